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
from llmop.api.v1alpha1 import CompileCacheOutcome, ReplicaStartup, StartupPhase, StartupStatus
from llmop.conditions import parse_time

MAX_REPLICAS = 10
"""Replicas listed in the status: the ones not ready, then the newest."""
_AGENT_PHASES: dict[str, StartupPhase] = {"downloading": "Downloading", "loading": "Loading"}


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


def _engine(pod: Mapping[str, Any]) -> Mapping[str, Any]:
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
    running = (_engine(pod).get("state") or {}).get("running") or {}
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
    return f"all ready; slowest {slowest.ready_after_seconds}s ({slowest.pod}{_cache(slowest)})"


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
