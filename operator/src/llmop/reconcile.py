"""Orchestration of one LLMDeployment: desired state → child plan → execute → status.

Called by the kopf handlers (a few lines each) but free of kopf itself: it talks to the API
through `llmop.kube`, decides with pure functions (`desired`, `plan`, `status`) and reads the
live children from watch-fed caches (kopf indexes, handed in as plain mappings), never from a
GET per event. Two named entry points share one per-parent lock:

- `reconcile_parent()` — create/update/resume of the LLMDeployment: apply every wanted child,
  delete unwanted ones, write the status;
- `refresh_from_child()` — a watch event of one child: repair that child if it drifted or
  vanished, and re-derive the parent's status;
- `refresh_from_pod()` / `refresh_status()` — an engine pod changed, or the agents were read
  (`llmop.fleet`): re-derive the parent's status only.

Why the status never flaps: both entry points derive it from the same watch cache of the child
Deployment, whose entries only move forward in time, and compare with the status this process
wrote last. Before, the parent path used the Deployment returned by its apply while the
child-event path used the (older) Deployment of a queued watch event, so a CR went
Ready=True → False → True whenever the two interleaved.
"""

from __future__ import annotations

import base64
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from time import perf_counter
from typing import Any

from pydantic import ValidationError

from llmop import conditions, engine_client, events, hub, kinds, names, preflight
from llmop.agents import AgentReading
from llmop.api.v1alpha1 import (
    GROUP,
    KIND,
    LLMDeployment,
    LLMDeploymentStatus,
    ModelSpec,
    ModelStatus,
)
from llmop.config import OperatorConfig
from llmop.desired import DesiredState, desired_state
from llmop.kinds import ChildKind
from llmop.kube import Kube, KubeError, RejectedError, TerminatingError
from llmop.metrics import RESULT_ERROR, RESULT_OK, RESULT_SKIPPED, RESULT_STALLED, Metrics
from llmop.plan import Apply, ChildPlan, Delete, owner_reference, plan_children, with_owner
from llmop.quantity import quantity_value
from llmop.render import model_cache
from llmop.settings import RenderSettings
from llmop.status import (
    Problem,
    autoscaler_issue,
    derive_invalid_status,
    derive_status,
    parse_previous,
    status_patch,
)

log = logging.getLogger("llmop.reconcile")

TRIGGER_PARENT = "parent"
TRIGGER_CHILD = "child"
TRIGGER_POD = "pod"
TRIGGER_FLEET = "fleet"

ChildIndex = Mapping[tuple[str, str], Iterable[Mapping[str, Any]]]
"""A watch cache of one child kind: (namespace, parent name) → the live children (normally
one). kopf's indexes have this shape; tests pass plain dicts."""


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

    def busy(self, key: tuple[str, str]) -> bool:
        """Someone holds or waits for the lock of `key` right now (never blocks on it)."""
        with self._guard:
            return key in self._locks

    def __len__(self) -> int:
        with self._guard:
            return len(self._locks)


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass
class _Parsed:
    """One generation of a parent, parsed and planned once (not once per child event)."""

    uid: str
    generation: int | None
    desired: DesiredState | None
    error: str | None


@dataclass
class _ModelGate:
    """One generation's model pre-flight verdict, the engine children rendered at the resolved
    commit, and the latest model status (the download's progress)."""

    uid: str
    generation: int | None
    model: ModelSpec
    """The spec.model the verdict was reached for: a new generation that leaves it as it was
    (`kubectl scale`, an engine flag) keeps a passing verdict and the resolved commit, so it neither
    calls the hub again nor moves a floating revision to a newer commit behind the user's back."""
    verdict: preflight.Verdict
    status: ModelStatus
    applied: bool = False
    """The claim and the Job were applied for this generation (re-applied if the Job goes)."""
    desired: DesiredState | None = None
    """Set once the cache holds the commit: what the engine children are planned from."""


@dataclass(frozen=True)
class _Found:
    """A problem this process found for one generation of a parent, and the kind of the child
    the API server rejected (None for problems of the parent itself)."""

    uid: str
    generation: int | None
    problem: Problem
    child: str | None = None


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
    children: dict[ChildKind, ChildIndex] = field(default_factory=dict)
    """Watch caches of the watched child kinds (kopf indexes, set by the handlers)."""
    parents: Mapping[tuple[str, str], Iterable[Mapping[str, Any]]] = field(default_factory=dict)
    """Watch cache of the LLMDeployments: (namespace, name) → the parent."""
    pods: Mapping[tuple[str, str], Iterable[Mapping[str, Any]]] = field(default_factory=dict)
    """Watch cache of the engine pods: (namespace, parent name) → their summaries (llmop.pods)."""
    fleet: dict[tuple[str, str], tuple[AgentReading, ...]] = field(default_factory=dict)
    """The agents' latest readings per parent (written by `llmop.fleet`); a parent absent here
    has not been read by this process yet, and its status keeps what the agents said before."""
    _parsed: dict[tuple[str, str], _Parsed] = field(default_factory=dict)
    _written: dict[tuple[str, str], tuple[str, dict[str, Any]]] = field(default_factory=dict)
    _applied: dict[tuple[str, str], tuple[str, int | None]] = field(default_factory=dict)
    """(uid, generation) each parent's children were last fully applied for, by this process."""
    _gates: dict[tuple[str, str], _ModelGate] = field(default_factory=dict)
    """The model pre-flight of each parent with spec.model.cache, once per generation."""
    downloading: set[tuple[str, str]] = field(default_factory=set)
    """Parents whose download Job runs: `poll_downloads` refreshes their progress."""
    _problems: dict[tuple[str, str], _Found] = field(default_factory=dict)
    """The last problem found per parent: every status path carries it until a new generation
    or a parent pass that applied every child (`_remember`, `_problem_of`, `_clear_problem`)."""

    def __post_init__(self) -> None:
        self.render_settings = self.config.render_settings()

    def forget(self, namespace: str, name: str) -> None:
        """Drop what this process remembers of a deleted parent."""
        self._parsed.pop((namespace, name), None)
        self._written.pop((namespace, name), None)
        self._applied.pop((namespace, name), None)
        self._gates.pop((namespace, name), None)
        self.downloading.discard((namespace, name))
        self.fleet.pop((namespace, name), None)
        self._problems.pop((namespace, name), None)


# ----------------------------------------------------------------------------------------------
# Reading the caches


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


def _one(values: Iterable[Mapping[str, Any]] | None, uid: str | None) -> dict[str, Any] | None:
    """The cached object owned by `uid` (a recreated parent's old children do not count)."""
    for value in list(values or ()):
        owner = controller_owner(value)
        if uid is None or (owner is not None and owner.uid == uid):
            return dict(value)
    return None


def live_children(ctx: Context, namespace: str, name: str, uid: str) -> dict[ChildKind, Any]:
    """The watched children of one parent as the watch caches last saw them."""
    return {kind: _one(index.get((namespace, name)), uid) for kind, index in ctx.children.items()}


def _cached_parent(ctx: Context, namespace: str, name: str) -> dict[str, Any] | None:
    return _one(ctx.parents.get((namespace, name)), None)


def _key(body: Mapping[str, Any]) -> tuple[str, str]:
    metadata = body["metadata"]
    return metadata["namespace"], metadata["name"]


def _summary(error: ValidationError) -> str:
    parts = []
    for item in error.errors()[:5]:
        location = ".".join(str(part) for part in item["loc"])
        parts.append(f"{location}: {item['msg']}")
    return "; ".join(parts)


def _parse(ctx: Context, body: Mapping[str, Any]) -> _Parsed:
    """The parent's desired state, computed once per generation."""
    key = _key(body)
    metadata = body["metadata"]
    uid, generation = metadata.get("uid", ""), metadata.get("generation")
    cached = ctx._parsed.get(key)
    if cached is not None and cached.uid == uid and cached.generation == generation:
        return cached
    try:
        desired: DesiredState | None = desired_state(
            LLMDeployment.model_validate(body), ctx.render_settings
        )
        error = None
    except ValidationError as invalid:
        desired, error = None, _summary(invalid)
    parsed = _Parsed(uid, generation, desired, error)
    ctx._parsed[key] = parsed
    return parsed


def _previous_status(ctx: Context, body: Mapping[str, Any]) -> Any:
    """The status as last written: this process's own write when the body predates it (the
    operator is the only status writer, and a watch event may lag behind its own patch)."""
    written = ctx._written.get(_key(body))
    if written is not None and written[0] == body["metadata"].get("uid"):
        return written[1]
    return body.get("status")


# ----------------------------------------------------------------------------------------------
# Doing


class StepRejectedError(RejectedError):
    """The API server refused one step of a plan; `kind` names the child it was for."""

    def __init__(self, kind: str, error: RejectedError) -> None:
        super().__init__(str(error), error.status)
        self.kind = kind


def execute(ctx: Context, plan: ChildPlan) -> None:
    """Carry out a child plan, step by step, deciding nothing. Raises `StepRejectedError` when
    the API server refuses an object, `KubeError` for transient failures."""
    for step in plan.steps():
        kind = step.kind.kind if isinstance(step, Delete) else step.kind
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
    raw_previous = _previous_status(ctx, body)
    status = _with_model_status(ctx, body, status, raw_previous)
    patch = status_patch(raw_previous, status)
    if patch is None:
        return
    namespace, name = _key(body)
    written = ctx.kube.patch_status(
        kinds.LLMDEPLOYMENT.api_version, kinds.LLMDEPLOYMENT.kind, namespace, name, patch
    )
    if written is None:
        return
    ctx._written[namespace, name] = (body["metadata"].get("uid", ""), written.get("status") or {})
    ctx.metrics.status_writes.inc()
    previous = parse_previous(raw_previous)
    now = ctx.clock()
    for spec in events.transition_events(previous.conditions, status.conditions):
        try:
            ctx.kube.create_event(events.render_event(body, spec, now=now, instance=ctx.instance))
        except KubeError as error:
            log.warning("could not post event %s on %s/%s: %s", spec.reason, namespace, name, error)


def _with_model_status(
    ctx: Context, body: Mapping[str, Any], status: LLMDeploymentStatus, raw_previous: Any
) -> LLMDeploymentStatus:
    """`status` with status.model: this process's pre-flight, else the stored one (a restarted
    operator keeps it until its own pre-flight runs)."""
    gate = ctx._gates.get(_key(body))
    if gate is not None and gate.uid == body["metadata"].get("uid"):
        return status.model_copy(update={"model": gate.status})
    stored = raw_previous.get("model") if isinstance(raw_previous, Mapping) else None
    if isinstance(stored, Mapping):
        return status.model_copy(update={"model": ModelStatus.model_validate(stored)})
    return status


def _stalled(ctx: Context, body: Mapping[str, Any], problem: Problem) -> str:
    namespace, name = _key(body)
    _remember(ctx, body, problem)
    status = derive_invalid_status(
        name=name,
        generation=body["metadata"].get("generation"),
        previous=parse_previous(_previous_status(ctx, body)),
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
    namespace, name = _key(body)
    if problem is None:
        problem = _problem_of(ctx, body)
    live = live_children(ctx, namespace, name, body["metadata"]["uid"])
    deployment = live.get(kinds.DEPLOYMENT)
    if deployment is None and applied:
        deployment = JUST_APPLIED
    spec = desired.llmd.spec
    return derive_status(
        name=name,
        namespace=namespace,
        generation=desired.llmd.metadata.generation,
        previous=parse_previous(_previous_status(ctx, body)),
        spec=spec,
        sizing=desired.sizing,
        deployment=deployment,
        template_hash=desired.template_hash,
        problem=problem,
        now=ctx.clock(),
        pods=list(ctx.pods.get((namespace, name)) or ()),
        fleet=ctx.fleet.get((namespace, name)),
        hpa=live.get(kinds.HPA) if spec.autoscaling is not None else None,
    )


def _status_changed(ctx: Context, body: Mapping[str, Any], desired: DesiredState) -> bool:
    """`_write_derived_status(ctx, body, desired, None)` would write (decided without I/O)."""
    status = _derived_status(ctx, body, desired, None)
    raw_previous = _previous_status(ctx, body)
    return (
        status_patch(raw_previous, _with_model_status(ctx, body, status, raw_previous)) is not None
    )


def _write_derived_status(
    ctx: Context,
    body: Mapping[str, Any],
    desired: DesiredState,
    problem: Problem | None,
    *,
    applied: bool = False,
) -> str:
    """Derive the status from the watch cache of the Deployment (`_derived_status`) and write
    it if it changed."""
    _write_status(ctx, body, _derived_status(ctx, body, desired, problem, applied=applied))
    return _result(ctx, body, desired, problem)


def _result(
    ctx: Context, body: Mapping[str, Any], desired: DesiredState, problem: Problem | None
) -> str:
    """The reconcile's result for a derived status: stalled while a problem is found or
    remembered, or the model does not fit."""
    stalled = (
        problem is not None or _problem_of(ctx, body) is not None or desired.sizing.fits is False
    )
    return RESULT_STALLED if stalled else RESULT_OK


def _run_plan(ctx: Context, body: Mapping[str, Any], plan: ChildPlan) -> Problem | None:
    """Execute `plan`; a rejected child is a problem, remembered for every status path."""
    if plan:
        log.debug("%s/%s: %s", *_key(body), "; ".join(plan.reasons))
    try:
        execute(ctx, plan)
    except StepRejectedError as error:
        problem = Problem(conditions.REASON_CHILD_REJECTED, str(error))
        _remember(ctx, body, problem, child=error.kind)
        return problem
    return None


# ----------------------------------------------------------------------------------------------
# The problem memory: a found problem is never erased by a path that cannot see it
#
# Only the parent path applies every child and checks the spec and the model; the child, pod,
# fleet and download paths derive the status from caches. Without this memory they derived it
# with no problem and wrote "no longer stalled" a moment after the parent path found one.


def _remember(
    ctx: Context, body: Mapping[str, Any], problem: Problem, *, child: str | None = None
) -> None:
    metadata = body["metadata"]
    ctx._problems[_key(body)] = _Found(
        str(metadata.get("uid") or ""), metadata.get("generation"), problem, child
    )


def _problem_of(ctx: Context, body: Mapping[str, Any]) -> Problem | None:
    """The problem this process found for the parent's current generation, if any."""
    found = ctx._problems.get(_key(body))
    metadata = body["metadata"]
    if found is None or (found.uid, found.generation) != (
        metadata.get("uid"),
        metadata.get("generation"),
    ):
        return None
    return found.problem


def _clear_problem(ctx: Context, body: Mapping[str, Any], plan: ChildPlan, *, repair: bool) -> None:
    """A parent pass applied its plan: clear the problem when that pass covered it (a full
    apply, or a repair that applied the rejected child; a problem of the parent itself, such
    as an internal error, is cleared by any parent pass that got this far)."""
    found = ctx._problems.get(_key(body))
    if found is None:
        return
    kinds_done = {s.kind.kind if isinstance(s, Delete) else s.kind for s in plan.steps()}
    if not repair or found.child is None or found.child in kinds_done:
        del ctx._problems[_key(body)]


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


# ----------------------------------------------------------------------------------------------
# The model cache gate: pre-flight, claim, download Job — before any engine pod


JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
"""Set by the Job controller on the Job's pods."""
TRIGGER_DOWNLOAD = "download"
REASON_CACHE_CLAIM_NOT_FOUND = "CacheClaimNotFound"
REASON_MODEL_DOWNLOAD_FAILED = "ModelDownloadFailed"
REASON_TOKEN_SECRET_NOT_FOUND = "TokenSecretNotFound"


def _token(ctx: Context, namespace: str, llmd: LLMDeployment) -> str | Problem | None:
    ref = llmd.spec.model.token_secret_ref
    if ref is None:
        return None
    secret = ctx.kube.read("v1", kinds.SECRET.kind, namespace, ref.name)
    data = (secret or {}).get("data") or {}
    if ref.key not in data:
        return Problem(
            REASON_TOKEN_SECRET_NOT_FOUND,
            f"spec.model.tokenSecretRef names key {ref.key!r} of Secret {ref.name!r}, which "
            "does not exist: create the Secret with that key, or fix tokenSecretRef",
        )
    return base64.b64decode(data[ref.key]).decode().strip()


def _cache_bytes(ctx: Context, namespace: str, llmd: LLMDeployment) -> float | Problem | None:
    cache = llmd.spec.model.cache
    if cache is None:
        return None
    if cache.size is not None:
        return quantity_value(cache.size)
    claim = ctx.kube.read("v1", kinds.PVC.kind, namespace, cache.existing_claim or "")
    if claim is None:
        return Problem(
            REASON_CACHE_CLAIM_NOT_FOUND,
            f"spec.model.cache.existingClaim {cache.existing_claim!r} does not exist in "
            f"namespace {namespace}: create the claim, or set spec.model.cache.size instead",
        )
    capacity = ((claim.get("status") or {}).get("capacity") or {}).get("storage") or (
        ((claim.get("spec") or {}).get("resources") or {}).get("requests") or {}
    ).get("storage")
    return None if capacity is None else quantity_value(capacity)


def _preflight(ctx: Context, body: Mapping[str, Any], llmd: LLMDeployment) -> _ModelGate:
    namespace, _ = _key(body)
    metadata = body["metadata"]
    model = llmd.spec.model
    ref = model.token_secret_ref
    token = _token(ctx, namespace, llmd)
    cache_bytes = _cache_bytes(ctx, namespace, llmd)
    problem = next((p for p in (token, cache_bytes) if isinstance(p, Problem)), None)
    if problem is not None:
        verdict = preflight.Verdict(ok=False, reason=problem.reason, message=problem.message)
    else:
        answer = hub.probe(
            model.name,
            model.revision,
            token=token if isinstance(token, str) else None,
            endpoint=ctx.render_settings.hub_endpoint,
        )
        verdict = preflight.verdict(
            model=model.name,
            revision=model.revision,
            token_secret=None if ref is None else f"{ref.name}/{ref.key}",
            answer=answer,
            cache_bytes=cache_bytes if isinstance(cache_bytes, float) else None,
        )
        if verdict.retry:
            raise KubeError(verdict.message)  # the handler retries with backoff
    status = ModelStatus(
        resolved_revision=verdict.resolved_revision,
        floating_revision=verdict.floating if verdict.resolved_revision else None,
        size_bytes=verdict.total_bytes,
        cache_claim=model_cache.cache_claim(llmd),
    )
    gate = _ModelGate(metadata.get("uid", ""), metadata.get("generation"), model, verdict, status)
    if verdict.ok and verdict.floating:
        spec = events.EventSpec("Warning", preflight.REASON_FLOATING_REVISION, verdict.message)
        try:
            ctx.kube.create_event(
                events.render_event(body, spec, now=ctx.clock(), instance=ctx.instance)
            )
        except KubeError as error:
            log.warning("could not post event %s: %s", spec.reason, error)
    return gate


def _download_progress(ctx: Context, namespace: str, job_name: str) -> Any:
    """The running download pod's own progress report, if it can be read."""
    pods = ctx.kube.list(
        kinds.POD.api_version,
        kinds.POD.kind,
        namespace,
        label_selector=f"{JOB_NAME_LABEL}={job_name}",
    )
    for pod in pods:
        status = pod.get("status") or {}
        if status.get("phase") == "Running" and status.get("podIP"):
            return engine_client.read_progress(status["podIP"])
    return None


def _model_gate(ctx: Context, body: Mapping[str, Any], parsed: _Parsed) -> DesiredState | str:
    """The desired state at the resolved commit once the cache holds it; else the result of
    stalling (pre-flight refused, download failed) or of waiting for the download."""
    assert parsed.desired is not None
    llmd = parsed.desired.llmd
    key = _key(body)
    gate = ctx._gates.get(key)
    if gate is None or (gate.uid, gate.generation) != (parsed.uid, parsed.generation):
        # A refusal is checked again on every generation: access may have been granted since.
        if (
            gate is not None
            and gate.uid == parsed.uid
            and gate.verdict.ok
            and gate.model == llmd.spec.model
        ):
            gate = _ModelGate(parsed.uid, parsed.generation, gate.model, gate.verdict, gate.status)
        else:
            gate = _preflight(ctx, body, llmd)
        ctx._gates[key] = gate
    verdict = gate.verdict
    if not verdict.ok or verdict.resolved_revision is None:
        return _stalled(
            ctx, body, Problem(verdict.reason or conditions.REASON_STALLED, verdict.message)
        )
    sha = verdict.resolved_revision
    job_name = model_cache.download_job_name(llmd, sha)
    job = ctx.kube.read(kinds.JOB.api_version, kinds.JOB.kind, key[0], job_name)
    if job is None or not gate.applied:
        reference = owner_reference(body)
        manifests = [
            model_cache.render_pvc(llmd),
            model_cache.render_download_job(llmd, ctx.render_settings, revision=sha),
        ]
        try:
            for manifest in manifests:
                if manifest is not None:
                    ctx.kube.apply(
                        with_owner(manifest, reference),
                        field_manager=names.FIELD_MANAGER,
                        want_result=False,
                    )
        except RejectedError as error:
            return _stalled(ctx, body, Problem(conditions.REASON_CHILD_REJECTED, str(error)))
        gate.applied = True
        job = ctx.kube.read(kinds.JOB.api_version, kinds.JOB.kind, key[0], job_name)
    phase, message = model_cache.download_phase(job)
    progress = _download_progress(ctx, key[0], job_name) if phase == "Downloading" else None
    if phase == "Downloading":
        ctx.downloading.add(key)
    else:
        ctx.downloading.discard(key)
    gate.status = gate.status.model_copy(
        update={
            "download": model_cache.download_status(phase, message, progress, verdict.total_bytes)
        }
    )
    if phase == "Failed":
        return _stalled(
            ctx,
            body,
            Problem(
                REASON_MODEL_DOWNLOAD_FAILED,
                f"the download Job {job_name} failed ({message}): see `kubectl logs "
                f"job/{job_name} -n {key[0]}`; fix the cause, then delete the Job to retry",
            ),
        )
    if phase != "Complete":
        _write_derived_status(ctx, body, parsed.desired, None)
        return RESULT_OK
    if gate.desired is None:
        gate.desired = desired_state(
            LLMDeployment.model_validate(body), ctx.render_settings, resolved_revision=sha
        )
    return gate.desired


def _desired(ctx: Context, body: Mapping[str, Any], parsed: _Parsed) -> DesiredState | None:
    """What the engine children are planned from: the parsed spec, or for a model cache the
    gate's (None until this process saw the cache filled: the parent path decides then)."""
    if parsed.desired is None or parsed.desired.llmd.spec.model.cache is None:
        return parsed.desired
    gate = ctx._gates.get(_key(body))
    if gate is None or (gate.uid, gate.generation) != (parsed.uid, parsed.generation):
        return None
    return gate.desired


# ----------------------------------------------------------------------------------------------
# Entry points


def _converge_parent(ctx: Context, body: Mapping[str, Any]) -> str:
    parsed = _parse(ctx, body)
    if parsed.desired is None:
        return _stalled(ctx, body, Problem(conditions.REASON_INVALID_SPEC, parsed.error or ""))
    desired = parsed.desired
    if desired.llmd.spec.model.cache is not None:
        gated = _model_gate(ctx, body, parsed)
        if isinstance(gated, str):
            return gated
        desired = gated
    namespace, name = _key(body)
    uid = body["metadata"]["uid"]
    live = live_children(ctx, namespace, name, uid)
    if desired.llmd.spec.autoscaling is not None:
        # The handover decides from who owns spec.replicas right now: read it fresh, since
        # the watch cache may not show our own last apply yet.
        fresh = ctx.kube.read(kinds.DEPLOYMENT.api_version, kinds.DEPLOYMENT.kind, namespace, name)
        live[kinds.DEPLOYMENT] = fresh if _one([fresh] if fresh else [], uid) else None
    # kopf may run the create handler of one generation twice (under load its own annotation
    # patch can arrive after the next event): what this process already applied is only repaired.
    done = ctx._applied.get((namespace, name)) == (uid, parsed.generation)
    plan = plan_children(desired, live, parent=body, repair=done)
    problem = _run_plan(ctx, body, plan)
    if problem is None:
        ctx._applied[namespace, name] = (uid, parsed.generation)
        _clear_problem(ctx, body, plan, repair=done)
    applied = problem is None and any(a.kind == kinds.DEPLOYMENT.kind for a in plan.applies)
    return _write_derived_status(ctx, body, desired, problem, applied=applied)


def reconcile_parent(
    ctx: Context, body: Mapping[str, Any], *, trigger: str = TRIGGER_PARENT
) -> str:
    """Bring one LLMDeployment (`body`, as the watch delivered it) and its children to the
    desired state; returns the result (ok, stalled, skipped, error). Raises `KubeError` for
    transient API failures."""
    namespace, name = _key(body)
    with ctx.locks.hold((namespace, name)), ctx.metrics.reconciling(trigger) as outcome:
        if body["metadata"].get("deletionTimestamp"):
            outcome.result = RESULT_SKIPPED  # never resurrect a dying parent's children
            return outcome.result
        try:
            outcome.result = _guarded(ctx, body, lambda: _converge_parent(ctx, body))
        except TerminatingError:
            # The namespace is being deleted; its garbage collection takes the parent too.
            outcome.result = RESULT_SKIPPED
        return outcome.result


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
class _ChildEvent:
    """A watch event of a child we own, as both the event-loop check and the worker read it."""

    kind: ChildKind
    owner: Owner
    type: str
    hpa: Mapping[str, Any] | None  # the HPA as this event delivered it (its conditions matter)


def _child_event(
    ctx: Context, event_type: str | None, child: Mapping[str, Any]
) -> _ChildEvent | None:
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
    return _ChildEvent(kind, owner, event_type, hpa)


@dataclass(frozen=True)
class _ChildWork:
    """What a child event asks of its parent: repair the child (a non-empty plan), then write
    the parent's status if it changed."""

    body: Mapping[str, Any]
    desired: DesiredState
    plan: ChildPlan


def _child_work(
    ctx: Context, event: _ChildEvent, body: Mapping[str, Any] | None
) -> _ChildWork | str:
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
    desired = _desired(ctx, body, _parse(ctx, body))
    if desired is None:
        # The parent path owns the status of an unreadable spec, and of a model cache that
        # this process has not yet seen filled.
        return RESULT_SKIPPED
    live = live_children(ctx, owner.namespace, owner.name, owner.uid)
    plan = plan_children(desired, live, parent=body, only=event.kind)
    if (
        not plan
        and event.kind != kinds.DEPLOYMENT
        and not (event.kind == kinds.HPA and _hpa_news(body, event.hpa))
    ):
        # Only the Deployment feeds the status, and the HPA when it cannot scale.
        return RESULT_SKIPPED
    return _ChildWork(body, desired, plan)


def _refresh(ctx: Context, event: _ChildEvent) -> str:
    owner = event.owner
    if event.type == "DELETED":
        # Recreating a child is the one write a stale cache could get wrong (a parent being
        # deleted right now): ask the API server.
        body = ctx.kube.read(
            kinds.LLMDEPLOYMENT.api_version, kinds.LLMDEPLOYMENT.kind, owner.namespace, owner.name
        )
    else:
        body = _cached_parent(ctx, owner.namespace, owner.name)
    if body is None:
        return RESULT_SKIPPED
    parent = body

    def run() -> str:
        work = _child_work(ctx, event, parent)
        if isinstance(work, str):
            return work
        problem = None
        if work.plan:
            problem = _run_plan(ctx, parent, work.plan)
            log.info("%s/%s: %s", owner.namespace, owner.name, "; ".join(work.plan.reasons))
        applied = problem is None and any(
            a.kind == kinds.DEPLOYMENT.kind for a in work.plan.applies
        )
        return _write_derived_status(ctx, parent, work.desired, problem, applied=applied)

    return _guarded(ctx, parent, run)


def refresh_from_child(ctx: Context, event_type: str | None, child: Mapping[str, Any]) -> str:
    """React to a watch event of a labelled child (Deployment, Service, HPA, PDB)."""
    event = _child_event(ctx, event_type, child)
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


def _status_target(
    ctx: Context, namespace: str, name: str
) -> tuple[Mapping[str, Any], DesiredState] | None:
    """The cached parent and its desired state, when the status paths own its status: not for
    a missing or dying parent, nor an unreadable spec (the parent path owns those). A problem
    this process found is carried by the derivation (`_problem_of`); a Stalled status it has
    no memory of (written before a restart or by another leader, or a model that does not fit)
    is left to the parent path, which finds the problem again on its first pass."""
    body = _cached_parent(ctx, namespace, name)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return None
    desired = _desired(ctx, body, _parse(ctx, body))
    stalled = _problem_of(ctx, body) is None and any(
        c.get("type") == conditions.STALLED and c.get("status") == "True"
        for c in (_previous_status(ctx, body) or {}).get("conditions") or []
    )
    return None if desired is None or stalled else (body, desired)


def refresh_status(ctx: Context, namespace: str, name: str, *, trigger: str = TRIGGER_FLEET) -> str:
    """Re-derive one parent's status from the caches (pods, Deployment, agent readings);
    writes only the status, and only when it changed."""
    with ctx.locks.hold((namespace, name)), ctx.metrics.reconciling(trigger) as outcome:
        target = _status_target(ctx, namespace, name)
        if target is None:
            outcome.result = RESULT_SKIPPED
            return outcome.result
        body, desired = target
        outcome.result = _guarded(
            ctx, body, lambda: _write_derived_status(ctx, body, desired, None)
        )
        return outcome.result


def refresh_from_job(ctx: Context, event_type: str | None, job: Mapping[str, Any]) -> str:
    """A model download Job changed: reconcile its parent (a finished download creates the
    engine pods; a failed one stalls the parent)."""
    owner = controller_owner(job)
    if owner is None or event_type is None:
        return RESULT_SKIPPED  # initial listing: the parents' resume handlers run anyway
    body = _cached_parent(ctx, owner.namespace, owner.name)
    if body is None or body["metadata"].get("uid") != owner.uid:
        return RESULT_SKIPPED
    return reconcile_parent(ctx, body, trigger=TRIGGER_CHILD)


def poll_downloads(ctx: Context) -> None:
    """Refresh the status of every parent whose download runs (progress, rate, ETA): the Job
    emits no event while bytes flow. Called every few seconds by the operator's poller."""
    for namespace, name in sorted(ctx.downloading.copy()):  # copy: handlers add meanwhile
        body = _cached_parent(ctx, namespace, name)
        if body is None:
            ctx.downloading.discard((namespace, name))
            continue
        try:
            reconcile_parent(ctx, body, trigger=TRIGGER_DOWNLOAD)
        except KubeError as error:
            log.warning("download progress of %s/%s: %s", namespace, name, error)


# ----------------------------------------------------------------------------------------------
# Deciding in kopf's event loop
#
# Most child and pod watch events change nothing we write (a Deployment's status moving, a pod
# being scheduled). kopf runs a sync handler in its thread pool, where such an event queues behind
# the reconciles blocked on the API server, and kopf holds every later event of that object, fully
# decoded, in a per-object queue meanwhile: under a 1,000-CR burst that backlog was the operator's
# memory and its lag. These checks answer those events from the caches alone (no I/O, no waiting
# on a lock, microseconds), so only events that lead to a write take a worker thread.
#
# Why a "quiet" answer is safe: kopf updates its indexes before it calls the handlers, so the
# caches already hold this event's object. A worker that takes the parent's lock after the check
# derives from data at least as new; one that holds or waits for it during the check makes the
# answer "not quiet", and the event goes to the worker path as before.


def _quiet(
    ctx: Context, trigger: str, key: tuple[str, str], decide: Callable[[], str | None]
) -> bool:
    """Run `decide` unless a worker is busy with `key`; record its result as a reconcile when
    it found nothing to write. Any error leaves the event to the worker path, which handles it."""
    if ctx.locks.busy(key):
        return False
    started = perf_counter()
    try:
        result = decide()
    except Exception:
        return False
    if result is None:
        return False
    ctx.metrics.count_reconcile(trigger, result, perf_counter() - started)
    return True


def _quiet_result(ctx: Context, body: Mapping[str, Any], desired: DesiredState) -> str | None:
    """What `_write_derived_status(ctx, body, desired, None)` returns, if it would not write."""
    if _status_changed(ctx, body, desired):
        return None
    return _result(ctx, body, desired, None)


def quiet_child_event(ctx: Context, event_type: str | None, child: Mapping[str, Any]) -> bool:
    """True when `refresh_from_child(ctx, event_type, child)` would write nothing — decided
    from the caches, without I/O or blocking — and the event has been recorded as it would
    record it. False when it must run: a child to repair, a status that changed, a deletion
    (the parent is then read fresh), or a worker busy with this parent."""
    event = _child_event(ctx, event_type, child)
    if event is None:
        return True
    if event.type == "DELETED":
        return False
    owner = event.owner

    def decide() -> str | None:
        work = _child_work(ctx, event, _cached_parent(ctx, owner.namespace, owner.name))
        if isinstance(work, str):
            return work
        return None if work.plan else _quiet_result(ctx, work.body, work.desired)

    return _quiet(ctx, TRIGGER_CHILD, (owner.namespace, owner.name), decide)


def quiet_pod_event(ctx: Context, event_type: str | None, pod: Mapping[str, Any]) -> bool:
    """True when `refresh_from_pod(ctx, event_type, pod)` would write nothing (decided from the
    caches, without I/O or blocking), recorded as it would record it; False when it must run."""
    metadata = pod.get("metadata") or {}
    namespace = str(metadata.get("namespace") or "")
    name = (metadata.get("labels") or {}).get(names.LABEL_DEPLOYMENT)
    if event_type is None or not name:
        return True

    def decide() -> str | None:
        target = _status_target(ctx, namespace, name)
        return RESULT_SKIPPED if target is None else _quiet_result(ctx, *target)

    return _quiet(ctx, TRIGGER_POD, (namespace, name), decide)
