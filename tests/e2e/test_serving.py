"""An LLMDeployment served for real: Ready only once the kubelet's probes pass, and the
OpenAI-compatible API answering through the Service's ClusterIP (kube-proxy), streaming and not."""

from __future__ import annotations

import json
import urllib.request
from datetime import datetime
from typing import Any

import pytest

from llmop import names
from support.cluster import wait_until
from support.realnode import REAL_NODE, RealCluster, post_json, real_node_spec, service_url

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]


def _ts(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def test_ready_after_probes_and_serves_through_the_service(
    real_cluster: RealCluster, e2e_namespace: str
) -> None:
    ns, name = e2e_namespace, "served"
    spec = real_node_spec(replicas=1, scheduling={"prePullImage": True})
    real_cluster.kit.apply_llmd(ns, name, spec)
    obj = real_cluster.kit.wait_condition(ns, name, "Ready", "True", timeout=180)
    assert obj["status"]["readyReplicas"] == 1

    def cr_status() -> dict[str, Any]:
        found: dict[str, Any] = (real_cluster.kit.get_llmd(ns, name) or {}).get("status") or {}
        return found

    # The image pre-pull: its DaemonSet's pod ran the engine image on the real node.
    pulled = wait_until(
        lambda: (
            (p := cr_status().get("prePull") or {}).get("nodes") and p["pulled"] == p["nodes"] and p
        ),
        timeout=60,
        interval=1,
        what="status.prePull: the image on every node",
    )
    print(f"\npre-pull: {pulled}")
    (held,) = real_cluster.pods(
        ns, f"{names.LABEL_INSTANCE}={name},{names.LABEL_COMPONENT}={names.PRE_PULL_COMPONENT}"
    )
    assert held["spec"]["nodeName"] == REAL_NODE

    # Where the start went, phase by phase, read by the agent from the engine's own lines.
    def replicas() -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = (cr_status().get("startup") or {}).get("replicas") or []
        return found

    engine_start = wait_until(
        lambda: (r := replicas()) and "untracedSeconds" in (r[0].get("engine") or {}) and r[0],
        timeout=60,
        interval=1,
        what="status.startup.replicas[0].engine",
    )
    print(f"start: {engine_start}")
    phases = engine_start["engine"]
    assert phases["weightsSeconds"] >= 1, phases  # the simulator's model load
    assert phases["untracedSeconds"] <= 1, phases
    assert {"agentStartSeconds", "engineStartSeconds", "apiStartSeconds"} <= phases.keys()

    (pod,) = real_cluster.pods(ns, names.selector_string(name))
    assert pod["spec"]["nodeName"] == REAL_NODE
    status = pod["status"]
    (engine,) = status["containerStatuses"]
    assert engine["ready"]
    assert engine["started"]
    # Ready came from the kubelet running /readyz after the container started, not at once.
    started = _ts(engine["state"]["running"]["startedAt"])
    ready_at = _ts(
        next(c for c in status["conditions"] if c["type"] == "Ready")["lastTransitionTime"]
    )
    assert ready_at >= started

    url = service_url(real_cluster.cluster, ns, name)
    code, body = post_json(
        f"{url}/v1/completions", {"model": name, "prompt": "Hello", "max_tokens": 8}
    )
    assert code == 200, body
    assert body["choices"][0]["finish_reason"] == "length", body
    code, body = post_json(
        f"{url}/v1/chat/completions",
        {"model": name, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8},
    )
    assert code == 200, body
    assert body["choices"][0]["message"]["role"] == "assistant", body

    for path, payload in (
        ("/v1/completions", {"model": name, "prompt": "Hello", "max_tokens": 8, "stream": True}),
        (
            "/v1/chat/completions",
            {
                "model": name,
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 8,
                "stream": True,
            },
        ),
    ):
        request = urllib.request.Request(
            url + path,
            data=json.dumps(payload).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            lines = [ln.decode().strip() for ln in response if ln.strip()]
        assert lines[-1] == "data: [DONE]", (path, lines[-3:])
        chunks = [json.loads(ln[5:]) for ln in lines[:-1] if ln.startswith("data:")]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length", (path, chunks[-1])

    # The API server reaches the kubelet with its client certificate: logs work.
    logs = real_cluster.kubectl("logs", "-n", ns, pod["metadata"]["name"], "--tail=50")
    assert logs.stdout.strip(), "no container logs through the kubelet"
