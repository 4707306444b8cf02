"""Pure: the Service in front of ready engine pods (OpenAI-compatible API + metrics port)."""

from __future__ import annotations

from typing import Any

from llmop import names
from llmop.api.v1alpha1 import LLMDeployment
from llmop.render.metadata import child_metadata


def render_service(deployment: LLMDeployment) -> dict[str, Any]:
    """ClusterIP (or the requested type) selecting this deployment's engine pods."""
    name = deployment.metadata.name
    service = deployment.spec.service
    metadata: dict[str, Any] = child_metadata(deployment)
    if service.annotations:
        metadata["annotations"] = dict(sorted(service.annotations.items()))
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {
            "type": service.type,
            "selector": names.selector_labels(name),
            "ports": [
                {
                    "name": names.API_PORT_NAME,
                    "port": service.port,
                    "targetPort": names.API_PORT_NAME,
                    "protocol": "TCP",
                },
                {
                    "name": names.PROBE_PORT_NAME,
                    "port": names.PROBE_PORT,
                    "targetPort": names.PROBE_PORT_NAME,
                    "protocol": "TCP",
                },
            ],
        },
    }
