"""Pure: the InferencePool (Gateway API Inference Extension v1) that lets a conformant gateway
route to this LLMDeployment's engine pods through an endpoint picker (spec.router.inferencePool).
"""

from __future__ import annotations

from typing import Any

from llmop import kinds, names
from llmop.api.v1alpha1 import LLMDeployment
from llmop.render.metadata import child_metadata

EPP_REF_GROUP = ""
EPP_REF_KIND = "Service"


def render_inference_pool(llmd: LLMDeployment) -> dict[str, Any] | None:
    """The pool of the engine pods (the Service's selector) on the engine's API port, with the
    endpoint picker it names; None without spec.router.inferencePool."""
    pool = llmd.spec.router.inference_pool
    if pool is None:
        return None
    ref = pool.endpoint_picker_ref
    return {
        "apiVersion": kinds.INFERENCE_POOL.api_version,
        "kind": kinds.INFERENCE_POOL.kind,
        "metadata": child_metadata(llmd),
        "spec": {
            # The Service's own selector: the pool and the Service always hold the same pods.
            "selector": {"matchLabels": names.selector_labels(llmd.metadata.name)},
            "targetPorts": [{"number": llmd.spec.service.port}],
            "endpointPickerRef": {
                # Written out although they are the CRD's defaults: drift detection and a
                # reader of the object see the whole reference.
                "group": EPP_REF_GROUP,
                "kind": EPP_REF_KIND,
                "name": ref.name,
                "port": {"number": ref.port},
                "failureMode": ref.failure_mode,
            },
        },
    }
