"""Deciding in kopf's event loop which child and pod events would write nothing."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from time import perf_counter
from typing import Any

from llmop.desired import DesiredState
from llmop.metrics import RESULT_SKIPPED
from llmop.reconcile.caches import cached_parent
from llmop.reconcile.context import Context, Hint, Key, Pass, Trigger
from llmop.reconcile.entry import child_work, noted, status_target
from llmop.reconcile.writes import result_of, status_changed

# Most child and pod watch events change nothing we write (a Deployment's status moving, a pod
# being scheduled). kopf runs a sync handler in its thread pool, where such an event queues behind
# the reconciles blocked on the API server, and kopf holds every later event of that object, fully
# decoded, in a per-object queue meanwhile: under a 1,000-CR burst that backlog was the operator's
# memory and its lag. These checks answer those events from the caches alone (no I/O, no waiting
# on a lock, microseconds), so only events that lead to a write take a worker thread.
#
# Why a "quiet" answer is safe: kopf updates its indexes before it calls the handlers, so the
# caches already hold this event's object. A worker that takes the parent's lock after the check
# derives from data at least as new. A worker that holds or waits for it during the check may
# have read the caches before this event, so its status write may miss this event's news: then
# an answer that depends on the status is "not quiet", and the event goes to the worker path.
# An event that asks nothing of the status (a Service in sync) is quiet even then: the worker
# can only change the intent by parsing a new generation, and a new generation is applied whole.


def _quiet(
    ctx: Context, trigger: str, key: tuple[str, str], decide: Callable[[bool], str | None]
) -> bool:
    """Run `decide(busy)`, `busy` telling whether a worker holds or waits for `key`; record
    its result as a reconcile when it found nothing to write. Any error leaves the event to
    the worker path, which handles it."""
    busy = ctx.locks.busy(key)
    started = perf_counter()
    try:
        result = decide(busy)
    except Exception:
        return False
    if result is None:
        return False
    ctx.metrics.count_reconcile(trigger, result, perf_counter() - started)
    return True


def _quiet_result(ctx: Context, body: Mapping[str, Any], desired: DesiredState) -> str | None:
    """What `write_derived_status(ctx, body, desired, None)` returns, if it would not write."""
    if status_changed(ctx, body, desired):
        return None
    return result_of(ctx, body, desired, None)


def quiet(ctx: Context, key: Key, hint: Hint) -> bool:
    """True when `reconcile(ctx, key, hint)` would write nothing — decided from the caches,
    without I/O or blocking — and the event has been recorded as the pass would record it.
    Only a child's or a pod's event can be quiet. False when the pass must run: a child to
    repair, a status that changed, a deletion (the parent is then read fresh), or an event for
    the status while a worker is busy with this parent."""
    if hint.scope is Pass.CHILD:
        if len(hint.children) != 1 or hint.fresh:
            return False  # one event's hint only; a deletion reads the parent fresh
        event = hint.children[0]

        def decide_child(busy: bool) -> str | None:
            work = child_work(ctx, event, cached_parent(ctx, *key))
            if isinstance(work, str):
                return work  # nothing to repair, and nothing for the status
            return None if work.plan or busy else _quiet_result(ctx, work.body, work.desired)

        return _quiet(ctx, hint.trigger, key, decide_child)
    if hint.trigger is not Trigger.POD:
        return False

    def decide_status(busy: bool) -> str | None:
        if busy:
            return None
        target = status_target(ctx, *key)
        return RESULT_SKIPPED if target is None else _quiet_result(ctx, *target)

    return _quiet(ctx, hint.trigger, key, decide_status)


def triggered(
    ctx: Context, kind: str, event_type: str | None, obj: Mapping[str, Any]
) -> tuple[Key, Hint] | None:
    """The pass a watch event of an object of `kind` asks for, to put on the queue; None when
    it asks none (not ours, the initial listing) or when that pass would write nothing
    (`quiet`). Call it for every event: it first feeds this process's memory (`noted`)."""
    found = noted(ctx, kind, event_type, obj)
    if found is None or quiet(ctx, *found):
        return None
    return found
