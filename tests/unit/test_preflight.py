"""The model pre-flight verdict: each Hub answer → ok, or a Stalled reason whose message names
the fix; floating revisions flagged; the cache checked against the files with headroom."""

from __future__ import annotations

import pytest

from llmop import preflight as pf
from llmop.quantity import GIB

SHA = "0123456789abcdef0123456789abcdef01234567"
MODEL = "acme/llama"


def run(
    answer: pf.HubAnswer,
    *,
    revision: str | None = SHA,
    token_secret: str | None = None,
    cache_bytes: float | None = None,
) -> pf.Verdict:
    return pf.verdict(
        model=MODEL,
        revision=revision,
        token_secret=token_secret,
        answer=answer,
        cache_bytes=cache_bytes,
    )


@pytest.mark.parametrize(
    ("revision", "floating"),
    [(SHA, False), ("main", True), (None, True), ("v1.0", True), (SHA[:12], True)],
)
def test_a_reachable_model_passes_and_records_the_commit(
    revision: str | None, floating: bool
) -> None:
    v = run(pf.HubFacts(SHA, 16 * GIB), revision=revision)
    assert v.ok
    assert v.resolved_revision == SHA
    assert v.total_bytes == 16 * GIB
    assert v.floating is floating
    assert (f"pin spec.model.revision to {SHA}" in v.message) is floating


@pytest.mark.parametrize(
    ("failure", "token", "reason", "fix"),
    [
        ("no_token", None, pf.REASON_MODEL_ACCESS_DENIED, "spec.model.tokenSecretRef"),
        ("access_denied", "hf/token", pf.REASON_MODEL_ACCESS_DENIED, "request access"),
        ("invalid_token", "hf/token", pf.REASON_MODEL_ACCESS_DENIED, "revoked or mistyped"),
        ("repo_not_found", None, pf.REASON_MODEL_NOT_FOUND, "check spec.model.name"),
        ("revision_not_found", None, pf.REASON_MODEL_NOT_FOUND, "set spec.model.revision"),
    ],
)
def test_hub_refusals_stall_with_a_reason_naming_the_fix(
    failure: pf.FailureKind, token: str | None, reason: str, fix: str
) -> None:
    v = run(pf.HubFailure(failure, "detail from hub"), token_secret=token)
    assert not v.ok
    assert not v.retry
    assert v.reason == reason
    assert fix in v.message
    assert MODEL in v.message
    assert "detail from hub" in v.message
    if token is not None:
        assert "hf/token" in v.message


def test_an_unreachable_hub_is_retried_not_stalled() -> None:
    v = run(pf.HubFailure("unreachable", "ConnectError"))
    assert not v.ok
    assert v.retry
    assert v.reason is None


@pytest.mark.parametrize(
    ("total_gib", "cache_gib", "fits"),
    [(16, 16, False), (16, 16.81, True), (16, 16.7, False), (15.2, 20, True), (1, 100, True)],
)
def test_cache_size_is_checked_with_headroom(
    total_gib: float, cache_gib: float, fits: bool
) -> None:
    v = run(pf.HubFacts(SHA, int(total_gib * GIB)), cache_bytes=cache_gib * GIB)
    assert v.ok is fits
    if not fits:
        assert v.reason == pf.REASON_CACHE_TOO_SMALL
        assert v.resolved_revision == SHA
        assert f"at least {pf.suggested_size(int(total_gib * GIB))}" in v.message


def test_suggested_size_passes_the_check() -> None:
    for total in (1, 10**6, 15 * GIB, 16 * GIB, 140 * GIB + 7):
        size_gib = int(pf.suggested_size(total).removesuffix("Gi"))
        assert run(pf.HubFacts(SHA, total), cache_bytes=size_gib * GIB).ok


def test_no_cache_means_no_size_check() -> None:
    assert run(pf.HubFacts(SHA, 10**13), cache_bytes=None).ok
