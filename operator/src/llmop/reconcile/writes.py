"""Doing: the executor of a child plan (deciding nothing), status derivation from the caches
and status writes with their transition Events, and the error policy (`guarded`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from llmop import conditions, events, kinds, pool_view
from llmop.api.v1alpha1 import LLMDeploymentStatus, ModelStatus
from llmop.desired import DesiredState
from llmop.hub import HubUnavailableError
from llmop.kube import KubeError, RejectedError
from llmop.metrics import RESULT_ERROR, RESULT_OK, RESULT_STALLED
from llmop.observed import shared_strings
from llmop.plan import Apply, ChildPlan, Delete
from llmop.reconcile import first_status
from llmop.reconcile.adapter_gate import verdicts_for
from llmop.reconcile.caches import key_of, live_children, previous_status, waiting_for_model
from llmop.reconcile.context import Context
from llmop.reconcile.groups import restarts_of
from llmop.reconcile.problems import problem_of, remember
from llmop.status import Problem, derive_invalid_status, derive_status, parse_previous, status_patch

log = logging.getLogger("llmop.reconcile.writes")


class StepRejectedError(RejectedError):
    """The API server refused one step of a plan; `kind` names the child it was for."""

    def __init__(self, kind: str, error: RejectedError) -> None:
        super().__init__(str(error), error.status)
        self.kind = kind


def execute(ctx: Context, plan: ChildPlan) -> None:
    """Carry out a child plan, step by step, deciding nothing. Raises `StepRejectedError` when
    the API server refuses an object, `KubeError` for transient failures."""
    for step in plan.steps():
        kind = step.kind_name
        try:
            if isinstance(step, Delete):
                if ctx.kube.delete(step.kind.api_version, kind, step.namespace, step.name):
                    ctx.metrics.child_writes.labels(kind, "delete").inc()
            else:
                _apply(ctx, step)
        except RejectedError as error:
            raise StepRejectedError(kind, error) from error


def _apply(ctx: Context, step: Apply) -> None:
    ctx.kube.apply(step.manifest, field_manager=step.field_manager, want_result=False)
    ctx.metrics.child_writes.labels(step.kind, "apply").inc()


def _write_status(ctx: Context, body: Mapping[str, Any], status: Any) -> None:
    """Write `status` when it differs from the last one, then post transition Events."""
    raw_previous = previous_status(ctx, body)
    status = _with_model_status(ctx, body, status, raw_previous)
    patch = status_patch(raw_previous, status)
    if patch is None:
        return
    namespace, name = key_of(body)
    written = ctx.kube.patch_status(
        kinds.LLMDEPLOYMENT.api_version, kinds.LLMDEPLOYMENT.kind, namespace, name, patch
    )
    if written is None:
        return
    ctx._written[namespace, name] = (
        body["metadata"].get("uid", ""),
        shared_strings(written.get("status") or {}),
    )
    ctx.metrics.status_writes.inc()
    previous = parse_previous(raw_previous)
    now = ctx.clock()
    wanted = events.transition_events(previous.conditions, status.conditions)
    wanted += events.adapter_events(previous.adapters, status.adapters)
    for spec in wanted:
        try:
            ctx.kube.create_event(events.render_event(body, spec, now=now, instance=ctx.instance))
        except KubeError as error:
            log.warning("could not post event %s on %s/%s: %s", spec.reason, namespace, name, error)


def _with_model_status(
    ctx: Context, body: Mapping[str, Any], status: LLMDeploymentStatus, raw_previous: Any
) -> LLMDeploymentStatus:
    """`status` with status.model: this process's pre-flight, else the stored one (a restarted
    operator keeps it until its own pre-flight runs)."""
    gate = ctx._gates.get(key_of(body))
    if gate is not None and gate.uid == body["metadata"].get("uid"):
        return status.model_copy(update={"model": gate.status})
    stored = raw_previous.get("model") if isinstance(raw_previous, Mapping) else None
    if isinstance(stored, Mapping):
        return status.model_copy(update={"model": ModelStatus.model_validate(stored)})
    return status


def write_stalled(ctx: Context, body: Mapping[str, Any], problem: Problem) -> str:
    namespace, name = key_of(body)
    remember(ctx, body, problem)
    status = derive_invalid_status(
        name=name,
        generation=body["metadata"].get("generation"),
        previous=parse_previous(previous_status(ctx, body)),
        problem=problem,
        now=ctx.clock(),
    )
    _write_status(ctx, body, status)
    log.warning("%s/%s stalled: %s: %s", namespace, name, problem.reason, problem.message)
    return RESULT_STALLED


JUST_APPLIED: Mapping[str, Any] = {"metadata": {"generation": 1}}
"""How a Deployment looks right after its first apply, before any controller saw it."""


def _derived_status(
    ctx: Context,
    body: Mapping[str, Any],
    desired: DesiredState,
    problem: Problem | None,
    *,
    applied: bool = False,
) -> LLMDeploymentStatus:
    """The status derived from the watch cache of the Deployment (no I/O).

    A Deployment this reconcile just applied but the cache has not delivered yet is read as
    freshly created (not yet observed: rolling out) rather than missing — what its own watch
    event will say a moment later, so that event needs no second status write. It can never
    read as Ready."""
    namespace, name = key_of(body)
    if problem is None:
        problem = problem_of(ctx, body)
    live = live_children(ctx, namespace, name, body["metadata"]["uid"])
    spec = desired.llmd.spec
    # The workload the spec wants: the other kind, while it waits to be deleted after a
    # pipelineParallelSize switch, says nothing about the new one.
    multi_node = spec.pipeline_parallel_size > 1
    deployment = live.get(kinds.LEADER_WORKER_SET if multi_node else kinds.DEPLOYMENT)
    if deployment is None and applied:
        deployment = JUST_APPLIED
    previous = parse_previous(previous_status(ctx, body))
    inference_pool, pool_issue = pool_view.pool_state(
        name=name,
        namespace=namespace,
        uid=str(body["metadata"].get("uid") or ""),
        spec=spec,
        previous=previous,
        verdict=ctx._pools.get((namespace, name)),
    )
    return derive_status(
        name=name,
        namespace=namespace,
        generation=desired.llmd.metadata.generation,
        previous=previous,
        spec=spec,
        sizing=desired.sizing,
        deployment=deployment,
        template_hash=desired.template_hash,
        problem=problem,
        now=ctx.clock(),
        pods=list(ctx.pods.get((namespace, name)) or ()),
        fleet=ctx.fleet.get((namespace, name)),
        hpa=live.get(kinds.HPA) if spec.autoscaling is not None else None,
        waiting=waiting_for_model(ctx, body),
        router=ctx.router,
        inference_pool=inference_pool,
        pool_issue=pool_issue,
        adapter_verdicts=verdicts_for(ctx, body, spec),
        group_restarts=restarts_of(ctx, namespace, name, str(body["metadata"].get("uid") or "")),
    )


def status_changed(ctx: Context, body: Mapping[str, Any], desired: DesiredState) -> bool:
    """`write_derived_status(ctx, body, desired, None)` would write (decided without I/O)."""
    if first_status.held(ctx, body, desired):
        return False
    status = _derived_status(ctx, body, desired, None)
    raw_previous = previous_status(ctx, body)
    return (
        status_patch(raw_previous, _with_model_status(ctx, body, status, raw_previous)) is not None
    )


def write_derived_status(
    ctx: Context,
    body: Mapping[str, Any],
    desired: DesiredState,
    problem: Problem | None,
    *,
    applied: bool = False,
) -> str:
    """Derive the status from the watch cache of the Deployment (`_derived_status`, which
    carries a remembered problem) and write it if it changed; nothing while the parent pass's
    deferred status waits for the Deployment controller (`first_status.held`)."""
    if problem is None and first_status.held(ctx, body, desired):
        return result_of(ctx, body, desired, None)
    _write_status(ctx, body, _derived_status(ctx, body, desired, problem, applied=applied))
    return result_of(ctx, body, desired, problem)


def result_of(
    ctx: Context, body: Mapping[str, Any], desired: DesiredState, problem: Problem | None
) -> str:
    """The reconcile's result for a derived status: stalled while a problem is found or
    remembered, or the model does not fit."""
    stalled = (
        problem is not None or problem_of(ctx, body) is not None or desired.sizing.fits is False
    )
    return RESULT_STALLED if stalled else RESULT_OK


def run_plan(ctx: Context, body: Mapping[str, Any], plan: ChildPlan) -> Problem | None:
    """Execute `plan`; a rejected child is a problem, remembered for every status path."""
    if plan:
        log.debug("%s/%s: %s", *key_of(body), "; ".join(plan.reasons))
    try:
        execute(ctx, plan)
    except StepRejectedError as error:
        problem = Problem(conditions.REASON_CHILD_REJECTED, str(error))
        remember(ctx, body, problem, child=error.kind)
        return problem
    return None


def guarded(ctx: Context, body: Mapping[str, Any], run: Callable[[], str]) -> str:
    """Run a reconcile step; a bug (not an API error) stalls the parent instead of retrying
    forever, and the next spec change or operator restart tries again."""
    try:
        return run()
    except (KubeError, HubUnavailableError):
        raise
    except Exception as error:
        namespace, name = key_of(body)
        log.exception("reconcile of %s/%s failed", namespace, name)
        write_stalled(ctx, body, Problem(conditions.REASON_INTERNAL_ERROR, f"{error!r}"[:1000]))
        return RESULT_ERROR
