"""Leader election (llmop.leader) against an in-memory Lease store that enforces the API
server's optimistic concurrency (a PUT with a stale resourceVersion gets 409), on fake clocks."""

from __future__ import annotations

import copy
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from llmop.kube import KubeError
from llmop.leader import LeaderElector, Timing, lease_object

NOW = datetime(2026, 1, 2, tzinfo=UTC)


class FakeLeases:
    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.down = False
        self.writes = 0

    def read(self, api_version: str, kind: str, namespace: str, name: str) -> Any:
        if self.down:
            raise KubeError("GET: connection refused")
        return copy.deepcopy(self.lease)

    def _store(self, manifest: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        self.writes += 1
        stored = copy.deepcopy(manifest)
        stored["metadata"]["resourceVersion"] = str(self.version)
        self.lease = stored
        return copy.deepcopy(stored)

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        if self.lease is not None:
            raise KubeError("POST: HTTP 409: already exists", 409)
        return self._store(manifest)

    def replace(self, manifest: dict[str, Any]) -> dict[str, Any]:
        if self.down:
            raise KubeError("PUT: connection refused")
        assert self.lease is not None
        if manifest["metadata"].get("resourceVersion") != self.lease["metadata"]["resourceVersion"]:
            raise KubeError("PUT: HTTP 409: the object has been modified", 409)
        return self._store(manifest)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def elector(store: FakeLeases, identity: str, clock: Clock) -> LeaderElector:
    return LeaderElector(
        store,  # type: ignore[arg-type]
        "llmop-system",
        identity,
        monotonic=clock,
        wall=lambda: NOW + timedelta(seconds=clock.now - 100),
    )


def test_the_first_candidate_creates_the_lease() -> None:
    store, clock = FakeLeases(), Clock()
    a = elector(store, "a", clock)
    assert a.try_once()
    assert a.leading
    assert store.lease is not None
    spec = store.lease["spec"]
    assert store.lease["metadata"]["name"] == "llmop-operator"
    assert spec["holderIdentity"] == "a"
    assert spec["leaseDurationSeconds"] == 15
    assert spec["leaseTransitions"] == 0
    assert spec["renewTime"] == "2026-01-02T00:00:00.000000Z"


def test_a_standby_waits_for_a_lease_renewed_in_time() -> None:
    store, clock = FakeLeases(), Clock()
    a, b = elector(store, "a", clock), elector(store, "b", clock)
    assert a.try_once()
    assert not b.try_once()
    for _ in range(20):  # the leader renews every 2 s: the standby never sees it expire
        clock.now += 2
        assert a.try_once()
        assert not b.try_once()
    assert b.holder == "a"


def test_a_standby_takes_an_expired_lease_by_its_own_clock() -> None:
    """Expiry counts from when the standby saw the record change, not from renewTime (which
    another node's clock wrote)."""
    store, clock = FakeLeases(), Clock()
    a, b = elector(store, "a", clock), elector(store, "b", clock)
    assert a.try_once()
    assert not b.try_once()  # first sight of a's record
    clock.now += 14.9
    assert not b.try_once()
    clock.now += 0.2
    assert b.try_once()
    assert store.lease is not None
    assert store.lease["spec"]["holderIdentity"] == "b"
    assert store.lease["spec"]["leaseTransitions"] == 1
    # The old leader finds another holder: it has lost, at once.
    assert not a.try_once()
    assert not a.leading


def test_of_two_candidates_racing_for_an_expired_lease_one_wins() -> None:
    store, clock = FakeLeases(), Clock()
    a, b, c = (elector(store, n, clock) for n in "abc")
    assert a.try_once()
    b.try_once()
    c.try_once()
    clock.now += 16
    # Both read the same expired record; the second PUT carries a stale resourceVersion.
    lease = store.read("", "", "", "")
    b._write(lease, clock.now)
    assert not c._write(lease, clock.now)
    assert store.lease is not None
    assert store.lease["spec"]["holderIdentity"] == "b"


def test_release_hands_over_at_the_next_attempt() -> None:
    store, clock = FakeLeases(), Clock()
    a, b = elector(store, "a", clock), elector(store, "b", clock)
    assert a.try_once()
    assert not b.try_once()
    a.release()
    assert store.lease is not None
    assert store.lease["spec"]["holderIdentity"] == ""
    assert not a.leading
    assert b.try_once()


def test_keep_gives_up_after_the_renew_deadline() -> None:
    store, clock = FakeLeases(), Clock()
    a = LeaderElector(
        store,  # type: ignore[arg-type]
        "llmop-system",
        "a",
        timing=Timing(lease_duration=15, renew_deadline=10, retry_period=0.001),
        monotonic=clock,
        wall=lambda: NOW,
    )
    assert a.try_once()
    store.down = True
    lost: list[float] = []
    stop = threading.Event()

    def on_lost() -> None:
        lost.append(clock.now)

    original_wait = stop.wait

    def tick(timeout: float | None = None) -> bool:
        clock.now += 1
        return original_wait(0)

    stop.wait = tick  # type: ignore[method-assign]
    a.keep(stop, on_lost)
    assert lost == [110.0]  # the first failed renewal 10 s after the last good one
    assert not a.leading


@pytest.mark.parametrize("release", [False, True])
def test_lease_object_keeps_acquire_time_while_renewing(release: bool) -> None:
    timing = Timing()
    first = lease_object("ns", "a", None, NOW, timing)
    first["metadata"]["resourceVersion"] = "7"
    later = datetime(2026, 1, 2, 0, 0, 8, tzinfo=UTC)
    renewed = lease_object("ns", "a", first, later, timing, release=release)
    assert renewed["metadata"]["resourceVersion"] == "7"
    assert renewed["spec"]["renewTime"] == "2026-01-02T00:00:08.000000Z"
    if release:
        assert renewed["spec"]["holderIdentity"] == ""
        assert renewed["spec"]["leaseDurationSeconds"] == 1
    else:
        assert renewed["spec"]["acquireTime"] == "2026-01-02T00:00:00.000000Z"
