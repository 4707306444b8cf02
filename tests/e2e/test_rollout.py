"""Drain that loses nothing, proven by Kubernetes itself: a rolling update and a scale-down of
real engine pods under steady streaming load through the Service's ClusterIP. The same rollout of
a hand-written Deployment (same engine, no agent, no preStop) loses requests in the same test, so
the zero is the mechanism's, not luck's."""

from __future__ import annotations

import json
import time

import pytest

from llmop import names
from llmop.settings import DEFAULT_SIMULATOR_IMAGE
from support.cluster import wait_until
from support.realnode import (
    KUBEAI_STYLE,
    BackgroundLoad,
    RealCluster,
    plain_engine_deployment,
    plain_service,
    real_node_spec,
    service_url,
    summary,
    wait_rolled_out,
)

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]

CLIENTS = 8
WARMUP_SECONDS = 5
SETTLE_SECONDS = 5


@pytest.mark.parametrize("keepalive", [False, True], ids=["new-connection", "keepalive"])
def test_rolling_update_under_load_loses_nothing(
    real_cluster: RealCluster, e2e_namespace: str, keepalive: bool
) -> None:
    """With `keepalive` each client reuses its pooled connection, which kube-proxy pins to one
    pod, also after that pod left the Service: the draining engine's `Connection: close` is what
    moves such a client to a pod still in the Service (llmop_engine.connection_close)."""
    ns, name = e2e_namespace, "rolling"
    kit = real_cluster.kit
    kit.apply_llmd(ns, name, real_node_spec(replicas=3))
    kit.wait_condition(ns, name, "Ready", "True", timeout=240)
    url = service_url(real_cluster.cluster, ns, name)

    load = BackgroundLoad(
        url, model=name, concurrency=CLIENTS, duration=600, keepalive=keepalive
    ).start()
    time.sleep(WARMUP_SECONDS)
    # A spec change that rolls every pod: a new engine flag.
    kit.apply_llmd(ns, name, real_node_spec(replicas=3, engine={"args": ["--sim-decode-ms", "21"]}))
    kit.wait_condition(ns, name, "Ready", "True", timeout=300)
    wait_rolled_out(real_cluster.cluster, ns, name, 3)
    time.sleep(SETTLE_SECONDS)
    result = load.stop()
    print(f"\nllmop rollout ({'keep-alive' if keepalive else 'new connection'}): {summary(result)}")
    assert result.total >= 50, summary(result)
    assert result.lost == 0, summary(result)


def test_plain_deployment_rollout_loses_requests(
    real_cluster: RealCluster, e2e_namespace: str
) -> None:
    """The control: same engine, same node, same load, no agent and no preStop (as KubeAI
    renders it, and as a hand-written manifest does)."""
    ns, name = e2e_namespace, "plain"
    rc = real_cluster

    def deployment(decode_ms: str) -> str:
        args = ["--max-num-seqs", "16", "--max-model-len", "2048", "--sim-decode-ms", decode_ms]
        return json.dumps(
            plain_engine_deployment(ns, name, DEFAULT_SIMULATOR_IMAGE, KUBEAI_STYLE, args)
        )

    rc.kubectl("apply", "-f", "-", input=deployment("20"))
    rc.kubectl("apply", "-f", "-", input=json.dumps(plain_service(ns, name)))
    wait_rolled_out(rc.cluster, ns, name, 3)
    url = service_url(rc.cluster, ns, name)

    load = BackgroundLoad(url, model=name, concurrency=CLIENTS, duration=600).start()
    time.sleep(WARMUP_SECONDS)
    rc.kubectl("apply", "-f", "-", input=deployment("21"))
    wait_rolled_out(rc.cluster, ns, name, 3)
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
