"""Pure renderers: an LLMDeployment → the plain manifest dicts of its children.

Deterministic (same input, same bytes) and without owner references, which the caller adds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmop.api.v1alpha1 import LLMDeployment
from llmop.render.autoscaling import render_hpa
from llmop.render.deployment import render_deployment
from llmop.render.disruption import render_pdb
from llmop.render.monitoring import render_service_monitor
from llmop.render.service import render_service
from llmop.render.settings import RenderSettings

HPA_KIND = ("autoscaling/v2", "HorizontalPodAutoscaler")
PDB_KIND = ("policy/v1", "PodDisruptionBudget")


@dataclass(frozen=True)
class Children:
    """Everything one LLMDeployment owns."""

    deployment: dict[str, Any]
    service: dict[str, Any]
    hpa: dict[str, Any] | None
    pdb: dict[str, Any] | None
    service_monitor: dict[str, Any] | None

    def wanted(self) -> list[dict[str, Any]]:
        """Children to apply, in dependency order (the HPA after its target)."""
        optional = (self.pdb, self.hpa, self.service_monitor)
        return [self.service, self.deployment, *(child for child in optional if child)]

    def unwanted(self) -> list[tuple[str, str]]:
        """(apiVersion, kind) of optional children that must not exist, named like the parent.

        ServiceMonitors are never listed: monitoring is an operator-wide setting, and clusters
        without the prometheus-operator CRD must never see a request for one.
        """
        out = []
        if self.hpa is None:
            out.append(HPA_KIND)
        if self.pdb is None:
            out.append(PDB_KIND)
        return out


def render_children(
    deployment: LLMDeployment, settings: RenderSettings, *, load_timeout_seconds: int
) -> Children:
    """All children of `deployment` under the operator's `settings`."""
    return Children(
        deployment=render_deployment(
            deployment, settings, load_timeout_seconds=load_timeout_seconds
        ),
        service=render_service(deployment),
        hpa=render_hpa(deployment),
        pdb=render_pdb(deployment),
        service_monitor=render_service_monitor(deployment) if settings.service_monitor else None,
    )


__all__ = ["Children", "RenderSettings", "render_children"]
