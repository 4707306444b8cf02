"""The planner reading a model's own config.json: KV per layer type as vLLM sizes it, weights
from the checkpoint's bytes, refusals that name the field — checked against real vLLM 0.19.0
startup logs (tests/support/published_configs.py says where each figure comes from)."""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any

import pytest

from llmop.planner import PlanRequest, lookup_gpu, plan_capacity
from llmop.planner.capacity import GIB, REASON_FITS, REASON_INVALID_TP, cost_per_million_tokens
from llmop.planner.cpu import CpuPlanRequest, plan_cpu_capacity
from llmop.planner.kv_layout import CHUNKED, FULL, MLA, SLIDING, build_layout
from llmop.planner.model_config import (
    ModelConfigError,
    ModelFiles,
    facts_from_config,
    facts_from_files,
    total_size_from_index,
)
from llmop.planner.vllm_profile import (
    VLLM_0_19,
    VLLM_CURRENT,
    image_vllm_version,
    profile_for,
)
from support.published_configs import AWQ_72B, CHECKPOINT_GIB, CONFIGS, LOGGED, SWEEP, Logged

H100 = lookup_gpu("NVIDIA-H100-80GB-HBM3")
assert H100 is not None
H100_TORCH_GIB = 79.19
"""What vLLM 0.19 logged as the H100's total memory in the sweep ("init_total_memory_gib")."""
SWEEP_BATCHED_TOKENS = 8192


def _facts(run: Logged) -> Any:
    checkpoint = CHECKPOINT_GIB.get(run.model)
    return facts_from_config(
        CONFIGS[run.model],
        name=run.model,
        checkpoint_bytes=None if checkpoint is None else int(checkpoint * GIB),
    )


def _id(run: Logged) -> str:
    return f"{run.model.split('/')[1]}-tp{run.tp}"


@pytest.mark.parametrize("run", LOGGED, ids=_id)
def test_kv_blocks_tokens_and_concurrency_match_the_vllm_log(run: Logged) -> None:
    """Given the memory vLLM had for the KV cache ("Available KV cache memory"), the grouping and
    block arithmetic give its num_gpu_blocks (within the 0.01 GiB the log rounds to), and from
    its block count exactly its "GPU KV cache size" and "Maximum concurrency" (source: SWEEP)."""
    layout = build_layout(
        _facts(run).attention_layers,
        tensor_parallel_size=run.tp,
        element_bytes=2,
        block_size=16,
    )
    rounding = 0.005 * GIB / (layout.page_bytes * layout.group_size)
    assert abs(layout.num_blocks(run.kv_gib * GIB) - run.blocks) <= rounding + 1, SWEEP
    assert layout.logged_tokens_from_blocks(run.blocks) == run.tokens
    per_request = layout.blocks_per_request(run.max_model_len, SWEEP_BATCHED_TOKENS)
    assert round(run.blocks / per_request, 2) == pytest.approx(run.concurrency, abs=0.011)


def _plan(run: Logged) -> Any:
    return plan_capacity(
        PlanRequest(
            _facts(run),
            H100_TORCH_GIB,
            run.tp,
            max_model_len=run.max_model_len,
            gpu_memory_utilization=run.utilization,
            gpu_product=H100.product,
            vllm_version="0.19.0",
        )
    )


def test_end_to_end_kv_tokens_and_weights_against_the_logged_startups() -> None:
    """From the files alone (GPU memory, utilization and the overhead model included): median
    |KV tokens error| ≤ 3 % on the logged startups of models outside the catalog, weights within
    2 % where the checkpoint's size is known (source: SWEEP)."""
    kv_errors: list[float] = []
    weight_errors: list[float] = []
    for run in LOGGED:
        plan = _plan(run)
        assert plan.fits, run.model
        if not run.in_catalog:
            kv_errors.append(abs(plan.kv_cache_tokens - run.tokens) / run.tokens)
        if run.model in CHECKPOINT_GIB:
            weight_errors.append(abs(plan.weights_gib_per_gpu - run.weights_gib) / run.weights_gib)
    assert len(kv_errors) >= 15
    assert statistics.median(kv_errors) <= 0.03
    assert statistics.median(weight_errors) <= 0.02
    # Llama-4-Scout's vision tower and expert layout cost vLLM more than checkpoint / TP (-4.8 %).
    assert max(weight_errors) <= 0.05


def test_gemma3_sparse_text_config_takes_transformers_defaults() -> None:
    """gemma-3-12b-it's text_config omits head_dim: 256, not 3840 / 16 = 240 (Kaito's error);
    every 6th layer is global: 8 full + 40 sliding in 6 groups of 8 (planner-from-files.md §2.4)."""
    facts = facts_from_config(CONFIGS["google/gemma-3-12b-it"], name="gemma-3-12b-it")
    assert facts.head_dim == 256
    assert facts.kv_heads == 8
    kinds = [layer.kind for layer in facts.attention_layers]
    assert kinds.count(FULL) == 8
    assert kinds.count(SLIDING) == 40
    assert facts.sliding_window == 1024
    layout = build_layout(
        facts.attention_layers, tensor_parallel_size=1, element_bytes=2, block_size=16
    )
    assert (layout.group_size, len(layout.groups)) == (8, 6)
    four_b = facts_from_config(CONFIGS["google/gemma-3-4b-it"], name="gemma-3-4b-it")
    assert (four_b.attention_heads, four_b.kv_heads, four_b.vocab_size) == (8, 4, 262208)


def test_llama4_chunked_layers_and_mla_replication() -> None:
    scout = facts_from_config(CONFIGS["meta-llama/Llama-4-Scout-17B-16E-Instruct"], name="scout")
    kinds = [layer.kind for layer in scout.attention_layers]
    assert (kinds.count(FULL), kinds.count(CHUNKED)) == (12, 36)
    assert scout.moe
    lite = facts_from_config(CONFIGS["deepseek-ai/DeepSeek-V2-Lite-Chat"], name="lite")
    assert {layer.kind for layer in lite.attention_layers} == {MLA}
    one, two = (
        build_layout(lite.attention_layers, tensor_parallel_size=tp, element_bytes=2, block_size=16)
        for tp in (1, 2)
    )
    # 27 layers x (512 + 64) x 2 bytes, on every rank: MLA is not divided by TP.
    assert one.bytes_per_token == two.bytes_per_token == 31_104


def test_awq_checkpoint_weights_are_its_bytes_and_no_quantization_is_suggested_again() -> None:
    """Qwen2.5-72B-Instruct-AWQ: the weights are the index's total_size split over TP (a derived
    expectation: no vLLM log of this model in the sweep); the plan never suggests fp8 or awq for
    weights that are already int4."""
    total_size = 41_612_877_824  # an index metadata.total_size of the order of the AWQ 72B's
    index = f'{{"metadata": {{"total_size": {total_size}}}, "weight_map": {{}}}}'
    facts = facts_from_files(
        ModelFiles(config_text=_json(CONFIGS[AWQ_72B]), index_text=index),
        name=AWQ_72B,
        source="files",
    )
    assert facts.default_quantization == "awq"
    assert facts.checkpoint_bytes == total_size
    plan = plan_capacity(
        PlanRequest(facts, H100.memory_gib, 2, max_model_len=8192, gpu_product=H100.product)
    )
    assert plan.weights_gib_per_gpu == pytest.approx(total_size / GIB / 2)
    assert plan.fits
    short = plan_capacity(
        PlanRequest(facts, H100.memory_gib, 1, max_model_len=32768, gpu_product=H100.product)
    )
    assert not any("quantization" in suggestion for suggestion in short.suggestions)


def _json(value: Any) -> str:
    import json

    return json.dumps(value)


def test_tensor_parallel_must_divide_the_padded_vocabulary() -> None:
    """Qwen3-14B at TP 5 failed in the sweep on the vocabulary (accuracy_report.md @ d3121e05):
    40 heads divide by 5, 151,936 does not."""
    config = {
        "model_type": "qwen3",
        "hidden_size": 5120,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "num_hidden_layers": 40,
        "max_position_embeddings": 40960,
        "vocab_size": 151936,
        "intermediate_size": 17408,
    }
    facts = facts_from_config(config, name="Qwen/Qwen3-14B")
    plan = plan_capacity(PlanRequest(facts, H100.memory_gib, 5, gpu_product=H100.product))
    assert plan.reason == REASON_INVALID_TP
    assert "vocabulary" in plan.message


@pytest.mark.parametrize(
    ("change", "names"),
    [
        ({"layer_types": ["linear_attention"] * 4}, ["layer_types", "'linear_attention'"]),
        ({"model_type": "rwkv"}, ["model_type", "'rwkv'"]),
        ({"mamba_d_state": 16}, ["mamba_d_state"]),
        ({"layer_types": ["full_attention"] * 3}, ["layer_types", "3 entries"]),
        ({"num_key_value_heads": 3}, ["num_key_value_heads", "3"]),
        ({"num_hidden_layers": None}, ["num_hidden_layers"]),
    ],
    ids=[
        "unknown-layer-type",
        "unknown-model-type",
        "mamba",
        "layer-count",
        "kv-heads",
        "no-layers",
    ],
)
def test_what_cannot_be_sized_is_refused_naming_the_file_and_field(
    change: dict[str, Any], names: list[str]
) -> None:
    config = {
        "model_type": "llama",
        "hidden_size": 512,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "num_hidden_layers": 4,
        "max_position_embeddings": 4096,
        "vocab_size": 32000,
    } | change
    with pytest.raises(ModelConfigError) as error:
        facts_from_config(config, name="x/y")
    message = str(error.value)
    assert message.startswith("config.json: ")
    for name in names:
        assert name in message
    assert "spec.model.architecture" in message or "fix the config" in message


def test_no_config_json_says_so() -> None:
    with pytest.raises(ModelConfigError, match=r"config\.json: no such file in x/y at abc"):
        facts_from_files(ModelFiles(config_text=None, revision="abc"), name="x/y", source="hub")


def test_index_total_size_is_read_from_a_prefix() -> None:
    assert total_size_from_index('{\n  "metadata": {\n    "total_size": 16060522496\n  },') == (
        16_060_522_496
    )
    assert total_size_from_index('{"weight_map": {') is None


def test_the_sliding_reserve_follows_the_vllm_version() -> None:
    """gemma-3-12b at maxModelLen 32768: a sliding layer keeps window - 1 + 8192 tokens per
    request in 0.19 (577 blocks) and window - 1 + 2 x 8192 from 0.32 on (1089 blocks); derived
    from planner-from-files.md §2.3, not from a log."""
    facts = facts_from_config(CONFIGS["google/gemma-3-12b-it"], name="g")
    layout = build_layout(
        facts.attention_layers, tensor_parallel_size=1, element_bytes=2, block_size=16
    )
    old = layout.blocks_per_request(32768, VLLM_0_19.sliding_reserve_tokens(8192, 1))
    new = layout.blocks_per_request(32768, VLLM_CURRENT.sliding_reserve_tokens(8192, 1))
    assert old == 2048 + 5 * 577
    assert new == 2048 + 5 * 1089
    assert profile_for("0.19.0") is VLLM_0_19
    assert profile_for(None) is VLLM_CURRENT
    assert image_vllm_version("vllm/vllm-openai:v0.19.0") == "0.19.0"
    assert image_vllm_version("ghcr.io/llmop/engine:0.1.0") is None


def test_plan_reports_batch_budget_groups_and_a_decode_ceiling() -> None:
    run = next(r for r in LOGGED if r.model == "google/gemma-3-12b-it")
    plan = _plan(run)
    assert plan.reason == REASON_FITS
    assert (plan.max_num_seqs, plan.max_num_batched_tokens, plan.kv_groups) == (1024, 8192, 6)
    # min(max_num_seqs 1024, whole sequences of maxModelLen the KV cache holds (~16)).
    assert plan.decode_batch == int(plan.max_concurrency) == 16
    # Derived: each step reads ~21.9 GiB of weights and 16 x ~1.5 GiB of KV at 3.35 TB/s.
    ceiling = plan.decode_ceiling_tokens_per_s
    assert ceiling is not None
    step_gib = plan.weights_gib_per_gpu + 16 * (1 * 512 + 5 * 513) * 16 * 8192 * 8 / GIB
    assert ceiling == pytest.approx(16 * 3350e9 / (step_gib * GIB), rel=1e-6)
    cost = cost_per_million_tokens(plan.decode_ceiling_tokens_per_s, 2.0, 1)
    assert cost == pytest.approx(2.0 / (plan.decode_ceiling_tokens_per_s * 3600) * 1e6)


def test_cpu_plan_of_the_tiny_model_matches_vllm_cpu_log() -> None:
    """The tiny test model (tests/support/tiny_model.py, float32) on vLLM's CPU build with
    VLLM_CPU_KVCACHE_SPACE=1 logs "CPU KV cache size: 524,288 tokens" with --dtype float32
    (../shared/reference/vllm-cpu.md), and 1,048,576 with --dtype auto: vLLM 0.32 computes a
    float32 checkpoint in bfloat16 there too."""
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "max_position_embeddings": 2048,
        "vocab_size": 2048,
        "torch_dtype": "float32",
    }
    facts = facts_from_config(config, name="tiny")
    request = CpuPlanRequest(facts, memory_gib=8, kv_cache_gib=1, max_model_len=512)
    plan = plan_cpu_capacity(replace(request, dtype="float32"))
    assert plan.kv_cache_tokens == 524_288
    assert plan.max_concurrency == pytest.approx(1024.0)
    plan = plan_cpu_capacity(request)
    assert (plan.kv_cache_tokens, plan.max_concurrency) == (1_048_576, 2048.0)
