"""Configs of Mamba and gated-delta-net hybrids and of pure Mamba models for the planner's
tests: small ones that vLLM's CPU build serves with dummy weights (tests/unit/
test_planner_hybrids.py checks the plan against its log lines), and some at a GPU's size
(Granite 4.0-H's kind, ...). Made for the tests, in the published configs' key spellings; not
copies of published files."""

from __future__ import annotations

from typing import Any

GRANITE_TINY: dict[str, Any] = {
    "architectures": ["GraniteMoeHybridForCausalLM"],
    "model_type": "granitemoehybrid",
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "layer_types": ["linear_attention", "full_attention", "linear_attention", "linear_attention"],
    "mamba_n_heads": 8,
    "mamba_d_head": 32,
    "mamba_d_state": 128,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_n_groups": 1,
    "mamba_chunk_size": 64,
    "intermediate_size": 256,
    "shared_intermediate_size": 256,
    "num_local_experts": 2,
    "num_experts_per_tok": 1,
    "vocab_size": 2048,
    "max_position_embeddings": 2048,
    "position_embedding_type": "rope",
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
}
"""A tiny Granite 4.0 hybrid: 3 Mamba-2 layers of 34,304 state elements (conv (256 + 2 x 128)
x 3, SSM 8 x 32 x 128), one attention layer of 4 x (32 + 32) elements a token."""

QWEN3_NEXT_TINY: dict[str, Any] = {
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "full_attention_interval": 4,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 32,
    "linear_value_head_dim": 32,
    "linear_conv_kernel_dim": 4,
    "num_experts": 2,
    "num_experts_per_tok": 1,
    "moe_intermediate_size": 128,
    "shared_expert_intermediate_size": 128,
    "intermediate_size": 256,
    "decoder_sparse_step": 1,
    "vocab_size": 2048,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}
"""A tiny Qwen3-Next: 3 gated-delta-net layers (conv (32 x 2 x 2 + 32 x 4) x 3, temporal
4 x 32 x 32) and every 4th layer full attention (2 KV heads of 64)."""

QWEN3_5_TINY: dict[str, Any] = {
    "architectures": ["Qwen3_5ForCausalLM"],
    "model_type": "qwen3_5_text",
    "hidden_size": 128,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "layer_types": [
        "linear_attention",
        "full_attention",
        "linear_attention",
        "linear_attention",
        "linear_attention",
        "full_attention",
    ],
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 32,
    "linear_value_head_dim": 64,
    "linear_conv_kernel_dim": 4,
    "intermediate_size": 256,
    "vocab_size": 2048,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}
"""A tiny Qwen3.5 (text only): 4 gated-delta-net layers (conv (32 x 2 x 2 + 64 x 4) x 3,
temporal 4 x 32 x 64) and 2 attention layers (1 KV head of 64), from its `layer_types`."""

QWEN3_5_MOE_TINY: dict[str, Any] = {
    "architectures": ["Qwen3_5MoeForCausalLM"],
    "model_type": "qwen3_5_moe_text",
    "hidden_size": 128,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "full_attention_interval": 4,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 2,
    "linear_key_head_dim": 32,
    "linear_value_head_dim": 32,
    "linear_conv_kernel_dim": 4,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64,
    "vocab_size": 2048,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}
"""A tiny Qwen3.5 MoE (text only) with no `layer_types`: transformers makes every 4th of its 8
layers full attention (2 KV heads of 32) from `full_attention_interval`, the other 6
gated-delta-net layers (conv (32 x 2 x 2 + 32 x 2) x 3, temporal 2 x 32 x 32)."""

QWEN3_5_VL_TINY: dict[str, Any] = {
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "model_type": "qwen3_5",
    "text_config": {
        key: value
        for key, value in QWEN3_5_TINY.items()
        if key not in ("architectures", "torch_dtype")
    },
    "vision_config": {
        "model_type": "qwen3_5_vision",
        "depth": 1,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_heads": 2,
        "out_hidden_size": 128,
        "num_position_embeddings": 64,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "deepstack_visual_indexes": [],
    },
    "image_token_id": 2040,
    "video_token_id": 2041,
    "vision_start_token_id": 2042,
    "vision_end_token_id": 2043,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}
"""The tiny Qwen3.5 under the multimodal wrapper the published Qwen3.5 checkpoints use: the
language model under `text_config`, a one-block vision tower vLLM loads beside it (served with
images and videos off: `--limit-mm-per-prompt`, the tiny tokenizer has no image tokens)."""

OLMO_HYBRID_TINY: dict[str, Any] = {
    "architectures": ["OlmoHybridForCausalLM"],
    "model_type": "olmo_hybrid",
    "hidden_size": 128,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "linear_conv_kernel_dim": 4,
    "intermediate_size": 256,
    "vocab_size": 2048,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}
"""A tiny OLMo Hybrid that leaves its layer kinds and linear-attention sizes to transformers:
layer 4 of 6 full attention (2 KV heads of hidden / heads = 32), the other 5 gated-delta-net
layers of 4 key and 4 value heads (the attention heads), key head 0.75 x 128 / 4 = 24, value
head 48: conv (24 x 4 x 2 + 48 x 4) x 3, temporal 4 x 24 x 48."""

ZAMBA2_TINY: dict[str, Any] = {
    "architectures": ["Zamba2ForCausalLM"],
    "model_type": "zamba2",
    "hidden_size": 128,
    "num_hidden_layers": 6,
    "layers_block_type": ["mamba", "hybrid", "mamba", "mamba", "hybrid", "mamba"],
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "n_mamba_heads": 4,
    "mamba_ngroups": 1,
    "mamba_d_state": 32,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "chunk_size": 64,
    "num_mem_blocks": 1,
    "use_shared_attention_adapter": False,
    "use_mem_rope": True,
    "intermediate_size": 256,
    "vocab_size": 2048,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
}
"""A tiny Zamba2: 6 Mamba-2 mixers (conv (256 + 2 x 32) x 3, SSM 4 x 64 x 32) and, in its 2
"hybrid" layers, the shared attention block's own KV cache: 4 KV heads of 2 x 128 / 4 = 64."""

LFM2_TINY: dict[str, Any] = {
    "architectures": ["Lfm2ForCausalLM"],
    "model_type": "lfm2",
    "hidden_size": 128,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "full_attn_idxs": [2, 5],
    "conv_dim": 128,
    "conv_dim_out": 128,
    "conv_L_cache": 3,
    "conv_bias": False,
    "block_dim": 128,
    "block_ff_dim": 256,
    "block_multiple_of": 256,
    "block_ffn_dim_multiplier": 1.0,
    "block_auto_adjust_ff_dim": True,
    "norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "vocab_size": 2048,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
}
"""A tiny LFM2: attention at layers 2 and 5 (`full_attn_idxs`; 2 KV heads of 128 / 4 = 32),
short convolutions elsewhere, each a conv state of 128 channels x (3 - 1) and nothing else."""

LFM2_MOE_TINY: dict[str, Any] = {
    "architectures": ["Lfm2MoeForCausalLM"],
    "model_type": "lfm2_moe",
    "hidden_size": 128,
    "intermediate_size": 256,
    "moe_intermediate_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "layer_types": ["conv", "full_attention", "conv", "conv"],
    "conv_L_cache": 3,
    "conv_bias": False,
    "num_dense_layers": 1,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "use_expert_bias": True,
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.0,
    "norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "vocab_size": 2048,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
}
"""A tiny LFM2-MoE: layer 1 attention, 3 short convolutions of hidden_size channels (LFM2-MoE
has no `conv_dim`), experts from the second layer on (`num_dense_layers` 1)."""

LFM2_VL_TINY: dict[str, Any] = {
    "architectures": ["Lfm2VlForConditionalGeneration"],
    "model_type": "lfm2_vl",
    "text_config": {
        key: value
        for key, value in LFM2_TINY.items()
        if key not in ("architectures", "torch_dtype")
    },
    "vision_config": {
        "model_type": "siglip2_vision_model",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_channels": 3,
        "patch_size": 16,
        "num_patches": 64,
    },
    "downsample_factor": 2,
    "projector_hidden_size": 128,
    "image_token_id": 2040,
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
}
"""The tiny LFM2 under LFM2-VL's multimodal wrapper: the language model under `text_config`, a
one-layer SigLIP2 tower vLLM loads beside it (served with images off: `--limit-mm-per-prompt`).
vLLM's wrapper sizes the conv state from the text config's hidden_size, not its `conv_dim`:
the two are equal here, as in the published LFM2-VL checkpoints."""

NEMOTRON_H_TINY: dict[str, Any] = {
    "architectures": ["NemotronHForCausalLM"],
    "model_type": "nemotron_h",
    "hidden_size": 128,
    "num_hidden_layers": 8,
    "hybrid_override_pattern": "M*M-M*M-",
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "mamba_num_heads": 4,
    "mamba_head_dim": 64,
    "ssm_state_size": 64,
    "n_groups": 2,
    "conv_kernel": 4,
    "expand": 2,
    "chunk_size": 64,
    "intermediate_size": 256,
    "mlp_hidden_act": "relu2",
    "vocab_size": 2048,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}
"""A tiny Nemotron-H: 4 Mamba-2 layers (conv (256 + 2 x 2 x 64) x 3, SSM 4 x 64 x 64; the SSM
state float32, vLLM's default for the family), 2 attention layers (2 KV heads of 64) and 2 MLP
layers, which hold no cache."""

NEMOTRON_NANO_VL_TINY: dict[str, Any] = {
    "architectures": ["NemotronH_Nano_VL_V2"],
    "model_type": "NemotronH_Nano_VL_V2",
    "llm_config": dict(NEMOTRON_H_TINY),
    "vision_config": {
        "args": {"model": "vit_small_patch16_224"},
        "patch_size": 16,
        "max_resolution": 2048,
        "preferred_resolution": [224, 224],
    },
    "force_image_size": 224,
    "patch_size": 16,
    "downsample_ratio": 0.5,
    "ps_version": "v2",
    "image_tag_type": "internvl",
    "vit_hidden_size": 384,
    "projector_hidden_size": 128,
    "img_context_token_id": 2040,
    "torch_dtype": "float32",
}
"""The tiny Nemotron-H under Nemotron Nano VL's wrapper (vLLM 0.32 nano_nemotron_vl.py
`NemotronH_Nano_VL_V2`): the language model under `llm_config`, beside the smallest RADIO tower
vLLM builds (`vit_small_patch16_224`). The published checkpoints' config classes are remote
code (`--trust-remote-code`), so vLLM's CPU build cannot start from this file alone."""

FALCON_H1_TINY: dict[str, Any] = {
    "architectures": ["FalconH1ForCausalLM"],
    "model_type": "falcon_h1",
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "mamba_d_ssm": 256,
    "mamba_n_heads": 4,
    "mamba_d_head": 64,
    "mamba_n_groups": 1,
    "mamba_d_state": 64,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_chunk_size": 64,
    "mamba_conv_bias": True,
    "mamba_proj_bias": False,
    "mamba_rms_norm": True,
    "mamba_norm_before_gate": False,
    "intermediate_size": 256,
    "rope_theta": 100000000000.0,
    "vocab_size": 2048,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}
"""A tiny Falcon-H1: 4 decoder layers, each an attention block (2 KV heads of 64) and a Mamba-2
mixer (conv (256 + 2 x 64) x 3, SSM 4 x 64 x 64) side by side: 4 attention and 4 state
layers."""

JAMBA_TINY: dict[str, Any] = {
    "architectures": ["JambaForCausalLM"],
    "model_type": "jamba",
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "attn_layer_period": 4,
    "attn_layer_offset": 2,
    "expert_layer_period": 2,
    "expert_layer_offset": 1,
    "num_experts": 2,
    "num_experts_per_tok": 1,
    "mamba_d_state": 64,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_dt_rank": 8,
    "intermediate_size": 256,
    "vocab_size": 2048,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}
"""A tiny Jamba: 3 Mamba-1 layers (conv 256 x 3, SSM 256 x 64) and its third layer attention
(2 KV heads of hidden / heads = 32), an MoE MLP every second layer."""

MAMBA_TINY: dict[str, Any] = {
    "architectures": ["MambaForCausalLM"],
    "model_type": "mamba",
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "state_size": 16,
    "expand": 2,
    "conv_kernel": 4,
    "intermediate_size": 256,
    "time_step_rank": 8,
    "use_bias": False,
    "use_conv_bias": True,
    "layer_norm_epsilon": 1e-05,
    "vocab_size": 2048,
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
}
"""A tiny Mamba (Mamba-1, no attention): 4 layers, each a state of conv 256 x 3 and SSM 256 x
16; no length key, so vLLM assumes 2,048 tokens."""

FALCON_MAMBA_TINY: dict[str, Any] = {
    "architectures": ["FalconMambaForCausalLM"],
    "model_type": "falcon_mamba",
    "hidden_size": 128,
    "num_hidden_layers": 3,
    "state_size": 32,
    "expand": 2,
    "conv_kernel": 4,
    "time_step_rank": 8,
    "use_bias": False,
    "use_conv_bias": True,
    "layer_norm_epsilon": 1e-05,
    "mixer_rms_eps": 1e-06,
    "vocab_size": 2048,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}
"""A tiny Falcon-Mamba (vLLM serves it as a Mamba-1 model with RMS-normed B, C and dt): 3
layers, each a state of conv 256 x 3 and SSM 256 x 32."""

MAMBA2_TINY: dict[str, Any] = {
    "architectures": ["Mamba2ForCausalLM"],
    "model_type": "mamba2",
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "num_heads": 8,
    "head_dim": 32,
    "n_groups": 1,
    "state_size": 64,
    "expand": 2,
    "conv_kernel": 4,
    "chunk_size": 64,
    "time_step_rank": 8,
    "use_bias": False,
    "use_conv_bias": True,
    "layer_norm_epsilon": 1e-05,
    "vocab_size": 2048,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}
"""A tiny Mamba-2 (no attention): 4 layers, each a state of conv (256 + 2 x 64) x 3 and SSM 8 x
32 x 64."""

GRANITE_H_SHAPE: dict[str, Any] = {
    "model_type": "granitemoehybrid",
    "hidden_size": 1536,
    "num_hidden_layers": 40,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "layer_types": ["full_attention" if i % 10 == 5 else "linear_attention" for i in range(40)],
    "mamba_n_heads": 48,
    "mamba_d_head": 64,
    "mamba_d_state": 128,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_n_groups": 1,
    "intermediate_size": 512,
    "num_local_experts": 64,
    "num_experts_per_tok": 6,
    "vocab_size": 100352,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
}
"""A hybrid of Granite 4.0-H's kind at a GPU's size: 4 attention and 36 Mamba-2 layers."""

NEMOTRON_H_SHAPE: dict[str, Any] = {
    "model_type": "nemotron_h",
    "hidden_size": 4096,
    "num_hidden_layers": 52,
    "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "mamba_num_heads": 128,
    "mamba_head_dim": 64,
    "ssm_state_size": 128,
    "n_groups": 8,
    "conv_kernel": 4,
    "intermediate_size": 21504,
    "vocab_size": 131072,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
}
"""A hybrid of Nemotron-H 8B's kind at a GPU's size: 24 Mamba-2 layers, 4 attention layers and
24 MLP layers (`hybrid_override_pattern`'s M, * and -)."""

FALCON_H1_SHAPE: dict[str, Any] = {
    "model_type": "falcon_h1",
    "hidden_size": 3072,
    "num_hidden_layers": 44,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "attn_layer_indices": None,
    "mamba_d_ssm": 3072,
    "mamba_n_heads": 24,
    "mamba_d_head": 128,
    "mamba_d_state": 256,
    "mamba_n_groups": 1,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "intermediate_size": 12288,
    "vocab_size": 130048,
    "max_position_embeddings": 262144,
    "torch_dtype": "bfloat16",
}
"""A hybrid of Falcon-H1 7B's kind at a GPU's size: 44 decoder layers, each an attention block
(2 KV heads of 128) and a Mamba-2 mixer (24 heads of 128, state 256, one group)."""

JAMBA_SHAPE: dict[str, Any] = {
    "model_type": "jamba",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "attn_layer_period": 8,
    "attn_layer_offset": 4,
    "expert_layer_period": 2,
    "expert_layer_offset": 1,
    "num_experts": 16,
    "num_experts_per_tok": 2,
    "mamba_d_state": 16,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "intermediate_size": 14336,
    "vocab_size": 65536,
    "max_position_embeddings": 262144,
    "torch_dtype": "bfloat16",
}
"""A hybrid of Jamba v0.1's kind at a GPU's size: 4 attention and 28 Mamba-1 layers."""

MAMBA2_SHAPE: dict[str, Any] = {
    "architectures": ["Mamba2ForCausalLM"],
    "model_type": "mamba2",
    "hidden_size": 4096,
    "num_hidden_layers": 64,
    "num_heads": 128,
    "head_dim": 64,
    "n_groups": 8,
    "state_size": 128,
    "expand": 2,
    "conv_kernel": 4,
    "chunk_size": 256,
    "vocab_size": 32768,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
"""A Mamba-2 of Mamba-Codestral 7B's kind at a GPU's size: 64 layers, 128 heads of 64, 8
groups, state 128, no attention and no length key (vLLM assumes 2,048 tokens)."""


Logged = tuple[dict[str, Any], int, float]
"""A tiny config and what vLLM 0.32's CPU build logged serving it (dummy weights,
VLLM_CPU_KVCACHE_SPACE=1, --max-model-len 512, --dtype auto): "CPU KV cache size: N tokens" and
"Maximum concurrency for 512 tokens per request: Cx"."""

HYBRIDS_LOGGED: dict[str, Logged] = {
    "granite-4.0-hybrid": (GRANITE_TINY, 254_184, 496.45),
    "qwen3-next": (QWEN3_NEXT_TINY, 838_860, 1638.40),
    "qwen3.5": (QWEN3_5_TINY, 699_050, 1365.33),
    "qwen3.5-moe": (QWEN3_5_MOE_TINY, 838_860, 1638.40),
    "qwen3.5-vl": (QWEN3_5_VL_TINY, 699_050, 1365.33),
    "nemotron-h": (NEMOTRON_H_TINY, 262_144, 512.00),
    "falcon-h1": (FALCON_H1_TINY, 209_715, 409.60),
    "jamba": (JAMBA_TINY, 699_008, 1365.25),
    "zamba2": (ZAMBA2_TINY, 161_319, 315.08),
    "lfm2": (LFM2_TINY, 1_048_576, 2048.00),
    "lfm2-moe": (LFM2_MOE_TINY, 1_677_721, 3276.80),
    "lfm2-vl": (LFM2_VL_TINY, 1_048_576, 2048.00),
}
"""The hybrids' figures (tests/unit/test_planner_hybrids.py plans against them; the opt-in
tests/engine/test_planner_vllm_cpu.py checks them against a fresh vLLM start)."""

STATE_MODELS_LOGGED: dict[str, Logged] = {
    "mamba": (MAMBA_TINY, 7_669_248, 14979.00),
    "falcon-mamba": (FALCON_MAMBA_TINY, 5_341_696, 10433.00),
    "mamba2": (MAMBA2_TINY, 2_025_472, 3956.00),
}
"""The pure state-space models' figures, as HYBRIDS_LOGGED."""
