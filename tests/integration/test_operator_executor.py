"""The child plan's executor against the real API server: what server-side apply does to
`spec.replicas` is the API server's business, so the replica handover is proven here, not with a
fake. A control case runs the same switch with the handover step removed and shows the count
collapse to 1 — so this test would catch a broken handover."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import pytest

from llmop import kinds, names
from llmop.api.v1alpha1 import LLMDeployment
from llmop.config import OperatorConfig
from llmop.desired import desired_state
from llmop.metrics import Metrics
from llmop.plan import ChildPlan, plan_children
from llmop.reconcile import Context
from llmop.reconcile.writes import execute
from llmop.settings import RenderSettings
from support.manifests import llmd_manifest, simulator_spec

if TYPE_CHECKING:
    from conftest import Kit

pytestmark = pytest.mark.cluster

AUTOSCALING = {"minReplicas": 1, "maxReplicas": 5}


def _context(kit: Kit) -> Context:
    return Context(kube=kit.kube, config=OperatorConfig(), metrics=Metrics(), instance="test")


def _parent(kit: Kit, namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A real LLMDeployment (no operator runs here), so the owner reference is valid."""
    return kit.kube.apply(llmd_manifest(namespace, name, spec), field_manager="llmop-tests")


def _plan(kit: Kit, parent: dict[str, Any]) -> ChildPlan:
    namespace, name = parent["metadata"]["namespace"], parent["metadata"]["name"]
    live = {kind: kit.get(kind.api_version, kind.kind, namespace, name) for kind in kinds.WATCHED}
    desired = desired_state(LLMDeployment.model_validate(parent), RenderSettings())
    return plan_children(desired, live, parent=parent)


def _replicas(kit: Kit, namespace: str, name: str) -> tuple[int, set[str]]:
    deployment = kit.deployment(namespace, name)
    assert deployment is not None
    owners = {
        entry["manager"]
        for entry in deployment["metadata"]["managedFields"]
        if "f:replicas" in (entry.get("fieldsV1") or {}).get("f:spec", {})
    }
    return deployment["spec"]["replicas"], owners


@pytest.mark.parametrize("with_handover", [True, False], ids=["handover", "control"])
def test_turning_autoscaling_on_keeps_the_running_count(
    kit: Kit, namespace: str, with_handover: bool
) -> None:
    ctx = _context(kit)
    fixed = _parent(kit, namespace, "flip", simulator_spec(replicas=3))
    execute(ctx, _plan(kit, fixed))
    assert _replicas(kit, namespace, "flip") == (3, {names.FIELD_MANAGER})

    auto = _parent(kit, namespace, "flip", simulator_spec(autoscaling=AUTOSCALING))
    plan = _plan(kit, auto)
    assert plan.handover_first is not None
    if not with_handover:
        plan = dataclasses.replace(plan, handover_first=None)
    execute(ctx, plan)

    count, owners = _replicas(kit, namespace, "flip")
    if with_handover:
        assert (count, owners) == (3, {names.HANDOVER_FIELD_MANAGER})
    else:
        # What real server-side apply does when our manager drops a field it owned.
        assert count == 1
    assert kit.get(kinds.HPA.api_version, kinds.HPA.kind, namespace, "flip") is not None


def test_new_autoscaled_deployment_starts_at_min_replicas(kit: Kit, namespace: str) -> None:
    ctx = _context(kit)
    auto = {"minReplicas": 2, "maxReplicas": 5}
    parent = _parent(kit, namespace, "boot", simulator_spec(autoscaling=auto))
    execute(ctx, _plan(kit, parent))
    assert _replicas(kit, namespace, "boot") == (2, {names.HANDOVER_FIELD_MANAGER})
    # Planning again against the live object: nothing more to hand over.
    again = _plan(kit, parent)
    assert again.handover_first is None
    assert again.handover_last is None


def test_turning_autoscaling_off_deletes_the_hpa_and_takes_replicas_back(
    kit: Kit, namespace: str
) -> None:
    ctx = _context(kit)
    parent = _parent(kit, namespace, "back", simulator_spec(autoscaling=AUTOSCALING))
    execute(ctx, _plan(kit, parent))
    kit.cluster.kubectl("scale", "deployment/back", "-n", namespace, "--replicas=4")
    fixed = _parent(kit, namespace, "back", simulator_spec(replicas=2))
    plan = _plan(kit, fixed)
    # Two replicas still want a PDB; only the HPA goes, before replicas are taken back.
    assert [step.kind for step in plan.deletes] == [kinds.HPA]
    execute(ctx, plan)
    assert kit.get(kinds.HPA.api_version, kinds.HPA.kind, namespace, "back") is None
    count, owners = _replicas(kit, namespace, "back")
    assert count == 2
    assert names.FIELD_MANAGER in owners
