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
fallback run after `DEFER_SECONDS` writes what the caches say then, so a slow or absent
Deployment controller delays `status.observedGeneration` by at most that. Only where the
operator's handlers installed a scheduler (`Context.schedule_status`); otherwise, and for
LeaderWorkerSets (listed, not watched), a problem, or a model that does not fit, the status is
written at once as before."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llmop import kinds
from llmop.desired import DesiredState
from llmop.reconcile.caches import key_of, live_children
from llmop.reconcile.context import Context
from llmop.reconcile.problems import problem_of
from llmop.status import observe_rollout

DEFER_SECONDS = 3.0
"""The longest a parent pass's status waits for the Deployment controller's first status."""


def _generation(body: Mapping[str, Any]) -> tuple[str, int | None]:
    metadata = body["metadata"]
    return str(metadata.get("uid") or ""), metadata.get("generation")


def _observed(ctx: Context, body: Mapping[str, Any], desired: DesiredState) -> bool:
    """The cached Deployment is the one the parent pass applied, seen by its controller."""
    namespace, name = key_of(body)
    deployment = live_children(ctx, namespace, name, body["metadata"]["uid"]).get(kinds.DEPLOYMENT)
    rollout = observe_rollout(deployment, desired.llmd.spec, template_hash=desired.template_hash)
    return rollout.exists and rollout.current_generation_observed and rollout.template_current


def defer(ctx: Context, body: Mapping[str, Any], desired: DesiredState) -> bool:
    """The parent pass that just applied `desired`'s Deployment writes no status now: True when
    the write is left to the first status path after the controller observed it (and to the
    fallback). False when there is nothing to wait for (the cache already shows the change
    observed: a template the apply left as it was), or nobody runs the fallback."""
    if (
        ctx.schedule_status is None
        or desired.llmd.spec.pipeline_parallel_size > 1
        or _observed(ctx, body, desired)
    ):
        return False
    namespace, name = key_of(body)
    ctx._deferred[namespace, name] = _generation(body)
    ctx.schedule_status(namespace, name)
    return True


def held(ctx: Context, body: Mapping[str, Any], desired: DesiredState) -> bool:
    """A status path is to write nothing yet: this generation's status was deferred and the
    Deployment controller has not observed the applied Deployment. Once it has (or the parent
    moved on to another generation, or a problem is remembered), the deferral ends."""
    key = key_of(body)
    pending = ctx._deferred.get(key)
    if pending is None:
        return False
    if (
        pending == _generation(body)
        and problem_of(ctx, body) is None
        and not _observed(ctx, body, desired)
    ):
        return True
    ctx._deferred.pop(key, None)
    return False


def take(ctx: Context, body: Mapping[str, Any]) -> bool:
    """End the deferral of `body`'s generation for the fallback: True when it was still
    pending (nothing has written this generation's status since the parent pass)."""
    pending = ctx._deferred.pop(key_of(body), None)
    return pending is not None and pending == _generation(body)
