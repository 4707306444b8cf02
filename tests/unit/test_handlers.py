"""The kopf wiring: which handlers exist (none that would add a finalizer) and the settings."""

from __future__ import annotations

import asyncio
import contextvars
import copy
import gc
import logging
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any, cast

import kopf
import pytest

from llmop import handlers, kinds, main
from llmop.coalescer import COALESCE_SECONDS, Coalescer
from llmop.config import OperatorConfig
from llmop.kube import Kube
from llmop.metrics import Metrics
from llmop.observed import Owner, child_event_summary
from llmop.persistence import ProcessDiffBase
from llmop.reconcile import Hint
from llmop.reconcile import quiet as quiet_module
from llmop.reconcile.context import ChildEvent, Pass


def _handlers(kind: str) -> list[object]:
    registry = getattr(kopf.get_default_registry(), kind)
    return list(registry.get_all_handlers())


def test_nothing_would_make_kopf_add_a_finalizer() -> None:
    assert _handlers("_spawning") == []  # no timers, no daemons
    changing = _handlers("_changing")
    assert {getattr(h, "id", None) for h in changing} == {"reconcile"}
    reasons = {str(getattr(h, "reason", None)) for h in changing}
    assert not any("delete" in reason for reason in reasons)
    assert not any(getattr(h, "requires_finalizer", None) for h in changing)


def test_children_are_watched_with_low_level_handlers_only() -> None:
    ids = {getattr(h, "id", None) for h in _handlers("_watching")}
    assert ids == {"count-llmdeployments", handlers.POD_HANDLER_ID, handlers.JOB_HANDLER_ID} | {
        f"child-{k.plural}" for k in kinds.WATCHED
    }


def test_every_watched_kind_and_the_parents_have_a_watch_cache() -> None:
    ids = {getattr(h, "id", None) for h in _handlers("_indexing")}
    assert ids == {handlers.PARENT_INDEX, handlers.POD_INDEX} | {
        f"{k.plural}-cache" for k in kinds.WATCHED
    }


def test_settings_use_our_prefixes_and_server_side_label_filters() -> None:
    settings = main.build_settings(OperatorConfig(max_workers=7))
    assert settings.persistence.finalizer.startswith("serving.llmop.dev/")
    assert isinstance(settings.persistence.progress_storage, kopf.AnnotationsProgressStorage)
    assert settings.persistence.progress_storage.prefix == "serving.llmop.dev"
    assert isinstance(settings.persistence.diffbase_storage, ProcessDiffBase)
    assert settings.persistence.diffbase_storage.prefix == "serving.llmop.dev"
    assert settings.execution.max_workers == 7
    assert settings.peering.standalone is True
    # An idle object worker holds its last event's body: let it go after a second, not five.
    assert settings.queueing.idle_timeout == main.WORKER_IDLE_SECONDS == 1.0
    selectors = {
        (s.group, s.version, s.any_name): v for s, v in settings.watching.label_selectors.items()
    }
    assert selectors == {
        ("apps", "v1", "deployments"): "app.kubernetes.io/managed-by=llmop",
        ("apps", "v1", "daemonsets"): "app.kubernetes.io/managed-by=llmop",
        ("", "v1", "pods"): "app.kubernetes.io/managed-by=llmop",
        ("", "v1", "services"): "app.kubernetes.io/managed-by=llmop",
        ("", "v1", "configmaps"): "app.kubernetes.io/managed-by=llmop",
        ("autoscaling", "v2", "horizontalpodautoscalers"): "app.kubernetes.io/managed-by=llmop",
        ("policy", "v1", "poddisruptionbudgets"): "app.kubernetes.io/managed-by=llmop",
        ("batch", "v1", "jobs"): "app.kubernetes.io/managed-by=llmop",
    }


def test_peering_settings() -> None:
    settings = main.build_settings(
        OperatorConfig(standalone=False, peering_name="default", priority=5)
    )
    assert settings.peering.standalone is False
    assert settings.peering.name == "default"
    assert settings.peering.mandatory is True
    assert settings.peering.priority == 5


def _run_event(handler: Any, memo: Any, body: dict[str, Any], type: str = "MODIFIED") -> None:
    async def go() -> None:
        await handler(
            type=type,
            body=kopf.Body(cast(Any, body)),
            namespace="ns",
            memo=memo,
            logger=logging.getLogger("t"),
        )
        await handlers._coalescer(memo).idle()

    asyncio.run(go())


POD = {
    "kind": "Pod",
    "metadata": {
        "namespace": "ns",
        "name": "x-abc",
        "labels": {"serving.llmop.dev/deployment": "x"},
    },
}
DEPLOYMENT = {"kind": "Deployment", "metadata": {"namespace": "ns", "name": "x"}}
KINDS = {"Deployment": kinds.DEPLOYMENT, "Service": kinds.SERVICE}


def _noted_as_event(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every event is taken as ours: the parent is the object's namespace and name, the hint
    a pod's or a child's of the object's kind."""

    def noted(_ctx: Any, kind: str, type: str, obj: Any) -> tuple[tuple[str, str], Hint]:
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        if kind == "Pod":
            return key, Hint.POD
        return key, Hint.child(ChildEvent(KINDS[kind], Owner(*key, "uid"), type, None))

    monkeypatch.setattr(quiet_module, "noted", noted)


def _memo(run: Any, delay: float = 0.0, **pools: Any) -> SimpleNamespace:
    """A memo as kopf hands one to a handler: the context (its caches handed over), the queue
    (running `run` instead of the pass) and the pools."""
    context = SimpleNamespace(children={"cached": {}})
    return SimpleNamespace(context=context, coalescer=Coalescer(delay, run=run), **pools)


@pytest.mark.parametrize(
    "case",
    [
        (handlers.child_event, DEPLOYMENT, "MODIFIED"),
        (handlers.child_event, DEPLOYMENT, "DELETED"),
        (handlers.pod_event, POD, "MODIFIED"),
    ],
)
def test_watch_events_take_a_worker_thread_only_to_write(
    monkeypatch: pytest.MonkeyPatch, case: tuple[Any, Any, str]
) -> None:
    """A quiet event is answered in the event loop; any other runs the blocking pass in the
    refresh pool (`main` puts it in the memo), never in the event loop's thread nor in kopf's
    pool, where under a burst it would wait behind every queued full pass."""
    handler, body, type = case
    quiet = True
    workers: list[str] = []
    _noted_as_event(monkeypatch)
    monkeypatch.setattr(quiet_module, "quiet", lambda *_: quiet)

    def run(*_: Any) -> str:
        workers.append(threading.current_thread().name)
        return "ok"

    with (
        ThreadPoolExecutor(1, thread_name_prefix="kopf-pool") as pool,
        ThreadPoolExecutor(1, thread_name_prefix="refresh-pool") as refresh_pool,
    ):
        memo = _memo(run, executor=pool, refresh_executor=refresh_pool)
        _run_event(handler, memo, body, type)
        assert workers == []
        quiet = False
        _run_event(handler, memo, body, type)
    assert len(workers) == 1
    assert workers[0].startswith("refresh-pool")


def test_events_waiting_for_a_worker_are_merged_per_parent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While a parent's pass runs, its later events merge into one waiting pass (which reads
    the caches when it runs): each parent runs at most twice (the run already taken, then one
    for everything that came meanwhile, every child kind in it); other parents are not held
    up, and no handler waits."""
    _noted_as_event(monkeypatch)
    monkeypatch.setattr(quiet_module, "quiet", lambda *_: False)
    gate = threading.Event()
    seen: list[tuple[str, list[str]]] = []

    def run(_ctx: Any, key: tuple[str, str], hint: Hint) -> str:
        gate.wait(5)
        seen.append((key[1], [event.kind.kind for event in hint.children]))
        return "ok"

    def child(kind: str, name: str) -> kopf.Body:
        return kopf.Body(cast(Any, {"kind": kind, "metadata": {"namespace": "ns", "name": name}}))

    async def go(memo: Any) -> None:
        kwargs = {"namespace": "ns", "memo": memo, "logger": logging.getLogger("t")}
        for kind in ("Deployment", "Service", "Deployment", "Service", "Deployment"):
            for name in ("x", "y"):
                await handlers.child_event(type="MODIFIED", body=child(kind, name), **kwargs)
            await asyncio.sleep(0.01)  # the first run of each parent has taken a thread
        # Every handler returned although no pass could finish yet.
        assert seen == []
        gate.set()
        await handlers._coalescer(memo).idle()

    with ThreadPoolExecutor(2) as pool:
        memo = _memo(run, executor=pool)
        asyncio.run(go(memo))
    for name in ("x", "y"):
        runs = [children for n, children in seen if n == name]
        assert runs == [["Deployment"], ["Service", "Deployment"]]
    assert memo.coalescer.submitted == 10
    assert memo.coalescer.runs == 4


def test_triggers_within_the_delay_make_one_pass() -> None:
    """The Deployment controller writes a new Deployment's status three times within a second;
    waiting `delay` before the first run writes the parent's status once, not once per step
    (at 1,000 CRs with pods: 2,472 status writes instead of 2,984). Triggers of every kind
    merge into that one pass."""
    runs: list[Hint] = []

    def run(_ctx: Any, _key: tuple[str, str], hint: Hint) -> str:
        runs.append(hint)
        return "ok"

    deployment = ChildEvent(kinds.DEPLOYMENT, Owner("ns", "x", "uid"), "MODIFIED", None)

    async def go(memo: Any) -> None:
        for hint in (Hint.POD, Hint.child(deployment), Hint.FLEET, Hint.POD, Hint.DEFERRED):
            memo.coalescer.submit(memo, ("ns", "x"), hint)
            await asyncio.sleep(0.01)
        assert runs == []
        await memo.coalescer.idle()

    with ThreadPoolExecutor(1) as pool:
        asyncio.run(go(_memo(run, delay=0.3, executor=pool)))
    assert len(runs) == 1
    assert runs[0].scope is Pass.CHILD
    assert runs[0].children == (deployment,)
    assert runs[0].also == {Pass.STATUS, Pass.DEFERRED}


def test_a_waiting_event_does_not_keep_kopf_s_cause_alive() -> None:
    """kopf keeps the cause of the running handler (the whole decoded watch event) in a context
    variable; the queue's task must not inherit it, or every event waiting for a thread keeps
    its body alive (~1,900 of them at 1,000 CRs)."""
    cause_var: contextvars.ContextVar[object] = contextvars.ContextVar("cause_var")
    gate = threading.Event()

    class Cause:
        pass

    async def go(memo: Any) -> None:
        cause = Cause()

        def handler(value: Cause) -> None:  # as kopf runs one: a copied context, a var set
            cause_var.set(value)
            memo.coalescer.submit(memo, ("ns", "x"), Hint.POD)

        contextvars.copy_context().run(handler, cause)
        reference = weakref.ref(cause)
        del cause
        gc.collect()
        alive = reference() is not None
        gate.set()
        await memo.coalescer.idle()
        assert not alive, "the waiting run kept the handler's context (and its cause) alive"

    with ThreadPoolExecutor(1) as pool:
        asyncio.run(go(_memo(lambda *_: str(gate.wait(5)), executor=pool)))


def test_every_object_s_copy_of_the_memo_shares_one_coalescer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kopf gives each object `copy.copy(memo)`; a coalescer made on first use would be one per
    object (1,900 at 1,000 CRs), so `main` makes it before any copy."""
    monkeypatch.setattr(Kube, "connect", staticmethod(lambda **_: SimpleNamespace()))
    memo = main._memo(OperatorConfig(), Metrics())
    assert handlers._coalescer(copy.copy(memo)) is handlers._coalescer(copy.copy(memo))
    assert memo.coalescer.delay == COALESCE_SECONDS > 0


def test_a_queued_child_event_keeps_only_what_the_worker_reads() -> None:
    deployment: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "namespace": "ns",
            "name": "x",
            "uid": "u",
            "resourceVersion": "7",
            "ownerReferences": [{"kind": "LLMDeployment", "name": "x", "uid": "p"}],
            "managedFields": [{"manager": "llmop"}],
        },
        "spec": {"template": {"spec": {"containers": [{"name": "engine"}]}}},
        "status": {"readyReplicas": 1},
    }
    stub = child_event_summary(deployment)
    assert stub == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            key: deployment["metadata"][key]
            for key in ("namespace", "name", "uid", "resourceVersion", "ownerReferences")
        },
    }
    hpa = {**deployment, "kind": "HorizontalPodAutoscaler", "status": {"conditions": []}}
    assert child_event_summary(hpa)["status"] == {"conditions": []}


def test_a_deleted_parent_s_diff_base_is_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    """kopf never calls the diff base for a gone object; the count handler must, or the
    operator would keep one entry per LLMDeployment ever created."""
    monkeypatch.setattr(Kube, "connect", staticmethod(lambda **_: SimpleNamespace()))
    memo = main._memo(OperatorConfig(), Metrics())
    memo.context.children = {"cached": {}}  # the caches are handed over: no indexes needed
    memo.diffbase = diffbase = ProcessDiffBase("serving.llmop.dev")
    for uid in ("u-1", "u-2"):
        body = kopf.Body({"metadata": {"uid": uid, "name": uid, "namespace": "ns"}, "spec": {}})
        diffbase.store(body=body, patch=kopf.Patch(), essence=diffbase.build(body=body))

    async def event(type: str, uid: str) -> None:
        await handlers.count_llmdeployment(
            type=type, namespace="ns", name=uid, uid=uid, memo=copy.copy(memo)
        )

    asyncio.run(event("MODIFIED", "u-1"))
    assert len(diffbase) == 2
    asyncio.run(event("DELETED", "u-1"))
    assert len(diffbase) == 1
    assert diffbase.fetch(body=kopf.Body({"metadata": {"uid": "u-2"}})) is not None


def test_a_run_timed_by_its_caller_does_not_wait_for_the_queue() -> None:
    """A deferred status's fallback comes on the queue when its own timer fires, and a parent's
    own handler at once: they skip the queue's wait for later events (`delay=0`), while an
    event's run still waits for it — unless a trigger due sooner comes for the same parent,
    which takes the waiting one along."""
    runs: list[tuple[str, float]] = []
    started = time.monotonic()

    def run(_ctx: Any, key: tuple[str, str], _hint: Hint) -> str:
        runs.append((key[1], time.monotonic() - started))
        return "ok"

    async def go(memo: Any) -> None:
        memo.coalescer.submit(memo, ("ns", "timed"), Hint.DEFERRED, delay=0.0)
        memo.coalescer.submit(memo, ("ns", "event"), Hint.POD)
        memo.coalescer.submit(memo, ("ns", "joined"), Hint.POD)
        memo.coalescer.submit(memo, ("ns", "joined"), Hint.PARENT, delay=0.0)
        await memo.coalescer.idle()

    with ThreadPoolExecutor(1) as pool:
        asyncio.run(go(_memo(run, delay=0.5, executor=pool)))
    waited = dict(runs)
    assert len(runs) == 3
    assert waited["timed"] < 0.25
    assert waited["joined"] < 0.25
    assert waited["event"] >= 0.5
