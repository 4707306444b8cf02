"""LLMDeployment manifests the cluster-backed tests build, written once."""

from __future__ import annotations

from typing import Any

from llmop.api.v1alpha1 import API_VERSION, KIND

H100 = "NVIDIA-H100-80GB-HBM3"
SMALL_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


def simulator_spec(**overrides: Any) -> dict[str, Any]:
    """A small spec that fits: the simulator on one H100 (kwok pods become Ready at once)."""
    base: dict[str, Any] = {
        "model": {"name": SMALL_MODEL},
        "engine": {"backend": "simulator"},
        "resources": {"gpus": 1, "gpuProduct": H100},
    }
    return base | overrides


def llmd_manifest(namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A complete LLMDeployment object."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }
