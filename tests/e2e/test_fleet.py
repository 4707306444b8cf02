"""The operator reads its fleet on real pods: real agents on the real node answer `/status` on
their pod IPs, so within 30 s of Ready the CR shows the KV capacity the engines report, every
engine pod carries a deletion cost, and the cold-start breakdown times each step; a crashed
engine makes the CR Degraded with the restart and its exit while Ready comes back."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import pytest

from llmop import names
from support.cluster import wait_until
from support.realnode import RealCluster, post_json, real_node_spec

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]

COST = "controller.kubernetes.io/pod-deletion-cost"


def _conds(obj: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in ((obj or {}).get("status") or {}).get("conditions") or []}


def test_fleet_is_read_on_real_pods(real_cluster: RealCluster, e2e_namespace: str) -> None:
    rc, ns, name = real_cluster, e2e_namespace, "fleet"
    rc.kit.apply_llmd(ns, name, real_node_spec(replicas=2))
    rc.kit.wait_condition(ns, name, "Ready", "True", timeout=180)
    ready_at = time.monotonic()
    selector = names.selector_string(name)

    seen: list[Any] = []

    def read() -> dict[str, Any] | None:
        obj = rc.kit.get_llmd(ns, name) or {}
        status = obj.get("status") or {}
        actual = (status.get("plan") or {}).get("actual") or {}
        pods = rc.pods(ns, selector)
        costs = [(p["metadata"].get("annotations") or {}).get(COST) for p in pods]
        summary = (status.get("startup") or {}).get("summary", "")
        seen[:] = [actual, costs, summary]
        if actual.get("kvCacheTokens") and all(c is not None for c in costs):
            return obj if summary.startswith("all ready") else None
        return None

    try:
        obj = wait_until(read, timeout=30, interval=1, what="actual capacity, costs and startup")
    except TimeoutError:
        agents = []
        for pod in rc.pods(ns, selector):
            url = f"http://{pod['status']['podIP']}:8081/status"
            with urllib.request.urlopen(url, timeout=5) as response:
                agents.append(json.loads(response.read()))
        pytest.fail(f"last seen (actual, costs, summary): {seen}; agents: {agents}")
    print(
        f"\nactual KV capacity {obj['status']['plan']['actual']['kvCacheTokens']} tokens, "
        f"deletion costs and the startup breakdown {time.monotonic() - ready_at:.1f}s after Ready"
    )
    for replica in obj["status"]["startup"]["replicas"]:
        print(f"  {replica}")
        assert replica["phase"] == "Ready"
        assert (
            0
            <= replica["scheduledAfterSeconds"]
            <= replica["startedAfterSeconds"]
            <= replica["readyAfterSeconds"]
        )
    assert _conds(obj)["Degraded"]["status"] == "False"

    # A crash: the kubelet restarts the engine; the CR is Degraded with the restart and exit.
    pod = rc.pods(ns, selector)[0]
    code, body = post_json(f"http://{pod['status']['podIP']}:8000/sim/fault", {"mode": "crash"})
    assert code == 200, body
    crashed_at = time.monotonic()

    def degraded() -> dict[str, Any] | None:
        found = _conds(rc.kit.get_llmd(ns, name)).get("Degraded") or {}
        return found if found.get("reason") == "ContainerRestarting" else None

    found = wait_until(degraded, timeout=60, interval=1, what="Degraded=True ContainerRestarting")
    print(f"Degraded after {time.monotonic() - crashed_at:.1f}s: {found['message']}")
    assert found["status"] == "True"
    assert pod["metadata"]["name"] in found["message"]
    assert "restarted 1 times" in found["message"]
    assert "last exit" in found["message"]
    obj = rc.kit.wait_condition(ns, name, "Ready", "True", timeout=120)
    assert _conds(obj)["Degraded"]["status"] == "True"  # recent restart: still worth a look
