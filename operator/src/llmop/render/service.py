"""Pure: the Service in front of ready engine pods (OpenAI-compatible API + metrics port)."""

from __future__ import annotations

from typing import Any

from llmop import kinds, names
from llmop.api.v1alpha1 import LLMDeployment
from llmop.render.leader_worker_set import replica_selector
from llmop.render.metadata import child_metadata


def render_service(llmd: LLMDeployment) -> dict[str, Any]:
    """ClusterIP (or the requested type) selecting this LLMDeployment's engine pods (the
    leaders of multi-node replicas: they serve the API)."""
    service = llmd.spec.service
    metadata: dict[str, Any] = child_metadata(llmd)
    if service.annotations:
        metadata["annotations"] = dict(sorted(service.annotations.items()))
    return {
        "apiVersion": kinds.SERVICE.api_version,
        "kind": kinds.SERVICE.kind,
        "metadata": metadata,
        "spec": {
            "type": service.type,
            "selector": replica_selector(llmd),
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
