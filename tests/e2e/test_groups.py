"""Multi-node replicas on the real node (issue 23): `spec.engine.pipelineParallelSize: 2` as
LeaderWorkerSet groups of real pods, the simulator in vLLM's `--nnodes` roles under the agent.

Each group is a leader pod (agent + rank 0, behind the Service) and a worker pod (agent + a
headless rank that joins the leader at `$(LWS_LEADER_ADDRESS)`, resolved by the node's cluster
DNS), one GPU each of the node's four. What is proven, on a real kubelet and kube-proxy with the
real LWS controller:

- a group becomes Ready, and serves through the Service's ClusterIP;
- a worker pod deleted takes its group out of service (the CR's Ready goes off), LeaderWorkerSet
  recreates the whole group, and it serves again;
- a rolling update of two groups (one at a time, no surge) under streaming load loses nothing:
  the other group serves while one drains, a draining leader's worker outlives its drain, and
  no container restarts (the old workers wait for their deletion after their leader went).

The seconds are printed: time to group Ready, to out of service, to serving again, the rollout.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from support.cluster import wait_until
from support.realnode import (
    LWS_NAME_LABEL,
    BackgroundLoad,
    RealCluster,
    group_pods,
    group_recreated,
    group_story,
    post_json,
    ready_status,
    real_node_spec,
    service_url,
    summary,
)

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]

LWS_API = "leaderworkerset.x-k8s.io/v1"
CLIENTS = 8
WARMUP_SECONDS = 5
SETTLE_SECONDS = 5


def group_spec(replicas: int, **engine: Any) -> dict[str, Any]:
    return real_node_spec(replicas=replicas, engine={"pipelineParallelSize": 2, **engine})


def completion(rc: RealCluster, namespace: str, name: str) -> dict[str, Any]:
    code, body = post_json(
        f"{service_url(rc.cluster, namespace, name)}/v1/completions",
        {"model": name, "prompt": "Hello", "max_tokens": 8},
    )
    assert code == 200, body
    assert body["choices"][0]["finish_reason"] == "length", body
    return dict(body)


def test_a_group_serves_and_a_lost_worker_recreates_it(
    real_cluster: RealCluster, e2e_namespace: str
) -> None:
    rc, ns, name = real_cluster, e2e_namespace, "grouped"
    started = time.monotonic()
    rc.kit.apply_llmd(ns, name, group_spec(replicas=1))
    cr = rc.kit.wait_condition(ns, name, "Ready", "True", timeout=240)
    to_ready = time.monotonic() - started
    assert cr["status"]["readyReplicas"] == 1
    pods = group_pods(rc, ns, name)
    assert pods.keys() == {f"{name}-0", f"{name}-0-1"}, pods.keys()
    completion(rc, ns, name)

    # The worker goes: the group must leave service and come back whole.
    first_leader_uid = pods[f"{name}-0"]["metadata"]["uid"]
    deleted = time.monotonic()
    rc.kubectl("delete", "pod", "-n", ns, f"{name}-0-1", "--wait=false")
    wait_until(
        lambda: ready_status(rc.kit.get_llmd(ns, name)) != "True",
        timeout=60,
        interval=0.2,
        what="the CR out of service after its worker went",
    )
    out_of_service = time.monotonic() - deleted

    wait_until(
        lambda: group_recreated(rc, ns, name, first_leader_uid),
        timeout=240,
        interval=0.5,
        what="the group recreated and Ready",
    )
    serving_again = time.monotonic() - deleted
    completion(rc, ns, name)
    print(
        f"\ngroup of 2 pods: Ready {to_ready:.1f}s after apply; worker deleted: out of service "
        f"after {out_of_service:.1f}s, recreated and Ready after {serving_again:.1f}s"
    )


def test_rolling_update_of_two_groups_under_load_loses_nothing(
    real_cluster: RealCluster, e2e_namespace: str
) -> None:
    rc, ns, name = real_cluster, e2e_namespace, "groups"
    rc.kit.apply_llmd(ns, name, group_spec(replicas=2))
    rc.kit.wait_condition(ns, name, "Ready", "True", timeout=240)
    before = {p: pod["metadata"]["uid"] for p, pod in group_pods(rc, ns, name).items()}
    assert len(before) == 4, before.keys()
    url = service_url(rc.cluster, ns, name)

    load = BackgroundLoad(url, model=name, concurrency=CLIENTS, duration=600).start()
    time.sleep(WARMUP_SECONDS)
    started = time.monotonic()
    # A new engine flag rolls every pod, a group at a time.
    rc.kit.apply_llmd(ns, name, group_spec(replicas=2, args=["--sim-decode-ms", "21"]))

    restarts: dict[str, tuple[str, int]] = {}
    """Per pod uid (old and new pods share names): its name and container restarts."""

    def rolled() -> bool:
        for pod in rc.pods(ns, f"{LWS_NAME_LABEL}={name}"):
            counts = pod["status"].get("containerStatuses") or []
            restarts[pod["metadata"]["uid"]] = (
                pod["metadata"]["name"],
                sum(c.get("restartCount", 0) for c in counts),
            )
        lws = rc.kit.get(LWS_API, "LeaderWorkerSet", ns, name) or {}
        status = lws.get("status") or {}
        now = group_pods(rc, ns, name)
        return bool(
            status.get("updatedReplicas") == 2
            and status.get("readyReplicas") == 2
            and len(now) == 4
            and not set(before.values()) & {p["metadata"]["uid"] for p in now.values()}
            and ready_status(rc.kit.get_llmd(ns, name)) == "True"
        )

    try:
        wait_until(rolled, timeout=420, interval=1, what="both groups replaced and Ready")
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}\n{group_story(rc, ns, name)}") from None
    rollout = time.monotonic() - started
    time.sleep(SETTLE_SECONDS)
    result = load.stop()
    print(f"\nrolling update of 2 groups (2 pods each) in {rollout:.1f}s: {summary(result)}")
    assert result.total >= 50, summary(result)
    assert result.lost == 0, summary(result)
    # No container restarted, old pods included: an old worker whose rank ended when its leader
    # went must wait for its deletion, not restart (a restarted rank joins the next leader).
    assert not [pod for pod in restarts.values() if pod[1]], restarts
