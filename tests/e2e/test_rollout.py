"""Drain that loses nothing, proven by Kubernetes itself: a rolling update and a scale-down of
real engine pods under steady streaming load through the Service's ClusterIP. The same rollout of
a hand-written Deployment (same engine, no agent, no preStop) loses requests in the same test, so
the zero is the mechanism's, not luck's."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from llmop import names
from support.cluster import wait_until
from support.realnode import (
    ENGINE_CPU,
    ENGINE_MEMORY,
    BackgroundLoad,
    real_node_spec,
    service_url,
    summary,
)

from .conftest import RealCluster

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]

CLIENTS = 8
WARMUP_SECONDS = 5
SETTLE_SECONDS = 5


def _wait_rolled_out(rc: RealCluster, namespace: str, deployment: str, replicas: int) -> None:
    """The Deployment observed its spec and every pod is updated, available, and the only one."""

    def done() -> bool:
        dep = json.loads(
            rc.kubectl("get", "deployment", "-n", namespace, deployment, "-o", "json").stdout
        )
        st = dep.get("status", {})
        return (
            st.get("observedGeneration") == dep["metadata"]["generation"]
            and st.get("updatedReplicas") == replicas
            and st.get("availableReplicas") == replicas
            and st.get("replicas") == replicas
        )

    wait_until(done, timeout=240, interval=1, what=f"{namespace}/{deployment} rolled out")


def test_rolling_update_under_load_loses_nothing(
    real_cluster: RealCluster, e2e_namespace: str
) -> None:
    ns, name = e2e_namespace, "rolling"
    kit = real_cluster.kit
    kit.apply_llmd(ns, name, real_node_spec(replicas=3))
    kit.wait_condition(ns, name, "Ready", "True", timeout=240)
    url = service_url(real_cluster.cluster, ns, name)

    load = BackgroundLoad(url, model=name, concurrency=CLIENTS, duration=600).start()
    time.sleep(WARMUP_SECONDS)
    # A spec change that rolls every pod: a new engine flag.
    kit.apply_llmd(ns, name, real_node_spec(replicas=3, engine={"args": ["--sim-decode-ms", "21"]}))
    kit.wait_condition(ns, name, "Ready", "True", timeout=300)
    _wait_rolled_out(real_cluster, ns, name, 3)
    time.sleep(SETTLE_SECONDS)
    result = load.stop()
    print(f"\nllmop rollout: {summary(result)}")
    assert result.total >= 50, summary(result)
    assert result.lost == 0, summary(result)


def _plain_deployment(namespace: str, name: str, image: str, decode_ms: str) -> dict[str, Any]:
    """What a hand-written manifest does: the engine alone, readiness on /health, no preStop."""
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": labels},
            "strategy": {"rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [
                        {
                            "name": "engine",
                            "image": image,
                            "imagePullPolicy": "IfNotPresent",
                            "args": [
                                "simulate",
                                "--model",
                                name,
                                "--port",
                                "8000",
                                "--max-num-seqs",
                                "16",
                                "--max-model-len",
                                "2048",
                                "--sim-decode-ms",
                                decode_ms,
                            ],
                            "ports": [{"name": "http", "containerPort": 8000}],
                            "readinessProbe": {
                                "httpGet": {"path": "/health", "port": 8000},
                                "periodSeconds": 5,
                            },
                            "resources": {
                                "limits": {"cpu": ENGINE_CPU, "memory": ENGINE_MEMORY},
                                "requests": {"cpu": ENGINE_CPU, "memory": ENGINE_MEMORY},
                            },
                        }
                    ],
                    "tolerations": [
                        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
                    ],
                    "nodeSelector": {"llmop.dev/real-node": "true"},
                },
            },
        },
    }


def test_plain_deployment_rollout_loses_requests(
    real_cluster: RealCluster, e2e_namespace: str
) -> None:
    """The control: same engine, same node, same load, no agent and no preStop."""
    ns, name = e2e_namespace, "plain"
    image = _simulator_image(real_cluster)
    rc = real_cluster
    rc.kubectl("apply", "-f", "-", input=json.dumps(_plain_deployment(ns, name, image, "20")))
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"selector": {"app": name}, "ports": [{"name": "http", "port": 8000}]},
    }
    rc.kubectl("apply", "-f", "-", input=json.dumps(service))
    _wait_rolled_out(rc, ns, name, 3)
    url = service_url(rc.cluster, ns, name)

    load = BackgroundLoad(url, model=name, concurrency=CLIENTS, duration=600).start()
    time.sleep(WARMUP_SECONDS)
    rc.kubectl("apply", "-f", "-", input=json.dumps(_plain_deployment(ns, name, image, "21")))
    _wait_rolled_out(rc, ns, name, 3)
    time.sleep(SETTLE_SECONDS)
    result = load.stop()
    print(f"\nplain Deployment rollout: {summary(result)}")
    assert result.total >= 50, summary(result)
    assert result.lost > 0, (
        f"the control lost nothing, so the test proves nothing: {summary(result)}"
    )


def test_scale_down_under_load_loses_nothing(real_cluster: RealCluster, e2e_namespace: str) -> None:
    ns, name = e2e_namespace, "shrinking"
    kit = real_cluster.kit
    kit.apply_llmd(ns, name, real_node_spec(replicas=3))
    kit.wait_condition(ns, name, "Ready", "True", timeout=240)
    url = service_url(real_cluster.cluster, ns, name)

    load = BackgroundLoad(url, model=name, concurrency=CLIENTS, duration=600).start()
    time.sleep(WARMUP_SECONDS)
    real_cluster.kubectl("scale", "llmd", "-n", ns, name, "--replicas=1")
    kit.wait_condition(ns, name, "Ready", "True", timeout=180)
    wait_until(
        lambda: len(real_cluster.pods(ns, names.selector_string(name))) == 1,
        timeout=120,
        what="old pods gone",
    )
    time.sleep(SETTLE_SECONDS)
    result = load.stop()
    print(f"\nllmop scale-down 3 -> 1: {summary(result)}")
    assert result.total >= 30, summary(result)
    assert result.lost == 0, summary(result)


def _simulator_image(rc: RealCluster) -> str:
    """The simulator image the operator renders (the one imported into the node)."""
    from llmop.render.settings import DEFAULT_SIMULATOR_IMAGE

    return DEFAULT_SIMULATOR_IMAGE
