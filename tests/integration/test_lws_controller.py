"""The LeaderWorkerSet controller that every local cluster runs (e2e/lws/lws.sh) really works.

cluster.sh starts sigs.k8s.io/lws v0.9.0 as a host process whose webhooks the API server calls on
127.0.0.1. This drives a LeaderWorkerSet end to end on kwok's fake nodes: the controller creates
the leader StatefulSet, each leader gets its worker StatefulSet, the pod webhook labels every pod
with its group and injects the LWS_* env, the status reports ready groups, and the scale
subresource removes whole groups. Multi-node serving (PP > 1) builds on exactly this.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from support.cluster import Cluster, wait_until

pytestmark = pytest.mark.cluster

LWS = "leaderworkerset.x-k8s.io"
LABEL = "leaderworkerset.sigs.k8s.io"
NAME = "lws-probe"
SIZE = 2


def leader_worker_set(replicas: int) -> dict[str, Any]:
    # Every rollout field rendered explicitly: the controller dereferences them, and a client of
    # the API should not depend on the defaulting webhook having run.
    pod_spec: dict[str, Any] = {
        # kwok plays the kubelet: the image is never pulled.
        "containers": [
            {
                "name": "engine",
                "image": "llmop.invalid/engine:1",
                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
            }
        ],
        "terminationGracePeriodSeconds": 0,
        # On a fake node even when a real node has joined (which taints the fake ones).
        "nodeSelector": {"kubernetes.io/hostname": "cpu-0"},
        "tolerations": [
            {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}
        ],
    }
    return {
        "apiVersion": f"{LWS}/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": NAME},
        "spec": {
            "replicas": replicas,
            "startupPolicy": "LeaderCreated",
            "rolloutStrategy": {
                "type": "RollingUpdate",
                "rollingUpdateConfiguration": {"partition": 0, "maxUnavailable": 1, "maxSurge": 0},
            },
            "networkConfig": {"subdomainPolicy": "Shared"},
            "leaderWorkerTemplate": {
                "size": SIZE,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "workerTemplate": {"spec": pod_spec},
            },
        },
    }


def get_json(cluster: Cluster, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def lws_pods(cluster: Cluster, namespace: str) -> dict[str, dict[str, Any]]:
    items = get_json(cluster, "pods", "-n", namespace, "-l", f"{LABEL}/name={NAME}")["items"]
    return {p["metadata"]["name"]: p for p in items if not p["metadata"].get("deletionTimestamp")}


def is_ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    found = [c for c in obj.get("status", {}).get("conditions", []) if c["type"] == kind]
    return found[0] if found else None


def available(cluster: Cluster, namespace: str, groups: int) -> dict[str, Any] | None:
    """The LeaderWorkerSet once its status reports `groups` ready groups and Available."""
    lws = get_json(cluster, "leaderworkerset", NAME, "-n", namespace)
    status = lws.get("status", {})
    cond = condition(lws, "Available")
    done = (
        status.get("readyReplicas") == groups
        and status.get("replicas") == groups
        and cond is not None
        and cond["status"] == "True"
    )
    return lws if done else None


def test_groups_are_created_labelled_ready_and_scaled(
    kube_cluster: Cluster, namespace: str
) -> None:
    kube_cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=json.dumps(leader_worker_set(replicas=2))
    )

    # Group g: leader <name>-g (worker-index 0), worker <name>-g-1.
    expected = {f"{NAME}-{g}": (g, 0) for g in range(2)} | {
        f"{NAME}-{g}-1": (g, 1) for g in range(2)
    }
    pods = wait_until(
        lambda: (
            (p := lws_pods(kube_cluster, namespace)).keys() == expected.keys()
            and all(map(is_ready, p.values()))
            and p
        ),
        timeout=40,
        what="2 leaders and 2 workers Ready",
    )
    for name, (group, worker) in expected.items():
        labels = pods[name]["metadata"]["labels"]
        assert labels[f"{LABEL}/name"] == NAME
        assert labels[f"{LABEL}/group-index"] == str(group)
        assert labels[f"{LABEL}/worker-index"] == str(worker)
        env = {e["name"]: e.get("value") for e in pods[name]["spec"]["containers"][0]["env"]}
        # The leader's stable DNS name under the LWS's headless Service (subdomain Shared).
        assert env["LWS_LEADER_ADDRESS"] == f"{NAME}-{group}.{NAME}.{namespace}"
        assert env["LWS_GROUP_SIZE"] == str(SIZE)
        assert env["LWS_WORKER_INDEX"] == str(worker)

    lws = wait_until(
        lambda: available(kube_cluster, namespace, 2), timeout=20, what="readyReplicas 2, Available"
    )
    status = lws["status"]
    assert status["observedGeneration"] == lws["metadata"]["generation"]
    # What an HPA reads through the scale subresource: the leaders only.
    assert status["hpaPodSelector"] == f"{LABEL}/name={NAME},{LABEL}/worker-index=0"
    progressing = condition(lws, "Progressing")
    assert progressing is None or progressing["status"] == "False"

    scale = json.loads(
        kube_cluster.kubectl(
            "get", "--raw", f"/apis/{LWS}/v1/namespaces/{namespace}/leaderworkersets/{NAME}/scale"
        ).stdout
    )
    assert (scale["spec"]["replicas"], scale["status"]["replicas"]) == (2, 2)

    kube_cluster.kubectl("scale", "-n", namespace, f"leaderworkerset/{NAME}", "--replicas=1")
    # The whole of group 1 goes: its leader (leader StatefulSet scaled down), then its worker
    # (the worker StatefulSet is owned by the leader pod, so the garbage collector removes it).
    wait_until(
        lambda: lws_pods(kube_cluster, namespace).keys() == {f"{NAME}-0", f"{NAME}-0-1"},
        timeout=30,
        what="group 1 removed",
    )
    wait_until(
        lambda: available(kube_cluster, namespace, 1), timeout=20, what="readyReplicas 1, Available"
    )
