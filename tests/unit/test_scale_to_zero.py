"""Scale to zero in the operator (pure parts): when a model counts as idle, what its status and
Events say across zero, the HPA floor it keeps, and the CRs it never touches."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from llmop import conditions, events, idle_check, kinds
from llmop.agents import AgentReading
from llmop.api.v1alpha1 import LLMDeployment, LLMDeploymentStatus
from llmop.idle import Activity, decide, parse_activity
from llmop.render.autoscaling import render_hpa
from llmop.router_view import RouterRef, RouterView
from llmop.sizing import plan_for
from llmop.status import Observed, derive_status
from support.manifests import workload_status

KEY = ("ns", "m")
T0 = 1_000_000.0
EMPTY = (AgentReading(pod="p", running=0, waiting=0),)
ROUTER = RouterView(RouterRef("llmop-system", "llmop-router", 8080), ready=True)


@pytest.mark.parametrize(
    ("routers", "readings", "since", "now", "expected"),
    [
        ([{}], EMPTY, T0, T0 + 300, (True, "idle for 300s")),
        ([{}], EMPTY, T0, T0 + 299, (False, "last activity 299s ago")),
        # The newest request at any router pod restarts the idle period.
        ([{}, {KEY: Activity(last_request_unix=T0 + 200)}], EMPTY, T0, T0 + 300, (False, "100s")),
        ([{KEY: Activity(held=1)}], EMPTY, T0, T0 + 999, (False, "held at the router")),
        ([{KEY: Activity(in_flight=2)}], EMPTY, T0, T0 + 999, (False, "in flight")),
        # Unknown is not idle: an unanswered router pod, no router pod, unread agents.
        ([{}, None], EMPTY, T0, T0 + 999, (False, "did not answer")),
        ([], EMPTY, T0, T0 + 999, (False, "no ready router pod")),
        ([{}], None, T0, T0 + 999, (False, "not read yet")),
        ([{}], (AgentReading(pod="p"),), T0, T0 + 999, (False, "unknown")),
        ([{}], (AgentReading(pod="p", running=0, waiting=1),), T0, T0 + 999, (False, "queued")),
        ([{}], EMPTY, None, T0 + 999, (False, "not serving")),
    ],
)
def test_idle_only_when_everything_is_known_quiet(
    routers: list[dict[tuple[str, str], Activity] | None],
    readings: tuple[AgentReading, ...] | None,
    since: float | None,
    now: float,
    expected: tuple[bool, str],
) -> None:
    idle, why = expected
    verdict = decide(
        KEY,
        now_unix=now,
        idle_seconds=300,
        serving_since_unix=since,
        routers=routers,
        readings=readings,
    )
    assert verdict.idle is idle
    assert why in verdict.reason


def test_router_activity_is_parsed_defensively() -> None:
    payload = {
        "models": [
            {"namespace": "ns", "name": "m", "inFlight": 2, "held": 1, "lastRequestUnix": 5.5},
            {"namespace": "ns", "name": "n", "inFlight": True, "held": -3},
            {"name": "no-namespace"},
            "junk",
        ]
    }
    assert parse_activity(payload) == {
        ("ns", "m"): Activity(in_flight=2, held=1, last_request_unix=5.5),
        ("ns", "n"): Activity(),
    }
    assert parse_activity({"models": "x"}) is None
    assert parse_activity(None) is None


def body(autoscaling: dict[str, Any] | None, ready_reason: str = "AllReplicasReady") -> Any:
    spec: dict[str, Any] = {"model": {"name": "acme/m"}}
    if autoscaling is not None:
        spec["autoscaling"] = autoscaling
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": ready_reason,
        "lastTransitionTime": "2026-01-02T03:04:05Z",
    }
    return {"spec": spec, "status": {"conditions": [ready]}}


def test_only_crs_with_min_replicas_0_are_candidates_and_only_while_serving() -> None:
    parents = {
        ("ns", "zero"): [body({"minReplicas": 0, "maxReplicas": 2})],
        ("ns", "one"): [body({"minReplicas": 1, "maxReplicas": 2})],
        ("ns", "fixed"): [body(None)],
    }
    assert set(idle_check.candidates(parents)) == {("ns", "zero")}
    since = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC).timestamp()
    assert idle_check.serving_since(body({"minReplicas": 0})) == since
    assert idle_check.serving_since(body({"minReplicas": 0}, "ScaledToZero")) is None


def ld(autoscaling: dict[str, Any]) -> LLMDeployment:
    return LLMDeployment.model_validate(
        {
            "metadata": {"name": "m", "namespace": "ns", "uid": "u", "generation": 1},
            "spec": {
                "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
                "engine": {"backend": "simulator"},
                "autoscaling": autoscaling,
            },
        }
    )


def test_the_hpa_keeps_one_replica_while_the_spec_allows_zero() -> None:
    hpa = render_hpa(ld({"minReplicas": 0, "maxReplicas": 3}))
    assert hpa is not None
    assert hpa["spec"]["minReplicas"] == 1
    assert ld({"minReplicas": 0, "maxReplicas": 3}).spec.autoscaling.zero.idle_seconds == 300  # type: ignore[union-attr]


def derive(
    resource: LLMDeployment,
    dep: dict[str, Any],
    previous: LLMDeploymentStatus,
    now: datetime,
    router: RouterView | None = ROUTER,
) -> LLMDeploymentStatus:
    observed = Observed(
        "m",
        "ns",
        generation=1,
        previous=previous,
        children={kinds.DEPLOYMENT: dep},
        router=router,
    )
    return derive_status(
        observed, resource.spec, plan_for(resource.spec), template_hash=None, now=now
    )


def ready_of(status: LLMDeploymentStatus) -> tuple[str, str]:
    found = conditions.find(status.conditions, conditions.READY)
    assert found is not None
    return found.status, found.reason


def test_going_to_zero_and_waking_are_stamped_and_announced() -> None:
    resource = ld({"minReplicas": 0, "maxReplicas": 3})
    t = datetime(2026, 1, 2, 3, 0, 0, tzinfo=UTC)
    serving = derive(resource, workload_status(1, 1), LLMDeploymentStatus(), t)
    assert ready_of(serving) == ("True", "AllReplicasReady")
    assert serving.scale_to_zero is None

    at_zero = derive(resource, workload_status(0, 0), serving, t + timedelta(seconds=10))
    assert ready_of(at_zero) == ("True", "ScaledToZero")
    assert at_zero.scale_to_zero is not None
    assert at_zero.scale_to_zero.last_scaled_to_zero_time == "2026-01-02T03:00:10Z"
    went = events.transition_events(serving.conditions, at_zero.conditions)
    assert ("Normal", "ScaledToZero") in [(e.type, e.reason) for e in went]

    waking = derive(resource, workload_status(1, 0), at_zero, t + timedelta(seconds=20))
    assert ready_of(waking)[0] == "False"
    assert waking.scale_to_zero is not None
    assert waking.scale_to_zero.last_wake_time == "2026-01-02T03:00:20Z"
    assert waking.scale_to_zero.last_wake_seconds is None
    woke = events.transition_events(at_zero.conditions, waking.conditions)
    assert ("Normal", "Waking") in [(e.type, e.reason) for e in woke]

    still = derive(resource, workload_status(1, 0), waking, t + timedelta(seconds=25))
    assert still.scale_to_zero == waking.scale_to_zero
    served = derive(resource, workload_status(1, 1), still, t + timedelta(seconds=32.5))
    assert ready_of(served) == ("True", "AllReplicasReady")
    assert served.scale_to_zero is not None
    assert served.scale_to_zero.last_wake_seconds == 12.5
    assert served.scale_to_zero.last_scaled_to_zero_time == "2026-01-02T03:00:10Z"


def test_a_wake_first_seen_with_its_replica_ready_is_recorded_in_one_derivation() -> None:
    """One pass that sees the scale back to 1 and the ready replica together (the triggers of
    a burst merged on the queue) records the whole wake, 0 s after it was seen: deriving again
    changes nothing, so no later trigger is needed to finish the record."""
    resource = ld({"minReplicas": 0, "maxReplicas": 3})
    t = datetime(2026, 1, 2, 3, 0, 0, tzinfo=UTC)
    serving = derive(resource, workload_status(1, 1), LLMDeploymentStatus(), t)
    at_zero = derive(resource, workload_status(0, 0), serving, t + timedelta(seconds=10))
    woke = derive(resource, workload_status(1, 1), at_zero, t + timedelta(seconds=20))
    assert ready_of(woke) == ("True", "AllReplicasReady")
    assert woke.scale_to_zero is not None
    assert woke.scale_to_zero.last_wake_time == "2026-01-02T03:00:20Z"
    assert woke.scale_to_zero.last_wake_seconds == 0.0
    again = derive(resource, workload_status(1, 1), woke, t + timedelta(seconds=21))
    assert again.scale_to_zero == woke.scale_to_zero


def test_min_replicas_0_without_a_router_is_stalled_with_the_fix() -> None:
    resource = ld({"minReplicas": 0, "maxReplicas": 3})
    status = derive(resource, workload_status(1, 1), LLMDeploymentStatus(), datetime.now(UTC), None)
    stalled = conditions.find(status.conditions, conditions.STALLED)
    assert stalled is not None
    assert (stalled.status, stalled.reason) == ("True", "RouterUnavailable")
    assert "router.enabled=true" in stalled.message
    assert "minReplicas to 1" in stalled.message


def test_a_fixed_zero_has_no_scale_to_zero_history() -> None:
    fixed = LLMDeployment.model_validate(
        {
            "metadata": {"name": "m", "namespace": "ns"},
            "spec": {
                "model": {"name": "acme/m"},
                "engine": {"backend": "simulator"},
                "replicas": 0,
            },
        }
    )
    status = derive(fixed, workload_status(0, 0), LLMDeploymentStatus(), datetime.now(UTC), None)
    assert ready_of(status) == ("True", "ScaledToZero")
    assert status.scale_to_zero is None
