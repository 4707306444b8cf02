"""What a request costs in GPU time, for a model whose owner set no price per token
(`spec.router.pricing` absent) when the router has a GPU-hour price (`--gpu-hour-price`).

vLLM's decode is bound by memory bandwidth: each step reads every GPU's (active) weights once
for the whole batch, and each sequence's KV cache once for that sequence. So a request's share
of a replica's time, at the nameplate bandwidth of its GPUs (`status.plan`, which the
operator's planner writes), is
    its uncached prompt tokens x t_weights / the step's token budget      (prefill, in chunks)
  + its output tokens x t_weights / the batch the engine runs             (decode)
  + t_kv x the KV it reads: at each of its output tokens, its whole context so far
where t_weights is the time to read one GPU's active weights and t_kv one token's KV; the
batch is the engine's `maxNumSeqs`, less where the KV cache cannot hold that many sequences of
this request's length (a long context takes room from the batch, so it pays more). Times the
replica's GPUs at the GPU-hour price, that is the request's cost.

These are floors: reached at full load and at nameplate bandwidth, with prefill as fast as
reading the weights (compute-bound prefill costs more); idle time is charged to no one and
shows in `llmop_gateway_gpu_cost_per_hour` against the tokens metered. A prompt token found in
the prefix cache costs no prefill, but its KV is read at every step like any other. A sliding
window or state layer's KV is counted as full attention's (more, never less, than is read).

Pure: values in, values out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal

from llmop_router import contract
from llmop_router.quota import PICO, Usage

GIB = 2**30
SECONDS_PER_HOUR = Decimal(3600)


@dataclass(frozen=True)
class PlanFacts:
    """What the GPU-time price needs of `status.plan` (per GPU, for one replica)."""

    weights_seconds: float
    """Time to read one GPU's active weights at its bandwidth: one decode step's floor."""
    kv_seconds_per_token: float
    """Time to read one token's KV cache on one GPU."""
    batch: int
    """Sequences the engine runs at once (`maxNumSeqs`)."""
    kv_tokens: int
    """Tokens the replica's KV cache holds."""
    batch_tokens: int
    """The scheduler's token budget per step (`maxNumBatchedTokens`)."""


def plan_facts(status: object) -> PlanFacts | None:
    """The plan's facts, or None when the plan has no bandwidth (an unknown GPU, a CPU engine,
    a model that does not fit) or is malformed."""
    plan = status.get(contract.Status.PLAN) if isinstance(status, Mapping) else None
    if not isinstance(plan, Mapping):
        return None
    keys = (
        contract.Status.MEMORY_BANDWIDTH,
        contract.Status.ACTIVE_WEIGHTS,
        contract.Status.KV_BYTES_PER_TOKEN,
        contract.Status.MAX_NUM_SEQS,
        contract.Status.KV_CACHE_TOKENS,
        contract.Status.MAX_NUM_BATCHED_TOKENS,
    )
    numbers = [n for n in (_positive(plan.get(key)) for key in keys) if n is not None]
    if len(numbers) < len(keys):
        return None
    bandwidth, weights, kv_bytes, batch, kv_tokens, budget = numbers
    bytes_per_second = bandwidth * 1e9
    return PlanFacts(
        weights_seconds=weights * GIB / bytes_per_second,
        kv_seconds_per_token=kv_bytes / bytes_per_second,
        batch=int(batch),
        kv_tokens=int(kv_tokens),
        batch_tokens=int(budget),
    )


def _positive(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


@dataclass(frozen=True)
class GpuTime:
    """A price in GPU time: `cost_picos` of a request, as `quota.Price` has it for tokens."""

    facts: PlanFacts
    picos_per_second: Decimal
    """The replica's GPUs' price per second, in picos of the currency."""

    @classmethod
    def of(cls, gpu_hour_price: Decimal, gpus: int, facts: PlanFacts | None) -> GpuTime | None:
        """None without a plan to price from, or without GPUs."""
        if facts is None or gpus < 1:
            return None
        return cls(facts, gpu_hour_price * gpus * PICO / SECONDS_PER_HOUR)

    def seconds(self, usage: Usage) -> float:
        """The request's share of its replica's time (see the module's docstring)."""
        facts = self.facts
        prompt, output = usage.input_tokens, usage.output_tokens
        fresh = prompt - min(usage.cached_tokens, prompt)
        batch = max(1, min(facts.batch, facts.kv_tokens // max(1, prompt + output)))
        kv_reads = output * prompt + output * (output - 1) // 2
        return (
            fresh * facts.weights_seconds / facts.batch_tokens
            + output * facts.weights_seconds / batch
            + kv_reads * facts.kv_seconds_per_token
        )

    def cost_picos(self, usage: Usage) -> int:
        return int(Decimal(self.seconds(usage)) * self.picos_per_second)
