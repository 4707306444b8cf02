"""Reconcile orchestration against an in-memory API (a fake of llmop.kube.Kube, not of a
library) and plain-dict watch caches: status derivation from the caches, write suppression,
stalls, drift repair, and the per-parent lock. What server-side apply does to `spec.replicas`
is not modelled here: the plan is table-tested in test_plan.py and the executor runs against
the real API server in tests/integration/test_operator_executor.py."""

from __future__ import annotations

import copy
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from llmop import kinds, names, reconcile
from llmop.config import OperatorConfig
from llmop.hub import HubUnavailableError
from llmop.kube import ExistsError, KubeError, RejectedError, TerminatingError
from llmop.metrics import Metrics
from llmop.reconcile import caches, first_status
from llmop.reconcile.context import KeyedLocks, Pass, Trigger
from llmop.reconcile.entry import noted
from support.passes import (
    Recorded,
    deferred_pass,
    event_pass,
    event_quiet,
    parent_pass,
    status_pass,
)

NOW = datetime(2026, 1, 2, tzinfo=UTC)
API = "serving.llmop.dev/v1alpha1"
CACHED_KINDS = {k.kind: k for k in kinds.WATCHED}


class FakeKube:
    """Objects by (kind, namespace, name); an apply stores the intent (no SSA merge)."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.calls: list[tuple[str, str, str]] = []
        self.reject: set[str] = set()
        self.terminating = False
        self.version = 100

    def put(self, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        self.objects[obj["kind"], meta.get("namespace", ""), meta["name"]] = obj

    def list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        *,
        field_selector: str | None = None,
        **_: Any,
    ) -> Any:
        self.calls.append(("list", kind, namespace or ""))
        by_name = field_selector is not None and field_selector.startswith("metadata.name=")
        named = field_selector.removeprefix("metadata.name=") if by_name else None
        return [
            copy.deepcopy(obj)
            for (k, ns, name), obj in self.objects.items()
            if k == kind and namespace in (None, ns) and named in (None, name)
        ]

    def read(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append(("read", kind, name))
        found = self.objects.get((kind, namespace, name))
        return copy.deepcopy(found) if found else None

    def apply(
        self, manifest: dict[str, Any], *, field_manager: str, new: bool = False, **_: Any
    ) -> dict[str, Any]:
        kind = manifest["kind"]
        self.calls.append(("apply:" + field_manager, kind, manifest["metadata"]["name"]))
        if kind in self.reject:
            raise RejectedError("APPLY: HTTP 422: invalid", 422)
        if self.terminating:
            raise TerminatingError("APPLY: HTTP 403: namespace is being terminated", 403)
        key = (kind, manifest["metadata"]["namespace"], manifest["metadata"]["name"])
        if new and key in self.objects:
            # What the real API server answers (tests/integration/test_operator_takeover.py).
            raise ExistsError("APPLY: HTTP 409: the object has been modified", 409)
        self.version += 1
        live = copy.deepcopy(self.objects.get(key) or {})
        merged = copy.deepcopy(dict(manifest))
        if field_manager != names.FIELD_MANAGER:
            merged = {**live, "spec": {**live.get("spec", {}), **manifest["spec"]}}
        merged["metadata"] = {
            **live.get("metadata", {}),
            **merged["metadata"],
            "resourceVersion": str(self.version),
            "uid": live.get("metadata", {}).get("uid", f"uid-{kind}"),
        }
        self.objects[key] = merged
        return {}

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        self.calls.append(("delete", kind, name))
        return self.objects.pop((kind, namespace, name), None) is not None

    def patch_status(
        self, api_version: str, kind: str, namespace: str, name: str, patch: dict[str, Any]
    ) -> dict[str, Any] | None:
        self.calls.append(("status", kind, name))
        obj = self.objects.get((kind, namespace, name))
        if obj is None:
            return None
        status = dict(obj.get("status") or {})
        for key, value in patch.items():
            if value is None:
                status.pop(key, None)
            else:
                status[key] = value
        obj["status"] = status
        return copy.deepcopy(obj)

    def create_event(self, event: dict[str, Any]) -> None:
        self.calls.append(("event", event["reason"], event["involvedObject"]["name"]))

    def patch_annotations(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        name: str,
        annotations: dict[str, str | None],
    ) -> bool:
        self.calls.append(("annotate", kind, name, dict(annotations)))
        return True


def parent(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "LLMDeployment",
        "metadata": {"name": "x", "namespace": "ns", "uid": "uid-1", "generation": 1},
        "spec": {
            "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
            "engine": {"backend": "simulator"},
            "resources": {"gpus": 1, "gpuProduct": "NVIDIA-H100-80GB-HBM3"},
            **spec,
        },
    }


@pytest.fixture
def kube() -> FakeKube:
    return FakeKube()


@pytest.fixture
def ctx(kube: FakeKube) -> reconcile.Context:
    context = reconcile.Context(
        kube=kube,  # type: ignore[arg-type]
        config=OperatorConfig(),
        metrics=Metrics(),
        instance="test",
        clock=lambda: NOW,
    )
    context.children = {kind: {} for kind in kinds.WATCHED}
    context.parents = {}
    return context


def deliver(ctx: reconcile.Context, kube: FakeKube) -> None:
    """What the watches would do: the caches catch up with the (fake) API server."""
    parents: dict[tuple[str, str], list[dict[str, Any]]] = {}
    caches: dict[Any, dict[tuple[str, str], list[dict[str, Any]]]] = {
        kind: {} for kind in kinds.WATCHED
    }
    for (kind, namespace, name), obj in kube.objects.items():
        if kind == "LLMDeployment":
            parents[namespace, name] = [copy.deepcopy(obj)]
        elif kind in CACHED_KINDS:
            caches[CACHED_KINDS[kind]][namespace, name] = [copy.deepcopy(obj)]
    ctx.parents = parents
    ctx.children = caches  # type: ignore[assignment]


def run_parent(ctx: reconcile.Context, kube: FakeKube) -> str:
    body = kube.objects["LLMDeployment", "ns", "x"]
    return parent_pass(ctx, copy.deepcopy(body))


def conds(kube: FakeKube) -> dict[str, dict[str, Any]]:
    status = kube.objects["LLMDeployment", "ns", "x"]["status"]
    return {c["type"]: c for c in status["conditions"]}


def rolled_out(kube: FakeKube, ready: int) -> dict[str, Any]:
    deployment = kube.objects["Deployment", "ns", "x"]
    deployment["metadata"]["generation"] = 1
    deployment["status"] = {
        "observedGeneration": 1,
        "replicas": 1,
        "readyReplicas": ready,
        "updatedReplicas": 1,
        "availableReplicas": ready,
    }
    return copy.deepcopy(deployment)


def test_create_applies_children_with_owner_and_writes_status(
    ctx: reconcile.Context, kube: FakeKube
) -> None:
    kube.put(parent(replicas=2))
    assert run_parent(ctx, kube) == "ok"
    kinds_made = {k for (k, _, _) in kube.objects}
    assert kinds_made == {"LLMDeployment", "Deployment", "Service", "PodDisruptionBudget"}
    for (kind, _, _), obj in kube.objects.items():
        if kind != "LLMDeployment":
            (ref,) = obj["metadata"]["ownerReferences"]
            assert ref["uid"] == "uid-1"
            assert ref["controller"] is True
            assert obj["metadata"]["labels"][names.LABEL_MANAGED_BY] == "llmop"
    # Nothing to delete: the caches show no HPA, so no DELETE request is made at all.
    assert not [c for c in kube.calls if c[0] == "delete"]
    status = kube.objects["LLMDeployment", "ns", "x"]["status"]
    assert status["observedGeneration"] == 1
    assert [c["type"] for c in status["conditions"]][:3] == ["Ready", "Reconciling", "Stalled"]
    # The Deployment is not in the watch cache yet; just applied, it is rolling out.
    assert conds(kube)["Reconciling"]["reason"] == "RollingOut"
    assert conds(kube)["Ready"]["status"] == "False"
    assert ("event", "RollingOut", "x") in kube.calls


def test_the_desired_state_is_planned_once_per_generation_and_kept_packed(
    ctx: reconcile.Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    planned: list[int] = []
    real = caches.desired_state

    def counting(llmd: Any, settings: Any, **options: Any) -> Any:
        planned.append(llmd.metadata.generation)
        return real(llmd, settings, **options)

    monkeypatch.setattr(caches, "desired_state", counting)
    body = parent()
    first = caches.parse(ctx, body)
    packed = ctx.recall(("ns", "x")).parsed
    assert packed is not None
    assert isinstance(packed.planned, bytes)  # kept pickled, not as objects
    again = caches.parse(ctx, body)
    assert again.desired == first.desired
    assert again.desired is not first.desired  # each caller gets its own copy to change
    status_view = caches.parse(ctx, body).desired
    assert status_view is not None
    assert first.desired is not None
    # What the status paths read comes without unpickling the children.
    assert status_view.template_hash == first.desired.template_hash is not None
    assert status_view.sizing == first.desired.sizing
    assert isinstance(status_view._children, bytes)
    assert status_view.children == first.desired.children
    edited = copy.deepcopy(body)
    edited["metadata"]["generation"] = 2
    edited["spec"]["replicas"] = 3
    later = caches.parse(ctx, edited).desired
    assert later is not None
    assert later.llmd.spec.replicas == 3
    assert planned == [1, 2]


def test_second_reconcile_writes_no_status(ctx: reconcile.Context, kube: FakeKube) -> None:
    kube.put(parent())
    run_parent(ctx, kube)
    deliver(ctx, kube)
    run_parent(ctx, kube)
    kube.calls.clear()
    run_parent(ctx, kube)
    assert not [c for c in kube.calls if c[0] in ("status", "event")]


def test_plan_that_does_not_fit_creates_nothing(ctx: reconcile.Context, kube: FakeKube) -> None:
    kube.put(
        parent(model={"name": "meta-llama/Llama-3.1-70B-Instruct"}, engine={"backend": "vllm"})
    )
    assert run_parent(ctx, kube) == "stalled"
    assert not [c for c in kube.calls if c[0].startswith("apply")]
    assert conds(kube)["Stalled"]["status"] == "True"
    assert conds(kube)["Stalled"]["reason"] == "WeightsExceedMemory"


def test_invalid_spec_is_stalled_not_raised(ctx: reconcile.Context, kube: FakeKube) -> None:
    body = parent()
    body["spec"]["engine"]["gpuMemoryUtilization"] = "lots"
    kube.put(body)
    assert run_parent(ctx, kube) == "stalled"
    assert conds(kube)["Stalled"]["reason"] == "InvalidSpec"
    assert "gpuMemoryUtilization" in conds(kube)["Stalled"]["message"]


def test_rejected_child_is_stalled(ctx: reconcile.Context, kube: FakeKube) -> None:
    kube.put(parent())
    kube.reject.add("Deployment")
    assert run_parent(ctx, kube) == "stalled"
    assert conds(kube)["Stalled"]["reason"] == "ChildRejected"


def test_terminating_namespace_is_skipped_without_status(
    ctx: reconcile.Context, kube: FakeKube
) -> None:
    kube.put(parent())
    kube.terminating = True
    assert run_parent(ctx, kube) == "skipped"
    assert not [c for c in kube.calls if c[0] == "status"]


def test_dying_parent_is_skipped(ctx: reconcile.Context, kube: FakeKube) -> None:
    body = parent()
    body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    kube.put(body)
    assert run_parent(ctx, kube) == "skipped"
    assert kube.calls == []


def test_autoscaled_parent_reads_the_deployment_fresh(
    ctx: reconcile.Context, kube: FakeKube
) -> None:
    kube.put(parent(replicas=3))
    run_parent(ctx, kube)
    kube.calls.clear()
    body = parent(autoscaling={"minReplicas": 1, "maxReplicas": 5})
    body["metadata"]["generation"] = 2
    kube.put(body)
    run_parent(ctx, kube)  # the cache is stale (nothing delivered): the read decides
    assert kube.calls[0] == ("read", "Deployment", "x")
    handover = [c for c in kube.calls if c[0] == "apply:" + names.HANDOVER_FIELD_MANAGER]
    assert handover == []  # the fake keeps no managedFields: nobody owns replicas


def test_child_event_repairs_drift(ctx: reconcile.Context, kube: FakeKube) -> None:
    kube.put(parent(replicas=2))
    run_parent(ctx, kube)
    kube.objects["Service", "ns", "x"]["spec"]["ports"][0]["port"] = 9999
    deliver(ctx, kube)
    kube.calls.clear()
    edited = kube.objects["Service", "ns", "x"]
    event_pass(ctx, "MODIFIED", edited)
    assert [c for c in kube.calls if c[0].startswith("apply")] == [("apply:llmop", "Service", "x")]


def test_child_event_without_drift_only_refreshes_status(
    ctx: reconcile.Context, kube: FakeKube
) -> None:
    kube.put(parent(replicas=1))
    run_parent(ctx, kube)
    live = rolled_out(kube, ready=1)
    deliver(ctx, kube)
    kube.calls.clear()
    assert event_pass(ctx, "MODIFIED", live) == "ok"
    assert not [c for c in kube.calls if c[0].startswith("apply") or c[0] == "read"]
    assert conds(kube)["Ready"]["status"] == "True"
    assert ("event", "Ready", "x") in kube.calls


def test_a_late_event_cannot_take_ready_back(ctx: reconcile.Context, kube: FakeKube) -> None:
    """The flap: a queued event carrying an older Deployment (not yet ready) is processed after
    the status already said Ready. The status comes from the watch cache, which holds the
    newest Deployment, so Ready stays True and nothing is written."""
    kube.put(parent(replicas=1))
    run_parent(ctx, kube)
    older = rolled_out(kube, ready=0)
    rolled_out(kube, ready=1)
    deliver(ctx, kube)
    event_pass(ctx, "MODIFIED", kube.objects["Deployment", "ns", "x"])
    assert conds(kube)["Ready"]["status"] == "True"
    kube.calls.clear()
    event_pass(ctx, "MODIFIED", older)
    run_parent(ctx, kube)
    assert conds(kube)["Ready"]["status"] == "True"
    assert not [c for c in kube.calls if c[0] == "status"]


def test_status_compares_with_our_last_write_not_a_stale_parent(
    ctx: reconcile.Context, kube: FakeKube
) -> None:
    kube.put(parent(replicas=1))
    run_parent(ctx, kube)
    deliver(ctx, kube)  # the parent cache now holds the first status
    rolled_out(kube, ready=1)
    stale_parent = ctx.parents["ns", "x"]
    ctx.children = {**ctx.children, kinds.DEPLOYMENT: {("ns", "x"): [rolled_out(kube, ready=1)]}}
    event_pass(ctx, "MODIFIED", kube.objects["Deployment", "ns", "x"])
    writes = [c for c in kube.calls if c[0] == "status"]
    # The parent cache still has the old status, but what we wrote is remembered: no rewrite.
    ctx.parents = {("ns", "x"): stale_parent}
    event_pass(ctx, "MODIFIED", kube.objects["Deployment", "ns", "x"])
    assert [c for c in kube.calls if c[0] == "status"] == writes


def test_child_deleted_is_recreated_after_a_fresh_parent_read(
    ctx: reconcile.Context, kube: FakeKube
) -> None:
    kube.put(parent())
    run_parent(ctx, kube)
    gone = kube.objects.pop(("Deployment", "ns", "x"))
    deliver(ctx, kube)
    kube.calls.clear()
    assert event_pass(ctx, "DELETED", gone) == "ok"
    assert kube.calls[0] == ("read", "LLMDeployment", "x")
    assert ("Deployment", "ns", "x") in kube.objects


def test_child_deleted_with_its_dying_parent_is_not_recreated(
    ctx: reconcile.Context, kube: FakeKube
) -> None:
    kube.put(parent())
    run_parent(ctx, kube)
    deliver(ctx, kube)
    gone = kube.objects.pop(("Deployment", "ns", "x"))
    kube.objects.pop(("LLMDeployment", "ns", "x"))  # deleted; the cache has not noticed yet
    assert event_pass(ctx, "DELETED", gone) == "skipped"
    assert ("Deployment", "ns", "x") not in kube.objects


def test_child_events_of_foreign_or_initial_objects_are_ignored(
    ctx: reconcile.Context, kube: FakeKube
) -> None:
    foreign = {"kind": "Deployment", "metadata": {"namespace": "ns", "name": "y"}}
    assert event_pass(ctx, "MODIFIED", foreign) == "skipped"
    kube.put(parent())
    run_parent(ctx, kube)
    kube.calls.clear()
    child = kube.objects["Deployment", "ns", "x"]
    assert event_pass(ctx, None, child) == "skipped"
    assert kube.calls == []


def test_child_of_a_recreated_parent_is_ignored(ctx: reconcile.Context, kube: FakeKube) -> None:
    kube.put(parent())
    run_parent(ctx, kube)
    deliver(ctx, kube)
    child = copy.deepcopy(kube.objects["Deployment", "ns", "x"])
    child["metadata"]["ownerReferences"][0]["uid"] = "old-uid"
    assert event_pass(ctx, "MODIFIED", child) == "skipped"


def test_parent_parsed_once_per_generation(ctx: reconcile.Context, kube: FakeKube) -> None:
    kube.put(parent())
    run_parent(ctx, kube)
    deliver(ctx, kube)
    first = ctx.recall(("ns", "x")).parsed
    assert first is not None
    event_pass(ctx, "MODIFIED", kube.objects["Deployment", "ns", "x"])
    assert ctx.recall(("ns", "x")).parsed is first
    ctx.forget("ns", "x")  # one record per parent: forgetting it drops every memory at once
    assert ("ns", "x") not in dict(ctx.memories())
    assert ctx.recall(("ns", "x")).parsed is None


def test_keyed_locks_serialize_one_key_not_others_and_clean_up() -> None:
    locks = KeyedLocks()
    lock = threading.Lock()
    inside: dict[tuple[str, str], int] = {}
    most: dict[tuple[str, str], int] = {}
    barrier = threading.Barrier(6)

    def worker(key: tuple[str, str]) -> None:
        barrier.wait()
        with locks.hold(key):
            with lock:
                inside[key] = inside.get(key, 0) + 1
                most[key] = max(most.get(key, 0), inside[key])
            time.sleep(0.05)  # long enough for an unguarded peer to enter
            with lock:
                inside[key] -= 1

    keys = [("ns", "x")] * 3 + [("ns", "y")] * 3
    threads = [threading.Thread(target=worker, args=(key,)) for key in keys]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    assert most == {("ns", "x"): 1, ("ns", "y"): 1}  # never two holders of one key
    assert elapsed < 0.05 * 6  # the two keys ran side by side, not one after another
    assert len(locks) == 0


def test_a_generation_this_process_applied_is_only_repaired(
    ctx: reconcile.Context, kube: FakeKube
) -> None:
    """kopf can run the create handler of one generation twice; the second run finds the
    children in the caches and applies nothing. A new process (restart) applies everything."""
    kube.put(parent(replicas=1))
    run_parent(ctx, kube)
    deliver(ctx, kube)
    kube.calls.clear()
    run_parent(ctx, kube)
    assert not [c for c in kube.calls if c[0].startswith("apply")]
    restarted = reconcile.Context(
        kube=kube,  # type: ignore[arg-type]
        config=OperatorConfig(),
        metrics=Metrics(),
        instance="test",
        clock=lambda: NOW,
    )
    restarted.children, restarted.parents = ctx.children, ctx.parents
    run_parent(restarted, kube)
    applies = [c for c in kube.calls if c[0].startswith("apply")]
    assert applies == [("apply:llmop", "Service", "x"), ("apply:llmop", "Deployment", "x")]


# ----------------------------------------------------------------------------------------------
# Deciding in the event loop: each quiet answer must match what the worker path would do.


def _unschedulable_pod() -> dict[str, Any]:
    return {
        "metadata": {
            "name": "x-abc",
            "namespace": "ns",
            "labels": {names.LABEL_DEPLOYMENT: "x", names.LABEL_MANAGED_BY: "llmop"},
        },
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/1 nodes are available",
                }
            ],
        },
    }


def _reconciles(ctx: reconcile.Context, trigger: str, result: str) -> float:
    value = ctx.metrics.registry.get_sample_value(
        "llmop_reconciles_total", {"trigger": trigger, "result": result}
    )
    return value or 0.0


def _ready_deployment(ctx: reconcile.Context, kube: FakeKube) -> dict[str, Any]:
    """One replica rolled out and delivered to the caches; returns the live Deployment."""
    kube.put(parent(replicas=1))
    run_parent(ctx, kube)
    rolled_out(kube, ready=1)
    deliver(ctx, kube)
    return kube.objects["Deployment", "ns", "x"]


def test_an_unchanged_deployment_event_is_quiet_and_counted(
    ctx: reconcile.Context, kube: FakeKube
) -> None:
    deployment = _ready_deployment(ctx, kube)
    # The status changed (Ready): the worker path must write it.
    assert not event_quiet(ctx, "MODIFIED", deployment)
    assert event_pass(ctx, "MODIFIED", deployment) == "ok"
    assert conds(kube)["Ready"]["status"] == "True"
    kube.calls.clear()
    before = _reconciles(ctx, "child", "ok")
    # The same Deployment again (a resync, a status field we do not read): nothing to write.
    assert event_quiet(ctx, "MODIFIED", deployment)
    assert kube.calls == []
    assert _reconciles(ctx, "child", "ok") == before + 1
    # ...and the worker path agrees.
    assert event_pass(ctx, "MODIFIED", deployment) == "ok"
    assert kube.calls == []


def test_a_drifted_child_is_not_quiet(ctx: reconcile.Context, kube: FakeKube) -> None:
    kube.put(parent(replicas=2))
    run_parent(ctx, kube)
    deliver(ctx, kube)
    service = kube.objects["Service", "ns", "x"]
    assert event_quiet(ctx, "MODIFIED", service)  # as applied: nothing to do
    service["spec"]["ports"][0]["port"] = 9999
    deliver(ctx, kube)
    kube.calls.clear()
    assert not event_quiet(ctx, "MODIFIED", service)
    assert kube.calls == []  # deciding makes no request; the repair is the worker's


def test_deletions_and_busy_parents_go_to_the_worker(
    ctx: reconcile.Context, kube: FakeKube
) -> None:
    deployment = _ready_deployment(ctx, kube)
    event_pass(ctx, "MODIFIED", deployment)
    assert event_quiet(ctx, "MODIFIED", deployment)
    # A deletion reads the parent fresh before recreating: never decided from the caches.
    assert not event_quiet(ctx, "DELETED", deployment)
    # While a worker holds (or waits for) this parent, its write may not be visible yet.
    with ctx.locks.hold(("ns", "x")):
        assert ctx.locks.busy(("ns", "x"))
        assert not ctx.locks.busy(("ns", "y"))
        assert not event_quiet(ctx, "MODIFIED", deployment)
        assert not event_quiet(ctx, "MODIFIED", kind="Pod", obj=_unschedulable_pod())
    assert not ctx.locks.busy(("ns", "x"))


def test_an_event_that_asks_nothing_of_the_status_is_quiet_while_a_worker_is_busy(
    ctx: reconcile.Context, kube: FakeKube
) -> None:
    kube.put(parent(replicas=2))
    run_parent(ctx, kube)
    deliver(ctx, kube)
    service = kube.objects["Service", "ns", "x"]
    with ctx.locks.hold(("ns", "x")):
        # A Service as applied: no repair, and a Service never feeds the status.
        assert event_quiet(ctx, "ADDED", service)
        service["spec"]["ports"][0]["port"] = 9999
        deliver(ctx, kube)
        assert not event_quiet(ctx, "MODIFIED", service)


def test_a_child_found_in_sync_is_compared_again_only_once_it_changed(
    ctx: reconcile.Context, kube: FakeKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    deployment = _ready_deployment(ctx, kube)
    assert event_pass(ctx, "MODIFIED", deployment) == "ok"  # found in sync
    compared: list[str] = []
    plan_children = reconcile.entry.plan_children

    def counted(*args: Any, **kwargs: Any) -> Any:
        compared.append(kwargs["only"].kind)
        return plan_children(*args, **kwargs)

    monkeypatch.setattr(reconcile.entry, "plan_children", counted)
    live = kube.objects["Deployment", "ns", "x"]

    # Only its status and resourceVersion moved: not compared again, and still quiet.
    live["metadata"]["resourceVersion"] = "900"
    live["status"] = {**live["status"], "observedGeneration": 1}
    deliver(ctx, kube)
    assert event_quiet(ctx, "MODIFIED", live)
    assert compared == []

    # A label edited by hand (the generation stays): compared, and repaired by the worker.
    live["metadata"]["labels"] = {**live["metadata"]["labels"], names.LABEL_MANAGED_BY: "me"}
    deliver(ctx, kube)
    assert not event_quiet(ctx, "MODIFIED", live)
    assert compared == ["Deployment"]
    assert event_pass(ctx, "MODIFIED", live) == "ok"
    assert ("apply:llmop", "Deployment", "x") in kube.calls

    # The repaired Deployment rolled out, found in sync once more; then its spec edited (the
    # API server raises the generation): compared again and found drifted.
    live = rolled_out(kube, ready=1)
    deliver(ctx, kube)
    event_pass(ctx, "MODIFIED", live)
    assert event_quiet(ctx, "MODIFIED", live)
    compared.clear()
    assert event_quiet(ctx, "MODIFIED", live)
    assert compared == []
    live = kube.objects["Deployment", "ns", "x"]
    live["spec"]["template"]["spec"]["containers"][0]["image"] = "someone/else:1"
    live["metadata"]["generation"] = 2
    deliver(ctx, kube)
    assert not event_quiet(ctx, "MODIFIED", live)
    assert compared == ["Deployment"]

    # A new generation of the parent forgets every answer: its intent is another.
    kube.objects["Deployment", "ns", "x"] = rolled_out(kube, ready=1)
    event_pass(ctx, "MODIFIED", kube.objects["Deployment", "ns", "x"])
    newer = kube.objects["LLMDeployment", "ns", "x"]
    newer["metadata"]["generation"] = 2
    newer["spec"]["replicas"] = 3
    deliver(ctx, kube)
    compared.clear()
    assert not event_quiet(ctx, "MODIFIED", kube.objects["Deployment", "ns", "x"])
    assert compared == ["Deployment"]


def test_foreign_initial_and_orphaned_child_events_are_quiet(
    ctx: reconcile.Context, kube: FakeKube
) -> None:
    foreign = {"kind": "Deployment", "metadata": {"namespace": "ns", "name": "y"}}
    assert event_quiet(ctx, "MODIFIED", foreign)
    kube.put(parent())
    run_parent(ctx, kube)
    deliver(ctx, kube)
    child = copy.deepcopy(kube.objects["Deployment", "ns", "x"])
    assert event_quiet(ctx, None, child)
    child["metadata"]["ownerReferences"][0]["uid"] = "old-uid"  # a recreated parent's
    kube.calls.clear()
    assert event_quiet(ctx, "MODIFIED", child)
    assert kube.calls == []


def test_a_decision_that_fails_goes_to_the_worker(
    ctx: reconcile.Context, kube: FakeKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    kube.put(parent())
    run_parent(ctx, kube)
    deliver(ctx, kube)

    def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("bug")

    monkeypatch.setattr(reconcile.entry, "plan_children", broken)
    assert not event_quiet(ctx, "MODIFIED", kube.objects["Deployment", "ns", "x"])


def test_pod_events_are_quiet_unless_the_status_changes(
    ctx: reconcile.Context, kube: FakeKube
) -> None:
    kube.put(parent(replicas=1))
    run_parent(ctx, kube)
    deliver(ctx, kube)
    event_pass(ctx, "MODIFIED", kube.objects["Deployment", "ns", "x"])
    pod = _unschedulable_pod()
    assert event_quiet(ctx, None, kind="Pod", obj=pod)  # initial listing
    kube.calls.clear()
    assert event_quiet(ctx, "MODIFIED", kind="Pod", obj=pod)  # the cache has no such pod yet
    ctx.pods = {("ns", "x"): [pod]}
    assert not event_quiet(ctx, "MODIFIED", kind="Pod", obj=pod)  # the status must name it
    assert kube.calls == []
    assert event_pass(ctx, "MODIFIED", kind="Pod", obj=pod) == "ok"
    assert "cannot be scheduled" in str(kube.objects["LLMDeployment", "ns", "x"]["status"])
    kube.calls.clear()
    assert event_quiet(ctx, "MODIFIED", kind="Pod", obj=pod)
    assert kube.calls == []


# ----------------------------------------------------------------------------------------------
# A found problem stays reported: every status path carries what the parent path found.
# (The Job and download triggers run the full pass itself (`Pass.FULL`), which meets the
# rejection again.)


def stalled(kube: FakeKube) -> tuple[str, str]:
    found = conds(kube)["Stalled"]
    return found["status"], found["reason"]


def _pending_pod_event(ctx: reconcile.Context) -> dict[str, Any]:
    pod = _unschedulable_pod()
    ctx.pods = {("ns", "x"): [pod]}
    return pod


def test_a_rejected_hpa_stays_stalled_on_every_path(ctx: reconcile.Context, kube: FakeKube) -> None:
    """The live repro: an admission policy denies the HPA; Deployment, pod and fleet events
    used to write "no longer stalled" within a second, leaving Ready=True with no HPA."""
    kube.put(parent(autoscaling={"minReplicas": 1, "maxReplicas": 3}))
    kube.reject.add("HorizontalPodAutoscaler")
    assert run_parent(ctx, kube) == "stalled"
    assert stalled(kube) == ("True", "ChildRejected")
    rolled_out(kube, ready=1)
    deliver(ctx, kube)
    deployment = kube.objects["Deployment", "ns", "x"]

    assert not event_quiet(ctx, "MODIFIED", deployment)  # Ready moves: writes
    assert event_pass(ctx, "MODIFIED", deployment) == "stalled"
    assert stalled(kube) == ("True", "ChildRejected")
    assert event_quiet(ctx, "MODIFIED", deployment)
    assert _reconciles(ctx, "child", "stalled") == 2  # the worker's and the quiet one
    assert event_pass(ctx, "MODIFIED", kind="Pod", obj=_pending_pod_event(ctx)) == "stalled"
    assert stalled(kube) == ("True", "ChildRejected")
    assert "cannot be scheduled" in str(kube.objects["LLMDeployment", "ns", "x"]["status"])
    assert status_pass(ctx, "ns", "x") == "stalled"
    assert stalled(kube) == ("True", "ChildRejected")
    assert "Recovered" not in {c[1] for c in kube.calls if c[0] == "event"}

    # A child event that repairs another child does not clear it.
    kube.objects["Service", "ns", "x"]["spec"]["ports"][0]["port"] = 9999
    deliver(ctx, kube)
    event_pass(ctx, "MODIFIED", kube.objects["Service", "ns", "x"])
    assert kube.objects["Service", "ns", "x"]["spec"]["ports"][0]["port"] != 9999
    assert stalled(kube) == ("True", "ChildRejected")

    # The policy is lifted: the next parent pass applies every child and clears it.
    kube.reject.clear()
    assert run_parent(ctx, kube) == "ok"
    assert ("HorizontalPodAutoscaler", "ns", "x") in kube.objects
    assert stalled(kube)[0] == "False"


def test_a_rejection_on_the_child_path_is_remembered_too(
    ctx: reconcile.Context, kube: FakeKube
) -> None:
    deployment = _ready_deployment(ctx, kube)
    event_pass(ctx, "MODIFIED", deployment)
    assert conds(kube)["Ready"]["status"] == "True"
    kube.objects["Service", "ns", "x"]["spec"]["ports"][0]["port"] = 9999
    kube.reject.add("Service")
    deliver(ctx, kube)
    assert event_pass(ctx, "MODIFIED", kube.objects["Service", "ns", "x"]) == ("stalled")
    assert stalled(kube) == ("True", "ChildRejected")
    assert event_pass(ctx, "MODIFIED", kind="Pod", obj=_pending_pod_event(ctx)) == "stalled"
    assert stalled(kube) == ("True", "ChildRejected")


def test_an_internal_error_stays_reported_until_a_parent_pass(
    ctx: reconcile.Context, kube: FakeKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    deployment = _ready_deployment(ctx, kube)
    real_plan = reconcile.entry.plan_children

    def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("bug")

    monkeypatch.setattr(reconcile.entry, "plan_children", broken)
    assert event_pass(ctx, "MODIFIED", deployment) == "error"
    assert stalled(kube) == ("True", "InternalError")
    monkeypatch.setattr(reconcile.entry, "plan_children", real_plan)
    assert event_pass(ctx, "MODIFIED", deployment) == "stalled"
    assert event_pass(ctx, "MODIFIED", kind="Pod", obj=_pending_pod_event(ctx)) == "stalled"
    assert status_pass(ctx, "ns", "x") == "stalled"
    assert stalled(kube) == ("True", "InternalError")
    assert run_parent(ctx, kube) == "ok"
    assert stalled(kube)[0] == "False"


def test_a_new_generation_forgets_the_old_problem(ctx: reconcile.Context, kube: FakeKube) -> None:
    kube.put(parent(autoscaling={"minReplicas": 1, "maxReplicas": 3}))
    kube.reject.add("HorizontalPodAutoscaler")
    run_parent(ctx, kube)
    kube.reject.clear()
    body = parent(autoscaling={"minReplicas": 1, "maxReplicas": 4})
    body["metadata"]["generation"] = 2
    body["status"] = kube.objects["LLMDeployment", "ns", "x"]["status"]
    kube.put(body)
    assert run_parent(ctx, kube) == "ok"
    assert stalled(kube)[0] == "False"


def test_a_new_process_refinds_the_problem_on_its_first_parent_pass(
    ctx: reconcile.Context, kube: FakeKube
) -> None:
    """The memory is per process: a new leader leaves a Stalled it did not find to the parent
    path (its status paths do not erase it), which finds the problem again."""
    kube.put(parent(autoscaling={"minReplicas": 1, "maxReplicas": 3}))
    kube.reject.add("HorizontalPodAutoscaler")
    run_parent(ctx, kube)
    rolled_out(kube, ready=1)
    successor = reconcile.Context(
        kube=ctx.kube, config=ctx.config, metrics=Metrics(), instance="test", clock=lambda: NOW
    )
    deliver(successor, kube)
    kube.calls.clear()
    assert status_pass(successor, "ns", "x") == "skipped"
    assert event_pass(successor, "MODIFIED", kind="Pod", obj=_pending_pod_event(successor)) == (
        "skipped"
    )
    assert not [c for c in kube.calls if c[0] == "status"]
    assert run_parent(successor, kube) == "stalled"
    assert stalled(kube) == ("True", "ChildRejected")
    assert status_pass(successor, "ns", "x") == "stalled"


def test_a_hub_outage_is_transient_not_an_internal_error(
    ctx: reconcile.Context, kube: FakeKube
) -> None:
    """The hub not answering raises its own transient error (the handler retries with backoff);
    it never stalls the parent as a bug would."""
    kube.put(parent())

    def outage() -> str:
        raise HubUnavailableError("the hub did not answer: timed out")

    body = kube.objects["LLMDeployment", "ns", "x"]
    with pytest.raises(HubUnavailableError):
        reconcile.writes.guarded(ctx, body, outage)
    assert "status" not in body


def test_a_rollout_on_a_full_node_replaces_one_pod_at_a_time(
    ctx: reconcile.Context, kube: FakeKube
) -> None:
    kube.put(parent(replicas=2))
    run_parent(ctx, kube)
    created = kube.objects["Deployment", "ns", "x"]
    digest = created["metadata"]["annotations"][names.ANNOTATION_TEMPLATE_HASH]
    # A create rolls nothing: nothing is counted, nothing is listed.
    assert created["metadata"]["annotations"][names.ANNOTATION_ROLLOUT_ROOM] == f"{digest}/-"
    assert created["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert not [c for c in kube.calls if c[0] == "list"]

    product = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    kube.put(
        {
            "kind": "Node",
            "metadata": {"name": "n0", "labels": product},
            "status": {"allocatable": {"nvidia.com/gpu": "2", "cpu": "8", "pods": "110"}},
        }
    )
    for index in range(2):
        kube.put(
            {
                "kind": "Pod",
                "metadata": {
                    "name": f"x-{index}",
                    "namespace": "ns",
                    "labels": {names.LABEL_DEPLOYMENT: "x"},
                },
                "spec": {
                    "nodeName": "n0",
                    "containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                },
                "status": {"phase": "Running"},
            }
        )
    body = parent(replicas=2, engine={"backend": "simulator", "maxNumSeqs": 8})
    body["metadata"]["generation"] = 2
    kube.put(body)
    deliver(ctx, kube)
    kube.calls.clear()
    assert run_parent(ctx, kube) == "ok"
    rolled = kube.objects["Deployment", "ns", "x"]
    new_digest = rolled["metadata"]["annotations"][names.ANNOTATION_TEMPLATE_HASH]
    assert new_digest != digest
    assert rolled["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert rolled["metadata"]["annotations"][names.ANNOTATION_ROLLOUT_ROOM] == f"{new_digest}/0"
    assert [c for c in kube.calls if c[0] == "list"] == [("list", "Node", ""), ("list", "Pod", "")]
    assert ("event", "RolloutStrategy", "x") in kube.calls

    # Every later pass (a repair, a child event) renders the stored count: no list, no drift.
    deliver(ctx, kube)
    kube.calls.clear()
    run_parent(ctx, kube)
    event_pass(ctx, "MODIFIED", copy.deepcopy(rolled))
    assert not [c for c in kube.calls if c[0] == "list" or c[0].startswith("apply")]


class _Deferrals(Recorded):
    """The operator's queue as the deferred statuses use it: each fallback on a timer."""

    def __init__(self, runs: list[tuple[str, str]]) -> None:
        super().__init__()
        self.runs = runs

    def put(
        self, key: tuple[str, str], hint: reconcile.Hint, *, after: float | None = None
    ) -> None:
        assert hint == reconcile.Hint.DEFERRED
        assert after == first_status.DEFER_SECONDS
        self.runs.append(key)


@pytest.fixture
def scheduled(ctx: reconcile.Context) -> list[tuple[str, str]]:
    """The operator's queue, recording the deferred statuses' fallbacks put on it."""
    runs: list[tuple[str, str]] = []
    ctx.queue = _Deferrals(runs)
    return runs


def _writes(kube: FakeKube) -> list[tuple[str, ...]]:
    return [c for c in kube.calls if c[0] in ("status", "event")]


def _unobserved(kube: FakeKube) -> dict[str, Any]:
    """The applied Deployment as its ADDED event shows it: generation 1, no status yet."""
    deployment = kube.objects["Deployment", "ns", "x"]
    deployment["metadata"]["generation"] = 1
    return copy.deepcopy(deployment)


def test_a_created_deployment_gets_one_status_write_once_its_controller_saw_it(
    ctx: reconcile.Context, kube: FakeKube, scheduled: list[tuple[str, str]]
) -> None:
    """The parent pass leaves its "rolling out" status to the Deployment controller's first
    status: one status write and one Event (Ready), not two of each."""
    kube.put(parent(replicas=1))
    assert run_parent(ctx, kube) == "ok"
    assert scheduled == [("ns", "x")]
    assert _writes(kube) == []
    added = _unobserved(kube)
    deliver(ctx, kube)
    assert event_quiet(ctx, "ADDED", added)
    assert event_pass(ctx, "ADDED", added) == "ok"
    assert status_pass(ctx, "ns", "x") == "ok"
    assert _writes(kube) == []

    observed = rolled_out(kube, ready=1)
    deliver(ctx, kube)
    assert not event_quiet(ctx, "MODIFIED", observed)
    assert event_pass(ctx, "MODIFIED", observed) == "ok"
    assert _writes(kube) == [("status", "LLMDeployment", "x"), ("event", "Ready", "x")]
    assert kube.objects["LLMDeployment", "ns", "x"]["status"]["observedGeneration"] == 1
    assert conds(kube)["Ready"]["status"] == "True"
    # The fallback finds the generation written and does nothing.
    kube.calls.clear()
    assert deferred_pass(ctx, "ns", "x") == "skipped"
    assert kube.calls == []


def test_the_fallback_writes_a_deferred_status_the_controller_never_answered(
    ctx: reconcile.Context, kube: FakeKube, scheduled: list[tuple[str, str]]
) -> None:
    kube.put(parent(replicas=1))
    run_parent(ctx, kube)
    _unobserved(kube)
    deliver(ctx, kube)
    assert deferred_pass(ctx, "ns", "x") == "ok"
    assert kube.objects["LLMDeployment", "ns", "x"]["status"]["observedGeneration"] == 1
    assert conds(kube)["Reconciling"]["reason"] == "RollingOut"
    assert ("event", "RollingOut", "x") in kube.calls
    # Over: the next status path writes as usual, and a second fallback run does nothing.
    assert deferred_pass(ctx, "ns", "x") == "skipped"
    observed = rolled_out(kube, ready=1)
    deliver(ctx, kube)
    assert not event_quiet(ctx, "MODIFIED", observed)


def _other_deployment_observed(ctx: reconcile.Context) -> None:
    """A watch event of another model's Deployment that its controller has observed."""
    first_status.note_deployment(
        ctx,
        {"metadata": {"name": "other", "generation": 2}, "status": {"observedGeneration": 2}},
    )


def _deferred_on_a_clock(ctx: reconcile.Context, kube: FakeKube) -> dict[str, datetime]:
    """A created CR whose parent pass deferred its status, its Deployment not yet observed, on
    a clock the test moves (`clock["now"]`)."""
    clock = {"now": NOW}
    ctx.clock = lambda: clock["now"]
    kube.put(parent(replicas=1))
    run_parent(ctx, kube)
    _unobserved(kube)
    deliver(ctx, kube)
    return clock


def test_the_fallback_waits_longer_while_the_deployment_controller_is_at_work(
    ctx: reconcile.Context, kube: FakeKube, scheduled: list[tuple[str, str]]
) -> None:
    """A burst: the controller observes other Deployments but has not reached this one yet. The
    fallback runs again later instead of writing "rolling out" (and a RollingOut Event) moments
    before the controller's status makes it write Ready (and a Ready Event)."""
    clock = _deferred_on_a_clock(ctx, kube)
    # Not a sign of a working controller: a Deployment it has not observed yet.
    first_status.note_deployment(ctx, kube.objects["Deployment", "ns", "x"])
    assert ctx.deployments_observed_at is None
    _other_deployment_observed(ctx)
    scheduled.clear()
    clock["now"] = NOW + timedelta(seconds=first_status.DEFER_SECONDS)
    _other_deployment_observed(ctx)
    assert deferred_pass(ctx, "ns", "x") == "skipped"
    assert scheduled == [("ns", "x")]
    assert _writes(kube) == []
    # Its first status comes: one status write, one Event, and the fallback has nothing left.
    observed = rolled_out(kube, ready=1)
    deliver(ctx, kube)
    assert event_pass(ctx, "MODIFIED", observed) == "ok"
    assert _writes(kube) == [("status", "LLMDeployment", "x"), ("event", "Ready", "x")]
    assert deferred_pass(ctx, "ns", "x") == "skipped"


def test_the_fallback_writes_once_the_controller_is_gone_quiet_or_the_wait_is_longest(
    ctx: reconcile.Context, kube: FakeKube, scheduled: list[tuple[str, str]]
) -> None:
    clock = _deferred_on_a_clock(ctx, kube)
    # Seen at work, but not within the last DEFER_SECONDS: it may have stopped; write.
    _other_deployment_observed(ctx)
    clock["now"] = NOW + timedelta(seconds=first_status.DEFER_SECONDS + 1)
    assert deferred_pass(ctx, "ns", "x") == "ok"
    assert conds(kube)["Reconciling"]["reason"] == "RollingOut"

    # A new generation, and a controller at work that never reaches this Deployment: the
    # fallback waits again only while the whole wait stays within LONGEST_DEFER_SECONDS.
    _edit_and_reconcile(ctx, kube, 2, replicas=1, engine={"backend": "simulator", "maxNumSeqs": 8})
    started = clock["now"]
    waits = 0
    while True:
        clock["now"] += timedelta(seconds=first_status.DEFER_SECONDS)
        _other_deployment_observed(ctx)
        if deferred_pass(ctx, "ns", "x") != "skipped":
            break
        waits += 1
    assert (clock["now"] - started).total_seconds() <= first_status.LONGEST_DEFER_SECONDS
    assert waits == first_status.LONGEST_DEFER_SECONDS // first_status.DEFER_SECONDS - 1
    assert kube.objects["LLMDeployment", "ns", "x"]["status"]["observedGeneration"] == 2


def _edit_and_reconcile(
    ctx: reconcile.Context, kube: FakeKube, generation: int, **spec: Any
) -> str:
    """The user's edit as generation `generation` (status kept), delivered, then a parent pass
    with the calls recorded from there."""
    edited = parent(**spec)
    edited["metadata"]["generation"] = generation
    edited["status"] = kube.objects["LLMDeployment", "ns", "x"]["status"]
    kube.put(edited)
    deliver(ctx, kube)
    kube.calls.clear()
    return run_parent(ctx, kube)


def test_a_template_change_defers_and_a_replica_change_writes_at_once(
    ctx: reconcile.Context, kube: FakeKube, scheduled: list[tuple[str, str]]
) -> None:
    """Only a change the cached Deployment does not show yet is waited for: a new pod template
    (its hash) is; a replica count on an observed Deployment with the same template is not."""
    deployment = _ready_deployment(ctx, kube)
    event_pass(ctx, "MODIFIED", deployment)
    scheduled.clear()

    assert _edit_and_reconcile(ctx, kube, 2, replicas=2) == "ok"
    assert scheduled == []
    assert kube.objects["LLMDeployment", "ns", "x"]["status"]["observedGeneration"] == 2

    engine = {"backend": "simulator", "maxNumSeqs": 8}
    assert _edit_and_reconcile(ctx, kube, 3, replicas=2, engine=engine) == "ok"
    assert scheduled == [("ns", "x")]
    # (The rollout's RolloutStrategy Event is news of the rollout, not of the status.)
    assert [c for c in _writes(kube) if c[1] != "RolloutStrategy"] == []
    kube.calls.clear()
    # A status path that runs before the controller saw the new template writes nothing...
    deliver(ctx, kube)
    assert status_pass(ctx, "ns", "x") == "ok"
    assert _writes(kube) == []
    # ...and the fallback writes the new generation's status (the controller last seen at work
    # long ago: the ready Deployment's event, noted as the handlers note every one, would
    # otherwise have it wait once more).
    ctx.deployments_observed_at = NOW - timedelta(seconds=first_status.LONGEST_DEFER_SECONDS)
    assert deferred_pass(ctx, "ns", "x") == "ok"
    assert kube.objects["LLMDeployment", "ns", "x"]["status"]["observedGeneration"] == 3


def test_a_problem_is_written_at_once_with_a_scheduler(
    ctx: reconcile.Context, kube: FakeKube, scheduled: list[tuple[str, str]]
) -> None:
    kube.put(parent(autoscaling={"minReplicas": 1, "maxReplicas": 3}))
    kube.reject.add("HorizontalPodAutoscaler")
    assert run_parent(ctx, kube) == "stalled"
    assert scheduled == []
    assert stalled(kube) == ("True", "ChildRejected")


def test_every_watch_event_becomes_its_parent_s_key_and_a_hint(
    ctx: reconcile.Context, kube: FakeKube
) -> None:
    """`noted` turns an event into the parent's key and the hint of the one pass: a child's
    repairs its own kind (two kinds merged on the queue repair both), a pod's re-derives the
    status only, a Job's is a full pass for its owner's uid; the initial listing and objects
    not ours ask for nothing."""
    kube.put(parent())
    run_parent(ctx, kube)
    deliver(ctx, kube)
    deployment = kube.objects["Deployment", "ns", "x"]
    service = kube.objects["Service", "ns", "x"]
    found = noted(ctx, "Deployment", "MODIFIED", deployment)
    assert found is not None
    key, hint = found
    assert key == ("ns", "x")
    assert hint.scope is Pass.CHILD
    assert hint.trigger is Trigger.CHILD
    other = noted(ctx, "Service", "MODIFIED", service)
    assert other is not None
    merged = hint.merge(other[1])
    assert merged.scope is Pass.CHILD
    assert [event.kind for event in merged.children] == [kinds.DEPLOYMENT, kinds.SERVICE]
    assert noted(ctx, "Deployment", None, deployment) is None  # initial listing
    pod = {"metadata": {"namespace": "ns", "name": "x-1", "labels": {names.LABEL_DEPLOYMENT: "x"}}}
    assert noted(ctx, "Pod", "MODIFIED", pod) == (("ns", "x"), reconcile.Hint.POD)
    assert reconcile.Hint.POD.scope is Pass.STATUS
    job = {"metadata": {"namespace": "ns", "name": "x-download", "ownerReferences": []}}
    job["metadata"]["ownerReferences"] = deployment["metadata"]["ownerReferences"]
    found = noted(ctx, "Job", "MODIFIED", job)
    assert found is not None
    assert found[1].scope is Pass.FULL
    assert found[1].uid == "uid-1"


def test_a_job_of_a_recreated_parent_runs_no_pass(ctx: reconcile.Context, kube: FakeKube) -> None:
    """A Job's hint names its owner's uid: a parent recreated under the same name is left alone,
    and nothing is counted (the pass never starts)."""
    kube.put(parent())
    run_parent(ctx, kube)
    deliver(ctx, kube)
    kube.calls.clear()
    hint = reconcile.Hint(Trigger.CHILD, Pass.FULL, uid="old-uid")
    before = _reconciles(ctx, "child", "skipped")
    assert reconcile.reconcile(ctx, ("ns", "x"), hint) == "skipped"
    assert _reconciles(ctx, "child", "skipped") == before
    assert kube.calls == []


def _foreign_service() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "x", "namespace": "ns", "uid": "svc-1", "resourceVersion": "7"},
        "spec": {"ports": [{"port": 443}], "selector": {"app": "shop"}},
    }


def test_a_child_name_taken_by_someone_else_stalls_and_leaves_it_untouched(
    ctx: reconcile.Context, kube: FakeKube
) -> None:
    """No takeovers: a Service named like the CR with no owner is refused (one create, one
    list by name), the CR is Stalled ChildNameConflict naming it, one retry is put on the
    queue however many passes find the conflict, and nothing flaps meanwhile; once it is
    deleted, the retry creates the child and Stalled clears."""
    ctx.queue = queue = Recorded()
    scheduled = queue.put_on
    kube.put(_foreign_service())
    kube.put(parent())
    before = copy.deepcopy(kube.objects["Service", "ns", "x"])
    assert run_parent(ctx, kube) == "stalled"
    assert kube.objects["Service", "ns", "x"] == before
    stalled = conds(kube)["Stalled"]
    assert (stalled["status"], stalled["reason"]) == ("True", "ChildNameConflict")
    assert "Service ns/x already exists" in stalled["message"]
    assert "(no owner)" in stalled["message"]
    assert "delete or rename that Service" in stalled["message"]
    assert [c[:2] for c in kube.calls[:2]] == [("apply:llmop", "Service"), ("list", "Service")]
    assert scheduled == [(("ns", "x"), reconcile.Hint.PARENT, 10.0)]
    # Other passes meanwhile (a pod's status pass, the parent again) carry the problem.
    deliver(ctx, kube)
    kube.calls.clear()
    assert status_pass(ctx, "ns", "x") in ("stalled", "skipped")
    assert run_parent(ctx, kube) == "stalled"
    assert not [c for c in kube.calls if c[0] in ("status", "event")]
    assert len(scheduled) == 1
    assert kube.objects["Service", "ns", "x"] == before
    # The object goes: the retry creates the child, and Stalled clears.
    del kube.objects["Service", "ns", "x"]
    deliver(ctx, kube)
    assert run_parent(ctx, kube) == "ok"
    assert kube.objects["Service", "ns", "x"]["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    # The status waits for the Deployment controller's first status (`first_status`).
    deployment = rolled_out(kube, ready=1)
    deliver(ctx, kube)
    event_pass(ctx, "MODIFIED", deployment)
    assert conds(kube)["Stalled"]["status"] == "False"
    assert conds(kube)["Ready"]["status"] == "True"


def test_a_child_the_cache_has_not_shown_yet_is_ours_and_applied(
    ctx: reconcile.Context, kube: FakeKube
) -> None:
    """The watch cache may lag behind our own create (kopf running a create twice, a new
    generation at once): the child found in the way is this CR's, so it is applied as usual."""
    kube.put(parent())
    assert run_parent(ctx, kube) == "ok"
    body = parent(replicas=2)
    body["metadata"]["generation"] = 2
    kube.put(body)
    kube.calls.clear()
    assert run_parent(ctx, kube) == "ok"  # nothing delivered: the caches show no child
    assert kube.objects["Deployment", "ns", "x"]["spec"]["replicas"] == 2
    assert conds(kube)["Stalled"]["status"] == "False"


def test_a_deleted_predecessors_child_is_retried_not_stalled(
    ctx: reconcile.Context, kube: FakeKube
) -> None:
    """A CR deleted and created again under its name finds its predecessor's children until
    the garbage collector removes them: a transient error (retried), not a conflict."""
    kube.put(parent())
    run_parent(ctx, kube)
    recreated = parent()
    recreated["metadata"]["uid"] = "uid-2"
    kube.put(recreated)
    ctx.forget("ns", "x")
    with pytest.raises(KubeError, match="waiting for the garbage collector"):
        run_parent(ctx, kube)
    assert kube.objects["Service", "ns", "x"]["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
