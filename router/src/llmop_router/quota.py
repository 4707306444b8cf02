"""Pure: what a request is charged and whether a tenant's limits admit it.

Rates are GCRA buckets (the generic cell rate algorithm): per bucket one number, the
theoretical arrival time (TAT). A unit of cost takes `interval = 60 s / limit`; a request of
cost `c` at `now` is admitted when `max(TAT, now) + c*interval - now <= tau` (the burst
tolerance, `burstSeconds` of rate, or the request's own cost when that is larger, so one big
request is never refused forever), which then becomes the new TAT. The refusal says exactly
when the request would pass (`Retry-After`). Over any window of `t` seconds a bucket admits at
most `rate * t + burst`.

Tokens are known only at the end, so admission reserves an estimate (the prompt at ~4
characters a token plus `min(max_tokens, reserveOutputTokens)`) and settlement moves the TAT by
the difference: debt when the answer was longer, a refund (never past full) when shorter.

All buckets of one request are checked together and charged only if every one admits: a
request refused by one limit consumes nothing of the others. The same arithmetic runs in the
shared store's script (`store`) and in the local store used without one or while it is down.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum

from llmop_router.tenants import Rates, Tenant

MINUTE_MS = 60_000.0
LEASE_MS = 60_000
"""A concurrency lease's life: renewed while its request lasts, so a router that dies leaves
leases that expire by themselves (never a stuck count)."""
PICO = 10**12
"""Money is counted in integer millionths of a millionth of the currency: a price per million
tokens with up to 6 decimals is a whole number of picos per token, so costs add up exactly."""


class Charge(StrEnum):
    """What a bucket counts, so settlement knows how to correct it."""

    REQUESTS = "requests"
    TOKENS = "tokens"
    OUTPUT_TOKENS = "output_tokens"


@dataclass(frozen=True)
class Bucket:
    key: str
    """The bucket's name under its tenant, e.g. `tpm` or `m:llama:tpm`."""
    charge: Charge
    limit: int
    """Per minute."""
    cost: int
    burst_seconds: int

    @property
    def interval_ms(self) -> float:
        return MINUTE_MS / self.limit

    @property
    def tau_ms(self) -> float:
        """The burst tolerance, at least the request's own cost."""
        return max(self.burst_seconds * 1000.0, self.cost * self.interval_ms)


@dataclass(frozen=True)
class Estimate:
    input_tokens: int
    output_tokens: int
    """Reserved: `min(max_tokens, reserveOutputTokens)`."""


def estimate(prompt_chars: int, max_tokens: int | None, tenant: Tenant) -> Estimate:
    reserve = tenant.reserve_output_tokens
    output = reserve if max_tokens is None else min(max_tokens, reserve)
    return Estimate(math.ceil(prompt_chars / 4), output)


def _scope(rates: Rates, prefix: str, est: Estimate, burst: int) -> list[Bucket]:
    buckets = []
    if rates.requests_per_minute is not None:
        buckets.append(Bucket(f"{prefix}rpm", Charge.REQUESTS, rates.requests_per_minute, 1, burst))
    if rates.tokens_per_minute is not None:
        cost = est.input_tokens + est.output_tokens
        buckets.append(Bucket(f"{prefix}tpm", Charge.TOKENS, rates.tokens_per_minute, cost, burst))
    if rates.output_tokens_per_minute is not None:
        buckets.append(
            Bucket(
                f"{prefix}otpm",
                Charge.OUTPUT_TOKENS,
                rates.output_tokens_per_minute,
                est.output_tokens,
                burst,
            )
        )
    return buckets


@dataclass(frozen=True)
class Admission:
    """One request's ask of the store: all or nothing."""

    tenant: str
    model: str
    request_id: str
    buckets: tuple[Bucket, ...]
    concurrency: int | None
    """The tenant's cap on requests at once (a lease per request), or None."""
    budget_picos: int | None
    month: str
    """`YYYY-MM` (UTC): the usage hash the budget reads."""
    estimate: Estimate

    @property
    def limited(self) -> bool:
        """Whether there is anything to decide: a bucket, a concurrency cap or a budget. A
        request of a tenant without limits is only metered (at settlement): its admission
        needs no answer from the store."""
        return bool(self.buckets) or self.concurrency is not None or self.budget_picos is not None


def admission(tenant: Tenant, model: str, request_id: str, est: Estimate, month: str) -> Admission:
    buckets = _scope(tenant.rates, "", est, tenant.burst_seconds)
    model_rates = tenant.rates_for(model)
    if model_rates is not None:
        buckets += _scope(model_rates, f"m:{model}:", est, tenant.burst_seconds)
    budget = None if tenant.monthly_budget is None else int(tenant.monthly_budget * PICO)
    return Admission(
        tenant.name,
        model,
        request_id,
        tuple(buckets),
        tenant.max_concurrent_requests,
        budget,
        month,
        est,
    )


class Refused(StrEnum):
    """Why an admission failed (the metric's `reason`)."""

    REQUESTS = "requests"
    TOKENS = "tokens"
    OUTPUT_TOKENS = "output_tokens"
    CONCURRENCY = "concurrency"
    BUDGET = "budget"


@dataclass(frozen=True)
class Decision:
    refused: Refused | None
    retry_after_ms: int = 0
    remaining: dict[str, int] = field(default_factory=dict)
    """Bucket key → units left after this request (for `x-ratelimit-remaining-*`)."""
    reset_ms: dict[str, int] = field(default_factory=dict)
    """Bucket key → ms until the bucket is full again (for `x-ratelimit-reset-*`)."""

    @property
    def admitted(self) -> bool:
        return self.refused is None


@dataclass(frozen=True)
class Gcra:
    """One bucket's answer: admitted or not, its TAT if charged, how long to wait if not."""

    admitted: bool
    tat: float
    retry_after_ms: float
    remaining: int


def gcra(tat: float | None, now: float, bucket: Bucket) -> Gcra:
    start = now if tat is None or tat < now else tat
    new = start + bucket.cost * bucket.interval_ms
    tau = bucket.tau_ms
    if new - now > tau:
        return Gcra(False, start, new - tau - now, 0)
    remaining = int((tau - (new - now)) / bucket.interval_ms)
    return Gcra(True, new, 0.0, remaining)


def settled_tat(tat: float | None, now: float, delta: int, interval_ms: float) -> float:
    """The TAT after correcting a charge by `delta` units (actual - reserved): later by a debt,
    earlier by a refund but never before `now` (a bucket refills to full, not past it)."""
    start = now if tat is None or tat < now else tat
    return max(start + delta * interval_ms, now)


def bucket_delta(bucket: Bucket, actual_input: int, actual_output: int, est: Estimate) -> int:
    if bucket.charge is Charge.TOKENS:
        return actual_input + actual_output - est.input_tokens - est.output_tokens
    if bucket.charge is Charge.OUTPUT_TOKENS:
        return actual_output - est.output_tokens
    return 0


@dataclass(frozen=True)
class Usage:
    """What a request used, as the engine's `usage` said (or as counted when it had none)."""

    input_tokens: int
    output_tokens: int
    cached_tokens: int = 0
    exact: bool = True
    """False: an aborted stream, charged its prompt estimate and the events relayed."""


@dataclass(frozen=True)
class Price:
    """Picos per token (a price per million tokens times a million)."""

    input: int = 0
    cached_input: int = 0
    output: int = 0

    @classmethod
    def per_million(
        cls, input: Decimal, output: Decimal, cached_input: Decimal | None = None
    ) -> Price:
        per_token = Decimal(PICO) / Decimal(1_000_000)
        cached = input if cached_input is None else cached_input
        return cls(
            input=int(input * per_token),
            cached_input=int(cached * per_token),
            output=int(output * per_token),
        )

    def cost_picos(self, usage: Usage) -> int:
        cached = min(usage.cached_tokens, usage.input_tokens)
        return (
            (usage.input_tokens - cached) * self.input
            + cached * self.cached_input
            + usage.output_tokens * self.output
        )


FREE = Price()
