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
- Every handler but the login and the probe is `async`: kopf runs a sync function in its
  pool, where every watch event would otherwise queue behind the passes blocked on API calls
  (the queue runs the full passes in that pool). kopf 1.45 processes every queued event of an
  object in turn (no batching), so the longer events wait, the more full decoded bodies sit in its
  per-object queues: under a 1,000-CR burst that lag, not any cache, was the operator's memory.
  Every handler turns its event into a parent's key and a hint (`reconcile.triggered`) and puts it
  on the operator's one queue (`llmop.coalescer`), where the hints waiting for one parent merge
  and one worker per parent runs the one pass, `reconcile.reconcile(ctx, key, hint)`. The event
  handlers decide from the caches in the event loop (`triggered` is None when the pass would write
  nothing: no I/O, no blocking) and queue only events that lead to a write, so that a handler
  never waits on the pool and kopf's queue of that object drains at once; the parent's own handler
  awaits the run that includes its hint, so kopf retries a transient failure with backoff.

- kopf's memory of the last handled spec is kept in this process (`llmop.persistence`), not on
  the object; the count handler drops a deleted object's entry.
- `install_queue` (called by `main` before kopf and the background loops start) makes the queue
  the reconcile's `Context.queue`: the background loops put their passes there too, and the
  parent passes may defer their status write to the Deployment controller's first status
  (`reconcile.first_status`), with a fallback pass put on the queue on a timer.
- The background loops (the agent reader, the router, pool, Hub, group and idle checks, the
  late-CRD check...) are no handlers: `main` starts and stops them with each leadership term
  (`llmop.runnables`), as tasks of kopf's event loop (no daemon per LLMDeployment: that would
  add a finalizer) or threads.

Handlers return None so kopf writes no handler results into the status.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import kopf

from llmop import credentials, kinds, names
from llmop.api.v1alpha1 import GROUP, PLURAL, VERSION
from llmop.coalescer import Coalescer
from llmop.hub import HubUnavailableError
from llmop.kube import KubeError
from llmop.observed import child_summary, controller_owner, parent_summary
from llmop.persistence import ProcessDiffBase
from llmop.pods import pod_summary
from llmop.reconcile import Context, Hint, triggered

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


def _coalescer(memo: Any) -> Coalescer:
    """The operator's one coalescer. kopf hands each object a shallow copy of the operator's
    memo, so it must exist before the first copy (`main` puts it there); one made later would
    live in a single object's copy."""
    coalescer: Coalescer | None = getattr(memo, "coalescer", None)
    if coalescer is None:
        coalescer = memo.coalescer = Coalescer()
    return coalescer


def install_queue(memo: Any) -> None:
    """Make the operator's queue the reconcile's `Context.queue`, so that every trigger — the
    background loops', the timers' — puts its pass there. Call it on kopf's event loop before
    kopf and the loops start."""
    context: Context = memo.context
    context.queue = _coalescer(memo).attach(memo)


@kopf.on.event(kinds.POD.api_version, kinds.POD.plural, labels=MANAGED_LABELS, id=POD_HANDLER_ID)
async def pod_event(type: str, body: kopf.Body, memo: Any, **kwargs: Any) -> None:
    """An engine pod changed: its parent's status may now name (or stop naming) a problem.
    Decided in the event loop when nothing is to be written; a write is coalesced per parent
    and takes a worker."""
    ctx = _context(memo, kwargs)
    # Every event, before the quiet check (which derives from it) and before coalescing (which
    # may drop it): a group's recreate shows only in its new leader's event.
    found = triggered(ctx, kinds.POD.kind, type, pod_summary(body))
    if found is None:
        return
    _coalescer(memo).submit(memo, *found)


for _kind in kinds.WATCHED:
    kopf.index(_kind.api_version, _kind.plural, labels=MANAGED_LABELS, id=_index_id(_kind))(
        _index_child
    )


@kopf.on.event(kinds.JOB.api_version, kinds.JOB.plural, labels=MANAGED_LABELS, id=JOB_HANDLER_ID)
async def job_event(type: str, body: kopf.Body, memo: Any, **kwargs: Any) -> None:
    """A model download Job changed: a finished download lets the engine pods be created, a
    failed one stalls the parent (a full pass, queued with the Job's other events)."""
    ctx = _context(memo, kwargs)
    found = triggered(ctx, kinds.JOB.kind, type, dict(body))
    if found is None:
        return  # initial listing: the parents' resume passes run anyway
    _coalescer(memo).submit(memo, *found)


@kopf.on.resume(GROUP, VERSION, PLURAL, id="reconcile")
@kopf.on.create(GROUP, VERSION, PLURAL, id="reconcile")
@kopf.on.update(GROUP, VERSION, PLURAL, id="reconcile")
async def reconcile_llmdeployment(body: kopf.Body, retry: int, memo: Any, **kwargs: Any) -> None:
    """Converge one LLMDeployment: its pass goes on the queue at once (merged with whatever
    waits there for it) and the handler awaits that run; transient API errors retry with
    exponential backoff."""
    ctx = _context(memo, kwargs)
    parent = parent_summary(body)
    key = (parent["metadata"]["namespace"], parent["metadata"]["name"])
    run = _coalescer(memo).submit(memo, key, Hint.parent(parent), delay=0.0, wait=True)
    assert run is not None
    try:
        await run
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


async def child_event(type: str, body: kopf.Body, memo: Any, **kwargs: Any) -> None:
    """A child changed or vanished: repair it, or refresh the parent's status. Decided in the
    event loop when nothing is to be written; a write goes on the queue, merged with what waits
    there for the parent (a deletion stays one in the merge, and is due at once: its pass reads
    the parent fresh and recreates the child). A transient API error is only logged: the next
    event, or the parent's own pass, tries again."""
    ctx = _context(memo, kwargs)
    # Every event, before the quiet check: the deferred statuses' fallback judges from a
    # Deployment's whether the Deployment controller is at work.
    found = triggered(ctx, str(body.get("kind")), type, body)
    if found is None:
        return
    _coalescer(memo).submit(memo, *found, delay=0.0 if type == "DELETED" else None)


for _kind in kinds.WATCHED:
    kopf.on.event(
        _kind.api_version, _kind.plural, labels=MANAGED_LABELS, id=child_handler_id(_kind)
    )(child_event)


@kopf.on.probe(id="reconciles")
def reconciles_probe(memo: Any, **_: Any) -> int:
    """Liveness payload: parents currently being reconciled (cheap, never fails)."""
    context: Context = memo.context
    return len(context.locks)
