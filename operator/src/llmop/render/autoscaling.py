"""Pure: the HorizontalPodAutoscaler that scales engine pods on queue depth.

GPU-sane behaviour: scale up at once (a new replica takes minutes to load), scale down one pod at
a time after a long stabilization window (reloading a model is expensive).
"""

from __future__ import annotations

from typing import Any

from llmop import kinds, names
from llmop.api.v1alpha1 import AutoscalingSpec, LLMDeployment
from llmop.render.metadata import child_metadata

SCALE_UP_PERIOD_SECONDS = 60


def quantity(value: float) -> str:
    """A Kubernetes quantity for a target value: `4`, or `2500m` for 2.5."""
    if float(value).is_integer():
        return str(int(value))
    return f"{round(value * 1000)}m"


def render_hpa(llmd: LLMDeployment) -> dict[str, Any] | None:
    """The HPA, or None when autoscaling is off."""
    autoscaling = llmd.spec.autoscaling
    if autoscaling is None:
        return None
    name = llmd.metadata.name
    # A multi-node replica is one LWS group: the HPA scales groups through the LWS's scale
    # subresource, whose selector picks the leaders (which carry the queue metric).
    target = kinds.LEADER_WORKER_SET if llmd.spec.pipeline_parallel_size > 1 else kinds.DEPLOYMENT
    return {
        "apiVersion": kinds.HPA.api_version,
        "kind": kinds.HPA.kind,
        "metadata": child_metadata(llmd),
        "spec": {
            "scaleTargetRef": {
                "apiVersion": target.api_version,
                "kind": target.kind,
                "name": name,
            },
            # The HPA keeps 1..N; 0 <-> 1 is the operator's (idle) and the router's (wake): an
            # HPA does not act on a target at 0 replicas, and its own minReplicas 0 is alpha.
            "minReplicas": max(1, autoscaling.min_replicas),
            "maxReplicas": autoscaling.max_replicas,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": names.QUEUE_DEPTH_METRIC},
                        "target": {
                            "type": "AverageValue",
                            "averageValue": quantity(autoscaling.target_queue_depth),
                        },
                    },
                }
            ],
            "behavior": _behavior(autoscaling),
        },
    }


def _behavior(autoscaling: AutoscalingSpec) -> dict[str, Any]:
    up = autoscaling.scale_up
    down = autoscaling.scale_down
    return {
        "scaleUp": {
            "stabilizationWindowSeconds": up.stabilization_window_seconds,
            "selectPolicy": "Max",
            "policies": [
                {
                    "type": "Percent",
                    "value": up.max_percent_per_minute,
                    "periodSeconds": SCALE_UP_PERIOD_SECONDS,
                },
                {
                    "type": "Pods",
                    "value": up.max_pods_per_minute,
                    "periodSeconds": SCALE_UP_PERIOD_SECONDS,
                },
            ],
        },
        "scaleDown": {
            "stabilizationWindowSeconds": down.stabilization_window_seconds,
            "selectPolicy": "Min",
            "policies": [
                {
                    "type": "Pods",
                    "value": down.pods_per_period,
                    "periodSeconds": down.period_seconds,
                }
            ],
        },
    }
