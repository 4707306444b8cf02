"""Pure: consistent hashing with bounded load (CHWBL) over one model's ready engine pods.

Each pod owns `VIRTUAL_NODES` points on a 64-bit ring (enough that no pod owns a large arc:
kubeai#447 saw one pod take 80 requests with 20). A key's pod is the first one clockwise from the
key that stays within `LOAD_FACTOR` times the mean once it takes the request (the bounded loads of
Mirrokni, Thorup and Zadeh: the mean and the pod's load both count the new request, the bound
rounded up), so a hot key spills to the next pods on the ring instead of piling onto one
(aibrix#842). KubeAI checks the pod's load before it takes the request, which lets a pod go one
request over the bound: 11 of 24 in flight on 3 pods (1.38 times the mean) where this allows
10. The walk order is the retry order: a request that fails before its first byte goes to the
next pod, never the same one (KubeAI retries the same key and so the same pod). Deterministic:
every router replica with the same pods and loads picks alike.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from llmop_router.prefix import hash_bytes

VIRTUAL_NODES = 256
LOAD_FACTOR = 1.25


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
    """`prefix` (the key's own pod), `spill` (a later pod on the key's walk: the first ones were
    over the load bound), or `least-loaded` (no key)."""


def within_bound(load: int, total: int, endpoints: int, factor: float = LOAD_FACTOR) -> bool:
    """Whether a pod at `load` may take one more request: with it, at most `factor` times the
    mean in flight (which counts it too), rounded up; an idle fleet takes anything."""
    if total == 0:
        return True
    return load + 1 <= math.ceil((total + 1) / endpoints * factor)


def pick(ring: Ring, key: int | None, load: Mapping[str, int]) -> Pick:
    """Order the ring's endpoints for a request with `key` under `load` (in-flight per pod)."""
    if not ring.endpoints:
        return Pick((), "none")
    if key is None:
        # Least loaded first; ties broken by ring position of the pod name, not arrival order.
        by_load = sorted(ring.endpoints, key=lambda e: (load.get(e, 0), hash_bytes(e.encode())))
        return Pick(tuple(by_load), "least-loaded")
    walk = ring.walk(key)
    total = sum(load.get(e, 0) for e in ring.endpoints)
    for i, endpoint in enumerate(walk):
        if within_bound(load.get(endpoint, 0), total, len(ring.endpoints)):
            order = (*walk[i:], *walk[:i])
            return Pick(order, "prefix" if i == 0 else "spill")
    return Pick(tuple(walk), "prefix")
