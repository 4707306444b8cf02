"""The API models: defaults, camelCase wire names, bounds, and round trips."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from llmop.api.v1alpha1 import LLMDeployment, LLMDeploymentSpec


def minimal_spec(**overrides: Any) -> dict[str, Any]:
    return {"model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"}, **overrides}


def test_defaults_match_the_design() -> None:
    spec = LLMDeploymentSpec.model_validate(minimal_spec())
    assert spec.engine.backend == "vllm"
    assert spec.engine.gpu_memory_utilization == 0.9
    assert spec.resources.gpus == 1
    assert spec.resources.gpu_resource_name is None
    assert spec.rollout.max_surge is None  # decided from the room on the nodes
    assert spec.rollout.max_unavailable == 0
    assert spec.rollout.endpoint_propagation_seconds == 5
    assert spec.service.port == 8000
    assert spec.health.deep_probe.enabled is True
    assert spec.replicas is None
    assert spec.desired_fixed_replicas == 1


def test_wire_names_are_camel_case_and_round_trip() -> None:
    body = minimal_spec(
        engine={"maxModelLen": 4096, "kvCacheDtype": "fp8", "tensorParallelSize": 2},
        resources={"gpus": 2, "gpuMemoryGiB": 24, "gpuProduct": "NVIDIA-L4"},
        autoscaling={"maxReplicas": 3, "scaleDown": {"stabilizationWindowSeconds": 60}},
    )
    spec = LLMDeploymentSpec.model_validate(body)
    assert spec.engine.max_model_len == 4096
    assert spec.resources.gpu_memory_gib == 24
    dumped = spec.model_dump(by_alias=True, exclude_none=True)
    assert dumped["resources"]["gpuMemoryGiB"] == 24
    assert dumped["autoscaling"]["scaleDown"]["stabilizationWindowSeconds"] == 60
    assert LLMDeploymentSpec.model_validate(dumped) == spec


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"engine": {"gpuMemoryUtilization": 0}}, "gpuMemoryUtilization"),
        ({"engine": {"gpuMemoryUtilization": 0.99}}, "gpuMemoryUtilization"),
        ({"engine": {"backend": "tgi"}}, "backend"),
        ({"resources": {"gpus": -1}}, "gpus"),
        ({"replicas": -1}, "replicas"),
        ({"autoscaling": {"minReplicas": 1}}, "maxReplicas"),
        ({"rollout": {"drainSeconds": 0}}, "drainSeconds"),
        ({"engine": {"env": [{"name": "1BAD"}]}}, "name"),
    ],
    ids=[
        "utilization-zero",
        "utilization-above-0.98",
        "unknown-backend",
        "negative-gpus",
        "negative-replicas",
        "autoscaling-needs-max",
        "drain-zero",
        "bad-env-name",
    ],
)
def test_bounds_reject_bad_values_naming_the_field(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as error:
        LLMDeploymentSpec.model_validate(minimal_spec(**overrides))
    assert field in str(error.value)


def test_full_object_parses_with_unknown_fields_ignored() -> None:
    body = {
        "apiVersion": "serving.llmop.dev/v1alpha1",
        "kind": "LLMDeployment",
        "metadata": {"name": "x", "namespace": "ns", "generation": 3, "uid": "u"},
        "spec": minimal_spec(futureField=True),
        "status": {"observedGeneration": 2, "conditions": []},
    }
    deployment = LLMDeployment.model_validate(body)
    assert deployment.metadata.generation == 3
    assert deployment.status.observed_generation == 2
