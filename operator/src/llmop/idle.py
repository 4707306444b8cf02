"""Pure: when an LLMDeployment that may scale to zero (`spec.autoscaling.minReplicas: 0`) has
been idle long enough for the operator to take its engine workload to 0.

Inputs are what `llmop.idle_check` read: every ready router pod's `GET /llmop/activity` on its
admin port (`admin_port`; the router's in-flight and held requests per CR, and when the newest
one arrived), the agents' latest queue readings (`ParentMemory.fleet`), and since when the CR
has served (its Ready condition's transition time, so a model just rolled out or woken gets its
full idle period even when no request ever came). Anything unknown is "not idle": an unread
router pod or agent may be serving, and waking costs a model load.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llmop.agents import AgentReading
from llmop_router import contract
from llmop_router.contract import ActivityKey

Key = tuple[str, str]
"""(namespace, name) of an LLMDeployment."""


@dataclass(frozen=True)
class Activity:
    """One router pod's traffic for one CR."""

    in_flight: int = 0
    held: int = 0
    last_request_unix: float | None = None


@dataclass(frozen=True)
class Verdict:
    """Scale to zero now, or why not."""

    idle: bool
    reason: str


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    return max(0, int(value))


def admin_port(pod: Mapping[str, Any]) -> int:
    """Where a router pod serves `/llmop/activity`: its container port named `admin` (the
    chart's, whatever `router.adminPort` says), else the router's default admin port."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            number = port.get("containerPort")
            if port.get("name") == contract.ADMIN_PORT_NAME and isinstance(number, int):
                return number
    return contract.DEFAULT_ADMIN_PORT


def parse_activity(payload: Any) -> dict[Key, Activity] | None:
    """A router pod's `/llmop/activity` JSON by CR; None when it is not that shape."""
    if not isinstance(payload, Mapping) or not isinstance(payload.get(ActivityKey.MODELS), list):
        return None
    result: dict[Key, Activity] = {}
    for entry in payload[ActivityKey.MODELS]:
        if not isinstance(entry, Mapping):
            continue
        namespace, name = entry.get(ActivityKey.NAMESPACE), entry.get(ActivityKey.NAME)
        if not isinstance(namespace, str) or not isinstance(name, str):
            continue
        last = entry.get(ActivityKey.LAST_REQUEST_UNIX)
        result[(namespace, name)] = Activity(
            in_flight=_count(entry.get(ActivityKey.IN_FLIGHT)),
            held=_count(entry.get(ActivityKey.HELD)),
            last_request_unix=float(last) if isinstance(last, int | float) else None,
        )
    return result


def decide(
    key: Key,
    *,
    now_unix: float,
    idle_seconds: float,
    serving_since_unix: float | None,
    routers: Sequence[Mapping[Key, Activity] | None],
    readings: Sequence[AgentReading] | None,
) -> Verdict:
    """Whether `key` has been idle for `idle_seconds`: every router pod answered and holds
    nothing for it, every agent read says its engine is empty, and neither the newest request
    nor the time it started serving is within the idle period."""
    blocker = _blocker(serving_since_unix, routers, readings)
    if blocker is not None:
        return Verdict(False, blocker)
    assert serving_since_unix is not None
    last = serving_since_unix
    for report in routers:
        activity = (report or {}).get(key)
        if activity is None:
            continue
        if activity.in_flight or activity.held:
            return Verdict(False, "requests in flight or held at the router")
        if activity.last_request_unix is not None:
            last = max(last, activity.last_request_unix)
    quiet = now_unix - last
    if quiet < idle_seconds:
        return Verdict(False, f"last activity {quiet:.0f}s ago, idle after {idle_seconds:.0f}s")
    return Verdict(True, f"idle for {quiet:.0f}s (spec.autoscaling.scaleToZero.idleSeconds)")


def _blocker(
    serving_since_unix: float | None,
    routers: Sequence[Mapping[Key, Activity] | None],
    readings: Sequence[AgentReading] | None,
) -> str | None:
    """What is not known well enough to call the model idle, if anything."""
    if serving_since_unix is None:
        return "not serving: rolling out, waking or not ready"
    if not routers:
        return "no ready router pod to ask"
    if any(report is None for report in routers):
        return "a router pod did not answer"
    if not readings:
        return "the engines' queues are not read yet"
    if any(reading.load is None for reading in readings):
        return "an engine's queue is unknown"
    if any(reading.load for reading in readings):
        return "requests running or queued at the engines"
    return None
