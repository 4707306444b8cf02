"""The planner counts the LoRA slots (maxLoras x maxLoraRank, allocated at start) in the memory
the KV cache does not get: checked against the projection sizes of a known model, and through
the CR (adapters imply the default slots)."""

from __future__ import annotations

import pytest

from llmop.api.v1alpha1 import LLMDeploymentSpec
from llmop.planner import PlanRequest, lookup_gpu, lookup_model, plan_capacity
from llmop.planner.capacity import GIB, lora_slots_gib_per_gpu
from llmop.sizing import plan_for

H100 = lookup_gpu("NVIDIA-H100-80GB-HBM3")
LLAMA_8B = lookup_model("meta-llama/Llama-3.1-8B-Instruct")


def request(**kwargs: object) -> PlanRequest:
    assert H100 is not None
    assert LLAMA_8B is not None
    return PlanRequest(
        architecture=LLAMA_8B,
        gpu_memory_gib=H100.memory_gib,
        gpu_product=H100.product,
        **kwargs,  # type: ignore[arg-type]
    )


def test_slot_memory_matches_llama_8b_projection_sizes() -> None:
    # Llama-3.1-8B: hidden 4096, kv_dim 1024, intermediate 14336, 32 layers; per layer and rank
    # the seven projections take 9 x 4096 + 2 x 1024 + 3 x 14336 = 81,920 elements (bf16).
    exact = 4 * 64 * 32 * 81_920 * 2 / GIB
    estimate = lora_slots_gib_per_gpu(request(max_loras=4, max_lora_rank=64), 32, 2.0)
    assert estimate == pytest.approx(exact, rel=0.03)
    assert 1.2 < estimate < 1.3  # GiB per GPU at the CR's default slots


def test_slots_shrink_the_kv_cache_and_scale_with_tp() -> None:
    plain = plan_capacity(request())
    lora = plan_capacity(request(max_loras=4, max_lora_rank=64))
    lost = (plain.kv_cache_gib_per_gpu - lora.kv_cache_gib_per_gpu) * GIB
    assert lost / GIB == pytest.approx(
        lora_slots_gib_per_gpu(request(max_loras=4, max_lora_rank=64), 32, 2.0)
    )
    assert lora.kv_cache_tokens < plain.kv_cache_tokens
    assert "LoRA slots" in lora.message
    assert "LoRA slots" not in plain.message
    two = lora_slots_gib_per_gpu(
        request(max_loras=4, max_lora_rank=64, tensor_parallel_size=2), 32, 2.0
    )
    assert two == pytest.approx(
        lora_slots_gib_per_gpu(request(max_loras=4, max_lora_rank=64), 32, 2.0) / 2
    )


def test_off_without_slots() -> None:
    assert lora_slots_gib_per_gpu(request(), 32, 2.0) == 0.0


def test_the_cr_adapters_imply_the_default_slots_in_the_plan() -> None:
    base = {
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
        "resources": {"gpus": 1, "gpuProduct": "NVIDIA-H100-80GB-HBM3"},
    }
    plain = plan_for(LLMDeploymentSpec.model_validate(base))
    with_adapter = plan_for(
        LLMDeploymentSpec.model_validate(
            base | {"adapters": [{"name": "sql", "source": "hf://acme/sql"}]}
        )
    )
    assert plain.plan is not None
    assert with_adapter.plan is not None
    assert with_adapter.plan.kv_cache_tokens < plain.plan.kv_cache_tokens
