"""The Degraded condition, status.plan.actual and their Events: derived from pod objects shaped
like the kubelet's and from agent readings shaped like `llmop_engine.agent.Agent.status()`."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from llmop import conditions, events, kinds
from llmop.agents import AgentReading, parse_status
from llmop.api.v1alpha1 import LLMDeployment, LLMDeploymentStatus
from llmop.pods import RECENT_RESTART, degraded_issue
from llmop.sizing import plan_for
from llmop.status import Observed, derive_status

NOW = datetime(2026, 11, 23, 12, 0, 0, tzinfo=UTC)
HASH = "abc123"
ROLLED_OUT = {
    "metadata": {"generation": 3, "annotations": {"serving.llmop.dev/template-hash": HASH}},
    "spec": {"replicas": 2},
    "status": {
        "observedGeneration": 3,
        "replicas": 2,
        "readyReplicas": 2,
        "updatedReplicas": 2,
        "availableReplicas": 2,
    },
}


def ld() -> LLMDeployment:
    return LLMDeployment.model_validate(
        {
            "metadata": {"name": "x", "namespace": "ns", "uid": "u", "generation": 4},
            "spec": {
                "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
                "engine": {"backend": "simulator"},
                "resources": {"gpus": 1, "gpuProduct": "NVIDIA-H100-80GB-HBM3"},
                "replicas": 2,
            },
        }
    )


def time(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(
    name: str,
    *,
    ready: bool = True,
    restarts: int = 0,
    last: dict[str, Any] | None = None,
    waiting: str | None = None,
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "engine",
        "image": "ghcr.io/llmop/engine-sim:0.1.0",
        "ready": ready,
        "restartCount": restarts,
        "state": {"waiting": {"reason": waiting}} if waiting else {"running": {}},
    }
    if last is not None:
        container["lastState"] = {"terminated": last}
    return {
        "metadata": {"name": name, "namespace": "ns"},
        "status": {"conditions": [], "containerStatuses": [container]},
    }


def oom(at: datetime) -> dict[str, Any]:
    return {"reason": "OOMKilled", "exitCode": 137, "finishedAt": time(at)}


def derive(
    pods: list[dict[str, Any]],
    fleet: list[AgentReading] | None = None,
    previous: LLMDeploymentStatus | None = None,
    now: datetime = NOW,
) -> LLMDeploymentStatus:
    resource = ld()
    observed = Observed(
        "x",
        "ns",
        generation=4,
        previous=previous or LLMDeploymentStatus(),
        children={kinds.DEPLOYMENT: ROLLED_OUT},
        pods=pods,
        fleet=fleet,
    )
    return derive_status(
        observed, resource.spec, plan_for(resource.spec), template_hash=HASH, now=now
    )


def cond(status: LLMDeploymentStatus, type_: str) -> tuple[str, str, str]:
    found = conditions.find(status.conditions, type_)
    assert found is not None
    return found.status, found.reason, found.message


def agent(name: str, **fields: Any) -> AgentReading:
    payload: dict[str, Any] = {
        "phase": "ready",
        "ready": True,
        "running": 0,
        "queueDepth": 0,
        "kvCacheCapacityTokens": None,
        "lastDeepProbe": {"ok": True, "latencySeconds": 0.01, "ageSeconds": 1.0, "error": None},
        **fields,
    }
    return parse_status(name, payload)


def test_healthy_fleet_is_not_degraded_and_ready_stays_true() -> None:
    status = derive([pod("x-1"), pod("x-2")], [agent("x-1"), agent("x-2")])
    assert cond(status, "Ready")[0] == "True"
    assert cond(status, "Degraded")[:2] == ("False", "AsExpected")


def test_recent_oom_kill_of_a_ready_pod_is_degraded_while_ready_stays_true() -> None:
    restarted = pod("x-2", restarts=3, last=oom(NOW - timedelta(minutes=2)))
    status = derive([pod("x-1"), restarted])
    assert cond(status, "Ready")[:2] == ("True", "AllReplicasReady")
    state, reason, message = cond(status, "Degraded")
    assert (state, reason) == ("True", "ContainerRestarting")
    assert "x-2" in message
    assert "3 times" in message
    assert "OOMKilled (code 137)" in message
    assert "spec.resources.memory" in message


def test_an_old_restart_no_longer_degrades() -> None:
    restarted = pod("x-2", restarts=1, last=oom(NOW - RECENT_RESTART - timedelta(seconds=1)))
    assert cond(derive([pod("x-1"), restarted]), "Degraded")[0] == "False"


@pytest.mark.parametrize(
    ("code", "words"),
    [(137, "liveness probe"), (143, "SIGTERM"), (1, "kubectl logs --previous")],
)
def test_restart_reasons_say_what_to_do(code: int, words: str) -> None:
    last = {"reason": "Error", "exitCode": code, "finishedAt": time(NOW - timedelta(seconds=30))}
    issue = degraded_issue([pod("x-1", restarts=1, last=last)], NOW)
    assert issue is not None
    assert f"Error (code {code})" in issue.message
    assert words in issue.message


def test_crash_loop_outranks_a_recent_restart_elsewhere() -> None:
    last = oom(NOW - timedelta(seconds=30))
    pods = [
        pod("x-1", restarts=1, last=last),
        pod("x-2", ready=False, restarts=5, last=last, waiting="CrashLoopBackOff"),
    ]
    issue = degraded_issue(pods, NOW)
    assert issue is not None
    assert (issue.reason, issue.pod) == ("CrashLoopBackOff", "x-2")


def test_pods_being_deleted_do_not_degrade() -> None:
    gone = pod("x-2", ready=False, waiting="ImagePullBackOff")
    gone["metadata"]["deletionTimestamp"] = time(NOW)
    assert degraded_issue([gone], NOW) is None


def test_image_pull_failure_degrades_and_names_the_image() -> None:
    status = derive([pod("x-1"), pod("x-2", ready=False, waiting="ImagePullBackOff")])
    state, reason, message = cond(status, "Degraded")
    assert (state, reason) == ("True", "ImagePullBackOff")
    assert "ghcr.io/llmop/engine-sim:0.1.0" in message


def test_ready_pod_with_failing_deep_probe_is_degraded() -> None:
    failing = agent(
        "x-2",
        lastDeepProbe={"ok": False, "latencySeconds": 5.0, "ageSeconds": 2, "error": "timeout"},
    )
    status = derive([pod("x-1"), pod("x-2")], [agent("x-1"), failing])
    assert cond(status, "Ready")[0] == "True"
    state, reason, message = cond(status, "Degraded")
    assert (state, reason) == ("True", "DeepProbeFailing")
    assert "x-2 is Ready but" in message
    assert "timeout" in message


def test_deep_probe_failing_on_a_pod_already_out_of_the_service_still_degrades() -> None:
    failing = agent("x-2", lastDeepProbe={"ok": False, "error": "timeout"})
    status = derive([pod("x-1"), pod("x-2", ready=False)], [agent("x-1"), failing])
    state, reason, message = cond(status, "Degraded")
    assert (state, reason) == ("True", "DeepProbeFailing")
    assert "x-2 is out of the Service" in message


def test_before_the_first_agent_read_the_previous_verdicts_stand() -> None:
    failing = agent("x-2", lastDeepProbe={"ok": False, "error": "timeout"})
    reads = [agent("x-1", kvCacheCapacityTokens=1000), failing]
    before = derive([pod("x-1"), pod("x-2")], reads)
    restarted = derive([pod("x-1"), pod("x-2")], None, previous=before, now=NOW + timedelta(1))
    assert cond(restarted, "Degraded") == cond(before, "Degraded")
    assert restarted.plan is not None
    assert before.plan is not None
    assert restarted.plan.actual == before.plan.actual
    # Once read again, a recovered probe clears it.
    recovered = derive([pod("x-1"), pod("x-2")], [agent("x-1"), agent("x-2")], previous=before)
    assert cond(recovered, "Degraded")[0] == "False"


def test_actual_capacity_is_the_smallest_a_ready_engine_reports() -> None:
    reads = [
        agent("x-1", kvCacheCapacityTokens=900_000),
        agent("x-2", kvCacheCapacityTokens=880_000),
        agent("x-3", ready=False, kvCacheCapacityTokens=10),
    ]
    status = derive([pod("x-1"), pod("x-2")], reads)
    assert status.plan is not None
    assert status.plan.actual is not None
    assert status.plan.actual.kv_cache_tokens == 880_000


def test_actual_capacity_is_shown_even_without_a_plan() -> None:
    resource = LLMDeployment.model_validate(
        {
            "metadata": {"name": "x", "namespace": "ns", "uid": "u", "generation": 4},
            "spec": {
                "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
                "engine": {"backend": "simulator"},
                "resources": {"gpus": 1},  # no gpuProduct: GPU memory unknown, no plan
            },
        }
    )
    common: dict[str, Any] = {
        "generation": 4,
        "children": {kinds.DEPLOYMENT: ROLLED_OUT},
        "pods": [pod("x-1")],
    }
    sizing = plan_for(resource.spec)

    def derived(observed: Observed) -> LLMDeploymentStatus:
        return derive_status(observed, resource.spec, sizing, template_hash=HASH, now=NOW)

    assert derived(Observed("x", "ns", **common)).plan is None
    read = derived(
        Observed("x", "ns", **common, fleet=[agent("x-1", kvCacheCapacityTokens=262144)])
    )
    assert read.plan is not None
    assert read.plan.actual is not None
    assert read.plan.actual.kv_cache_tokens == 262144
    assert read.plan.kv_cache_tokens is None
    assert cond(read, "CapacityPlanned")[0] == "Unknown"


def test_shortfall_beyond_the_margin_says_by_how_much() -> None:
    planned = derive([pod("x-1")]).plan
    assert planned is not None
    assert planned.kv_cache_tokens
    short = planned.kv_cache_tokens // 2
    status = derive([pod("x-1")], [agent("x-1", kvCacheCapacityTokens=short)])
    state, reason, message = cond(status, "CapacityPlanned")
    assert (state, reason) == ("True", "CapacityShortfall")
    assert "50% below" in message
    assert f"{planned.kv_cache_tokens - short} tokens short" in message
    # Within the margin: the planner's own reason stays.
    close = int(planned.kv_cache_tokens * 0.95)
    status = derive([pod("x-1")], [agent("x-1", kvCacheCapacityTokens=close)])
    assert cond(status, "CapacityPlanned")[1] != "CapacityShortfall"


def test_events_on_transitions_only_never_per_restart() -> None:
    healthy = derive([pod("x-1")])
    first = derive([pod("x-1", restarts=1, last=oom(NOW))], previous=healthy)
    again = derive([pod("x-1", restarts=2, last=oom(NOW))], previous=first)
    recovered = derive([pod("x-1", restarts=2, last=oom(NOW - timedelta(hours=1)))], None, first)
    kinds = [
        [(e.type, e.reason) for e in events.transition_events(a.conditions, b.conditions)]
        for a, b in [(healthy, first), (first, again), (again, recovered)]
    ]
    assert kinds == [[("Warning", "ContainerRestarting")], [], [("Normal", "NoLongerDegraded")]]


def test_shortfall_posts_one_warning() -> None:
    planned = derive([pod("x-1")])
    assert planned.plan is not None
    assert planned.plan.kv_cache_tokens
    reads = [agent("x-1", kvCacheCapacityTokens=planned.plan.kv_cache_tokens // 3)]
    short = derive([pod("x-1")], reads, previous=planned)
    still = derive([pod("x-1")], reads, previous=short)
    first = events.transition_events(planned.conditions, short.conditions)
    assert [(e.type, e.reason) for e in first] == [("Warning", "CapacityShortfall")]
    assert events.transition_events(short.conditions, still.conditions) == []
