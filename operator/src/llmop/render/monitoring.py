"""Pure: the optional prometheus-operator ServiceMonitor scraping the agents' stable metrics."""

from __future__ import annotations

from typing import Any

from llmop import kinds, names
from llmop.api.v1alpha1 import LLMDeployment
from llmop.render.metadata import child_metadata


def render_service_monitor(llmd: LLMDeployment) -> dict[str, Any]:
    """Scrape `/metrics` on the agent's probe port of every engine pod behind the Service."""
    name = llmd.metadata.name
    return {
        "apiVersion": kinds.SERVICE_MONITOR.api_version,
        "kind": kinds.SERVICE_MONITOR.kind,
        "metadata": child_metadata(llmd),
        "spec": {
            "selector": {"matchLabels": names.selector_labels(name)},
            "endpoints": [
                {"port": names.PROBE_PORT_NAME, "path": names.METRICS_PATH, "interval": "15s"}
            ],
        },
    }
