"""Leader election (llmop.leader) against an in-memory Lease store that enforces the API
server's optimistic concurrency (a PUT with a stale resourceVersion gets 409), on fake clocks."""

from __future__ import annotations

import asyncio
import copy
import os
import signal
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import kopf
import pytest

from llmop import kube as kube_module
from llmop import main, runnables
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


def test_a_leader_that_lost_the_lease_takes_it_back_at_once_unless_another_did() -> None:
    """After an outage the process campaigns again with the same elector (`llmop.main`): a
    Lease still in its name is its own at the first attempt (no 15 s wait for itself); one a
    standby took meanwhile is the standby's."""
    store, clock = FakeLeases(), Clock()
    a, b = elector(store, "a", clock), elector(store, "b", clock)
    assert a.try_once()
    assert not b.try_once()
    store.down = True
    clock.now += 11
    assert not a._attempt()
    a._renewed_at = None  # what `keep` does once the renew deadline passed
    store.down = False
    assert a.try_once(), "nobody took it: its own again at once"
    assert store.lease is not None
    assert store.lease["spec"]["holderIdentity"] == "a"
    assert store.lease["spec"]["leaseTransitions"] == 0

    assert not b.try_once()  # b sees a's renewal
    a._renewed_at = None  # a loses it again, and this time stays away past the lease
    clock.now += 16  # b's wait since it last saw a's record change
    assert b.try_once()
    assert not a.try_once(), "b took it: a stands by"
    assert a.holder == "b"


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


# The process's leadership terms (`llmop.main`): kopf faked, the Lease scripted.


class TermKube:
    """The API client of one term (`Kube.connect` in `main._memo`)."""

    def __init__(self) -> None:
        self.fenced = False
        self.closed = False

    def fence(self) -> None:
        self.fenced = True

    def close(self) -> None:
        self.closed = True

    def serves(self, api_version: str, plural: str) -> bool:
        return True  # the CRD is installed: `llmop.crd_check` has nothing to say


class ScriptedElector:
    """Leads whenever it campaigns (up to `terms` times), loses the Lease in the terms listed
    in `lose_in` once that term's kopf runs, and records what it saw."""

    def __init__(self, terms: int, lose_in: set[int], kopf_running: list[threading.Event]):
        self.timing = Timing(lease_duration=15, renew_deadline=10, retry_period=2)
        self.kube = TermKube()
        self.terms = terms
        self.lose_in = lose_in
        self.kopf_running = kopf_running
        self.acquired = 0
        self.released: list[int] = []
        self.kubes_at_acquire: list[list[tuple[bool, bool]]] = []
        self.kubes: list[TermKube] = []

    def acquire(self, stop: threading.Event) -> bool:
        if stop.is_set() or self.acquired == self.terms:
            return False
        self.kubes_at_acquire.append([(k.fenced, k.closed) for k in self.kubes])
        self.acquired += 1
        return True

    def keep(self, stop: threading.Event, on_lost: Any) -> None:
        term = self.acquired
        if term in self.lose_in:
            self.kopf_running[term - 1].wait(10)
            on_lost()
            return
        stop.wait()

    def release(self) -> None:
        self.released.append(self.acquired)
        assert all(k.fenced for k in self.kubes), "released the Lease before the term was fenced"


@pytest.fixture
def faked_process(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """`main.run` with no API server and no kopf: each `Kube.connect` a `TermKube`, kopf's
    spawn/run a stand-in that runs until its stop flag or a cancellation, `os._exit` recorded."""
    seen: dict[str, Any] = {"spawned": [], "exits": [], "kubes": [], "running": []}

    def connect(**_: Any) -> TermKube:
        made = TermKube()
        seen["kubes"].append(made)
        return made

    monkeypatch.setattr(kube_module.Kube, "connect", staticmethod(connect))
    monkeypatch.setattr(main, "_configure_logging", lambda config: None)
    monkeypatch.setattr(main, "tune_garbage_collector", lambda: None)

    def exit_(code: int) -> None:
        seen["exits"].append(code)
        seen["exited"].set()

    seen["exited"] = threading.Event()
    monkeypatch.setattr(main, "_exit", exit_)
    return seen


def _run(seen: dict[str, Any], elector: ScriptedElector, monkeypatch: pytest.MonkeyPatch) -> int:
    def make_elector(config: Any, instance: str) -> ScriptedElector:
        elector.kubes = seen["kubes"]
        return elector

    monkeypatch.setattr(main, "_elector", make_elector)
    return main.run(["--liveness-port", "0", "--metrics-port", "0"])


def test_a_leader_that_loses_the_lease_stands_by_and_leads_again_with_fresh_state(
    faked_process: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Term 1 loses the Lease: its client is fenced and closed and kopf cancelled before the
    process campaigns again; term 2 gets a new memo (Context, caches, client), new settings
    (diff base) and a new kopf run; SIGTERM in term 2 stops the process cleanly (exit 0, the
    Lease released after the fence)."""
    seen = faked_process
    running = [threading.Event(), threading.Event()]

    async def spawn_tasks(**kwargs: Any) -> list[Any]:
        seen["spawned"].append(kwargs)
        return []

    async def run_tasks(tasks: Any, ignored: Any) -> None:
        term = len(seen["spawned"])
        stop = seen["spawned"][-1]["stop_flag"]
        running[term - 1].set()
        if term == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # as the kubelet would
        await asyncio.get_running_loop().run_in_executor(None, stop.wait)

    monkeypatch.setattr(kopf, "spawn_tasks", spawn_tasks)
    monkeypatch.setattr(kopf, "run_tasks", run_tasks)
    elector = ScriptedElector(terms=3, lose_in={1}, kopf_running=running)
    previous = signal.getsignal(signal.SIGTERM)

    assert _run(seen, elector, monkeypatch) == 0

    assert elector.acquired == 2, "campaigned again after the loss, and stopped on SIGTERM"
    first, second = seen["spawned"]
    assert first["memo"] is not second["memo"]
    assert first["memo"].context is not second["memo"].context
    assert first["memo"].context.kube is not second["memo"].context.kube
    assert first["settings"] is not second["settings"]
    assert first["memo"].diffbase is not second["memo"].diffbase
    assert first["insights"] is not second["insights"]
    assert first["memo"].refresh_executor is not second["memo"].refresh_executor
    term_kubes = [first["memo"].context.kube, second["memo"].context.kube]
    # When it campaigned again, the lost term's client was fenced and closed.
    assert elector.kubes_at_acquire[1][:1] == [(True, True)]
    assert all(k.fenced and k.closed for k in term_kubes)
    assert elector.released == [2], "only the clean stop releases the Lease"
    assert seen["exits"] == []
    assert signal.getsignal(signal.SIGTERM) is previous


def test_a_lost_term_whose_kopf_does_not_stop_ends_the_process_with_the_old_code(
    faked_process: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The safety net: kopf still running `grace` seconds after the loss (a blocking call on
    its event loop) → exit code 3, for Kubernetes to restart the process as a standby."""
    seen = faked_process
    running = [threading.Event()]

    async def spawn_tasks(**kwargs: Any) -> list[Any]:
        seen["spawned"].append(kwargs)
        return []

    async def run_tasks(tasks: Any, ignored: Any) -> None:
        running[0].set()
        # Deaf to the stop flag and to cancellation, like a blocking call in a coroutine.
        seen["exited"].wait(30)
        seen["lost_at_exit"] = time.monotonic()

    monkeypatch.setattr(kopf, "spawn_tasks", spawn_tasks)
    monkeypatch.setattr(kopf, "run_tasks", run_tasks)
    elector = ScriptedElector(terms=1, lose_in={1}, kopf_running=running)
    elector.timing = Timing(lease_duration=4, renew_deadline=2, retry_period=1)  # grace: 1 s

    started = time.monotonic()
    assert _run(seen, elector, monkeypatch) == 0  # (the recorded exit returned)
    assert seen["exits"] == [main.LOST_EXIT_CODE]
    assert 0.9 < seen["lost_at_exit"] - started < 5


def test_a_handler_still_running_after_the_drain_ends_the_process_with_the_old_code(
    faked_process: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """kopf stopped, but one of its handler threads does not return (hung, not on the API:
    a fenced client fails at once): exit code 3 after `TERM_DRAIN_SECONDS`."""
    seen = faked_process
    running = [threading.Event()]
    monkeypatch.setattr(main, "TERM_DRAIN_SECONDS", 0.5)

    async def spawn_tasks(**kwargs: Any) -> list[Any]:
        seen["spawned"].append(kwargs)
        return []

    async def run_tasks(tasks: Any, ignored: Any) -> None:
        kwargs = seen["spawned"][-1]
        kwargs["memo"].executor.submit(seen["exited"].wait, 30)  # a hung handler
        running[0].set()
        await asyncio.get_running_loop().run_in_executor(None, kwargs["stop_flag"].wait)

    monkeypatch.setattr(kopf, "spawn_tasks", spawn_tasks)
    monkeypatch.setattr(kopf, "run_tasks", run_tasks)
    elector = ScriptedElector(terms=1, lose_in={1}, kopf_running=running)

    assert _run(seen, elector, monkeypatch) == 0
    assert seen["exits"] == [main.LOST_EXIT_CODE]


def test_each_term_runs_its_own_loops_and_a_lost_term_stops_them_first(
    faked_process: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The background loops (`llmop.runnables`) run once per term, on that term's `Context`:
    term 1 loses the Lease, and its task is cancelled and its thread has returned before term
    2 starts fresh ones, which SIGTERM stops in turn; a row the config disables never runs."""
    seen = faked_process
    running = [threading.Event(), threading.Event()]
    events: list[tuple[str, Any]] = []

    async def task(term: runnables.Term) -> None:
        events.append(("task started", term.context))
        try:
            await asyncio.Event().wait()
        finally:
            events.append(("task stopped", term.context))

    def thread(term: runnables.Term, stop: threading.Event) -> None:
        events.append(("thread started", term.context))
        stop.wait()
        events.append(("thread stopped", term.context))

    def disabled(term: runnables.Term) -> Any:
        events.append(("disabled row made", term.context))

    monkeypatch.setattr(
        runnables,
        "TABLE",
        (
            runnables.Runnable("task", task),
            runnables.Runnable("off", disabled, lambda config: not config.leader_elect),
            runnables.Runnable("thread", lambda term: lambda stop: thread(term, stop)),
        ),
    )

    async def spawn_tasks(**kwargs: Any) -> list[Any]:
        seen["spawned"].append(kwargs)
        return []

    async def run_tasks(tasks: Any, ignored: Any) -> None:
        term = len(seen["spawned"])
        stop = seen["spawned"][-1]["stop_flag"]
        while len(events) < 2 * term:  # this term's loops have started
            await asyncio.sleep(0.01)
        running[term - 1].set()
        if term == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.get_running_loop().run_in_executor(None, stop.wait)

    monkeypatch.setattr(kopf, "spawn_tasks", spawn_tasks)
    monkeypatch.setattr(kopf, "run_tasks", run_tasks)
    elector = ScriptedElector(terms=3, lose_in={1}, kopf_running=running)

    assert _run(seen, elector, monkeypatch) == 0

    first, second = (kwargs["memo"].context for kwargs in seen["spawned"])
    assert first is not second
    assert [ctx for _, ctx in events] == [first] * 4 + [second] * 4, "one term after the other"
    started, stopped = {"task started", "thread started"}, {"task stopped", "thread stopped"}
    for term in (events[:4], events[4:]):
        assert {what for what, _ in term[:2]} == started
        assert {what for what, _ in term[2:]} == stopped
