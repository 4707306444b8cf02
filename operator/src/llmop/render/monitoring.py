"""Pure: the optional prometheus-operator ServiceMonitor scraping the agents' stable metrics."""

from __future__ import annotations

from typing import Any

from llmop import names
from llmop.api.v1alpha1 import LLMDeployment
from llmop.render.metadata import child_metadata


def render_service_monitor(deployment: LLMDeployment) -> dict[str, Any]:
    """Scrape `/metrics` on the agent's probe port of every engine pod behind the Service."""
    name = deployment.metadata.name
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": child_metadata(deployment),
        "spec": {
            "selector": {"matchLabels": names.selector_labels(name)},
            "endpoints": [
                {"port": names.PROBE_PORT_NAME, "path": names.METRICS_PATH, "interval": "15s"}
            ],
        },
    }
