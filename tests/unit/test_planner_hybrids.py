"""The planner on Mamba-1, Mamba-2 and gated-delta-net hybrids (Granite 4.0, Qwen3-Next,
Qwen3.5, Nemotron-H, Falcon-H1, Jamba), read from their config.json: each state layer's bytes
as vLLM 0.32's `MambaStateShapeCalculator` gives them, the attention block grown until a page
holds a state (`_align_hybrid_block_size`), state pages padded to it, the groups, and the pages a
request holds per state group (2 in prefix caching's `align` mode, vLLM's default for hybrids, and a
Mamba-2 prefill checkpoint's third); pure Mamba models (Mamba, Falcon-Mamba, Mamba-2), which
have no attention and hold 1 unpadded state page a layer per request; the refusal of
architectures vLLM no longer serves. The CPU cases are checked against vLLM 0.32's CPU build
serving the same configs (dummy weights): its own "CPU KV cache size" log lines."""

from __future__ import annotations

from typing import Any

import pytest

from llmop.planner import PlanRequest, plan_capacity
from llmop.planner.capacity import GIB, REASON_INVALID_PP, REASON_INVALID_TP
from llmop.planner.cpu import REASON_CPU_UNSUPPORTED, CpuPlanRequest, plan_cpu_capacity
from llmop.planner.kv_layout import (
    FULL,
    MAMBA1,
    MAMBA2,
    SHORT_CONV,
    STATE,
    StateShape,
    build_layout,
)
from llmop.planner.model_config import ModelConfigError, facts_from_config
from llmop.planner.models import ModelArchitecture
from llmop.planner.vllm_profile import ENGINE_VLLM_VERSION
from support.hybrid_configs import (
    FALCON_H1_SHAPE,
    FALCON_H1_TINY,
    FALCON_MAMBA_TINY,
    GRANITE_H_SHAPE,
    GRANITE_TINY,
    HYBRIDS_LOGGED,
    JAMBA_SHAPE,
    JAMBA_TINY,
    LFM2_MOE_TINY,
    LFM2_TINY,
    LFM2_VL_TINY,
    MAMBA2_SHAPE,
    MAMBA2_TINY,
    MAMBA_TINY,
    NEMOTRON_H_SHAPE,
    NEMOTRON_H_TINY,
    NEMOTRON_NANO_VL_TINY,
    OLMO_HYBRID_TINY,
    STATE_MODELS_LOGGED,
    ZAMBA2_TINY,
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


def test_qwen3_5_is_read_from_its_text_config_with_transformers_defaults() -> None:
    """Qwen3.5 (vLLM 0.32 qwen3_5.py) as published: `Qwen3_5ForConditionalGeneration` with the
    language model under `text_config`. Keys it omits take transformers' `Qwen3_5TextConfig`
    defaults: 32 layers, every 4th full attention (`full_attention_interval` 4; 4 KV heads of
    256), the others gated-delta-net layers of 16 key heads and 32 value heads of 128, sized
    from the same keys as Qwen3-Next's: conv (128 x 16 x 2 + 128 x 32) x 3, temporal 32 x 128
    x 128, each split across TP ranks; TP must divide the 16 attention heads. The MoE wrapper
    (`qwen3_5_moe`) takes `Qwen3_5MoeTextConfig`'s: 40 layers, 256 experts, 8 a token."""
    dense = facts_from_config(
        {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5"}
        | {"text_config": {"model_type": "qwen3_5_text"}},
        name="qwen3.5",
        checkpoint_bytes=18 * 1024**3,
    )
    kinds = [x.kind for x in dense.attention_layers]
    assert (dense.layers, kinds.count(STATE), kinds.count(FULL)) == (32, 24, 8)
    assert kinds[:4] == [STATE, STATE, STATE, FULL]
    assert (dense.kv_heads, dense.head_dim, dense.max_position_embeddings) == (4, 256, 32768)
    state = dense.attention_layers[0].state
    assert state is not None
    assert state.elements(1) == ((128 * 16 * 2 + 128 * 32) * 3, 32 * 128 * 128)
    assert state.elements(2) == ((128 * 16 * 2 + 128 * 32) // 2 * 3, 16 * 128 * 128)
    for tp in (1, 2):
        plan = plan_capacity(
            PlanRequest(dense, 79.19, tp, max_model_len=32768, gpu_memory_utilization=0.9)
        )
        assert plan.fits, plan.message
    three = plan_capacity(PlanRequest(dense, 79.19, 3, max_model_len=32768))
    assert three.reason == REASON_INVALID_TP
    moe = facts_from_config(
        {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe"}
        | {"text_config": {}},
        name="qwen3.5-moe",
        checkpoint_bytes=60 * 1024**3,
    )
    kinds = [x.kind for x in moe.attention_layers]
    assert (moe.layers, kinds.count(STATE), kinds.count(FULL)) == (40, 30, 10)
    assert moe.moe
    assert moe.active_parameters is not None
    assert moe.active_parameters < moe.parameters / 5


def test_falcon_h1_has_an_attention_and_a_state_layer_in_every_decoder_layer() -> None:
    """Falcon-H1 (vLLM 0.32 falcon_h1.py): every decoder layer is a `FalconH1ParallelHybrid`, an
    `Attention` and a `MambaMixer2` side by side, so 44 layers hold 44 attention and 44 state
    caches; the mixer's inner size is `mamba_d_ssm` and its SSM state is at the model's dtype
    (`mamba2_state_dtype`, `mamba_ssm_cache_dtype` auto). GPU, bfloat16, TP 1: a state is
    (3,072 + 2 x 256) x 3 x 2 + 24 x 128 x 256 x 2 = 1,594,368 bytes, an attention token 2 x
    256 x 2 = 1,024 a layer, so the block grows to 16 x ceil(1,594,368 / 16,384) = 1,568 tokens;
    44 and 44 layers: groups of 44, one of each; 8,192 tokens hold 6 attention blocks and 3 in
    the state group. TP 4 divides the attention heads but not 6 Mamba heads: refused."""
    facts = _facts(FALCON_H1_SHAPE)
    assert facts.layers == 44
    kinds = [x.kind for x in facts.attention_layers]
    assert (kinds.count(FULL), kinds.count(STATE)) == (44, 44)
    layout = build_layout(
        facts.attention_layers, tensor_parallel_size=1, element_bytes=2, block_size=16
    )
    assert (layout.block_size, layout.page_bytes, layout.group_size) == (1568, 1_605_632, 44)
    assert [g.kind for g in layout.groups] == [FULL, STATE]
    assert layout.blocks_per_request(8192, 0) == 6 + 3
    plan = plan_capacity(
        PlanRequest(facts, 79.19, 1, max_model_len=8192, gpu_memory_utilization=0.9)
    )
    assert plan.fits, plan.message
    assert plan.kv_groups == 2
    blocks = int(plan.kv_cache_gib_per_gpu * GIB // 1_605_632 // 44)
    assert plan.max_concurrency == pytest.approx(blocks / 9)
    refused = plan_capacity(
        PlanRequest(
            _facts(FALCON_H1_SHAPE | {"mamba_n_heads": 6, "mamba_d_head": 512}),
            79.19,
            4,
            max_model_len=8192,
        )
    )
    assert refused.reason == REASON_INVALID_TP
    assert "mamba heads 6" in refused.message


def test_falcon_h1_takes_transformers_defaults_for_the_mixer() -> None:
    """transformers' FalconH1Config: `mamba_d_ssm` 1,024 when a config omits it, `mamba_expand`
    x hidden_size only when it is null; `mamba_d_head` "auto" is the inner size over the
    heads."""
    omitted = {k: v for k, v in FALCON_H1_TINY.items() if k not in ("mamba_d_ssm", "mamba_d_head")}
    state = _facts(omitted).state_layers[0]
    assert (state.intermediate, state.heads, state.head_dim) == (1024, 4, 256)
    state = _facts(FALCON_H1_TINY | {"mamba_d_ssm": None, "mamba_d_head": "auto"}).state_layers[0]
    assert (state.intermediate, state.head_dim) == (256, 64)


@pytest.mark.parametrize(
    "config",
    [FALCON_H1_TINY | {"mamba_d_head": 32}, FALCON_H1_TINY | {"mamba_d_head": None}],
    ids=["heads-do-not-make-d-ssm", "no-head-size"],
)
def test_a_falcon_h1_mixer_transformers_would_not_load_is_refused_naming_the_field(
    config: dict[str, Any],
) -> None:
    with pytest.raises(ModelConfigError, match="mamba_d_head"):
        _facts(config)


def test_jamba_has_mamba_1_layers_and_an_attention_layer_every_period() -> None:
    """Jamba (vLLM 0.32 jamba.py): attention where `i % attn_layer_period ==
    attn_layer_offset` (transformers' `layers_block_type`), Mamba-1 elsewhere
    (`mamba1_state_shape`: conv mamba_expand x hidden / TP x (kernel - 1), SSM mamba_expand x
    hidden / TP x d_state), the attention head hidden / heads whatever `head_dim` says, no
    prefill checkpoint (2 pages a state group). GPU, bfloat16, TP 1: a state is 8,192 x 3 x 2
    + 8,192 x 16 x 2 = 311,296 bytes, an attention token 8 x 256 x 2 = 4,096, so the block
    grows to 16 x ceil(311,296 / 65,536) = 80 tokens; 4 attention and 28 Mamba layers: groups
    of 4, 1 + 7; 8,192 tokens hold 103 attention blocks and 2 per state group."""
    facts = _facts(JAMBA_SHAPE | {"head_dim": 64})
    kinds = [x.kind for x in facts.attention_layers]
    assert [i for i, kind in enumerate(kinds) if kind == FULL] == [4, 12, 20, 28]
    assert facts.head_dim == 128
    assert facts.state_layers[0].family == MAMBA1
    assert facts.state_layers[0].elements(2) == (4096 * 3, 4096 * 16)
    layout = build_layout(
        facts.attention_layers, tensor_parallel_size=1, element_bytes=2, block_size=16
    )
    assert (layout.block_size, layout.page_bytes, layout.group_size) == (80, 327_680, 4)
    assert layout.blocks_per_request(8192, 0) == 103 + 7 * 2
    plan = plan_capacity(
        PlanRequest(facts, 79.19, 1, max_model_len=8192, gpu_memory_utilization=0.9)
    )
    assert plan.fits, plan.message
    assert plan.kv_groups == 8
    with pytest.raises(ModelConfigError, match="attn_layer_offset"):
        _facts(JAMBA_TINY | {"attn_layer_offset": 4})
    # Experts only every `expert_layer_period` layers (transformers' `layers_num_experts`): a
    # token reads more of Jamba than of a model whose every layer holds experts.
    every = _facts(JAMBA_SHAPE | {"expert_layer_period": 1, "expert_layer_offset": 0})
    assert facts.active_parameters is not None
    assert every.active_parameters is not None
    assert facts.active_parameters / facts.parameters > every.active_parameters / every.parameters


def test_zamba2_has_a_mamba_2_mixer_in_every_layer_and_attention_in_its_hybrid_layers() -> None:
    """Zamba2 (vLLM 0.32 zamba2.py): every layer a Mamba-2 mixer (inner mamba_expand x
    hidden_size, `n_mamba_heads` heads of transformers' `mamba_headdim`); each "hybrid" layer
    also the shared attention block with its own cache, a KV head per attention head (vLLM's
    `Attention` there takes no `num_kv_heads`) of transformers' `attention_head_dim`, 2 x
    hidden_size / heads, whatever the config says. Without `layers_block_type`, transformers'
    54-layer list (9 hybrid layers). vLLM's `Zamba2ForCausalLM` has no `SupportsPP`."""
    facts = _facts(ZAMBA2_TINY | {"num_key_value_heads": 1, "attention_head_dim": 7})
    kinds = [x.kind for x in facts.attention_layers]
    assert (facts.layers, kinds.count(STATE), kinds.count(FULL)) == (6, 6, 2)
    attention = next(x for x in facts.attention_layers if x.kind == FULL)
    assert (attention.kv_heads, attention.head_size) == (4, 64)
    state = facts.attention_layers[0].state
    assert state is not None
    assert (state.family, state.heads, state.head_dim, state.intermediate) == (MAMBA2, 4, 64, 256)
    assert state.elements(1) == ((256 + 2 * 32) * 3, 4 * 64 * 32)
    assert facts.pipeline_parallel == "Zamba2ForCausalLM"
    staged = plan_capacity(
        PlanRequest(facts, 79.19, 1, pipeline_parallel_size=2, max_model_len=2048)
    )
    assert staged.reason == REASON_INVALID_PP
    default = _facts({"architectures": ["Zamba2ForCausalLM"], "model_type": "zamba2"})
    kinds = [x.kind for x in default.attention_layers]
    assert (default.layers, kinds.count(STATE), kinds.count(FULL)) == (54, 54, 9)
    assert (default.kv_heads, default.head_dim) == (32, 160)
    with pytest.raises(ModelConfigError, match="n_mamba_heads: 3 heads do not divide"):
        _facts(ZAMBA2_TINY | {"n_mamba_heads": 3})
    with pytest.raises(ModelConfigError, match="layers_block_type: layer kind 'moe'"):
        _facts(ZAMBA2_TINY | {"layers_block_type": ["mamba", "moe"]})


def test_olmo_hybrid_takes_its_derived_sizes_and_is_refused_on_the_cpu_engine() -> None:
    """OLMo Hybrid (vLLM 0.32 olmo_hybrid.py): gated-delta-net layers sized from the same keys
    as Qwen3-Next's, which transformers' OlmoHybridConfig derives when a config omits them
    (key and value heads: the attention heads; key head 0.75 x hidden / key heads; value head
    twice that); every 4th layer full attention, at least the last; attention heads of
    hidden / heads. vLLM's CPU build fails to load it (its GDN layer sets a Triton allocator:
    "module 'triton' has no attribute 'set_allocator'"), so the CPU plan refuses it; a GPU
    plan sizes it."""
    facts = _facts(OLMO_HYBRID_TINY | {"head_dim": 99})
    kinds = [x.kind for x in facts.attention_layers]
    assert kinds == [STATE, STATE, STATE, FULL, STATE, STATE]
    assert (facts.kv_heads, facts.head_dim) == (2, 32)
    state = facts.attention_layers[0].state
    assert state is not None
    assert state.elements(1) == ((24 * 4 * 2 + 48 * 4) * 3, 4 * 24 * 48)
    short = _facts(OLMO_HYBRID_TINY | {"num_hidden_layers": 3})
    assert [x.kind for x in short.attention_layers] == [STATE, STATE, FULL]
    cpu = plan_cpu_capacity(CpuPlanRequest(facts, memory_gib=8, kv_cache_gib=1))
    assert not cpu.fits
    assert cpu.reason == REASON_CPU_UNSUPPORTED
    assert "Triton" in cpu.message
    assert "spec.resources.gpus" in cpu.message
    gpu = plan_capacity(PlanRequest(facts, 79.19, 1, max_model_len=2048))
    assert gpu.fits, gpu.message


def test_lfm2_has_short_convolutions_beside_its_attention_layers() -> None:
    """LFM2 (vLLM 0.32 lfm2.py, lfm2_moe.py): attention where `layer_types` says
    "full_attention" (Lfm2Config derives it from `full_attn_idxs`), a ShortConv elsewhere: one
    conv state of `conv_dim` channels (LFM2-MoE: hidden_size) x (conv_L_cache - 1), split
    across TP ranks, no temporal state and no prefill checkpoint (2 pages a request in
    `align` mode, like Mamba-1). Refused: LFM2-MoE without `layer_types` (Lfm2MoeConfig derives
    none and vLLM indexes it), a model with no attention layer (vLLM's hybrid path then keeps 2
    unpadded pages a request, which the planner does not size), a list that is not one."""
    facts = _facts(LFM2_TINY)
    kinds = [x.kind for x in facts.attention_layers]
    assert kinds == [STATE, STATE, FULL, STATE, STATE, FULL]
    assert (facts.kv_heads, facts.head_dim) == (2, 32)
    state = facts.attention_layers[0].state
    assert state is not None
    assert state.family == SHORT_CONV
    assert state.elements(1) == (128 * 2, 0)
    assert state.elements(2) == (64 * 2, 0)
    assert state.checkpoint_blocks == 0
    moe = _facts(LFM2_MOE_TINY)
    assert [x.kind for x in moe.attention_layers] == [STATE, FULL, STATE, STATE]
    assert moe.moe
    moe_state = moe.attention_layers[0].state
    assert moe_state is not None
    assert moe_state.elements(1) == (128 * 2, 0)
    no_list = {k: v for k, v in LFM2_MOE_TINY.items() if k != "layer_types"}
    with pytest.raises(ModelConfigError, match="layer_types: missing"):
        _facts(no_list)
    with pytest.raises(ModelConfigError, match="no full_attention layer"):
        _facts(LFM2_TINY | {"full_attn_idxs": []})
    with pytest.raises(ModelConfigError, match="full_attn_idxs: not a list of layer indices"):
        _facts(LFM2_TINY | {"full_attn_idxs": ["two"]})
    with pytest.raises(ModelConfigError, match="layer type 'mamba'"):
        _facts(LFM2_MOE_TINY | {"layer_types": ["conv", "full_attention", "mamba", "conv"]})


def test_multimodal_wrappers_of_lfm2_and_nemotron_h_are_sized_from_their_language_model() -> None:
    """LFM2-VL (vLLM 0.32 lfm2_vl.py) keeps LFM2 under `text_config`, which `Lfm2VlConfig`
    makes an LFM2 config when it names no `model_type`; Nemotron Nano VL (nano_nemotron_vl.py,
    `NemotronH_Nano_VL_V2`) keeps Nemotron-H under `llm_config`, which its remote-code config
    class builds as a `NemotronHConfig`. Both are their language model's layers, whether or not
    the wrapped config names its type."""
    for wrapper, key, text in (
        (LFM2_VL_TINY, "text_config", LFM2_TINY),
        (NEMOTRON_NANO_VL_TINY, "llm_config", NEMOTRON_H_TINY),
    ):
        untyped = {k: v for k, v in wrapper[key].items() if k != "model_type"}
        expected = _facts(text)
        for config in (wrapper, wrapper | {key: untyped}):
            facts = _facts(config)
            assert facts.attention_layers == expected.attention_layers
            assert (facts.kv_heads, facts.head_dim) == (expected.kv_heads, expected.head_dim)


def test_nemotron_nano_vl_plans_as_nemotron_h_on_cpu_though_no_vllm_log_checks_it() -> None:
    """Nemotron Nano VL: vLLM 0.32 takes the state shape and dtype from
    `NemotronHForCausalLM` on the `llm_config` (`get_mamba_state_shape_from_config`,
    `NemotronHNanoVLV2Config` sets the same float32 SSM cache), so the CPU plan is the tiny
    Nemotron-H's (262,144 tokens, 512.00x). Not in the vLLM CPU check: the published config
    class is remote code (`--trust-remote-code`), and vLLM refuses the model_type without it
    ("Transformers does not recognize this architecture"); with a stand-in for that class its
    CPU build logged the same "Setting attention block size to 256 tokens", "Padding mamba page
    size by 91.04%" and 262,144 tokens, 512.00x."""
    plan = plan_cpu_capacity(
        CpuPlanRequest(
            _facts(NEMOTRON_NANO_VL_TINY), memory_gib=8, kv_cache_gib=1, max_model_len=512
        )
    )
    assert plan.kv_cache_tokens == 262_144
    assert round(plan.max_concurrency, 2) == 512.00


def test_a_hybrid_vllm_serves_but_the_planner_does_not_size_is_still_refused() -> None:
    """Kimi Linear (vLLM 0.32 registry.py serves `KimiLinearForCausalLM`: KDA linear attention
    beside MLA layers, listed in `linear_attn_config`): refused naming the field."""
    config = {
        "architectures": ["KimiLinearForCausalLM"],
        "model_type": "kimi_linear",
        "linear_attn_config": {"kda_layers": [1, 2, 3], "full_attn_layers": [4]},
        "num_hidden_layers": 4,
    }
    with pytest.raises(
        ModelConfigError,
        match=r"linear_attn_config: model_type 'kimi_linear' has Mamba or linear-attention "
        r"layers, which the planner does not size; set spec.model.architecture",
    ):
        _facts(config)


@pytest.mark.parametrize(
    ("config", "version"),
    [
        (
            {
                "architectures": ["BambaForCausalLM"],
                "model_type": "bamba",
                "mamba_d_state": 128,
                "num_hidden_layers": 2,
            },
            "0.23.0",
        ),
        (
            {"architectures": ["Plamo2ForCausalLM"], "model_type": "plamo2", "mamba_d_state": 64},
            "0.26.0",
        ),
        ({"architectures": ["MPTForCausalLM"], "model_type": "mpt", "n_layers": 2}, "0.28.0"),
    ],
    ids=["bamba", "plamo2", "mpt"],
)
def test_an_architecture_vllm_no_longer_serves_is_refused_saying_so(
    config: dict[str, Any], version: str
) -> None:
    """vLLM 0.32 registry.py `_PREVIOUSLY_SUPPORTED_MODELS`: vLLM refuses these at start ("was
    supported in vLLM until v0.23.0"); the planner says so, with the last release that served
    it, whatever else the config holds."""
    arch = config["architectures"][0]
    with pytest.raises(ModelConfigError) as refused:
        _facts(config)
    message = str(refused.value)
    assert message.startswith(
        f"config.json: architectures: {arch} was served by vLLM up to {version}, not by the "
        f"engine's vLLM {ENGINE_VLLM_VERSION}"
    )
    assert f"run it on an engine image with vLLM {version} or earlier (spec.engine.image)" in (
        message
    )
    assert "spec.model.architecture" in message


def test_pure_mamba_models_have_only_state_layers() -> None:
    """Mamba, Falcon-Mamba and Mamba-2 (vLLM 0.32 mamba.py, mamba2.py: `IsAttentionFree`):
    every layer a state layer, no attention heads, the context vLLM assumes without a length
    key (2,048), the parameters from the checkpoint. Mamba-1's inner size is expand x hidden
    whatever `intermediate_size` says (transformers' MambaConfig sets it so); Mamba-2's is the
    config's `intermediate_size`, else expand x hidden (`Mamba2DecoderLayer`)."""
    for config, family in (
        (MAMBA_TINY, MAMBA1),
        (FALCON_MAMBA_TINY, MAMBA1),
        (MAMBA2_TINY, MAMBA2),
    ):
        facts = facts_from_config(config, name="ssm", checkpoint_bytes=8 * 1024**2)
        assert {x.kind for x in facts.attention_layers} == {STATE}
        assert len(facts.attention_layers) == config["num_hidden_layers"]
        assert (facts.kv_heads, facts.head_dim, facts.attention_heads) == (0, 0, None)
        assert facts.max_position_embeddings == 2048
        assert facts.parameters == 8 * 1024**2 // 4
        assert facts.state_layers[0].family == family
    state = _facts(MAMBA_TINY | {"intermediate_size": 999}).state_layers[0]
    assert state.elements(1) == (256 * 3, 256 * 16)
    assert _facts(MAMBA_TINY | {"max_position_embeddings": 4096}).max_position_embeddings == 4096
    assert _facts(FALCON_MAMBA_TINY).state_layers[0].elements(2) == (128 * 3, 128 * 32)
    assert _facts(MAMBA2_TINY).state_layers[0].elements(1) == ((256 + 2 * 64) * 3, 8 * 32 * 64)
    with pytest.raises(ModelConfigError, match="head_dim: 8 heads of 16"):
        _facts(MAMBA2_TINY | {"head_dim": 16})
    with pytest.raises(ModelConfigError, match=r"safetensors\.index\.json: missing"):
        facts_from_config(MAMBA_TINY, name="ssm")
    # No heads is for models without attention only.
    with pytest.raises(ValueError, match="kv_heads must be positive"):
        ModelArchitecture(parameters=1, layers=2, kv_heads=0, head_dim=0, max_position_embeddings=8)


def test_a_mamba_2_model_on_a_gpu_holds_one_state_page_a_request() -> None:
    """A Mamba-2 of Mamba-Codestral 7B's kind on one H100, bfloat16: no attention, so no block
    to grow and no padding (`update_block_size_for_backend` aligns hybrids only); prefix caching
    off (vLLM's default for attention-free models), so `mamba_cache_mode` none: a request holds
    1 page (`MambaSpec.max_memory_usage_bytes`). A state is (8,192 + 2 x 8 x 128) x 3 x 2 +
    128 x 64 x 128 x 2 = 2,158,592 bytes, one group of 64 layers: num_blocks = KV bytes //
    (64 x 2,158,592), max concurrency = num_blocks, tokens = num_blocks x max_model_len. TP 2
    halves the state (8 groups split, 64 heads a rank); TP 3 divides neither: refused."""
    facts = _facts(MAMBA2_SHAPE)
    assert facts.max_position_embeddings == 2048
    layout = build_layout(
        facts.attention_layers, tensor_parallel_size=1, element_bytes=2, block_size=16
    )
    assert (layout.page_bytes, layout.group_size, len(layout.groups)) == (2_158_592, 64, 1)
    assert layout.bytes_per_token == 0
    assert layout.blocks_per_request(2048, 0) == 1
    plan = plan_capacity(PlanRequest(facts, 79.19, 1, gpu_memory_utilization=0.9))
    assert plan.fits, plan.message
    blocks = int(plan.kv_cache_gib_per_gpu * GIB // 2_158_592 // 64)
    assert (plan.kv_blocks, plan.kv_groups) == (blocks, 1)
    assert plan.max_concurrency == blocks
    assert plan.kv_cache_tokens == blocks * 2048
    half = build_layout(
        facts.attention_layers, tensor_parallel_size=2, element_bytes=2, block_size=16
    )
    assert half.page_bytes == 2_158_592 // 2
    refused = plan_capacity(PlanRequest(facts, 79.19, 3))
    assert refused.reason == REASON_INVALID_TP
    # vLLM's Mamba2ForCausalLM has no `SupportsPP`: pipeline stages are refused, naming it
    # (MambaForCausalLM has it, and a Mamba-1 model may take them).
    staged = plan_capacity(PlanRequest(facts, 79.19, 1, pipeline_parallel_size=2))
    assert staged.reason == REASON_INVALID_PP
    assert not staged.fits
    assert "Mamba2ForCausalLM" in staged.message
    assert "pipelineParallelSize 1" in staged.message
    assert _facts(MAMBA_TINY).pipeline_parallel is None


@pytest.mark.parametrize("name", list(HYBRIDS_LOGGED))
def test_cpu_plan_of_tiny_hybrids_matches_the_vllm_cpu_log(name: str) -> None:
    """vLLM 0.32's CPU build (x86 with AVX512-BF16), VLLM_CPU_KVCACHE_SPACE=1, --max-model-len
    512, --dtype auto (bfloat16), the config with dummy weights, logged "CPU KV cache size: N
    tokens, Maximum concurrency for 512 tokens per request: Cx". Granite: "Reset SSM cache type
    to float32", so a state is 1,536 x 2 + 32,768 x 4 = 134,144 bytes; "Setting attention
    block size to 384 tokens" (128 x ceil(134,144 / 65,536)), "Padding mamba page size by
    46.56%" (196,608 / 134,144); 5,461 blocks / (2 + 3 x 3) a request. Qwen3-Next: state 768 x
    2 + 4,096 x 4 = 17,920 bytes, padded by 265.71 % to 65,536 (block 128 holds it); 16,384
    blocks / (4 + 3 x 2). Qwen3.5 ("Reset SSM cache type to float32 for accelerated GDN mamba
    backend 'qwen3_5_text'"): state 1,152 x 2 + 8,192 x 4 = 35,072 bytes; "Setting attention
    block size to 256 tokens", "Padding mamba page size by 86.86%" (65,536 / 35,072); 2
    attention and 4 state layers in groups of 2: 8,192 blocks / (2 + 2 x 2); the same under
    the multimodal wrapper (`Qwen3_5ForConditionalGeneration`, images and videos off). Qwen3.5
    MoE: state 576 x 2 + 2,048 x 4 = 9,344 bytes, padded to the 32,768 of a 128-token block; 2
    attention and 6 state layers in groups of 2: 16,384 blocks / (4 + 3 x 2). Nemotron-H:
    "Updating mamba_ssm_cache_dtype to 'float32'", state 1,536 x 2 + 16,384 x 4 = 68,608
    bytes; "Setting attention block size to 256 tokens", "Padding mamba page size by 91.04%"
    (131,072 / 68,608); its 2 MLP layers hold nothing.
    Falcon-H1: "Reset SSM cache type to float32", state 1,152 x 2 + 16,384 x 4 = 67,840 bytes;
    "Setting attention block size to 256 tokens", "Padding mamba page size by 93.21%" (131,072
    / 67,840); 4 attention and 4 state layers in 2 groups: 2,048 blocks / (2 + 3). Jamba: state
    (Mamba-1) 768 x 2 + 16,384 x 4 = 67,072 bytes; "Setting attention block size to 384
    tokens", "Padding mamba page size by 46.56%" (98,304 / 67,072); 1 attention and 3 Mamba
    layers in groups of 1: 10,922 blocks / (2 + 3 x 2). Zamba2: state (Mamba-2) 960 x 2 +
    8,192 x 4 = 34,688 bytes, "Padding mamba page size by 277.86%" (131,072 / 34,688: 4 KV
    heads of 64 fill a 128-token block); 2 attention and 6 state layers in groups of 2: 4,096
    blocks / (4 + 3 x 3). LFM2: a conv state of 128 x 2 x 2 = 512 bytes (bfloat16, the model's
    dtype; no SSM state), "Padding mamba page size by 6300.00%" (32,768 / 512); 2 attention and
    4 conv layers in groups of 2: 16,384 blocks / (4 + 2 x 2). LFM2-MoE: the same state, 1
    attention and 3 conv layers in groups of 1: 32,768 blocks / (4 + 3 x 2). LFM2-VL
    (`Lfm2VlForConditionalGeneration`, images off: "running in text-only mode"): the LFM2's
    figures and its "Padding mamba page size by 6300.00%"."""
    config, tokens, concurrency = HYBRIDS_LOGGED[name]
    plan = plan_cpu_capacity(
        CpuPlanRequest(_facts(config), memory_gib=8, kv_cache_gib=1, max_model_len=512)
    )
    assert plan.kv_cache_tokens == tokens
    assert round(plan.max_concurrency, 2) == concurrency


@pytest.mark.parametrize("name", list(STATE_MODELS_LOGGED))
def test_cpu_plan_of_tiny_mamba_models_matches_the_vllm_cpu_log(name: str) -> None:
    """vLLM 0.32's CPU build as above serving the pure Mamba models ("Resolved architecture:
    MambaForCausalLM" / FalconMambaForCausalLM / Mamba2ForCausalLM): no attention, so no
    "Setting attention block size" and no "Padding mamba page size" line; its engine config
    says enable_prefix_caching=False (attention-free), so one group of every layer and 1 page
    a request: max concurrency = 1 GiB // (layers x state), tokens = that x 512. "Reset SSM
    cache type to float32 for accelerated GDN mamba backend 'mamba'" ('falcon_mamba',
    'mamba2'). Mamba: state 768 x 2 + 4,096 x 4 = 17,920 bytes, 4 layers: 14,979 pages.
    Falcon-Mamba: 768 x 2 + 8,192 x 4 = 34,304 bytes, 3 layers: 10,433. Mamba-2: 1,152 x 2 +
    16,384 x 4 = 67,840 bytes (no prefill checkpoint outside `align` mode), 4 layers: 3,956."""
    config, tokens, concurrency = STATE_MODELS_LOGGED[name]
    plan = plan_cpu_capacity(
        CpuPlanRequest(_facts(config), memory_gib=8, kv_cache_gib=1, max_model_len=512)
    )
    assert plan.kv_cache_tokens == tokens
    assert round(plan.max_concurrency, 2) == concurrency
