"""Pure renderers: an LLMDeployment → the plain manifest dicts of its children.

Deterministic (same input, same bytes) and without owner references, which the caller adds.
Which kinds exist, their order and which are optional come from `llmop.kinds`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmop import kinds
from llmop.api.v1alpha1 import LLMDeployment
from llmop.kinds import ChildKind
from llmop.render.adapters import render_config_map
from llmop.render.autoscaling import render_hpa
from llmop.render.deployment import render_deployment
from llmop.render.disruption import render_pdb
from llmop.render.inference_pool import render_inference_pool
from llmop.render.leader_worker_set import render_leader_worker_set
from llmop.render.monitoring import render_service_monitor
from llmop.render.network_policy import render_network_policy
from llmop.render.pre_pull import render_pre_pull
from llmop.render.service import render_service
from llmop.settings import RenderSettings


@dataclass(frozen=True)
class Children:
    """Everything one LLMDeployment owns; None for a kind it must not have."""

    deployment: dict[str, Any] | None
    """The workload of one-pod replicas (pipelineParallelSize 1)."""
    leader_worker_set: dict[str, Any] | None
    """The workload of multi-node replicas (pipelineParallelSize > 1)."""
    service: dict[str, Any]
    adapters: dict[str, Any] | None
    """The desired LoRA adapters' ConfigMap (while LoRA is on)."""
    hpa: dict[str, Any] | None
    pdb: dict[str, Any] | None
    service_monitor: dict[str, Any] | None
    inference_pool: dict[str, Any] | None
    network_policy: dict[str, Any] | None = None
    """The engine pods' ingress fence (with the operator's LLMOP_NETWORK_POLICY)."""
    pre_pull: dict[str, Any] | None = None
    """The image pre-pull DaemonSet (spec.scheduling.prePullImage)."""

    def by_kind(self) -> dict[ChildKind, dict[str, Any] | None]:
        """Every child kind of the registry → its manifest (None: must not exist)."""
        return {
            kinds.SERVICE: self.service,
            kinds.CONFIG_MAP: self.adapters,
            kinds.PRE_PULL: self.pre_pull,
            kinds.DEPLOYMENT: self.deployment,
            kinds.LEADER_WORKER_SET: self.leader_worker_set,
            kinds.PDB: self.pdb,
            kinds.HPA: self.hpa,
            kinds.SERVICE_MONITOR: self.service_monitor,
            kinds.INFERENCE_POOL: self.inference_pool,
            kinds.NETWORK_POLICY: self.network_policy,
        }

    @property
    def workload(self) -> dict[str, Any]:
        """The Deployment or the LeaderWorkerSet, whichever this spec has."""
        workload = self.deployment or self.leader_worker_set
        assert workload is not None, "render_children renders exactly one workload"
        return workload

    def get(self, kind: ChildKind) -> dict[str, Any] | None:
        """The manifest of `kind`, if wanted."""
        return self.by_kind()[kind]

    def wanted(self) -> list[dict[str, Any]]:
        """Children to apply, in the registry's order (the HPA after its target)."""
        by_kind = self.by_kind()
        return [manifest for kind in kinds.CHILDREN if (manifest := by_kind[kind]) is not None]

    def unwanted(self) -> list[ChildKind]:
        """Optional kinds that must not exist (named like the parent).

        ServiceMonitors are never listed: monitoring is an operator-wide setting, and clusters
        without the prometheus-operator CRD must never see a request for one. An unwanted
        InferencePool is listed, but deleted only where status.inferencePool says one was made.
        """
        by_kind = self.by_kind()
        return [kind for kind in kinds.CHILDREN if kind.optional and by_kind[kind] is None]


def render_children(
    llmd: LLMDeployment,
    settings: RenderSettings,
    *,
    load_timeout_seconds: int,
    kv_cache_tokens: int | None = None,
) -> Children:
    """All children of `llmd` under the operator's `settings`; `kv_cache_tokens` is the planned
    KV cache of one replica (None: no plan), which a simulated engine is given as its own."""
    multi_node = llmd.spec.pipeline_parallel_size > 1
    render_workload = render_leader_worker_set if multi_node else render_deployment
    workload = render_workload(
        llmd,
        settings,
        load_timeout_seconds=load_timeout_seconds,
        kv_cache_tokens=kv_cache_tokens,
    )
    return Children(
        deployment=None if multi_node else workload,
        leader_worker_set=workload if multi_node else None,
        service=render_service(llmd),
        adapters=render_config_map(llmd),
        hpa=render_hpa(llmd),
        pdb=render_pdb(llmd),
        service_monitor=render_service_monitor(llmd) if settings.service_monitor else None,
        inference_pool=render_inference_pool(llmd),
        network_policy=(
            render_network_policy(llmd, settings.network_policy)
            if settings.network_policy is not None
            else None
        ),
        pre_pull=render_pre_pull(llmd, settings),
    )


__all__ = ["Children", "RenderSettings", "render_children"]
