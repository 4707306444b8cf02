"""The child plan, table-driven on live objects as the API server returns them (managedFields
included): what is applied, deleted and handed over, in which order, and why."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from llmop import kinds, names
from llmop.api.v1alpha1 import LLMDeployment
from llmop.desired import desired_state
from llmop.kinds import ChildKind
from llmop.observed import child_summary, full_spec
from llmop.plan import Apply, Delete, drifted, owns_field, plan_children
from llmop.settings import RenderSettings

LIVE = Path(__file__).parent / "fixtures" / "live"
SETTINGS = RenderSettings()
PARENT = {
    "apiVersion": "serving.llmop.dev/v1alpha1",
    "kind": "LLMDeployment",
    "metadata": {"name": "flip", "namespace": "team", "uid": "uid-1", "generation": 2},
}
SIMULATOR = {
    "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
    "engine": {"backend": "simulator"},
    "resources": {"gpus": 1, "gpuProduct": "NVIDIA-H100-80GB-HBM3"},
}
FIXED_2 = {**SIMULATOR, "replicas": 2}
AUTOSCALED = {**SIMULATOR, "autoscaling": {"minReplicas": 1, "maxReplicas": 5}}
AUTOSCALED_MIN_2 = {**SIMULATOR, "autoscaling": {"minReplicas": 2, "maxReplicas": 5}}
TOO_BIG = {
    "model": {"name": "meta-llama/Llama-3.1-70B-Instruct"},
    "resources": {"gpus": 1, "gpuProduct": "NVIDIA-H100-80GB-HBM3"},
}


def recorded(name: str) -> dict[str, Any]:
    """A live object recorded from the local API server (see fixtures/live/README.md)."""
    loaded: dict[str, Any] = json.loads((LIVE / f"{name}.json").read_text())
    return loaded


def desired(spec: dict[str, Any]) -> Any:
    llmd = LLMDeployment.model_validate({**PARENT, "spec": spec})
    return desired_state(llmd, SETTINGS)


def describe(step: Apply | Delete) -> tuple[str, str, Any]:
    """(action, kind, replicas in the intent) — the parts of a step the table pins."""
    if isinstance(step, Delete):
        return ("delete", step.kind.kind, None)
    replicas = (step.manifest.get("spec") or {}).get("replicas")
    action = "handover" if step.field_manager == names.HANDOVER_FIELD_MANAGER else "apply"
    return (action, step.kind, replicas)


LIVE_FIXED_2 = "deployment-fixed-2"  # llmop applied replicas: 2 (owns f:spec.f:replicas)
LIVE_HPA_3 = "deployment-hpa-scaled-3"  # the HPA scaled to 3; llmop's intent has no replicas
LIVE_HANDOVER_3 = "deployment-handover-3"  # llmop-handover holds 3, the HPA has not written yet

CASES: dict[str, tuple[dict[str, Any], dict[ChildKind, str], list[tuple[str, str, Any]]]] = {
    "new fixed: apply in registry order, nothing to delete": (
        FIXED_2,
        {},
        [
            ("apply", "Service", None),
            ("apply", "Deployment", 2),
            ("apply", "PodDisruptionBudget", None),
        ],
    ),
    "new autoscaled at min 1: no handover, the default is right": (
        AUTOSCALED,
        {},
        [
            ("apply", "Service", None),
            ("apply", "Deployment", None),
            ("apply", "PodDisruptionBudget", None),
            ("apply", "HorizontalPodAutoscaler", None),
        ],
    ),
    "new autoscaled at min 2: start it at 2 after it exists": (
        AUTOSCALED_MIN_2,
        {},
        [
            ("apply", "Service", None),
            ("apply", "Deployment", None),
            ("apply", "PodDisruptionBudget", None),
            ("apply", "HorizontalPodAutoscaler", None),
            ("handover", "Deployment", 2),
        ],
    ),
    "autoscaling turned on: hand today's 2 over before dropping replicas": (
        AUTOSCALED,
        {kinds.DEPLOYMENT: LIVE_FIXED_2},
        [
            ("handover", "Deployment", 2),
            ("apply", "Service", None),
            ("apply", "Deployment", None),
            ("apply", "PodDisruptionBudget", None),
            ("apply", "HorizontalPodAutoscaler", None),
        ],
    ),
    "HPA owns replicas: no handover, replicas never in the intent": (
        AUTOSCALED,
        {kinds.DEPLOYMENT: LIVE_HPA_3, kinds.HPA: "hpa"},
        [
            ("apply", "Service", None),
            ("apply", "Deployment", None),
            ("apply", "PodDisruptionBudget", None),
            ("apply", "HorizontalPodAutoscaler", None),
        ],
    ),
    "handover manager holds replicas: leave it to the HPA": (
        AUTOSCALED,
        {kinds.DEPLOYMENT: LIVE_HANDOVER_3},
        [
            ("apply", "Service", None),
            ("apply", "Deployment", None),
            ("apply", "PodDisruptionBudget", None),
            ("apply", "HorizontalPodAutoscaler", None),
        ],
    ),
    "autoscaling turned off: delete the HPA first, then take replicas back": (
        {**SIMULATOR, "replicas": 1},
        {kinds.DEPLOYMENT: LIVE_HPA_3, kinds.HPA: "hpa", kinds.PDB: "pdb"},
        [
            ("delete", "PodDisruptionBudget", None),
            ("delete", "HorizontalPodAutoscaler", None),
            ("apply", "Service", None),
            ("apply", "Deployment", 1),
        ],
    ),
    "unwanted children that do not exist are not deleted": (
        {**SIMULATOR, "replicas": 1},
        {kinds.DEPLOYMENT: LIVE_FIXED_2},
        [("apply", "Service", None), ("apply", "Deployment", 1)],
    ),
    "a plan that does not fit does nothing, not even deletes": (
        TOO_BIG,
        {kinds.DEPLOYMENT: LIVE_FIXED_2, kinds.HPA: "hpa"},
        [],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_parent_plan(case: str) -> None:
    spec, live_names, expected = CASES[case]
    live = {kind: recorded(name) for kind, name in live_names.items()}
    plan = plan_children(desired(spec), live, parent=PARENT)
    assert [describe(step) for step in plan.steps()] == expected
    assert len(plan.reasons) == len(expected)
    for step in plan.steps():
        if isinstance(step, Apply) and step.field_manager == names.FIELD_MANAGER:
            (reference,) = step.manifest["metadata"]["ownerReferences"]
            assert (reference["uid"], reference["controller"]) == ("uid-1", True)


def test_handover_intent_holds_replicas_and_nothing_else() -> None:
    plan = plan_children(
        desired(AUTOSCALED), {kinds.DEPLOYMENT: recorded(LIVE_FIXED_2)}, parent=PARENT
    )
    assert plan.handover_first is not None
    assert plan.handover_first.manifest == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "flip", "namespace": "team"},
        "spec": {"replicas": 2},
    }
    intent = next(a for a in plan.applies if a.kind == "Deployment")
    assert "replicas" not in intent.manifest["spec"]
    assert "keep replicas=2" in plan.handover_first.reason


def live_rendered(spec: dict[str, Any], kind: ChildKind) -> dict[str, Any]:
    """What the API server returns after our apply: the intent plus server defaults."""
    plan = plan_children(desired(spec), {}, parent=PARENT)
    manifest = copy.deepcopy(next(a.manifest for a in plan.applies if a.kind == kind.kind))
    manifest["metadata"] |= {"uid": "child-uid", "resourceVersion": "7", "generation": 1}
    manifest["spec"]["sessionAffinity"] = "None"  # a server default: not drift
    return manifest


def test_child_plan_applies_only_a_drifted_or_missing_child() -> None:
    service = live_rendered(FIXED_2, kinds.SERVICE)
    calm = plan_children(
        desired(FIXED_2), {kinds.SERVICE: service}, parent=PARENT, only=kinds.SERVICE
    )
    assert not calm
    service["spec"]["ports"][0]["targetPort"] = 9999
    repair = plan_children(
        desired(FIXED_2), {kinds.SERVICE: service}, parent=PARENT, only=kinds.SERVICE
    )
    assert [describe(s) for s in repair.steps()] == [("apply", "Service", None)]
    assert repair.reasons == ["Service: apply (drifted from its intent)"]
    gone = plan_children(desired(FIXED_2), {}, parent=PARENT, only=kinds.SERVICE)
    assert gone.reasons == ["Service: apply (missing)"]


def test_child_plan_deletes_an_unwanted_child_it_sees() -> None:
    plan = plan_children(
        desired({**SIMULATOR, "replicas": 1}),
        {kinds.HPA: recorded("hpa")},
        parent=PARENT,
        only=kinds.HPA,
    )
    assert [describe(s) for s in plan.steps()] == [("delete", "HorizontalPodAutoscaler", None)]


def test_recreated_autoscaled_deployment_starts_at_min_replicas_again() -> None:
    plan = plan_children(desired(AUTOSCALED_MIN_2), {}, parent=PARENT, only=kinds.DEPLOYMENT)
    assert [describe(s) for s in plan.steps()] == [
        ("apply", "Deployment", None),
        ("handover", "Deployment", 2),
    ]


@pytest.mark.parametrize(
    ("desired_value", "live", "expected"),
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
def test_drifted(desired_value: Any, live: Any, expected: bool) -> None:
    assert drifted(desired_value, live) is expected


@pytest.mark.parametrize(
    ("name", "manager", "owns"),
    [
        (LIVE_FIXED_2, names.FIELD_MANAGER, True),
        (LIVE_HPA_3, names.FIELD_MANAGER, False),
        (LIVE_HANDOVER_3, names.FIELD_MANAGER, False),
        (LIVE_HANDOVER_3, names.HANDOVER_FIELD_MANAGER, True),
    ],
)
def test_owns_field_on_recorded_objects(name: str, manager: str, owns: bool) -> None:
    assert owns_field(recorded(name), manager, ("spec", "replicas")) is owns


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
    assert not owns_field(live, "llmop", ("spec", "replicas"))
    live["metadata"]["managedFields"][1]["fieldsV1"]["f:spec"]["f:replicas"] = {}
    assert owns_field(live, "llmop", ("spec", "replicas"))
    assert not owns_field(live, "other", ("spec", "replicas"))


def test_repair_plan_applies_only_what_is_missing_or_drifted() -> None:
    service = live_rendered(FIXED_2, kinds.SERVICE)
    deployment = live_rendered(FIXED_2, kinds.DEPLOYMENT)
    live = {kinds.SERVICE: service, kinds.DEPLOYMENT: deployment}
    plan = plan_children(desired(FIXED_2), live, parent=PARENT, repair=True)
    assert plan.reasons == ["PodDisruptionBudget: apply (missing)"]
    full = plan_children(desired(FIXED_2), live, parent=PARENT)
    assert [describe(s) for s in full.steps()] == [
        ("apply", "Service", None),
        ("apply", "Deployment", 2),
        ("apply", "PodDisruptionBudget", None),
    ]


def test_a_cached_deployment_is_checked_for_drift_on_its_whole_spec() -> None:
    """The watch cache keeps a Deployment's spec as text (`observed.child_summary`); the drift
    check still sees every field of the pod template, and the handover still reads replicas."""
    deployment = live_rendered(FIXED_2, kinds.DEPLOYMENT)
    cached = child_summary(deployment)
    assert cached["spec"] == {"replicas": 2}
    assert full_spec(cached)["spec"] == deployment["spec"]
    calm = plan_children(
        desired(FIXED_2), {kinds.DEPLOYMENT: cached}, parent=PARENT, only=kinds.DEPLOYMENT
    )
    assert not calm
    deployment["spec"]["template"]["spec"]["containers"][0]["image"] = "someone/else:1"
    repair = plan_children(
        desired(FIXED_2),
        {kinds.DEPLOYMENT: child_summary(deployment)},
        parent=PARENT,
        only=kinds.DEPLOYMENT,
    )
    assert repair.reasons == ["Deployment: apply (drifted from its intent)"]
    handover = plan_children(
        desired(AUTOSCALED),
        {kinds.DEPLOYMENT: child_summary(recorded(LIVE_FIXED_2))},
        parent=PARENT,
    )
    assert handover.handover_first is not None
    assert handover.handover_first.manifest["spec"] == {"replicas": 2}
