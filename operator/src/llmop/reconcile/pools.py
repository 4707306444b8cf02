"""The InferencePool's part of a parent pass: whether the cluster serves its API, whether a
pool the operator made may exist (so that an unwanted one is deleted), the verdict every status
path then reads (`pool_view`), and bringing in the pools that waited for the CRDs.

Never a request for a parent that neither wants a pool nor had one: whether one exists comes
from this process's verdict or, after a restart, from `status.inferencePool`, not from a GET
(the operator does not watch InferencePools: their CRD may be absent)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from llmop import kinds
from llmop.desired import DesiredState
from llmop.kinds import ChildKind
from llmop.kube import KubeError
from llmop.pool_view import PoolVerdict
from llmop.reconcile.caches import key_of, previous_status
from llmop.reconcile.context import Context

log = logging.getLogger("llmop.reconcile.pools")

KIND = kinds.INFERENCE_POOL


def served(ctx: Context) -> bool:
    """Whether the cluster serves InferencePools: discovery once, then remembered (forgotten
    again when an apply finds the API gone, `forget_served`)."""
    known = ctx.served.get(KIND)
    if known is None:
        known = ctx.served[KIND] = ctx.kube.serves(KIND.api_version, KIND.plural)
        if not known:
            log.warning("the cluster does not serve %s InferencePools", KIND.api_version)
    return known


def forget_served(ctx: Context) -> None:
    """An apply got a 404: the API may have gone (its CRD deleted); ask discovery again."""
    ctx.served.pop(KIND, None)


def recorded(ctx: Context, body: Mapping[str, Any]) -> bool:
    """A pool this operator made may exist: this process's verdict, else the stored status."""
    verdict = ctx.recall(key_of(body)).pool
    if verdict is not None and verdict.uid == body["metadata"].get("uid"):
        return verdict.applied
    stored = previous_status(ctx, body)
    return isinstance(stored, Mapping) and stored.get("inferencePool") is not None


def wanted(desired: DesiredState) -> bool:
    """The rendered children include a pool."""
    return desired.children is not None and desired.children.inference_pool is not None


def prepare(
    ctx: Context, body: Mapping[str, Any], desired: DesiredState, live: dict[ChildKind, Any]
) -> tuple[ChildKind, ...]:
    """Before planning: the kinds to leave out of the plan (the pool, when its API is not
    served), and a placeholder in `live` for a recorded pool the spec no longer wants (the
    plan deletes an unwanted optional child that exists)."""
    if wanted(desired):
        return () if served(ctx) else (KIND,)
    if recorded(ctx, body):
        namespace, name = key_of(body)
        live[KIND] = {"metadata": {"name": name, "namespace": namespace}}
    return ()


def settle(ctx: Context, body: Mapping[str, Any], desired: DesiredState, *, unserved: bool) -> None:
    """After a plan ran to its end: remember whether a pool exists now, and whether a wanted
    one waits for its API (for parents that want a pool or had one)."""
    want = wanted(desired)
    if desired.children is None or not (want or recorded(ctx, body)):
        return
    verdict = PoolVerdict(
        uid=str(body["metadata"].get("uid") or ""),
        applied=want and not unserved,
        unavailable=want and unserved,
    )
    ctx.update(key_of(body), lambda memory: replace(memory, pool=verdict))


def waiting(ctx: Context) -> list[tuple[str, str]]:
    """Parents whose wanted pool waits for the InferencePool API."""
    return sorted(
        key for key, memory in ctx.memories() if memory.pool is not None and memory.pool.unavailable
    )


def recheck(ctx: Context) -> list[tuple[str, str]]:
    """When parents wait for the InferencePool API, ask discovery again; the parents to
    reconcile now that it is served (empty while it is not)."""
    keys = waiting(ctx)
    if not keys:
        return []
    try:
        now_served = ctx.kube.serves(KIND.api_version, KIND.plural)
    except KubeError as error:
        log.warning("could not check for the InferencePool API: %s", error)
        return []
    if not now_served:
        return []
    log.info("the cluster serves %s InferencePools now: creating the waiting pools", KIND.group)
    ctx.served[KIND] = True
    return keys
