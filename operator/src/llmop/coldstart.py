"""Pure: where each engine pod's cold start goes, from the pod's own timestamps and its agent.

A GPU replica can take minutes to serve; a person wants to know which part: waiting for a node
(PodScheduled), pulling a multi-GiB image and creating the container (the container's
`running.startedAt`), downloading the weights or loading them (the agent's phase), and Ready
(the Ready condition). Every figure is a difference of timestamps the API server stores, never
of "now", so the breakdown only changes when a pod does (an unchanged fleet writes nothing).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, cast

from llmop.agents import AgentReading
from llmop.api.v1alpha1 import (
    CompileCacheOutcome,
    EngineStartPhases,
    ReplicaStartup,
    StartupPhase,
    StartupStatus,
)
from llmop.conditions import parse_time

MAX_REPLICAS = 10
"""Replicas listed in the status: the ones not ready, then the newest."""
_AGENT_PHASES: dict[str, StartupPhase] = {"downloading": "Downloading", "loading": "Loading"}
ENGINE_PHASE_FIELDS: dict[str, str] = {
    "agentStart": "agent_start_seconds",
    "prepare": "prepare_seconds",
    "engineStart": "engine_start_seconds",
    "weights": "weights_seconds",
    "compile": "compile_seconds",
    "warmup": "warmup_seconds",
    "apiStart": "api_start_seconds",
    "firstProbe": "first_probe_seconds",
    "untraced": "untraced_seconds",
}
"""The agent's phase names (`llmop_engine.contract.STARTUP_PHASES`) → `EngineStartPhases`."""
SUMMARY_PHASES = 2
"""Engine phases named in the summary: the longest ones, what a person would act on."""


def _after(start: datetime | None, end: Any) -> int | None:
    moment = parse_time(end)
    if start is None or moment is None:
        return None
    return max(0, round((moment - start).total_seconds()))


def _condition(pod: Mapping[str, Any], type_: str) -> Mapping[str, Any]:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == type_:
            return dict(condition)
    return {}


def _engine_container(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return dict(statuses[0]) if statuses else {}


def _downloaded(reading: AgentReading | None, known: ReplicaStartup | None) -> int | None:
    if reading is not None:
        return reading.model_cache_bytes
    return None if known is None else known.downloaded_bytes


def _compile_cache(
    reading: AgentReading | None, known: ReplicaStartup | None
) -> CompileCacheOutcome | None:
    if reading is not None and reading.compile_cache is not None:
        return cast(CompileCacheOutcome, reading.compile_cache)
    return None if known is None else known.compile_cache


def _engine(reading: AgentReading | None, known: ReplicaStartup | None) -> EngineStartPhases | None:
    if reading is None or reading.start_phases is None:
        return None if known is None else known.engine
    fields = {
        ENGINE_PHASE_FIELDS[name]: seconds
        for name, seconds in reading.start_phases.items()
        if name in ENGINE_PHASE_FIELDS
    }
    return EngineStartPhases(**fields) if fields else None


def replica_startup(
    pod: Mapping[str, Any], reading: AgentReading | None = None, known: ReplicaStartup | None = None
) -> ReplicaStartup | None:
    """One pod's breakdown; None for a pod without a creation time or one being deleted.
    `known` is what the previous status said of it: its phase and download bytes are kept while
    no reading says otherwise."""
    metadata = pod.get("metadata") or {}
    created = parse_time(metadata.get("creationTimestamp"))
    if created is None or metadata.get("deletionTimestamp"):
        return None
    scheduled = _condition(pod, "PodScheduled")
    ready = _condition(pod, "Ready")
    running = (_engine_container(pod).get("state") or {}).get("running") or {}
    phase: StartupPhase
    if ready.get("status") == "True":
        phase = "Ready"
    elif scheduled.get("status") != "True":
        phase = "Scheduling"
    elif not running:
        phase = "PullingImage"
    elif reading is not None:
        phase = _AGENT_PHASES.get(str(reading.phase).lower(), "Starting")
    else:
        phase = _AGENT_PHASES.get(str(known and known.phase).lower(), "Starting")
    return ReplicaStartup(
        pod=str(metadata.get("name", "?")),
        phase=phase,
        created=str(metadata["creationTimestamp"]),
        scheduled_after_seconds=(
            _after(created, scheduled.get("lastTransitionTime"))
            if scheduled.get("status") == "True"
            else None
        ),
        started_after_seconds=_after(created, running.get("startedAt")),
        ready_after_seconds=(
            _after(created, ready.get("lastTransitionTime")) if phase == "Ready" else None
        ),
        downloaded_bytes=None if phase != "Downloading" else _downloaded(reading, known),
        compile_cache=_compile_cache(reading, known),
        engine=_engine(reading, known),
    )


def _summary(replicas: Sequence[ReplicaStartup]) -> str:
    starting = [r for r in replicas if r.phase != "Ready"]
    if starting:
        # The oldest pod still starting is the one holding the deployment up the longest.
        slowest = min(starting, key=lambda r: (r.created, r.pod))
        others = f" (+{len(starting) - 1} starting)" if len(starting) > 1 else ""
        got = slowest.downloaded_bytes
        progress = f" {got / 2**30:.2f} GiB" if got is not None else ""
        return f"{slowest.pod} {slowest.phase}{progress}{_cache(slowest)}{others}"
    timed = [r for r in replicas if r.ready_after_seconds is not None]
    if not timed:
        return ""
    slowest = max(timed, key=lambda r: r.ready_after_seconds or 0)
    return (
        f"all ready; slowest {slowest.ready_after_seconds}s "
        f"({slowest.pod}{_cache(slowest)}{_longest(slowest.engine)})"
    )


def _longest(engine: EngineStartPhases | None) -> str:
    """The engine phases that took longest, by the names `/status` and the docs use."""
    if engine is None:
        return ""
    names = {field: name for name, field in ENGINE_PHASE_FIELDS.items()}
    seconds = [(value, names[field]) for field, value in engine if value]
    top = sorted(seconds, key=lambda pair: -pair[0])[:SUMMARY_PHASES]
    return "; " + ", ".join(f"{name} {value:g}s" for value, name in top) if top else ""


def _cache(replica: ReplicaStartup) -> str:
    """Whether a start loads what an earlier one compiled: the part of its seconds a person
    can change."""
    return f", compile cache {replica.compile_cache}" if replica.compile_cache else ""


def startup_status(
    pods: Iterable[Mapping[str, Any]],
    readings: Iterable[AgentReading] = (),
    known: Mapping[str, ReplicaStartup] | None = None,
) -> StartupStatus | None:
    """The breakdown of every live engine pod (None when there is none). `known`: pod → what
    the previous status said of it, for pods no agent reading covers yet (a restarted
    operator has read no agent: its first status must not undo what the last one said)."""
    by_pod = {r.pod: r for r in readings}
    replicas = []
    for pod in pods:
        name = str((pod.get("metadata") or {}).get("name"))
        found = replica_startup(pod, by_pod.get(name), (known or {}).get(name))
        if found is not None:
            replicas.append(found)
    if not replicas:
        return None
    # Not ready first; among each group the newest first (a rollout's new pods matter most).
    replicas.sort(key=lambda r: r.pod)
    replicas.sort(key=lambda r: r.created, reverse=True)
    replicas.sort(key=lambda r: r.phase == "Ready")
    return StartupStatus(summary=_summary(replicas), replicas=replicas[:MAX_REPLICAS])


def _cluster_seconds(replica: ReplicaStartup) -> dict[str, float]:
    out: dict[str, float] = {}
    if replica.scheduled_after_seconds is not None:
        out["scheduling"] = replica.scheduled_after_seconds
        if replica.started_after_seconds is not None:
            out["containerStart"] = max(
                0, replica.started_after_seconds - replica.scheduled_after_seconds
            )
    if replica.ready_after_seconds is not None:
        out["total"] = replica.ready_after_seconds
    return out


def _engine_seconds(replica: ReplicaStartup) -> dict[str, float]:
    if replica.engine is None:
        return {}
    names = {field: name for name, field in ENGINE_PHASE_FIELDS.items()}
    return {names[field]: value for field, value in replica.engine if value is not None}


def _engine_done(replica: ReplicaStartup | None) -> bool:
    """The agent reported the whole start (`untraced` is set once the engine is ready)."""
    return (
        replica is not None
        and replica.engine is not None
        and (replica.engine.untraced_seconds is not None)
    )


def new_phase_seconds(
    before: StartupStatus | None, after: StartupStatus | None
) -> list[dict[str, float]]:
    """Seconds per phase that `after` knows and `before` did not, for the operator's histogram,
    so each start is counted once: the cluster's part (scheduling, containerStart, total) when
    its pod first shows Ready, the engine's when its agent's report of the whole start first
    arrives (an agent is read after the kubelet's Ready, so usually a write later). A restarted
    operator, whose first status repeats the last one, counts nothing again."""
    if after is None:
        return []
    known = {r.pod: r for r in (before.replicas if before else ())}
    out = []
    for replica in after.replicas:
        was = known.get(replica.pod)
        found: dict[str, float] = {}
        if replica.phase == "Ready" and (was is None or was.phase != "Ready"):
            found |= _cluster_seconds(replica)
        if _engine_done(replica) and not _engine_done(was):
            found |= _engine_seconds(replica)
        if found:
            out.append(found)
    return out
