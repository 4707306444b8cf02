"""Planning a model outside the catalog from its files: `llmop.hub.model_files` against the Hub
stand-in serving published configs, and `llmop plan` (a subprocess) with `--model-files` (no
network) and with the stand-in as `HF_ENDPOINT`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from llmop import hub as hub_io
from llmop.planner.model_config import ModelFiles, facts_from_files
from llmop.preflight import HubFailure
from support.hub_standin import HubRepo, HubStandin
from support.hybrid_configs import GRANITE_H_SHAPE
from support.published_configs import CHECKPOINT_GIB, CONFIGS

REPO = Path(__file__).resolve().parents[2]
GIB = 1 << 30
MODELS = (
    "google/gemma-3-12b-it",
    "deepseek-ai/DeepSeek-V2-Lite-Chat",
    "openai/gpt-oss-20b",
    "Qwen/Qwen2.5-72B-Instruct-AWQ",
)
AWQ_TOTAL_SIZE = 41_612_877_824


def _write_model(directory: Path, repo: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(CONFIGS[repo], indent=2))
    size = AWQ_TOTAL_SIZE if repo.endswith("AWQ") else CHECKPOINT_GIB.get(repo)
    if size is not None:
        total = int(size if size > 1e6 else size * GIB)
        index = {"metadata": {"total_size": total}, "weight_map": {"lm_head.weight": "x"}}
        (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return directory


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubStandin]:
    root = tmp_path_factory.mktemp("hub")
    repos = [HubRepo(repo, _write_model(root / repo.replace("/", "--"), repo)) for repo in MODELS]
    gated_dir = _write_model(root / "gated", "google/gemma-3-12b-it")
    repos.append(HubRepo("acme/gated", gated_dir, gated=True))
    empty = root / "empty"
    empty.mkdir()
    (empty / "README.md").write_text("no config here\n")
    repos.append(HubRepo("acme/no-config", empty))
    with HubStandin(repos) as hub:
        yield hub


@pytest.mark.parametrize("repo", MODELS)
def test_model_files_reads_config_and_index_at_the_resolved_commit(
    standin: HubStandin, repo: str
) -> None:
    answer = hub_io.model_files(repo, "main", token=None, endpoint=standin.url, timeout=5)
    assert isinstance(answer, ModelFiles)
    assert answer.revision == standin.repos[repo].sha
    facts = facts_from_files(answer, name=repo, source="hub")
    assert facts.source == "hub"
    assert facts.attention_layers
    # Only config.json and the index were read: no weights.
    files = {
        entry.path.rsplit("/", 1)[-1] for entry in standin.requests if "/resolve/" in entry.path
    }
    assert files <= {"config.json", "model.safetensors.index.json"}


def test_gated_and_missing_files_are_refusals_not_guesses(standin: HubStandin) -> None:
    gated = hub_io.model_files("acme/gated", None, token=None, endpoint=standin.url, timeout=5)
    assert isinstance(gated, HubFailure)
    assert gated.kind == "no_token"
    empty = hub_io.model_files("acme/no-config", None, token=None, endpoint=standin.url, timeout=5)
    assert isinstance(empty, ModelFiles)
    assert empty.config_text is None


def _manifest(model: str, **engine: object) -> str:
    spec = {
        "model": {"name": model},
        "resources": {"gpus": 1, "gpuProduct": "NVIDIA-H100-80GB-HBM3"},
        "engine": {"maxModelLen": 8192, **engine},
    }
    doc = {
        "apiVersion": "serving.llmop.dev/v1alpha1",
        "kind": "LLMDeployment",
        "metadata": {"name": "m"},
        "spec": spec,
    }
    return yaml.safe_dump(doc)


def _llmop(
    *args: str, stdin: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmop.cli", *args],
        capture_output=True,
        text=True,
        input=stdin,
        cwd=REPO,
        check=False,
        env={**os.environ, "HF_HUB_OFFLINE": "0", **(env or {})},
    )


def test_plan_with_model_files_is_offline_and_quick(tmp_path: Path) -> None:
    directory = _write_model(tmp_path / "gemma", "google/gemma-3-12b-it")
    started = time.monotonic()
    # An endpoint nobody listens on: --model-files must not need it.
    result = _llmop(
        "plan",
        "-f",
        "-",
        "--model-files",
        str(directory),
        "--gpu-hour-price",
        "2.5",
        stdin=_manifest("google/gemma-3-12b-it"),
        env={"HF_ENDPOINT": "http://127.0.0.1:9"},
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert f"files in {directory}" in result.stdout
    assert "6 KV groups" in result.stdout
    assert "CEILING" in result.stdout
    assert "per 1M output tokens at 2.5 per GPU-hour" in result.stdout
    assert elapsed < 2.0, elapsed


def test_a_mamba_hybrid_is_planned_from_its_files(tmp_path: Path) -> None:
    """Granite 4.0-H's kind (4 attention and 36 Mamba-2 layers): its groups, from its
    config and its checkpoint's size (tests/unit/test_planner_hybrids.py has the arithmetic)."""
    directory = tmp_path / "granite"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(GRANITE_H_SHAPE))
    index = {"metadata": {"total_size": 14 * GIB}, "weight_map": {"lm_head.weight": "x"}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    started = time.monotonic()
    result = _llmop(
        "plan", "-f", "-", "--model-files", str(directory), stdin=_manifest("ibm/granite-h")
    )
    assert result.returncode == 0, result.stderr
    assert "10 KV groups" in result.stdout
    assert time.monotonic() - started < 2.0


def test_plan_outside_the_catalog_uses_the_hub_and_says_so(standin: HubStandin) -> None:
    repo = "Qwen/Qwen2.5-72B-Instruct-AWQ"
    result = _llmop(
        "plan",
        "-f",
        "-",
        "-o",
        "json",
        stdin=_manifest(repo),
        env={"HF_ENDPOINT": standin.url},
    )
    assert result.returncode == 0, result.stderr  # 38.8 GiB of int4 weights fit one H100
    (plan,) = json.loads(result.stdout)
    assert plan["fits"] is True
    assert plan["modelFacts"].startswith(f"hub ({repo}@{standin.repos[repo].sha[:12]}")
    assert plan["weightsGiBPerGPU"] == pytest.approx(AWQ_TOTAL_SIZE / GIB, abs=0.01)
    assert plan["decodeCeilingTokensPerSecond"] > 0


def test_plan_without_a_reachable_hub_says_it_could_not_plan(standin: HubStandin) -> None:
    result = _llmop(
        "plan",
        "-f",
        "-",
        stdin=_manifest("acme/not-in-catalog"),
        env={"HF_ENDPOINT": standin.url},
    )
    assert result.returncode == 0
    assert "model facts        none (Hub: repo_not_found" in result.stdout
    assert "not planned" in result.stdout


@pytest.mark.parametrize("command", ["plan", "render"])
def test_a_config_it_cannot_size_names_file_and_field(tmp_path: Path, command: str) -> None:
    directory = tmp_path / "hybrid"
    directory.mkdir()
    config = {"architectures": ["BambaForCausalLM"], "model_type": "bamba", "num_hidden_layers": 4}
    (directory / "config.json").write_text(json.dumps(config))
    manifest = _manifest("ibm-ai-platform/Bamba-9B")
    result = _llmop(command, "-f", "-", "--model-files", str(directory), stdin=manifest)
    assert result.returncode == 2
    assert "config.json: architectures: BambaForCausalLM was served by vLLM up to 0.23.0" in (
        result.stderr
    )
    assert "vLLM 0.23.0 or earlier (spec.engine.image)" in result.stderr


def test_render_plans_from_model_files_as_the_operator_does(tmp_path: Path) -> None:
    """`llmop render` of a model outside the catalog: with its files, the children the
    operator would create from them (the load budget follows the weights' size); without, the
    catalog-less defaults. A config it cannot size: the test above."""
    directory = _write_model(tmp_path / "gemma", "google/gemma-3-12b-it")
    stdin = _manifest("google/gemma-3-12b-it")
    offline = {"HF_ENDPOINT": "http://127.0.0.1:9"}
    planned = _llmop("render", "-f", "-", "--model-files", str(directory), stdin=stdin, env=offline)
    plain = _llmop("render", "-f", "-", stdin=stdin, env=offline)
    assert planned.returncode == plain.returncode == 0, planned.stderr + plain.stderr

    def load_timeout(out: str) -> str:
        (deployment,) = [d for d in yaml.safe_load_all(out) if d["kind"] == "Deployment"]
        env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        return next(e["value"] for e in env if e["name"] == "LLMOP_LOAD_TIMEOUT_SECONDS")

    assert load_timeout(plain.stdout) == "1800"
    assert int(load_timeout(planned.stdout)) < 1800
