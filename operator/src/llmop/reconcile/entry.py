"""The one pass of a parent: `reconcile(ctx, key, hint)` runs observe → desire → plan →
execute → status for one LLMDeployment under its lock, the hint picking a fast path (a full
pass, the repair of the child kinds whose events it merges, the status alone, or the deferred
status's fallback); `noted` turns a watch event into its parent's key and hint, `enqueue` puts
a trigger's pass on the operator's queue, and `check` puts there the passes of the parents a
periodic check finds due."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from llmop import conditions, kinds, names, rollout_room
from llmop.desired import DesiredState
from llmop.hub import HubUnavailableError
from llmop.kinds import ChildKind
from llmop.kube import KubeError, TerminatingError
from llmop.metrics import RESULT_OK, RESULT_SKIPPED
from llmop.observed import child_event_summary, controller_owner
from llmop.plan import ChildPlan, plan_children
from llmop.reconcile import adapter_gate, first_status, groups, in_sync, pools, rollouts, writes
from llmop.reconcile.caches import (
    cached_parent,
    key_of,
    live_children,
    one_owned,
    parse,
    previous_status,
)
from llmop.reconcile.context import ChildEvent, Context, Deferral, Hint, Key, Pass, Trigger
from llmop.reconcile.model_gate import desired_for, run_gate
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


def _desire(ctx: Context, body: Mapping[str, Any]) -> DesiredState | str:
    """Desire: the parsed spec through the group, adapter and model gates, each deciding; a
    result when the pass ends here (stalled, or waiting for the download, status written)."""
    parsed = parse(ctx, body)
    if parsed.desired is None:
        return write_stalled(ctx, body, Problem(conditions.REASON_INVALID_SPEC, parsed.error or ""))
    desired = parsed.desired
    if groups.wanted(desired) and not groups.served(ctx):
        # Before the model gate: no download for groups that cannot run here.
        return write_stalled(ctx, body, groups.missing())
    # Before the model gate: an adapter's refusal shows in status while the model downloads.
    adapter_gate.check(ctx, body, parsed)
    # No download either for a model whose plan waits for its files or was refused by them.
    sized = desired.sizing.waiting or desired.sizing.refused
    if desired.llmd.spec.model.cache is not None and not sized:
        decision = run_gate(ctx, body, parsed)
        if isinstance(decision, Problem):
            return write_stalled(ctx, body, decision)
        if not isinstance(decision, DesiredState):
            # The download runs: the status shows its progress, from the spec as parsed.
            write_derived_status(ctx, body, desired, None)
            return RESULT_OK
        desired = decision
    return adapter_gate.applied(ctx, body, desired)


def _converge_parent(ctx: Context, body: Mapping[str, Any], hint: Hint) -> str:
    """The full pass: desire, observe the live children, plan every child, execute, status."""
    wanted = _desire(ctx, body)
    if isinstance(wanted, str):
        return wanted
    desired = wanted
    generation = body["metadata"].get("generation")
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
    done = ctx.recall((namespace, name)).applied == (uid, generation)
    desired = rollouts.decided(ctx, body, desired, live.get(kinds.DEPLOYMENT))
    unserved = pools.prepare(ctx, body, desired, live)
    confirmed = writes.confirmed_kinds(ctx, body)
    plan = plan_children(
        desired, live, parent=body, repair=done, unserved=unserved, confirmed=confirmed
    )
    try:
        problem = run_plan(ctx, body, plan)
    except KubeError as error:
        if error.status == 404:  # an optional API may have gone: ask discovery next time
            pools.forget_served(ctx)
            groups.forget_served(ctx)
        raise
    if problem is None and desired.children is not None:
        # Nothing was applied while the plan waits for the model's files: its first apply,
        # once they are read, is a full one (a create-only apply of each new child).
        done_for = (uid, generation)
        ctx.update((namespace, name), lambda memory: replace(memory, applied=done_for))
    if problem is None:
        clear_problem(ctx, body, plan, repair=done)
        adapter_gate.nudge_pods(ctx, body, plan, undone_edit=_undone_edit(hint, live, plan))
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


def _undone_edit(hint: Hint, live: Mapping[ChildKind, Any], plan: ChildPlan) -> str | None:
    """The resourceVersion of the adapters ConfigMap whose watch event the pass carries and
    whose plan puts it back (an edit made out of band), else None: the pods are then all told
    again (`adapter_gate.nudge_pods`)."""
    edited = live.get(kinds.CONFIG_MAP)
    if edited is None or not any(e.kind == kinds.CONFIG_MAP for e in hint.children):
        return None
    if not any(a.kind == kinds.CONFIG_MAP.kind for a in plan.applies):
        return None
    return str(edited["metadata"].get("resourceVersion"))


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


def _child_event(
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
    loop to tell quiet events from the rest (`quiet.quiet`), the pass to act
    (`_child_pass`), deriving again under the parent's lock from caches at least as new."""
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
    plan = plan_children(
        desired, live, parent=body, only=event.kind, confirmed=writes.confirmed_kinds(ctx, body)
    )
    if not plan and from_spec:
        in_sync.note(ctx, body, event.kind, live.get(event.kind))
    if not plan and not feeds_status:
        return RESULT_SKIPPED
    edited = live.get(kinds.CONFIG_MAP) if event.kind == kinds.CONFIG_MAP and plan else None
    undone_edit = None if edited is None else str(edited["metadata"].get("resourceVersion"))
    return ChildWork(body, desired, plan, undone_edit)


def _parent_for(ctx: Context, key: Key, hint: Hint) -> Mapping[str, Any] | None:
    """The parent a pass works on: read from the API server after a child's deletion
    (`Hint.fresh`), else as kopf delivered it to its own handler, else the cached one."""
    if hint.fresh:
        return ctx.kube.read(
            kinds.LLMDEPLOYMENT.api_version, kinds.LLMDEPLOYMENT.kind, key[0], key[1]
        )
    return hint.body if hint.body is not None else cached_parent(ctx, *key)


def _child_pass(ctx: Context, key: Key, hint: Hint) -> str:
    """The child kinds of the hint's events planned (repaired if they drifted or vanished),
    then one status write; with a status pass merged in, the status is derived even when no
    child asks for it."""
    body = _parent_for(ctx, key, hint)
    if body is None:
        return RESULT_SKIPPED
    parent = body

    def run() -> str:
        desired: DesiredState | None = None
        problem: Problem | None = None
        workloads = False
        for event in hint.children:
            work = child_work(ctx, event, parent)
            if isinstance(work, str):
                continue
            desired = work.desired
            if not work.plan:
                continue
            found = run_plan(ctx, parent, work.plan)
            log.info("%s/%s: %s", *key, "; ".join(work.plan.reasons))
            if found is None:
                adapter_gate.nudge_pods(ctx, parent, work.plan, undone_edit=work.undone_edit)
                workloads |= any(a.kind in WORKLOAD_KINDS for a in work.plan.applies)
            problem = problem or found
        if desired is not None:
            applied = problem is None and workloads
            return write_derived_status(ctx, parent, desired, problem, applied=applied)
        return _status_pass(ctx, key) if Pass.STATUS in hint.also else RESULT_SKIPPED

    return guarded(ctx, parent, run)


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


def _full_pass(ctx: Context, key: Key, hint: Hint) -> str:
    """Observe → desire → plan → execute → status with nothing skipped."""
    body = _parent_for(ctx, key, hint)
    if body is None or (hint.uid is not None and body["metadata"].get("uid") != hint.uid):
        return RESULT_SKIPPED
    if body["metadata"].get("deletionTimestamp"):
        return RESULT_SKIPPED  # never resurrect a dying parent's children
    parent = body
    return guarded(ctx, parent, lambda: _converge_parent(ctx, parent, hint))


def _status_pass(ctx: Context, key: Key) -> str:
    """The status re-derived from the caches (pods, Deployment, agent readings), written only
    when it changed; desire comes from memory, and nothing is planned or applied."""
    target = status_target(ctx, *key)
    if target is None:
        return RESULT_SKIPPED
    body, desired = target
    return guarded(ctx, body, lambda: write_derived_status(ctx, body, desired, None))


def _deferred_pass(ctx: Context, key: Key) -> str:
    """The fallback of a parent pass's deferred status (`first_status`): write what the caches
    say now, unless a status path wrote this generation's status meanwhile, or run again later
    while the Deployment controller is seen at work (`first_status.wait_longer`)."""
    # Pending first: at a burst most fallbacks find the status written meanwhile, and need not
    # unpack the desired state to say so.
    cached = cached_parent(ctx, *key)
    if cached is None or not first_status.pending(ctx, cached):
        return RESULT_SKIPPED
    target = status_target(ctx, *key)
    if target is None or not first_status.pending(ctx, target[0]):
        return RESULT_SKIPPED
    body, desired = target
    if first_status.wait_longer(ctx, body, desired) and ctx.queue is not None:
        ctx.queue.put(key, Hint.DEFERRED, after=first_status.DEFER_SECONDS)
        return RESULT_SKIPPED
    first_status.take(ctx, body)
    return guarded(ctx, body, lambda: write_derived_status(ctx, body, desired, None, applied=True))


def reconcile(ctx: Context, key: Key, hint: Hint) -> str:
    """The one pass of the parent `key` (namespace, name), for whatever trigger `hint` names
    (the triggers of a burst merged into one hint by the queue): returns the result (ok,
    stalled, skipped, error), counted under the hint's trigger. Runs under the parent's lock
    and decides from the caches as they are when it runs (a hint only picks the fast path: see
    `Pass`). Raises `KubeError` for transient API failures and `HubUnavailableError` when the
    model hub cannot answer now; the caller retries (kopf with backoff) or leaves it to the
    next trigger."""
    if hint.uid is not None and hint.body is None:
        # A Job's event: nothing to count for a parent gone or recreated since.
        cached = cached_parent(ctx, *key)
        if cached is None or cached["metadata"].get("uid") != hint.uid:
            return RESULT_SKIPPED
    with ctx.locks.hold(key), ctx.metrics.reconciling(hint.trigger) as outcome:
        try:
            try:
                outcome.result = _run(ctx, key, hint)
            except (KubeError, HubUnavailableError):
                _narrower(ctx, key, hint)
                raise
        except TerminatingError:
            # The namespace is being deleted; its garbage collection takes the parent too.
            outcome.result = RESULT_SKIPPED
        return outcome.result


def _run(ctx: Context, key: Key, hint: Hint) -> str:
    """The pass the hint's scope names, then the deferred fallback if one was merged in."""
    deferral = ctx.recall(key).deferred
    if hint.scope is Pass.FULL:
        result = _full_pass(ctx, key, hint)
    elif hint.scope is Pass.CHILD:
        result = _child_pass(ctx, key, hint)
    elif hint.scope is Pass.STATUS:
        result = _status_pass(ctx, key)
    else:
        result = _deferred_pass(ctx, key)
    if Pass.DEFERRED in hint.also and deferral is not None:
        result = _fallback_after(ctx, key, deferral, result)
    return result


def _narrower(ctx: Context, key: Key, hint: Hint) -> None:
    """A merged pass failed (a transient API error, say a child still owned by a deleted
    predecessor that kopf's retry waits out): the narrower passes merged into it still run,
    as each would have alone — a status the name check or a pod asked for is written while
    the full pass waits. Their own failure is left to the next trigger."""
    narrower = hint.narrowed()
    if narrower is None:
        return
    try:
        _run(ctx, key, narrower)
    except (KubeError, HubUnavailableError) as error:
        log.warning("could not reconcile %s/%s (%s) either: %s", *key, narrower.scope.value, error)


def _fallback_after(ctx: Context, key: Key, deferral: Deferral, result: str) -> str:
    """A deferred status's fallback merged into another pass: it runs after that pass only if
    the pass left the deferral as it found it (a pass that wrote the status ended it; one that
    deferred again put a new fallback on the queue), so the parent's status is written once."""
    if ctx.recall(key).deferred is not deferral:
        return result
    fallback = _deferred_pass(ctx, key)
    return fallback if result == RESULT_SKIPPED else result


def noted(
    ctx: Context, kind: str, event_type: str | None, obj: Mapping[str, Any]
) -> tuple[Key, Hint] | None:
    """A watch event of an object of `kind` ("Pod", "Job" or a child kind): fed to this
    process's memory (a group's pods, the Deployment controller at work, the managed-objects
    gauge), then the parent it asks a pass of and the hint for it; None when it asks nothing
    (not ours, or the initial listing: the parents' resume passes run then). Call it for every
    event, before `quiet` and before the queue (which may drop it). A child's hint keeps only
    what its pass reads of the event (`observed.child_event_summary`)."""
    if kind == kinds.POD.kind:
        # Every pod event: a group's recreate shows only in its new leader's event.
        groups.note_pod(ctx, event_type, obj)
        metadata = obj.get("metadata") or {}
        name = (metadata.get("labels") or {}).get(names.LABEL_DEPLOYMENT)
        if event_type is None or not name:
            return None
        return (str(metadata.get("namespace") or ""), name), Hint.POD
    if kind == kinds.JOB.kind:
        owner = controller_owner(obj)
        if owner is None or event_type is None:
            return None
        # A finished download creates the engine pods; a failed one stalls the parent.
        return (owner.namespace, owner.name), Hint(Trigger.CHILD, Pass.FULL, uid=owner.uid)
    if event_type != "DELETED" and kind == kinds.DEPLOYMENT.kind:
        # The deferred statuses' fallback judges from it whether the Deployment controller is
        # at work.
        first_status.note_deployment(ctx, obj)
    event = _child_event(ctx, event_type, child_event_summary(obj))
    if event is None:
        return None
    return (event.owner.namespace, event.owner.name), Hint.child(event)


Check = Literal["hub", "pools", "groups", "downloads"]
"""The periodic checks that find parents no event will bring back."""


def _due(ctx: Context, check: Check) -> list[tuple[Key, Hint]]:
    if check == "groups":
        return groups.due(ctx)
    if check == "downloads":
        # The Job emits no event while bytes flow: a pass reads the progress, rate and ETA.
        keys = sorted(key for key, memory in ctx.memories() if memory.downloading)
        for key in keys:
            if cached_parent(ctx, *key) is None:
                ctx.update(key, lambda memory: replace(memory, downloading=False))
        hint = Hint.DOWNLOAD
    else:
        keys = adapter_gate.due_for_hub(ctx) if check == "hub" else pools.recheck(ctx)
        hint = Hint.PARENT
    return [(key, hint) for key in keys if cached_parent(ctx, *key) is not None]


def enqueue(ctx: Context, key: Key, hint: Hint) -> None:
    """A trigger: the pass of `key` goes on the operator's queue (`Context.queue`), where it
    merges with what waits there for `key` and runs on the one worker of `key`. Without a
    queue (tests, tools) the pass runs at once here, and a transient failure is logged: the
    next trigger tries again."""
    if ctx.queue is not None:
        ctx.queue.put(key, hint)
        return
    try:
        reconcile(ctx, key, hint)
    except (KubeError, HubUnavailableError) as error:
        log.warning("could not reconcile %s/%s (%s): %s", *key, hint.trigger, error)


def check(ctx: Context, which: Check) -> int:
    """One round of a periodic check: the pass of each parent it finds due goes on the queue
    (`enqueue`) — the adapters the Hub could not answer for, the InferencePools whose API came,
    the groups that changed, the downloads that run. Returns how many it asked for."""
    due = _due(ctx, which)
    for key, hint in due:
        enqueue(ctx, key, hint)
    return len(due)
