"""The rollout strategy of a Deployment whose maxSurge the user left unset: the room counted on
the nodes the engine pods can run on, and how every path renders it."""

from __future__ import annotations

from typing import Any

import pytest

from llmop import names, rollout_room
from llmop.api.v1alpha1 import LLMDeployment
from llmop.desired import DesiredState, desired_state
from llmop.settings import RenderSettings

PARENT = {
    "apiVersion": "serving.llmop.dev/v1alpha1",
    "kind": "LLMDeployment",
    "metadata": {"name": "roll", "namespace": "team", "uid": "uid-1", "generation": 1},
}
SPEC: dict[str, Any] = {
    "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
    "engine": {"backend": "simulator"},
    "resources": {"gpus": 1, "gpuProduct": "NVIDIA-H100-80GB-HBM3"},
    "replicas": 3,
}
GPU = "nvidia.com/gpu"
PRODUCT = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


def desired(**spec: Any) -> DesiredState:
    llmd = LLMDeployment.model_validate({**PARENT, "spec": {**SPEC, **spec}})
    return desired_state(llmd, RenderSettings())


def node(
    name: str,
    gpus: int,
    *,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    unschedulable: bool = False,
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": PRODUCT if labels is None else labels},
        "spec": {"taints": taints or [], "unschedulable": unschedulable},
        "status": {"allocatable": {GPU: str(gpus), "cpu": "32", "memory": "256Gi", "pods": "110"}},
    }


def pod(
    on: str, gpus: int = 1, *, phase: str = "Running", terminating: bool = False
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": f"p-{on}"}
    if terminating:
        metadata["deletionTimestamp"] = "2026-11-28T00:00:00Z"
    return {
        "metadata": metadata,
        "spec": {"nodeName": on, "containers": [{"resources": {"limits": {GPU: str(gpus)}}}]},
        "status": {"phase": phase},
    }


def engine_pod_spec() -> dict[str, Any]:
    deployment = desired().children.deployment  # type: ignore[union-attr]
    return dict(rollout_room.pod_spec_of(deployment))  # type: ignore[arg-type]


def test_requests_take_limits_for_unset_requests_the_largest_init_container_and_overhead() -> None:
    spec = {
        "containers": [
            {"resources": {"limits": {GPU: "2", "cpu": "4"}, "requests": {"cpu": "500m"}}},
            {"resources": {"requests": {"memory": "1Gi"}}},
        ],
        "initContainers": [{"resources": {"requests": {"memory": "3Gi", "cpu": "250m"}}}],
        "overhead": {"memory": "1Gi"},
    }
    assert rollout_room.pod_requests(spec) == {
        GPU: 2.0,
        "cpu": 0.5,
        "memory": 4 * 1024**3,
        "pods": 1.0,
    }


@pytest.mark.parametrize(
    ("the_node", "fits"),
    [
        (node("a", 4), True),
        (node("cordoned", 4, unschedulable=True), False),
        (node("other-gpu", 4, labels={"nvidia.com/gpu.product": "NVIDIA-L4"}), False),
        (node("gpu-taint", 4, taints=[{"key": GPU, "effect": "NoSchedule"}]), True),
        (
            node("team-taint", 4, taints=[{"key": "team", "value": "x", "effect": "NoSchedule"}]),
            False,
        ),
        (node("soft-taint", 4, taints=[{"key": "team", "effect": "PreferNoSchedule"}]), True),
    ],
    ids=lambda v: v["metadata"]["name"] if isinstance(v, dict) else str(v),
)
def test_a_node_matches_as_the_scheduler_would(the_node: dict[str, Any], fits: bool) -> None:
    assert rollout_room.node_matches(engine_pod_spec(), the_node) is fits


def test_required_node_affinity_any_term_with_every_expression() -> None:
    spec = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
                        {
                            "matchExpressions": [
                                {"key": "zone", "operator": "NotIn", "values": ["b"]},
                                {"key": "big", "operator": "Exists"},
                            ]
                        },
                    ]
                }
            }
        }
    }
    assert rollout_room.node_matches(spec, node("x", 1, labels={"zone": "b"}))
    assert rollout_room.node_matches(spec, node("x", 1, labels={"zone": "a", "big": ""}))
    assert not rollout_room.node_matches(spec, node("x", 1, labels={"zone": "a"}))


def test_room_is_what_each_matching_node_has_left_terminating_pods_included() -> None:
    nodes = [node("a", 4), node("b", 8), node("l4", 8, labels={"nvidia.com/gpu.product": "L4"})]
    pods = [
        *(pod("a") for _ in range(3)),
        pod("b", 4),
        pod("b", 2, terminating=True),  # still holds its GPUs until it is gone
        pod("b", 2, phase="Succeeded"),  # holds nothing
        pod("l4", 0),
    ]
    # a: 4 - 3 = 1; b: 8 - 4 - 2 = 2; l4 does not match the GPU product.
    assert rollout_room.room(engine_pod_spec(), nodes, pods) == 3


def test_a_full_pool_counts_zero_and_a_pool_that_can_never_hold_one_none() -> None:
    """0: full now, but the Deployment's own old pods free what a new one needs (replace one
    at a time). None: no matching node could hold one even then (the old pods keep serving)."""
    nodes = [node("a", 2), node("l4", 8, labels={"nvidia.com/gpu.product": "L4"})]
    ours = [pod("a"), pod("a")]
    for p in ours:
        p["metadata"] = {"namespace": "ns", "labels": {names.LABEL_DEPLOYMENT: "x"}}

    def own(p: dict[str, Any]) -> bool:
        return (p.get("metadata") or {}).get("labels", {}).get(names.LABEL_DEPLOYMENT) == "x"

    spec = engine_pod_spec()
    assert rollout_room.room_for_rollout(spec, nodes, ours, own) == 0
    assert rollout_room.room_for_rollout(spec, nodes, [*ours, pod("l4")], own) == 0
    others = [pod("a"), pod("a")]
    assert rollout_room.room_for_rollout(spec, nodes, others, own) is None
    spec["nodeSelector"] = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    assert rollout_room.room_for_rollout(spec, nodes, ours, own) is None
    assert rollout_room.room_for_rollout(engine_pod_spec(), [node("b", 4)], [], own) == 4


def test_a_pod_needs_all_its_gpus_on_one_node() -> None:
    spec = engine_pod_spec()
    spec["containers"] = [{"resources": {"limits": {GPU: "2"}}}]
    assert rollout_room.room(spec, [node("a", 1), node("b", 1)], []) == 0
    assert rollout_room.room(spec, [node("a", 5)], []) == 2


def test_a_pod_without_gpus_is_bounded_by_cpu_memory_and_the_pod_count() -> None:
    spec = {"containers": [{"resources": {"requests": {"cpu": "10", "memory": "1Gi"}}}]}
    assert rollout_room.room(spec, [node("a", 0)], []) == 3  # 32 CPUs / 10
    tiny = {"containers": [{}]}
    assert rollout_room.room(tiny, [node("a", 0)], []) == 110


@pytest.mark.parametrize(
    ("replicas", "max_unavailable", "measured", "surge", "unavailable"),
    [
        (3, 0, None, 1, 0),  # not counted (a new Deployment): the default
        (3, 0, 0, 0, 1),  # a full pool: one pod at a time instead of waiting forever
        (3, 2, 0, 0, 2),
        (3, 0, 1, 1, 0),
        (3, 0, 2, 2, 0),
        (3, 0, 40, 3, 0),  # at most a second full copy
        (0, 0, 5, 1, 0),
    ],
)
def test_the_strategy_from_the_room(
    replicas: int, max_unavailable: int, measured: int | None, surge: int, unavailable: int
) -> None:
    strategy = rollout_room.decide(replicas, max_unavailable, measured)
    assert (strategy.max_surge, strategy.max_unavailable) == (surge, unavailable)


def _rolling(state: DesiredState) -> tuple[Any, Any]:
    deployment = state.children.deployment  # type: ignore[union-attr]
    rolling = deployment["spec"]["strategy"]["rollingUpdate"]  # type: ignore[index]
    annotation = deployment["metadata"]["annotations"].get(names.ANNOTATION_ROLLOUT_ROOM)  # type: ignore[index]
    return (rolling["maxSurge"], rolling["maxUnavailable"]), annotation


def _live(state: DesiredState) -> dict[str, Any]:
    """The Deployment as the API server would hold it after `state` was applied."""
    deployment = state.children.deployment  # type: ignore[union-attr]
    return {**deployment, "spec": {**deployment["spec"], "replicas": 3}}  # type: ignore[index]


def test_every_path_renders_the_count_of_the_rollout_that_started_this_template() -> None:
    first = desired()
    digest = first.template_hash
    # A new Deployment: nothing rolls, nothing is counted.
    assert not rollout_room.needs_measuring(first, None)
    created = rollout_room.with_strategy(first, None)
    assert _rolling(created) == ((1, 0), f"{digest}/-")
    # The same template again (the child path, a repair): nothing to count, the same strategy.
    assert not rollout_room.needs_measuring(first, _live(created))
    assert _rolling(rollout_room.with_strategy(first, _live(created))) == ((1, 0), f"{digest}/-")

    # A new template starts a rollout: count once, and every later pass renders that count.
    second = desired(engine={"backend": "simulator", "maxNumSeqs": 8})
    assert second.template_hash != digest
    assert rollout_room.needs_measuring(second, _live(created))
    counted = rollout_room.with_strategy(second, _live(created), 0)
    assert _rolling(counted) == ((0, 1), f"{second.template_hash}/0")
    assert not rollout_room.needs_measuring(second, _live(counted))
    assert _rolling(rollout_room.with_strategy(second, _live(counted))) == (
        (0, 1),
        f"{second.template_hash}/0",
    )
    # A changed maxUnavailable applies at once with the stored count.
    more = desired(engine={"backend": "simulator", "maxNumSeqs": 8}, rollout={"maxUnavailable": 2})
    assert more.template_hash == second.template_hash
    assert _rolling(rollout_room.with_strategy(more, _live(counted)))[0] == (0, 2)


def test_a_surge_the_user_set_is_left_alone() -> None:
    fixed = desired(rollout={"maxSurge": 2})
    assert rollout_room.decided_deployment(fixed) is None
    assert rollout_room.with_strategy(fixed, None, 0) is fixed
    deployment = fixed.children.deployment  # type: ignore[union-attr]
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 2  # type: ignore[index]
    assert names.ANNOTATION_ROLLOUT_ROOM not in deployment["metadata"]["annotations"]  # type: ignore[index]
