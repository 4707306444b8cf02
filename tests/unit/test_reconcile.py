"""Reconcile orchestration against an in-memory API (a fake of llmop.kube.Kube, not of a
library): owner references, HPA handover, drift detection, status write suppression."""

from __future__ import annotations

import copy
import threading
from datetime import UTC, datetime
from typing import Any

import pytest

from llmop import names, reconcile
from llmop.config import OperatorConfig
from llmop.kube import RejectedError, TerminatingError
from llmop.metrics import Metrics

NOW = datetime(2026, 1, 2, tzinfo=UTC)
API = "serving.llmop.dev/v1alpha1"


class FakeKube:
    """Objects by (kind, namespace, name); SSA modelled as a merge that records managers."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.calls: list[tuple[str, str, str]] = []
        self.reject: set[str] = set()
        self.terminating = False

    def put(self, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        self.objects[obj["kind"], meta["namespace"], meta["name"]] = obj

    def read(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append(("read", kind, name))
        found = self.objects.get((kind, namespace, name))
        return copy.deepcopy(found) if found else None

    def apply(
        self, manifest: dict[str, Any], *, field_manager: str, force: bool = True
    ) -> dict[str, Any]:
        kind = manifest["kind"]
        self.calls.append(("apply:" + field_manager, kind, manifest["metadata"]["name"]))
        if kind in self.reject:
            raise RejectedError("APPLY: HTTP 422: invalid", 422)
        if self.terminating:
            raise TerminatingError("APPLY: HTTP 403: namespace is being terminated", 403)
        key = (kind, manifest["metadata"]["namespace"], manifest["metadata"]["name"])
        live = copy.deepcopy(self.objects.get(key) or {"metadata": {"generation": 1}})
        spec = dict(live.get("spec") or {})
        replicas_owned = "replicas" in (manifest.get("spec") or {})
        entries = [
            e for e in live["metadata"].get("managedFields", []) if e["manager"] != field_manager
        ]
        fields: dict[str, Any] = (
            {"f:spec": {"f:replicas": {}}} if replicas_owned else {"f:spec": {}}
        )
        entries.append({"manager": field_manager, "operation": "Apply", "fieldsV1": fields})
        new_spec = manifest.get("spec") or {}
        if field_manager == names.FIELD_MANAGER:
            keep = {"replicas": spec["replicas"]} if "replicas" in spec else {}
            spec = {**new_spec, **({} if "replicas" in new_spec else keep)}
        else:
            spec = {**spec, **new_spec}
        merged = {
            **live,
            **{k: v for k, v in manifest.items() if k not in ("spec", "metadata")},
            "metadata": {
                **live["metadata"],
                **manifest["metadata"],
                "managedFields": entries,
            },
            "spec": spec,
        }
        self.objects[key] = merged
        return copy.deepcopy(merged)

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        self.calls.append(("delete", kind, name))
        return self.objects.pop((kind, namespace, name), None) is not None

    def patch_status(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        patch: dict[str, Any],
        **_: Any,
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
        return obj

    def create_event(self, event: dict[str, Any]) -> None:
        self.calls.append(("event", event["reason"], event["involvedObject"]["name"]))


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
    return reconcile.Context(
        kube=kube,  # type: ignore[arg-type]
        config=OperatorConfig(),
        metrics=Metrics(),
        instance="test",
        clock=lambda: NOW,
    )


def writes(kube: FakeKube) -> list[tuple[str, str, str]]:
    return [c for c in kube.calls if c[0] != "read"]


def test_create_applies_children_with_owner_and_writes_status(
    ctx: reconcile.Context, kube: FakeKube
) -> None:
    kube.put(parent(replicas=2))
    assert reconcile.reconcile(ctx, "ns", "x") == "ok"
    kinds = {k for (k, _, _) in kube.objects}
    assert kinds == {"LLMDeployment", "Deployment", "Service", "PodDisruptionBudget"}
    for (kind, _, _), obj in kube.objects.items():
        if kind != "LLMDeployment":
            (ref,) = obj["metadata"]["ownerReferences"]
            assert ref["uid"] == "uid-1"
            assert ref["controller"] is True
            assert obj["metadata"]["labels"][names.LABEL_MANAGED_BY] == "llmop"
    assert ("delete", "HorizontalPodAutoscaler", "x") in kube.calls
    status = kube.objects["LLMDeployment", "ns", "x"]["status"]
    assert status["observedGeneration"] == 1
    assert [c["type"] for c in status["conditions"]][:3] == ["Ready", "Reconciling", "Stalled"]
    assert ("event", "RollingOut", "x") in kube.calls


def test_second_reconcile_writes_no_status(ctx: reconcile.Context, kube: FakeKube) -> None:
    kube.put(parent())
    reconcile.reconcile(ctx, "ns", "x")
    kube.calls.clear()
    reconcile.reconcile(ctx, "ns", "x")
    assert not [c for c in kube.calls if c[0] in ("status", "event")]


def test_plan_that_does_not_fit_creates_nothing(ctx: reconcile.Context, kube: FakeKube) -> None:
    kube.put(
        parent(model={"name": "meta-llama/Llama-3.1-70B-Instruct"}, engine={"backend": "vllm"})
    )
    assert reconcile.reconcile(ctx, "ns", "x") == "stalled"
    assert not [c for c in kube.calls if c[0].startswith("apply")]
    conds = {c["type"]: c for c in kube.objects["LLMDeployment", "ns", "x"]["status"]["conditions"]}
    assert conds["Stalled"]["status"] == "True"
    assert conds["Stalled"]["reason"] == "WeightsExceedMemory"


def test_invalid_spec_is_stalled_not_raised(ctx: reconcile.Context, kube: FakeKube) -> None:
    body = parent()
    body["spec"]["engine"]["gpuMemoryUtilization"] = "lots"
    kube.put(body)
    assert reconcile.reconcile(ctx, "ns", "x") == "stalled"
    conds = {c["type"]: c for c in kube.objects["LLMDeployment", "ns", "x"]["status"]["conditions"]}
    assert conds["Stalled"]["reason"] == "InvalidSpec"
    assert "gpuMemoryUtilization" in conds["Stalled"]["message"]


def test_rejected_child_is_stalled(ctx: reconcile.Context, kube: FakeKube) -> None:
    kube.put(parent())
    kube.reject.add("Deployment")
    assert reconcile.reconcile(ctx, "ns", "x") == "stalled"
    conds = {c["type"]: c for c in kube.objects["LLMDeployment", "ns", "x"]["status"]["conditions"]}
    assert conds["Stalled"]["reason"] == "ChildRejected"


def test_terminating_namespace_is_skipped_without_status(
    ctx: reconcile.Context, kube: FakeKube
) -> None:
    kube.put(parent())
    kube.terminating = True
    assert reconcile.reconcile(ctx, "ns", "x") == "skipped"
    assert not [c for c in kube.calls if c[0] == "status"]


def test_deleted_or_dying_parent_is_skipped(ctx: reconcile.Context, kube: FakeKube) -> None:
    assert reconcile.reconcile(ctx, "ns", "x") == "skipped"
    body = parent()
    body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    kube.put(body)
    assert reconcile.reconcile(ctx, "ns", "x") == "skipped"
    assert writes(kube) == []


def test_turning_autoscaling_on_hands_replicas_over_first(
    ctx: reconcile.Context, kube: FakeKube
) -> None:
    kube.put(parent(replicas=3))
    reconcile.reconcile(ctx, "ns", "x")
    kube.calls.clear()
    kube.put(parent(autoscaling={"minReplicas": 1, "maxReplicas": 5}))
    reconcile.reconcile(ctx, "ns", "x")
    applies = [c for c in kube.calls if c[0].startswith("apply") and c[1] == "Deployment"]
    assert applies == [
        ("apply:" + names.HANDOVER_FIELD_MANAGER, "Deployment", "x"),
        ("apply:" + names.FIELD_MANAGER, "Deployment", "x"),
    ]
    assert kube.objects["Deployment", "ns", "x"]["spec"]["replicas"] == 3
    assert ("HorizontalPodAutoscaler", "ns", "x") in kube.objects


def test_hpa_owned_replicas_are_left_alone(ctx: reconcile.Context, kube: FakeKube) -> None:
    kube.put(parent(autoscaling={"minReplicas": 1, "maxReplicas": 5}))
    reconcile.reconcile(ctx, "ns", "x")
    kube.objects["Deployment", "ns", "x"]["spec"]["replicas"] = 3  # the HPA scaled
    kube.calls.clear()
    reconcile.reconcile(ctx, "ns", "x")
    assert not [c for c in kube.calls if c[0] == "apply:" + names.HANDOVER_FIELD_MANAGER]
    assert kube.objects["Deployment", "ns", "x"]["spec"]["replicas"] == 3


def test_new_autoscaled_deployment_starts_at_min_replicas(
    ctx: reconcile.Context, kube: FakeKube
) -> None:
    kube.put(parent(autoscaling={"minReplicas": 2, "maxReplicas": 5}))
    reconcile.reconcile(ctx, "ns", "x")
    assert kube.objects["Deployment", "ns", "x"]["spec"]["replicas"] == 2


def test_turning_autoscaling_off_deletes_hpa_before_applying_replicas(
    ctx: reconcile.Context, kube: FakeKube
) -> None:
    kube.put(parent(autoscaling={"minReplicas": 1, "maxReplicas": 5}))
    reconcile.reconcile(ctx, "ns", "x")
    kube.calls.clear()
    kube.put(parent(replicas=2))
    reconcile.reconcile(ctx, "ns", "x")
    order = [c[:2] for c in kube.calls if c[0] in ("delete", "apply:llmop")]
    assert order.index(("delete", "HorizontalPodAutoscaler")) < order.index(
        ("apply:llmop", "Deployment")
    )
    assert ("HorizontalPodAutoscaler", "ns", "x") not in kube.objects
    assert kube.objects["Deployment", "ns", "x"]["spec"]["replicas"] == 2


def test_child_event_repairs_drift(ctx: reconcile.Context, kube: FakeKube) -> None:
    kube.put(parent(replicas=2))
    reconcile.reconcile(ctx, "ns", "x")
    edited = copy.deepcopy(kube.objects["Service", "ns", "x"])
    edited["spec"]["ports"][0]["port"] = 9999
    kube.calls.clear()
    reconcile.on_child_event(ctx, "MODIFIED", edited)
    assert ("apply:llmop", "Service", "x") in kube.calls


def test_child_event_without_drift_only_refreshes_status(
    ctx: reconcile.Context, kube: FakeKube
) -> None:
    kube.put(parent(replicas=1))
    reconcile.reconcile(ctx, "ns", "x")
    live = copy.deepcopy(kube.objects["Deployment", "ns", "x"])
    live["status"] = {
        "observedGeneration": 1,
        "replicas": 1,
        "readyReplicas": 1,
        "updatedReplicas": 1,
        "availableReplicas": 1,
    }
    kube.calls.clear()
    assert reconcile.on_child_event(ctx, "MODIFIED", live) == "ok"
    assert not [c for c in kube.calls if c[0].startswith("apply")]
    conds = {c["type"]: c for c in kube.objects["LLMDeployment", "ns", "x"]["status"]["conditions"]}
    assert conds["Ready"]["status"] == "True"
    assert ("event", "Ready", "x") in kube.calls


def test_child_deleted_triggers_full_reconcile(ctx: reconcile.Context, kube: FakeKube) -> None:
    kube.put(parent())
    reconcile.reconcile(ctx, "ns", "x")
    gone = kube.objects.pop(("Deployment", "ns", "x"))
    assert reconcile.on_child_event(ctx, "DELETED", gone) == "ok"
    assert ("Deployment", "ns", "x") in kube.objects


def test_child_events_of_foreign_or_initial_objects_are_ignored(
    ctx: reconcile.Context, kube: FakeKube
) -> None:
    foreign = {"kind": "Deployment", "metadata": {"namespace": "ns", "name": "y"}}
    assert reconcile.on_child_event(ctx, "MODIFIED", foreign) == "skipped"
    kube.put(parent())
    reconcile.reconcile(ctx, "ns", "x")
    kube.calls.clear()
    child = kube.objects["Deployment", "ns", "x"]
    assert reconcile.on_child_event(ctx, None, child) == "skipped"
    assert kube.calls == []


def test_child_of_a_recreated_parent_is_ignored(ctx: reconcile.Context, kube: FakeKube) -> None:
    kube.put(parent())
    reconcile.reconcile(ctx, "ns", "x")
    child = copy.deepcopy(kube.objects["Deployment", "ns", "x"])
    child["metadata"]["ownerReferences"][0]["uid"] = "old-uid"
    assert reconcile.on_child_event(ctx, "MODIFIED", child) == "skipped"


@pytest.mark.parametrize(
    ("desired", "live", "expected"),
    [
        ({"a": 1}, {"a": 1, "b": 2}, False),
        ({"a": 1}, {"a": "1"}, False),
        ({"a": True}, {"a": "True"}, True),
        ({"a": {"b": [1, 2]}}, {"a": {"b": [1, 2]}}, False),
        ({"a": {"b": [1, 2]}}, {"a": {"b": [1]}}, True),
        ({"a": [{"x": 1}]}, {"a": [{"x": 1, "y": 2}]}, False),
        ({"a": 1}, {}, True),
        ({"a": {"b": 1}}, {"a": "flat"}, True),
    ],
)
def test_drifted(desired: Any, live: Any, expected: bool) -> None:
    assert reconcile.drifted(desired, live) is expected


def test_owns_field_reads_apply_entries_only() -> None:
    live = {
        "metadata": {
            "managedFields": [
                {
                    "manager": "llmop",
                    "operation": "Update",
                    "fieldsV1": {"f:spec": {"f:replicas": {}}},
                },
                {
                    "manager": "llmop",
                    "operation": "Apply",
                    "fieldsV1": {"f:spec": {"f:template": {}}},
                },
            ]
        }
    }
    assert not reconcile.owns_field(live, "llmop", ("spec", "replicas"))
    live["metadata"]["managedFields"][1]["fieldsV1"]["f:spec"]["f:replicas"] = {}
    assert reconcile.owns_field(live, "llmop", ("spec", "replicas"))
    assert not reconcile.owns_field(live, "other", ("spec", "replicas"))


def test_keyed_locks_serialize_one_key_and_clean_up() -> None:
    locks = reconcile.KeyedLocks()
    inside = []
    barrier = threading.Barrier(2)

    def worker() -> None:
        barrier.wait()
        with locks.hold(("ns", "x")):
            inside.append(len(inside))

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert inside == [0, 1]
    assert len(locks) == 0
