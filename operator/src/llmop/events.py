"""Pure: which Kubernetes Events a status change deserves, and the Event manifest itself.

Only meaningful transitions produce an Event (became ready, started reconciling, stalled,
recovered, became degraded or stopped being so, KV capacity fell short of the plan), so
`kubectl describe llmd` tells the story without one Event per watch update: a Degraded reason
or message that changes while it stays True posts nothing (a crash loop's restart count would
otherwise post one Event per restart).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from llmop import conditions
from llmop.api.v1alpha1 import AdapterStatus, Condition
from llmop.conditions import format_time
from llmop.pods import REASON_GROUP_RESTART_LOOP

COMPONENT = "llmop"


@dataclass(frozen=True)
class EventSpec:
    """One Event to post on the LLMDeployment."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str


def _flipped(
    before: Sequence[Condition], after: Sequence[Condition], type_: str, to: str
) -> Condition | None:
    """The new condition when `type_` just became `to`, else None."""
    new = conditions.find(after, type_)
    if new is None or new.status != to:
        return None
    return None if conditions.status_of(before, type_) == to else new


def transition_events(before: Sequence[Condition], after: Sequence[Condition]) -> list[EventSpec]:
    """Events for the transitions from `before` to `after`."""
    events = []
    if (stalled := _flipped(before, after, conditions.STALLED, "True")) is not None:
        events.append(EventSpec("Warning", stalled.reason, stalled.message))
    elif (
        conditions.status_of(before, conditions.STALLED) == "True"
        and conditions.status_of(after, conditions.STALLED) == "False"
    ):
        events.append(EventSpec("Normal", "Recovered", "No longer stalled."))
    if (reconciling := _flipped(before, after, conditions.RECONCILING, "True")) is not None:
        events.append(EventSpec("Normal", reconciling.reason, reconciling.message))
    ready = _flipped(before, after, conditions.READY, "True")
    if ready is not None and ready.reason != conditions.REASON_SCALED_TO_ZERO:
        # Ready at zero replicas is announced once, by `_zero`'s ScaledToZero (a model created
        # at zero posted both, with the same message).
        events.append(EventSpec("Normal", "Ready", ready.message))
    if (degraded := _flipped(before, after, conditions.DEGRADED, "True")) is not None:
        events.append(EventSpec("Warning", degraded.reason, degraded.message))
    elif (
        conditions.status_of(before, conditions.DEGRADED) == "True"
        and conditions.status_of(after, conditions.DEGRADED) == "False"
    ):
        events.append(EventSpec("Normal", "NoLongerDegraded", "No replica problems seen."))
    events.extend(_restart_loop(before, after))
    events.extend(_shortfall(before, after))
    events.extend(_zero(before, after))
    return events


def _zero(before: Sequence[Condition], after: Sequence[Condition]) -> list[EventSpec]:
    """One Event each way across zero replicas: in (`ScaledToZero`), and out (`Waking`)."""
    old, new = conditions.find(before, conditions.READY), conditions.find(after, conditions.READY)
    was = old is not None and old.reason == conditions.REASON_SCALED_TO_ZERO
    now = new is not None and new.reason == conditions.REASON_SCALED_TO_ZERO
    if now and not was and new is not None:
        return [EventSpec("Normal", conditions.REASON_SCALED_TO_ZERO, new.message)]
    if was and not now and old is not None:
        return [EventSpec("Normal", "Waking", "Leaving zero replicas: a replica is starting.")]
    return []


def _restart_loop(before: Sequence[Condition], after: Sequence[Condition]) -> list[EventSpec]:
    """A Warning when a group's recreate loop is found while Degraded was already True for
    another reason (a recreate in progress): a loop is never silent."""
    new = conditions.find(after, conditions.DEGRADED)
    old = conditions.find(before, conditions.DEGRADED)
    if new is None or new.reason != REASON_GROUP_RESTART_LOOP or new.status != "True":
        return []
    if old is None or old.status != "True" or old.reason == REASON_GROUP_RESTART_LOOP:
        return []  # a flip to True posts its own Warning above
    return [EventSpec("Warning", new.reason, new.message)]


def _shortfall(before: Sequence[Condition], after: Sequence[Condition]) -> list[EventSpec]:
    """A Warning when CapacityPlanned starts reporting a KV capacity shortfall."""
    new = conditions.find(after, conditions.CAPACITY_PLANNED)
    old = conditions.find(before, conditions.CAPACITY_PLANNED)
    if new is None or new.reason != conditions.REASON_CAPACITY_SHORTFALL:
        return []
    if old is not None and old.reason == conditions.REASON_CAPACITY_SHORTFALL:
        return []
    return [EventSpec("Warning", new.reason, new.message)]


def adapter_events(
    before: Sequence[AdapterStatus] | None, after: Sequence[AdapterStatus] | None
) -> list[EventSpec]:
    """One Event per adapter whose phase changed (a new adapter's first phase included):
    Warning for Failed and Degraded, else Normal. Only the phase counts: a replica count or
    message moving inside one phase posts nothing."""
    old = {s.name: s.phase for s in before or ()}
    out = []
    for status in after or ():
        if old.get(status.name) == status.phase:
            continue
        kind: Literal["Normal", "Warning"] = (
            "Warning" if status.phase in ("Failed", "Degraded") else "Normal"
        )
        message = f"Adapter {status.name}: {status.phase}"
        message += f" ({status.message})" if status.message else "."
        out.append(EventSpec(kind, f"Adapter{status.phase}", message))
    return out


def render_event(
    involved: Mapping[str, Any], event: EventSpec, *, now: datetime, instance: str
) -> dict[str, Any]:
    """A core/v1 Event about `involved` (the LLMDeployment body)."""
    metadata = involved.get("metadata") or {}
    timestamp = format_time(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "generateName": f"{metadata.get('name')}.",
            "namespace": metadata.get("namespace"),
        },
        "involvedObject": {
            "apiVersion": involved.get("apiVersion"),
            "kind": involved.get("kind"),
            "name": metadata.get("name"),
            "namespace": metadata.get("namespace"),
            "uid": metadata.get("uid"),
            "resourceVersion": metadata.get("resourceVersion"),
        },
        "type": event.type,
        "reason": event.reason,
        "message": event.message[:1024],
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": instance,
        "firstTimestamp": timestamp,
        "lastTimestamp": timestamp,
        "count": 1,
    }
