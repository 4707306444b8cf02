"""Pure: consistent hashing with bounded load (CHWBL) over one model's ready engine pods, and
within the bound the pod where the request's first token comes soonest.

Each pod owns `VIRTUAL_NODES` points on a 64-bit ring (enough that no pod owns a large arc:
kubeai#447 saw one pod take 80 requests with 20). A key's *home* is the first pod clockwise from
the key: the pod that served the conversation's turns before and holds their prompt in its prefix
cache.

**The bound.** No pod takes a request that would put it over `LOAD_FACTOR` times the mean in
flight (the bounded loads of Mirrokni, Thorup and Zadeh: the mean and the pod's load both count
the new request), so a hot key spills instead of piling onto one pod (aibrix#842): past the
bound, load wins over any cache. From a mean of `LOADED` in flight per pod on, the bound is
rounded down, so the busiest pod stays within 1.25 times the mean: 10 of 24 on 3 pods, 5 of 13
(KubeAI checks the pod's load before it takes the request: 11 of 24, 1.38 times the mean, and 6
of 13). Below that, one request is more than a quarter of the mean and no integer bound holds
1.25: a pod may hold one request more than the mean rounded up, so a pod serving the only request
in flight still takes a second (2 of 2 on 3 pods, where 1.25 times the mean sends a
conversation's next turn away from its cache while the fleet is all but idle).

**Within the bound, the soonest first token.** In-flight counts say little about time to first
token: a pod whose requests are all decoding answers a new one at once, a pod with the same count
still prefilling makes it wait for all of them. Bounding in-flight alone made the router slower
than a random Service on one-turn traffic (`make bench-router`, `system-prompts`: 1.12-1.24 times
the Service's mean TTFT in three runs); balancing in-flight counts exactly was worse still (1.6
times in `bench/router_replay.py`: requests that end together on one pod leave it the least
loaded, so their users' next requests go back to it together and prefill in one long step). So
each eligible pod is scored by the prefill it would make this request wait for and do:

    queued[pod] + (new            if pod is the home
                   total + new    otherwise)

`queued` is the prompt, in characters, of the requests the router sent to the pod that have had
no first byte back (what it still has to prefill); `total` and `new` are the request's prompt and
its part after the last answer (`prefix.Prefill`). Home prefills only `new` (it holds the rest);
another pod prefills the whole now, and the next turn, back home, prefills this turn again. The
lowest score wins, ties go to the earliest pod on the key's walk: with nothing queued a request
stays home, a conversation leaves home only while home's queue costs more than its history saves,
and a shared prefix spreads over the pods once one of them is saturated. Characters stand in for
tokens (about 4 a token).

The order after the first pod is the key's walk, the retry order: a request that fails before its
first byte goes to the next pod, never the same one (KubeAI retries the same key and so the same
pod). Deterministic: every router replica with the same pods and loads picks alike.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from llmop_router.prefix import NO_PREFILL, Prefill, hash_bytes

VIRTUAL_NODES = 256
LOAD_FACTOR = 1.25
LOADED = 4
"""Mean in flight per pod from which the bound is `LOAD_FACTOR` times the mean, rounded down."""


@dataclass(frozen=True)
class Ring:
    """The ring of one endpoint set (rebuilt when the set changes, shared between requests)."""

    endpoints: tuple[str, ...]
    points: tuple[int, ...] = field(repr=False)
    owners: tuple[str, ...] = field(repr=False)

    @classmethod
    def of(cls, endpoints: Iterable[str], virtual_nodes: int = VIRTUAL_NODES) -> Ring:
        unique = tuple(sorted(set(endpoints)))
        placed = sorted(
            (hash_bytes(f"{endpoint}#{i}".encode()), endpoint)
            for endpoint in unique
            for i in range(virtual_nodes)
        )
        return cls(unique, tuple(p for p, _ in placed), tuple(e for _, e in placed))

    def walk(self, key: int) -> list[str]:
        """Every endpoint once, in ring order clockwise from `key`."""
        if not self.endpoints:
            return []
        start = bisect.bisect_left(self.points, key) % len(self.points)
        order: list[str] = []
        seen: set[str] = set()
        count = len(self.points)
        for step in range(count):
            owner = self.owners[(start + step) % count]
            if owner not in seen:
                seen.add(owner)
                order.append(owner)
                if len(order) == len(self.endpoints):
                    break
        return order


@dataclass(frozen=True)
class Pick:
    """The endpoints to try, best first, and why the first was chosen."""

    order: tuple[str, ...]
    reason: str
    """`prefix` (the key's home), `spill` (another pod: home was over the load bound, or its
    queued prefill outweighed the request's cached history), or `least-loaded` (no key)."""
    home: str | None = None
    """The key's first pod on the ring (None: no key)."""
    prefill: Prefill = NO_PREFILL

    def prefill_on(self, endpoint: str) -> int:
        """What the request is expected to prefill on `endpoint`, in characters: its new part at
        home, all of it elsewhere (what the pod's queue grows by until the first byte)."""
        return self.prefill.new if endpoint == self.home else self.prefill.total


def bound(total: int, endpoints: int, factor: float = LOAD_FACTOR) -> int:
    """The most requests one pod may hold once a new one joins the `total` in flight: `factor`
    times the mean (which counts the new one), rounded down, from a mean of `LOADED` on; below
    it, the mean rounded up plus one. Never below the mean rounded up, so some pod is in."""
    mean = (total + 1) / endpoints
    if mean >= LOADED:
        return max(math.ceil(mean), math.floor(mean * factor))
    return math.ceil(mean) + 1


def within_bound(load: int, total: int, endpoints: int, factor: float = LOAD_FACTOR) -> bool:
    """Whether a pod at `load` may take one more request (`bound`); an idle fleet takes
    anything."""
    if total == 0:
        return True
    return load + 1 <= bound(total, endpoints, factor)


def score(endpoint: str, home: str | None, queued: Mapping[str, int], prefill: Prefill) -> int:
    """The prefill, in characters, a request waits for and does on `endpoint`: what is queued
    there, plus its new part at home, or all of it and its new part again elsewhere (the next
    turn, back home, prefills this one)."""
    own = prefill.new if endpoint == home else prefill.total + prefill.new
    return queued.get(endpoint, 0) + own


def pick(
    ring: Ring,
    key: int | None,
    load: Mapping[str, int],
    queued: Mapping[str, int] | None = None,
    prefill: Prefill = NO_PREFILL,
) -> Pick:
    """Order the ring's endpoints for a request with `key` and `prefill` under `load` (in flight
    per pod) and `queued` (prompt characters per pod sent and not yet answered by a first byte):
    first the lowest-scoring pod within the load bound, then the rest in the key's walk order."""
    if not ring.endpoints:
        return Pick((), "none")
    queued = queued or {}
    total = sum(load.get(e, 0) for e in ring.endpoints)
    # Within the bound: load + 1 <= limit (an idle fleet takes anything). Never empty: the least
    # loaded pod is always in (the bound is at least the mean, rounded up).
    limit = bound(total, len(ring.endpoints)) if total else total + 1
    if key is None:
        # No home: least queued, then least in flight; ties by the pod name's hash, not arrival.
        def rank(e: str) -> tuple[bool, int, int, int]:
            over = load.get(e, 0) + 1 > limit
            return (over, queued.get(e, 0), load.get(e, 0), hash_bytes(e.encode()))

        by_rank = sorted(ring.endpoints, key=rank)
        return Pick(tuple(by_rank), "least-loaded", None, prefill)
    walk = ring.walk(key)
    home = walk[0]
    at, best = 0, None
    for i, endpoint in enumerate(walk):
        if load.get(endpoint, 0) + 1 > limit:
            continue
        cost = score(endpoint, home, queued, prefill)
        if best is None or cost < best:  # ties: the earlier pod on the walk
            at, best = i, cost
    order = (*walk[at:], *walk[:at])
    return Pick(order, "prefix" if at == 0 else "spill", home, prefill)
