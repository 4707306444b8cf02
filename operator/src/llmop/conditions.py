"""Pure: the LLMDeployment's condition types, reasons and transition-time bookkeeping.

Conditions follow metav1.Condition and kstatus: `Ready`, `Reconciling` and `Stalled` (abnormal-true
polarity for the last two) plus `CapacityPlanned` and `Degraded` (abnormal-true: serving, or
trying to, but something about the replicas needs a look). kstatus reads only the first three,
so `Degraded` never hides `Stalled` nor makes `Ready` lie. `lastTransitionTime` moves only when a
condition's status flips, never when only its reason or message changes; time is a parameter.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from llmop.api.v1alpha1 import Condition, ConditionStatus
from llmop_router import contract as router_contract

READY = router_contract.READY
RECONCILING = "Reconciling"
STALLED = "Stalled"
CAPACITY_PLANNED = "CapacityPlanned"
DEGRADED = "Degraded"
TYPES = (READY, RECONCILING, STALLED, CAPACITY_PLANNED, DEGRADED)
"""Every condition the operator writes, in the order it writes them."""

# Reasons (CamelCase, machine-readable). Planner reasons come from llmop.sizing.
REASON_ALL_REPLICAS_READY = "AllReplicasReady"
REASON_SCALED_TO_ZERO = router_contract.REASON_SCALED_TO_ZERO
REASON_CREATING = "Creating"
REASON_DOWNLOADING_MODEL = "DownloadingModel"
"""The engine children wait for the model cache to fill (spec.model.cache)."""
REASON_ROLLING_OUT = "RollingOut"
REASON_SCALING = "Scaling"
REASON_WAITING_FOR_REPLICAS = "WaitingForReplicas"
REASON_AS_EXPECTED = "AsExpected"
REASON_STALLED = "Stalled"
REASON_INVALID_SPEC = "InvalidSpec"
REASON_CHILD_REJECTED = "ChildRejected"
REASON_CHILD_NAME_CONFLICT = "ChildNameConflict"
"""Stalled=True: an object named like a child exists and is not this LLMDeployment's (left
untouched; the message names it, its owner and the fix)."""
REASON_INTERNAL_ERROR = "InternalError"
REASON_PROGRESS_DEADLINE_EXCEEDED = "ProgressDeadlineExceeded"
REASON_LWS_MISSING = "LeaderWorkerSetMissing"
"""Stalled=True: pipelineParallelSize > 1 and the cluster does not serve the LeaderWorkerSet API."""
REASON_SPEC_UNREADABLE = "NotPlanned"
"""CapacityPlanned=Unknown: the spec could not be read, so nothing was planned."""
REASON_CAPACITY_SHORTFALL = "CapacityShortfall"
"""CapacityPlanned: the engines report less KV cache than the plan promised."""
REASON_DEEP_PROBE_FAILING = "DeepProbeFailing"
"""Degraded=True: a pod is Ready but its agent's deep probe (a real completion) fails."""
REASON_AUTOSCALER_INACTIVE = "AutoscalerInactive"
"""Degraded=True: the HPA cannot compute or apply a replica count (e.g. no custom metrics API)."""
REASON_ROUTER_UNAVAILABLE = "RouterUnavailable"
"""Degraded=True: the model is routed, and the llmop router has no ready pod."""
REASON_ENGINE_KEY_BEHIND_GATEWAY = "EngineKeyBehindGateway"
"""Degraded=True: the model is routed through the router's gateway, which authenticates clients
itself and forwards no key, and its engine wants one (`spec.service.apiKeySecretRef`): the
router refuses every request for it."""
REASON_MODEL_NAME_CONFLICT = "ModelNameConflict"
"""Degraded=True: another LLMDeployment owns (or holds reserved) a model name this one claims;
the router does not route that name here (`llmop.name_owners`)."""
REASON_NAMESPACE_NOT_SERVED = "NamespaceNotServed"
"""Degraded=True: the model is routed, and its namespace is outside the chart's
router.servingNamespaces; the router does not route it."""
REASON_FALLBACK_NOT_ROUTED = "FallbackNotRouted"
"""Degraded=True: `spec.router.fallback` names a model no other routed LLMDeployment serves; the
router skips that fallback (`llmop.name_owners`)."""
REASON_INFERENCE_POOL_UNAVAILABLE = "InferencePoolUnavailable"
"""Degraded=True: spec.router.inferencePool is set, and the cluster does not serve the
InferencePool API (the Gateway API Inference Extension CRDs are not installed)."""


@dataclass(frozen=True)
class Observation:
    """What a condition should say now, before transition-time bookkeeping."""

    type: str
    status: ConditionStatus
    reason: str
    message: str = ""


def format_time(now: datetime) -> str:
    """RFC 3339 in UTC with second precision, as the API server stores metav1.Time."""
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: Any) -> datetime | None:
    """A metav1.Time from an object's body; None when absent or not a timestamp."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def find(conditions: Iterable[Condition], type_: str) -> Condition | None:
    """The condition of `type_`, if present."""
    return next((c for c in conditions if c.type == type_), None)


def status_of(conditions: Iterable[Condition], type_: str) -> ConditionStatus | None:
    """The status of condition `type_`, None when absent."""
    found = find(conditions, type_)
    return None if found is None else found.status


def merge(
    previous: Sequence[Condition],
    observations: Sequence[Observation],
    *,
    generation: int | None,
    now: datetime,
) -> list[Condition]:
    """The full conditions list: one entry per observation, keeping `lastTransitionTime` when
    the status is unchanged. Types not observed are dropped (the operator owns the list)."""
    merged = []
    for observation in observations:
        before = find(previous, observation.type)
        unchanged = before is not None and before.status == observation.status
        merged.append(
            Condition(
                type=observation.type,
                status=observation.status,
                observed_generation=generation,
                last_transition_time=(
                    before.last_transition_time
                    if unchanged and before is not None
                    else format_time(now)
                ),
                reason=observation.reason,
                message=observation.message,
            )
        )
    return merged
