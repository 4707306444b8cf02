"""The model cache gate: pre-flight, claim, download Job — before any engine pod. The engine
children are planned from the commit the cache holds. The gate returns a decision (go on with
this desired state, stall with this problem, or wait for the download); the pass writes the
status."""

from __future__ import annotations

import base64
import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from llmop import events, hub, kinds, pod_client, preflight
from llmop.api.v1alpha1 import LLMDeployment, ModelStatus
from llmop.cache_gate import plan_gate
from llmop.desired import DesiredState, desired_state
from llmop.quantity import quantity_value
from llmop.reconcile.caches import generation_of, key_of
from llmop.reconcile.context import Context, ModelGate, Parsed, post_event
from llmop.reconcile.writes import run_plan
from llmop.render import model_cache
from llmop.status import Problem

log = logging.getLogger("llmop.reconcile.model_gate")


JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
"""Set by the Job controller on the Job's pods."""
REASON_CACHE_CLAIM_NOT_FOUND = "CacheClaimNotFound"
REASON_TOKEN_SECRET_NOT_FOUND = "TokenSecretNotFound"


@dataclass(frozen=True)
class Waiting:
    """The gate's decision while the download runs: no engine child yet; the status is derived
    from the spec as parsed (it shows the download's progress)."""


WAITING = Waiting()

Decision = DesiredState | Problem | Waiting
"""What the gate decided: plan the engine children from this desired state, stall the parent
with this problem, or wait for the download."""


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


def _preflight(ctx: Context, body: Mapping[str, Any], llmd: LLMDeployment) -> ModelGate:
    namespace, _ = key_of(body)
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
            raise hub.HubUnavailableError(verdict.message)  # the handler retries with backoff
    status = ModelStatus(
        resolved_revision=verdict.resolved_revision,
        floating_revision=verdict.floating if verdict.resolved_revision else None,
        size_bytes=verdict.total_bytes,
        cache_claim=model_cache.cache_claim(llmd),
    )
    gate = ModelGate(*generation_of(body), model, verdict, status)
    if verdict.ok and verdict.floating:
        spec = events.EventSpec("Warning", preflight.REASON_FLOATING_REVISION, verdict.message)
        post_event(ctx, body, spec)
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
            return pod_client.read_progress(status["podIP"])
    return None


def _gate(ctx: Context, body: Mapping[str, Any], parsed: Parsed) -> ModelGate:
    """This generation's gate: the pre-flight runs once per generation (a refusal is checked
    again on every generation, as access may have been granted since; an accepted model that
    did not change keeps its verdict)."""
    assert parsed.desired is not None
    llmd = parsed.desired.llmd
    key = key_of(body)
    gate = ctx.recall(key).model_gate
    if gate is not None and (gate.uid, gate.generation) == (parsed.uid, parsed.generation):
        return gate
    if (
        gate is not None
        and gate.uid == parsed.uid
        and gate.verdict.ok
        and gate.model == llmd.spec.model
    ):
        gate = ModelGate(parsed.uid, parsed.generation, gate.model, gate.verdict, gate.status)
    else:
        gate = _preflight(ctx, body, llmd)
    kept = gate
    ctx.update(key, lambda memory: replace(memory, model_gate=kept))
    return gate


def _read_job(ctx: Context, namespace: str, llmd: LLMDeployment, sha: str) -> Any:
    job_name = model_cache.download_job_name(llmd, sha)
    return ctx.kube.read(kinds.JOB.api_version, kinds.JOB.kind, namespace, job_name)


def run_gate(ctx: Context, body: Mapping[str, Any], parsed: Parsed) -> Decision:
    """The desired state at the resolved commit once the cache holds it; else the problem to
    stall on (pre-flight refused, a child rejected, download failed) or `WAITING` for the
    download. Decided by `cache_gate.plan_gate`; its applies (claim, Job) go through the
    executor. Writes no status: the caller does, from the decision."""
    assert parsed.desired is not None
    llmd = parsed.desired.llmd
    key = key_of(body)
    gate = _gate(ctx, body, parsed)
    sha = gate.verdict.resolved_revision
    job = _read_job(ctx, key[0], llmd, sha) if gate.verdict.ok and sha else None
    progress = None
    if job is not None and model_cache.download_phase(job)[0] == "Downloading":
        progress = _download_progress(ctx, key[0], job["metadata"]["name"])
    settings = ctx.render_settings
    plan = plan_gate(
        llmd, body, settings, gate.verdict, job=job, progress=progress, applied=gate.applied
    )
    if plan.children:
        problem = run_plan(ctx, body, plan.children)
        if problem is not None:
            return problem
        gate.applied = True
        job = _read_job(ctx, key[0], llmd, plan.revision or "")
        plan = plan_gate(llmd, body, settings, gate.verdict, job=job, progress=None, applied=True)
    downloading = plan.downloading
    ctx.update(key, lambda memory: replace(memory, downloading=downloading))
    if plan.download is not None:
        gate.status = gate.status.model_copy(update={"download": plan.download})
    if plan.outcome == "stall":
        assert plan.problem is not None
        return plan.problem
    if plan.outcome == "wait":
        return WAITING
    if gate.desired is None:
        gate.desired = desired_state(
            LLMDeployment.model_validate(body),
            settings,
            resolved_revision=plan.revision,
            facts=parsed.facts,
        )
    return gate.desired


def desired_for(ctx: Context, body: Mapping[str, Any], parsed: Parsed) -> DesiredState | None:
    """What the engine children are planned from: the parsed spec, or for a model cache the
    gate's (None until this process saw the cache filled: the parent path decides then)."""
    if parsed.desired is None or parsed.desired.llmd.spec.model.cache is None:
        return parsed.desired
    gate = ctx.recall(key_of(body)).model_gate
    if gate is None or (gate.uid, gate.generation) != (parsed.uid, parsed.generation):
        return None
    return gate.desired
