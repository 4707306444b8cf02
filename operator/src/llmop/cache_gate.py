"""The model cache gate as a pure decision: from the pre-flight's verdict, the download Job as the
API server last showed it and the downloader's own progress, what to apply (the cache claim and
the Job), what status.model.download says, and whether the engine children wait, stall or go.

`llmop.reconcile.model_gate` reads the inputs, runs the applies through the same executor as
the engine children (so they are counted in `llmop_child_writes_total`) and acts on the outcome.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from llmop import conditions, names, preflight
from llmop.api.v1alpha1 import DownloadStatus, LLMDeployment
from llmop.plan import Apply, ChildPlan, owner_reference, with_owner
from llmop.render import model_cache
from llmop.settings import RenderSettings
from llmop.status import Problem

REASON_MODEL_DOWNLOAD_FAILED = "ModelDownloadFailed"

Outcome = Literal["wait", "stall", "proceed"]


@dataclass(frozen=True)
class GatePlan:
    """What the gate decided for one pass."""

    outcome: Outcome
    """wait: the cache is not filled yet; stall: it never will be as specified; proceed: plan
    the engine children at `revision`."""
    children: ChildPlan = field(default_factory=ChildPlan)
    """The cache claim and the download Job to apply (empty once applied and present)."""
    download: DownloadStatus | None = None
    """status.model.download (None before the Job's revision is known)."""
    problem: Problem | None = None
    """Why it stalls (outcome "stall")."""
    revision: str | None = None
    """The commit the cache holds or will hold."""
    downloading: bool = False
    """The download pod runs: its progress is worth polling."""


def plan_gate(
    llmd: LLMDeployment,
    parent: Mapping[str, Any],
    settings: RenderSettings,
    verdict: preflight.Verdict,
    *,
    job: dict[str, Any] | None,
    progress: Mapping[str, Any] | None,
    applied: bool,
) -> GatePlan:
    """The gate's decision. `job` is the download Job (None when it does not exist), `progress`
    the running downloader's `/progress` answer (None when unread), `applied` whether this
    process applied the claim and Job for this generation already."""
    if not verdict.ok or verdict.resolved_revision is None:
        return GatePlan(
            "stall", problem=Problem(verdict.reason or conditions.REASON_STALLED, verdict.message)
        )
    sha = verdict.resolved_revision
    if job is None or not applied:
        reference = owner_reference(parent)
        manifests = (
            model_cache.render_pvc(llmd),
            model_cache.render_download_job(llmd, settings, revision=sha),
        )
        applies = tuple(
            Apply(with_owner(m, reference), names.FIELD_MANAGER, f"{m['kind']}: model cache")
            for m in manifests
            if m is not None
        )
        return GatePlan("wait", ChildPlan(applies=applies), revision=sha)
    phase, message = model_cache.download_phase(job)
    download = model_cache.download_status(
        phase, message, progress if phase == "Downloading" else None, verdict.total_bytes
    )
    if phase == "Failed":
        job_name = model_cache.download_job_name(llmd, sha)
        namespace = llmd.metadata.namespace
        problem = Problem(
            REASON_MODEL_DOWNLOAD_FAILED,
            f"the download Job {job_name} failed ({message}): see `kubectl logs "
            f"job/{job_name} -n {namespace}`; fix the cause, then delete the Job to retry",
        )
        return GatePlan("stall", download=download, problem=problem, revision=sha)
    if phase != "Complete":
        return GatePlan("wait", download=download, revision=sha, downloading=phase == "Downloading")
    return GatePlan("proceed", download=download, revision=sha)


def waiting_message(download: DownloadStatus | None) -> str | None:
    """Ready's and Reconciling's message while the engine children wait for the cache; None
    once the download is complete (or unknown)."""
    if download is None or download.phase == "Complete":
        return None
    return f"Downloading the model into its cache: {download.summary}."
