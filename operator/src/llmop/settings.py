"""Operator-wide inputs to rendering that do not come from the LLMDeployment itself.

A leaf module: `config` (which reads them from flags and the environment) and `render` (which
uses them) both import it, so configuration does not depend on rendering.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_VLLM_IMAGE = "ghcr.io/llmop/engine:0.1.0"
DEFAULT_SIMULATOR_IMAGE = "ghcr.io/llmop/engine-sim:0.1.0"
DEFAULT_VLLM_CPU_IMAGE = "ghcr.io/llmop/engine-cpu:0.1.0"
DEFAULT_GPU_RESOURCE_NAME = "nvidia.com/gpu"


@dataclass(frozen=True)
class RenderSettings:
    """Defaults the operator was configured with (read once at startup)."""

    vllm_image: str = DEFAULT_VLLM_IMAGE
    """Engine image for `backend: vllm` when the CR names none."""
    simulator_image: str = DEFAULT_SIMULATOR_IMAGE
    """Engine image for `backend: simulator` when the CR names none."""
    vllm_cpu_image: str = DEFAULT_VLLM_CPU_IMAGE
    """Engine image for `backend: vllm` with `resources.gpus: 0` (vLLM's CPU build)."""
    service_monitor: bool = False
    """Render a prometheus-operator ServiceMonitor for each LLMDeployment."""
    image_pull_policy: str = "IfNotPresent"
    """Pull policy of the engine container."""
    gpu_resource_name: str = DEFAULT_GPU_RESOURCE_NAME
    """GPU extended resource for LLMDeployments that name none (the cluster's device plugin)."""
    hub_endpoint: str | None = None
    """Model hub base URL (`HF_ENDPOINT`) for the pre-flight and the download Job; None: the
    public Hugging Face Hub."""
