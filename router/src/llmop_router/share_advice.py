"""Pure: the `maxSharePercent` to suggest for a priority class at a model, from the load the
classes above it were measured to bring (docs/gateway.md, "Suggested shares"); no I/O, no
clock of its own.

A higher class's request finds a slot free at once only if enough of them are held back from
the lower classes (strict priority alone makes it wait for the next slot to free). Taking the
requests of every class above as one stream whose load is their mean number in flight (the
offered load, in slots: arrivals a second x seconds each), the slots to hold back are the
fewest `k` for which Erlang C(k, load), the chance that one of those requests finds all `k`
busy and waits, is at most `WAIT_TARGET`; the class's share is then the rest, in whole percent
of each router pod's share (gateway.md's reference case: 1.37 slots of interactive load waits
56 % of the time with 2 of 16 slots held back, 6 % with 4). The load is what this router pod
sent, decayed with a `HALF_LIFE_SECONDS` half-life (over the time it was measured, while that
is shorter), times the router pods (each sees its share of the clients).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

Key = tuple[str, str]
"""(namespace, name) of the CR."""

WAIT_TARGET = 0.05
"""The chance a higher class's request may wait for a slot."""
HALF_LIFE_SECONDS = 300.0
MAX_HELD_BACK = 4096


def erlang_c(servers: int, load: float) -> float:
    """The chance an arrival waits, with `servers` and an offered `load` (Erlang C); 1 when
    the load fills them."""
    if load <= 0:
        return 0.0
    if servers <= load:
        return 1.0
    blocking = 1.0  # Erlang B by its recursion, stable for large counts
    for n in range(1, servers + 1):
        blocking = load * blocking / (n + load * blocking)
    return blocking / (1 - (load / servers) * (1 - blocking))


def held_back(load: float, target: float = WAIT_TARGET) -> int:
    """The fewest slots that keep the chance of a wait at most `target` for `load`."""
    if load <= 0:
        return 0
    servers = max(1, math.floor(load) + 1)
    while erlang_c(servers, load) > target and servers < MAX_HELD_BACK:
        servers += 1
    return servers


def suggested_percent(share: int, load_above: float, replicas: int = 1) -> int | None:
    """The share to suggest a class whose higher classes bring `load_above` through each of
    `replicas` router pods, each owning `share` slots of the model; None: nothing to suggest
    (no load above it, or no slots). A class's `maxSharePercent` applies to each pod's own
    share, rounded down: the percent is the least that keeps the slots left to it there."""
    if share <= 0 or load_above <= 0:
        return None
    held = -(-held_back(load_above * replicas) // replicas)
    kept = max(1, share - held)
    return min(100, -(-100 * kept // share))


@dataclass
class ClassLoad:
    """Mean requests in flight per model and class, through this pod."""

    means: dict[Key, dict[str, float]] = field(default_factory=dict)
    weights: dict[Key, float] = field(default_factory=dict)
    """How much of the decayed window each model's means cover: a model first seen a minute
    ago has a minute's mean, not a fifth of one (the means are divided by it)."""
    values: dict[str, int] = field(default_factory=dict)
    """Class name → its value (as its requests came)."""
    sampled: float | None = None

    def sample(self, running: Mapping[Key, Mapping[str, int]], now: float) -> None:
        """Requests in flight now per model and class (models not named: none)."""
        if self.sampled is None:
            self.sampled = now
            return
        decay = 0.5 ** (max(0.0, now - self.sampled) / HALF_LIFE_SECONDS)
        self.sampled = now
        for key in set(self.means) | set(running):
            counts = running.get(key, {})
            means = self.means.setdefault(key, {})
            self.weights[key] = decay * self.weights.get(key, 0.0) + (1 - decay)
            for name in set(means) | set(counts):
                means[name] = decay * means.get(name, 0.0) + (1 - decay) * counts.get(name, 0)
            for name in [n for n, m in means.items() if m < 1e-6 and not counts.get(n)]:
                del means[name]
            if not means:
                del self.means[key], self.weights[key]

    def mean(self, key: Key, name: str) -> float:
        """The class's mean requests in flight at the model, over the decayed window."""
        weight = self.weights.get(key, 0.0)
        return self.means.get(key, {}).get(name, 0.0) / weight if weight > 0 else 0.0

    def suggestions(self, key: Key, slots: int, replicas: int) -> dict[str, int]:
        """Class name → the share to suggest it at the model `key`, of which this pod owns
        `slots` slots (of `replicas` pods alike), for every class of its requests with load
        above it."""
        means = {name: self.mean(key, name) for name in self.means.get(key, {})}
        found: dict[str, int] = {}
        for name in means:
            value = self.values.get(name, 0)
            above = sum(m for n, m in means.items() if self.values.get(n, 0) > value)
            percent = suggested_percent(slots, above, replicas)
            if percent is not None:
                found[name] = percent
        return found
