"""Pure: the fair queue in front of a saturated model (docs/gateway.md, "Priority and fair
sharing"); no I/O, no clock of its own (`now` comes in).

With the gateway on, every request for a model passes here after its tenant's admission. While
the model has a free slot (its ready endpoints x the engine's batch, `status.plan.maxNumSeqs`,
less what this router pod has in flight to it) that its priority class may take, and nobody
waits, it goes at once. Otherwise it waits, and each freed slot goes to, in order (Gateway API
Inference Extension's three tiers):
1. the **class** of highest value with waiting work (strict: a lower one waits while a higher
   one waits), unless that class holds its share of the slots already (`maxSharePercent`: the
   slots it leaves are for higher classes), when the next class down may take the slot;
2. inside it, the **tenant with the least weighted service** (VTC, "Fairness in Serving Large
   Language Models", OSDI'24): each tenant's counter grows by what a dispatched request costs
   (input + 2 x output tokens, divided by the tenant's weight; estimated at dispatch, corrected
   when the answer's usage is known), and a tenant that starts waiting is lifted to the least
   counter of those already waiting, so idle time banks no credit;
3. that tenant's **oldest** request.

Shedding, in order: a request of a sheddable class is refused at once when it cannot go at
once; a full queue (the pod's caps across models, or the class's own `maxRequests`) refuses,
unless the newcomer outranks a waiting request, which it then displaces from the pod's queue
(the newest of the lowest class: the one that waited least); a request that waits past its
class's deadline leaves. A request in flight is never evicted.

Per router pod: each pod counts only what it sent itself, against its share of the slots (the
caller divides them between the router pods, and lends freed ones to a pod whose waiting work
outranks its own: `loans`); a class's `maxSharePercent` applies to the pod's own share.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from llmop_router.priorities import PriorityClass

Key = tuple[str, str]
"""(namespace, name) of the CR."""

OUTPUT_WEIGHT = 2.0
"""An output token costs two input tokens of service (VTC's `output_price`)."""

SHED = "shed"
FULL = "full"
DISPLACED = "displaced"
UNBOUNDED = 1 << 62
"""Slots past any model's (what one more free slot could serve, whatever is free now)."""


@dataclass(frozen=True)
class Waiting:
    """One request that waits for a slot."""

    ticket: int
    tenant: str
    terms: PriorityClass
    """Its class: what it may do (its band, value, shedding, share, queue bound)."""
    weight: int
    cost: float
    """Estimated tokens of service: input + OUTPUT_WEIGHT x reserved output."""
    arrived: float
    deadline: float
    size: int = 0
    """Its body's bytes (held with it)."""


@dataclass(frozen=True)
class Verdict:
    """What `FairQueues.admit` decided: `go` (a slot now), `waiting` (queued), or `refused`
    (SHED or FULL); `displaced` is a request the newcomer pushed out (the caller answers it)."""

    go: bool = False
    waiting: Waiting | None = None
    refused: str = ""
    displaced: Waiting | None = None


@dataclass
class Band:
    """One class's waiting requests on one model, by tenant."""

    value: int
    tenants: dict[str, deque[Waiting]] = field(default_factory=dict)


@dataclass
class ModelQueue:
    """One model's waiting requests, by class then tenant, and its tenants' service."""

    bands: dict[str, Band] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    """Each tenant's weighted service while the model is busy (reset once it is idle)."""
    running: Counter[str] = field(default_factory=Counter)
    """Requests this pod dispatched to the model and that have not finished, by class."""
    waiting: int = 0

    def busy(self) -> int:
        return sum(self.running.values())

    def items(self) -> Iterator[Waiting]:
        for band in self.bands.values():
            for queue in band.tenants.values():
                yield from queue

    def free_for(self, terms: PriorityClass, slots: int, share: int) -> bool:
        """Whether a request of this class may take a slot now (`share`: the slots its
        class's `maxSharePercent` applies to)."""
        return self.busy() < slots and self.running[terms.name] < _cap(terms, slots, share)


@dataclass
class FairQueues:
    """Every model's queue on this router pod, within the pod's caps across models."""

    max_requests: int
    """Requests waiting at once, all models together."""
    max_bytes: int
    """Bytes of their bodies, all models together."""
    models: dict[Key, ModelQueue] = field(default_factory=dict)
    total: int = 0
    total_bytes: int = 0
    by_class: Counter[str] = field(default_factory=Counter)
    """Requests waiting, by class, all models."""
    _tickets: int = 0

    def waiting(self, key: Key) -> int:
        queue = self.models.get(key)
        return queue.waiting if queue else 0

    def running(self, key: Key) -> int:
        queue = self.models.get(key)
        return queue.busy() if queue else 0

    def admit(
        self,
        key: Key,
        *,
        tenant: str,
        terms: PriorityClass,
        weight: int,
        cost: float,
        size: int,
        now: float,
        wait_seconds: float,
        slots: int,
        share: int | None = None,
    ) -> Verdict:
        """A request for the model with `slots` in all (free or not; `share`: the slots the
        classes' `maxSharePercent` apply to, `slots` unless given): at once while its class
        may take a free one and nobody of its class or above waits for one; else queued, shed
        or refused."""
        queue = self.models.setdefault(key, ModelQueue())
        share = slots if share is None else share
        # Ahead of it: requests of its class or above that could take a free slot now (a class
        # that holds its share already waits for its own slots, not for this one).
        ahead = any(
            band.value >= terms.value
            and queue.running[name] < _cap(_head(band).terms, slots, share)
            for name, band in queue.bands.items()
        )
        if not ahead and queue.free_for(terms, slots, share):
            self._charge(queue, tenant, cost / weight)
            queue.running[terms.name] += 1
            return Verdict(go=True)
        if terms.sheddable:
            self._drop_if_idle(key)
            return Verdict(refused=SHED)
        if terms.max_requests is not None and self.by_class[terms.name] >= terms.max_requests:
            self._drop_if_idle(key)
            return Verdict(refused=FULL)
        displaced = None
        if self.total >= self.max_requests or self.total_bytes + size > self.max_bytes:
            displaced = self._displace(queue, terms.value, size)
            if displaced is None:
                self._drop_if_idle(key)
                return Verdict(refused=FULL)
        self._tickets += 1
        item = Waiting(self._tickets, tenant, terms, weight, cost, now, now + wait_seconds, size)
        band = queue.bands.setdefault(terms.name, Band(terms.value))
        own = band.tenants.get(tenant)
        if not own:
            # Lifted to the least service of those waiting in its band: no banked credit.
            backlogged = [queue.counters.get(t, 0.0) for t, q in band.tenants.items() if q]
            if backlogged:
                queue.counters[tenant] = max(queue.counters.get(tenant, 0.0), min(backlogged))
            own = band.tenants[tenant] = deque()
        own.append(item)
        queue.waiting += 1
        self.total += 1
        self.total_bytes += size
        self.by_class[terms.name] += 1
        return Verdict(waiting=item, displaced=displaced)

    def dispatch(self, key: Key, slots: int, share: int | None = None) -> list[Waiting]:
        """Take out, in class then fair order, as many requests as the model has free slots
        (`slots` in all, less what runs) that their classes may take (of `share`)."""
        queue = self.models.get(key)
        if queue is None:
            return []
        share = slots if share is None else share
        out = []
        while queue.waiting and queue.busy() < slots:
            item = self._next(queue, slots, share)
            if item is None:
                break  # every waiting class holds its share
            self._remove(queue, item)
            self._charge(queue, item.tenant, item.cost / item.weight)
            queue.running[item.terms.name] += 1
            out.append(item)
        return out

    def best(self, key: Key, share: int) -> tuple[int, int] | None:
        """What waits for the model that one more free slot would serve: the value of the
        highest class whose share (of `share`) has room, and how many of its requests could
        go; None when nothing could (what other router pods are told: `loans`)."""
        queue = self.models.get(key)
        if queue is None or not queue.waiting:
            return None
        item = self._next(queue, UNBOUNDED, share)
        if item is None:
            return None
        band = queue.bands[item.terms.name]
        room = _cap(item.terms, UNBOUNDED, share) - queue.running[item.terms.name]
        return band.value, min(room, sum(len(q) for q in band.tenants.values()))

    def expire(self, key: Key, now: float) -> list[Waiting]:
        """Take out the requests past their deadline."""
        queue = self.models.get(key)
        if queue is None:
            return []
        expired = [item for item in queue.items() if item.deadline <= now]
        for item in expired:
            self._remove(queue, item)
        self._drop_if_idle(key)
        return expired

    def leave(self, key: Key, ticket: int) -> bool:
        """A waiting request that left on its own (its client went away); False if it was not
        waiting (dispatched or answered already)."""
        queue = self.models.get(key)
        if queue is None:
            return False
        for item in queue.items():
            if item.ticket == ticket:
                self._remove(queue, item)
                self._drop_if_idle(key)
                return True
        return False

    def done(self, key: Key, tenant: str, class_name: str, weight: int, correction: float) -> None:
        """A dispatched request finished: its slot is free, and its tenant's service is
        corrected by `correction` tokens (its real cost less the estimate charged)."""
        queue = self.models.get(key)
        if queue is None:
            return
        if queue.running[class_name] > 0:
            queue.running[class_name] -= 1
        if not queue.running[class_name]:
            del queue.running[class_name]
        if tenant in queue.counters:
            queue.counters[tenant] = max(0.0, queue.counters[tenant] + correction / weight)
        self._drop_if_idle(key)

    def take_all(self) -> list[tuple[Key, Waiting]]:
        """Empty every queue (the router stops: each gets 503)."""
        taken = [(key, item) for key, queue in self.models.items() for item in queue.items()]
        for key, item in taken:
            self._remove(self.models[key], item)
        for key in list(self.models):
            self._drop_if_idle(key)
        return taken

    def _next(self, queue: ModelQueue, slots: int, share: int) -> Waiting | None:
        """The request the next free slot goes to: the highest class that may take one, its
        tenant with the least service, that tenant's oldest."""
        bands = sorted(queue.bands.items(), key=lambda entry: (-entry[1].value, entry[0]))
        for name, band in bands:
            if not band.tenants or queue.running[name] >= _cap(_head(band).terms, slots, share):
                continue
            tenant = min(
                band.tenants,
                key=lambda t: (queue.counters.get(t, 0.0), band.tenants[t][0].arrived),
            )
            return band.tenants[tenant][0]
        return None

    def _charge(self, queue: ModelQueue, tenant: str, service: float) -> None:
        queue.counters[tenant] = queue.counters.get(tenant, 0.0) + service

    def _displace(self, queue: ModelQueue, value: int, size: int) -> Waiting | None:
        """The newest waiting request of this model's lowest class below `value`, taken out
        when that makes room for the newcomer; else None."""
        lower = [item for item in queue.items() if item.terms.value < value]
        if not lower:
            return None
        victim = min(lower, key=lambda item: (item.terms.value, -item.arrived, -item.ticket))
        if self.total_bytes - victim.size + size > self.max_bytes:
            return None
        self._remove(queue, victim)
        return victim

    def _remove(self, queue: ModelQueue, item: Waiting) -> None:
        band = queue.bands[item.terms.name]
        own = band.tenants[item.tenant]
        own.remove(item)
        if not own:
            del band.tenants[item.tenant]
        if not band.tenants:
            del queue.bands[item.terms.name]
        queue.waiting -= 1
        self.total -= 1
        self.total_bytes -= item.size
        self.by_class[item.terms.name] -= 1
        if not self.by_class[item.terms.name]:
            del self.by_class[item.terms.name]

    def _drop_if_idle(self, key: Key) -> None:
        """Forget a model that nothing waits for and nothing runs on (its counters too: a new
        busy period starts even)."""
        queue = self.models.get(key)
        if queue is not None and queue.waiting == 0 and not queue.busy():
            del self.models[key]


def _cap(terms: PriorityClass, slots: int, share: int) -> int:
    """The most of `slots` a class may hold: its `maxSharePercent` of the pod's own `share`
    (a slot lent by another pod is for a class below its share there too), or all of them."""
    return terms.slots_of(share) if terms.max_share_percent < 100 else slots


def _head(band: Band) -> Waiting:
    return next(iter(band.tenants.values()))[0]
