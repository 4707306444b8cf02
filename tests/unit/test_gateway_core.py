"""The gateway's pure core by tables: GCRA admission and settlement (`quota`), tenants and
keys (`tenants`), reading usage from answers as they pass (`metering`)."""

from __future__ import annotations

import asyncio
import json
import secrets
from decimal import Decimal
from typing import Any

import pytest

from llmop_router.contract import API_KEY_PREFIX, api_key_hash
from llmop_router.metering import Tap, with_usage_requested
from llmop_router.quota import (
    Bucket,
    Charge,
    Estimate,
    Price,
    Refused,
    Usage,
    admission,
    estimate,
    gcra,
    settled_tat,
)
from llmop_router.store import Local
from llmop_router.tenant_status import conditions_of, status_patch, usage_of
from llmop_router.tenants import Directory, TenantError, parse_tenant

RPM_60 = Bucket("rpm", Charge.REQUESTS, 60, 1, 2)  # 1 a second, 2 s of burst


@pytest.mark.parametrize(
    ("tat", "now", "admitted", "new_tat", "wait"),
    [
        (None, 0.0, True, 1000.0, 0.0),  # a full bucket
        (1000.0, 0.0, True, 2000.0, 0.0),  # the burst's second
        (2000.0, 0.0, False, 2000.0, 1000.0),  # over: wait exactly a second
        (2000.0, 1500.0, True, 3000.0, 0.0),  # half a second later: in again
        (500.0, 10_000.0, True, 11_000.0, 0.0),  # an idle bucket refills, not past full
    ],
)
def test_gcra(tat: float | None, now: float, admitted: bool, new_tat: float, wait: float) -> None:
    answer = gcra(tat, now, RPM_60)
    assert (answer.admitted, answer.tat, answer.retry_after_ms) == (admitted, new_tat, wait)


def test_a_request_larger_than_the_burst_passes_on_a_full_bucket_only() -> None:
    big = Bucket("tpm", Charge.TOKENS, 60, 10, 2)  # costs 10 s of a 2 s burst
    assert gcra(None, 0.0, big).admitted
    assert not gcra(10_000.0, 0.0, big).admitted


@pytest.mark.parametrize(
    ("tat", "delta", "expected"),
    [
        (5000.0, 3, 8000.0),  # a longer answer: debt
        (5000.0, -3, 2000.0),  # a shorter one: a refund
        (5000.0, -9, 1000.0),  # never past full (now)
    ],
)
def test_settlement_moves_the_tat(tat: float, delta: int, expected: float) -> None:
    assert settled_tat(tat, 1000.0, delta, 1000.0) == expected


def tenant_doc(**spec: object) -> dict[str, object]:
    return {"metadata": {"name": "t"}, "spec": spec}


def test_estimate_reserves_the_smaller_of_max_tokens_and_the_reserve() -> None:
    tenant = parse_tenant(tenant_doc(limits={"reserveOutputTokens": 100}))
    assert estimate(41, 64, tenant) == Estimate(11, 64)
    assert estimate(41, 1000, tenant) == Estimate(11, 100)
    assert estimate(0, None, tenant) == Estimate(0, 100)


def test_a_refused_request_charges_no_bucket() -> None:
    tenant = parse_tenant(
        tenant_doc(limits={"requestsPerMinute": 600, "tokensPerMinute": 60, "burstSeconds": 1})
    )
    local = Local(clock=lambda: 100.0)

    async def run() -> None:
        first = admission(tenant, "m", "r1", Estimate(1, 1), "2026-12")
        assert (await local.admit(first)).admitted
        before = dict(local.tats)
        second = admission(tenant, "m", "r2", Estimate(1, 1), "2026-12")
        decision = await local.admit(second)
        assert decision.refused is Refused.TOKENS
        assert decision.retry_after_ms == 2000  # 2 tokens at 1 a second, past a full bucket
        assert local.tats == before

    asyncio.run(run())


def test_the_local_store_holds_a_share_of_each_limit() -> None:
    tenant = parse_tenant(tenant_doc(limits={"maxConcurrentRequests": 4}))
    local = Local(share=0.5, clock=lambda: 0.0)

    async def run() -> list[bool]:
        asks = [admission(tenant, "m", f"r{i}", Estimate(1, 1), "2026-12") for i in range(3)]
        return [(await local.admit(a)).admitted for a in asks]

    assert asyncio.run(run()) == [True, True, False]


def test_keys_are_found_by_hash_and_refused_for_good_reasons() -> None:
    key, other = (API_KEY_PREFIX + secrets.token_urlsafe(32) for _ in range(2))
    docs = [
        {
            "metadata": {"name": "a"},
            "spec": {
                "apiKeys": [
                    {"name": "live", "sha256": api_key_hash(key)},
                    {"name": "old", "sha256": api_key_hash(other), "disabled": True},
                ]
            },
        },
        {"metadata": {"name": "b"}, "spec": {"apiKeys": [{"name": "x", "sha256": "0" * 64}]}},
        {"metadata": {"name": "c"}, "spec": {"apiKeys": [{"name": "y", "sha256": "0" * 64}]}},
    ]
    directory = Directory.of(parse_tenant(d) for d in docs)
    found = directory.identify(key, 0.0)
    assert getattr(found, "key_name", None) == "live"
    assert getattr(directory.identify(other, 0.0), "reason", None) == "key_disabled"
    assert directory.clashes == {"0" * 64: ("b", "c")}
    assert getattr(directory.identify("x" * 300, 0.0), "reason", None) == "unauthenticated"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"apiKeys": [{"name": "k", "sha256": "abc"}]}, "64 lowercase hex"),
        ({"apiKeys": [{"name": "k", "sha256": "A" * 64}]}, "64 lowercase hex"),
        ({"limits": {"requestsPerMinute": 0}}, "requestsPerMinute must be a whole number"),
        ({"limits": {"mode": "Loud"}}, "must be Enforce or Shadow"),
        ({"budget": {"monthly": "lots"}}, "decimal amount"),
        ({"models": "llama"}, "must list served names"),
    ],
)
def test_a_tenant_the_router_cannot_use_is_refused_with_the_field(
    spec: dict[str, object], message: str
) -> None:
    with pytest.raises(TenantError, match=message):
        parse_tenant(tenant_doc(**spec))


def test_models_are_globs_and_model_limits_apply_to_their_models() -> None:
    tenant = parse_tenant(
        tenant_doc(
            models=["qwen-*", "llama"], modelLimits=[{"model": "qwen-*", "tokensPerMinute": 9}]
        )
    )
    assert tenant.may_use("qwen-7b")
    assert tenant.may_use("llama")
    assert not tenant.may_use("mixtral")
    keys = [b.key for b in admission(tenant, "qwen-7b", "r", Estimate(1, 1), "m").buckets]
    assert keys == ["m:qwen-7b:tpm"]


def sse(*events: Any) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + (
        b"data: [DONE]\n\n"
    )


CONTENT = {"id": "c", "choices": [{"index": 0, "text": "hi"}]}
USAGE = {"id": "c", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}}


@pytest.mark.parametrize("split", [1, 7, 30, 10_000])
def test_the_usage_event_is_read_and_removed_however_the_stream_is_cut(split: int) -> None:
    stream = sse(CONTENT, CONTENT, USAGE)
    tap = Tap(stream=True, strip_usage=True)
    out = b"".join(tap.feed(stream[i : i + split]) for i in range(0, len(stream), split))
    out += tap.finish()
    assert out == sse(CONTENT, CONTENT)
    assert tap.usage == Usage(5, 2)
    assert tap.events == 2


def test_usage_the_client_asked_for_passes_untouched() -> None:
    stream = sse(CONTENT, USAGE)
    tap = Tap(stream=True, strip_usage=False)
    assert tap.feed(stream) + tap.finish() == stream
    assert tap.used(0) == Usage(5, 2)


def test_an_aborted_stream_is_charged_what_was_relayed() -> None:
    tap = Tap(stream=True, strip_usage=True)
    tap.feed(sse(CONTENT, CONTENT, CONTENT)[:-14])
    assert tap.used(7) == Usage(7, 3, exact=False)


def test_a_json_answer_gives_its_usage_from_its_tail() -> None:
    body = json.dumps(
        {
            "choices": [{"text": "x" * 20_000}],
            "usage": {
                "prompt_tokens": 3,
                "completion_tokens": 4,
                "prompt_tokens_details": {"cached_tokens": 2},
            },
        }
    ).encode()
    tap = Tap(stream=False, strip_usage=False)
    for i in range(0, len(body), 999):
        assert tap.feed(body[i : i + 999]) == body[i : i + 999]
    tap.finish()
    assert tap.usage == Usage(3, 4, 2)


def test_usage_is_requested_in_the_body() -> None:
    body = with_usage_requested(b'{"model": "m", "stream": true, "stream_options": {"x": 1}}')
    assert json.loads(body)["stream_options"] == {"x": 1, "include_usage": True}


def test_costs_add_up_exactly() -> None:
    price = Price.per_million(Decimal("0.15"), Decimal("0.60"), Decimal("0.075"))
    picos = price.cost_picos(Usage(1000, 333, cached_tokens=400))
    expected = (600 * Decimal("0.15") + 400 * Decimal("0.075") + 333 * Decimal("0.60")) / 10**6
    assert Decimal(picos) / 10**12 == expected


def test_a_tenants_status_says_what_the_router_knows_of_it() -> None:
    key = "0" * 64
    docs = [
        {
            "metadata": {"name": "a"},
            "spec": {
                "models": ["llama", "qwen-*", "gone"],
                "apiKeys": [
                    {"name": "old", "sha256": key},
                    {"name": "new", "sha256": "1" * 64, "notAfter": "1970-01-03T00:00:00Z"},
                ],
            },
        },
        {"metadata": {"name": "b"}, "spec": {"apiKeys": [{"name": "x", "sha256": key}]}},
    ]
    directory = Directory.of(parse_tenant(d) for d in docs)
    found = {
        kind: (holds, message)
        for kind, holds, _reason, message in conditions_of("a", directory, None, ["llama"], 0.0)
    }
    assert found["Ready"][0] is True
    assert found["DuplicateKeyHash"] == (True, "refused: old (also in b)")
    assert found["KeyExpiringSoon"][0] is True
    assert "new at 1970-01-03T00:00:00Z" in found["KeyExpiringSoon"][1]
    assert found["UnknownModels"] == (True, "no LLMDeployment serves: gone (check spec.models)")
    broken = conditions_of("c", directory, "LLMTenant c: spec.models must list", [], 0.0)
    assert broken == [("Ready", False, "Invalid", "LLMTenant c: spec.models must list")]


def test_a_status_keeps_its_transition_times_and_sums_the_months_usage() -> None:
    usage = usage_of(
        "2026-12",
        {"llama:in": 10, "qwen:in": 5, "llama:out": 7, "llama:picos": 3, "total:picos": 1500000},
    )
    assert usage == {
        "month": "2026-12",
        "inputTokens": 15,
        "cachedInputTokens": 0,
        "outputTokens": 7,
        "cost": "0.000002",
    }
    previous = [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}]
    patch = status_patch(
        [("Ready", True, "Serving", "ok"), ("UnknownModels", False, "AllServed", "ok")],
        previous,
        usage,
        86_400.0,
    )
    times = [c["lastTransitionTime"] for c in patch["status"]["conditions"]]
    assert times == ["2026-01-01T00:00:00Z", "1970-01-02T00:00:00Z"]


def test_a_fallback_store_starts_with_empty_buckets() -> None:
    """When the shared store goes away, it may just have admitted a burst: the local fallback
    must not grant another (it admits at its share of the rate from the start)."""
    tenant = parse_tenant(tenant_doc(limits={"requestsPerMinute": 120, "burstSeconds": 5}))
    now = [0.0]
    local = Local(share=0.5, clock=lambda: now[0])
    local.start_empty()

    async def admitted() -> bool:
        ask = admission(tenant, "m", "r", Estimate(1, 1), "2026-12")
        return (await local.admit(ask)).admitted

    assert asyncio.run(admitted()) is False
    now[0] = 1.0  # 60 a minute here: one a second
    assert asyncio.run(admitted()) is True
    assert asyncio.run(admitted()) is False
