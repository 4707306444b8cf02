"""Smoke tests proving the local cluster is a real Kubernetes control plane.

Each test exercises one component the operator depends on: the API server's
CRD schema validation, the real scheduler's extended-resource accounting on
the fake GPU nodes, kwok's pod lifecycle, the controller-manager's garbage
collector, and the autoscaling/v2 API with its HPA controller.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

import pytest

from support.cluster import Cluster, KubectlError, wait_until

pytestmark = pytest.mark.cluster

H100 = "NVIDIA-H100-80GB-HBM3"
L4 = "NVIDIA-L4"


def apply(cluster: Cluster, obj: dict[str, Any], namespace: str | None = None) -> None:
    args = ["apply", "-f", "-"] + (["-n", namespace] if namespace else [])
    cluster.kubectl(*args, input=json.dumps(obj))


def get_json(cluster: Cluster, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def deployment(
    name: str,
    *,
    replicas: int,
    gpus: int = 0,
    node_selector: dict[str, str] | None = None,
) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": "100m", "memory": "64Mi"}}
    if gpus:
        # Extended resources: the limit is what counts (requests default to it).
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    pod_spec: dict[str, Any] = {
        # kwok plays the kubelet, so the image is never pulled.
        "containers": [{"name": "main", "image": "llmop.invalid/smoke:1", "resources": resources}],
        "terminationGracePeriodSeconds": 0,
    }
    if node_selector:
        pod_spec["nodeSelector"] = node_selector
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": pod_spec},
        },
    }


def pods(cluster: Cluster, namespace: str, app: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = get_json(cluster, "pods", "-n", namespace, "-l", f"app={app}")[
        "items"
    ]
    return items


def is_ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def test_server_is_kubernetes_1_x(kube_cluster: Cluster) -> None:
    version = json.loads(kube_cluster.kubectl("version", "-o", "json").stdout)
    server = version["serverVersion"]["gitVersion"]
    assert server.startswith("v1.")
    if kube_cluster.bin_dir is not None:
        # Our own build: the ldflags stamped the real release into both binaries.
        assert server == version["clientVersion"]["gitVersion"]


def test_fake_gpu_nodes_are_ready_and_labelled(kube_cluster: Cluster) -> None:
    nodes = get_json(kube_cluster, "nodes", "-l", "nvidia.com/gpu.present=true")["items"]
    by_product: dict[str, list[int]] = {}
    for node in nodes:
        labels = node["metadata"]["labels"]
        gpus = int(node["status"]["allocatable"]["nvidia.com/gpu"])
        assert labels["nvidia.com/gpu.count"] == str(gpus)
        assert int(labels["nvidia.com/gpu.memory"]) > 0
        assert is_ready(node)
        by_product.setdefault(labels["nvidia.com/gpu.product"], []).append(gpus)
    assert by_product == {H100: [8, 8], L4: [4]}


def test_crd_schema_rejects_invalid_objects(kube_cluster: Cluster) -> None:
    group = f"smoke{secrets.token_hex(3)}.llmop.invalid"
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "required": ["model"],
                                    "properties": {
                                        "model": {"type": "string", "minLength": 1},
                                        "replicas": {"type": "integer", "minimum": 1},
                                    },
                                }
                            },
                        }
                    },
                }
            ],
        },
    }
    apply(kube_cluster, crd)
    try:
        kube_cluster.kubectl(
            "wait", "--for=condition=Established", f"crd/widgets.{group}", "--timeout=60s"
        )

        def widget(spec: dict[str, Any]) -> dict[str, Any]:
            name = f"w-{secrets.token_hex(3)}"
            return {
                "apiVersion": f"{group}/v1",
                "kind": "Widget",
                "metadata": {"name": name},
                "spec": spec,
            }

        apply(kube_cluster, widget({"model": "llama", "replicas": 2}), "default")

        with pytest.raises(KubectlError) as rejected:
            apply(kube_cluster, widget({"model": "llama", "replicas": 0}), "default")
        assert "spec.replicas" in rejected.value.stderr
        assert "should be greater than or equal to 1" in rejected.value.stderr

        with pytest.raises(KubectlError) as rejected:
            apply(kube_cluster, widget({"replicas": 1}), "default")
        assert "spec.model: Required value" in rejected.value.stderr
    finally:
        kube_cluster.kubectl("delete", "crd", f"widgets.{group}", "--wait=false", check=False)


def test_gpu_pods_are_scheduled_only_onto_gpu_nodes(kube_cluster: Cluster, namespace: str) -> None:
    gpu_nodes = {
        n["metadata"]["name"]: n["metadata"]["labels"]["nvidia.com/gpu.product"]
        for n in get_json(kube_cluster, "nodes", "-l", "nvidia.com/gpu.present=true")["items"]
    }
    apply(kube_cluster, deployment("any-gpu", replicas=4, gpus=1), namespace)
    apply(
        kube_cluster,
        deployment("l4", replicas=2, gpus=1, node_selector={"nvidia.com/gpu.product": L4}),
        namespace,
    )
    for name in ("any-gpu", "l4"):
        kube_cluster.kubectl(
            "rollout", "status", f"deployment/{name}", "-n", namespace, "--timeout=120s"
        )

    any_gpu = pods(kube_cluster, namespace, "any-gpu")
    assert len(any_gpu) == 4
    assert all(is_ready(p) for p in any_gpu)
    assert {p["spec"]["nodeName"] for p in any_gpu} <= set(gpu_nodes)

    l4 = pods(kube_cluster, namespace, "l4")
    assert len(l4) == 2
    assert all(is_ready(p) for p in l4)
    assert {gpu_nodes[p["spec"]["nodeName"]] for p in l4} == {L4}


def test_too_many_gpus_stays_pending_with_scheduler_reason(
    kube_cluster: Cluster, namespace: str
) -> None:
    apply(kube_cluster, deployment("greedy", replicas=1, gpus=9), namespace)

    def unschedulable() -> dict[str, Any] | None:
        for pod in pods(kube_cluster, namespace, "greedy"):
            for cond in pod.get("status", {}).get("conditions", []):
                if cond["type"] == "PodScheduled" and cond["status"] == "False":
                    return pod
        return None

    pod = wait_until(unschedulable, timeout=60, what="the scheduler to give up on the pod")
    cond = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
    assert pod["status"]["phase"] == "Pending"
    assert cond["reason"] == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in cond["message"]
    assert "nodeName" not in pod["spec"]


def test_deleting_owner_garbage_collects_dependents(kube_cluster: Cluster, namespace: str) -> None:
    # Owner reference set by hand: the garbage collector alone must act.
    apply(
        kube_cluster,
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}},
        namespace,
    )
    owner_uid = get_json(kube_cluster, "configmap", "owner", "-n", namespace)["metadata"]["uid"]
    dependent = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "dependent",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner_uid}
            ],
        },
    }
    apply(kube_cluster, dependent, namespace)

    # And the usual chain: Deployment -> ReplicaSet -> Pods (kwok completes pod deletion).
    apply(kube_cluster, deployment("doomed", replicas=2), namespace)
    kube_cluster.kubectl(
        "rollout", "status", "deployment/doomed", "-n", namespace, "--timeout=120s"
    )
    assert len(pods(kube_cluster, namespace, "doomed")) == 2

    kube_cluster.kubectl("delete", "configmap", "owner", "-n", namespace, "--wait=false")
    kube_cluster.kubectl("delete", "deployment", "doomed", "-n", namespace, "--wait=false")

    def gone() -> bool:
        dependents = kube_cluster.kubectl(
            "get", "configmap", "dependent", "-n", namespace, "--ignore-not-found", "-o", "name"
        ).stdout.strip()
        replicasets = get_json(kube_cluster, "replicasets", "-n", namespace, "-l", "app=doomed")
        return (
            not dependents
            and not replicasets["items"]
            and not pods(kube_cluster, namespace, "doomed")
        )

    wait_until(gone, timeout=90, what="the garbage collector to delete the dependents")


def test_hpa_is_accepted_and_seen_by_its_controller(kube_cluster: Cluster, namespace: str) -> None:
    apply(kube_cluster, deployment("scaled", replicas=1), namespace)
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "scaled"},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "scaled"},
            "minReplicas": 1,
            "maxReplicas": 3,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {
                        "name": "cpu",
                        "target": {"type": "Utilization", "averageUtilization": 80},
                    },
                }
            ],
        },
    }
    apply(kube_cluster, hpa, namespace)
    stored = get_json(kube_cluster, "hpa", "scaled", "-n", namespace)
    assert stored["spec"]["maxReplicas"] == 3

    # The HPA controller (in kube-controller-manager) reports on it; without a
    # metrics API it cannot compute utilisation, but AbleToScale shows it ran.
    def conditions() -> list[str] | None:
        status = get_json(kube_cluster, "hpa", "scaled", "-n", namespace).get("status", {})
        types = [c["type"] for c in status.get("conditions", [])]
        return types or None

    assert "AbleToScale" in wait_until(conditions, timeout=90, what="HPA status conditions")
