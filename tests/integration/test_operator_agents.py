"""The operator reads its engine agents, against the real API server and real HTTP: kwok pods'
IPs are rewritten (pods/status, as the kubelet writes them) to loopback addresses where
stand-in agents answer `/status` in the real agent's shape. Checked: status.plan.actual and the
KV shortfall Warning, Degraded for a Ready pod whose deep probe fails (and back), deletion
costs that follow the load without rewrites when it holds still, and a 3 → 1 scale-down that
keeps the loaded pod. The operator runs with a 2-second read interval."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from support.cluster import wait_until
from support.manifests import simulator_spec as spec
from support.operator import OperatorProcess
from support.standin_agents import StandinAgent, agent_status, standin_agents

if TYPE_CHECKING:
    from support.operator import Kit

pytestmark = pytest.mark.cluster

COST = "controller.kubernetes.io/pod-deletion-cost"
INTERVAL = 2


@pytest.fixture(scope="module")
def operator(
    operator_kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """`llmop run` reading agents every INTERVAL seconds."""
    process = OperatorProcess(
        operator_kubeconfig, tmp_path_factory.mktemp("operator-log") / "operator.log"
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LLMOP_AGENT_READ_INTERVAL_SECONDS", str(INTERVAL))
        process.start()
    try:
        yield process
    finally:
        process.stop()


def conds(obj: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in ((obj or {}).get("status") or {}).get("conditions") or []}


def engine_pods(kit: Kit, namespace: str, name: str) -> list[dict[str, Any]]:
    selector = f"serving.llmop.dev/deployment={name}"
    pods = kit.kube.list("v1", "Pod", namespace, label_selector=selector)
    return sorted(
        (p for p in pods if not p["metadata"].get("deletionTimestamp")),
        key=lambda p: p["metadata"]["name"],
    )


def point_at(kit: Kit, pod: dict[str, Any], agent: StandinAgent) -> None:
    """Give the pod the stand-in's address, as the kubelet reports a pod IP."""
    metadata = pod["metadata"]
    kit.kube.patch_status(
        "v1",
        "Pod",
        metadata["namespace"],
        metadata["name"],
        {"podIP": agent.host, "podIPs": [{"ip": agent.host}]},
    )


def loopback_hosts(count: int) -> list[str]:
    base = random.randrange(2, 250)  # away from 127.0.0.1 and from other test runs
    return [f"127.{base}.{random.randrange(1, 250)}.{i + 1}" for i in range(count)]


def costs(kit: Kit, namespace: str) -> dict[str, str | None]:
    return {
        p["metadata"]["name"]: (p["metadata"].get("annotations") or {}).get(COST)
        for p in engine_pods(kit, namespace, "agents")
    }


def test_agents_feed_capacity_degraded_and_least_loaded_scale_down(  # noqa: PLR0915
    operator: OperatorProcess, kit: Kit, namespace: str
) -> None:
    kit.apply_llmd(namespace, "agents", spec(replicas=3))
    ready = kit.wait_condition(namespace, "agents", "Ready", "True", timeout=60)
    planned = ready["status"]["plan"]["kvCacheTokens"]
    pods = engine_pods(kit, namespace, "agents")
    assert len(pods) == 3

    # The cold-start breakdown: every replica Ready, each step timed, and `-o wide` shows it.
    def started() -> dict[str, Any] | None:
        startup = ((kit.get_llmd(namespace, "agents") or {}).get("status") or {}).get("startup")
        ok = startup and startup["summary"].startswith("all ready; slowest")
        return startup if ok else None

    startup = wait_until(started, timeout=30, what="the startup summary")
    assert sorted(r["pod"] for r in startup["replicas"]) == [p["metadata"]["name"] for p in pods]
    for replica in startup["replicas"]:
        assert replica["phase"] == "Ready"
        steps = [replica[k] for k in ("scheduledAfterSeconds", "startedAfterSeconds")]
        assert all(isinstance(v, int) for v in steps), replica
        assert 0 <= steps[0] <= steps[1] <= replica["readyAfterSeconds"] < 60
    wide = kit.cluster.kubectl("get", "llmd", "agents", "-n", namespace, "-o", "wide").stdout
    assert "STARTUP" in wide
    assert "all ready; slowest" in wide
    with standin_agents(loopback_hosts(3)) as agents:
        busy, idle, light = agents
        busy.status = agent_status(running=8, waiting=4, kv_tokens=planned // 2)
        idle.status = agent_status(kv_tokens=planned)
        light.status = agent_status(running=2, kv_tokens=planned)
        for pod, agent in zip(pods, agents, strict=True):
            point_at(kit, pod, agent)
        names = [p["metadata"]["name"] for p in pods]

        # Actual capacity: the weakest replica's, with a Warning saying by how much.
        def short() -> dict[str, Any] | None:
            obj = kit.get_llmd(namespace, "agents")
            actual = ((obj or {}).get("status") or {}).get("plan", {}).get("actual")
            if actual and conds(obj)["CapacityPlanned"]["reason"] == "CapacityShortfall":
                return obj
            return None

        obj = wait_until(short, timeout=30, interval=0.5, what="the KV capacity shortfall")
        assert obj["status"]["plan"]["actual"]["kvCacheTokens"] == planned // 2
        message = conds(obj)["CapacityPlanned"]["message"]
        assert "50% below" in message
        assert conds(obj)["CapacityPlanned"]["status"] == "True"
        assert conds(obj)["Ready"]["status"] == "True"

        def shortfall_events() -> list[dict[str, Any]]:
            return [
                e
                for e in kit.kube.list("v1", "Event", namespace)
                if e["reason"] == "CapacityShortfall" and e["involvedObject"]["name"] == "agents"
            ]

        # The Event follows the status write that earned it: wait for it, then count.
        wait_until(lambda: shortfall_events() or None, timeout=10, what="the shortfall Event")
        warnings = shortfall_events()
        assert len(warnings) == 1
        assert warnings[0]["type"] == "Warning"

        # Deletion costs follow the load (running + waiting).
        wanted = {names[0]: "12", names[1]: "0", names[2]: "2"}
        wait_until(lambda: costs(kit, namespace) == wanted, timeout=30, what=f"costs {wanted}")
        # A load that only jitters is not rewritten.
        versions = {p["metadata"]["name"]: p["metadata"]["resourceVersion"] for p in pods}
        before = {
            p["metadata"]["name"]: p["metadata"]["resourceVersion"]
            for p in engine_pods(kit, namespace, "agents")
        }
        assert before != versions  # the annotation writes moved them
        busy.status = agent_status(running=8, waiting=5, kv_tokens=planned // 2)
        reads = busy.requests
        wait_until(lambda: busy.requests >= reads + 2, timeout=30, what="two more reads")
        after = {
            p["metadata"]["name"]: p["metadata"]["resourceVersion"]
            for p in engine_pods(kit, namespace, "agents")
        }
        assert after == before

        # A Ready pod whose deep probe fails: Degraded, naming it; and back.
        idle.status = agent_status(kv_tokens=planned, probe_ok=False, probe_error="timed out")

        def degraded(status: str) -> dict[str, Any] | None:
            found = conds(kit.get_llmd(namespace, "agents")).get("Degraded") or {}
            return found if found.get("status") == status else None

        found = wait_until(lambda: degraded("True"), timeout=30, what="Degraded=True")
        assert found["reason"] == "DeepProbeFailing"
        assert names[1] in found["message"]
        assert "timed out" in found["message"]
        idle.status = agent_status(kv_tokens=planned)
        wait_until(lambda: degraded("False"), timeout=30, what="Degraded=False")

        # Scale 3 → 1: the ReplicaSet removes the lowest-cost pods, so the busy one stays.
        kit.apply_llmd(namespace, "agents", spec(replicas=1))
        wait_until(
            lambda: (
                [p["metadata"]["name"] for p in engine_pods(kit, namespace, "agents")] == [names[0]]
            ),
            timeout=60,
            what="the scale-down to the busy pod",
        )
