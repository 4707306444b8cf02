"""Pure: a saturated model's slots lent between router pods, so that priority holds across
them (docs/gateway.md, "Priority and fair sharing"); no I/O, no clock of its own (`now` comes
in).

Each router pod owns 1/N of a model's slots at each endpoint and queues alone. Without loans a
request of a high class waiting on one pod waits for one of that pod's slots to free while the
other pod hands its freed slots to a lower class: strict priority only per pod, and a wait for
one of N/2 slots instead of one of N. With loans, a pod whose slot frees lends it to the peer
that advertises a waiting request of a higher class than any of its own that could take it
(or to any peer with waiting work, when nothing waits here), naming the endpoint where the
slot is; the borrower gives a borrowed slot back as soon as it has a free one, unless what it
still has waiting outranks what the lender advertises (the lender would lend it back).

A peer's slots held here are counted per (peer, model, endpoint): +1 for a slot this pod holds
of the peer's, -1 for one the peer holds of this pod's. A slot given back may be at another
endpoint than the one lent (where this pod's request finished), so both sides move the same
endpoint's count and stay each other's mirror. A pod that may have missed messages (its
subscription was made again, a publish failed) forgets every loan and starts a new epoch,
which every message carries: its peers forget their loans with it when they hear the new
epoch, and a loan addressed to an epoch before it is ignored (its sender forgets it on hearing
the new one), so the two sides never disagree for longer than a message takes. A peer heard
nothing from for `SILENT_SECONDS` is forgotten too: at worst the engines queue a few requests
for a while, which is what the pods' static shares did anyway.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

Key = tuple[str, str]
"""(namespace, name) of the CR."""

SILENT_SECONDS = 3.0
"""A peer with loans or adverts that said nothing for this long is gone (a pod with either
says its state every `BEAT_SECONDS`)."""
BEAT_SECONDS = 1.0
MAX_PEERS = 64
"""Peers remembered at once (the chart runs 2 routers; a message from one more is ignored)."""


@dataclass(frozen=True)
class Advert:
    """What a peer has waiting for a model: the highest class that could take a free slot,
    and how many of its requests could."""

    value: int
    count: int


@dataclass
class Loans:
    """This pod's loans with its peers, and what each peer has waiting."""

    held: Counter[tuple[str, Key, str]] = field(default_factory=Counter)
    """(peer, model, endpoint) → slots of the peer's held here (negative: of ours it holds)."""
    adverts: dict[tuple[str, Key], Advert] = field(default_factory=dict)
    lent_since: Counter[tuple[str, Key]] = field(default_factory=Counter)
    """Slots lent to a peer since its last advert (it may not have counted them yet)."""
    heard: dict[str, float] = field(default_factory=dict)
    """Peer → when it was last heard."""
    epochs: dict[str, int] = field(default_factory=dict)
    """Peer → its epoch, as last heard."""

    def hear(self, peer: str, epoch: int, now: float) -> tuple[bool, set[Key]]:
        """Note that `peer` spoke in `epoch`: whether to read its message (not from an epoch
        it has left, nor from one peer too many), and the models whose loans or adverts a
        new epoch of its made this pod forget."""
        if peer not in self.heard and len(self.heard) >= MAX_PEERS:
            return False, set()
        known = self.epochs.get(peer, epoch)
        if epoch < known:
            return False, set()
        forgotten = self.forget(peer) if epoch > known else set()
        self.heard[peer] = now
        if len(self.epochs) >= 4 * MAX_PEERS:  # peers long gone (each restart is a new one)
            self.epochs = {p: e for p, e in self.epochs.items() if p in self.heard}
        self.epochs[peer] = epoch
        return True, forgotten

    def at(self, key: Key, endpoint: str) -> int:
        """Slots this pod holds at `endpoint` beyond its own share (negative: fewer)."""
        return sum(n for (_, k, e), n in self.held.items() if k == key and e == endpoint)

    def net(self, key: Key) -> int:
        """Slots of `key` this pod holds beyond its own share (negative: fewer)."""
        return sum(n for (_, k, _), n in self.held.items() if k == key)

    def owed(self, key: Key) -> list[str]:
        """Peers that lent this pod more slots of `key` than they hold of its."""
        by_peer: Counter[str] = Counter()
        for (peer, k, _), n in self.held.items():
            if k == key:
                by_peer[peer] += n
        return sorted(peer for peer, n in by_peer.items() if n > 0)

    def wanting(self, key: Key, own: Advert | None) -> str | None:
        """The peer a free slot of `key` should go to: the one advertising the highest class
        above this pod's own best waiting (`own`, None when nothing here could take the slot),
        that still has requests the loans sent since its advert do not cover."""
        best: tuple[int, str] | None = None
        for (peer, k), advert in self.adverts.items():
            if k != key or advert.count <= self.lent_since[peer, k]:
                continue
            if own is not None and advert.value <= own.value:
                continue
            if best is None or (advert.value, peer) > best:
                best = (advert.value, peer)
        return None if best is None else best[1]

    def keeps(self, key: Key, peer: str, own: Advert | None) -> bool:
        """Whether a slot borrowed from `peer` stays here though free: what waits here outranks
        what the peer advertises (it would lend the slot straight back)."""
        if own is None:
            return False
        theirs = self.adverts.get((peer, key))
        return theirs is None or own.value > theirs.value

    def lend(self, peer: str, key: Key, endpoint: str) -> None:
        self._move(peer, key, endpoint, -1)
        self.lent_since[peer, key] += 1

    def borrowed(self, peer: str, key: Key, endpoint: str) -> None:
        self._move(peer, key, endpoint, +1)

    def give_back(self, peer: str, key: Key, endpoint: str) -> None:
        self._move(peer, key, endpoint, -1)

    def given_back(self, peer: str, key: Key, endpoint: str) -> None:
        self._move(peer, key, endpoint, +1)

    def advertised(self, peer: str, adverts: dict[Key, Advert]) -> set[Key]:
        """A peer's whole advert (every model it has waiting work for); the models whose
        advert changed come back."""
        changed = set()
        for peer_key in [pk for pk in self.adverts if pk[0] == peer]:
            if peer_key[1] not in adverts:
                del self.adverts[peer_key]
                self.lent_since.pop(peer_key, None)
                changed.add(peer_key[1])
        for key, advert in adverts.items():
            if self.adverts.get((peer, key)) != advert:
                changed.add(key)
            self.adverts[peer, key] = advert
            self.lent_since.pop((peer, key), None)
        return changed

    def forget(self, peer: str) -> set[Key]:
        """Drop every loan with `peer` and its adverts (it restarted or went silent); the
        models whose slots or adverts that touched come back."""
        keys = {k for (p, k, _) in self.held if p == peer}
        keys |= {k for (p, k) in self.adverts if p == peer}
        for entry in [e for e in self.held if e[0] == peer]:
            del self.held[entry]
        for peer_key in [pk for pk in self.adverts if pk[0] == peer]:
            del self.adverts[peer_key]
        for peer_key in [pk for pk in self.lent_since if pk[0] == peer]:
            del self.lent_since[peer_key]
        self.heard.pop(peer, None)
        return keys

    def forget_all(self) -> set[Key]:
        keys: set[Key] = set()
        for peer in list(self.heard) + [p for (p, _, _) in self.held]:
            keys |= self.forget(peer)
        return keys

    def silent(self, now: float) -> list[str]:
        """Peers not heard from for `SILENT_SECONDS` (their loans and adverts are stale)."""
        return [peer for peer, heard in self.heard.items() if now - heard > SILENT_SECONDS]

    def busy(self) -> bool:
        """Whether this pod has loans to keep alive (it then says its state every beat)."""
        return any(self.held.values())

    def _move(self, peer: str, key: Key, endpoint: str, by: int) -> None:
        entry = (peer, key, endpoint)
        self.held[entry] += by
        if not self.held[entry]:
            del self.held[entry]
