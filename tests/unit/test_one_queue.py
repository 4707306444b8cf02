"""The one queue of reconcile passes (`llmop.coalescer`, issue 54 item 1): every trigger — the
parent's handler, child, pod and Job events, the agents' readings, the router's, the periodic
checks, the timers — puts its parent's key and a hint there; the hints waiting for one parent
merge (`Hint.merge`), and one worker per parent runs the pass. Driven through the real handlers,
background-loop functions and pass against the in-memory API of test_reconcile."""

from __future__ import annotations

import asyncio
import copy
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from types import SimpleNamespace
from typing import Any, cast

import kopf
import pytest
from test_reconcile import NOW, FakeKube, conds, deliver, parent, rolled_out, run_parent

from llmop import fleet, handlers, kinds, names, reconcile, router_check
from llmop.coalescer import COALESCE_SECONDS, Coalescer
from llmop.config import OperatorConfig
from llmop.kube import KubeError
from llmop.metrics import Metrics
from llmop.observed import Owner
from llmop.pod_client import ReadResult
from llmop.reconcile import Hint
from llmop.reconcile.context import ChildEvent, Pass, Trigger
from support.passes import deferred_pass

KEY = ("ns", "x")
Run = Callable[[reconcile.Context, tuple[str, str], Hint], str]


@pytest.fixture
def kube() -> FakeKube:
    return FakeKube()


@pytest.fixture
def ctx(kube: FakeKube) -> reconcile.Context:
    context = reconcile.Context(
        kube=cast(Any, kube), config=OperatorConfig(), metrics=Metrics(), instance="test"
    )
    context.clock = lambda: NOW
    context.children = {kind: {} for kind in kinds.WATCHED}
    return context


def _memo(ctx: reconcile.Context, delay: float, run: Run = reconcile.reconcile) -> Any:
    """What `main` makes: the context, the one queue, kopf's pool and the refresh pool."""
    return SimpleNamespace(
        context=ctx,
        coalescer=Coalescer(delay, run=run),
        executor=ThreadPoolExecutor(2, thread_name_prefix="kopf-pool"),
        refresh_executor=ThreadPoolExecutor(2, thread_name_prefix="refresh-pool"),
    )


def _close(memo: Any) -> None:
    memo.executor.shutdown()
    memo.refresh_executor.shutdown()


def _owned(kube: FakeKube, kind: str, name: str) -> dict[str, Any]:
    """A child of the parent as its watch event shows it (owner reference, our labels)."""
    owner = kube.objects["Deployment", "ns", "x"]["metadata"]["ownerReferences"]
    metadata = {"namespace": "ns", "name": name, "ownerReferences": owner, "labels": {}}
    return {"kind": kind, "apiVersion": "batch/v1", "metadata": metadata}


def _ready_pod() -> dict[str, Any]:
    return {
        "kind": "Pod",
        "metadata": {
            "name": "x-abc",
            "namespace": "ns",
            "uid": "pod-1",
            "labels": {names.LABEL_DEPLOYMENT: "x", names.LABEL_MANAGED_BY: "llmop"},
        },
        "status": {
            "phase": "Running",
            "podIP": "10.0.0.1",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def _event(handler: Any, memo: Any, body: dict[str, Any], type: str = "MODIFIED") -> Any:
    return handler(
        type=type,
        body=kopf.Body(cast(Any, body)),
        namespace="ns",
        memo=memo,
        logger=None,
        retry=0,
    )


def _status_writes(kube: FakeKube) -> int:
    return sum(1 for call in kube.calls if call[:2] == ("status", "LLMDeployment"))


def _rolled_out_quietly(ctx: reconcile.Context, kube: FakeKube) -> dict[str, Any]:
    """A created CR whose status says "rolling out" while the caches already show it ready:
    every trigger of its pass would now write the status."""
    kube.put(parent(replicas=1))
    assert run_parent(ctx, kube) == "ok"  # no queue yet: written at once, not deferred
    assert conds(kube)["Ready"]["status"] == "False"
    deployment = rolled_out(kube, ready=1)
    deliver(ctx, kube)
    ctx.pods = {KEY: [_ready_pod()]}
    kube.calls.clear()
    return deployment


def burst(ctx: reconcile.Context, kube: FakeKube, memo: Any) -> list[str]:
    """A scripted burst of 12 triggers of 7 kinds for one parent within ~0.1 s, the way the
    operator would deliver them: three Deployment status events, three pod events, a Job's
    two events (through the handlers, in kopf's event loop), the agents' readings and the
    router check (from a background loop's thread), the download poll's periodic check (from
    its thread), and a deferred status's timer. Returns the triggers' names."""
    deployment = _rolled_out_quietly(ctx, kube)
    job = _owned(kube, "Job", "x-download")
    ctx.update(KEY, lambda memory: replace(memory, downloading=True))
    sent: list[str] = []

    async def go() -> None:
        ctx.queue = memo.coalescer.attach(memo)
        for step in range(3):
            changed = copy.deepcopy(deployment)
            changed["metadata"]["resourceVersion"] = str(1000 + step)
            await _event(handlers.child_event, memo, changed)
            await _event(handlers.pod_event, memo, _ready_pod())
            sent.extend(["Deployment event", "pod event"])
            if step < 2:
                await _event(handlers.job_event, memo, job)
                sent.append("Job event")
            await asyncio.sleep(0.01)
        readings = ReadResult(readings={}, failed=0)
        await asyncio.to_thread(fleet.apply_round, ctx, [KEY], [], readings)
        await asyncio.to_thread(router_check.refresh_all, ctx, [KEY])
        await asyncio.to_thread(reconcile.check, ctx, "downloads")
        ctx.queue.put(KEY, Hint.DEFERRED, after=0.01)
        sent.extend(["agents' readings", "router check", "download poll", "deferred timer"])
        await asyncio.sleep(0.05)  # the timer fires, the thread's triggers land
        await memo.coalescer.idle()

    asyncio.run(go())
    return sent


def test_a_burst_of_mixed_triggers_is_one_pass_with_one_status_write(
    ctx: reconcile.Context, kube: FakeKube
) -> None:
    """(a) Twelve triggers of seven kinds for one parent, all within the queue's wait: one
    pass runs (a full one: the Job's and the download poll's triggers ask for it, and it
    covers the rest), and it writes the status once — Ready."""
    memo = _memo(ctx, delay=COALESCE_SECONDS)
    try:
        sent = burst(ctx, kube, memo)
    finally:
        _close(memo)
    assert len(sent) == 12
    assert len(set(sent)) == 7
    assert memo.coalescer.submitted == 12
    assert memo.coalescer.runs == 1
    assert _status_writes(kube) == 1
    assert conds(kube)["Ready"]["status"] == "True"
    assert sum(1 for c in kube.calls if c[:2] == ("event", "Ready")) == 1


def test_two_parents_run_side_by_side_and_one_never_beside_itself() -> None:
    """(b) One worker per parent: a parent's triggers that come while its pass runs wait for
    it (and merge), so it is never in two passes at once; another parent's pass runs
    meanwhile on another thread. The first passes hold until both run (side by side, or the
    barrier breaks) and until every later trigger has come, so no timing is assumed."""
    lock = threading.Lock()
    running: dict[str, int] = {"a": 0, "b": 0}
    most = {"a": 0, "b": 0, "both": 0}
    runs: list[str] = []
    both_running = threading.Barrier(2, timeout=10)
    release = threading.Event()

    def run(_ctx: Any, key: tuple[str, str], _hint: Hint) -> str:
        with lock:
            running[key[1]] += 1
            most[key[1]] = max(most[key[1]], running[key[1]])
            most["both"] = max(most["both"], running["a"] + running["b"])
            first = key[1] not in runs
            runs.append(key[1])
        if first:
            both_running.wait()
            release.wait(10)
        with lock:
            running[key[1]] -= 1
        return "ok"

    memo = _memo(cast(reconcile.Context, None), delay=0.0, run=run)
    memo.refresh_executor = ThreadPoolExecutor(4)

    async def go() -> None:
        for name in ("a", "b"):
            memo.coalescer.submit(memo, ("ns", name), Hint.POD)
        for _ in range(1000):
            if runs.count("a") and runs.count("b"):
                break
            await asyncio.sleep(0.01)
        for _ in range(19):
            for name in ("a", "b"):
                memo.coalescer.submit(memo, ("ns", name), Hint.POD)
        release.set()
        await memo.coalescer.idle()

    try:
        asyncio.run(go())
    finally:
        release.set()
        _close(memo)
    assert most == {"a": 1, "b": 1, "both": 2}
    # The 19 triggers each parent got while its first pass ran are one pass after it.
    assert runs.count("a") == 2
    assert runs.count("b") == 2
    assert memo.coalescer.submitted == 40


def test_triggers_that_come_while_the_pool_is_backlogged_join_the_queued_pass() -> None:
    """A parent's job waiting for a thread takes its hint only when a thread starts it: the
    triggers that come meanwhile (however long the backlog) are in that one pass, not in a
    second one after it."""
    gate = threading.Event()
    ran: list[tuple[str, Hint]] = []

    def run(_ctx: Any, key: tuple[str, str], hint: Hint) -> str:
        if key[1] == "busy":
            gate.wait(5)
        ran.append((key[1], hint))
        return "ok"

    memo = _memo(cast(reconcile.Context, None), delay=0.0, run=run)
    memo.refresh_executor = ThreadPoolExecutor(1)  # one thread, held by the busy parent

    async def go() -> None:
        memo.coalescer.submit(memo, ("ns", "busy"), Hint.POD)
        await asyncio.sleep(0.05)
        memo.coalescer.submit(memo, KEY, Hint.POD)  # queued behind the busy one
        await asyncio.sleep(0.05)
        for hint in (Hint.child(_child(kinds.DEPLOYMENT)), Hint.FLEET, Hint.DEFERRED):
            memo.coalescer.submit(memo, KEY, hint)
        gate.set()
        await memo.coalescer.idle()

    try:
        asyncio.run(go())
    finally:
        _close(memo)
    assert [name for name, _ in ran] == ["busy", "x"]
    merged = ran[1][1]
    assert (merged.scope, merged.also) == (Pass.CHILD, {Pass.STATUS, Pass.DEFERRED})
    assert memo.coalescer.runs == 2


def test_a_full_pass_never_waits_behind_the_refresh_pool_s_backlog(
    ctx: reconcile.Context, kube: FakeKube
) -> None:
    """A parent's child event waits for a refresh thread (all busy); its own update comes: the
    waiting job moves to kopf's pool and runs there at once, the child event merged in, and the
    handler returns while the refresh pool is still busy. The withdrawn job takes nothing."""
    kube.put(parent(replicas=1))
    body = copy.deepcopy(kube.objects["LLMDeployment", "ns", "x"])
    gate = threading.Event()
    recorder = _Recorder()

    def run(context: Any, key: tuple[str, str], hint: Hint) -> str:
        if key[1] == "busy":
            gate.wait(5)
            return "ok"
        return recorder(context, key, hint)

    memo = _memo(ctx, delay=0.0, run=run)
    memo.refresh_executor = ThreadPoolExecutor(1, thread_name_prefix="refresh-pool")

    async def go() -> None:
        memo.coalescer.submit(memo, ("ns", "busy"), Hint.POD)
        await asyncio.sleep(0.05)
        memo.coalescer.submit(memo, KEY, Hint.child(_child(kinds.DEPLOYMENT)))
        await asyncio.sleep(0.05)
        assert recorder.ran == []  # queued behind the busy parent
        await asyncio.wait_for(_event(handlers.reconcile_llmdeployment, memo, body), 2.0)
        assert not gate.is_set()
        gate.set()
        await memo.coalescer.idle()

    try:
        asyncio.run(go())
    finally:
        _close(memo)
    ((key, hint, thread),) = recorder.ran
    assert key == KEY
    assert thread.startswith("kopf-pool")
    assert (hint.trigger, hint.scope, hint.also) == (Trigger.PARENT, Pass.FULL, {Pass.CHILD})
    assert [event.kind for event in hint.children] == [kinds.DEPLOYMENT]
    assert memo.coalescer.runs == 2  # the busy parent's and this one: the withdrawn job ran none


class _Recorder:
    """The queue's worker function, recording what it ran (key, hint, thread), and nothing
    else: the triggers are the test's subject here."""

    def __init__(self) -> None:
        self.ran: list[tuple[tuple[str, str], Hint, str]] = []
        self.fail: Exception | None = None

    def __call__(self, _ctx: Any, key: tuple[str, str], hint: Hint) -> str:
        self.ran.append((key, hint, threading.current_thread().name))
        if self.fail is not None:
            raise self.fail
        return "ok"


def test_a_periodic_check_s_and_a_job_event_s_triggers_go_through_the_queue(
    ctx: reconcile.Context, kube: FakeKube
) -> None:
    """(c) The download poll's round (from its own thread) and a Job's event (in kopf's event
    loop) run no pass themselves: each puts its parent's key on the queue, which records the
    hint and runs it on the queue's worker — a full pass in kopf's pool. Within the queue's
    wait, the two merge into one run."""
    kube.put(parent(replicas=1))
    run_parent(ctx, kube)
    deliver(ctx, kube)
    job = _owned(kube, "Job", "x-download")
    ctx.update(KEY, lambda memory: replace(memory, downloading=True))
    recorder = _Recorder()
    memo = _memo(ctx, delay=0.3, run=recorder)

    async def go() -> None:
        ctx.queue = memo.coalescer.attach(memo)
        assert await asyncio.to_thread(reconcile.check, ctx, "downloads") == 1
        await asyncio.sleep(0.01)
        assert recorder.ran == []  # queued, not run by the check's thread
        await memo.coalescer.idle()
        await _event(handlers.job_event, memo, job)
        assert recorder.ran[1:] == []
        await memo.coalescer.idle()
        # Both within the wait: one run.
        await asyncio.to_thread(reconcile.check, ctx, "downloads")
        await _event(handlers.job_event, memo, job)
        await memo.coalescer.idle()

    try:
        asyncio.run(go())
    finally:
        _close(memo)
    (_, poll, poll_thread), (_, job_hint, job_thread), (_, merged, _) = recorder.ran
    assert [key for key, _, _ in recorder.ran] == [KEY, KEY, KEY]
    assert (poll.trigger, poll.scope, poll.uid) == (Trigger.DOWNLOAD, Pass.FULL, None)
    assert (job_hint.trigger, job_hint.scope, job_hint.uid) == (Trigger.CHILD, Pass.FULL, "uid-1")
    assert poll_thread.startswith("kopf-pool")
    assert job_thread.startswith("kopf-pool")
    assert (merged.trigger, merged.scope, merged.uid) == (Trigger.DOWNLOAD, Pass.FULL, None)
    assert memo.coalescer.submitted == 4
    assert memo.coalescer.runs == 3


def test_the_parent_s_handler_awaits_the_run_that_includes_its_hint(
    ctx: reconcile.Context, kube: FakeKube
) -> None:
    """The parent's create/update/resume goes on the queue due at once, merged with what waits
    for it (a pod event's status pass here), and its handler awaits that one run: a transient
    API error of the run is kopf's TemporaryError, retried with backoff."""
    kube.put(parent(replicas=1))
    body = copy.deepcopy(kube.objects["LLMDeployment", "ns", "x"])
    recorder = _Recorder()
    memo = _memo(ctx, delay=5.0, run=recorder)

    async def go() -> None:
        memo.coalescer.submit(memo, KEY, Hint.POD)  # would wait 5 s on its own
        started = time.monotonic()
        await _event(handlers.reconcile_llmdeployment, memo, body)
        assert time.monotonic() - started < 1.0
        recorder.fail = KubeError("APPLY: HTTP 500: etcd is busy", 500)
        with pytest.raises(kopf.TemporaryError):
            await _event(handlers.reconcile_llmdeployment, memo, body)
        await memo.coalescer.idle()

    try:
        asyncio.run(go())
    finally:
        _close(memo)
    (_, first, _), (_, second, _) = recorder.ran
    assert (first.trigger, first.scope, first.also) == (Trigger.PARENT, Pass.FULL, {Pass.STATUS})
    assert first.body == body
    assert second.trigger is Trigger.PARENT
    assert memo.coalescer.runs == 2


# ----------------------------------------------------------------------------------------------
# Merged hints, and the one pass they run.


def _child(kind: kinds.ChildKind, type: str = "MODIFIED") -> ChildEvent:
    return ChildEvent(kind, Owner("ns", "x", "uid-1"), type, None)


def test_merging_keeps_the_wider_pass_and_what_it_does_not_cover() -> None:
    deployment, service = _child(kinds.DEPLOYMENT), _child(kinds.SERVICE)
    body = {"metadata": {"name": "x"}}
    job = Hint(Trigger.CHILD, Pass.FULL, uid="uid-1")
    # A child's repair covers the status; the merged status pass is kept for when no child
    # asks for one, and the deferred fallback for after the pass.
    merged = Hint.POD.merge(Hint.child(deployment)).merge(Hint.DEFERRED)
    assert (merged.trigger, merged.scope) == (Trigger.CHILD, Pass.CHILD)
    assert merged.also == {Pass.STATUS, Pass.DEFERRED}
    # Every kind's newest event; a deletion in between stays one (the parent is read fresh).
    gone = Hint.child(_child(kinds.SERVICE, "DELETED"))
    merged = merged.merge(gone).merge(Hint.child(service))
    assert [(e.kind, e.type) for e in merged.children] == [
        (kinds.DEPLOYMENT, "MODIFIED"),
        (kinds.SERVICE, "DELETED"),
    ]
    assert merged.fresh
    # A full pass takes over, with the parent's body and no uid unless both name it.
    full = merged.merge(Hint.parent(body))
    assert (full.trigger, full.scope, full.body) == (Trigger.PARENT, Pass.FULL, body)
    assert full.children == merged.children
    assert job.merge(job).uid == "uid-1"
    assert job.merge(Hint.DOWNLOAD).uid is None
    assert job.merge(Hint.POD).uid is None
    assert Hint.DOWNLOAD.merge(job).trigger is Trigger.DOWNLOAD
    # What still runs when the merged pass fails: the narrower passes, the widest of them first.
    narrower = full.narrowed()
    assert narrower is not None
    assert (narrower.scope, narrower.also) == (Pass.CHILD, {Pass.STATUS, Pass.DEFERRED})
    assert Hint.POD.narrowed() is None


def test_a_deletion_merged_with_a_later_event_still_reads_the_parent_fresh(
    ctx: reconcile.Context, kube: FakeKube
) -> None:
    """The Deployment went with its dying parent, and was "seen" again in a later event before
    the pass ran: the merged pass still reads the parent from the API server and recreates
    nothing."""
    kube.put(parent())
    run_parent(ctx, kube)
    deliver(ctx, kube)
    kube.objects.pop(("Deployment", "ns", "x"))
    kube.objects.pop(("LLMDeployment", "ns", "x"))  # deleted; the cache has not noticed yet
    hint = Hint.child(_child(kinds.DEPLOYMENT, "DELETED")).merge(
        Hint.child(_child(kinds.DEPLOYMENT))
    )
    kube.calls.clear()
    assert reconcile.reconcile(ctx, KEY, hint) == "skipped"
    assert kube.calls == [("read", "LLMDeployment", "x")]
    assert ("Deployment", "ns", "x") not in kube.objects


def test_children_that_ask_nothing_of_the_status_still_derive_it_for_a_merged_pod_event(
    ctx: reconcile.Context, kube: FakeKube
) -> None:
    """A Service in sync asks for no write; merged with a pod's event (the status pass), the
    one pass writes the status the pod's event asked for."""
    _rolled_out_quietly(ctx, kube)
    service = Hint.child(_child(kinds.SERVICE))
    assert reconcile.reconcile(ctx, KEY, service) == "skipped"
    assert _status_writes(kube) == 0
    assert reconcile.reconcile(ctx, KEY, service.merge(Hint.POD)) == "ok"
    assert _status_writes(kube) == 1
    assert conds(kube)["Ready"]["status"] == "True"


def test_a_deferred_fallback_merged_into_another_pass_writes_once(
    ctx: reconcile.Context, kube: FakeKube
) -> None:
    """The parent pass deferred its status to the Deployment controller, which never answered;
    the fallback's timer fires together with a pod's event. The pod's status pass alone would
    hold the write; merged, the fallback runs after it and writes the status once."""
    from support.passes import Recorded

    ctx.queue = Recorded()
    kube.put(parent(replicas=1))
    run_parent(ctx, kube)
    assert [hint for _, hint, _ in ctx.queue.put_on] == [Hint.DEFERRED]
    kube.objects["Deployment", "ns", "x"]["metadata"]["generation"] = 1  # not yet observed
    deliver(ctx, kube)
    assert reconcile.reconcile(ctx, KEY, Hint.POD) == "ok"
    assert _status_writes(kube) == 0  # held for the controller
    assert reconcile.reconcile(ctx, KEY, Hint.POD.merge(Hint.DEFERRED)) == "ok"
    assert _status_writes(kube) == 1
    assert conds(kube)["Reconciling"]["reason"] == "RollingOut"
    assert deferred_pass(ctx, "ns", "x") == "skipped"  # over: nothing pending
    assert _status_writes(kube) == 1


def test_a_full_pass_that_fails_still_runs_the_status_pass_merged_into_it(
    ctx: reconcile.Context, kube: FakeKube
) -> None:
    """A CR recreated under its name finds its predecessor's children until the garbage
    collector takes them: its full pass fails (kopf retries it). A status pass merged into it
    (the name check's verdict, a pod's event) still runs, as it would have alone, and the
    failure still reaches kopf."""
    kube.put(parent())
    run_parent(ctx, kube)
    recreated = parent()
    recreated["metadata"]["uid"] = "uid-2"
    kube.put(recreated)
    ctx.forget("ns", "x")
    deliver(ctx, kube)
    kube.calls.clear()
    hint = Hint.POD.merge(Hint.parent(copy.deepcopy(recreated)))
    assert (hint.scope, hint.also) == (Pass.FULL, {Pass.STATUS})
    with pytest.raises(KubeError, match="waiting for the garbage collector"):
        reconcile.reconcile(ctx, KEY, hint)
    assert _status_writes(kube) == 1
    assert kube.objects["LLMDeployment", "ns", "x"]["status"]["observedGeneration"] == 1
    assert kube.objects["Service", "ns", "x"]["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
