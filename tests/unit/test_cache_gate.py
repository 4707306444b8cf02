"""The model cache gate's decision (llmop.cache_gate.plan_gate), table-tested like plan_children:
verdict, Job and progress → applies, status.model.download and wait | stall | proceed."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from llmop import cache_gate, conditions, preflight
from llmop.api.v1alpha1 import LLMDeployment
from llmop.settings import RenderSettings
from llmop.status import Observed, derive_status, parse_previous

SHA = "b" * 40
OK = preflight.Verdict(ok=True, resolved_revision=SHA, total_bytes=1 << 30)
REFUSED = preflight.Verdict(ok=False, reason="ModelAccessDenied", message="no access")


def parent(cache: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "serving.llmop.dev/v1alpha1",
        "kind": "LLMDeployment",
        "metadata": {"name": "chat", "namespace": "ml", "uid": "u-1", "generation": 1},
        "spec": {
            "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct", "cache": cache},
            "engine": {"backend": "simulator"},
            "resources": {"gpus": 1, "gpuProduct": "NVIDIA-H100-80GB-HBM3"},
        },
    }


def job(status: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "Job", "metadata": {"name": "chat-model-bbbbbbbb"}, "status": status}


ACTIVE = job({"active": 1})
PENDING = job({})
COMPLETE = job({"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1})
FAILED = job({"conditions": [{"type": "Failed", "status": "True", "reason": "PodFailurePolicy"}]})
PROGRESS = {
    "phase": "downloading",
    "bytesDone": 512 << 20,
    "bytesTotal": 1 << 30,
    "rateBytesPerSecond": 50 << 20,
    "etaSeconds": 10,
    "attempt": 1,
    "message": "",
}


def gate(
    cache: dict[str, Any],
    verdict: preflight.Verdict,
    found: dict[str, Any] | None,
    *,
    applied: bool = True,
    progress: dict[str, Any] | None = None,
) -> cache_gate.GatePlan:
    body = parent(cache)
    llmd = LLMDeployment.model_validate(body)
    return cache_gate.plan_gate(
        llmd, body, RenderSettings(), verdict, job=found, progress=progress, applied=applied
    )


SIZED = {"size": "2Gi"}
BOTH = ["PersistentVolumeClaim", "Job"]


@pytest.mark.parametrize(
    ("cache", "verdict", "found", "applied", "expected"),
    [
        pytest.param(SIZED, REFUSED, None, False, ("stall", [], None), id="refused"),
        pytest.param(SIZED, OK, None, False, ("wait", BOTH, None), id="first-pass-applies-both"),
        pytest.param(
            {"existingClaim": "models"},
            OK,
            None,
            False,
            ("wait", ["Job"], None),
            id="existing-claim-applies-only-the-job",
        ),
        pytest.param(SIZED, OK, ACTIVE, False, ("wait", BOTH, None), id="new-process-applies"),
        pytest.param(SIZED, OK, None, True, ("wait", BOTH, None), id="deleted-job-is-recreated"),
        pytest.param(SIZED, OK, PENDING, True, ("wait", [], "Pending"), id="pending"),
        pytest.param(SIZED, OK, ACTIVE, True, ("wait", [], "Downloading"), id="downloading"),
        pytest.param(SIZED, OK, COMPLETE, True, ("proceed", [], "Complete"), id="complete"),
        pytest.param(SIZED, OK, FAILED, True, ("stall", [], "Failed"), id="failed"),
    ],
)
def test_gate_table(
    cache: dict[str, Any],
    verdict: preflight.Verdict,
    found: dict[str, Any] | None,
    applied: bool,
    expected: tuple[str, list[str], str | None],
) -> None:
    outcome, applies, phase = expected
    plan = gate(cache, verdict, found, applied=applied)
    assert plan.outcome == outcome
    assert [a.kind for a in plan.children.applies] == applies
    for step in plan.children.applies:
        (owner,) = step.manifest["metadata"]["ownerReferences"]
        assert owner["uid"] == "u-1"
    assert (plan.download.phase if plan.download else None) == phase
    assert plan.downloading is (phase == "Downloading")
    if outcome != "stall" or phase is not None:
        assert plan.revision == SHA


def test_refusal_and_failure_name_their_cause() -> None:
    refused = gate({"size": "2Gi"}, REFUSED, None)
    assert refused.problem is not None
    assert (refused.problem.reason, refused.problem.message) == ("ModelAccessDenied", "no access")
    failed = gate({"size": "2Gi"}, OK, FAILED)
    assert failed.problem is not None
    assert failed.problem.reason == cache_gate.REASON_MODEL_DOWNLOAD_FAILED
    assert "kubectl logs job/" in failed.problem.message
    assert "-n ml" in failed.problem.message


def test_progress_shows_while_downloading_and_in_ready() -> None:
    plan = gate({"size": "2Gi"}, OK, ACTIVE, progress=PROGRESS)
    assert plan.download is not None
    assert plan.download.bytes_done == 512 << 20
    message = cache_gate.waiting_message(plan.download)
    assert message is not None
    assert "512.0 MiB/1.00 GiB" in message
    assert cache_gate.waiting_message(gate({"size": "2Gi"}, OK, COMPLETE).download) is None
    # Ready and Reconciling say the model downloads (what Argo CD and Flux show), not
    # "Creating the engine Deployment.".
    llmd = LLMDeployment.model_validate(parent({"size": "2Gi"}))
    status = derive_status(
        Observed("chat", "ml", generation=1, previous=parse_previous(None), waiting=message),
        llmd.spec,
        None,
        template_hash=None,
        now=datetime(2026, 1, 1, tzinfo=UTC),
    )
    found = {c.type: c for c in status.conditions}
    assert found["Ready"].reason == conditions.REASON_DOWNLOADING_MODEL
    assert found["Reconciling"].reason == conditions.REASON_DOWNLOADING_MODEL
    assert found["Reconciling"].status == "True"
    assert found["Ready"].message == message
