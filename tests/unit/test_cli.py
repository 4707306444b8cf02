"""`llmop crd | render | plan` as a user runs them (the console script, in a subprocess)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
LLMOP = [sys.executable, "-m", "llmop.cli"]


def llmop(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*LLMOP, *args], capture_output=True, text=True, input=stdin, cwd=REPO, check=False
    )


def manifest(name: str, spec: dict[str, object]) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "serving.llmop.dev/v1alpha1",
            "kind": "LLMDeployment",
            "metadata": {"name": name},
            "spec": spec,
        }
    )


def test_crd_prints_the_committed_crd() -> None:
    result = llmop("crd")
    assert result.returncode == 0
    assert result.stdout == (REPO / "crds/serving.llmop.dev_llmdeployments.yaml").read_text()


def test_render_prints_every_child_of_every_example() -> None:
    result = llmop("render", "-f", "examples/llama-3.1-8b-h100.yaml")
    assert result.returncode == 0, result.stderr
    kinds = [doc["kind"] for doc in yaml.safe_load_all(result.stdout)]
    assert kinds == ["Service", "Deployment", "PodDisruptionBudget", "HorizontalPodAutoscaler"]


def test_plan_accepts_the_8b_example() -> None:
    result = llmop("plan", "-f", "examples/llama-3.1-8b-h100.yaml", "-o", "json")
    assert result.returncode == 0, result.stderr
    (plan,) = json.loads(result.stdout)
    assert plan["fits"] is True
    assert plan["maxModelLen"] == 8192
    assert plan["kvCacheTokens"] > 0


def test_plan_rejects_70b_on_one_gpu_and_suggests_tensor_parallelism() -> None:
    spec = {
        "model": {"name": "meta-llama/Llama-3.1-70B-Instruct"},
        "resources": {"gpus": 1, "gpuProduct": "NVIDIA-H100-80GB-HBM3"},
        "engine": {"maxModelLen": 8192},
    }
    result = llmop("plan", "-f", "-", stdin=manifest("big", spec))
    assert result.returncode == 1
    assert "DOES NOT FIT" in result.stdout
    assert "tensorParallelSize: 2" in result.stdout


def test_plan_accepts_70b_on_two_h100s() -> None:
    spec = {
        "model": {"name": "meta-llama/Llama-3.1-70B-Instruct"},
        "resources": {"gpus": 2, "gpuProduct": "NVIDIA-H100-80GB-HBM3"},
        "engine": {"maxModelLen": 8192},
    }
    result = llmop("plan", "-f", "-", "-o", "json", stdin=manifest("big", spec))
    assert result.returncode == 0, result.stdout
    assert json.loads(result.stdout)[0]["fits"] is True


def test_plan_of_a_model_bigger_than_a_node_prints_no_negative_size_nor_an_impossible_pod() -> None:
    spec = {
        "model": {"name": "meta-llama/Llama-3.1-405B-Instruct"},
        "resources": {"gpus": 8, "gpuProduct": "NVIDIA-H100-80GB-HBM3"},
    }
    table = llmop("plan", "-f", "-", stdin=manifest("huge", spec))
    assert table.returncode == 1
    assert re.search(r"(?<![\w.-])-\d", table.stdout) is None, (
        table.stdout
    )  # a minus sign, not a name
    assert "short by" in table.stdout
    assert "tensorParallelSize: 16" not in table.stdout
    as_json = llmop("plan", "-f", "-", "-o", "json", stdin=manifest("huge", spec))
    (plan,) = json.loads(as_json.stdout)
    assert plan["kvCacheGiBPerGPU"] == 0
    assert plan["shortfallGiBPerGPU"] > 0
    assert all(value >= 0 for value in plan.values() if isinstance(value, int | float))


def test_plan_of_405b_suggests_two_pods_and_shows_pods_per_replica() -> None:
    spec: dict[str, object] = {
        "model": {"name": "meta-llama/Llama-3.1-405B-Instruct"},
        "resources": {"gpus": 8, "gpuProduct": "NVIDIA-H100-80GB-HBM3"},
    }
    table = llmop("plan", "-f", "-", stdin=manifest("huge", spec))
    assert "try: engine.pipelineParallelSize: 2 with engine.tensorParallelSize: 8" in table.stdout
    spec["engine"] = {"pipelineParallelSize": 2}
    table = llmop("plan", "-f", "-", stdin=manifest("huge", spec))
    assert table.returncode == 0, table.stdout
    assert "pods per replica   2 (pipeline parallel, 16 GPUs per replica)" in table.stdout
    as_json = llmop("plan", "-f", "-", "-o", "json", stdin=manifest("huge", spec))
    (plan,) = json.loads(as_json.stdout)
    assert plan["podsPerReplica"] == 2
    assert plan["fits"] is True


def test_render_prints_a_leader_worker_set_for_pipeline_parallel() -> None:
    spec = {
        "model": {"name": "meta-llama/Llama-3.1-405B-Instruct"},
        "resources": {"gpus": 8, "gpuProduct": "NVIDIA-H100-80GB-HBM3"},
        "engine": {"pipelineParallelSize": 2},
        "replicas": 2,
    }
    result = llmop("render", "-f", "-", stdin=manifest("huge", spec))
    assert result.returncode == 0, result.stderr
    docs = list(yaml.safe_load_all(result.stdout))
    assert [doc["kind"] for doc in docs] == ["Service", "LeaderWorkerSet", "PodDisruptionBudget"]
    assert docs[1]["spec"]["leaderWorkerTemplate"]["size"] == 2


def test_bad_input_is_a_clear_error() -> None:
    missing = llmop("plan", "-f", "does-not-exist.yaml")
    assert missing.returncode == 2
    assert "cannot read does-not-exist.yaml" in missing.stderr
    wrong = llmop("plan", "-f", "-", stdin="kind: ConfigMap\napiVersion: v1\n")
    assert wrong.returncode == 2
    assert "no serving.llmop.dev/v1alpha1 LLMDeployment" in wrong.stderr
    invalid = llmop("plan", "-f", "-", stdin=manifest("x", {"model": {}}))
    assert invalid.returncode == 2
    assert "model.name" in invalid.stderr


def test_run_keeps_the_kubernetes_library_out_and_logs_kopf_in_with_llmops_credentials() -> None:
    """`llmop run` (before kopf is imported) makes the `kubernetes` package unimportable, so
    kopf offers none of its client-library logins: its only login is llmop's own."""
    script = (
        "import sys\n"
        "from llmop import cli\n"
        "cli.keep_out_unused_libraries()\n"
        "import kopf, llmop.main\n"
        "from kopf._core.intents.registries import get_default_registry\n"
        "handlers = get_default_registry()._activities.get_all_handlers()\n"
        "ids = [h.id for h in handlers if h.activity.value == 'authentication']\n"
        "print(sys.modules['kubernetes'] is None, sorted(ids))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "True ['credentials']" in result.stdout, result.stdout
