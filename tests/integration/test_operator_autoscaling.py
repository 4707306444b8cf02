"""HPA coexistence: with autoscaling on the operator never sets Deployment replicas; turning it on
keeps the running count; turning it off applies the CR's replicas and removes the HPA."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from support.cluster import wait_until
from support.manifests import simulator_spec as spec

if TYPE_CHECKING:
    from support.operator import Kit, OperatorProcess

pytestmark = pytest.mark.cluster

HPA = ("autoscaling/v2", "HorizontalPodAutoscaler")


def replicas(kit: Kit, namespace: str, name: str) -> int:
    deployment = kit.deployment(namespace, name)
    assert deployment is not None
    count: int = deployment["spec"]["replicas"]
    return count


def managers_of_replicas(kit: Kit, namespace: str, name: str) -> set[str]:
    deployment = kit.deployment(namespace, name)
    assert deployment is not None
    return {
        entry["manager"]
        for entry in deployment["metadata"]["managedFields"]
        if "f:replicas" in (entry.get("fieldsV1") or {}).get("f:spec", {})
    }


def test_hpa_scaled_replicas_survive_reconciles(
    operator: OperatorProcess, kit: Kit, namespace: str
) -> None:
    auto = {"minReplicas": 1, "maxReplicas": 5}
    kit.apply_llmd(namespace, "auto", spec(autoscaling=auto))
    kit.wait_condition(namespace, "auto", "Ready", "True", timeout=60)
    hpa = kit.get(*HPA, namespace, "auto")
    assert hpa is not None
    assert hpa["spec"]["scaleTargetRef"]["name"] == "auto"
    assert "llmop" not in managers_of_replicas(kit, namespace, "auto")

    # What the HPA controller does: write the scale subresource.
    kit.cluster.kubectl("scale", "deployment/auto", "-n", namespace, "--replicas=3")
    # A spec change makes the operator reconcile (and re-apply the Deployment).
    kit.apply_llmd(
        namespace,
        "auto",
        spec(autoscaling=auto, service={"annotations": {"example.com/touch": "1"}}),
    )
    ready = kit.wait_condition(namespace, "auto", "Ready", "True", timeout=60)
    assert ready["status"]["replicaSummary"] == "3/3"
    time.sleep(2)
    assert replicas(kit, namespace, "auto") == 3


def test_autoscaling_on_keeps_count_and_off_applies_spec(
    operator: OperatorProcess, kit: Kit, namespace: str
) -> None:
    kit.apply_llmd(namespace, "flip", spec(replicas=2))
    kit.wait_condition(namespace, "flip", "Ready", "True", timeout=60)
    assert "llmop" in managers_of_replicas(kit, namespace, "flip")

    # On: the HPA appears, the running count stays 2 (not reset to the default of 1).
    kit.apply_llmd(namespace, "flip", spec(autoscaling={"minReplicas": 1, "maxReplicas": 4}))
    wait_until(
        lambda: kit.get(*HPA, namespace, "flip"), timeout=30, interval=0.3, what="HPA created"
    )
    kit.wait_condition(namespace, "flip", "Ready", "True", timeout=30)
    time.sleep(2)
    assert replicas(kit, namespace, "flip") == 2
    assert "llmop" not in managers_of_replicas(kit, namespace, "flip")

    # Off: the HPA goes, the CR's replicas are applied.
    kit.apply_llmd(namespace, "flip", spec(replicas=1))
    wait_until(
        lambda: kit.get(*HPA, namespace, "flip") is None,
        timeout=30,
        interval=0.3,
        what="HPA deleted",
    )
    wait_until(
        lambda: replicas(kit, namespace, "flip") == 1,
        timeout=30,
        interval=0.3,
        what="replicas 1",
    )
    ready = kit.wait_condition(namespace, "flip", "Ready", "True", timeout=60)
    assert ready["status"]["replicaSummary"] == "1/1"
    assert "llmop" in managers_of_replicas(kit, namespace, "flip")
    # One replica: no PDB either.
    assert kit.get("policy/v1", "PodDisruptionBudget", namespace, "flip") is None


def test_new_autoscaled_deployment_starts_at_min_replicas(
    operator: OperatorProcess, kit: Kit, namespace: str
) -> None:
    kit.apply_llmd(namespace, "minrep", spec(autoscaling={"minReplicas": 2, "maxReplicas": 3}))
    ready = kit.wait_condition(namespace, "minrep", "Ready", "True", timeout=60)
    assert ready["status"]["replicaSummary"] == "2/2"
    assert replicas(kit, namespace, "minrep") == 2


def test_hpa_without_a_metrics_api_is_named_in_the_status(
    operator: OperatorProcess, kit: Kit, namespace: str
) -> None:
    """This cluster serves no custom metrics API: the HPA cannot read the queue depth, and the
    CR says so in its own words (Degraded), rather than silently never scaling; Ready stays
    honest. With autoscaling off again (no HPA) it clears."""
    auto = {"minReplicas": 1, "maxReplicas": 3}
    kit.apply_llmd(namespace, "blind", spec(autoscaling=auto))
    obj = kit.wait_condition(namespace, "blind", "Degraded", "True", timeout=90)
    degraded = {c["type"]: c for c in obj["status"]["conditions"]}["Degraded"]
    assert degraded["reason"] == "AutoscalerInactive", degraded
    assert "ScalingActive=False" in degraded["message"], degraded
    assert "llmop_engine_queue_depth" in degraded["message"], degraded  # the HPA's own words
    kit.wait_condition(namespace, "blind", "Ready", "True", timeout=60)

    kit.apply_llmd(namespace, "blind", spec(replicas=1))
    cleared = kit.wait_condition(namespace, "blind", "Degraded", "False", timeout=60)
    assert kit.get(*HPA, namespace, "blind") is None
    assert {c["type"]: c for c in cleared["status"]["conditions"]}["Ready"]["status"] == "True"
