"""LLMDeployment manifests the cluster-backed tests build, written once."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from llmop.api.v1alpha1 import API_VERSION, KIND

H100 = "NVIDIA-H100-80GB-HBM3"
PLAN_8B_ON_H100: dict[str, Any] = {
    "memoryBandwidthGBs": 3350,
    "activeWeightsGiBPerGPU": 14.96,
    "kvBytesPerToken": 131072,
    "maxNumSeqs": 1024,
    "kvCacheTokens": 433744,
    "maxNumBatchedTokens": 8192,
}
"""`status.plan`'s keys the GPU-time price reads, as the operator writes them for an 8B model in
bfloat16 on one H100 (~15 GiB of weights, 128 KiB of KV a token)."""
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


def open_crd(group: str, kind: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A namespaced CustomResourceDefinition `<kind>s.<group>` (v1) whose schema accepts any
    object: a stand-in for a CRD the test needs to exist, not to check."""
    plural = f"{kind.lower()}s"
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}", **({"labels": labels} if labels else {})},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }


def workload_status(replicas: int, ready: int) -> dict[str, Any]:
    """A Deployment (or LeaderWorkerSet) as the status derivation reads it: generation 2,
    observed, `replicas` wanted and `ready` of them ready, updated and available."""
    return {
        "metadata": {"generation": 2},
        "spec": {"replicas": replicas},
        "status": {
            "observedGeneration": 2,
            "replicas": ready,
            "readyReplicas": ready,
            "updatedReplicas": ready,
            "availableReplicas": ready,
        },
    }


def cel_rules(node: Any) -> Iterator[dict[str, str]]:
    """Every `x-kubernetes-validations` rule of a CRD (or any part of one), depth first."""
    if isinstance(node, dict):
        yield from node.get("x-kubernetes-validations", [])
        for value in node.values():
            yield from cel_rules(value)
    elif isinstance(node, list):
        for value in node:
            yield from cel_rules(value)
