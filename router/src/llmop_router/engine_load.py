"""Pure: how many requests an engine really takes now, from its own running and waiting
counts (docs/gateway.md, "Slots measured at the engines"); no I/O, no clock of its own.

The fair queue gives each engine `maxNumSeqs` slots (`status.plan`), split between the router
pods. That guess is wrong when the engine cannot run its whole batch (KV-bound: long prompts,
a plan whose memory was optimistic) or when requests reach it past this router (another
router, a client on the engine's Service): the router then sends requests that wait in the
engine's first-come-first-served queue, where no priority holds. The engine says so itself:
`vllm:num_requests_waiting` above 0 (what its last step's scheduler passed over). While it does,
this pod cuts what it sends there to what it holds less its part of what waits (its in-flight
share of everything the engine holds), never below one request (traffic past the router cannot
starve the router's own). The cut is of the slots the pod may have there (its share and
loans), not a ceiling, so a slot lent between pods moves on top of it. The cut eases by one
with each reading that shows the engine running fewer than it did when it queued (room it did
not have then: requests of others ended, or this pod cut too deep; the first such reading may
be a slot between a request's end and the next one, so room needs two in a row too), and by
one every `PROBE_SECONDS` while it runs as many without a queue (it may take more now: a probe
costs at most one request in its queue, for a reading or two; each probe that makes it queue
doubles the wait for the next, up to `MAX_PROBE_SECONDS`, and one that holds resets it). Only
a pod that sends all it may there eases its cut (more would prove nothing). At zero the cut
ends. A waiting count in one reading only may be a request the engine's scheduling budget
left for its next step, not a queue: a cut needs two readings in a row. A cut no reading
confirmed for `STALE_SECONDS` (the engine did not answer) ends: the plan's slots again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

Key = tuple[str, str]
"""(namespace, name) of the CR."""

POLL_SECONDS = 0.5
"""How often a busy engine is read (`--engine-readings-seconds`)."""
STALE_SECONDS = 2.0
"""A correction not confirmed by a reading for this long ends."""
PROBE_SECONDS = 5.0
"""How often a cut eases while its engine runs as many as when it queued, and no queue:
at first, and again after a probe that held."""
MAX_PROBE_SECONDS = 60.0
"""Each probe that made the engine queue doubles the wait for the next, up to this."""
FLOOR = 1
"""The fewest requests a pod sends an engine that queues: one at a time."""
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"


@dataclass(frozen=True)
class Reading:
    """An engine's scheduler, as its `/metrics` says (summed over its engine cores)."""

    running: int
    waiting: int


def parse(text: str) -> Reading | None:
    """The running and waiting counts of a Prometheus text page of vLLM's (or the
    simulator's); None when it has neither."""
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:num_requests_"):
            continue
        name, _, rest = line.partition("{") if "{" in line else line.partition(" ")
        if name not in {RUNNING, WAITING}:
            continue  # vllm:num_requests_waiting_by_reason and the like
        value = rest.rsplit("}", 1)[-1].split()
        try:
            number = float(value[0])
        except (IndexError, ValueError):
            continue
        if 0 <= number < 1e9:  # not NaN (every comparison with it is false), not nonsense
            counts[name] = counts.get(name, 0.0) + number
    if not counts:
        return None
    return Reading(int(counts.get(RUNNING, 0.0)), int(counts.get(WAITING, 0.0)))


@dataclass
class _Cut:
    cut: int
    """Of the slots this pod may have at the engine (its share and loans), how many it does
    not send it now."""
    read_at: float
    full: int
    """What the engine ran when it last queued: fewer is room."""
    grown_at: float
    """When the cut was last made, deepened or eased."""
    probe_every: float = PROBE_SECONDS
    probed: bool = False
    """The last easing was a probe, and no queue has followed it yet."""
    roomy: bool = False
    """The last reading showed room."""


@dataclass
class EngineLoad:
    """Per model and endpoint: the cut its engine's readings put on this pod's slots."""

    limits: dict[Key, dict[str, _Cut]] = field(default_factory=dict)
    """Model → endpoint → its cut (only models with one: empty when no engine queues)."""
    queued: dict[str, float] = field(default_factory=dict)
    """Endpoint → when a reading last showed requests waiting in its engine."""

    def read(
        self,
        key: Key,
        endpoint: str,
        reading: Reading,
        *,
        mine: int,
        entitled: int,
        now: float,
    ) -> bool:
        """Take a reading of `endpoint`'s engine, where this pod has `mine` requests in flight
        and may have `entitled` (its share and loans, before any cut). True when the cut
        eased or ended: a slot may have freed."""
        limits = self.limits.setdefault(key, {})
        limit = limits.get(endpoint)
        if reading.waiting > 0:
            self._queued(key, endpoint, reading, mine=mine, entitled=entitled, now=now)
            self._tidy(key)
            return False
        self.queued.pop(endpoint, None)
        if limit is None:
            self._tidy(key)
            return False
        limit.read_at = now
        if mine < entitled - limit.cut:
            limit.roomy = False
            return False  # this pod does not use what it may: more would prove nothing
        room = reading.running < limit.full
        if room and not limit.roomy:
            limit.roomy = True
            return False  # one reading: a slot between a request's end and the next one
        limit.roomy = room
        if not room:
            if now - limit.grown_at < limit.probe_every:
                return False  # as full as when it queued: more would queue again
            if limit.probed:
                limit.probe_every = PROBE_SECONDS  # the last probe held: it may take more
            limit.probed = True
        if limit.cut <= 1:
            del limits[endpoint]
            self._tidy(key)
        else:
            limit.cut, limit.grown_at = limit.cut - 1, now
        return True

    def _queued(
        self, key: Key, endpoint: str, reading: Reading, *, mine: int, entitled: int, now: float
    ) -> None:
        limits = self.limits[key]
        limit = limits.get(endpoint)
        before = self.queued.get(endpoint)
        self.queued[endpoint] = now
        if limit is not None:
            limit.read_at, limit.roomy = now, False
        if before is None or now - before > STALE_SECONDS:
            return  # one reading: a request between two engine steps, maybe
        held = reading.running + reading.waiting
        part = -(-reading.waiting * mine // held)
        cut = entitled - max(FLOOR, min(mine, entitled) - part)
        if limit is None:
            if cut > 0:
                limits[endpoint] = _Cut(cut, now, reading.running, now)
            return
        if limit.probed:
            # The probe queued: probe half as often, up to MAX_PROBE_SECONDS.
            limit.probe_every = min(MAX_PROBE_SECONDS, 2 * limit.probe_every)
            limit.probed = False
        limit.cut = max(limit.cut, cut)
        limit.full, limit.grown_at = reading.running, now

    def cut(self, key: Key, endpoint: str) -> int:
        """The slots of this pod's at `endpoint` for `key` that it does not send now."""
        limit = self.limits.get(key, {}).get(endpoint)
        return 0 if limit is None else limit.cut

    def cuts(self, key: Key) -> dict[str, int]:
        """`key`'s endpoints under a cut → its size."""
        return {e: limit.cut for e, limit in self.limits.get(key, {}).items()}

    def expire(self, now: float) -> set[Key]:
        """End the cuts no reading confirmed within `STALE_SECONDS`; the models whose slots
        grew."""
        grown: set[Key] = set()
        for key, limits in list(self.limits.items()):
            for endpoint, limit in list(limits.items()):
                if now - limit.read_at > STALE_SECONDS:
                    del limits[endpoint]
                    grown.add(key)
            self._tidy(key)
        self.queued = {e: t for e, t in self.queued.items() if now - t <= STALE_SECONDS}
        return grown

    def _tidy(self, key: Key) -> None:
        if not self.limits.get(key, True):
            del self.limits[key]
