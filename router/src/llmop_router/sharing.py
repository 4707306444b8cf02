"""Priority and fair sharing (docs/gateway.md, "Priority and fair sharing"): the I/O around the
pure queues of `fairqueue.py`.

With the gateway on, an admitted request asks here for a slot of its model. It goes at once
while one is free and nobody waits; else it waits, and is handed a slot as one frees (a request
through this pod finishes: no polling on that path), highest priority first, then the tenant
with the least weighted service, then that tenant's oldest. A pump per busy model also looks
every `TICK_SECONDS` for deadlines and for slots that new endpoints bring. A request that
waited its model's fallback's `afterSeconds` leaves for the fallback (the app sends it).

With several router pods and a shared store (`--replicas`, `--store`), each pod owns its share
of the slots and lends a freed one to a pod whose waiting work outranks its own (`loans`;
messages on the store's pub/sub: `store.Bus`), so priority holds across the pods and a request
waits for the first of all the model's slots to free, not of its own pod's.

The slots are the plan's guess until the engines say otherwise: every `--engine-readings-seconds`
this pod reads the running and waiting counts of the engines it has requests at
(`engine_readings`), and an engine that queues requests gets fewer until it has room again
(`engine_load`), so the queue, and priority, stays here rather than in the engine.

Refusals: 429 with `Retry-After` when the model has endpoints but none for this request now
(sheddable while saturated, queue full, displaced by a higher priority, waited past its class's
bound or `--queue-wait-seconds`); 503 when the wait ended with no endpoint, or this pod stops.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, replace
from typing import Any

from aiohttp import web

from llmop_router.answers import error
from llmop_router.contract import PRIORITY_CLASS_HEADER
from llmop_router.engine_load import EngineLoad, Reading
from llmop_router.engine_readings import MAX_ENGINES, Readings
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
from llmop_router.loans import BEAT_SECONDS, Advert, Loans
from llmop_router.metrics import QueueMetrics
from llmop_router.priorities import Classes, PriorityClass
from llmop_router.routes import Backend, Choice, RouteTable
from llmop_router.share_advice import ClassLoad
from llmop_router.store import Bus

log = logging.getLogger("llmop_router.sharing")

TICK_SECONDS = 0.1
SAMPLE_SECONDS = 1.0
"""How often each class's requests in flight are sampled (`share_advice`)."""
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
        self.bus: Bus | None = None
        """Set with several replicas and a shared store: slots are lent between the pods."""
        self.me = uuid.uuid4().hex[:16]
        """This pod among its peers (a restarted pod is a new one)."""
        self.loans = Loans()
        self._advertised: dict[Key, Advert] = {}
        """What this pod last told its peers it has waiting, per model."""
        self.epoch = 0
        """Starts again (+1) whenever this pod may have missed messages (`loans`)."""
        self._subscribed = False
        self._reset = False
        """A new epoch no peer has heard of yet: said on the next beat."""
        self._tasks: list[asyncio.Task[None]] = []
        self.readings: Readings | None = None
        """Set: the engines' own counts correct their slots (`engine_load`)."""
        self.load = EngineLoad()
        self.metrics.withheld.set_function(self._withheld_all)
        self.class_load = ClassLoad()
        """Each class's mean requests in flight per model: the shares to suggest."""
        self.metrics.suggested.suggestions = self._suggestions

    def start(self) -> None:
        """Listen to the other router pods (with a bus), and read the engines (with
        `readings`)."""
        if self._tasks:
            return
        if self.bus is not None:
            listening = self.bus.listen(self._received, self._lost)
            self._tasks = [asyncio.ensure_future(listening), asyncio.ensure_future(self._beat())]
        if self.readings is not None:
            self._tasks.append(asyncio.ensure_future(self._read_engines()))
        self._tasks.append(asyncio.ensure_future(self._sample_classes()))

    def _own(self, backend: Backend | None) -> int:
        """The model's slots this pod owns: its ready endpoints x the engine's batch, this
        pod's share of them (rounded up: at worst the engines queue a few)."""
        if backend is None or not backend.ring.endpoints:
            return 0
        return self._share(backend.wake.concurrency * len(backend.ring.endpoints))

    def slots(self, backend: Backend | None) -> int:
        """The model's slots through this pod: its own, and those other pods lent it less
        those it lent them, less what its engines' readings take away."""
        own = self._own(backend)
        if not own or backend is None:
            return 0
        key = (backend.namespace, backend.name)
        return max(0, own + self.loans.net(key) - self._withheld(key, backend))

    def _measured(self, backend: Backend | None) -> int:
        """This pod's own slots less what the engines' readings take away: what a class's
        `maxSharePercent` is a share of."""
        own = self._own(backend)
        if not own or backend is None:
            return 0
        return max(0, own - self._withheld((backend.namespace, backend.name), backend))

    def _entitled(self, key: Key, endpoint: str, share: int) -> int:
        """The requests this pod may have at `endpoint`: its share of the engine's batch and
        the slots lent there, less what the engine's readings cut."""
        nominal = share + self.loans.at(key, endpoint)
        return max(0, nominal - self.load.cut(key, endpoint)) if self.load.limits else nominal

    def _withheld(self, key: Key, backend: Backend) -> int:
        if not self.load.limits:
            return 0  # the common case, on every turn: no engine queues
        share = self._share(backend.wake.concurrency)
        cuts = self.load.cuts(key).items()
        return sum(min(cut, max(0, share + self.loans.at(key, e))) for e, cut in cuts)

    def _withheld_all(self) -> int:
        return sum(
            self._withheld(key, backend)
            for key in list(self.load.limits)
            if (backend := self._backend_of(key)) is not None
        )

    def _share(self, slots: int) -> int:
        """This pod's share of `slots`, rounded up."""
        return -(-slots // self.replicas)

    def free_first(self, choice: Choice) -> Choice:
        """`choice` with the endpoints that have a free slot of this pod's share first (the ring
        picked by prefix and load; a pod full to its batch would queue the request again, in
        the engine, behind whatever came first)."""
        share = self._share(choice.backend.wake.concurrency) if choice.backend.ring.endpoints else 0
        in_flight = self.table.in_flight
        key = (choice.backend.namespace, choice.backend.name)
        order = sorted(
            choice.pick.order,
            key=lambda e: in_flight.get(e, 0) >= self._entitled(key, e, share),
        )
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
        self.class_load.values[priority.name] = priority.value
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
            share=self._measured(backend),
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
        """Answer every waiting request 503 (this pod stops; the client's retry goes elsewhere),
        and let the other pods take back the slots they lent it."""
        for _key, item in self.queues.take_all():
            self._resolve(item, STOPPING)
        if self.bus is not None and self.loans.busy():
            self.epoch += 1  # the peers forget their loans with this pod
            self._publish_state()

    def close(self) -> None:
        self.stop()
        for task in [*self._pumps.values(), *self._tasks]:
            task.cancel()

    def _hand_out(self, key: Key, backend: Backend | None, *, lent: bool = False) -> None:
        """Free slots of `key` to whom they are for (`lent`: one was just lent to this pod)."""
        own = self._measured(backend)
        if self.bus is not None and backend is not None:
            self._lend_or_give_back(key, backend, own)
        for item in self.queues.dispatch(key, self.slots(backend), own):
            self._resolve(item, "go")
        if self.bus is not None:
            self._advertise(key, own, again=lent)

    # -- slots lent between router pods (`loans`) ----------------------------------------------

    def _lend_or_give_back(self, key: Key, backend: Backend, own: int) -> None:
        """Each free slot of `key`: back to a pod it was borrowed from, unless what waits here
        outranks what that pod has waiting; else to a pod whose waiting work outranks this
        one's; else it stays (dispatched here)."""
        best = self.queues.best(key, own)
        waiting = Advert(*best) if best is not None else None
        free = self.slots(backend) - self.queues.running(key)
        while free > 0:
            kind = "return"
            peer = next(
                (p for p in self.loans.owed(key) if not self.loans.keeps(key, p, waiting)), None
            )
            if peer is None:
                kind, peer = "lend", self.loans.wanting(key, waiting)
            if peer is None:
                return
            endpoint = self._free_endpoint(key, backend)
            if kind == "return":
                self.loans.give_back(peer, key, endpoint)
            else:
                self.loans.lend(peer, key, endpoint)
            self.metrics.loans.labels(kind).inc()
            self._send(kind, peer, key, endpoint)
            free -= 1

    def _free_endpoint(self, key: Key, backend: Backend) -> str:
        """The endpoint where this pod uses least of what it may: where a freed slot is."""
        share = self._share(backend.wake.concurrency)
        in_flight = self.table.in_flight
        return max(
            backend.ring.endpoints,
            key=lambda e: self._entitled(key, e, share) - in_flight.get(e, 0),
        )

    def _advertise(self, key: Key, own: int, *, again: bool = False) -> None:
        """Tell the other pods when what waits here for `key` changed, or `again` (after a
        loan: the lender counts what it lent against the last advert it heard, and more may
        wait here now than that one said)."""
        best = self.queues.best(key, own)
        advert = Advert(*best) if best is not None else None
        if self._advertised.get(key) == advert and not (again and advert is not None):
            return
        if advert is None:
            del self._advertised[key]
        else:
            self._advertised[key] = advert
        self._publish_state()

    def _publish_state(self) -> None:
        waiting = [[*k, a.value, a.count] for k, a in self._advertised.items()]
        self._publish({"kind": "state", "waiting": waiting})

    def _send(self, kind: str, peer: str, key: Key, endpoint: str) -> None:
        """A slot lent or given back to `peer`, in the epoch of it this pod knows."""
        to_epoch = self.loans.epochs.get(peer, 0)
        message = {"kind": kind, "to": peer, "to_epoch": to_epoch, "model": [*key]}
        self._publish({**message, "endpoint": endpoint})

    def _publish(self, message: dict[str, Any]) -> None:
        assert self.bus is not None
        self.bus.publish({**message, "from": self.me, "epoch": self.epoch}, self._failed)

    def _failed(self) -> None:
        if not self._reset:
            self._lost()

    def _lost(self) -> None:
        """Messages to or from the peers may have been lost (a publish failed, or the
        subscription was made again): every loan is forgotten, and a new epoch begins, which
        the peers hear of with the next message (they forget theirs with this pod)."""
        if not self._subscribed:
            self._subscribed = True  # the first subscription: nothing to have missed
            return
        self.epoch += 1
        self._reset = True
        keys = self.loans.forget_all()
        log.info("router pods' loans forgotten (messages may have been lost)")
        for key in keys:
            self._hand_out(key, self._backend_of(key))

    def _received(self, message: dict[str, Any]) -> None:
        sender, epoch = message.get("from"), message.get("epoch")
        now = asyncio.get_running_loop().time()
        if not isinstance(sender, str) or sender == self.me or len(sender) > 64:
            return
        if not isinstance(epoch, int):
            return
        read, keys = self.loans.hear(sender, epoch, now)
        if not read:
            return
        kind = message.get("kind")
        if kind == "state":
            keys |= self.loans.advertised(sender, _adverts(message.get("waiting")))
        elif (
            kind in {"lend", "return"}
            and message.get("to") == self.me
            and message.get("to_epoch") == self.epoch
        ):
            keys |= self._taken(sender, str(kind), message)
        for key in keys:
            self._hand_out(key, self._backend_of(key), lent=kind == "lend")

    def _taken(self, sender: str, kind: str, message: dict[str, Any]) -> set[Key]:
        """A slot lent or given back to this pod."""
        model, endpoint = message.get("model"), message.get("endpoint")
        if not (isinstance(model, list) and len(model) == 2 and isinstance(endpoint, str)):
            return set()
        if len(endpoint) > MAX_ENDPOINT_CHARS:
            return set()
        key = (str(model[0]), str(model[1]))
        if kind == "lend":
            self.loans.borrowed(sender, key, endpoint)
            if self._backend_of(key) is None:
                # A model this pod does not route (yet): the slot goes straight back.
                self.loans.give_back(sender, key, endpoint)
                self._send("return", sender, key, endpoint)
                return set()
        else:
            self.loans.given_back(sender, key, endpoint)
        return {key}

    def _backend_of(self, key: Key) -> Backend | None:
        for backend in self.table.backends.values():
            if (backend.namespace, backend.name) == key:
                return backend
        return None

    async def _beat(self) -> None:
        """Every beat: forget peers gone silent, start over after lost messages, and say this
        pod's state while it has loans or waiting work (so peers know it is alive)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(BEAT_SECONDS)
            keys: set[Key] = set()
            for peer in self.loans.silent(loop.time()):
                keys |= self.loans.forget(peer)
            for key in keys:
                self._hand_out(key, self._backend_of(key))
            if self._advertised or self.loans.busy() or self._reset:
                self._reset = False
                self._publish_state()

    # -- the engines' own counts (`engine_load`) ------------------------------------------------

    async def _read_engines(self) -> None:
        """Every `readings.every` seconds: read the engines this pod has requests at (all of
        a model's while it has requests waiting here), and hand out the slots a cut that
        ended or eased gives back."""
        assert self.readings is not None
        while True:
            await asyncio.sleep(self.readings.every)
            try:
                await self._read_round(self.readings)
            except Exception:  # a bad round must not end the readings: the next one may do
                log.exception("reading the engines' running and waiting counts failed")

    async def _read_round(self, readings: Readings) -> None:
        loop = asyncio.get_running_loop()
        grown = self.load.expire(loop.time())
        busy = self._busy_engines()
        if busy:
            found = await readings.read([endpoint for _, _, endpoint in busy])
            now = loop.time()
            for (key, backend, endpoint), reading in zip(busy, found, strict=True):
                if reading is None:
                    continue  # unread: its cut, if any, runs out
                share = self._share(backend.wake.concurrency)
                before = self.load.cut(key, endpoint)
                if self.load.read(
                    key,
                    endpoint,
                    reading,
                    mine=self.table.in_flight.get(endpoint, 0),
                    entitled=share + self.loans.at(key, endpoint),
                    now=now,
                ):
                    grown.add(key)
                after = self.load.cut(key, endpoint)
                _log_change(key, endpoint, (before, after), share, reading)
        for key in grown:
            self._hand_out(key, self._backend_of(key))

    def _busy_engines(self) -> list[tuple[Key, Backend, str]]:
        """(model, its backend, endpoint) for each engine with requests from this pod, and
        every engine of a model with requests waiting here (at most `MAX_ENGINES`)."""
        in_flight = self.table.in_flight
        found: list[tuple[Key, Backend, str]] = []
        seen: set[Key] = set()
        for backend in list(self.table.backends.values()):
            key = (backend.namespace, backend.name)
            if key in seen:
                continue  # a CR's adapters are models of their own on the same engines
            seen.add(key)
            waiting = self.queues.waiting(key)
            found.extend(
                (key, backend, e) for e in backend.ring.endpoints if waiting or in_flight.get(e)
            )
            if len(found) >= MAX_ENGINES:
                return found[:MAX_ENGINES]
        return found

    # -- the shares to suggest (`share_advice`) -----------------------------------------------

    async def _sample_classes(self) -> None:
        """Every second: each model's requests in flight through this pod, by class."""
        loop = asyncio.get_running_loop()
        while True:
            running = {k: dict(q.running) for k, q in self.queues.models.items() if q.running}
            self.class_load.sample(running, loop.time())
            await asyncio.sleep(SAMPLE_SECONDS)

    def _suggestions(self) -> list[tuple[str, str, int]]:
        """(CR, class, the maxSharePercent to suggest it) for `SuggestedShares`."""
        found = []
        for key in list(self.class_load.means):
            slots = self._measured(self._backend_of(key))
            for name, percent in self.class_load.suggestions(key, slots, self.replicas).items():
                found.append((f"{key[0]}/{key[1]}", name, percent))
        return found

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
            if self._own(self.table.backends.get(model)):
                message = (
                    f"{cr} is saturated: no slot freed for this request within {waited:.1f} s "
                    f"({_wait_bound(priority, self.wait_seconds)}); retry later"
                )
                return Refusal(kind, error(429, message, "RateLimitError", retry))
            message = f"{cr} has no ready replica left to serve this waiting request"
            return Refusal(kind, error(503, message, "ServiceUnavailableError", retry))
        message = f"this router pod is stopping while the request waited for {cr}; retry"
        return Refusal(STOPPING, error(503, message, "ServiceUnavailableError", retry))


def _log_change(
    key: Key, endpoint: str, cuts: tuple[int, int], share: int, reading: Reading
) -> None:
    """A cut that began or ended, said once (not each reading)."""
    cr = f"LLMDeployment {key[0]}/{key[1]}"
    before, after = cuts
    if not before and after:
        log.info(
            "the engine at %s (%s) queues %d requests beside %d running: this router pod "
            "sends it %d fewer than its share of %d until it has room (the rest wait here)",
            endpoint,
            cr,
            reading.waiting,
            reading.running,
            after,
            share,
        )
    elif before and not after:
        log.info("the engine at %s (%s) has room again: the plan's slots", endpoint, cr)


def _adverts(raw: Any) -> dict[Key, Advert]:
    """A peer's `waiting` list ([namespace, name, value, count], ...), what is well formed."""
    adverts: dict[Key, Advert] = {}
    if not isinstance(raw, list):
        return adverts
    for entry in raw[:MAX_ADVERTS]:
        if (
            isinstance(entry, list)
            and len(entry) == 4
            and all(isinstance(v, str) for v in entry[:2])
            and all(isinstance(v, int) and not isinstance(v, bool) for v in entry[2:])
        ):
            adverts[entry[0], entry[1]] = Advert(entry[2], entry[3])
    return adverts


MAX_ADVERTS = 1000
MAX_ENDPOINT_CHARS = 256


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
