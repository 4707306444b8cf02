"""The adapter pre-flight verdict: each Hub answer and adapter_config.json → accepted (resolved
commit, floating or not, rank, target modules) or a refusal whose reason is the table's and whose
message names `spec.adapters[<name>]` and the fix; an unreachable Hub is no verdict. Also the
verdicts' effect on the ConfigMap entries and on status.adapters."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmop import adapter_preflight as ap
from llmop.adapter_status import adapter_statuses
from llmop.api.v1alpha1 import AdapterSpec, LLMDeployment, LLMDeploymentSpec
from llmop.preflight import FailureKind, HubFailure
from llmop.render.adapters import Refusal, desired_entries, render_config_map

SHA = "0123456789abcdef0123456789abcdef01234567"
FILES = ("adapter_config.json", "adapter_model.safetensors", "README.md")
LORA: dict[str, Any] = {
    "peft_type": "LORA",
    "r": 16,
    "lora_alpha": 32,
    "target_modules": ["q_proj", "v_proj"],
    "bias": "none",
    "use_dora": False,
    "modules_to_save": None,
}


def adapter(revision: str | None = SHA, name: str = "sql") -> AdapterSpec:
    return AdapterSpec(name=name, source="hf://acme/sql-lora", revision=revision)


def facts(
    config: dict[str, Any] | str | None = None, files: tuple[str, ...] = FILES
) -> ap.AdapterFacts:
    text = config if isinstance(config, str) or config is None else json.dumps(config)
    return ap.AdapterFacts(sha=SHA, files=files, adapter_config=text)


def judge(
    answer: ap.AdapterAnswer,
    *,
    revision: str | None = SHA,
    cap: int = 64,
    model_type: str | None = "llama",
    token_secret: str | None = None,
) -> ap.AdapterVerdict | None:
    return ap.verdict(
        adapter(revision),
        answer,
        max_lora_rank=cap,
        base_model_type=model_type,
        token_secret=token_secret,
    )


@pytest.mark.parametrize(
    ("revision", "floating"),
    [(SHA, False), ("main", True), (None, True), ("v1.0", True), (SHA[:12], True)],
)
def test_a_lora_adapter_is_accepted_at_its_resolved_commit(
    revision: str | None, floating: bool
) -> None:
    v = judge(facts(LORA), revision=revision)
    assert isinstance(v, ap.Accepted)
    assert (v.sha, v.floating, v.rank, v.target_modules) == (
        SHA,
        floating,
        16,
        ("q_proj", "v_proj"),
    )
    assert (f"pin spec.adapters[sql].revision to {SHA}" in v.message) is floating


@pytest.mark.parametrize(
    ("failure", "token", "revision", "reason", "fix"),
    [
        ("no_token", None, SHA, ap.REASON_ACCESS_DENIED, "point spec.model.tokenSecretRef"),
        ("access_denied", "hf/token", SHA, ap.REASON_ACCESS_DENIED, "has no access to acme"),
        ("invalid_token", "hf/token", SHA, ap.REASON_ACCESS_DENIED, "revoked or mistyped"),
        ("repo_not_found", None, SHA, ap.REASON_NOT_FOUND, "spec.adapters[sql].source"),
        ("revision_not_found", None, "nope", ap.REASON_NOT_FOUND, "spec.adapters[sql].revision"),
    ],
)
def test_hub_refusals_name_the_adapter_and_the_fix(
    failure: FailureKind, token: str | None, revision: str, reason: str, fix: str
) -> None:
    v = judge(HubFailure(failure, "detail from hub"), revision=revision, token_secret=token)
    assert isinstance(v, Refusal)
    assert v.reason == reason
    assert fix in v.message
    assert "spec.adapters[sql]" in v.message
    assert "(hub: detail from hub)" in v.message
    if token:
        assert f"Secret {token}" in v.message


def test_an_unreachable_hub_is_no_verdict() -> None:
    assert judge(HubFailure("unreachable", "timed out")) is None


def test_a_missing_token_secret_is_named_when_the_adapter_is_gated() -> None:
    """The Secret the spec names is missing: asked anonymously, a gated adapter answers
    no_token, and the message must not claim tokenSecretRef is unset."""
    v = judge(HubFailure("no_token"), token_secret="hf/token")
    assert isinstance(v, Refusal)
    assert v.reason == ap.REASON_ACCESS_DENIED
    assert "Secret hf/token" in v.message
    assert "is not set" not in v.message


CASES: list[tuple[str, Any, tuple[str, ...], str, str]] = [
    # (id, adapter_config (dict, raw text, or None: absent), files, reason, words in message)
    ("no-config", None, FILES[1:], ap.REASON_NOT_FOUND, "has no adapter_config.json"),
    ("no-weights", LORA, FILES[:1], ap.REASON_NOT_FOUND, "no adapter weights"),
    ("bin-weights", LORA, ("adapter_config.json", "adapter_model.bin"), "", ""),
    ("not-json", "{r: 8", FILES, ap.REASON_NOT_LORA, "not a JSON object"),
    ("json-list", "[1, 2]", FILES, ap.REASON_NOT_LORA, "not a JSON object"),
    ("prefix", LORA | {"peft_type": "PREFIX_TUNING"}, FILES, ap.REASON_NOT_LORA, "PREFIX_TUNING"),
    (
        "no-type",
        {k: v for k, v in LORA.items() if k != "peft_type"},
        FILES,
        ap.REASON_NOT_LORA,
        "None",
    ),
    ("dora", LORA | {"use_dora": True}, FILES, ap.REASON_DORA, "use_dora false"),
    ("bias-all", LORA | {"bias": "all"}, FILES, ap.REASON_BIAS, "bias: 'all'"),
    ("bias-lora", LORA | {"bias": "lora_only"}, FILES, ap.REASON_BIAS, "lora_only"),
    ("lora-bias", LORA | {"lora_bias": True}, FILES, ap.REASON_BIAS, "lora_bias: true"),
    (
        "save-lm-head",
        LORA | {"modules_to_save": ["lm_head"]},
        FILES,
        ap.REASON_MODULES_TO_SAVE,
        "['lm_head']",
    ),
    (
        "save-str",
        LORA | {"modules_to_save": "embed"},
        FILES,
        ap.REASON_MODULES_TO_SAVE,
        "['embed']",
    ),
    (
        "no-r",
        {k: v for k, v in LORA.items() if k != "r"},
        FILES,
        ap.REASON_NOT_LORA,
        "no positive integer rank",
    ),
    ("zero-r", LORA | {"r": 0}, FILES, ap.REASON_NOT_LORA, "r: 0"),
    ("bool-r", LORA | {"r": True}, FILES, ap.REASON_NOT_LORA, "r: True"),
    (
        "bad-pattern",
        LORA | {"rank_pattern": {"q_proj": "x"}},
        FILES,
        ap.REASON_NOT_LORA,
        "rank_pattern",
    ),
    (
        "rank",
        LORA | {"r": 128},
        FILES,
        ap.REASON_RANK_TOO_HIGH,
        "raise spec.engine.lora.maxLoraRank to 128",
    ),
    ("rank-odd", LORA | {"r": 100}, FILES, ap.REASON_RANK_TOO_HIGH, "maxLoraRank to 128"),
    (
        "rank-pattern",
        LORA | {"rank_pattern": {"v_proj": 96}},
        FILES,
        ap.REASON_RANK_TOO_HIGH,
        "rank 96",
    ),
    ("rank-huge", LORA | {"r": 512}, FILES, ap.REASON_RANK_TOO_HIGH, "rank 256 or less"),
    (
        "modules",
        LORA | {"target_modules": ["q_proj", "c_attn"]},
        FILES,
        ap.REASON_UNKNOWN_TARGET_MODULES,
        "['c_attn']",
    ),
    ("dotted", LORA | {"target_modules": ["self_attn.q_proj", "mlp.down_proj"]}, FILES, "", ""),
    ("save-score", LORA | {"modules_to_save": ["score", "classifier"]}, FILES, "", ""),
    ("regex", LORA | {"target_modules": r".*\.(q|v)_proj"}, FILES, "", ""),
    ("all-linear", LORA | {"target_modules": "all-linear"}, FILES, "", ""),
]


@pytest.mark.parametrize(
    ("config", "files", "reason", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_adapter_config_table(config: Any, files: tuple[str, ...], reason: str, words: str) -> None:
    v = judge(facts(config, files))
    if not reason:
        assert isinstance(v, ap.Accepted), v
        return
    assert isinstance(v, Refusal), v
    assert v.reason == reason
    assert words in v.message
    assert v.message.startswith("spec.adapters[sql]")


def test_rank_refusal_names_the_cap_and_the_smallest_allowed_value() -> None:
    v = judge(facts(LORA | {"r": 20}), cap=16)
    assert isinstance(v, Refusal)
    assert v.message == (
        "spec.adapters[sql]: rank 20 is above spec.engine.lora.maxLoraRank (16): raise "
        "spec.engine.lora.maxLoraRank to 32 (restarts the engine pods) or use a lower-rank adapter"
    )
    assert isinstance(judge(facts(LORA | {"r": 16}), cap=16), ap.Accepted)


@pytest.mark.parametrize(
    ("rank", "allowed"), [(1, 8), (8, 8), (9, 16), (64, 64), (65, 128), (256, 256), (257, None)]
)
def test_allowed_rank(rank: int, allowed: int | None) -> None:
    assert ap.allowed_rank(rank) == allowed


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3", "gemma"])
def test_target_modules_are_checked_for_known_bases(model_type: str) -> None:
    v = judge(facts(LORA | {"target_modules": ["q_proj", "fc1"]}), model_type=model_type)
    assert isinstance(v, Refusal)
    assert v.reason == ap.REASON_UNKNOWN_TARGET_MODULES
    assert f"a {model_type} model has" in v.message


@pytest.mark.parametrize("model_type", [None, "gpt2", "phi3"])
def test_target_modules_are_not_checked_for_unknown_bases(model_type: str | None) -> None:
    v = judge(facts(LORA | {"target_modules": ["c_attn", "qkv_proj"]}), model_type=model_type)
    assert isinstance(v, ap.Accepted)
    assert v.target_modules == ("c_attn", "qkv_proj")


# --- The remembered answers → verdicts → ConfigMap and status --------------------------------


def spec(*adapters: dict[str, Any], lora: dict[str, Any] | None = None) -> LLMDeploymentSpec:
    engine: dict[str, Any] = {"backend": "simulator"} | ({"lora": lora} if lora else {})
    return LLMDeploymentSpec.model_validate(
        {
            "model": {"name": "acme/llama"},
            "engine": engine,
            "resources": {"gpus": 1, "gpuProduct": "NVIDIA-H100-80GB-HBM3"},
            "adapters": list(adapters),
        }
    )


SQL = {"name": "sql", "source": "hf://acme/sql-lora", "revision": "main"}
BIG = {"name": "big", "source": "hf://acme/big-lora", "revision": SHA}
DISK = {"name": "disk", "source": "pvc://models/loras/disk"}


def answers(s: LLMDeploymentSpec, **by_name: ap.AdapterAnswer) -> dict[str, Any]:
    return {
        a.name: (ap.asked_for(a, None), by_name[a.name]) for a in s.adapters if a.name in by_name
    }


def test_judge_reads_remembered_answers_for_what_the_spec_asks_now() -> None:
    s = spec(SQL, BIG, DISK)
    remembered = answers(s, sql=facts(LORA), big=facts(LORA | {"r": 128}))
    verdicts = ap.judge(s, remembered, base_model_type="llama", token_secret=None)
    assert set(verdicts) == {"sql", "big"}  # pvc:// adapters are not the Hub's
    assert isinstance(verdicts["sql"], ap.Accepted)
    assert isinstance(verdicts["big"], Refusal)
    # A larger cap re-judges the same answer: no new Hub question.
    wider = spec(SQL, BIG, DISK, lora={"maxLoraRank": 128})
    assert isinstance(
        ap.judge(wider, remembered, base_model_type="llama", token_secret=None)["big"], ap.Accepted
    )
    # A changed revision (or token ref) makes the remembered answer stale: no verdict.
    moved = spec(SQL | {"revision": "v2"}, BIG)
    assert ap.judge(moved, remembered, base_model_type=None, token_secret=None)["sql"] is None
    assert ap.judge(s, remembered, base_model_type=None, token_secret="hf/token") == {
        "sql": None,
        "big": None,
    }


def test_base_question_is_none_for_a_pvc_base() -> None:
    s = spec(SQL)
    assert ap.base_asked_for(s, None) == ("acme/llama", None, None)
    pvc = s.model_copy(update={"model": s.model.model_copy(update={"name": "pvc://models/llama"})})
    assert ap.base_asked_for(pvc, None) is None


def test_refused_adapters_leave_the_config_map_and_accepted_ones_are_pinned() -> None:
    s = spec(SQL, BIG, DISK | {"source": "pvc://elsewhere/disk"})
    llmd = LLMDeployment.model_validate({"metadata": {"name": "x", "namespace": "ns"}, "spec": s})
    verdicts = ap.judge(
        s,
        answers(s, sql=facts(LORA), big=facts(LORA | {"use_dora": True})),
        base_model_type="llama",
        token_secret=None,
    )
    entries = desired_entries(llmd, refused=ap.refused(verdicts), pinned=ap.pinned(verdicts))
    # big refused by the pre-flight, disk by the claim check; sql pinned to the commit.
    assert entries == [{"name": "sql", "repo": "acme/sql-lora", "revision": SHA, "path": None}]
    # Without verdicts (nothing asked yet, or the Hub unreachable) every Hub adapter goes.
    config_map = render_config_map(llmd)
    assert config_map is not None
    listed = json.loads(config_map["data"]["adapters.json"])["adapters"]
    assert [(a["name"], a["revision"]) for a in listed] == [("sql", "main"), ("big", SHA)]


def test_status_gets_refusals_and_the_resolved_commit_and_rank() -> None:
    s = spec(SQL, BIG)
    verdicts = ap.judge(
        s,
        answers(s, sql=facts(LORA), big=facts(LORA | {"bias": "all"})),
        base_model_type=None,
        token_secret=None,
    )
    statuses = adapter_statuses(s, ap.refused(verdicts), reports=[], ready_pods=[])
    out = ap.with_verdicts(statuses, verdicts)
    assert out is not None
    by_name = {a.name: a for a in out}
    assert (by_name["sql"].phase, by_name["sql"].revision, by_name["sql"].rank) == (
        "Pending",
        SHA,
        16,
    )
    assert by_name["big"].phase == "Failed"
    assert (by_name["big"].message or "").startswith("AdapterBias: spec.adapters[big]")
    assert ap.with_verdicts(None, verdicts) is None
