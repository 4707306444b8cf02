"""Pure: the holding queues of scale to zero (no I/O, no clock of its own; `now` comes in).

A request for a CR at zero (its Ready condition says `ScaledToZero`) waits here while the router
wakes the CR. Per CR one *episode*: a queue of held requests, each with its deadline
(`holdTimeoutSeconds` after arrival), at most `maxPendingRequests` of them (the next is refused),
and one wake however many requests arrive. When endpoints are ready the queue is released in
priority order (the gateway's class; arrival order within one) at the engines' concurrency:
each ready endpoint takes at most `concurrency` requests in flight through this router
(`status.plan.maxNumSeqs`, the engine's batch limit as
the operator rendered it; 256 when absent), so a cold pod gets one full batch at once rather
than the whole queue. The episode ends when its queue is empty; the next request at zero starts
a new one (and a new wake).

Across CRs, the router pod holds at most `max_held` requests and `max_held_bytes` of their
bodies (`limits.Limits`): past either, a request is refused whichever CR it is for.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from llmop_router import contract
from llmop_router.contract import Spec
from llmop_router.limits import DEFAULT as DEFAULT_LIMITS

DEFAULT_IDLE_SECONDS = float(contract.DEFAULT_IDLE_SECONDS)
DEFAULT_HOLD_TIMEOUT_SECONDS = float(contract.DEFAULT_HOLD_TIMEOUT_SECONDS)
DEFAULT_MAX_PENDING_REQUESTS = contract.DEFAULT_MAX_PENDING_REQUESTS
DEFAULT_CONCURRENCY = contract.DEFAULT_MAX_NUM_SEQS
"""The batch a ready pod takes at once when the CR's status does not say (`status.plan
.maxNumSeqs`)."""

PHASE_WAKING = "waking: requesting the scale"
PHASE_REQUESTED = "waking: scale requested, no ready replica yet"
PHASE_RELEASING = "releasing: a replica is ready, waiting for a free slot"

Key = tuple[str, str]
"""(namespace, name) of the CR."""


@dataclass(frozen=True)
class ScaleToZero:
    """`spec.autoscaling.scaleToZero` as the router uses it, with the API's defaults."""

    idle_seconds: float = DEFAULT_IDLE_SECONDS
    hold_timeout_seconds: float = DEFAULT_HOLD_TIMEOUT_SECONDS
    max_pending_requests: int = DEFAULT_MAX_PENDING_REQUESTS

    @classmethod
    def of(cls, spec: Mapping[str, Any]) -> ScaleToZero:
        """From a CR's spec (plain JSON); absent or malformed fields take the defaults."""
        autoscaling = spec.get(Spec.AUTOSCALING) or {}
        raw = autoscaling.get(Spec.SCALE_TO_ZERO) or {} if isinstance(autoscaling, Mapping) else {}
        raw = raw if isinstance(raw, Mapping) else {}

        def number(name: str, default: float) -> float:
            value = raw.get(name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                return default
            return float(value)

        return cls(
            idle_seconds=number(Spec.IDLE_SECONDS, DEFAULT_IDLE_SECONDS),
            hold_timeout_seconds=number(Spec.HOLD_TIMEOUT_SECONDS, DEFAULT_HOLD_TIMEOUT_SECONDS),
            max_pending_requests=int(
                number(Spec.MAX_PENDING_REQUESTS, DEFAULT_MAX_PENDING_REQUESTS)
            ),
        )


@dataclass(frozen=True)
class Held:
    """One held request: its ticket (unique per `Holding`), arrival, deadline, body size and
    priority (its gateway class's value; 0 without the gateway)."""

    ticket: int
    arrived: float
    deadline: float
    size: int = 0
    priority: int = 0


@dataclass
class Episode:
    """One CR's wait from its first held request until its queue empties."""

    started: float
    queue: deque[Held] = field(default_factory=deque)
    woken: bool = False
    """The wake was done (or found unnecessary): never again in this episode."""
    phase: str = PHASE_WAKING
    """What the held requests are waiting for, as a 504 tells it."""


@dataclass(frozen=True)
class Admission:
    """What `Holding.admit` decided: `held` (queued) or refused, `refused` saying why (`full`:
    the CR's queue; `router-full`: the pod's caps across CRs); `wake` is True for the request
    that opened the episode (the caller wakes the CR once)."""

    held: Held | None
    wake: bool
    refused: str = ""


@dataclass
class Holding:
    """Every CR's episode."""

    episodes: dict[Key, Episode] = field(default_factory=dict)
    max_held: int = DEFAULT_LIMITS.max_held_requests
    """Requests held at once, all CRs together."""
    max_held_bytes: int = DEFAULT_LIMITS.max_held_bytes
    """Bytes of held requests' bodies at once, all CRs together."""
    total: int = 0
    """Requests held now, all CRs."""
    total_bytes: int = 0
    """Their bodies' bytes."""
    _tickets: int = 0

    def holding(self, key: Key) -> bool:
        """Whether requests for this CR wait now (a new one then queues behind them)."""
        return key in self.episodes

    def held(self, key: Key) -> int:
        episode = self.episodes.get(key)
        return len(episode.queue) if episode else 0

    def admit(
        self, key: Key, now: float, settings: ScaleToZero, size: int = 0, priority: int = 0
    ) -> Admission:
        """Queue a request (its body `size` bytes, its `priority`) at the back; refuse it when
        `max_pending_requests` already wait for this CR, or when the pod's caps across CRs
        would be passed."""
        episode = self.episodes.get(key)
        if episode is not None and len(episode.queue) >= settings.max_pending_requests:
            return Admission(None, wake=False, refused="full")
        if self.total >= self.max_held or self.total_bytes + size > self.max_held_bytes:
            # Checked before an episode opens: a refused request leaves nothing behind.
            return Admission(None, wake=False, refused="router-full")
        opened = episode is None
        if episode is None:
            episode = self.episodes[key] = Episode(started=now)
        self._tickets += 1
        held = Held(self._tickets, now, now + settings.hold_timeout_seconds, size, priority)
        episode.queue.append(held)
        self.total += 1
        self.total_bytes += size
        return Admission(held, wake=opened)

    def woke(self, key: Key, phase: str) -> None:
        """The wake is done (or was not needed): record what the requests wait for now."""
        episode = self.episodes.get(key)
        if episode is not None:
            episode.woken = True
            episode.phase = phase

    def note(self, key: Key, phase: str) -> None:
        """A new phase without ending the wake (e.g. a failed scale request to retry)."""
        episode = self.episodes.get(key)
        if episode is not None:
            episode.phase = phase

    def expire(self, key: Key, now: float) -> list[Held]:
        """Take out the requests past their deadline (they get 504)."""
        episode = self.episodes.get(key)
        if episode is None:
            return []
        # Deadlines grow with arrival (one timeout per CR), but the settings may change
        # mid-episode: look at every request, not only the head.
        expired = [h for h in episode.queue if h.deadline <= now]
        if expired:
            episode.queue = deque(h for h in episode.queue if h.deadline > now)
            self._taken(expired)
            self._close_if_empty(key)
        return expired

    def release(
        self, key: Key, in_flight: Mapping[str, int], endpoints: Sequence[str], concurrency: int
    ) -> list[Held]:
        """Take out, highest priority first and oldest first within one, as many requests as
        the ready endpoints have free slots (`concurrency` each, less what is in flight to
        them); none without endpoints."""
        episode = self.episodes.get(key)
        if episode is None or not endpoints:
            return []
        slots = sum(max(0, concurrency - in_flight.get(e, 0)) for e in endpoints)
        episode.phase = PHASE_RELEASING
        if slots >= len(episode.queue):
            released = list(episode.queue)
            episode.queue.clear()
        elif any(h.priority != episode.queue[0].priority for h in episode.queue):
            order = sorted(episode.queue, key=lambda h: (-h.priority, h.ticket))
            released, kept = order[:slots], {h.ticket for h in order[slots:]}
            episode.queue = deque(h for h in episode.queue if h.ticket in kept)
        else:
            released = [episode.queue.popleft() for _ in range(slots)]
        self._taken(released)
        self._close_if_empty(key)
        return released

    def leave(self, key: Key, ticket: int) -> None:
        """A request that left on its own (its client went away)."""
        episode = self.episodes.get(key)
        if episode is not None:
            self._taken([h for h in episode.queue if h.ticket == ticket])
            episode.queue = deque(h for h in episode.queue if h.ticket != ticket)
            self._close_if_empty(key)

    def take_all(self) -> list[tuple[Key, Held]]:
        """Empty every queue (the router stops: each gets 503)."""
        taken = [(key, h) for key, episode in self.episodes.items() for h in episode.queue]
        self.episodes.clear()
        self._taken([h for _, h in taken])
        return taken

    def _taken(self, helds: Sequence[Held]) -> None:
        self.total -= len(helds)
        self.total_bytes -= sum(h.size for h in helds)

    def _close_if_empty(self, key: Key) -> None:
        episode = self.episodes.get(key)
        if episode is not None and not episode.queue:
            del self.episodes[key]
