"""Pure: the InferencePool as the status sees it — the pool the operator made
(`status.inferencePool`, which is how a removed spec.router.inferencePool gets its pool deleted
without a request for every LLMDeployment) and the `Degraded` issue while the cluster does not
serve the InferencePool API.

The parent path decides both and leaves a `PoolVerdict` in the reconcile context; every status
path derives from it, or, before this process's first parent pass (a restart), from the status
as stored, so no path erases what another found.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmop import conditions, kinds
from llmop.api.v1alpha1 import LLMDeploymentSpec, LLMDeploymentStatus
from llmop.pods import PodIssue

GIE_CRDS = (
    "https://github.com/kubernetes-sigs/gateway-api-inference-extension/releases/download/"
    "v1.6.0/manifests.yaml"
)


@dataclass(frozen=True)
class PoolVerdict:
    """What this process's last parent pass found about one parent's InferencePool."""

    uid: str
    applied: bool
    """A pool the operator made exists (applied, and not deleted since)."""
    unavailable: bool
    """The spec wants a pool, and the cluster does not serve the InferencePool API."""


def unavailable_issue(name: str, namespace: str) -> PodIssue:
    """Degraded's issue for a wanted pool the cluster cannot hold."""
    crd = f"{kinds.INFERENCE_POOL.plural}.{kinds.INFERENCE_POOL.group}"
    return PodIssue(
        conditions.REASON_INFERENCE_POOL_UNAVAILABLE,
        f"spec.router.inferencePool is set, but the cluster does not serve "
        f"{kinds.INFERENCE_POOL.api_version} InferencePools (CRD {crd}): install the Gateway API "
        f"Inference Extension CRDs v1.x (kubectl apply -f {GIE_CRDS}); the pool is created "
        f"within seconds of that. The model's own Service {name}.{namespace}.svc still serves it.",
        "",
    )


def pool_state(
    *,
    name: str,
    namespace: str,
    uid: str,
    spec: LLMDeploymentSpec,
    previous: LLMDeploymentStatus,
    verdict: PoolVerdict | None,
) -> tuple[str | None, PodIssue | None]:
    """(status.inferencePool, the Degraded issue) for the status about to be written.

    `verdict` is this process's last word for the parent (ignored when it is for another uid);
    without one, the stored status stands: the recorded pool, and an InferencePoolUnavailable
    verdict while the spec still wants a pool."""
    wanted = spec.router.inference_pool is not None
    if verdict is not None and verdict.uid == uid:
        applied, unavailable = verdict.applied, verdict.unavailable
    else:
        applied = previous.inference_pool is not None
        before = conditions.find(previous.conditions, conditions.DEGRADED)
        unavailable = (
            before is not None
            and before.status == "True"
            and before.reason == conditions.REASON_INFERENCE_POOL_UNAVAILABLE
        )
    issue = unavailable_issue(name, namespace) if wanted and unavailable else None
    return (name if applied else None), issue
