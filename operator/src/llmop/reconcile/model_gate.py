"""The model cache gate: pre-flight, claim, download Job — before any engine pod. The engine
children are planned from the commit the cache holds."""

from __future__ import annotations

import base64
import logging
from collections.abc import Mapping
from typing import Any

from llmop import conditions, engine_client, events, hub, kinds, names, preflight
from llmop.api.v1alpha1 import LLMDeployment, ModelStatus
from llmop.desired import DesiredState, desired_state
from llmop.kube import KubeError, RejectedError
from llmop.metrics import RESULT_OK
from llmop.plan import owner_reference, with_owner
from llmop.quantity import quantity_value
from llmop.reconcile.caches import key_of
from llmop.reconcile.context import Context, ModelGate, Parsed
from llmop.reconcile.writes import write_derived_status, write_stalled
from llmop.render import model_cache
from llmop.status import Problem

log = logging.getLogger("llmop.reconcile.model_gate")


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


def _preflight(ctx: Context, body: Mapping[str, Any], llmd: LLMDeployment) -> ModelGate:
    namespace, _ = key_of(body)
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
    gate = ModelGate(metadata.get("uid", ""), metadata.get("generation"), model, verdict, status)
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


def run_gate(ctx: Context, body: Mapping[str, Any], parsed: Parsed) -> DesiredState | str:  # noqa: C901, PLR0912
    """The desired state at the resolved commit once the cache holds it; else the result of
    stalling (pre-flight refused, download failed) or of waiting for the download."""
    assert parsed.desired is not None
    llmd = parsed.desired.llmd
    key = key_of(body)
    gate = ctx._gates.get(key)
    if gate is None or (gate.uid, gate.generation) != (parsed.uid, parsed.generation):
        # A refusal is checked again on every generation: access may have been granted since.
        if (
            gate is not None
            and gate.uid == parsed.uid
            and gate.verdict.ok
            and gate.model == llmd.spec.model
        ):
            gate = ModelGate(parsed.uid, parsed.generation, gate.model, gate.verdict, gate.status)
        else:
            gate = _preflight(ctx, body, llmd)
        ctx._gates[key] = gate
    verdict = gate.verdict
    if not verdict.ok or verdict.resolved_revision is None:
        return write_stalled(
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
            return write_stalled(ctx, body, Problem(conditions.REASON_CHILD_REJECTED, str(error)))
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
        return write_stalled(
            ctx,
            body,
            Problem(
                REASON_MODEL_DOWNLOAD_FAILED,
                f"the download Job {job_name} failed ({message}): see `kubectl logs "
                f"job/{job_name} -n {key[0]}`; fix the cause, then delete the Job to retry",
            ),
        )
    if phase != "Complete":
        write_derived_status(ctx, body, parsed.desired, None)
        return RESULT_OK
    if gate.desired is None:
        gate.desired = desired_state(
            LLMDeployment.model_validate(body), ctx.render_settings, resolved_revision=sha
        )
    return gate.desired


def desired_for(ctx: Context, body: Mapping[str, Any], parsed: Parsed) -> DesiredState | None:
    """What the engine children are planned from: the parsed spec, or for a model cache the
    gate's (None until this process saw the cache filled: the parent path decides then)."""
    if parsed.desired is None or parsed.desired.llmd.spec.model.cache is None:
        return parsed.desired
    gate = ctx._gates.get(key_of(body))
    if gate is None or (gate.uid, gate.generation) != (parsed.uid, parsed.generation):
        return None
    return gate.desired
