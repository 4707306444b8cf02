"""Faults on real pods: a hung engine is taken out of the Service and restarted by the kubelet's
liveness probe; a saturated one is left alone; a crash restarts the container; an image that
cannot be pulled and a pod that cannot be scheduled show up in the CR's status."""

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
    PodWatch,
    RealCluster,
    pod_ready,
    post_json,
    real_node_spec,
    service_url,
    summary,
    wait_pods,
)

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]

STALL_SECONDS = 10
SATURATION_SECONDS = 300


def _only_pod(rc: RealCluster, ns: str, name: str) -> dict[str, Any]:
    (pod,) = rc.pods(ns, names.selector_string(name))
    return pod


def _restarts(pod: dict[str, Any]) -> int:
    return sum(s.get("restartCount", 0) for s in pod["status"].get("containerStatuses") or [])


def _fault(pod: dict[str, Any], mode: str) -> None:
    code, body = post_json(f"http://{pod['status']['podIP']}:8000/sim/fault", {"mode": mode})
    assert code == 200, body


def _limits(pod: dict[str, Any]) -> tuple[float, float, float]:
    engine = pod["spec"]["containers"][0]
    live = engine["livenessProbe"]
    detection = STALL_SECONDS + live["periodSeconds"] * live["failureThreshold"]
    grace = (
        live.get("terminationGracePeriodSeconds") or pod["spec"]["terminationGracePeriodSeconds"]
    )
    return float(detection), float(grace), float(live["periodSeconds"])


def test_hung_engine_leaves_the_service_then_is_restarted(
    real_cluster: RealCluster, e2e_namespace: str
) -> None:
    ns, name = e2e_namespace, "hangs"
    rc = real_cluster
    rc.kit.apply_llmd(
        ns,
        name,
        real_node_spec(
            health={
                "stallSeconds": STALL_SECONDS,
                "deepProbe": {"intervalSeconds": 2, "timeoutSeconds": 1},
            }
        ),
    )
    rc.kit.wait_condition(ns, name, "Ready", "True", timeout=180)
    pod = _only_pod(rc, ns, name)
    detection, grace, period = _limits(pod)
    url = service_url(rc.cluster, ns, name)
    # Pending work that will never progress, as when a forward pass never returns.
    load = BackgroundLoad(url, model=name, concurrency=2, duration=600, max_tokens=512).start()
    time.sleep(2)
    hung_at = time.monotonic()
    _fault(pod, "hang")

    selector = names.selector_string(name)
    wait_pods(
        rc.cluster,
        ns,
        selector,
        lambda ps: bool(ps) and not pod_ready(ps[0]),
        timeout=detection + 10,
        what="hung pod NotReady",
    )
    not_ready_after = time.monotonic() - hung_at
    wait_pods(
        rc.cluster,
        ns,
        selector,
        lambda ps: bool(ps) and _restarts(ps[0]) >= 1,
        timeout=detection + grace + 30,
        what="hung pod restarted",
    )
    restarted_after = time.monotonic() - hung_at
    load.stop()
    wait_pods(
        rc.cluster,
        ns,
        selector,
        lambda ps: bool(ps) and pod_ready(ps[0]),
        timeout=120,
        what="restarted pod Ready again",
    )
    print(
        f"\nhang: NotReady after {not_ready_after:.1f}s, restarted after {restarted_after:.1f}s "
        f"(detection bound {detection:.0f}s + grace {grace:.0f}s)"
    )
    assert restarted_after <= detection + period + grace + 10
    last = rc.pods(ns, selector)[0]["status"]["containerStatuses"][0]["lastState"]["terminated"]
    assert last["exitCode"] != 0


def test_saturated_engine_is_never_restarted(real_cluster: RealCluster, e2e_namespace: str) -> None:
    """Five minutes with more streams than maxNumSeqs: 0 restarts, 0 readiness flaps."""
    ns, name = e2e_namespace, "saturated"
    rc = real_cluster
    rc.kit.apply_llmd(
        ns,
        name,
        real_node_spec(engine={"maxNumSeqs": 4}, health={"stallSeconds": STALL_SECONDS}),
    )
    rc.kit.wait_condition(ns, name, "Ready", "True", timeout=180)
    url = service_url(rc.cluster, ns, name)
    watch = PodWatch(rc.cluster, ns, names.selector_string(name))
    watch.sample()
    load = BackgroundLoad(
        url, model=name, concurrency=12, duration=SATURATION_SECONDS, max_tokens=128
    ).start()
    queued = 0
    samples = 0
    deadline = time.monotonic() + SATURATION_SECONDS
    while time.monotonic() < deadline:
        (pod,) = watch.sample()
        with urllib.request.urlopen(f"http://{pod['status']['podIP']}:8081/status", timeout=5) as r:
            status = json.loads(r.read())
        samples += 1
        queued += 1 if (status.get("queueDepth") or 0) > 0 else 0
        time.sleep(5)
    result = load.join()
    print(
        f"\nsaturation: {summary(result)}; queue non-empty in {queued}/{samples} samples, "
        f"{watch.ready_flips} readiness flips, restarts {watch.restarts}"
    )
    assert sum(watch.restarts.values()) == 0
    assert watch.ready_flips == 0
    assert queued >= samples * 0.8, "the engine was not saturated"
    assert result.lost == 0, summary(result)


def test_crash_restarts_the_container(real_cluster: RealCluster, e2e_namespace: str) -> None:
    ns, name = e2e_namespace, "crashes"
    rc = real_cluster
    rc.kit.apply_llmd(ns, name, real_node_spec())
    rc.kit.wait_condition(ns, name, "Ready", "True", timeout=180)
    _fault(_only_pod(rc, ns, name), "crash")
    selector = names.selector_string(name)
    (pod,) = wait_pods(
        rc.cluster,
        ns,
        selector,
        lambda ps: bool(ps) and _restarts(ps[0]) >= 1,
        timeout=60,
        what="crashed container restarted",
    )
    last = pod["status"]["containerStatuses"][0]["lastState"]["terminated"]
    assert last["exitCode"] != 0, last
    rc.kit.wait_condition(ns, name, "Ready", "True", timeout=120)


def _reason_within(
    rc: RealCluster, ns: str, name: str, words: tuple[str, ...], timeout: float
) -> str:
    def probe() -> str | None:
        obj = rc.kit.get_llmd(ns, name) or {}
        for cond in (obj.get("status") or {}).get("conditions") or []:
            text = f"{cond.get('reason')}: {cond.get('message')}"
            if all(w in text for w in words):
                return f"{cond['type']}={cond['status']} {text}"
        return None

    return wait_until(probe, timeout=timeout, interval=1, what=f"status naming {words}")


def test_unpullable_image_is_reported(real_cluster: RealCluster, e2e_namespace: str) -> None:
    ns, name = e2e_namespace, "nopull"
    image = "localhost/llmop-no-such-image:0"
    spec = real_node_spec(engine={"image": image}, scheduling={"prePullImage": True})
    real_cluster.kit.apply_llmd(ns, name, spec)
    start = time.monotonic()
    found = _reason_within(real_cluster, ns, name, ("ImagePull", image), timeout=30)
    print(f"\nunpullable image reported after {time.monotonic() - start:.1f}s: {found}")
    # The pre-pull says the image is on no node, and where to look.
    pre_pull = wait_until(
        lambda: ((real_cluster.kit.get_llmd(ns, name) or {}).get("status") or {}).get("prePull"),
        timeout=30,
        interval=1,
        what="status.prePull",
    )
    assert pre_pull["pulled"] == 0, pre_pull
    assert pre_pull["nodes"] >= 1, pre_pull
    assert "pulling or failing: kubectl get pods" in pre_pull["message"], pre_pull


def test_unschedulable_pod_is_reported(real_cluster: RealCluster, e2e_namespace: str) -> None:
    ns, name = e2e_namespace, "nogpu"
    # More GPUs than the real node has; the kwok nodes are tainted while it is joined.
    real_cluster.kit.apply_llmd(ns, name, real_node_spec(resources={"gpus": 5}))
    start = time.monotonic()
    found = _reason_within(real_cluster, ns, name, ("Unschedulable", "nvidia.com/gpu"), timeout=30)
    print(f"\nunschedulable pod reported after {time.monotonic() - start:.1f}s: {found}")
