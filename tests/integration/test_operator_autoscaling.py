"""HPA coexistence: with autoscaling on the operator never sets Deployment replicas; turning it on
keeps the running count; turning it off applies the CR's replicas and removes the HPA."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

import pytest

from support.cluster import wait_until
from support.manifests import simulator_spec as spec
from support.operator import conditions

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


def _hpas_denied(kit: Kit, namespace: str) -> bool:
    """Whether the API server denies an HPA in `namespace` now (a server-side dry run)."""
    probe = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "probe", "namespace": namespace},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "probe"},
            "maxReplicas": 2,
        },
    }
    out = kit.cluster.kubectl(
        "create", "--dry-run=server", "-f", "-", input=json.dumps(probe), check=False
    )
    return out.returncode != 0 and "not allowed here" in out.stderr


def _deny_hpas(kit: Kit, namespace: str) -> str:
    """A ValidatingAdmissionPolicy (and binding) that denies every HPA in `namespace`; returns
    its name, once the API server enforces it."""
    name = f"deny-hpa-{namespace}"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["autoscaling"],
                        "apiVersions": ["*"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["horizontalpodautoscalers"],
                    }
                ]
            },
            "validations": [{"expression": "false", "message": "HPAs are not allowed here"}],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
            },
        },
    }
    kit.cluster.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps({"kind": "List", "apiVersion": "v1", "items": [policy, binding]}),
    )
    wait_until(
        lambda: _hpas_denied(kit, namespace), timeout=30, interval=0.5, what="the policy enforced"
    )
    return name


def test_a_denied_hpa_stays_stalled(operator: OperatorProcess, kit: Kit, namespace: str) -> None:
    """The Stalled an admission policy causes is not erased by the Deployment and pod events
    that follow (they used to write "Recovered" within a second, leaving Ready with no HPA)."""
    policy = _deny_hpas(kit, namespace)
    try:
        auto = {"minReplicas": 1, "maxReplicas": 3}
        kit.apply_llmd(namespace, "denied", spec(autoscaling=auto))
        kit.wait_condition(namespace, "denied", "Stalled", "True", timeout=60)
        # The engine pod comes up on kwok meanwhile: Deployment and pod events keep coming.
        wait_until(
            lambda: (
                (kit.deployment(namespace, "denied") or {}).get("status", {}).get("readyReplicas")
            ),
            timeout=60,
            what="the engine pod ready",
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            obj = kit.get_llmd(namespace, "denied")
            found = conditions(obj)
            assert found["Stalled"]["status"] == "True", found["Stalled"]
            assert found["Stalled"]["reason"] == "ChildRejected"
            assert "not allowed here" in found["Stalled"]["message"]
            time.sleep(0.5)
        assert kit.get(*HPA, namespace, "denied") is None
        reasons = {
            e["reason"]
            for e in kit.kube.list("v1", "Event", namespace)
            if e["involvedObject"].get("name") == "denied"
        }
        assert "ChildRejected" in reasons
        assert "Recovered" not in reasons
    finally:
        kit.cluster.kubectl(
            "delete",
            "validatingadmissionpolicybinding,validatingadmissionpolicy",
            policy,
            "--ignore-not-found",
            check=False,
        )
    wait_until(
        lambda: not _hpas_denied(kit, namespace), timeout=30, interval=0.5, what="the policy gone"
    )
    # The policy is gone; the next generation's parent pass creates the HPA and clears it.
    kit.apply_llmd(
        namespace, "denied", spec(autoscaling=auto, service={"annotations": {"touch": "1"}})
    )
    kit.wait_condition(namespace, "denied", "Stalled", "False", timeout=60)
    assert kit.get(*HPA, namespace, "denied") is not None
