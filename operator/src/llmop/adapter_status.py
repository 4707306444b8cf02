"""Pure: `status.adapters`, `status.adaptersSummary` and the `AdaptersReady` condition, from the
engine agents' reports of their adapters (`/status` `adapters[]`) and the adapters the operator
refused itself (`llmop.render.adapters.refusals`).

Every adapter is meant to be on every ready replica. An adapter is Ready when each ready replica
serves it, Degraded when some serve it and another refused it, Failed when it is refused (by the
operator, or by every replica that reported it, with the engine's own words), Loading while a
replica fetches or loads it, else Pending. A refused adapter never touches the base model's
Ready: it has its own condition. Per-pod detail stays out of the status (only the first failing
pod is named), so its size does not grow with the replica count.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from llmop.agents import PodAdapter
from llmop.api.v1alpha1 import AdapterPhase, AdapterRevision, AdapterStatus, LLMDeploymentSpec
from llmop.conditions import Observation
from llmop.render.adapters import Refusal, lora_slots

ADAPTERS_READY = "AdaptersReady"
REASON_ALL_ADAPTERS_READY = "AllAdaptersReady"
REASON_ADAPTERS_LOADING = "AdaptersLoading"
REASON_ADAPTER_FAILED = "AdapterFailed"
REASON_RANK_TOO_HIGH = "AdapterRankTooHigh"
REASON_NOT_FOUND = "AdapterNotFound"

_RANK = re.compile(r"LoRA rank (\d+) is greater than max_lora_rank (\d+)")


@dataclass(frozen=True)
class PodReport:
    """A pod's adapters (None: not reported yet)."""

    pod: str
    adapters: tuple[PodAdapter, ...] | None


def explain_failure(spec: LLMDeploymentSpec, name: str, message: str | None) -> tuple[str, str]:
    """(reason, message with the fix) for an adapter an engine refused."""
    text = message or "the engine refused the adapter"
    rank = _RANK.search(text)
    if rank is not None:
        slots = lora_slots(spec)
        cap = slots.max_lora_rank if slots is not None else rank.group(2)
        return REASON_RANK_TOO_HIGH, (
            f"adapter {name}: rank {rank.group(1)} is above spec.engine.lora.maxLoraRank "
            f"({cap}): raise spec.engine.lora.maxLoraRank to {_allowed_rank(int(rank.group(1)))} "
            f"(restarts the engine pods) or use a lower-rank adapter. Engine: {text}"
        )
    if "No adapter found" in text or "not found" in text.lower() or "404" in text:
        return REASON_NOT_FOUND, (
            f"adapter {name}: not found at its source: check spec.adapters[].source (and "
            f"revision). Engine: {text}"
        )
    return REASON_ADAPTER_FAILED, f"adapter {name}: {text}"


def _allowed_rank(rank: int) -> int:
    return next((r for r in (8, 16, 32, 64, 128, 256) if r >= rank), 256)


def adapter_statuses(
    spec: LLMDeploymentSpec,
    refused: Mapping[str, Refusal],
    reports: Sequence[PodReport],
    ready_pods: Collection[str],
) -> list[AdapterStatus] | None:
    """One entry per declared adapter, in spec order (None without adapters)."""
    if not spec.adapters:
        return None
    ready_reports = [r for r in reports if r.pod in ready_pods]
    replicas = len(ready_pods)
    out = []
    for adapter in spec.adapters:
        seen = sorted(
            ((r.pod, a) for r in reports for a in r.adapters or () if a.name == adapter.name),
            key=lambda pair: pair[0],
        )
        rank = next((a.rank for _, a in seen if a.rank is not None), None)
        revision = adapter.revision or next((a.revision for _, a in seen if a.revision), None)
        serving = sum(
            1
            for r in ready_reports
            for a in r.adapters or ()
            if a.name == adapter.name and a.phase == "Loaded"
        )
        refusal = refused.get(adapter.name)
        phase: AdapterPhase
        message: str | None = None
        failed = [(pod, a) for pod, a in seen if a.phase == "Failed"]
        if refusal is not None:
            phase, message = "Failed", f"{refusal.reason}: {refusal.message}"
        elif failed:
            pod, first = failed[0]
            reason, text = explain_failure(spec, adapter.name, first.message)
            phase = "Degraded" if serving > 0 else "Failed"
            message = f"{reason}: {text} (pod {pod}"
            message += f" and {len(failed) - 1} more)" if len(failed) > 1 else ")"
        elif replicas > 0 and serving == replicas:
            phase = "Ready"
        elif any(a.phase in ("Fetching", "Loading", "Loaded") for _, a in seen):
            phase = "Loading"
            waiting = next((a.message for _, a in seen if a.message), None)
            message = f"{serving}/{replicas} ready replicas serve it" + (
                f"; {waiting}" if waiting else ""
            )
        else:
            phase = "Pending"
            waiting = next((a.message for _, a in seen if a.message), None)
            message = waiting or (
                "waiting for a ready replica" if replicas == 0 else "not loaded by any replica yet"
            )
        out.append(
            AdapterStatus(
                name=adapter.name,
                revision=revision,
                rank=rank,
                phase=phase,
                ready_replicas=serving,
                replicas=replicas,
                message=message[:4096] if message else None,
            )
        )
    return out


def routing_revisions(
    statuses: Sequence[AdapterStatus] | None,
    reports: Sequence[PodReport],
    ready_pods: Collection[str],
) -> list[AdapterRevision] | None:
    """`status.routing.adapterRevisions`: each declared adapter's revision, settled when every
    ready replica reports it Loaded at that revision (Ready, and no replica on another one).
    A new revision is written here in the pass that writes the pods' ConfigMap, so the router
    knows of it before an agent can have loaded it (docs/router.md, "Pinned to a model
    revision", says the one window left)."""
    if statuses is None:
        return None
    out = []
    for status in statuses:
        loaded = [
            a.revision
            for r in reports
            if r.pod in ready_pods
            for a in r.adapters or ()
            if a.name == status.name and a.phase == "Loaded"
        ]
        settled = status.phase == "Ready" and all(r == status.revision for r in loaded)
        out.append(AdapterRevision(name=status.name, revision=status.revision, settled=settled))
    return out


def summary(statuses: Sequence[AdapterStatus] | None) -> str | None:
    """`ready/declared` for the printer column."""
    if statuses is None:
        return None
    return f"{sum(1 for s in statuses if s.phase == 'Ready')}/{len(statuses)}"


def adapters_ready(statuses: Sequence[AdapterStatus] | None) -> Observation | None:
    """The AdaptersReady condition (None without adapters: the condition is then dropped)."""
    if statuses is None:
        return None
    failing = [s for s in statuses if s.phase in ("Failed", "Degraded")]
    if failing:
        first = failing[0]
        reason = (first.message or REASON_ADAPTER_FAILED).partition(":")[0]
        if not reason.isidentifier():
            reason = REASON_ADAPTER_FAILED
        names = ", ".join(s.name for s in failing)
        return Observation(
            ADAPTERS_READY, "False", reason, f"Failing: {names}. {first.message or ''}".strip()
        )
    waiting = [s for s in statuses if s.phase != "Ready"]
    if waiting:
        names = ", ".join(s.name for s in waiting)
        return Observation(
            ADAPTERS_READY,
            "False",
            REASON_ADAPTERS_LOADING,
            f"Not yet on every ready replica: {names}.",
        )
    return Observation(
        ADAPTERS_READY,
        "True",
        REASON_ALL_ADAPTERS_READY,
        f"{len(statuses)}/{len(statuses)} adapters on every ready replica.",
    )
