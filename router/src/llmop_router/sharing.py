"""Priority and fair sharing (docs/gateway.md, "Priority and fair sharing"): the I/O around the
pure queues of `fairqueue.py`.

With the gateway on, an admitted request asks here for a slot of its model. It goes at once
while one is free and nobody waits; else it waits, and is handed a slot as one frees (a request
through this pod finishes: no polling on that path), highest priority first, then the tenant
with the least weighted service, then that tenant's oldest. A pump per busy model also looks
every `TICK_SECONDS` for deadlines and for slots that new endpoints bring. A request that
waited its model's fallback's `afterSeconds` leaves for the fallback (the app sends it).

Refusals: 429 with `Retry-After` when the model has endpoints but none for this request now
(sheddable while saturated, queue full, displaced by a higher priority, waited past its class's
bound or `--queue-wait-seconds`); 503 when the wait ended with no endpoint, or this pod stops.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, replace

from aiohttp import web

from llmop_router.answers import error
from llmop_router.contract import PRIORITY_CLASS_HEADER
from llmop_router.fairqueue import (
    DISPLACED,
    FULL,
    OUTPUT_WEIGHT,
    SHED,
    FairQueues,
    Key,
    Waiting,
)
from llmop_router.limits import Limits
from llmop_router.metrics import QueueMetrics
from llmop_router.priorities import Classes, PriorityClass
from llmop_router.routes import Backend, Choice, RouteTable

TICK_SECONDS = 0.1
RETRY_AFTER_SECONDS = "1"
TIMEOUT = "timeout"
STOPPING = "stopping"
SATURATED = "saturated"
UNAVAILABLE = "unavailable"
"""Why a fallback answers: a request the model had no slot for in time, or nothing answered."""


@dataclass(frozen=True)
class Turn:
    """A slot given to a request: handed back by `Sharing.finish`."""

    key: Key
    model: str
    tenant: str
    class_name: str
    weight: int
    cost: float
    waited: float


@dataclass(frozen=True)
class Refusal:
    """Why a request got no slot (`kind`: SHED, FULL, DISPLACED, TIMEOUT, STOPPING, or
    SATURATED for a fallback to take it), and the answer that says so."""

    kind: str
    answer: web.Response


def cost_of(input_tokens: int, output_tokens: int) -> float:
    """Tokens of service: an output token weighs OUTPUT_WEIGHT input tokens."""
    return input_tokens + OUTPUT_WEIGHT * output_tokens


class Sharing:
    """Every model's fair queue on this router pod."""

    def __init__(self, table: RouteTable, metrics: QueueMetrics, limits: Limits) -> None:
        self.table = table
        self.metrics = metrics
        self.wait_seconds = limits.queue_wait_seconds
        self.queues = FairQueues(limits.max_queued_requests, limits.max_queued_bytes)
        self.replicas = 1
        """Router pods sharing the engines (`--replicas`): each sends 1/N of a model's slots."""
        self._waiters: dict[int, asyncio.Future[str]] = {}
        self._pumps: dict[Key, asyncio.Task[None]] = {}
        self.metrics.waiting.set_function(lambda: self.queues.total)

    def slots(self, backend: Backend | None) -> int:
        """The model's slots through this pod: its ready endpoints x the engine's batch, this
        pod's share of them (rounded up: at worst the engines queue a few)."""
        if backend is None or not backend.ring.endpoints:
            return 0
        return self._share(backend.wake.concurrency * len(backend.ring.endpoints))

    def _share(self, slots: int) -> int:
        """This pod's share of `slots`, rounded up."""
        return -(-slots // self.replicas)

    def free_first(self, choice: Choice) -> Choice:
        """`choice` with the endpoints that have a free slot of this pod's share first (the ring
        picked by prefix and load; a pod full to its batch would queue the request again, in
        the engine, behind whatever came first)."""
        share = self._share(choice.backend.wake.concurrency) if choice.backend.ring.endpoints else 0
        in_flight = self.table.in_flight
        order = sorted(choice.pick.order, key=lambda e: in_flight.get(e, 0) >= share)
        if order == list(choice.pick.order):
            return choice
        return replace(choice, pick=replace(choice.pick, order=tuple(order)))

    def turn(
        self,
        backend: Backend,
        model: str,
        *,
        tenant: str,
        priority: PriorityClass,
        weight: int,
        cost: float,
        size: int,
        saturated_after: float | None = None,
    ) -> Turn | Refusal | Coroutine[None, None, Turn | Refusal]:
        """A slot of `model` (served by `backend`) under the class `priority`. Decided at once
        when a slot is free (the turn) or none can be waited for (the refusal): the common case
        costs the request no turn of the event loop, which under load is a millisecond or more.
        Else the request waits in the queue, and what comes back is to be awaited: the turn,
        or why none (SATURATED once it waited `saturated_after` seconds, for a fallback to take
        it)."""
        key = (backend.namespace, backend.name)
        loop = asyncio.get_running_loop()
        started = loop.time()
        wait = priority.max_wait_seconds or self.wait_seconds
        verdict = self.queues.admit(
            key,
            tenant=tenant,
            terms=priority,
            weight=weight,
            cost=cost,
            size=size,
            now=started,
            wait_seconds=wait,
            slots=self.slots(backend),
        )
        if verdict.displaced is not None:
            self._resolve(verdict.displaced, DISPLACED)
        if verdict.go:
            self.metrics.outcomes.labels("dispatched").inc()
            self.metrics.wait_seconds.observe(0.0)
            return Turn(key, model, tenant, priority.name, weight, cost, 0.0)
        if verdict.waiting is None:
            return self._refused(verdict.refused, backend, tenant=tenant, priority=priority)
        item = verdict.waiting
        future: asyncio.Future[str] = loop.create_future()
        self._waiters[item.ticket] = future
        if key not in self._pumps:
            self._pumps[key] = asyncio.create_task(self._pump(key, model))
        # A class above it may wait only for want of its own share: a slot may be free for it.
        self._hand_out(key, backend)
        return self._waited(backend, model, item, future, started, saturated_after)

    async def _waited(  # noqa: PLR0917 - the queued request's parts, from `turn`
        self,
        backend: Backend,
        model: str,
        item: Waiting,
        future: asyncio.Future[str],
        started: float,
        saturated_after: float | None,
    ) -> Turn | Refusal:
        key = (backend.namespace, backend.name)
        outcome = await self._wait(model, item, future, key=key, saturated_after=saturated_after)
        waited = asyncio.get_running_loop().time() - started
        priority = item.terms
        if outcome != "go":
            return self._refused(
                outcome, backend, tenant=item.tenant, priority=priority, waited=waited, model=model
            )
        self.metrics.outcomes.labels("dispatched").inc()
        self.metrics.wait_seconds.observe(waited)
        return Turn(key, model, item.tenant, priority.name, item.weight, item.cost, waited)

    async def _wait(
        self,
        model: str,
        item: Waiting,
        future: asyncio.Future[str],
        *,
        key: Key,
        saturated_after: float | None,
    ) -> str:
        """The waiting request's outcome: "go", or why not."""
        try:
            if saturated_after is not None:
                await asyncio.wait([future], timeout=saturated_after)
                if not future.done() and self.queues.leave(key, item.ticket):
                    # Waited long enough: the request goes to its model's fallback instead.
                    future.set_result(SATURATED)
            return await future
        except asyncio.CancelledError:
            # The client went away while waiting: it leaves the queue, or gives back the slot
            # it was handed in the same instant.
            if not future.cancelled() and future.done() and future.result() == "go":
                self.queues.done(key, item.tenant, item.terms.name, item.weight, -item.cost)
                self._hand_out(key, self.table.backends.get(model))
            elif self.queues.leave(key, item.ticket):
                self.metrics.outcomes.labels("left").inc()
            raise
        finally:
            self._waiters.pop(item.ticket, None)

    def finish(self, turn: Turn, used: float) -> None:
        """The request ended having used `used` tokens of service: its slot goes to the next
        in line."""
        self.queues.done(turn.key, turn.tenant, turn.class_name, turn.weight, used - turn.cost)
        self._hand_out(turn.key, self.table.backends.get(turn.model))

    def stop(self) -> None:
        """Answer every waiting request 503 (this pod stops; the client's retry goes elsewhere)."""
        for _key, item in self.queues.take_all():
            self._resolve(item, STOPPING)

    def close(self) -> None:
        self.stop()
        for task in self._pumps.values():
            task.cancel()

    def _hand_out(self, key: Key, backend: Backend | None) -> None:
        for item in self.queues.dispatch(key, self.slots(backend)):
            self._resolve(item, "go")

    def _resolve(self, item: Waiting, outcome: str) -> None:
        future = self._waiters.get(item.ticket)
        if future is not None and not future.done():
            future.set_result(outcome)

    async def _pump(self, key: Key, model: str) -> None:
        """While requests for this model wait: time out the ones past their deadline, and hand
        out slots that appeared without a request finishing (a new endpoint)."""
        loop = asyncio.get_running_loop()
        try:
            while self.queues.waiting(key):
                for item in self.queues.expire(key, loop.time()):
                    self._resolve(item, TIMEOUT)
                self._hand_out(key, self.table.backends.get(model))
                await asyncio.sleep(TICK_SECONDS)
        finally:
            self._pumps.pop(key, None)

    def _refused(
        self,
        kind: str,
        backend: Backend,
        *,
        tenant: str,
        priority: PriorityClass,
        waited: float = 0.0,
        model: str = "",
    ) -> Refusal:
        self.metrics.outcomes.labels(kind).inc()
        cr = f"LLMDeployment {backend.namespace}/{backend.name}"
        retry = {"Retry-After": RETRY_AFTER_SECONDS}
        if kind == SHED:
            message = (
                f"{cr} is saturated and tenant {tenant!r}'s requests are of the sheddable "
                f"LLMPriorityClass {priority.name!r}: refused while no slot is free for them; "
                "retry later"
            )
            return Refusal(kind, error(429, message, "RateLimitError", retry))
        if (
            kind == FULL
            and priority.max_requests is not None
            and (self.queues.by_class[priority.name] >= priority.max_requests)
        ):
            message = (
                f"{cr} is saturated and {priority.max_requests} requests of LLMPriorityClass "
                f"{priority.name!r} already wait on this router pod (spec.queue.maxRequests); "
                "retry later"
            )
            return Refusal(kind, error(429, message, "RateLimitError", retry))
        if kind == FULL:
            queues = self.queues
            message = (
                f"{cr} is saturated and this router pod's queue is full ({queues.total} "
                f"requests, {queues.total_bytes} bytes of bodies; --max-queued-requests "
                f"{queues.max_requests}, --max-queued-bytes {queues.max_bytes}); retry later"
            )
            return Refusal(kind, error(429, message, "RateLimitError", retry))
        if kind == DISPLACED:
            message = (
                f"{cr} is saturated: this request (LLMPriorityClass {priority.name!r}) gave "
                "its place in the full queue to one of a higher class; retry later"
            )
            return Refusal(kind, error(429, message, "RateLimitError", retry))
        if kind == SATURATED:
            message = (
                f"{cr} is saturated: no slot freed for this request within {waited:.1f} s and "
                "its fallback could not take it; retry later"
            )
            return Refusal(kind, error(429, message, "RateLimitError", retry))
        if kind == TIMEOUT:
            if self.slots(self.table.backends.get(model)):
                message = (
                    f"{cr} is saturated: no slot freed for this request within {waited:.1f} s "
                    f"({_wait_bound(priority, self.wait_seconds)}); retry later"
                )
                return Refusal(kind, error(429, message, "RateLimitError", retry))
            message = f"{cr} has no ready replica left to serve this waiting request"
            return Refusal(kind, error(503, message, "ServiceUnavailableError", retry))
        message = f"this router pod is stopping while the request waited for {cr}; retry"
        return Refusal(STOPPING, error(503, message, "ServiceUnavailableError", retry))


def _wait_bound(priority: PriorityClass, default: float) -> str:
    if priority.max_wait_seconds:
        wait = priority.max_wait_seconds
        return f"LLMPriorityClass {priority.name!r} spec.queue.maxWaitSeconds {wait:g}"
    return f"--queue-wait-seconds {default:g}"


def priority_of(
    request: web.Request, classes: Classes, name: str | None
) -> PriorityClass | web.Response:
    """The request's class: its tenant's (`name`), or one of lower or equal value that the
    request asks for (`X-Llmop-Priority-Class`); a class it may not have is answered 400."""
    own = classes.of_tenant(name)
    asked = request.headers.get(PRIORITY_CLASS_HEADER)
    if asked is None:
        return own
    found = classes.lowered(own, asked.strip()[:253])
    if isinstance(found, str):
        return error(400, f"{PRIORITY_CLASS_HEADER}: {found}", "BadRequestError")
    return found
