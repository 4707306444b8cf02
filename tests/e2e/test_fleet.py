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
from support.realnode import (
    BackgroundLoad,
    RealCluster,
    post_json,
    real_node_spec,
    service_url,
    summary,
)

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


def _cost(pod: dict[str, Any]) -> int | None:
    value = (pod["metadata"].get("annotations") or {}).get(COST)
    return None if value is None else int(value)


def test_scale_down_removes_the_idle_pods_and_keeps_the_busy_one(
    real_cluster: RealCluster, e2e_namespace: str
) -> None:
    rc, ns, name = real_cluster, e2e_namespace, "least-loaded"
    rc.kit.apply_llmd(ns, name, real_node_spec(replicas=3))
    rc.kit.wait_condition(ns, name, "Ready", "True", timeout=240)
    selector = names.selector_string(name)
    pods = rc.pods(ns, selector)
    busy = pods[1]  # not the first or the last by name: the pick must come from the load
    busy_name, busy_ip = busy["metadata"]["name"], busy["status"]["podIP"]

    # Load pinned to one pod (its own IP), plus a trickle through the Service that the two idle
    # pods drain when they go.
    pinned = BackgroundLoad(f"http://{busy_ip}:8000", model=name, concurrency=12, duration=600)
    trickle = BackgroundLoad(
        service_url(rc.cluster, ns, name), model=name, concurrency=1, duration=600
    )
    pinned.start()
    trickle.start()

    def costs_follow_the_load() -> dict[str, int | None] | None:
        costs = {p["metadata"]["name"]: _cost(p) for p in rc.pods(ns, selector)}
        others = [c for n, c in costs.items() if n != busy_name]
        top = costs.get(busy_name)
        if top is not None and top >= 4 and all(c is not None and c < top for c in others):
            return costs
        return None

    costs = wait_until(costs_follow_the_load, timeout=45, interval=1, what="deletion costs")
    print(f"\ndeletion costs under load: {costs} (busy: {busy_name})")
    rc.kubectl("scale", "llmd", "-n", ns, name, "--replicas=1")
    left = wait_until(
        lambda: (p := rc.pods(ns, selector)) and len(p) == 1 and p,
        timeout=120,
        what="one pod left",
    )
    rc.kit.wait_condition(ns, name, "Ready", "True", timeout=60)
    pinned_result, trickle_result = pinned.stop(), trickle.stop()
    print(f"pinned: {summary(pinned_result)}; via the Service: {summary(trickle_result)}")
    assert left[0]["metadata"]["name"] == busy_name, costs
    assert pinned_result.total >= 12, summary(pinned_result)
    assert pinned_result.lost == 0, summary(pinned_result)
    assert trickle_result.lost == 0, summary(trickle_result)


def test_hung_deep_probe_degrades_and_recovers(
    real_cluster: RealCluster, e2e_namespace: str
) -> None:
    rc, ns, name = real_cluster, e2e_namespace, "hung-probe"
    # A long stall window: the agent keeps the hung engine alive, so only the deep probe tells.
    rc.kit.apply_llmd(ns, name, real_node_spec(replicas=1, health={"stallSeconds": 300}))
    rc.kit.wait_condition(ns, name, "Ready", "True", timeout=180)
    pod = rc.pods(ns, names.selector_string(name))[0]
    api = f"http://{pod['status']['podIP']}:8000/sim/fault"
    code, body = post_json(api, {"mode": "hang"})
    assert code == 200, body
    hung_at = time.monotonic()

    def degraded(reason: str | None) -> dict[str, Any] | None:
        found = _conds(rc.kit.get_llmd(ns, name)).get("Degraded") or {}
        if reason is None:
            return found if found.get("status") == "False" else None
        return found if found.get("reason") == reason else None

    found = wait_until(
        lambda: degraded("DeepProbeFailing"), timeout=30, interval=1, what="DeepProbeFailing"
    )
    print(f"\nDegraded {time.monotonic() - hung_at:.1f}s after the hang: {found['message']}")
    assert found["status"] == "True"
    assert pod["metadata"]["name"] in found["message"]

    code, body = post_json(api, {"mode": "none"})
    assert code == 200, body
    healed_at = time.monotonic()
    wait_until(lambda: degraded(None), timeout=30, interval=1, what="Degraded=False")
    print(f"Degraded=False {time.monotonic() - healed_at:.1f}s after the engine recovered")
    obj = rc.kit.wait_condition(ns, name, "Ready", "True", timeout=60)
    restarts = rc.pods(ns, names.selector_string(name))[0]["status"]["containerStatuses"][0]
    assert restarts["restartCount"] == 0, obj  # found by the probe, not by a kill
