"""Operator-wide inputs to rendering that do not come from the LLMDeployment itself.

A leaf module: `config` (which reads them from flags and the environment) and `render` (which
uses them) both import it, so configuration does not depend on rendering. The engine
NetworkPolicy's peers setting is parsed here for the same reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

DEFAULT_VLLM_IMAGE = "ghcr.io/llmop/engine:0.1.0"
DEFAULT_SIMULATOR_IMAGE = "ghcr.io/llmop/engine-sim:0.1.0"
DEFAULT_VLLM_CPU_IMAGE = "ghcr.io/llmop/engine-cpu:0.1.0"
DEFAULT_GPU_RESOURCE_NAME = "nvidia.com/gpu"


API_PEERS: Final = "api"
"""Key of the setting's JSON: peers of the engine API port."""
PROBE_PEERS: Final = "probe"
"""Key of the setting's JSON: peers of the agent's probe port."""


def parse_peers(text: str) -> dict[str, list[dict[str, Any]]]:
    """The setting `{"api": [peer...], "probe": [peer...]}`; ValueError naming what is wrong."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"not JSON ({error.msg} at character {error.pos})") from error
    if not isinstance(value, dict) or set(value) != {API_PEERS, PROBE_PEERS}:
        raise ValueError(
            f'must be an object with exactly the keys "{API_PEERS}" and "{PROBE_PEERS}", '
            "each a list of NetworkPolicyPeer objects"
        )
    for key in (API_PEERS, PROBE_PEERS):
        peers = value[key]
        if not isinstance(peers, list) or not all(isinstance(p, dict) and p for p in peers):
            raise ValueError(f'"{key}" must be a list of non-empty NetworkPolicyPeer objects')
    return value


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
    network_policy: str | None = None
    """Peers of the engine pods' NetworkPolicy as JSON (`llmop.render.network_policy`); None:
    no NetworkPolicy is rendered."""
