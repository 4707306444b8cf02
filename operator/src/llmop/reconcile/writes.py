"""Doing: the executor of a child plan (deciding nothing), status derivation from the caches
and status writes with their transition Events, and the error policy (`guarded`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from llmop import coldstart, conditions, events, kinds, name_owners, pool_view
from llmop.api.v1alpha1 import LLMDeploymentStatus, ModelStatus
from llmop.desired import DesiredState
from llmop.hub import HubUnavailableError
from llmop.kinds import ChildKind
from llmop.kube import ExistsError, KubeError, RejectedError
from llmop.metrics import RESULT_ERROR, RESULT_OK, RESULT_STALLED
from llmop.observed import shared_strings
from llmop.plan import REFUSE, WAIT, Apply, ChildPlan, Delete, takeover
from llmop.pods import PodIssue
from llmop.reconcile import first_status
from llmop.reconcile.adapter_gate import verdicts_for
from llmop.reconcile.caches import key_of, live_children, previous_status, waiting_for_model
from llmop.reconcile.context import Context, Hint, ParentMemory
from llmop.reconcile.groups import restarts_of
from llmop.reconcile.problems import problem_of, remember
from llmop.status import (
    Observed,
    Problem,
    derive_invalid_status,
    derive_status,
    parse_previous,
    status_patch,
)

log = logging.getLogger("llmop.reconcile.writes")


class StepRejectedError(RejectedError):
    """The API server refused one step of a plan; `kind` names the child it was for."""

    def __init__(self, kind: str, error: RejectedError) -> None:
        super().__init__(str(error), error.status)
        self.kind = kind


class NameTakenError(Exception):
    """A child's name is taken by an object that is not the parent's (`plan.takeover`); the
    message says which and what to do."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


CONFLICT_RETRY_SECONDS = 10.0
"""How often a parent stalled by a name conflict tries again: no watch event tells when the
other object goes (it is not ours, and the child watches select our label)."""


def execute(ctx: Context, plan: ChildPlan) -> None:
    """Carry out a child plan, step by step (deciding nothing but for `plan.takeover`'s verdict
    on an object in a new child's way). Raises `StepRejectedError` when the API server refuses
    an object, `NameTakenError` when a new child's name is someone else's, `KubeError` for
    transient failures."""
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
    """Apply one step. A new child is created only if its name is free — still one request —
    and an object found in its way is read once, then applied to only when it is ours."""
    try:
        ctx.kube.apply(
            step.manifest, field_manager=step.field_manager, want_result=False, new=step.new
        )
    except ExistsError:
        metadata = step.manifest["metadata"]
        api_version = step.manifest["apiVersion"]
        # Listed by name, not read: the child kinds' RBAC has list (their watches), not get.
        found_objects = ctx.kube.list(
            api_version,
            step.kind,
            metadata["namespace"],
            field_selector=f"metadata.name={metadata['name']}",
        )
        existing = found_objects[0] if found_objects else None
        if existing is None:
            # Gone between the two requests: the retry creates it.
            raise KubeError(f"{step.kind} {metadata['name']} vanished while created") from None
        found = takeover(step.manifest, existing)
        if found.verdict == WAIT:
            raise KubeError(
                f"{step.kind} {metadata['namespace']}/{metadata['name']} still belongs to a "
                "deleted LLMDeployment of this name; waiting for the garbage collector"
            ) from None
        if found.verdict == REFUSE:
            raise NameTakenError(step.kind, found.message) from None
        ctx.kube.apply(step.manifest, field_manager=step.field_manager, want_result=False)
    ctx.metrics.child_writes.labels(step.kind, "apply").inc()


def _write_status(
    ctx: Context, body: Mapping[str, Any], status: LLMDeploymentStatus, observed: Observed
) -> None:
    """Write `status` when it differs from the last one (`observed.stored`), then post
    transition Events."""
    status = _with_model_status(ctx, body, status, observed.stored)
    patch = status_patch(observed.stored, status)
    if patch is None:
        return
    namespace, name = key_of(body)
    written = ctx.kube.patch_status(
        kinds.LLMDEPLOYMENT.api_version, kinds.LLMDEPLOYMENT.kind, namespace, name, patch
    )
    if written is None:
        return
    kept = (body["metadata"].get("uid", ""), shared_strings(written.get("status") or {}))
    ctx.update((namespace, name), lambda memory: replace(memory, written=kept))
    ctx.metrics.status_writes.inc()
    previous = observed.previous
    ctx.metrics.started(coldstart.new_phase_seconds(previous.startup, status.startup))
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
    gate = ctx.recall(key_of(body)).model_gate
    if gate is not None and gate.uid == body["metadata"].get("uid"):
        return status.model_copy(update={"model": gate.status})
    stored = raw_previous.get("model") if isinstance(raw_previous, Mapping) else None
    if isinstance(stored, Mapping):
        return status.model_copy(update={"model": ModelStatus.model_validate(stored)})
    return status


def _previous(ctx: Context, body: Mapping[str, Any]) -> Observed:
    """The parent's identity and its status as last written, parsed once; nothing else."""
    namespace, name = key_of(body)
    stored = previous_status(ctx, body)
    return Observed(name, namespace, previous=parse_previous(stored), stored=stored)


def write_stalled(ctx: Context, body: Mapping[str, Any], problem: Problem) -> str:
    namespace, name = key_of(body)
    remember(ctx, body, problem)
    observed = _previous(ctx, body)
    status = derive_invalid_status(
        name=name,
        generation=body["metadata"].get("generation"),
        previous=observed.previous,
        problem=problem,
        now=ctx.clock(),
    )
    _write_status(ctx, body, status, observed)
    log.warning("%s/%s stalled: %s: %s", namespace, name, problem.reason, problem.message)
    return RESULT_STALLED


JUST_APPLIED: Mapping[str, Any] = {"metadata": {"generation": 1}}
"""How a Deployment looks right after its first apply, before any controller saw it."""


def observe(
    ctx: Context,
    body: Mapping[str, Any],
    desired: DesiredState,
    problem: Problem | None,
    live: Mapping[ChildKind, Any],
    *,
    applied: bool = False,
) -> Observed:
    """What one status write derives from, gathered once from the caches and this process's
    memory (no I/O): `live` (the children as `live_children` listed them for this write), the
    pods, the agents' readings, the status as last written, and the verdicts — `problem`, else
    the one remembered; the model download waited for; the pool's, the adapters'; the groups'
    restarts.

    A workload this reconcile just applied but the cache has not delivered yet is read as
    freshly created (not yet observed: rolling out) rather than missing — what its own watch
    event will say a moment later, so that event needs no second status write. It can never
    read as Ready."""
    namespace, name = key_of(body)
    uid = str(body["metadata"].get("uid") or "")
    spec = desired.llmd.spec
    # The workload the spec wants: the other kind, while it waits to be deleted after a
    # pipelineParallelSize switch, says nothing about the new one.
    workload = kinds.LEADER_WORKER_SET if spec.pipeline_parallel_size > 1 else kinds.DEPLOYMENT
    children = dict(live)
    if children.get(workload) is None and applied:
        children[workload] = JUST_APPLIED
    stored = previous_status(ctx, body)
    previous = parse_previous(stored)
    memory = ctx.recall((namespace, name))
    routing, name_issue = _names(ctx, namespace, name, previous)
    inference_pool, pool_issue = pool_view.pool_state(
        name=name, namespace=namespace, uid=uid, spec=spec, previous=previous, verdict=memory.pool
    )
    return Observed(
        name=name,
        namespace=namespace,
        generation=desired.llmd.metadata.generation,
        previous=previous,
        stored=stored,
        children=children,
        pods=list(ctx.pods.get((namespace, name)) or ()),
        fleet=memory.fleet,
        problem=problem if problem is not None else problem_of(ctx, body),
        waiting=waiting_for_model(ctx, body),
        router=ctx.router,
        routing=routing,
        name_issue=name_issue,
        inference_pool=inference_pool,
        pool_issue=pool_issue,
        adapter_verdicts=verdicts_for(ctx, body, spec),
        group_restarts=restarts_of(ctx, namespace, name, uid),
    )


def _names(
    ctx: Context, namespace: str, name: str, previous: LLMDeploymentStatus
) -> tuple[list[str] | None, PodIssue | None]:
    """The names a parent owns through the router and why it lost any (`llmop.name_check`'s
    verdict; none: it claims nothing, or it is newer than the last decision). Nothing decided
    yet in this process: what the status said, so a restart never drops `status.routing` and
    lets the router fall back to the oldest CR meanwhile.

    Undecided is written as owning nothing (`servedNames: []`), never as no `routing`: a CR
    whose status lacks `routing` is routed by the router's rule for operators that predate
    names (the oldest claimant), which would hand a name reserved to a deleted owner to a new
    CR for the seconds until the next decision."""
    if ctx.router is None:
        return None, None
    if ctx.names is not None:
        verdict = ctx.names.get((namespace, name))
        if verdict is None:
            return [], None
    else:
        before = conditions.find(previous.conditions, conditions.DEGRADED)
        kept = before is not None and before.reason in name_owners.REASONS
        return (
            [] if previous.routing is None else list(previous.routing.served_names),
            PodIssue(before.reason, before.message, "") if kept and before else None,
        )
    issue = name_owners.verdict_issue(
        verdict,
        namespace,
        allowed=ctx.config.serving_namespaces,
        now=ctx.clock(),
        grace=timedelta(seconds=ctx.config.name_grace_seconds),
        external_namespace=ctx.config.own_namespace or ctx.router.ref.namespace,
    )
    return list(verdict.owned), issue


def _derive(observed: Observed, desired: DesiredState, now: datetime) -> LLMDeploymentStatus:
    return derive_status(
        observed,
        desired.llmd.spec,
        desired.sizing,
        template_hash=desired.template_hash,
        now=now,
    )


def _live(ctx: Context, body: Mapping[str, Any]) -> dict[ChildKind, Any]:
    return live_children(ctx, *key_of(body), body["metadata"]["uid"])


def status_changed(ctx: Context, body: Mapping[str, Any], desired: DesiredState) -> bool:
    """`write_derived_status(ctx, body, desired, None)` would write (decided without I/O)."""
    live = _live(ctx, body)
    if first_status.held(ctx, body, desired, live):
        return False
    observed = observe(ctx, body, desired, None, live)
    status = _derive(observed, desired, ctx.clock())
    stored = observed.stored
    return status_patch(stored, _with_model_status(ctx, body, status, stored)) is not None


def write_derived_status(
    ctx: Context,
    body: Mapping[str, Any],
    desired: DesiredState,
    problem: Problem | None,
    *,
    applied: bool = False,
) -> str:
    """Derive the status from the watch caches (`observe`: the children listed once, the
    previous status parsed once, a remembered problem carried) and write it if it changed;
    nothing while the parent pass's deferred status waits for the Deployment controller
    (`first_status.held`)."""
    live = _live(ctx, body)
    if problem is None and first_status.held(ctx, body, desired, live):
        return result_of(ctx, body, desired, None)
    observed = observe(ctx, body, desired, problem, live, applied=applied)
    _write_status(ctx, body, _derive(observed, desired, ctx.clock()), observed)
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
        _confirm(ctx, body, plan)
    except StepRejectedError as error:
        problem = Problem(conditions.REASON_CHILD_REJECTED, str(error))
        remember(ctx, body, problem, child=error.kind)
        return problem
    except NameTakenError as error:
        problem = Problem(conditions.REASON_CHILD_NAME_CONFLICT, str(error))
        remember(ctx, body, problem, child=error.kind)
        _retry_later(ctx, body)
        return problem
    return None


def confirmed_kinds(ctx: Context, body: Mapping[str, Any]) -> frozenset[ChildKind]:
    """The kinds not watched whose child this process has applied for this parent (its own:
    applied as usual; any other is created only, `plan.plan_children`)."""
    memory = ctx.recall(key_of(body)).confirmed
    if memory is None or memory[0] != body["metadata"].get("uid"):
        return frozenset()
    return memory[1]


def _confirm(ctx: Context, body: Mapping[str, Any], plan: ChildPlan) -> None:
    """Remember the kinds not watched this plan applied: their children are this parent's."""
    applied = frozenset(
        kind
        for step in plan.steps()
        if isinstance(step, Apply) and (kind := kinds.child(step.kind)) and not kind.watched
    )
    if not applied:
        return
    uid = str(body["metadata"].get("uid") or "")

    def add(memory: ParentMemory) -> ParentMemory:
        known = memory.confirmed[1] if memory.confirmed and memory.confirmed[0] == uid else None
        return replace(memory, confirmed=(uid, (known or frozenset()) | applied))

    ctx.update(key_of(body), add)


def _retry_later(ctx: Context, body: Mapping[str, Any]) -> None:
    """Put a parent pass on the queue `CONFLICT_RETRY_SECONDS` from now, unless one is already
    due: the pass that timer runs asks again if the name is still taken, so one timer chain runs
    per parent, whatever else passes it meanwhile."""
    key = key_of(body)
    now = time.monotonic()
    due = ctx.recall(key).conflict_retry_at
    if ctx.queue is None or (due is not None and now < due):
        return
    at = now + CONFLICT_RETRY_SECONDS
    ctx.update(key, lambda memory: replace(memory, conflict_retry_at=at))
    ctx.queue.put(key, Hint.PARENT, after=CONFLICT_RETRY_SECONDS)


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
