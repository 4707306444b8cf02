"""Pure: what is wrong with an LLMDeployment's pods, in words a person can act on.

A Deployment's own status says only "2/3 available"; why the third is missing lives on its pod:
the scheduler's verdict (`PodScheduled=False`, reason Unschedulable, "0/5 nodes are available:
1 Insufficient nvidia.com/gpu…"), the kubelet's waiting reason (ErrImagePull, ImagePullBackOff,
CrashLoopBackOff, CreateContainerConfigError) and the last termination (OOMKilled, exit code).
`worst_issue` picks the one that explains the most, so the CR's status can name it within
seconds instead of after the Deployment's progress deadline.

`degraded_issue` also counts a container that is serving again but restarted recently (an
OOM kill or a failed liveness probe that the kubelet papered over): the `Degraded` condition
names it while `Ready` stays true. Each last termination comes with what to do about it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from llmop.conditions import parse_time
from llmop.model_revision import SUMMARY_FIELD, model_revision
from llmop.names import (
    ANNOTATION_ADAPTERS_REVISION,
    LABEL_LWS_GROUP_INDEX,
    LABEL_LWS_WORKER_INDEX,
)
from llmop.observed import shared_strings

REASON_UNSCHEDULABLE = "Unschedulable"
REASON_IMAGE_PULL = "ImagePullBackOff"
REASON_CRASH_LOOP = "CrashLoopBackOff"
REASON_CONTAINER_CONFIG = "CreateContainerError"
REASON_RESTARTING = "ContainerRestarting"
REASON_GROUP_RESTARTING = "GroupRestarting"
"""A LeaderWorkerSet group was recreated (all its pods) and is not ready again yet."""
REASON_GROUP_RESTART_LOOP = "GroupRestartLoop"
"""One group was recreated again and again (`llmop.group_restarts`)."""

# The kubelet's waiting reasons, grouped by what a person has to do about them.
_PULL_REASONS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "ErrImageNeverPull",
        "InvalidImageName",
        "RegistryUnavailable",
    }
)
_CONFIG_REASONS = frozenset(
    {"CreateContainerConfigError", "CreateContainerError", "RunContainerError"}
)
# Most explaining first: a pod that cannot be placed or pulled never gets as far as crashing.
# A group's restart loop comes before all of them: LeaderWorkerSet deletes the group's pods at
# each failure, so their own issues (a pending pod, a restart) show for moments and explain
# less than the loop; a group being recreated explains more than one container's restart.
_RANK = {
    REASON_GROUP_RESTART_LOOP: -1,
    REASON_UNSCHEDULABLE: 0,
    REASON_IMAGE_PULL: 1,
    REASON_CONTAINER_CONFIG: 2,
    REASON_CRASH_LOOP: 3,
    REASON_GROUP_RESTARTING: 4,
    REASON_RESTARTING: 5,
}
RECENT_RESTART = timedelta(minutes=10)
"""A ready container that restarted this recently still marks its LLMDeployment Degraded:
long enough to be seen by a person or an alert, short enough that one old restart does not
keep it Degraded for the pod's whole life."""


DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
"""The ReplicaSet controller deletes pods with the lowest cost first on scale-down."""
KEPT_ANNOTATIONS = (DELETION_COST_ANNOTATION, ANNOTATION_ADAPTERS_REVISION)
"""The pod annotations the operator writes, kept in the watch cache to write them only on change."""


def pod_summary(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What `pod_issue`, the agent reader and the cold-start breakdown read of a pod, and
    nothing else: the watch cache holds one per engine pod, so it stays small (no spec, no
    managedFields; of the spec only the model revision it serves, `llmop.model_revision`)."""
    metadata = pod.get("metadata") or {}
    status = pod.get("status") or {}
    keep = ("name", "image", "ready", "restartCount", "state", "lastState")
    annotations = metadata.get("annotations") or {}
    summary_metadata = {
        k: metadata[k]
        for k in ("name", "namespace", "uid", "labels", "deletionTimestamp", "creationTimestamp")
        if k in metadata
    }
    kept = {k: annotations[k] for k in KEPT_ANNOTATIONS if k in annotations}
    if kept:
        summary_metadata["annotations"] = kept
    summary: dict[str, Any] = shared_strings(
        {
            "metadata": summary_metadata,
            "status": {
                **{k: status[k] for k in ("phase", "podIP") if k in status},
                "conditions": [
                    c
                    for c in status.get("conditions") or []
                    if c.get("type") in ("PodScheduled", "Ready")
                ],
                "containerStatuses": [
                    {k: c[k] for k in keep if k in c} for c in status.get("containerStatuses") or []
                ],
                "initContainerStatuses": [
                    {k: c[k] for k in keep if k in c}
                    for c in status.get("initContainerStatuses") or []
                ],
            },
        }
    )
    revision = model_revision(pod)
    if revision is not None:
        summary[SUMMARY_FIELD] = revision
    return summary


@dataclass(frozen=True)
class PodIssue:
    """One pod's problem: a CamelCase reason for conditions and a sentence for people."""

    reason: str
    message: str
    pod: str


def _conditions(pod: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    status = pod.get("status") or {}
    return {str(c.get("type")): c for c in status.get("conditions") or []}


def _hint(reason: str, code: Any) -> str:
    """What a person can do about a container's last exit."""
    if reason == "OOMKilled":
        return (
            "out of memory: raise spec.resources.memory, or lower engine.maxModelLen / "
            "engine.maxNumSeqs"
        )
    if code == 137:
        return (
            "killed by SIGKILL: a failed liveness probe (a hung engine) or an external kill; "
            "see `kubectl describe pod` and `kubectl logs --previous`"
        )
    if code == 143:
        return "stopped by SIGTERM: a failed liveness probe or an eviction; see the pod's events"
    return "see `kubectl logs --previous` for why the engine exited"


def _last_termination(container: Mapping[str, Any]) -> str:
    terminated = (container.get("lastState") or {}).get("terminated") or {}
    if not terminated:
        return ""
    reason = terminated.get("reason") or "Terminated"
    code = terminated.get("exitCode", "?")
    return f"last exit: {reason} (code {code}): {_hint(str(reason), code)}"


def _recent_restart(
    pod: Mapping[str, Any], container: Mapping[str, Any], now: datetime
) -> PodIssue | None:
    """A container that restarted within `RECENT_RESTART` of `now`, whatever its state now."""
    restarts = container.get("restartCount", 0)
    terminated = (container.get("lastState") or {}).get("terminated") or {}
    finished = parse_time(terminated.get("finishedAt"))
    if not restarts or finished is None or now - finished > RECENT_RESTART:
        return None
    name = str((pod.get("metadata") or {}).get("name", "?"))
    return PodIssue(
        REASON_RESTARTING,
        f"{_who(pod)} container {container.get('name', '?')} restarted {restarts} times, "
        f"last at {terminated.get('finishedAt')}; {_last_termination(container)}",
        name,
    )


def is_worker(pod: Mapping[str, Any]) -> bool:
    """A LeaderWorkerSet worker: part of its leader's replica, never a replica itself (no
    traffic, no load, no deletion cost)."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return str(labels.get(LABEL_LWS_WORKER_INDEX, "0")) != "0"


def replica_pods(pods: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The pods that each stand for one replica: all but the LeaderWorkerSet workers."""
    return [pod for pod in pods if not is_worker(pod)]


def _who(pod: Mapping[str, Any]) -> str:
    """How an issue names its pod: a worker by its group, the replica it takes down."""
    metadata = pod.get("metadata") or {}
    name = str(metadata.get("name", "?"))
    if not is_worker(pod):
        return f"pod {name}"
    labels = metadata.get("labels") or {}
    return f"group {labels.get(LABEL_LWS_GROUP_INDEX, '?')}: worker pod {name}"


def pod_issue(pod: Mapping[str, Any]) -> PodIssue | None:
    """The problem of one pod, or None when it is running (or starting) normally. A worker's
    problem is its group's, and says so."""
    name = str((pod.get("metadata") or {}).get("name", "?"))
    who = _who(pod)
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return None  # going away on purpose (rollout, scale-down)
    scheduled = _conditions(pod).get("PodScheduled") or {}
    if scheduled.get("status") == "False" and scheduled.get("reason") == REASON_UNSCHEDULABLE:
        return PodIssue(
            REASON_UNSCHEDULABLE,
            f"{who} cannot be scheduled: {scheduled.get('message') or 'no node fits'}",
            name,
        )
    status = pod.get("status") or {}
    containers = [
        *(status.get("initContainerStatuses") or []),
        *(status.get("containerStatuses") or []),
    ]
    found: list[PodIssue] = []
    for container in containers:
        waiting = (container.get("state") or {}).get("waiting") or {}
        why = str(waiting.get("reason") or "")
        detail = str(waiting.get("message") or "").strip()
        image = container.get("image", "")
        if why in _PULL_REASONS:
            text = f"{who} cannot pull image {image}: {why}"
            found.append(PodIssue(REASON_IMAGE_PULL, f"{text}: {detail}" if detail else text, name))
        elif why in _CONFIG_REASONS:
            found.append(PodIssue(REASON_CONTAINER_CONFIG, f"{who}: {why}: {detail}", name))
        elif why == REASON_CRASH_LOOP:
            restarts = container.get("restartCount", 0)
            last = _last_termination(container) or "no exit recorded"
            found.append(
                PodIssue(
                    REASON_CRASH_LOOP,
                    f"{who} is crash-looping ({restarts} restarts; {last})",
                    name,
                )
            )
        elif container.get("restartCount", 0) > 0 and not container.get("ready", False):
            last = _last_termination(container)
            found.append(
                PodIssue(
                    REASON_RESTARTING,
                    f"{who} restarted {container['restartCount']} times"
                    + (f"; {last}" if last else ""),
                    name,
                )
            )
    return min(found, key=lambda i: _RANK[i.reason]) if found else None


def worst_of(issues: Iterable[PodIssue | None]) -> PodIssue | None:
    """The issue that explains the most (ties: the first pod by name); None when none."""
    found = [i for i in issues if i is not None]
    return min(found, key=lambda i: (_RANK[i.reason], i.pod)) if found else None


def worst_issue(pods: Iterable[Mapping[str, Any]]) -> PodIssue | None:
    """The issue that explains the most among all pods (ties: the first pod by name)."""
    return worst_of(pod_issue(p) for p in pods)


def degraded_issue(pods: Iterable[Mapping[str, Any]], now: datetime) -> PodIssue | None:
    """What makes the fleet Degraded: any pod's issue, or a container (ready again or not)
    that restarted within `RECENT_RESTART` of `now`."""
    found: list[PodIssue | None] = []
    for pod in pods:
        metadata = pod.get("metadata") or {}
        if metadata.get("deletionTimestamp"):
            continue
        found.append(pod_issue(pod))
        status = pod.get("status") or {}
        for container in status.get("containerStatuses") or []:
            found.append(_recent_restart(pod, container, now))
    return worst_of(found)
