"""No takeovers, against the real API server: a child the watch cache does not show is created
with a create-only server-side apply (`Kube.apply(new=True)`: one request, as before), so an
object that already has the child's name is never taken. Someone else's is left untouched and
the CR is Stalled `ChildNameConflict` naming it; once it is deleted the CR converges. A child
the CR owns but the cache does not show (a lagging cache, a fresh process) is applied as usual.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from llmop.api.v1alpha1 import LLMDeployment
from llmop.config import OperatorConfig
from llmop.desired import desired_state
from llmop.kube import ExistsError
from llmop.metrics import Metrics
from llmop.plan import plan_children
from llmop.reconcile import Context
from llmop.reconcile.writes import execute
from llmop.settings import RenderSettings
from support.cluster import wait_until
from support.manifests import simulator_spec

if TYPE_CHECKING:
    from support.operator import Kit, OperatorProcess

pytestmark = pytest.mark.cluster

AUTOSCALING = {"minReplicas": 1, "maxReplicas": 2}


def _conds(obj: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in ((obj or {}).get("status") or {}).get("conditions") or []}


def _foreign_service(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "chat", "namespace": namespace, "labels": {"app": "shop"}},
        "spec": {"ports": [{"port": 443, "targetPort": 8443}], "selector": {"app": "shop"}},
    }


def _foreign_hpa(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "chat", "namespace": namespace},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "shop"},
            "minReplicas": 1,
            "maxReplicas": 7,
        },
    }


def _same(kit: Kit, before: dict[str, Any]) -> None:
    """`before` (as created) is still there, untouched: same resourceVersion, same spec."""
    metadata = before["metadata"]
    now = kit.get(before["apiVersion"], before["kind"], metadata["namespace"], metadata["name"])
    assert now is not None
    assert now["metadata"]["resourceVersion"] == metadata["resourceVersion"]
    assert now["spec"] == before["spec"]
    assert not now["metadata"].get("ownerReferences")


def test_a_create_only_apply_creates_once_and_an_owned_child_is_still_applied(
    kit: Kit, namespace: str
) -> None:
    """The executor alone (no operator runs yet): every child created new, then a new
    generation planned as a fresh process with empty caches would — each create finds the
    child, reads it, sees it is this CR's and applies it."""
    ctx = Context(kube=kit.kube, config=OperatorConfig(), metrics=Metrics(), instance="test")
    parent = kit.apply_llmd(namespace, "mine", simulator_spec(replicas=1))
    desired = desired_state(LLMDeployment.model_validate(parent), RenderSettings())
    plan = plan_children(desired, {}, parent=parent)
    assert all(a.new for a in plan.applies if a.kind in ("Service", "Deployment"))
    execute(ctx, plan)
    with pytest.raises(ExistsError):  # the real API server's answer to a second create
        kit.kube.apply(plan.applies[0].manifest, field_manager="llmop", new=True)
    deployment = kit.deployment(namespace, "mine")
    assert deployment is not None
    # The Deployment controller's status writes are its own entry (subresource "status"): only
    # the object's own writers count here.
    writers = [e for e in deployment["metadata"]["managedFields"] if not e.get("subresource")]
    assert [e["operation"] for e in writers] == ["Apply"]
    parent = kit.apply_llmd(namespace, "mine", simulator_spec(replicas=3))
    desired = desired_state(LLMDeployment.model_validate(parent), RenderSettings())
    execute(ctx, plan_children(desired, {}, parent=parent))
    deployment = kit.deployment(namespace, "mine")
    assert deployment is not None
    assert deployment["spec"]["replicas"] == 3


def _stalled_on(kit: Kit, namespace: str, kind: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        obj = kit.get_llmd(namespace, "chat")
        stalled = _conds(obj).get("Stalled") or {}
        if stalled.get("reason") == "ChildNameConflict" and stalled["message"].startswith(kind):
            return stalled
        return None

    found: dict[str, Any] = wait_until(probe, timeout=30, interval=0.3, what=f"{kind} conflict")
    return found


def test_an_object_named_like_a_child_is_left_untouched_until_it_goes(
    operator: OperatorProcess, kit: Kit, namespace: str
) -> None:
    service = kit.kube.create(_foreign_service(namespace))
    hpa = kit.kube.create(_foreign_hpa(namespace))
    kit.apply_llmd(namespace, "chat", simulator_spec(autoscaling=AUTOSCALING))

    stalled = _stalled_on(kit, namespace, "Service")
    assert stalled["status"] == "True"
    assert f"Service {namespace}/chat already exists" in stalled["message"]
    assert "(no owner)" in stalled["message"]
    assert "delete or rename that Service" in stalled["message"]
    _same(kit, service)
    assert kit.deployment(namespace, "chat") is None  # nothing after the conflict is applied

    # The Service goes: the periodic retry creates ours, and meets the HPA next.
    kit.kube.delete("v1", "Service", namespace, "chat")
    stalled = _stalled_on(kit, namespace, "HorizontalPodAutoscaler")
    assert f"HorizontalPodAutoscaler {namespace}/chat" in stalled["message"]
    _same(kit, hpa)
    uid = kit.get_llmd(namespace, "chat")["metadata"]["uid"]  # type: ignore[index]
    ours = kit.get("v1", "Service", namespace, "chat")
    assert ours is not None
    assert ours["metadata"]["ownerReferences"][0]["uid"] == uid

    kit.kube.delete("autoscaling/v2", "HorizontalPodAutoscaler", namespace, "chat")
    ready = kit.wait_condition(namespace, "chat", "Ready", "True", timeout=40)
    assert _conds(ready)["Stalled"]["status"] == "False"
    hpa_now = kit.get("autoscaling/v2", "HorizontalPodAutoscaler", namespace, "chat")
    assert hpa_now is not None
    assert hpa_now["metadata"]["ownerReferences"][0]["uid"] == uid
    assert hpa_now["spec"]["maxReplicas"] == AUTOSCALING["maxReplicas"]
