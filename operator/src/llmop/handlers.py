"""kopf handler registrations: thin, and only orchestration.

- One level-based `reconcile` on create/update/resume of LLMDeployments. No delete handler, no
  timers or daemons on LLMDeployment: kopf then adds no finalizer, and children go by owner
  reference garbage collection.
- kopf indexes keep a watch-fed cache of the parents and of every watched child kind (the kinds
  come from `llmop.kinds`), so a child event needs no GET of its parent and the status is always
  derived from the newest child seen. kopf runs no handler until every index holds its initial
  listing, so a restarted operator sees its children before it reconciles anything.
- Low-level `on.event` handlers on the children (filtered by our label, also server side via
  `settings.watching.label_selectors` in `main`) repair drift and re-derive the parent's status.
  Low-level handlers and indexes store nothing on the objects.
- The index functions, the counting handler and the child and pod event handlers are `async`:
  kopf runs a sync function in its thread pool, where every watch event would otherwise queue
  behind the reconciles blocked on API calls. kopf 1.45 processes every queued event of an object
  in turn (no batching), so the longer events wait, the more full decoded bodies sit in its
  per-object queues: under a 1,000-CR burst that lag, not any cache, was the operator's memory.
  The event handlers decide from the caches in the event loop (`reconcile.quiet_child_event`,
  `quiet_pod_event`: no I/O, no blocking) and send only events that lead to a write to the pool,
  coalesced per object (`Coalescer`) so that a handler never waits on the pool and kopf's queue
  of that object drains at once.

- kopf's memory of the last handled spec is kept in this process (`llmop.persistence`), not on
  the object; the count handler drops a deleted object's entry.
- A startup activity lets the parent passes defer their status write to the Deployment
  controller's first status (`reconcile.first_status`), with a fallback run on this loop.
- Startup activities also run `llmop.router_check`, `llmop.pool_check` (the InferencePools
  that wait for their CRDs), `llmop.hub_check` (adapters the Hub could not answer for) and
  `llmop.group_check` (the LeaderWorkerSets, listed instead of watched); cleanup stops them.
- A startup activity starts `llmop.late_crds` on the `Insights` that `main` hands kopf: a kind
  whose CRD appeared after kopf last read discovery is served without a restart.
- One startup activity starts `llmop.fleet`'s agent reader as a task of kopf's event loop (no
  daemon per LLMDeployment: that would add a finalizer); the cleanup activity stops it.

Handlers return None so kopf writes no handler results into the status.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import kopf
from kopf._cogs.structs.references import Insights

from llmop import (
    credentials,
    fleet,
    group_check,
    hub_check,
    idle_check,
    kinds,
    late_crds,
    names,
    pool_check,
    router_check,
)
from llmop.api.v1alpha1 import GROUP, PLURAL, VERSION
from llmop.engine_client import AgentClient
from llmop.hub import HubUnavailableError
from llmop.kube import KubeError
from llmop.observed import child_event_summary, child_summary, parent_summary
from llmop.persistence import ProcessDiffBase
from llmop.pods import pod_summary
from llmop.reconcile import (
    Context,
    controller_owner,
    note_deployment,
    note_group_pod,
    quiet_child_event,
    quiet_pod_event,
    reconcile_parent,
    refresh_from_child,
    refresh_from_job,
    refresh_from_pod,
    write_deferred_status,
)
from llmop.reconcile.first_status import DEFER_SECONDS

log = logging.getLogger("llmop.handlers")

MAX_RETRY_DELAY_SECONDS = 300.0
MANAGED_LABELS = {names.LABEL_MANAGED_BY: names.MANAGED_BY}
COUNT_HANDLER_ID = "count-llmdeployments"
PARENT_INDEX = "llmdeployments-cache"
POD_INDEX = "pods-cache"
POD_HANDLER_ID = "engine-pods"
JOB_HANDLER_ID = "model-download-jobs"


def child_handler_id(kind: kinds.ChildKind) -> str:
    """The id of the event handler on `kind`'s objects."""
    return f"child-{kind.plural}"


WATCH_HANDLER_IDS = (
    COUNT_HANDLER_ID,
    POD_HANDLER_ID,
    JOB_HANDLER_ID,
    *(child_handler_id(kind) for kind in kinds.WATCHED),
)
"""Low-level handlers: they run on every watch event."""


def _index_id(kind: kinds.ChildKind) -> str:
    return f"{kind.plural}-cache"


def _context(memo: Any, indexes: Mapping[str, Any]) -> Context:
    context: Context = memo.context
    if not context.children:
        # The same index objects live as long as the operator: hand them over once.
        context.parents = indexes[PARENT_INDEX]
        context.pods = indexes[POD_INDEX]
        context.children = {kind: indexes[_index_id(kind)] for kind in kinds.WATCHED}
    return context


@kopf.on.login(id="credentials")
def login(**_: Any) -> kopf.ConnectionInfo:
    """kopf's credentials: the same as `llmop.kube`'s (`llmop.credentials.load`), so kopf's
    watches and our writes authenticate alike whether or not another client library is
    installed. kopf logs in again when the API server answers 401."""
    try:
        found = credentials.load()
        token = found.current_token()
    except credentials.CredentialsError as error:
        raise kopf.PermanentError(str(error)) from error
    return kopf.ConnectionInfo(
        server=found.server,
        ca_path=found.ca_file,
        ca_data=found.ca_data,
        insecure=found.insecure,
        username=found.username,
        password=found.password,
        scheme="Bearer" if token else None,
        token=token,
        certificate_path=found.cert_file,
        certificate_data=found.cert_data,
        private_key_path=found.key_file,
        private_key_data=found.key_data,
        default_namespace=found.namespace,
        expiration=found.expires,
    )


@kopf.index(GROUP, VERSION, PLURAL, id=PARENT_INDEX)
async def index_llmdeployment(body: kopf.Body, namespace: str | None, name: str, **_: Any) -> Any:
    """(namespace, name) → the parent, without managedFields."""
    return {(namespace or "", name): parent_summary(body)}


async def _index_child(body: kopf.Body, **_: Any) -> Any:
    """(namespace, parent name) → the child, with only the managedFields the plan reads."""
    owner = controller_owner(body)
    if owner is None:
        return None
    return {(owner.namespace, owner.name): child_summary(body)}


@kopf.index(kinds.POD.api_version, kinds.POD.plural, labels=MANAGED_LABELS, id=POD_INDEX)
async def index_pod(
    body: kopf.Body, namespace: str | None, labels: Mapping[str, str], **_: Any
) -> Any:
    """(namespace, parent name) → each engine pod, reduced to what its status problem needs.
    Pods are owned by ReplicaSets, so the parent comes from our label."""
    parent = labels.get(names.LABEL_DEPLOYMENT)
    return None if not parent else {(namespace or "", parent): pod_summary(body)}


async def _in_worker(memo: Any, function: Callable[..., Any], *args: Any) -> Any:
    """Run a blocking step of an event handler in the refresh pool that `main` put in the memo.

    Not in kopf's pool, where the reconciles run: under a burst that pool is a FIFO of hundreds
    of reconciles, each a few API calls, and a CR whose pods were ready waited behind all of
    them for its Ready (45 s at 1,000 CRs with pods). A refresh is a status write or a repair,
    so a few threads of its own keep it prompt. Falls back to kopf's pool (`memo.executor`)."""
    executor = getattr(memo, "refresh_executor", None) or getattr(memo, "executor", None)
    return await asyncio.get_running_loop().run_in_executor(executor, function, *args)


class Coalescer:
    """At most one pending worker run per key: a later event for the key replaces the arguments
    of the run still waiting for a thread, and the handler returns at once.

    Why: a watch event whose handler awaits a worker holds up every later event of its object in
    kopf's per-object queue, each fully decoded, and under a burst the thread pool is a long FIFO
    of reconciles blocked on the API server. The refreshes decide from the caches when they run,
    so only the newest event of a key matters; coalescing keeps one entry per key in memory
    instead of a queue of bodies, and one pool item instead of many. Runs on kopf's event loop
    only (no locking)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self._waiting: dict[Hashable, tuple[Callable[..., Any], tuple[Any, ...]]] = {}
        self._drains: dict[Hashable, asyncio.Task[None]] = {}

    def submit(self, memo: Any, key: Hashable, function: Callable[..., Any], *args: Any) -> None:
        """Run `function(*args)` in the pool soon, unless a later submit for `key` replaces it
        before a thread takes it."""
        self._waiting[key] = (function, args)
        if key not in self._drains:
            # An empty context: a task inherits its creator's, and inside a handler that holds
            # kopf's cause, the whole decoded watch event, until the task ends. Under a burst
            # that kept ~1,900 raw events alive behind the thread pool's queue.
            self._drains[key] = asyncio.create_task(
                self._drain(memo, key), context=contextvars.Context()
            )

    async def _drain(self, memo: Any, key: Hashable) -> None:
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
            while key in self._waiting:
                function, args = self._waiting.pop(key)
                try:
                    await _in_worker(memo, function, *args)
                except KubeError as error:
                    # The next event, or the parent's own reconcile, tries again.
                    log.warning("could not process an event of %s: %s", key, error)
                except Exception:
                    log.exception("processing an event of %s failed", key)
        finally:
            del self._drains[key]

    async def idle(self) -> None:
        """Wait until nothing is pending (the tests wait on it)."""
        while self._drains:
            await asyncio.gather(*self._drains.values(), return_exceptions=True)


def _coalescer(memo: Any) -> Coalescer:
    """The operator's one coalescer. kopf hands each object a shallow copy of the operator's
    memo, so it must exist before the first copy (`main` puts it there); one made later would
    live in a single object's copy."""
    coalescer: Coalescer | None = getattr(memo, "coalescer", None)
    if coalescer is None:
        coalescer = memo.coalescer = Coalescer()
    return coalescer


@kopf.on.event(kinds.POD.api_version, kinds.POD.plural, labels=MANAGED_LABELS, id=POD_HANDLER_ID)
async def pod_event(
    type: str, body: kopf.Body, namespace: str | None, memo: Any, **kwargs: Any
) -> None:
    """An engine pod changed: its parent's status may now name (or stop naming) a problem.
    Decided in the event loop when nothing is to be written; a write is coalesced per parent
    and takes a worker."""
    ctx = _context(memo, kwargs)
    pod = pod_summary(body)
    # Every event, before the quiet check (which derives from it) and before coalescing (which
    # may drop it): a group's recreate shows only in its new leader's event.
    note_group_pod(ctx, type, pod)
    if quiet_pod_event(ctx, type, pod):
        return
    parent = (body.get("metadata") or {}).get("labels", {}).get(names.LABEL_DEPLOYMENT)
    _coalescer(memo).submit(memo, ("pod", namespace, parent), refresh_from_pod, ctx, type, pod)


for _kind in kinds.WATCHED:
    kopf.index(_kind.api_version, _kind.plural, labels=MANAGED_LABELS, id=_index_id(_kind))(
        _index_child
    )


@kopf.on.event(kinds.JOB.api_version, kinds.JOB.plural, labels=MANAGED_LABELS, id=JOB_HANDLER_ID)
def job_event(type: str, body: kopf.Body, memo: Any, logger: Any, **kwargs: Any) -> None:
    """A model download Job changed: a finished download lets the engine pods be created."""
    try:
        refresh_from_job(_context(memo, kwargs), type, dict(body))
    except (KubeError, HubUnavailableError) as error:
        logger.warning(f"Could not process a Job event: {error}")


@kopf.on.resume(GROUP, VERSION, PLURAL, id="reconcile")
@kopf.on.create(GROUP, VERSION, PLURAL, id="reconcile")
@kopf.on.update(GROUP, VERSION, PLURAL, id="reconcile")
def reconcile_llmdeployment(body: kopf.Body, retry: int, memo: Any, **kwargs: Any) -> None:
    """Converge one LLMDeployment; transient API errors retry with exponential backoff."""
    ctx = _context(memo, kwargs)
    try:
        reconcile_parent(ctx, parent_summary(body))
    except (KubeError, HubUnavailableError) as error:
        delay = min(ctx.config.retry_delay_seconds * 2**retry, MAX_RETRY_DELAY_SECONDS)
        raise kopf.TemporaryError(str(error), delay=delay) from error


@kopf.on.event(GROUP, VERSION, PLURAL, id=COUNT_HANDLER_ID)
async def count_llmdeployment(
    type: str, namespace: str | None, name: str, uid: str | None, memo: Any, **kwargs: Any
) -> None:
    """Keep the managed-objects gauge current, and forget deleted parents (cheap; stores
    nothing on the object)."""
    ctx = _context(memo, kwargs)
    ctx.metrics.observe_object("LLMDeployment", f"{namespace}/{name}", present=type != "DELETED")
    if type == "DELETED":
        ctx.forget(namespace or "", name)
        diffbase: ProcessDiffBase | None = getattr(memo, "diffbase", None)
        if diffbase is not None and uid:
            diffbase.forget(uid)


async def child_event(
    type: str, body: kopf.Body, namespace: str | None, memo: Any, logger: Any, **kwargs: Any
) -> None:
    """A child changed or vanished: repair it, or refresh the parent's status. Decided in the
    event loop when nothing is to be written; a write is coalesced per child and takes a worker,
    a deletion is awaited as it is. A transient API error is only logged: the next event, or the
    parent's own reconcile, tries again."""
    ctx = _context(memo, kwargs)
    if type != "DELETED" and body.get("kind") == kinds.DEPLOYMENT.kind:
        # Every event, before the quiet check: the deferred statuses' fallback judges from it
        # whether the Deployment controller is at work.
        note_deployment(ctx, body)
    child = child_event_summary(body)
    if quiet_child_event(ctx, type, child):
        return
    if type == "DELETED":
        # Never replaced by a later event: a deletion reads the parent fresh and recreates.
        try:
            await _in_worker(memo, refresh_from_child, ctx, type, child)
        except KubeError as error:
            logger.warning(f"Could not process a {body.get('kind')} event: {error}")
        return
    key = (str(body.get("kind")), namespace, body.get("metadata", {}).get("name"))
    _coalescer(memo).submit(memo, key, refresh_from_child, ctx, type, child)


for _kind in kinds.WATCHED:
    kopf.on.event(
        _kind.api_version, _kind.plural, labels=MANAGED_LABELS, id=child_handler_id(_kind)
    )(child_event)


@kopf.on.probe(id="reconciles")
def reconciles_probe(memo: Any, **_: Any) -> int:
    """Liveness payload: parents currently being reconciled (cheap, never fails)."""
    context: Context = memo.context
    return len(context.locks)


@kopf.on.startup(id="fleet-reader")
async def start_fleet_reader(memo: Any, **_: Any) -> None:
    """Start reading the engine agents (unless configured off)."""
    context: Context = memo.context
    interval = context.config.agent_read_interval_seconds
    if interval <= 0:
        return
    client = AgentClient(concurrency=context.config.agent_read_concurrency)
    memo.fleet_client = client
    memo.fleet_task = asyncio.create_task(
        fleet.run(context, client, interval=interval), name="llmop-fleet-reader"
    )


@kopf.on.startup(id="first-status")
async def start_deferred_statuses(memo: Any, **_: Any) -> None:
    """Let parent passes defer their status write (`reconcile.first_status`): each deferral
    runs its fallback `DEFER_SECONDS` later in the refresh pool (and again each time the
    fallback decides to wait longer), one pending run per parent.
    The parent passes run in kopf's threads; the coalescer lives on this event loop."""
    context: Context = memo.context
    loop = asyncio.get_running_loop()
    deferred = Coalescer()

    def submit(namespace: str, name: str) -> None:
        key = ("first-status", namespace, name)
        deferred.submit(memo, key, write_deferred_status, context, namespace, name)

    def schedule(namespace: str, name: str) -> None:
        # A timer per call, not a delay per coalesced run: a fallback that decides to wait
        # longer schedules itself again from its worker, and must wait again, not run at once.
        loop.call_soon_threadsafe(loop.call_later, DEFER_SECONDS, submit, namespace, name)

    context.schedule_status = schedule


@kopf.on.startup(id="router-check")
async def start_router_check(memo: Any, **_: Any) -> None:
    """Start checking the installed router (when the chart names one)."""
    context: Context = memo.context
    if context.router is not None:
        memo.router_task = asyncio.create_task(router_check.run(context), name="llmop-router")


@kopf.on.startup(id="idle-check")
async def start_idle_check(memo: Any, **_: Any) -> None:
    """Start taking idle models to zero (`llmop.idle_check`; only with a router to wake them)."""
    context: Context = memo.context
    if context.router is not None:
        memo.idle_task = asyncio.create_task(idle_check.run(context), name="llmop-idle")


@kopf.on.cleanup(id="idle-check-stop")
async def stop_idle_check(memo: Any, **_: Any) -> None:
    """Stop the idle check."""
    await _cancel(getattr(memo, "idle_task", None))


@kopf.on.startup(id="group-check")
async def start_group_check(memo: Any, **_: Any) -> None:
    """Start reading the LeaderWorkerSets back (`llmop.group_check`)."""
    memo.group_task = asyncio.create_task(group_check.run(memo.context), name="llmop-groups")


@kopf.on.cleanup(id="group-check-stop")
async def stop_group_check(memo: Any, **_: Any) -> None:
    """Stop reading the LeaderWorkerSets back."""
    await _cancel(getattr(memo, "group_task", None))


@kopf.on.startup(id="hub-check")
async def start_hub_check(memo: Any, **_: Any) -> None:
    """Start asking the Hub again about adapters it could not answer for (`llmop.hub_check`)."""
    memo.hub_task = asyncio.create_task(hub_check.run(memo.context), name="llmop-hub")


@kopf.on.cleanup(id="hub-check-stop")
async def stop_hub_check(memo: Any, **_: Any) -> None:
    """Stop re-checking adapters at the Hub."""
    await _cancel(getattr(memo, "hub_task", None))


@kopf.on.startup(id="pool-check")
async def start_pool_check(memo: Any, **_: Any) -> None:
    """Start watching for the InferencePool API while pools wait for it (`llmop.pool_check`)."""
    memo.pool_task = asyncio.create_task(pool_check.run(memo.context), name="llmop-pools")


def fresh_insights(memo: Any) -> Insights:
    """New `Insights` for one `kopf.operator` run, kept on `memo` for `start_late_crds`."""
    insights = memo.insights = late_crds.new_insights()
    return insights


@kopf.on.startup(id="late-crds")
async def start_late_crds(memo: Any, settings: kopf.OperatorSettings, **_: Any) -> None:
    """Start serving kinds whose CRD kopf's own discovery missed (`llmop.late_crds`)."""
    insights = getattr(memo, "insights", None)
    if insights is None:  # kopf run without `main` (it made Insights of its own)
        return
    context: Context = memo.context
    served = late_crds.serves(context.kube)
    registry = kopf.get_default_registry()
    memo.late_crds_task = asyncio.create_task(
        late_crds.run(insights, settings, registry, served), name="llmop-late-crds"
    )


@kopf.on.cleanup(id="late-crds-stop")
async def stop_late_crds(memo: Any, **_: Any) -> None:
    """Stop the late-CRD check."""
    await _cancel(getattr(memo, "late_crds_task", None))


async def _cancel(task: asyncio.Task[None] | None) -> None:
    """Cancel a startup activity's task and wait for it to end."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@kopf.on.cleanup(id="router-check-stop")
async def stop_router_check(memo: Any, **_: Any) -> None:
    """Stop checking the router."""
    await _cancel(getattr(memo, "router_task", None))


@kopf.on.cleanup(id="pool-check-stop")
async def stop_pool_check(memo: Any, **_: Any) -> None:
    """Stop watching for the InferencePool API."""
    await _cancel(getattr(memo, "pool_task", None))


@kopf.on.cleanup(id="fleet-reader-stop")
async def stop_fleet_reader(memo: Any, **_: Any) -> None:
    """Stop the agent reader and close its connections."""
    await _cancel(getattr(memo, "fleet_task", None))
    client = getattr(memo, "fleet_client", None)
    if client is not None:
        await client.close()
