"""Orchestration: take idle models to zero replicas (`spec.autoscaling.minReplicas: 0`).

One asyncio task (started by the handlers when the chart names a router, `LLMOP_ROUTER`) loops
every `CHECK_SECONDS`:

1. candidates from the watch cache: CRs whose raw spec says `autoscaling.minReplicas: 0` and
   whose Ready condition is True with `AllReplicasReady` (serving, not rolling out or waking);
   every other CR costs one dictionary lookup and no request;
2. with at least one candidate: the router's ready pods (one label-filtered list) and each
   one's `GET /llmop/activity` on its admin port (`llmop.pod_client`), plus the agents'
   latest queue readings the fleet reader keeps (`ParentMemory.fleet`);
3. `llmop.idle.decide` per candidate; for an idle one, the router pods are read again just
   before the write (a request may have arrived meanwhile) and, still idle, the workload's
   scale subresource is set to 0 — the Deployment, or the LeaderWorkerSet of a multi-node CR.
   The HPA keeps `minReplicas: 1` and does not act on a target at 0; llmop-router sets it back
   to 1 when a request comes (`docs/router.md`). A status pass on the queue then says
   `ScaledToZero`.

Why a loop and not kopf timers: a timer per CR would run for every LLMDeployment, and the
router pods' activity is one read for all candidates together.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from llmop import conditions, idle, kinds, pod_client
from llmop.idle import Activity, Key
from llmop.kube import KubeError
from llmop.periodic import run_rounds
from llmop.reconcile import Context, Hint, enqueue
from llmop_router import contract
from llmop_router.contract import Spec

log = logging.getLogger("llmop.idle_check")

CHECK_SECONDS = 10.0
"""Between two idle checks: scale to zero is measured in minutes (idleSeconds ≥ 10)."""
ROUTER_POD_LABEL = contract.ROUTER_POD_SELECTOR
DEFAULT_IDLE_SECONDS = contract.DEFAULT_IDLE_SECONDS


def _spec(body: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = body.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _idle_seconds(body: Mapping[str, Any]) -> int | None:
    """`scaleToZero.idleSeconds` of a CR that may scale to zero, else None (raw JSON: the
    API server validated it; an unparsable one keeps the model up)."""
    autoscaling = _spec(body).get(Spec.AUTOSCALING)
    if not isinstance(autoscaling, Mapping) or autoscaling.get(Spec.MIN_REPLICAS) != 0:
        return None
    settings = autoscaling.get(Spec.SCALE_TO_ZERO)
    value = settings.get(Spec.IDLE_SECONDS) if isinstance(settings, Mapping) else None
    return value if isinstance(value, int) else DEFAULT_IDLE_SECONDS


def serving_since(body: Mapping[str, Any]) -> float | None:
    """Since when the CR has served with all replicas ready (Ready's transition time), or None."""
    status = body.get("status")
    found = (status or {}).get("conditions") if isinstance(status, Mapping) else None
    for condition in found or []:
        if not isinstance(condition, Mapping) or condition.get("type") != conditions.READY:
            continue
        if (
            condition.get("status") != "True"
            or condition.get("reason") != conditions.REASON_ALL_REPLICAS_READY
        ):
            return None
        since = conditions.parse_time(condition.get("lastTransitionTime"))
        return None if since is None else since.timestamp()
    return None


def candidates(parents: Mapping[Key, Iterable[Mapping[str, Any]]]) -> dict[Key, Mapping[str, Any]]:
    """The CRs that may scale to zero, with their cached bodies."""
    found: dict[Key, Mapping[str, Any]] = {}
    for key, cached in list(parents.items()):
        for body in list(cached or ()):
            if _idle_seconds(body) is not None:
                found[key] = body
    return found


def _router_pods(ctx: Context) -> list[tuple[str, int]]:
    """IP and admin port of each of the router's ready pods (the admin port is on no Service:
    clients never reach it)."""
    if ctx.router is None:
        return []
    pods = ctx.kube.list("v1", "Pod", ctx.router.ref.namespace, label_selector=ROUTER_POD_LABEL)
    found = []
    for pod in pods:
        status = pod.get("status") or {}
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions") or []
        )
        leaving = (pod.get("metadata") or {}).get("deletionTimestamp")
        if ready and not leaving and status.get("podIP"):
            found.append((str(status["podIP"]), idle.admin_port(pod)))
    return found


async def _activity(pods: list[tuple[str, int]]) -> list[Mapping[Key, Activity] | None]:
    payloads = await asyncio.gather(
        *(pod_client.read_router_activity(ip, port) for ip, port in pods)
    )
    return [idle.parse_activity(payload) for payload in payloads]


def _scale_to_zero(ctx: Context, key: Key, body: Mapping[str, Any]) -> bool:
    engine = _spec(body).get(Spec.ENGINE)
    pipeline = engine.get(Spec.PIPELINE_PARALLEL_SIZE) if isinstance(engine, Mapping) else None
    kind = kinds.workload_of_resource(contract.workload_resource(pipeline))
    return ctx.kube.scale(kind.api_version, kind.kind, key[0], key[1], 0)


def _verdict(
    ctx: Context,
    key: Key,
    body: Mapping[str, Any],
    seconds: int,
    routers: list[Mapping[Key, Activity] | None],
) -> idle.Verdict:
    return idle.decide(
        key,
        now_unix=time.time(),
        idle_seconds=seconds,
        serving_since_unix=serving_since(body),
        routers=routers,
        readings=ctx.recall(key).fleet,
    )


async def check_once(ctx: Context) -> list[Key]:
    """One round; returns the CRs it scaled to zero."""
    found = candidates(ctx.parents)
    if not found or ctx.router is None:
        return []
    router_pods = await asyncio.to_thread(_router_pods, ctx)
    routers = await _activity(router_pods)
    scaled: list[Key] = []
    for key, body in found.items():
        seconds = _idle_seconds(body) or DEFAULT_IDLE_SECONDS
        if not _verdict(ctx, key, body, seconds, routers).idle:
            continue
        # Just before the write: a request may have reached a router pod since the first read.
        final = _verdict(ctx, key, body, seconds, await _activity(router_pods))
        if not final.idle:
            log.info("%s/%s: not scaling to zero after all: %s", *key, final.reason)
            continue
        try:
            if await asyncio.to_thread(_scale_to_zero, ctx, key, body):
                log.info("%s/%s: scaled to zero: %s", *key, final.reason)
                scaled.append(key)
                enqueue(ctx, key, Hint.FLEET)
        except KubeError as error:
            log.warning("%s/%s: could not scale to zero: %s", *key, error)
    return scaled


async def run(ctx: Context, *, interval: float = CHECK_SECONDS) -> None:
    """Check every `interval` seconds, the first time after one interval, until cancelled."""
    await run_rounds(
        lambda: check_once(ctx),
        every=interval,
        first_wait=interval,
        log=log,
        failure="the scale-to-zero idle check failed",
    )
