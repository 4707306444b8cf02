"""Orchestration: read every engine agent now and then, and act on what the agents say.

One asyncio task (a row of `llmop.runnables`) loops:

1. the targets: every engine pod in the watch cache that runs and has an IP (not a GET);
2. one round of `GET /status` through `llmop.pod_client` (bounded concurrency, timeouts);
3. in a worker thread (the Kubernetes client is synchronous): per LLMDeployment, store the
   readings in `ParentMemory.fleet` and put a status pass on the queue (`reconcile.enqueue`)
   when what the status shows of them changed (KV capacity, deep probes, readiness, adapters)
   or while it is Degraded (a restart ages out); then set each pod's
   `controller.kubernetes.io/pod-deletion-cost` to its load where it moved materially
   (`llmop.agents.cost_changed`), at most `MAX_COST_PATCHES` per round.

Why not on the reconcile path: a reconcile (and an operator restart, which resumes every parent)
must not wait on hundreds of HTTP reads, and must not write anything new. The first round runs
one period after startup; until then `status.derive_status` keeps what the agents said before.
The period is `interval` or, for a big fleet, as long as reading it at `READS_PER_SECOND` takes:
100 pods every 10 s, 1,000 every 50 s.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from llmop import conditions, kinds, names
from llmop.agents import AgentReading, cost_changed, deletion_cost
from llmop.kube import KubeError
from llmop.periodic import run_rounds
from llmop.pod_client import AgentClient, ReadResult, Target
from llmop.pods import DELETION_COST_ANNOTATION, replica_pods
from llmop.reconcile import Context, Hint, enqueue

log = logging.getLogger("llmop.fleet")

READS_PER_SECOND = 20.0
"""Sustained agent reads per second at most: a 1,000-pod fleet is read every 50 s."""
MAX_COST_PATCHES = 100
"""Deletion-cost patches per round at most (the rest wait for the next round)."""


def period(pods: int, interval: float) -> float:
    """Seconds from one round's start to the next for a fleet of `pods`."""
    return max(interval, pods / READS_PER_SECOND)


@dataclass(frozen=True)
class _Pod:
    target: Target
    cost: str | None
    """The deletion-cost annotation as the watch cache last saw it."""
    grouped: bool = False
    """A LeaderWorkerSet leader: its scale-down removes the highest group index whatever the
    cost (StatefulSet order), so it gets no deletion cost."""


def _pods(ctx: Context) -> list[_Pod]:
    """Engine pods worth reading: running, with an IP, not going away; not LeaderWorkerSet
    workers (their agents report no load: the leader's speaks for the group)."""
    found = []
    for (namespace, parent), pods in list(ctx.pods.items()):
        for pod in replica_pods(list(pods or ())):
            metadata = pod.get("metadata") or {}
            status = pod.get("status") or {}
            ip = status.get("podIP")
            if metadata.get("deletionTimestamp") or status.get("phase") != "Running" or not ip:
                continue
            target = Target(namespace, parent, str(metadata.get("name")), str(ip))
            annotations = metadata.get("annotations") or {}
            grouped = names.LABEL_LWS_WORKER_INDEX in (metadata.get("labels") or {})
            found.append(_Pod(target, annotations.get(DELETION_COST_ANNOTATION), grouped))
    return found


def _shown(readings: Iterable[AgentReading]) -> tuple[Any, ...]:
    """The part of the readings the status shows (not the load, which moves all the time)."""
    return tuple(
        (r.pod, r.ready, r.kv_capacity_tokens, r.deep_probe_ok, r.deep_probe_error, r.adapters)
        for r in readings
    )


def _degraded(ctx: Context, key: tuple[str, str]) -> bool:
    for parent in list(ctx.parents.get(key) or ()):
        for condition in (parent.get("status") or {}).get("conditions") or []:
            if condition.get("type") == conditions.DEGRADED and condition.get("status") == "True":
                return True
    return False


def apply_round(
    ctx: Context, parents: Iterable[tuple[str, str]], pods: list[_Pod], result: ReadResult
) -> tuple[int, int]:
    """Act on one round of readings (synchronous: Kubernetes writes); `parents` are the ones
    with engine pods in the cache when the round started. Returns (status passes put on the
    queue, deletion costs written)."""
    by_parent: dict[tuple[str, str], list[AgentReading]] = {key: [] for key in parents}
    for pod in pods:
        reading = result.readings.get(pod.target)
        if reading is not None:
            by_parent.setdefault((pod.target.namespace, pod.target.parent), []).append(reading)
    refreshed = 0
    read_before = {key for key, memory in ctx.memories() if memory.fleet is not None}
    for key in set(by_parent) | read_before:
        readings = tuple(sorted(by_parent.get(key, ()), key=lambda r: r.pod))
        before = ctx.recall(key).fleet
        # A parent whose pods are all gone keeps an empty reading (scaled to zero: nothing
        # reported); `Context.forget` drops it with the parent.
        _keep(ctx, key, readings)
        if before is None or _shown(before) != _shown(readings) or _degraded(ctx, key):
            enqueue(ctx, key, Hint.FLEET)
            refreshed += 1
    return refreshed, _write_costs(ctx, pods, result)


def _keep(ctx: Context, key: tuple[str, str], readings: tuple[AgentReading, ...]) -> None:
    ctx.update(key, lambda memory: replace(memory, fleet=readings))


def _write_costs(ctx: Context, pods: list[_Pod], result: ReadResult) -> int:
    written = 0
    for pod in pods:
        reading = result.readings.get(pod.target)
        cost = None if reading is None or pod.grouped else deletion_cost(reading)
        if cost is None or not cost_changed(pod.cost, cost):
            continue
        if written >= MAX_COST_PATCHES:
            break
        try:
            ctx.kube.patch_annotations(
                kinds.POD.api_version,
                kinds.POD.kind,
                pod.target.namespace,
                pod.target.pod,
                {DELETION_COST_ANNOTATION: str(cost)},
            )
            written += 1
        except KubeError as error:
            log.warning("could not set the deletion cost of %s: %s", pod.target.pod, error)
    return written


async def read_round(ctx: Context, client: AgentClient) -> tuple[int, ReadResult]:
    """One round: read every agent, then act on the readings; returns (targets, result)."""
    # The watch caches are read here, on the event loop that updates them, never from the
    # worker thread below.
    parents = [key for key, cached in list(ctx.pods.items()) if list(cached or ())]
    pods = _pods(ctx)
    result = await client.read_all([p.target for p in pods])
    refreshed, costs = await asyncio.to_thread(apply_round, ctx, parents, pods, result)
    log.debug(
        "read %d agents (%d failed); %d status passes queued, %d deletion costs written",
        len(pods),
        result.failed,
        refreshed,
        costs,
    )
    return len(pods), result


async def run(ctx: Context, client: AgentClient, *, interval: float) -> None:
    """Read the fleet every `period(...)` seconds until cancelled; the first round waits one
    interval, so a (re)starting operator resumes its parents without reading any agent."""

    async def round() -> int:
        count, _ = await read_round(ctx, client)
        return count

    await run_rounds(
        round,
        every=lambda count: period(count or 0, interval),
        first_wait=interval,
        log=log,
        failure="reading the engine agents failed",
    )
