"""Pure: counting LeaderWorkerSet group recreates, and judging them (`GroupRestarting`,
`GroupRestartLoop`).

A multi-node replica is a LeaderWorkerSet group rendered with `restartPolicy:
RecreateGroupAfterStart`: when any container of the group restarts or any of its pods is
deleted, the LeaderWorkerSet controller deletes the group's leader and every pod of the group
comes back new — with no backoff (lws#1048: 30 recreations in 90 s) and no trace in the
LeaderWorkerSet's status. Each recreated pod starts with `restartCount` 0, so the pods' own
issues (`llmop.pods`) never show the loop.

What gives a recreate away is the leader pod (worker-index "0"): it keeps its name
(`<lws>-<group>`) but a recreated one has a new uid. The operator's pod watch feeds `observe`
one pod at a time; a leader with a new uid and the same template revision is one recreate (a new
revision is a rollout replacing the group, which is not counted). The last container exit seen
on any of the group's pods before the recreate is kept with it: it is the likely cause.

`group_issue` turns the histories into the Degraded issue: `GroupRestartLoop` once one group was
recreated `LOOP_THRESHOLD` times within `WINDOW` (whether or not it is ready right now: the
next failure recreates it again), else `GroupRestarting` while a recently recreated group is not
ready again. Time is always a parameter.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from llmop.names import LABEL_LWS_GROUP_INDEX, LABEL_LWS_TEMPLATE_HASH, LABEL_LWS_WORKER_INDEX
from llmop.pods import REASON_GROUP_RESTART_LOOP, REASON_GROUP_RESTARTING, PodIssue

WINDOW = timedelta(minutes=10)
"""How far back recreates count: long enough for a loop of slow-loading engines (a model that
takes 3 minutes to load and then dies is recreated about 3 times in 10 minutes), short enough
that a group recreated once a day now and then is never called a loop."""
LOOP_THRESHOLD = 3
"""Recreates of one group within `WINDOW` that make a loop."""
UNKNOWN_EXIT = "unknown"
EARLIER_LEADERS = 8
"""How many replaced leader uids a group's history keeps. kopf hands each object's events to a
worker of its own, so an old leader's last live event can be handled after its successor's
first: only seconds late, so a few uids suffice, while a group recreated for days keeps a
bounded history."""
"""The last exit of a recreated group when no container exit was seen (a deleted pod, or an
operator that started after it)."""


@dataclass(frozen=True)
class Exit:
    """One container exit seen on a group's pod."""

    finished_at: str
    """As the kubelet wrote it (RFC 3339, "" when absent): orders two exits."""
    text: str
    """E.g. "OOMKilled (exit code 137) in container engine of pod m-0-1"."""


@dataclass(frozen=True)
class Recreate:
    """One recreate of a group: when the operator saw its new leader, and the last exit seen on
    the group's pods before it (`UNKNOWN_EXIT` when none was seen)."""

    at: datetime
    last_exit: str


@dataclass(frozen=True)
class GroupHistory:
    """What this process saw of one group: its current leader and the recreates before it."""

    leader_uid: str
    template_hash: str
    recreates: tuple[Recreate, ...] = ()
    last_exit: Exit | None = None
    """The newest exit seen on the group's pods since its current leader came."""
    earlier_leaders: tuple[str, ...] = ()
    """The uids of the leaders before the current one, newest last (`EARLIER_LEADERS` at
    most): a late event of one of them is stale, not a new leader."""


def group_index(pod: Mapping[str, Any]) -> int | None:
    """The group a LeaderWorkerSet pod belongs to; None for any other pod."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    value = labels.get(LABEL_LWS_GROUP_INDEX)
    return int(value) if isinstance(value, str) and value.isdigit() else None


def _is_leader(pod: Mapping[str, Any]) -> bool:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return str(labels.get(LABEL_LWS_WORKER_INDEX, "")) == "0"


def _dying(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def latest_exit(pod: Mapping[str, Any]) -> Exit | None:
    """The newest container exit on `pod`: a restarted container's `lastState.terminated`, or a
    stopped one's `state.terminated` — except on a pod being deleted, whose containers stopping
    now are the recreate's effect (SIGTERM), not its cause."""
    metadata = pod.get("metadata") or {}
    status = pod.get("status") or {}
    found: list[Exit] = []
    for container in [
        *(status.get("initContainerStatuses") or []),
        *(status.get("containerStatuses") or []),
    ]:
        states = [(container.get("lastState") or {}).get("terminated")]
        if not _dying(pod):
            states.append((container.get("state") or {}).get("terminated"))
        for terminated in states:
            if not terminated:
                continue
            reason = terminated.get("reason") or "Terminated"
            code = terminated.get("exitCode", "?")
            found.append(
                Exit(
                    str(terminated.get("finishedAt") or ""),
                    f"{reason} (exit code {code}) in container {container.get('name', '?')} "
                    f"of pod {metadata.get('name', '?')}",
                )
            )
    return max(found, key=lambda e: e.finished_at) if found else None


def _newer(old: Exit | None, new: Exit | None) -> Exit | None:
    if old is None or (new is not None and new.finished_at >= old.finished_at):
        return new or old
    return old


def observe(
    history: GroupHistory | None, pod: Mapping[str, Any], now: datetime
) -> GroupHistory | None:
    """The history of `pod`'s group once `pod` (its current state, from a watch event) is seen.

    The first leader seen is the baseline (no recreate: this process may have started after
    it). A later live leader with another uid is one recreate at `now`, or, with another
    template revision, a rollout's replacement (not counted); a late event of a leader it
    replaced changes nothing. Any pod's exit becomes the group's last exit. None while no leader
    of the group was seen."""
    metadata = pod.get("metadata") or {}
    uid = str(metadata.get("uid") or "")
    labels = metadata.get("labels") or {}
    revision = str(labels.get(LABEL_LWS_TEMPLATE_HASH) or "")
    seen = latest_exit(pod)
    if _is_leader(pod) and uid and not _dying(pod):
        if history is None:
            return GroupHistory(uid, revision, last_exit=seen)
        if uid in history.earlier_leaders:
            return history
        if uid != history.leader_uid:
            recreates = history.recreates
            if revision == history.template_hash:
                cause = history.last_exit.text if history.last_exit else UNKNOWN_EXIT
                recreates = (*recreates, Recreate(now, cause))
            earlier = (*history.earlier_leaders, history.leader_uid)[-EARLIER_LEADERS:]
            return GroupHistory(uid, revision, recreates, last_exit=seen, earlier_leaders=earlier)
    if history is None:
        return None
    return replace(history, last_exit=_newer(history.last_exit, seen))


def prune(history: GroupHistory, now: datetime) -> GroupHistory:
    """`history` without the recreates older than `WINDOW`."""
    recent = tuple(r for r in history.recreates if now - r.at <= WINDOW)
    return history if recent == history.recreates else replace(history, recreates=recent)


def _ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"


def group_issue(
    histories: Mapping[int, GroupHistory],
    pods: Iterable[Mapping[str, Any]],
    *,
    size: int,
    now: datetime,
) -> PodIssue | None:
    """The Degraded issue of an LLMDeployment's groups: the loop of the group recreated most
    often (ties: the lowest index) when one reached `LOOP_THRESHOLD` within `WINDOW`; else the
    lowest group recreated within `WINDOW` that is not ready again (fewer than `size` pods, or
    one not Ready); else None. `pods`: the engine pods as the watch cache holds them."""
    by_group: dict[int, list[Mapping[str, Any]]] = {}
    for pod in pods:
        index = group_index(pod)
        if index is not None and not _dying(pod):
            by_group.setdefault(index, []).append(pod)
    recent = {
        index: pruned.recreates
        for index, history in histories.items()
        if (pruned := prune(history, now)).recreates
    }
    window = int(WINDOW.total_seconds() // 60)
    loops = [(len(r), index) for index, r in recent.items() if len(r) >= LOOP_THRESHOLD]
    if loops:
        count, index = min(loops, key=lambda found: (-found[0], found[1]))
        return PodIssue(
            REASON_GROUP_RESTART_LOOP,
            f"group {index} was recreated {count} times within {window} minutes, a restart "
            "loop (LeaderWorkerSet recreates all pods of a group whenever one of them fails, "
            f"without backoff); last exit before the latest recreate: "
            f"{recent[index][-1].last_exit}",
            f"group {index}",
        )
    for index in sorted(recent):
        members = by_group.get(index, [])
        ready = sum(1 for pod in members if _ready(pod))
        if len(members) >= size and ready == len(members):
            continue
        recreates = recent[index]
        return PodIssue(
            REASON_GROUP_RESTARTING,
            f"group {index} was recreated {_times(len(recreates))} within {window} minutes "
            f"and is not ready yet ({ready}/{size} pods ready); last exit before the "
            f"recreate: {recreates[-1].last_exit}",
            f"group {index}",
        )
    return None
