"""The gateway's steps in the request path: who is calling (before the body is read), may
they use this model, do their limits admit the request (one call to the store), and, after the
answer, what it used and cost (settled and metered in the background, even when the client
went away).

Identity comes only from the API key (`Authorization: Bearer`, or `x-api-key`); the key never
reaches an engine, nor do client-sent `x-llmop-*` headers. Refusals are OpenAI-shaped: 401 for
a key, 404 for a model the tenant may not use (the same answer as a model that does not exist),
429 with `Retry-After`, `retry-after-ms` and `x-ratelimit-*` for a limit, 403
`insufficient_quota` for a spent budget (clients retry a 429; a budget does not come back in
seconds), 503 when the store is down and the gateway fails closed.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any, Protocol

from aiohttp import web
from multidict import CIMultiDict

from llmop_router import contract
from llmop_router.answers import error
from llmop_router.gpu_price import GpuTime, plan_facts
from llmop_router.metering import Tap
from llmop_router.metrics import GatewayMetrics
from llmop_router.priorities import Classes, PriorityClass, PriorityClassError, parse_priority_class
from llmop_router.quota import (
    FREE,
    PICO,
    Admission,
    Bucket,
    Charge,
    Decision,
    Price,
    Refused,
    Usage,
    admission,
    estimate,
)
from llmop_router.store import Health, Store, StoreUnavailableError
from llmop_router.tenant_status import conditions_of, status_patch, usage_of
from llmop_router.tenants import Directory, Identity, KeyRefusal, Tenant, TenantError, parse_tenant

PRICING = contract.Pricing
log = logging.getLogger("llmop_router.gateway")
access_log = logging.getLogger("llmop_router.access")

UNLIMITED = Decision(None)
"""The admission of a request with no limit to check."""
RENEW_SECONDS = 20.0
"""How often the leases of requests still running are extended (they last `quota.LEASE_MS`)."""
MAX_LABEL_VALUES = 1000
"""Tenants named in metric labels; past it, `other` (a label per tenant is bounded by the
platform's LLMTenants, this by a typo'd script creating thousands)."""
NO_TENANT = "-"
OTHER = "other"
CLIENT_HEADER_PREFIX = "x-llmop-"


def bearer(headers: Mapping[str, str]) -> str | None:
    value = headers.get("Authorization")
    if value is not None:
        scheme, _, token = value.partition(" ")
        return token.strip() if scheme.lower() == "bearer" else None
    return headers.get("x-api-key")


def month_of(unix: float) -> str:
    return _month_of_day(int(unix // 86_400))


@functools.lru_cache(maxsize=4)
def _month_of_day(day: int) -> str:
    # Per day, not per request: formatting a date costs more than the rest of an admission.
    return datetime.fromtimestamp(day * 86_400, UTC).strftime("%Y-%m")


def price_of(pricing: object) -> tuple[Price, str] | None:
    """`spec.router.pricing` → picos per token and the currency; None when absent or bad."""
    if not isinstance(pricing, Mapping):
        return None
    try:
        values = {
            key: Decimal(str(pricing[key]))
            for key in (PRICING.INPUT, PRICING.OUTPUT, PRICING.CACHED_INPUT)
            if pricing.get(key) is not None
        }
    except InvalidOperation:
        return None
    if any(not v.is_finite() or v < 0 for v in values.values()):
        return None
    price = Price.per_million(
        values.get(PRICING.INPUT, Decimal(0)),
        values.get(PRICING.OUTPUT, Decimal(0)),
        values.get(PRICING.CACHED_INPUT),
    )
    return price, str(pricing.get(PRICING.CURRENCY) or "USD")


class Pricer(Protocol):
    """What a request cost, in picos of the price's currency: per token (`quota.Price`, from
    `spec.router.pricing`) or in GPU time (`gpu_price.GpuTime`, from the GPU-hour price)."""

    def cost_picos(self, usage: Usage) -> int: ...


@dataclass(frozen=True)
class GpuHourPrice:
    """The router's `--gpu-hour-price` and its currency."""

    price: Decimal
    currency: str


def store_health(metrics: GatewayMetrics) -> Health:
    """What the shared store's breaker reports, as the gateway's metrics."""
    return Health(
        degraded=lambda on: metrics.store_degraded.set(1 if on else 0),
        error=lambda op: metrics.of(metrics.store_errors, op).inc(),
        latency=lambda op, seconds: metrics.of(metrics.store_seconds, op).observe(seconds),
    )


@dataclass
class Ticket:
    """An admitted request, from admission to settlement."""

    identity: Identity
    ask: Admission
    charged: bool
    tap: Tap
    started: float
    client_request_id: str = ""
    """The client's `X-Request-Id` (at most 64 characters), for the log and the engine only."""
    headers: dict[str, str] = field(default_factory=dict)
    """`x-ratelimit-*` for the answer: what the admission left of each limit."""


@dataclass
class Gateway:
    store: Store
    metrics: GatewayMetrics
    directory: Directory = field(default_factory=Directory)
    prices: dict[tuple[str, str], tuple[Pricer, str]] = field(default_factory=dict)
    """CR (namespace, name) → its price and currency."""
    gpu_hour: GpuHourPrice | None = None
    """Prices a CR without `spec.router.pricing` in GPU time (from its `status.plan`)."""
    clock: Callable[[], float] = time.time
    running: dict[str, Ticket] = field(default_factory=dict)
    _settling: set[asyncio.Task[None]] = field(default_factory=set)
    _renewing: asyncio.Task[None] | None = None
    _tenant_docs: dict[str, Tenant] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)
    """Tenant name → why its object is not used (logged once, and in its status)."""
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Tenant name → its object as last watched (its status's conditions carry over)."""
    classes: Classes = field(default_factory=lambda: Classes.of(()))
    """The `LLMPriorityClass`es: what a tenant's requests wait under at a saturated model."""
    _class_docs: dict[str, PriorityClass] = field(default_factory=dict)

    # -- tenants -------------------------------------------------------------------------

    def set_tenants(self, tenants: list[Tenant]) -> None:
        self._tenant_docs = {t.name: t for t in tenants}
        self._rebuild()

    def on_tenant(self, kind: str, obj: dict[str, Any]) -> None:
        """A watch event of `LLMTenant`s (`SYNC` lists them all)."""
        if kind == "SYNC":
            self._tenant_docs = {}
            self.problems = {}
            self.objects = {}
            for item in obj.get("items") or []:
                self._take(item)
        elif kind == "DELETED":
            name = str((obj.get("metadata") or {}).get("name"))
            self._tenant_docs.pop(name, None)
            self.problems.pop(name, None)
            self.objects.pop(name, None)
        else:
            self._take(obj)
        self._rebuild()

    def set_classes(self, classes: list[PriorityClass]) -> None:
        self._class_docs = {c.name: c for c in classes}
        self.classes = Classes.of(self._class_docs.values())

    def on_priority_class(self, kind: str, obj: dict[str, Any]) -> None:
        """A watch event of `LLMPriorityClass`es (`SYNC` lists them all). One the router cannot
        read is left out (its tenants get the default class), and logged."""
        if kind == "SYNC":
            self._class_docs = {}
            items = obj.get("items") or []
        else:
            items = [obj]
        for item in items:
            name = str((item.get("metadata") or {}).get("name"))
            self._class_docs.pop(name, None)
            if kind == "DELETED":
                continue
            try:
                self._class_docs[name] = parse_priority_class(item)
            except PriorityClassError as exc:
                log.error("%s; tenants naming it get the default class until it is fixed", exc)
        self.classes = Classes.of(self._class_docs.values())

    def _take(self, obj: dict[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name"))
        self.objects[name] = obj
        try:
            tenant = parse_tenant(obj)
        except TenantError as exc:
            # Its keys stop working: a tenant the router cannot read is not guessed at.
            self._tenant_docs.pop(name, None)
            if self.problems.get(name) != str(exc):
                log.error("%s; its keys are refused until it is fixed", exc)
            self.problems[name] = str(exc)
            return
        self.problems.pop(name, None)
        self._tenant_docs[tenant.name] = tenant

    def _rebuild(self) -> None:
        self.directory = Directory.of(self._tenant_docs.values())
        for digest, owners in self.directory.clashes.items():
            log.error(
                "an API key hash (%s…) is listed by LLMTenants %s: it is refused",
                digest[:8],
                ", ".join(owners),
            )

    async def tenant_statuses(self, routed: list[str], now: float) -> dict[str, dict[str, Any]]:
        """Each watched tenant's status patch (`tenant_status`): conditions, and the month's
        usage where the store answers."""
        month = month_of(now)
        patches = {}
        for name, obj in list(self.objects.items()):
            conditions = conditions_of(
                name, self.directory, self.problems.get(name), routed, now, classes=self.classes
            )
            try:
                usage = usage_of(month, await self.store.usage(name, month))
            except Exception as exc:
                log.info("usage of tenant %s not read: %s", name, exc)
                usage = None
            previous = ((obj.get("status") or {}).get("conditions")) or []
            patches[name] = status_patch(conditions, previous, usage, now)
        return patches

    def set_price(
        self, cr: tuple[str, str], pricing: object, *, gpus: int = 0, status: object = None
    ) -> None:
        """The CR's price: its `spec.router.pricing`; without one, with a GPU-hour price, the
        GPU time of its `gpus` (a replica's) at its plan in `status`; else free."""
        found: tuple[Pricer, str] | None = price_of(pricing)
        if pricing is None and self.gpu_hour is not None:
            by_time = GpuTime.of(self.gpu_hour.price, gpus, plan_facts(status))
            found = None if by_time is None else (by_time, self.gpu_hour.currency)
        if found is None:
            self.prices.pop(cr, None)
        else:
            self.prices[cr] = found

    def tenant_label(self, name: str) -> str:
        if name in self.directory.tenants and len(self.directory.tenants) <= MAX_LABEL_VALUES:
            return name
        return OTHER if name != NO_TENANT else NO_TENANT

    # -- the request path ------------------------------------------------------------------

    def authenticate(self, request: web.Request) -> Identity | web.Response:
        found = self.directory.identify(bearer(request.headers), self.clock())
        if isinstance(found, KeyRefusal):
            self.metrics.of(self.metrics.rejected, NO_TENANT, found.reason).inc()
            return error(
                401,
                found.message,
                "AuthenticationError",
                {"WWW-Authenticate": 'Bearer realm="llmop"'},
            )
        return found

    def model_refusal(self, identity: Identity, model: str) -> web.Response | None:
        if identity.tenant.may_use(model):
            return None
        self.metrics.of(
            self.metrics.rejected, self.tenant_label(identity.tenant.name), "model"
        ).inc()
        return model_not_found(model)

    async def admit(
        self,
        identity: Identity,
        model: str,
        *,
        prompt_chars: int,
        max_tokens: int | None,
        stream: bool,
        strip_usage: bool,
        request_id: str,
        client_request_id: str = "",
    ) -> Ticket | web.Response:
        tenant = identity.tenant
        label = self.tenant_label(tenant.name)
        cap = tenant.max_tokens_per_request
        if cap is not None and max_tokens is not None and max_tokens > cap:
            self.metrics.of(self.metrics.rejected, label, "max_tokens").inc()
            return error(
                400,
                f"max_tokens {max_tokens} is more than tenant {tenant.name!r} may ask for in "
                f"one request ({cap}, spec.limits.maxTokensPerRequest)",
                "BadRequestError",
            )
        now = self.clock()
        ask = admission(
            tenant, model, request_id, estimate(prompt_chars, max_tokens, tenant), month_of(now)
        )
        try:
            # A tenant without limits waits for no round trip to the store (nor for a store
            # that is down: there is nothing to exceed); its usage settles as any other's.
            decision = await self.store.admit(ask) if ask.limited else UNLIMITED
        except StoreUnavailableError:
            self.metrics.of(self.metrics.rejected, label, "store_unavailable").inc()
            return error(
                503,
                "the gateway's limit store does not answer and the gateway fails closed; "
                "retry shortly",
                "ServiceUnavailableError",
                {"Retry-After": "5"},
            )
        charged = decision.admitted
        if not decision.admitted:
            assert decision.refused is not None
            if not tenant.shadow:
                self.metrics.of(self.metrics.rejected, label, decision.refused.value).inc()
                return refusal(tenant, ask, decision)
            self.metrics.of(self.metrics.shadow_rejected, label, decision.refused.value).inc()
        self.metrics.of(self.metrics.in_flight, label).inc()
        ticket = Ticket(
            identity,
            ask,
            charged,
            Tap(stream=stream, strip_usage=strip_usage),
            time.monotonic(),
            client_request_id,
            rate_limit_headers(ask, decision),
        )
        self.running[request_id] = ticket
        self._ensure_renewing()
        return ticket

    def headers_for(self, decision_headers: CIMultiDict[str], ticket: Ticket) -> None:
        """Strip what only the gateway may see: the client's key and `x-llmop-*`."""
        for name in list(decision_headers.keys()):
            lower = name.lower()
            if lower in ("authorization", "x-api-key") or lower.startswith(CLIENT_HEADER_PREFIX):
                del decision_headers[name]
        decision_headers["X-Request-Id"] = ticket.client_request_id or ticket.ask.request_id

    def finish(self, ticket: Ticket, status: int, cr: tuple[str, str] | None) -> None:
        """Meter and log now, at the price of `cr` (the LLMDeployment, or LLMExternalModel, that
        answered); settle with the store in the background: the handler may be cancelled (the
        client went away), the settlement must not be."""
        ended = time.monotonic()
        ask = ticket.ask
        self.running.pop(ask.request_id, None)
        answered = 200 <= status < 300
        usage = (
            ticket.tap.used(ask.estimate.input_tokens)
            if answered
            else Usage(0, 0)  # an engine that refused did no work for it
        )
        price, currency = self.prices.get(cr, (FREE, "USD")) if cr else (FREE, "USD")
        cost = price.cost_picos(usage)
        task = asyncio.ensure_future(self._settle(ask, usage, cost, ticket.charged))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)
        self._meter(ticket, status, usage, cost, currency)
        if access_log.isEnabledFor(logging.INFO):
            access_log.info("%s", access_line(ticket, status, usage, cost, currency, ended=ended))

    async def _settle(self, ask: Admission, usage: Usage, cost: int, charged: bool) -> None:
        try:
            await self.store.settle(ask, usage, cost, charged=charged)
        except Exception:
            log.exception("settling request %s failed", ask.request_id)

    def _meter(self, ticket: Ticket, status: int, usage: Usage, cost: int, currency: str) -> None:
        ask, metrics = ticket.ask, self.metrics
        tenant_label = self.tenant_label(ask.tenant)
        metrics.of(metrics.in_flight, tenant_label).dec()
        metrics.of(metrics.requests, tenant_label, ask.model, str(status)).inc()
        if usage.input_tokens or usage.output_tokens:
            cached = min(usage.cached_tokens, usage.input_tokens)
            metrics.of(metrics.tokens, tenant_label, ask.model, "input").inc(
                usage.input_tokens - cached
            )
            if cached:
                metrics.of(metrics.tokens, tenant_label, ask.model, "cached_input").inc(cached)
            metrics.of(metrics.tokens, tenant_label, ask.model, "output").inc(usage.output_tokens)
            if not usage.exact:
                metrics.of(metrics.estimated, tenant_label, ask.model).inc(
                    usage.input_tokens + usage.output_tokens
                )
            if cost:
                metrics.of(metrics.cost, tenant_label, ask.model, currency).inc(cost / PICO)

    def _ensure_renewing(self) -> None:
        if self._renewing is None or self._renewing.done():
            self._renewing = asyncio.ensure_future(self._renew_forever())

    async def _renew_forever(self) -> None:
        while self.running:
            await asyncio.sleep(RENEW_SECONDS)
            leases = [
                (t.ask.tenant, t.ask.request_id)
                for t in list(self.running.values())
                if t.charged and t.ask.concurrency is not None
            ]
            try:
                await self.store.renew(leases)
            except Exception as exc:
                log.warning("renewing %d leases failed: %s", len(leases), exc)

    async def close(self) -> None:
        if self._renewing is not None:
            self._renewing.cancel()
        if self._settling:
            await asyncio.wait(self._settling, timeout=5)
        await self.store.close()


def new_request_id() -> str:
    # 128 random bits as 32 hex digits, as `uuid4().hex`, without building a UUID.
    return os.urandom(16).hex()


def access_line(
    ticket: Ticket, status: int, usage: Usage, cost: int, currency: str, *, ended: float
) -> str:
    """The request's access-log line (JSON): who, which model, what it used and cost, how
    long it took; never the prompt or the key."""
    ask = ticket.ask
    first_byte = ticket.tap.first_byte
    ttft = None if first_byte is None else first_byte - ticket.started
    return json.dumps(
        {
            "requestId": ask.request_id,
            "clientRequestId": ticket.client_request_id or None,
            "tenant": ask.tenant,
            "key": ticket.identity.key_name,
            "model": ask.model,
            "status": status,
            "inputTokens": usage.input_tokens,
            "cachedTokens": usage.cached_tokens,
            "outputTokens": usage.output_tokens,
            "usageExact": usage.exact,
            "cost": str(Decimal(cost) / PICO),
            "currency": currency,
            "ttftMs": None if ttft is None else round(ttft * 1000, 1),
            "durationMs": round((ended - ticket.started) * 1000, 1),
            "charged": ticket.charged,
        },
        separators=(",", ":"),
    )


def model_not_found(model: str) -> web.Response:
    return error(
        404,
        f"The model {model!r} does not exist or you do not have access to it.",
        "NotFoundError",
        code="model_not_found",
    )


_HEADER_SUFFIX = {
    Charge.REQUESTS: "requests",
    Charge.TOKENS: "tokens",
    Charge.OUTPUT_TOKENS: "output-tokens",
}


def rate_limit_headers(ask: Admission, decision: Decision) -> dict[str, str]:
    """OpenAI's `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` (and `-output-tokens`)
    of an admitted request: per kind, the bucket with the least left (the tenant's, or a
    stricter one of the model's), after this request's charge; `reset` is when that bucket is
    full again, as OpenAI writes it (`1s`, `6m0s`, `20ms`)."""
    tightest: dict[Charge, Bucket] = {}
    for bucket in ask.buckets:
        left = decision.remaining.get(bucket.key)
        if left is None:
            continue
        kept = tightest.get(bucket.charge)
        if kept is None or left < decision.remaining[kept.key]:
            tightest[bucket.charge] = bucket
    headers = {}
    for charge, bucket in tightest.items():
        suffix = _HEADER_SUFFIX[charge]
        headers[f"x-ratelimit-limit-{suffix}"] = str(bucket.limit)
        headers[f"x-ratelimit-remaining-{suffix}"] = str(max(0, decision.remaining[bucket.key]))
        headers[f"x-ratelimit-reset-{suffix}"] = duration(decision.reset_ms.get(bucket.key, 0))
    return headers


def duration(ms: int) -> str:
    """A wait as OpenAI's headers write it: `20ms`, `1.5s`, `6m0s`."""
    if ms < 1000:
        return f"{max(0, ms)}ms"
    minutes, rest = divmod(ms, 60_000)
    seconds = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    return f"{minutes}m{seconds}s" if minutes else f"{seconds}s"


def refusal(tenant: Tenant, ask: Admission, decision: Decision) -> web.Response:
    reason = decision.refused
    if reason is Refused.BUDGET:
        return error(
            403,
            f"tenant {tenant.name!r} has spent its monthly budget ({tenant.monthly_budget}, "
            f"spec.budget.monthly) for {ask.month}; it renews on the 1st (UTC), or a platform "
            "admin raises it",
            "PermissionDeniedError",
            code="insufficient_quota",
        )
    wait_ms = max(1, decision.retry_after_ms)
    headers = {"Retry-After": str(math.ceil(wait_ms / 1000)), "retry-after-ms": str(wait_ms)}
    for bucket in ask.buckets:
        if bucket.key.startswith("m:"):
            continue
        suffix = _HEADER_SUFFIX[bucket.charge]
        headers[f"x-ratelimit-limit-{suffix}"] = str(bucket.limit)
    if reason is Refused.CONCURRENCY:
        message = (
            f"tenant {tenant.name!r} has {tenant.max_concurrent_requests} requests running, its "
            "limit (spec.limits.maxConcurrentRequests); retry when one ends"
        )
    else:
        assert reason is not None
        message = (
            f"tenant {tenant.name!r} is over its {reason.value.replace('_', ' ')} per minute "
            f"limit; retry after {wait_ms / 1000:.3f} s"
        )
    return error(429, message, "RateLimitError", headers, code="rate_limit_exceeded")
