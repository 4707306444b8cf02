"""Pure: the PodDisruptionBudget that lets node drains evict one engine pod at a time."""

from __future__ import annotations

from typing import Any

from llmop import kinds
from llmop.api.v1alpha1 import LLMDeployment, LLMDeploymentSpec
from llmop.render.leader_worker_set import replica_selector
from llmop.render.metadata import child_metadata


def most_replicas(spec: LLMDeploymentSpec) -> int:
    """The largest replica count this spec allows."""
    if spec.autoscaling is not None:
        return spec.autoscaling.max_replicas
    return spec.desired_fixed_replicas


def render_pdb(llmd: LLMDeployment) -> dict[str, Any] | None:
    """`maxUnavailable: 1` when more than one replica can exist; None otherwise.

    With a single replica a PDB would either block node drains forever (maxUnavailable 0) or
    protect nothing (1), so there is none.
    """
    if most_replicas(llmd.spec) <= 1:
        return None
    return {
        "apiVersion": kinds.PDB.api_version,
        "kind": kinds.PDB.kind,
        "metadata": child_metadata(llmd),
        "spec": {
            "maxUnavailable": 1,
            # Leaders only for multi-node replicas: one replica is one pod either way.
            "selector": {"matchLabels": replica_selector(llmd)},
        },
    }
