"""Pure: the optional prometheus-operator ServiceMonitor scraping the agents' stable metrics."""

from __future__ import annotations

from typing import Any, Final

from llmop import kinds, names
from llmop.api.v1alpha1 import LLMDeployment
from llmop.render.metadata import child_metadata

SCRAPE_INTERVAL: Final = "15s"
QUEUE_DEPTH_SCRAPE_INTERVAL: Final = "5s"
"""The HPA's metric is scraped alone, faster: a load step reaches Prometheus within 5 s instead
of 15 (the chart's PodMonitor does the same, `monitoring.podMonitor.queueDepthInterval`)."""


def _queue_depth_only(action: str) -> list[dict[str, Any]]:
    return [{"sourceLabels": ["__name__"], "regex": names.QUEUE_DEPTH_METRIC, "action": action}]


def render_service_monitor(llmd: LLMDeployment) -> dict[str, Any]:
    """Scrape `/metrics` on the agent's probe port of every engine pod behind the Service: the
    queue depth every 5 s, everything else every 15 s (one endpoint writes each series)."""
    name = llmd.metadata.name
    probe = {"port": names.PROBE_PORT_NAME, "path": names.METRICS_PATH}
    return {
        "apiVersion": kinds.SERVICE_MONITOR.api_version,
        "kind": kinds.SERVICE_MONITOR.kind,
        "metadata": child_metadata(llmd),
        "spec": {
            "selector": {"matchLabels": names.selector_labels(name)},
            "endpoints": [
                probe
                | {"interval": SCRAPE_INTERVAL, "metricRelabelings": _queue_depth_only("drop")},
                probe
                | {
                    "interval": QUEUE_DEPTH_SCRAPE_INTERVAL,
                    # Same pod and port as the endpoint above: a label of its own keeps this
                    # target's series (its `up`) apart.
                    "relabelings": [{"targetLabel": "llmop_scrape", "replacement": "queue-depth"}],
                    "metricRelabelings": _queue_depth_only("keep"),
                },
            ],
        },
    }
