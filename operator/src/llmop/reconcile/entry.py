"""The entry points: the parent path (apply every child, write status), the child path (repair
one child, re-derive status), and the status-only paths (pod, fleet, Job, download)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from llmop import conditions, kinds, names, rollout_room
from llmop.desired import DesiredState
from llmop.hub import HubUnavailableError
from llmop.kinds import ChildKind
from llmop.kube import KubeError, TerminatingError
from llmop.metrics import RESULT_OK, RESULT_SKIPPED
from llmop.plan import ChildPlan, plan_children
from llmop.reconcile import adapter_gate, first_status, groups, in_sync, pools, rollouts
from llmop.reconcile.caches import (
    Owner,
    cached_parent,
    controller_owner,
    key_of,
    live_children,
    one_owned,
    parse,
    previous_status,
)
from llmop.reconcile.context import (
    TRIGGER_CHILD,
    TRIGGER_FLEET,
    TRIGGER_PARENT,
    TRIGGER_POD,
    Context,
)
from llmop.reconcile.model_gate import TRIGGER_DOWNLOAD, desired_for, run_gate
from llmop.reconcile.problems import clear_problem, problem_of
from llmop.reconcile.writes import (
    guarded,
    result_of,
    run_plan,
    write_derived_status,
    write_stalled,
)
from llmop.status import Problem, autoscaler_issue

log = logging.getLogger("llmop.reconcile.entry")

WORKLOAD_KINDS = frozenset(kind.kind for kind in kinds.WORKLOADS)


def _converge_parent(ctx: Context, body: Mapping[str, Any]) -> str:
    parsed = parse(ctx, body)
    if parsed.desired is None:
        return write_stalled(ctx, body, Problem(conditions.REASON_INVALID_SPEC, parsed.error or ""))
    desired = parsed.desired
    if groups.wanted(desired) and not groups.served(ctx):
        # Before the model gate: no download for groups that cannot run here.
        return write_stalled(ctx, body, groups.missing())
    # Before the model gate: an adapter's refusal shows in status while the model downloads.
    adapter_gate.check(ctx, body, parsed)
    if desired.llmd.spec.model.cache is not None:
        gated = run_gate(ctx, body, parsed)
        if isinstance(gated, str):
            return gated
        desired = gated
    desired = adapter_gate.applied(ctx, body, desired)
    namespace, name = key_of(body)
    uid = body["metadata"]["uid"]
    live = live_children(ctx, namespace, name, uid)
    if desired.llmd.spec.autoscaling is not None:
        # The handover decides from who owns spec.replicas right now: read it fresh, since
        # the watch cache may not show our own last apply yet.
        fresh = ctx.kube.read(kinds.DEPLOYMENT.api_version, kinds.DEPLOYMENT.kind, namespace, name)
        live[kinds.DEPLOYMENT] = fresh if one_owned([fresh] if fresh else [], uid) else None
    # kopf may run the create handler of one generation twice (under load its own annotation
    # patch can arrive after the next event): what this process already applied is only repaired.
    done = ctx.recall((namespace, name)).applied == (uid, parsed.generation)
    desired = rollouts.decided(ctx, body, desired, live.get(kinds.DEPLOYMENT))
    unserved = pools.prepare(ctx, body, desired, live)
    plan = plan_children(desired, live, parent=body, repair=done, unserved=unserved)
    try:
        problem = run_plan(ctx, body, plan)
    except KubeError as error:
        if error.status == 404:  # an optional API may have gone: ask discovery next time
            pools.forget_served(ctx)
            groups.forget_served(ctx)
        raise
    if problem is None:
        done_for = (uid, parsed.generation)
        ctx.update((namespace, name), lambda memory: replace(memory, applied=done_for))
        clear_problem(ctx, body, plan, repair=done)
        adapter_gate.nudge_pods(ctx, body, plan)
        if not done:
            adapter_gate.note_lora_rollout(ctx, body, live.get(kinds.DEPLOYMENT), plan)
        pools.settle(ctx, body, desired, unserved=bool(unserved))
    applied = problem is None and any(a.kind in WORKLOAD_KINDS for a in plan.applies)
    return _write_parent_status(ctx, body, desired, problem, applied=applied)


def _write_parent_status(
    ctx: Context,
    body: Mapping[str, Any],
    desired: DesiredState,
    problem: Problem | None,
    *,
    applied: bool,
) -> str:
    """The parent pass's status: deferred to the Deployment controller's first status when it
    applied the workload and found nothing wrong (`first_status`), else written now."""
    if (
        applied
        and result_of(ctx, body, desired, None) == RESULT_OK
        and first_status.defer(ctx, body, desired)
    ):
        return RESULT_OK
    return write_derived_status(ctx, body, desired, problem, applied=applied)


def reconcile_parent(
    ctx: Context, body: Mapping[str, Any], *, trigger: str = TRIGGER_PARENT
) -> str:
    """Bring one LLMDeployment (`body`, as the watch delivered it) and its children to the
    desired state; returns the result (ok, stalled, skipped, error). Raises `KubeError` for
    transient API failures, `HubUnavailableError` when the model hub cannot answer now."""
    namespace, name = key_of(body)
    with ctx.locks.hold((namespace, name)), ctx.metrics.reconciling(trigger) as outcome:
        if body["metadata"].get("deletionTimestamp"):
            outcome.result = RESULT_SKIPPED  # never resurrect a dying parent's children
            return outcome.result
        try:
            outcome.result = guarded(ctx, body, lambda: _converge_parent(ctx, body))
        except TerminatingError:
            # The namespace is being deleted; its garbage collection takes the parent too.
            outcome.result = RESULT_SKIPPED
        return outcome.result


def reconcile_cached(ctx: Context, keys: Iterable[tuple[str, str]], *, why: str) -> int:
    """Run the parent pass of each of `keys` as the watch cache holds it (for the periodic
    checks that find parents no event will bring back); a transient failure is logged with
    `why` and the next check tries again. Returns how many ran."""
    ran = 0
    for namespace, name in keys:
        body = cached_parent(ctx, namespace, name)
        if body is None:
            continue
        try:
            reconcile_parent(ctx, body)
            ran += 1
        except (KubeError, HubUnavailableError) as error:
            log.warning("could not %s of %s/%s: %s", why, namespace, name, error)
    return ran


def _hpa_news(parent: Mapping[str, Any], hpa: Mapping[str, Any] | None) -> bool:
    """The HPA's event matters to the status: it cannot scale, or the status still says so.
    (Its metric readings change at every sync; those events derive nothing. While no replica is
    ready, a Deployment event brings the first ready one and derives the status then.)"""
    ready = int((parent.get("status") or {}).get("readyReplicas") or 0)
    if hpa is not None and autoscaler_issue(hpa, ready) is not None:
        return True
    return any(
        c.get("type") == conditions.DEGRADED
        and c.get("reason") == conditions.REASON_AUTOSCALER_INACTIVE
        for c in (parent.get("status") or {}).get("conditions") or ()
    )


@dataclass(frozen=True)
class ChildEvent:
    """A watch event of a child we own, as both the event-loop check and the worker read it."""

    kind: ChildKind
    owner: Owner
    type: str
    hpa: Mapping[str, Any] | None  # the HPA as this event delivered it (its conditions matter)


def child_event(
    ctx: Context, event_type: str | None, child: Mapping[str, Any]
) -> ChildEvent | None:
    """Record a child's watch event (the managed-objects gauge); None when it asks nothing of
    a parent: not ours, or the initial listing (the parents' resume handlers reconcile then)."""
    kind = kinds.child(str(child.get("kind")))
    owner = controller_owner(child)
    if owner is None or kind is None:
        return None
    metadata = child.get("metadata") or {}
    key = f"{metadata.get('namespace')}/{metadata.get('name')}"
    ctx.metrics.observe_object(kind.kind, key, present=event_type != "DELETED")
    if event_type is None:
        return None
    hpa = child if kind == kinds.HPA and event_type != "DELETED" else None
    return ChildEvent(kind, owner, event_type, hpa)


@dataclass(frozen=True)
class ChildWork:
    """What a child event asks of its parent: repair the child (a non-empty plan), then write
    the parent's status if it changed."""

    body: Mapping[str, Any]
    desired: DesiredState
    plan: ChildPlan
    # The resourceVersion of an edited adapters ConfigMap the plan puts back (else None): the
    # pods' kubelets may have delivered the edit already, so every pod is told again.
    undone_edit: str | None = None


def child_work(ctx: Context, event: ChildEvent, body: Mapping[str, Any] | None) -> ChildWork | str:
    """The one decision for a child event, from the caches and the parent `body` (no I/O): a
    result when the parent is to be left alone, else the work. Both paths call it — the event
    loop to tell quiet events from the rest (`quiet_child_event`), the worker to act
    (`_refresh`), deriving again under the parent's lock from caches at least as new."""
    owner = event.owner
    if (
        body is None
        or body["metadata"].get("uid") != owner.uid
        or body["metadata"].get("deletionTimestamp")
    ):
        return RESULT_SKIPPED
    live = live_children(ctx, owner.namespace, owner.name, owner.uid)
    # Only the Deployment feeds the status, and the HPA when it cannot scale.
    feeds_status = event.kind == kinds.DEPLOYMENT or (
        event.kind == kinds.HPA and _hpa_news(body, event.hpa)
    )
    if in_sync.known(ctx, body, event.kind, live.get(event.kind)):
        if not feeds_status:
            return RESULT_SKIPPED
        found = desired_for(ctx, body, parse(ctx, body))
        return RESULT_SKIPPED if found is None else ChildWork(body, found, ChildPlan())
    parsed = parse(ctx, body)
    desired = desired_for(ctx, body, parsed)
    if desired is None:
        # The parent path owns the status of an unreadable spec, and of a model cache that
        # this process has not yet seen filled.
        return RESULT_SKIPPED
    from_spec = desired is parsed.desired
    # The ConfigMap as the parent path applied it: a repair never puts back a refused adapter.
    desired = adapter_gate.applied(ctx, body, desired)
    # The strategy as the parent path decided it: a repair never undoes the counted surge.
    desired = rollout_room.with_strategy(desired, live.get(kinds.DEPLOYMENT))
    plan = plan_children(desired, live, parent=body, only=event.kind)
    if not plan and from_spec:
        in_sync.note(ctx, body, event.kind, live.get(event.kind))
    if not plan and not feeds_status:
        return RESULT_SKIPPED
    edited = live.get(kinds.CONFIG_MAP) if event.kind == kinds.CONFIG_MAP and plan else None
    undone_edit = None if edited is None else str(edited["metadata"].get("resourceVersion"))
    return ChildWork(body, desired, plan, undone_edit)


def _refresh(ctx: Context, event: ChildEvent) -> str:
    owner = event.owner
    if event.type == "DELETED":
        # Recreating a child is the one write a stale cache could get wrong (a parent being
        # deleted right now): ask the API server.
        body = ctx.kube.read(
            kinds.LLMDEPLOYMENT.api_version, kinds.LLMDEPLOYMENT.kind, owner.namespace, owner.name
        )
    else:
        body = cached_parent(ctx, owner.namespace, owner.name)
    if body is None:
        return RESULT_SKIPPED
    parent = body

    def run() -> str:
        work = child_work(ctx, event, parent)
        if isinstance(work, str):
            return work
        problem = None
        if work.plan:
            problem = run_plan(ctx, parent, work.plan)
            log.info("%s/%s: %s", owner.namespace, owner.name, "; ".join(work.plan.reasons))
            if problem is None:
                adapter_gate.nudge_pods(ctx, parent, work.plan, undone_edit=work.undone_edit)
        applied = problem is None and any(a.kind in WORKLOAD_KINDS for a in work.plan.applies)
        return write_derived_status(ctx, parent, work.desired, problem, applied=applied)

    return guarded(ctx, parent, run)


def refresh_from_child(ctx: Context, event_type: str | None, child: Mapping[str, Any]) -> str:
    """React to a watch event of a labelled child (Deployment, Service, HPA, PDB)."""
    event = child_event(ctx, event_type, child)
    if event is None:
        return RESULT_SKIPPED
    with (
        ctx.locks.hold((event.owner.namespace, event.owner.name)),
        ctx.metrics.reconciling(TRIGGER_CHILD) as outcome,
    ):
        try:
            outcome.result = _refresh(ctx, event)
        except TerminatingError:
            outcome.result = RESULT_SKIPPED
        return outcome.result


def refresh_from_pod(ctx: Context, event_type: str | None, pod: Mapping[str, Any]) -> str:
    """React to a watch event of an engine pod: re-derive its parent's status, so a pod that
    cannot be scheduled, pulled or started is named there within seconds. Writes only the
    status, and only when it changed."""
    metadata = pod.get("metadata") or {}
    namespace = str(metadata.get("namespace") or "")
    name = (metadata.get("labels") or {}).get(names.LABEL_DEPLOYMENT)
    if event_type is None or not name:
        return RESULT_SKIPPED  # initial listing: the parents' resume handlers derive status
    return refresh_status(ctx, namespace, name, trigger=TRIGGER_POD)


def status_target(
    ctx: Context, namespace: str, name: str
) -> tuple[Mapping[str, Any], DesiredState] | None:
    """The cached parent and its desired state, when the status paths own its status: not for
    a missing or dying parent, nor an unreadable spec (the parent path owns those). A problem
    this process found is carried by the derivation (`problem_of`); a Stalled status it has
    no memory of (written before a restart or by another leader, or a model that does not fit)
    is left to the parent path, which finds the problem again on its first pass."""
    body = cached_parent(ctx, namespace, name)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return None
    desired = desired_for(ctx, body, parse(ctx, body))
    stalled = problem_of(ctx, body) is None and any(
        c.get("type") == conditions.STALLED and c.get("status") == "True"
        for c in (previous_status(ctx, body) or {}).get("conditions") or []
    )
    return None if desired is None or stalled else (body, desired)


def refresh_status(ctx: Context, namespace: str, name: str, *, trigger: str = TRIGGER_FLEET) -> str:
    """Re-derive one parent's status from the caches (pods, Deployment, agent readings);
    writes only the status, and only when it changed."""
    with ctx.locks.hold((namespace, name)), ctx.metrics.reconciling(trigger) as outcome:
        target = status_target(ctx, namespace, name)
        if target is None:
            outcome.result = RESULT_SKIPPED
            return outcome.result
        body, desired = target
        outcome.result = guarded(ctx, body, lambda: write_derived_status(ctx, body, desired, None))
        return outcome.result


def write_deferred_status(ctx: Context, namespace: str, name: str) -> str:
    """The fallback of a parent pass's deferred status (`first_status`): write what the caches
    say now, unless a status path wrote this generation's status meanwhile, or run again later
    while the Deployment controller is seen at work (`first_status.wait_longer`)."""
    with ctx.locks.hold((namespace, name)), ctx.metrics.reconciling(TRIGGER_PARENT) as outcome:
        # Pending first: at a burst most fallbacks find the status written meanwhile, and
        # need not unpack the desired state to say so.
        cached = cached_parent(ctx, namespace, name)
        if cached is None or not first_status.pending(ctx, cached):
            outcome.result = RESULT_SKIPPED
            return outcome.result
        target = status_target(ctx, namespace, name)
        if target is None or not first_status.pending(ctx, target[0]):
            outcome.result = RESULT_SKIPPED
            return outcome.result
        body, desired = target
        if first_status.wait_longer(ctx, body, desired) and ctx.schedule_status is not None:
            ctx.schedule_status(namespace, name)
            outcome.result = RESULT_SKIPPED
            return outcome.result
        first_status.take(ctx, body)
        outcome.result = guarded(
            ctx, body, lambda: write_derived_status(ctx, body, desired, None, applied=True)
        )
        return outcome.result


def refresh_from_job(ctx: Context, event_type: str | None, job: Mapping[str, Any]) -> str:
    """A model download Job changed: reconcile its parent (a finished download creates the
    engine pods; a failed one stalls the parent)."""
    owner = controller_owner(job)
    if owner is None or event_type is None:
        return RESULT_SKIPPED  # initial listing: the parents' resume handlers run anyway
    body = cached_parent(ctx, owner.namespace, owner.name)
    if body is None or body["metadata"].get("uid") != owner.uid:
        return RESULT_SKIPPED
    return reconcile_parent(ctx, body, trigger=TRIGGER_CHILD)


def poll_downloads(ctx: Context) -> None:
    """Refresh the status of every parent whose download runs (progress, rate, ETA): the Job
    emits no event while bytes flow. Called every few seconds by the operator's poller."""
    for namespace, name in sorted(key for key, memory in ctx.memories() if memory.downloading):
        body = cached_parent(ctx, namespace, name)
        if body is None:
            ctx.update((namespace, name), lambda memory: replace(memory, downloading=False))
            continue
        try:
            reconcile_parent(ctx, body, trigger=TRIGGER_DOWNLOAD)
        except (KubeError, HubUnavailableError) as error:
            log.warning("download progress of %s/%s: %s", namespace, name, error)
