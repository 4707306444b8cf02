"""Rollouts with spec.rollout.maxSurge unset, on the kwok cluster's GPU nodes and the operator
running under its own RBAC: a full node rolls one pod at a time instead of waiting forever for a
surge pod that cannot be scheduled, and a node with room starts as many new pods as fit."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from llmop import names
from support.cluster import wait_until
from support.manifests import simulator_spec

if TYPE_CHECKING:
    from support.operator import Kit, OperatorProcess

pytestmark = pytest.mark.cluster

# gpu-l4-0 (e2e/cluster/gpu-nodes.yaml) is the only L4 node, with 4 GPUs, and no other test
# places pods on it: what fits there is known exactly.
L4 = "NVIDIA-L4"
L4_NODE = "gpu-l4-0"


def _spec(replicas: int, gpus: int, max_num_seqs: int) -> dict[str, Any]:
    return simulator_spec(
        replicas=replicas,
        resources={"gpus": gpus, "gpuProduct": L4},
        engine={"backend": "simulator", "maxNumSeqs": max_num_seqs},
    )


def _roll(kit: Kit, namespace: str, name: str, replicas: int, gpus: int) -> dict[str, Any]:
    """Create, wait for Ready, change the pod template, wait until the rollout finished;
    returns the Deployment as the rollout left it."""
    # An earlier test's namespace may still be going away: start from an empty node.
    wait_until(
        lambda: (
            not kit.kube.list(
                "v1", "Pod", field_selector=f"spec.nodeName={L4_NODE},status.phase=Running"
            )
        ),
        timeout=60,
        interval=0.5,
        what=f"no pods left on {L4_NODE}",
    )
    kit.apply_llmd(namespace, name, _spec(replicas, gpus, 4))
    kit.wait_condition(namespace, name, "Ready", "True", timeout=60)
    first = kit.deployment(namespace, name)
    assert first is not None
    # Nothing rolls on a create: nothing was counted.
    digest = first["metadata"]["annotations"][names.ANNOTATION_TEMPLATE_HASH]
    assert first["metadata"]["annotations"][names.ANNOTATION_ROLLOUT_ROOM] == f"{digest}/-"

    kit.apply_llmd(namespace, name, _spec(replicas, gpus, 8))

    def rolled() -> dict[str, Any] | None:
        deployment = kit.deployment(namespace, name)
        if deployment is None:
            return None
        status = deployment.get("status") or {}
        new_template = deployment["metadata"]["annotations"][names.ANNOTATION_TEMPLATE_HASH]
        done = (
            new_template != digest
            and status.get("observedGeneration") == deployment["metadata"]["generation"]
            and status.get("updatedReplicas") == replicas
            and status.get("replicas") == replicas
            and status.get("availableReplicas") == replicas
        )
        return deployment if done else None

    deployment = wait_until(rolled, timeout=60, interval=0.5, what=f"{name} rolled out")
    kit.wait_condition(namespace, name, "Ready", "True", timeout=30)
    return deployment


def _strategy_events(kit: Kit, namespace: str, name: str) -> list[str]:
    return [
        e.get("message") or ""
        for e in kit.kube.list("v1", "Event", namespace)
        if e.get("reason") == "RolloutStrategy" and e["involvedObject"]["name"] == name
    ]


def test_a_full_node_replaces_one_pod_at_a_time(
    operator: OperatorProcess, kit: Kit, namespace: str
) -> None:
    # 2 replicas x 2 GPUs fill the 4-GPU node: a surge pod could never be scheduled, and with
    # a fixed maxSurge 1 / maxUnavailable 0 this rollout would wait for its progress deadline.
    deployment = _roll(kit, namespace, "full", replicas=2, gpus=2)
    rolling = deployment["spec"]["strategy"]["rollingUpdate"]
    assert (rolling["maxSurge"], rolling["maxUnavailable"]) == (0, 1)
    digest = deployment["metadata"]["annotations"][names.ANNOTATION_TEMPLATE_HASH]
    assert deployment["metadata"]["annotations"][names.ANNOTATION_ROLLOUT_ROOM] == f"{digest}/0"
    (message,) = _strategy_events(kit, namespace, "full")
    assert message.startswith("0 more engine pod(s) fit"), message
    assert "maxUnavailable 1" in message


def test_a_node_with_room_starts_every_new_pod_at_once(
    operator: OperatorProcess, kit: Kit, namespace: str
) -> None:
    # 2 replicas x 1 GPU leave 2 of the 4 GPUs free: both new pods start at once.
    deployment = _roll(kit, namespace, "room", replicas=2, gpus=1)
    rolling = deployment["spec"]["strategy"]["rollingUpdate"]
    assert (rolling["maxSurge"], rolling["maxUnavailable"]) == (2, 0)
    digest = deployment["metadata"]["annotations"][names.ANNOTATION_TEMPLATE_HASH]
    assert deployment["metadata"]["annotations"][names.ANNOTATION_ROLLOUT_ROOM] == f"{digest}/2"
    (message,) = _strategy_events(kit, namespace, "room")
    assert message.startswith("2 more engine pod(s) fit"), message
    # The stored count survives the operator's later passes (the child path's repairs
    # included): the strategy is still the counted one once every pod settled.
    again = kit.deployment(namespace, "room")
    assert again is not None
    assert again["spec"]["strategy"]["rollingUpdate"] == rolling


def test_a_surge_the_user_sets_is_used_as_is(
    operator: OperatorProcess, kit: Kit, namespace: str
) -> None:
    spec = _spec(1, 1, 4) | {"rollout": {"maxSurge": 0, "maxUnavailable": 1}}
    kit.apply_llmd(namespace, "fixed", spec)
    kit.wait_condition(namespace, "fixed", "Ready", "True", timeout=60)
    deployment = kit.deployment(namespace, "fixed")
    assert deployment is not None
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert names.ANNOTATION_ROLLOUT_ROOM not in deployment["metadata"]["annotations"]
