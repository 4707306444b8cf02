"""A request's cost in GPU time (`llmop_router.gpu_price`): read from `status.plan`, the
prefill, decode and KV-read shares of a replica's time, and a price of the replica's GPUs."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from llmop_router.gpu_price import GpuTime, PlanFacts, plan_facts
from llmop_router.quota import Usage
from support.manifests import PLAN_8B_ON_H100

GIB = 2**30
PLAN = PLAN_8B_ON_H100


def facts(**changed: Any) -> PlanFacts:
    found = plan_facts({"plan": {**PLAN, **changed}})
    assert found is not None
    return found


def test_the_plan_gives_the_times_to_read_weights_and_kv() -> None:
    found = facts()
    assert found.weights_seconds == pytest.approx(14.96 * GIB / 3350e9)  # ~4.8 ms
    assert found.kv_seconds_per_token == pytest.approx(131072 / 3350e9)  # ~39 ns
    assert (found.batch, found.kv_tokens, found.batch_tokens) == (1024, 433744, 8192)


@pytest.mark.parametrize(
    "status",
    [
        None,
        {},
        {"plan": None},
        {"plan": {**PLAN, "memoryBandwidthGBs": None}},  # an unknown GPU, a CPU engine
        {"plan": {k: v for k, v in PLAN.items() if k != "kvCacheTokens"}},
        {"plan": {**PLAN, "maxNumSeqs": 0}},
        {"plan": {**PLAN, "maxNumSeqs": True}},
        {"plan": {**PLAN, "kvBytesPerToken": "131072"}},
        {"plan": {**PLAN, "kvBytesPerToken": 0}},  # a pure Mamba model: its state not planned
        {"plan": {**PLAN, "activeWeightsGiBPerGPU": float("inf")}},
        {"plan": {**PLAN, "memoryBandwidthGBs": float("nan")}},
    ],
)
def test_a_plan_without_what_the_price_needs_prices_nothing(status: object) -> None:
    assert plan_facts(status) is None
    assert GpuTime.of(Decimal(2), 1, plan_facts(status)) is None


def test_no_gpus_no_price() -> None:
    assert GpuTime.of(Decimal(2), 0, facts()) is None


def test_a_request_s_time_is_its_prefill_decode_and_kv_reads() -> None:
    price = GpuTime.of(Decimal("2.49"), 1, facts())
    assert price is not None
    t_w, t_kv = 14.96 * GIB / 3350e9, 131072 / 3350e9
    # 1,000 prompt tokens, 200 out: 433,744 // 1,200 = 361 sequences of its size fit.
    expected = 1000 * t_w / 8192 + 200 * t_w / 361 + (200 * 1000 + 200 * 199 // 2) * t_kv
    assert price.seconds(Usage(1000, 200)) == pytest.approx(expected)
    assert price.cost_picos(Usage(1000, 200)) == pytest.approx(expected * 2.49 / 3600 * 1e12, abs=1)
    # About 0.04 USD a million output tokens at full load: a floor, not a list price.
    per_million = price.cost_picos(Usage(1000, 200)) / 200 * 1e6 / 1e12
    assert 0.03 < per_million < 0.06


def test_cached_prompt_tokens_skip_prefill_but_not_their_kv_reads() -> None:
    price = GpuTime.of(Decimal(1), 1, facts())
    assert price is not None
    fresh, cached = price.seconds(Usage(1000, 50)), price.seconds(Usage(1000, 50, 800))
    assert fresh - cached == pytest.approx(800 * facts().weights_seconds / 8192)
    assert price.seconds(Usage(1000, 50, 5000)) == price.seconds(Usage(1000, 50, 1000))


def test_a_long_context_pays_for_the_batch_it_crowds_out() -> None:
    """Per output token, a request of 100k tokens costs far more than one of 1k: its KV is read
    at every step and the cache holds only four such sequences, so the weights' read is shared
    by four, not by the engine's whole batch."""
    price = GpuTime.of(Decimal(1), 1, facts())
    assert price is not None
    short = price.seconds(Usage(1_000, 100)) / 100
    long = price.seconds(Usage(100_000, 100)) / 100
    assert long > 50 * short
    # A short request alone in a batch of 1,024 shares the weights' read with the others.
    assert price.seconds(Usage(10, 10)) < 10 * facts().weights_seconds / 100


def test_nothing_used_costs_nothing_and_a_cost_is_whole_picos_of_all_the_gpus() -> None:
    eight, one = (GpuTime.of(Decimal("2.49"), n, facts()) for n in (8, 1))
    assert eight is not None
    assert one is not None
    assert eight.cost_picos(Usage(0, 0)) == 0
    assert isinstance(eight.cost_picos(Usage(7, 3)), int)
    assert eight.cost_picos(Usage(7, 3)) == pytest.approx(8 * one.cost_picos(Usage(7, 3)), abs=8)
