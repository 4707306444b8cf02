"""Orchestration of one LLMDeployment: parse → plan → render → apply children → derive status.

Called by the kopf handlers (which stay a few lines each) but free of kopf itself: it talks to the
API through `llmop.kube` and decides with pure functions (`llmop.status`, `llmop.render`,
`llmop.sizing`). Two entry points share one per-parent lock, so the parent path and the
child-event path never interleave their status writes:

- `reconcile()` — the level-based reconcile on create/update/resume and when a child vanished;
- `on_child_event()` — a child changed: repair drift, or re-derive the parent's status.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from llmop import conditions, events, names
from llmop.api.v1alpha1 import API_VERSION, GROUP, KIND, LLMDeployment
from llmop.config import OperatorConfig
from llmop.kube import Kube, KubeError, RejectedError, TerminatingError
from llmop.metrics import RESULT_ERROR, RESULT_OK, RESULT_SKIPPED, RESULT_STALLED, Metrics
from llmop.render import Children, RenderSettings, render_children
from llmop.sizing import SizingResult, plan_for
from llmop.status import (
    Problem,
    derive_invalid_status,
    derive_status,
    parse_previous,
    status_patch,
)

log = logging.getLogger("llmop.reconcile")

TRIGGER_PARENT = "parent"
TRIGGER_CHILD = "child"
DEPLOYMENT = ("apps/v1", "Deployment")
REPLICAS_PATH = ("spec", "replicas")


class KeyedLocks:
    """One lock per parent, created on demand and dropped when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[tuple[str, str], tuple[threading.Lock, int]] = {}

    @contextmanager
    def hold(self, key: tuple[str, str]) -> Iterator[None]:
        """Hold the lock of `key`."""
        with self._guard:
            lock, users = self._locks.get(key, (threading.Lock(), 0))
            self._locks[key] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._guard:
                lock, users = self._locks[key]
                if users == 1:
                    del self._locks[key]
                else:
                    self._locks[key] = (lock, users - 1)

    def __len__(self) -> int:
        with self._guard:
            return len(self._locks)


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass
class Context:
    """Everything a reconcile needs, built once at startup (kopf's memo carries it)."""

    kube: Kube
    config: OperatorConfig
    metrics: Metrics
    instance: str
    render_settings: RenderSettings = field(init=False)
    locks: KeyedLocks = field(default_factory=KeyedLocks)
    clock: Callable[[], datetime] = _now

    def __post_init__(self) -> None:
        self.render_settings = self.config.render_settings()


# ----------------------------------------------------------------------------------------------
# Pure helpers


def owner_reference(parent: Mapping[str, Any]) -> dict[str, Any]:
    """The controller reference children carry, so GC removes them with the parent."""
    metadata = parent["metadata"]
    return {
        "apiVersion": parent.get("apiVersion", API_VERSION),
        "kind": parent.get("kind", KIND),
        "name": metadata["name"],
        "uid": metadata["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def with_owner(manifest: Mapping[str, Any], reference: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `manifest` owned by `reference` (renderers leave owner references out)."""
    metadata = {**manifest["metadata"], "ownerReferences": [dict(reference)]}
    return {**manifest, "metadata": metadata}


@dataclass(frozen=True)
class Owner:
    """The LLMDeployment a child belongs to."""

    namespace: str
    name: str
    uid: str


def controller_owner(child: Mapping[str, Any]) -> Owner | None:
    """The LLMDeployment that controls `child`, from its owner references."""
    metadata = child.get("metadata") or {}
    for reference in metadata.get("ownerReferences") or []:
        if (
            reference.get("kind") == KIND
            and str(reference.get("apiVersion", "")).startswith(GROUP + "/")
            and reference.get("controller")
        ):
            return Owner(metadata.get("namespace", ""), reference["name"], reference["uid"])
    return None


def owns_field(live: Mapping[str, Any], manager: str, path: tuple[str, ...]) -> bool:
    """Whether `manager` owns the field at `path` through an Apply entry in managedFields."""
    for entry in (live.get("metadata") or {}).get("managedFields") or []:
        if entry.get("manager") != manager or entry.get("operation") != "Apply":
            continue
        node: Any = entry.get("fieldsV1") or {}
        for part in path:
            node = node.get(f"f:{part}") if isinstance(node, Mapping) else None
        if node is not None:
            return True
    return False


def _same_scalar(want: Any, have: Any) -> bool:
    # Quantities come back as strings (`1` → "1"): compare such scalars by text.
    return bool(want == have) or (
        not isinstance(want, bool) and not isinstance(have, bool) and str(want) == str(have)
    )


def drifted(desired: Any, live: Any) -> bool:
    """Whether `live` lost or changed any field of `desired` (fields only live has are fine:
    the API server adds defaults and other managers own fields too)."""
    if isinstance(desired, Mapping):
        if not isinstance(live, Mapping):
            return True
        return any(key not in live or drifted(value, live[key]) for key, value in desired.items())
    if isinstance(desired, list):
        if not isinstance(live, list) or len(desired) != len(live):
            return True
        return any(drifted(want, have) for want, have in zip(desired, live, strict=True))
    return not _same_scalar(desired, live)


def child_for(children: Children, kind: str) -> dict[str, Any] | None:
    """The rendered child of `kind`, if wanted."""
    return next((child for child in children.wanted() if child["kind"] == kind), None)


def _summary(error: ValidationError) -> str:
    parts = []
    for item in error.errors()[:5]:
        location = ".".join(str(part) for part in item["loc"])
        parts.append(f"{location}: {item['msg']}")
    return "; ".join(parts)


# ----------------------------------------------------------------------------------------------
# I/O


def _key(body: Mapping[str, Any]) -> tuple[str, str]:
    metadata = body["metadata"]
    return metadata["namespace"], metadata["name"]


def _read_parent(ctx: Context, namespace: str, name: str) -> dict[str, Any] | None:
    """The parent, unless it is gone or being deleted (never resurrect a dying parent's
    children)."""
    body = ctx.kube.read(API_VERSION, KIND, namespace, name)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return None
    return body


def _write_status(ctx: Context, body: Mapping[str, Any], status: Any) -> None:
    """Write `status` when it differs from what is stored, then post transition Events."""
    patch = status_patch(body.get("status"), status)
    if patch is None:
        return
    namespace, name = _key(body)
    if ctx.kube.patch_status(API_VERSION, KIND, namespace, name, patch) is None:
        return
    ctx.metrics.status_writes.inc()
    previous = parse_previous(body.get("status"))
    now = ctx.clock()
    for spec in events.transition_events(previous.conditions, status.conditions):
        try:
            ctx.kube.create_event(events.render_event(body, spec, now=now, instance=ctx.instance))
        except KubeError as error:
            log.warning("could not post event %s on %s/%s: %s", spec.reason, namespace, name, error)


def _apply(ctx: Context, manifest: Mapping[str, Any], manager: str) -> dict[str, Any]:
    live = ctx.kube.apply(manifest, field_manager=manager)
    ctx.metrics.child_writes.labels(manifest["kind"], "apply").inc()
    return live


def _replicas_only(manifest: Mapping[str, Any], replicas: int) -> dict[str, Any]:
    metadata = manifest["metadata"]
    return {
        "apiVersion": manifest["apiVersion"],
        "kind": manifest["kind"],
        "metadata": {"name": metadata["name"], "namespace": metadata["namespace"]},
        "spec": {"replicas": replicas},
    }


def _apply_children(
    ctx: Context, body: Mapping[str, Any], ld: LLMDeployment, children: Children
) -> dict[str, Any]:
    """Delete unwanted children, apply the wanted ones; returns the live Deployment.

    With autoscaling on, the Deployment intent has no `spec.replicas`. Dropping a field we
    applied before would reset it to the default 1, so the current count is first applied by
    a separate handover manager that keeps it until the HPA writes its own value.
    """
    namespace, name = _key(body)
    reference = owner_reference(body)
    # Delete first: turning autoscaling off must stop the HPA before replicas are taken back.
    for api_version, kind in children.unwanted():
        if ctx.kube.delete(api_version, kind, namespace, name):
            ctx.metrics.child_writes.labels(kind, "delete").inc()
    deployment = with_owner(children.deployment, reference)
    autoscaling = ld.spec.autoscaling
    handover: int | None = None
    if autoscaling is not None:
        live = ctx.kube.read(*DEPLOYMENT, namespace, name)
        if live is None:
            # A new Deployment starts at the default of 1; start it at minReplicas instead.
            handover = autoscaling.min_replicas if autoscaling.min_replicas != 1 else None
        elif owns_field(live, names.FIELD_MANAGER, REPLICAS_PATH):
            # Autoscaling just turned on: keep today's count while our ownership is dropped.
            _apply(
                ctx,
                _replicas_only(deployment, live["spec"].get("replicas", 1)),
                names.HANDOVER_FIELD_MANAGER,
            )
    live_deployment: dict[str, Any] = {}
    for manifest in children.wanted():
        live = _apply(ctx, with_owner(manifest, reference), names.FIELD_MANAGER)
        if manifest["kind"] == DEPLOYMENT[1]:
            live_deployment = live
    if handover is not None:
        live_deployment = _apply(
            ctx, _replicas_only(deployment, handover), names.HANDOVER_FIELD_MANAGER
        )
    return live_deployment


def _stalled(ctx: Context, body: Mapping[str, Any], problem: Problem) -> str:
    namespace, name = _key(body)
    status = derive_invalid_status(
        name=name,
        generation=body["metadata"].get("generation"),
        previous=parse_previous(body.get("status")),
        problem=problem,
        now=ctx.clock(),
    )
    _write_status(ctx, body, status)
    log.warning("%s/%s stalled: %s: %s", namespace, name, problem.reason, problem.message)
    return RESULT_STALLED


def _converge(ctx: Context, body: Mapping[str, Any], *, apply: bool, child: Any = None) -> str:
    """Plan, render, apply (when `apply`) and write the status of one parsed parent."""
    namespace, name = _key(body)
    try:
        ld = LLMDeployment.model_validate(body)
    except ValidationError as error:
        if not apply:
            return RESULT_SKIPPED  # the parent path owns the status of an unreadable spec
        return _stalled(ctx, body, Problem(conditions.REASON_INVALID_SPEC, _summary(error)))
    sizing = plan_for(ld.spec)
    children: Children | None = None
    problem: Problem | None = None
    deployment: dict[str, Any] | None = child
    if sizing.fits is not False:  # a plan that does not fit creates nothing (no pods)
        children = render_children(
            ld, ctx.render_settings, load_timeout_seconds=sizing.load_timeout_seconds
        )
        if apply:
            try:
                deployment = _apply_children(ctx, body, ld, children)
            except RejectedError as error:
                problem = Problem(conditions.REASON_CHILD_REJECTED, str(error))
                deployment = None
    if deployment is None:
        deployment = ctx.kube.read(*DEPLOYMENT, namespace, name)
    _write_status(
        ctx,
        body,
        derive_status(
            name=name,
            namespace=namespace,
            generation=ld.metadata.generation,
            previous=parse_previous(body.get("status")),
            spec=ld.spec,
            sizing=sizing,
            deployment=deployment,
            template_hash=_template_hash(children),
            problem=problem,
            now=ctx.clock(),
        ),
    )
    return RESULT_STALLED if problem is not None or sizing.fits is False else RESULT_OK


def _template_hash(children: Children | None) -> str | None:
    if children is None:
        return None
    annotations = children.deployment["metadata"].get("annotations") or {}
    value = annotations.get(names.ANNOTATION_TEMPLATE_HASH)
    return value if isinstance(value, str) else None


def _guarded(ctx: Context, body: Mapping[str, Any], run: Callable[[], str]) -> str:
    """Run a reconcile step; a bug (not an API error) stalls the parent instead of retrying
    forever, and the next spec change or operator restart tries again."""
    try:
        return run()
    except KubeError:
        raise
    except Exception as error:
        namespace, name = _key(body)
        log.exception("reconcile of %s/%s failed", namespace, name)
        _stalled(ctx, body, Problem(conditions.REASON_INTERNAL_ERROR, f"{error!r}"[:1000]))
        return RESULT_ERROR


def reconcile(ctx: Context, namespace: str, name: str, *, trigger: str = TRIGGER_PARENT) -> str:
    """Bring one LLMDeployment's children and status to the desired state; returns the result
    (ok, stalled, skipped, error). Raises `KubeError` for transient API failures."""
    with ctx.locks.hold((namespace, name)), ctx.metrics.reconciling(trigger) as outcome:
        body = _read_parent(ctx, namespace, name)
        if body is None:
            outcome.result = RESULT_SKIPPED
            return outcome.result
        try:
            outcome.result = _guarded(ctx, body, lambda: _converge(ctx, body, apply=True))
        except TerminatingError:
            # The namespace is being deleted; its garbage collection takes the parent too.
            outcome.result = RESULT_SKIPPED
        return outcome.result


def _refresh(ctx: Context, owner: Owner, child: Mapping[str, Any]) -> str:
    """A live child changed: re-apply everything when it drifted from what we render,
    otherwise (for the Deployment) only re-derive the parent's status."""
    body = _read_parent(ctx, owner.namespace, owner.name)
    if body is None or body["metadata"].get("uid") != owner.uid:
        return RESULT_SKIPPED
    try:
        ld = LLMDeployment.model_validate(body)
    except ValidationError:
        return RESULT_SKIPPED
    sizing: SizingResult = plan_for(ld.spec)
    is_deployment = child.get("kind") == DEPLOYMENT[1]
    if sizing.fits is not False:
        children = render_children(
            ld, ctx.render_settings, load_timeout_seconds=sizing.load_timeout_seconds
        )
        desired = child_for(children, str(child.get("kind")))
        if desired is not None and drifted(with_owner(desired, owner_reference(body)), child):
            log.info("%s %s/%s drifted; re-applying", child.get("kind"), *_key(body))
            return _guarded(ctx, body, lambda: _converge(ctx, body, apply=True))
    if not is_deployment:
        return RESULT_SKIPPED
    return _guarded(ctx, body, lambda: _converge(ctx, body, apply=False, child=dict(child)))


def on_child_event(ctx: Context, event_type: str | None, child: Mapping[str, Any]) -> str:
    """React to a watch event of a labelled child (Deployment, Service, HPA, PDB)."""
    owner = controller_owner(child)
    if owner is None:
        return RESULT_SKIPPED
    metadata = child.get("metadata") or {}
    key = f"{metadata.get('namespace')}/{metadata.get('name')}"
    ctx.metrics.observe_object(str(child.get("kind")), key, present=event_type != "DELETED")
    if event_type is None:
        # Initial listing at startup: the parents' resume handlers reconcile them anyway.
        return RESULT_SKIPPED
    if event_type == "DELETED":
        return reconcile(ctx, owner.namespace, owner.name, trigger=TRIGGER_CHILD)
    with (
        ctx.locks.hold((owner.namespace, owner.name)),
        ctx.metrics.reconciling(TRIGGER_CHILD) as outcome,
    ):
        try:
            outcome.result = _refresh(ctx, owner, child)
        except TerminatingError:
            outcome.result = RESULT_SKIPPED
        return outcome.result
