"""Spec → capacity plan: catalog lookups, overrides, and when there is nothing to plan."""

from __future__ import annotations

from typing import Any

import pytest

from llmop import sizing
from llmop.api.v1alpha1 import LLMDeploymentSpec


def spec(**fields: Any) -> LLMDeploymentSpec:
    body = {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, **fields}
    return LLMDeploymentSpec.model_validate(body)


def test_catalog_model_on_catalog_gpu_is_planned() -> None:
    result = sizing.plan_for(
        spec(resources={"gpuProduct": "NVIDIA-H100-80GB-HBM3"}, engine={"maxModelLen": 8192})
    )
    assert result.fits is True
    assert result.reason == sizing.REASON_FITS
    status = result.plan_status()
    assert status is not None
    assert status.fits is True
    assert status.kv_cache_tokens is not None
    assert status.kv_cache_tokens > 100_000
    assert status.max_model_len == 8192


def test_gpu_memory_override_wins_over_the_catalog() -> None:
    result = sizing.plan_for(
        spec(
            resources={"gpuProduct": "NVIDIA-H100-80GB-HBM3", "gpuMemoryGiB": 22},
            engine={"maxModelLen": 8192},
        )
    )
    assert result.gpu_memory_gib == 22
    assert result.plan is not None
    assert result.plan.kv_cache_tokens < 100_000


def test_does_not_fit_names_the_fix() -> None:
    result = sizing.plan_for(
        spec(
            model={"name": "meta-llama/Llama-3.1-70B-Instruct"},
            resources={"gpuProduct": "H100"},
            engine={"maxModelLen": 8192},
        )
    )
    assert result.fits is False
    assert result.plan is not None
    assert any("tensorParallelSize: 2" in s for s in result.plan.suggestions)


def test_architecture_override_plans_an_unknown_model() -> None:
    architecture = {
        "parameters": 7_000_000_000,
        "layers": 32,
        "kvHeads": 8,
        "headDim": 128,
        "maxPositionEmbeddings": 32768,
    }
    result = sizing.plan_for(
        spec(
            model={"name": "acme/private-7b", "architecture": architecture},
            resources={"gpuProduct": "NVIDIA-L40S"},
            engine={"maxModelLen": 8192},
        )
    )
    assert result.fits is True
    assert result.plan is not None
    assert result.plan.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        (
            {"model": {"name": "acme/unknown"}, "resources": {"gpuProduct": "H100"}},
            sizing.REASON_MODEL_UNKNOWN,
        ),
        ({"resources": {"gpuProduct": "NVIDIA-Imaginary-9000"}}, sizing.REASON_GPU_MEMORY_UNKNOWN),
        ({}, sizing.REASON_GPU_MEMORY_UNKNOWN),
        ({"resources": {"gpus": 0}, "engine": {"backend": "simulator"}}, sizing.REASON_NO_GPUS),
    ],
    ids=["unknown-model", "unknown-gpu", "no-gpu-product", "no-gpus"],
)
def test_missing_facts_give_no_verdict(fields: dict[str, Any], reason: str) -> None:
    result = sizing.plan_for(spec(**fields))
    assert result.plan is None
    assert result.fits is None
    assert result.plan_status() is None
    assert result.reason == reason
    assert result.load_timeout_seconds == sizing.UNKNOWN_SIZE_LOAD_SECONDS


@pytest.mark.parametrize(
    ("weights", "seconds"), [(None, 1800), (0.0, 600), (15.0, 900), (140.0, 3400)]
)
def test_load_timeout_grows_with_model_size(weights: float | None, seconds: int) -> None:
    assert sizing.load_timeout_seconds(weights) == seconds


def test_enforce_eager_in_args_frees_cuda_graph_memory() -> None:
    base = spec(resources={"gpuProduct": "H100"}, engine={"maxModelLen": 8192})
    eager = spec(
        resources={"gpuProduct": "H100"}, engine={"maxModelLen": 8192, "args": ["--enforce-eager"]}
    )
    base_plan, eager_plan = sizing.plan_for(base).plan, sizing.plan_for(eager).plan
    assert base_plan is not None
    assert eager_plan is not None
    assert eager_plan.kv_cache_tokens > base_plan.kv_cache_tokens
