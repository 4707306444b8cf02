"""Holding a parent pass's status write until the Deployment it applied has been observed.

Why: a parent pass that creates a Deployment (or changes its pod template) used to write the
status at once — "applied, rolling out", with a Reconciling Event — and a moment later the
Deployment controller's first status made the child path write again (Ready for a Deployment
that has nothing to roll, with a Ready Event): two status patches, two Events and two watch
events of the parent where one of each says the same. At 1,000 CRs that was a third of the
operator's API writes.

Now such a pass records the generation as deferred and writes nothing; every status path holds
its write while the cached Deployment is not yet the applied one as its controller observed it;
the first one after that writes (the child path, on the controller's status event); and a
fallback run after `DEFER_SECONDS` writes what the caches say then, so an absent Deployment
controller delays `status.observedGeneration` by at most that. A controller that is only behind
(seen observing other Deployments of ours within the last `DEFER_SECONDS`: a burst of new
models) gets `DEFER_SECONDS` more, again and again up to `LONGEST_DEFER_SECONDS` in all: at a
1,000-CR burst the fallback otherwise fired for 7-43 % of the CRs before their Deployment was
observed, each then writing "rolling out" with a RollingOut Event and, moments later, Ready with
another (1,072-1,433 status writes per 1,000 CRs, where 1,000 say it all). Only where the
operator's handlers installed the queue (`Context.queue`); otherwise, and for
LeaderWorkerSets (listed, not watched), a problem, or a model that does not fit, the status is
written at once as before."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from llmop import kinds
from llmop.desired import DesiredState
from llmop.kinds import ChildKind
from llmop.reconcile.caches import key_of, live_children
from llmop.reconcile.context import Context, Hint
from llmop.reconcile.problems import problem_of
from llmop.status import observe_rollout

DEFER_SECONDS = 3.0
"""How long a parent pass's status waits for the Deployment controller's first status, and how
recently the controller must have been seen at work for the fallback to wait once more."""
LONGEST_DEFER_SECONDS = 30.0
"""The longest a parent pass's status waits for a controller that is seen at work."""


def _generation(body: Mapping[str, Any]) -> tuple[str, int | None]:
    metadata = body["metadata"]
    return str(metadata.get("uid") or ""), metadata.get("generation")


def _observed(
    ctx: Context,
    body: Mapping[str, Any],
    desired: DesiredState,
    live: Mapping[ChildKind, Any] | None = None,
) -> bool:
    """The cached Deployment is the one the parent pass applied, seen by its controller
    (`live`: the children as the caller listed them; else listed here)."""
    if live is None:
        live = live_children(ctx, *key_of(body), body["metadata"]["uid"])
    deployment = live.get(kinds.DEPLOYMENT)
    rollout = observe_rollout(deployment, desired.llmd.spec, template_hash=desired.template_hash)
    return rollout.exists and rollout.current_generation_observed and rollout.template_current


def defer(ctx: Context, body: Mapping[str, Any], desired: DesiredState) -> bool:
    """The parent pass that just applied `desired`'s Deployment writes no status now: True when
    the write is left to the first status path after the controller observed it (and to the
    fallback). False when there is nothing to wait for (the cache already shows the change
    observed: a template the apply left as it was), or nobody runs the fallback."""
    if (
        ctx.queue is None
        or desired.llmd.spec.pipeline_parallel_size > 1
        or _observed(ctx, body, desired)
    ):
        return False
    namespace, name = key_of(body)
    deferred = (*_generation(body), ctx.clock())
    ctx.update((namespace, name), lambda memory: replace(memory, deferred=deferred))
    ctx.queue.put((namespace, name), Hint.DEFERRED, after=DEFER_SECONDS)
    return True


def note_deployment(ctx: Context, deployment: Mapping[str, Any]) -> None:
    """A watch event of one of our Deployments: remember when it showed the Deployment
    controller had observed its current generation (the controller runs)."""
    metadata = deployment.get("metadata") or {}
    observed = (deployment.get("status") or {}).get("observedGeneration")
    if observed is not None and observed == metadata.get("generation"):
        ctx.deployments_observed_at = ctx.clock()


def _seconds(since: datetime, now: datetime) -> float:
    return (now - since).total_seconds()


def _since(ctx: Context, body: Mapping[str, Any]) -> datetime | None:
    """When the deferral of `body`'s generation began; None when that generation's status is
    not deferred (never was, or something wrote it since)."""
    deferred = ctx.recall(key_of(body)).deferred
    return deferred[2] if deferred is not None and deferred[:2] == _generation(body) else None


def _unobserved(
    ctx: Context,
    body: Mapping[str, Any],
    desired: DesiredState,
    live: Mapping[ChildKind, Any] | None = None,
) -> bool:
    """Still waiting for the Deployment controller: it has not observed the applied Deployment,
    and no problem is remembered (a problem is written at once)."""
    return problem_of(ctx, body) is None and not _observed(ctx, body, desired, live)


def wait_longer(ctx: Context, body: Mapping[str, Any], desired: DesiredState) -> bool:
    """At the fallback: True when it is to run again `DEFER_SECONDS` later instead of writing.
    That is when this generation is still deferred and unobserved, the Deployment controller
    was seen at work within the last `DEFER_SECONDS` (it will get to this one), and one more
    wait keeps the whole deferral within `LONGEST_DEFER_SECONDS`."""
    since, seen = _since(ctx, body), ctx.deployments_observed_at
    if since is None or seen is None:
        return False
    now = ctx.clock()
    return (
        _seconds(seen, now) < DEFER_SECONDS
        and _seconds(since, now) + DEFER_SECONDS <= LONGEST_DEFER_SECONDS
        and _unobserved(ctx, body, desired)
    )


def held(
    ctx: Context, body: Mapping[str, Any], desired: DesiredState, live: Mapping[ChildKind, Any]
) -> bool:
    """A status path is to write nothing yet: this generation's status was deferred and the
    Deployment controller has not observed the applied Deployment (in `live`, the children as
    the status path listed them). Once it has (or the parent moved on to another generation,
    or a problem is remembered), the deferral ends."""
    key = key_of(body)
    if ctx.recall(key).deferred is None:
        return False
    if _since(ctx, body) is not None and _unobserved(ctx, body, desired, live):
        return True
    _end(ctx, key)
    return False


def pending(ctx: Context, body: Mapping[str, Any]) -> bool:
    """`body`'s generation is still deferred: nothing has written its status since the parent
    pass."""
    return _since(ctx, body) is not None


def take(ctx: Context, body: Mapping[str, Any]) -> bool:
    """End the deferral of `body`'s generation for the fallback: True when it was still
    pending (nothing has written this generation's status since the parent pass)."""
    was_pending = pending(ctx, body)
    _end(ctx, key_of(body))
    return was_pending


def _end(ctx: Context, key: tuple[str, str]) -> None:
    ctx.update(key, lambda memory: replace(memory, deferred=None))
