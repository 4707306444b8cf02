"""The operator's adapter probe (`llmop.hub.adapter_probe`, `llmop.hub.model_type`) against the
hub stand-in serving LoRA adapter repos: the real client's requests and errors become the
adapter pre-flight's verdicts, one per refusal reason, and the probe reads `adapter_config.json`
only (never the weights)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmop import adapter_preflight as ap
from llmop import hub as hub_io
from llmop.api.v1alpha1 import AdapterSpec
from llmop.preflight import HubFailure
from llmop.render.adapters import Refusal
from support.hub_standin import HubRepo, HubStandin, synthetic_adapter, synthetic_model

GRANTED = "hf_granted"
OTHER = "hf_other"

ADAPTERS: dict[str, dict[str, Any]] = {
    "acme/sql-lora": {},
    "acme/big-lora": {"r": 128},
    "acme/dora-lora": {"use_dora": True},
    "acme/bias-lora": {"bias": "all"},
    "acme/head-lora": {"modules_to_save": ["lm_head"]},
    "acme/gpt2-lora": {"target_modules": ["c_attn"]},
    "acme/prefix": {"peft_type": "PREFIX_TUNING"},
}


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubStandin]:
    root = tmp_path_factory.mktemp("hub")
    repos = [
        HubRepo(repo_id, synthetic_adapter(root / repo_id, **config))
        for repo_id, config in ADAPTERS.items()
    ]
    gated = synthetic_adapter(root / "gated", r=8)
    repos.append(HubRepo("acme/gated-lora", gated, gated=True, allowed_tokens=frozenset({GRANTED})))
    weights_only = root / "weights-only"
    weights_only.mkdir()
    (weights_only / "adapter_model.safetensors").write_bytes(b"\0" * 64)
    repos.append(HubRepo("acme/weights-only", weights_only))
    # A config of 2 MiB: the probe reads 1 MiB of it, so it parses as no JSON (not LoRA).
    huge = synthetic_adapter(root / "huge")
    (huge / "adapter_config.json").write_text(" " * (2 << 20) + "{}")
    repos.append(HubRepo("acme/huge-config", huge))
    repos.append(HubRepo("acme/llama", synthetic_model(root / "llama", weights_bytes=1 << 16)))
    repos.append(HubRepo("acme/no-config-model", weights_only))
    with HubStandin(repos, tokens=frozenset({OTHER})) as hub:
        yield hub


def judge(
    hub: HubStandin,
    repo: str,
    revision: str | None = "main",
    *,
    token: str | None = None,
    cap: int = 64,
) -> ap.AdapterVerdict | None:
    adapter = AdapterSpec(name="a", source=f"hf://{repo}", revision=revision)
    answer = hub_io.adapter_probe(repo, revision, token=token, endpoint=hub.url, timeout=5)
    base = hub_io.model_type("acme/llama", None, token=None, endpoint=hub.url, timeout=5)
    assert base == "llama"
    return ap.verdict(
        adapter,
        answer,
        max_lora_rank=cap,
        base_model_type=base,
        token_secret="ns-token/token" if token else None,
    )


def test_a_lora_adapter_resolves_its_branch_and_reads_only_its_config(
    standin: HubStandin,
) -> None:
    repo = standin.repos["acme/sql-lora"]
    standin.requests.clear()
    answer = hub_io.adapter_probe("acme/sql-lora", "main", token=None, endpoint=standin.url)
    assert isinstance(answer, ap.AdapterFacts)
    assert answer.sha == repo.sha
    assert set(answer.files) == {"adapter_config.json", "adapter_model.safetensors"}
    assert answer.adapter_config == (repo.directory / "adapter_config.json").read_text()
    fetched = [r.path for r in standin.requests if "/resolve/" in r.path]
    assert fetched == [f"/acme/sql-lora/resolve/{repo.sha}/adapter_config.json"]
    assert not standin.downloads("adapter_model.safetensors")

    floating = judge(standin, "acme/sql-lora", "main")
    assert isinstance(floating, ap.Accepted)
    assert (floating.sha, floating.floating, floating.rank) == (repo.sha, True, 8)
    assert floating.target_modules == ("q_proj", "v_proj")
    pinned = judge(standin, "acme/sql-lora", repo.sha)
    assert isinstance(pinned, ap.Accepted)
    assert not pinned.floating
    assert isinstance(judge(standin, "acme/sql-lora", None), ap.Accepted)  # None: main


@pytest.mark.parametrize(
    ("repo", "revision", "token", "reason", "words"),
    [
        ("acme/missing-lora", "main", None, ap.REASON_NOT_FOUND, "no adapter repo"),
        ("acme/sql-lora", "no-such-branch", None, ap.REASON_NOT_FOUND, "no revision"),
        ("acme/weights-only", "main", None, ap.REASON_NOT_FOUND, "has no adapter_config.json"),
        ("acme/gated-lora", "main", None, ap.REASON_ACCESS_DENIED, "tokenSecretRef is not set"),
        ("acme/gated-lora", "main", OTHER, ap.REASON_ACCESS_DENIED, "has no access"),
        ("acme/gated-lora", "main", "hf_unknown", ap.REASON_ACCESS_DENIED, "revoked"),
        ("acme/prefix", "main", None, ap.REASON_NOT_LORA, "PREFIX_TUNING"),
        ("acme/huge-config", "main", None, ap.REASON_NOT_LORA, "not a JSON object"),
        ("acme/dora-lora", "main", None, ap.REASON_DORA, "use_dora"),
        ("acme/bias-lora", "main", None, ap.REASON_BIAS, "bias: 'all'"),
        ("acme/head-lora", "main", None, ap.REASON_MODULES_TO_SAVE, "lm_head"),
        ("acme/big-lora", "main", None, ap.REASON_RANK_TOO_HIGH, "maxLoraRank to 128"),
        ("acme/gpt2-lora", "main", None, ap.REASON_UNKNOWN_TARGET_MODULES, "c_attn"),
    ],
)
def test_each_refusal_through_the_hub(  # noqa: PLR0917 (one parameter per table column)
    standin: HubStandin, repo: str, revision: str, token: str | None, reason: str, words: str
) -> None:
    v = judge(standin, repo, revision, token=token)
    assert isinstance(v, Refusal), v
    assert v.reason == reason
    assert words in v.message
    assert "spec.adapters[a]" in v.message


def test_a_gated_adapter_with_access_passes(standin: HubStandin) -> None:
    answer = hub_io.adapter_probe("acme/gated-lora", "main", token=GRANTED, endpoint=standin.url)
    assert isinstance(answer, ap.AdapterFacts)
    assert answer.gated
    assert isinstance(judge(standin, "acme/gated-lora", token=GRANTED), ap.Accepted)


def test_model_type_of_the_base(standin: HubStandin) -> None:
    assert hub_io.model_type("acme/llama", "main", token=None, endpoint=standin.url) == "llama"
    # No config.json: unknown, so the target modules go unchecked (not a failure).
    assert hub_io.model_type("acme/no-config-model", None, token=None, endpoint=standin.url) is None
    missing = hub_io.model_type("acme/nothing", None, token=None, endpoint=standin.url)
    assert isinstance(missing, HubFailure)
    assert missing.kind == "repo_not_found"


def test_an_unreachable_hub_is_no_verdict(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    answer = hub_io.adapter_probe("acme/sql-lora", None, token=None, endpoint=endpoint, timeout=2)
    assert isinstance(answer, HubFailure)
    assert answer.kind == "unreachable"
    adapter = AdapterSpec(name="a", source="hf://acme/sql-lora")
    assert (
        ap.verdict(adapter, answer, max_lora_rank=64, base_model_type=None, token_secret=None)
        is None
    )
    kind = hub_io.model_type("acme/llama", None, token=None, endpoint=endpoint, timeout=2)
    assert isinstance(kind, HubFailure)
    assert kind.kind == "unreachable"
