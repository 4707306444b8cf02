"""Published model configs and vLLM startup logs, for the planner's read-the-files tests.

`CONFIGS`: each model repo's `config.json` as published on the Hub, the keys that size memory
(architecture, shapes, layer types, dtype, quantization) copied with the file's own spellings and
omissions — gemma-3's `text_config` really omits `head_dim` and the attention heads, which is the
point of the test. Keys that do not bear on memory (token ids, rope settings, initializer ranges,
vision towers' inner shapes) are left out for brevity.

`LOGGED`: vLLM 0.19.0 startups on one H100-80GB (79.19 GiB) from llm-d-planner's capacity sweep,
`accuracy/results/v0.19.0/results_raw.csv` at commit d3121e059da88662db39a926a3ead964be97359b of
github.com/llm-d-incubation/llm-d-planner, parsed by its `parse_logs.py` from the real logs beside
it (`accuracy/results/v0.19.0/logs/*.log`): "Model loading took X GiB" (weights), "Available KV
cache memory: X GiB", "GPU KV cache size: N tokens", num_gpu_blocks and "Maximum concurrency for
8,192 tokens per request: Cx". All at gpu_memory_utilization 0.95 (gpt-oss 0.90), max_model_len
8192 (phi-2 2048), dtype auto, kv-cache-dtype auto, H100 batch defaults (max_num_batched_tokens
8192).

`CHECKPOINT_GIB`: the checkpoint's tensor bytes (GiB) the same sweep computed from each repo's
safetensors metadata (`results_predicted.csv`, `pred_total_weight_gib`), for the weights check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SWEEP = "llm-d-incubation/llm-d-planner@d3121e05 accuracy/results/v0.19.0/results_raw.csv"


def _alternate(first: str, second: str, layers: int) -> list[str]:
    return [first if i % 2 == 0 else second for i in range(layers)]


CONFIGS: dict[str, dict[str, Any]] = {
    # Sparse multimodal configs: transformers' Gemma3TextConfig defaults fill in head_dim 256,
    # 8 heads / 4 KV heads (4b), and every 6th layer global (sliding_window_pattern 6).
    "google/gemma-3-4b-it": {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "mm_tokens_per_image": 256,
        "text_config": {
            "hidden_size": 2560,
            "intermediate_size": 10240,
            "model_type": "gemma3_text",
            "num_hidden_layers": 34,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            "sliding_window": 1024,
        },
        "torch_dtype": "bfloat16",
        "vision_config": {"model_type": "siglip_vision_model", "num_hidden_layers": 27},
    },
    "google/gemma-3-12b-it": {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "mm_tokens_per_image": 256,
        "text_config": {
            "hidden_size": 3840,
            "intermediate_size": 15360,
            "model_type": "gemma3_text",
            "num_attention_heads": 16,
            "num_hidden_layers": 48,
            "num_key_value_heads": 8,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            "sliding_window": 1024,
        },
        "torch_dtype": "bfloat16",
        "vision_config": {"model_type": "siglip_vision_model", "num_hidden_layers": 27},
    },
    "google/gemma-3-27b-it": {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "mm_tokens_per_image": 256,
        "text_config": {
            "head_dim": 128,
            "hidden_size": 5376,
            "intermediate_size": 21504,
            "model_type": "gemma3_text",
            "num_attention_heads": 32,
            "num_hidden_layers": 62,
            "num_key_value_heads": 16,
            "query_pre_attn_scalar": 168,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            "sliding_window": 1024,
        },
        "torch_dtype": "bfloat16",
        "vision_config": {"model_type": "siglip_vision_model", "num_hidden_layers": 27},
    },
    "google/gemma-2-2b-it": {
        "architectures": ["Gemma2ForCausalLM"],
        "cache_implementation": "hybrid",
        "head_dim": 256,
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "max_position_embeddings": 8192,
        "model_type": "gemma2",
        "num_attention_heads": 8,
        "num_hidden_layers": 26,
        "num_key_value_heads": 4,
        "query_pre_attn_scalar": 256,
        "sliding_window": 4096,
        "torch_dtype": "float32",
        "vocab_size": 256000,
    },
    "google/gemma-2-9b-it": {
        "architectures": ["Gemma2ForCausalLM"],
        "cache_implementation": "hybrid",
        "head_dim": 256,
        "hidden_size": 3584,
        "intermediate_size": 14336,
        "max_position_embeddings": 8192,
        "model_type": "gemma2",
        "num_attention_heads": 16,
        "num_hidden_layers": 42,
        "num_key_value_heads": 8,
        "query_pre_attn_scalar": 256,
        "sliding_window": 4096,
        "torch_dtype": "float32",
        "vocab_size": 256000,
    },
    "google/gemma-2-27b-it": {
        "architectures": ["Gemma2ForCausalLM"],
        "cache_implementation": "hybrid",
        "head_dim": 128,
        "hidden_size": 4608,
        "intermediate_size": 36864,
        "max_position_embeddings": 8192,
        "model_type": "gemma2",
        "num_attention_heads": 32,
        "num_hidden_layers": 46,
        "num_key_value_heads": 16,
        "query_pre_attn_scalar": 144,
        "sliding_window": 4096,
        "torch_dtype": "bfloat16",
        "vocab_size": 256000,
    },
    "google/gemma-7b": {
        "architectures": ["GemmaForCausalLM"],
        "head_dim": 256,
        "hidden_size": 3072,
        "intermediate_size": 24576,
        "max_position_embeddings": 8192,
        "model_type": "gemma",
        "num_attention_heads": 16,
        "num_hidden_layers": 28,
        "num_key_value_heads": 16,
        "torch_dtype": "bfloat16",
        "vocab_size": 256000,
    },
    # MLA: one 512 + 64 latent per layer, replicated on every TP rank.
    "deepseek-ai/DeepSeek-V2-Lite-Chat": {
        "architectures": ["DeepseekV2ForCausalLM"],
        "first_k_dense_replace": 1,
        "hidden_size": 2048,
        "intermediate_size": 10944,
        "kv_lora_rank": 512,
        "max_position_embeddings": 163840,
        "model_type": "deepseek_v2",
        "moe_intermediate_size": 1408,
        "n_routed_experts": 64,
        "n_shared_experts": 2,
        "num_attention_heads": 16,
        "num_experts_per_tok": 6,
        "num_hidden_layers": 27,
        "num_key_value_heads": 16,
        "q_lora_rank": None,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "v_head_dim": 128,
        "vocab_size": 102400,
    },
    "moonshotai/Kimi-VL-A3B-Instruct": {
        "architectures": ["KimiVLForConditionalGeneration"],
        "model_type": "kimi_vl",
        "text_config": {
            "first_k_dense_replace": 1,
            "hidden_size": 2048,
            "intermediate_size": 11264,
            "kv_lora_rank": 512,
            "max_position_embeddings": 131072,
            "model_type": "deepseek_v3",
            "moe_intermediate_size": 1408,
            "n_routed_experts": 64,
            "n_shared_experts": 2,
            "num_attention_heads": 16,
            "num_experts_per_tok": 6,
            "num_hidden_layers": 27,
            "num_key_value_heads": 16,
            "q_lora_rank": None,
            "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64,
            "tie_word_embeddings": False,
            "v_head_dim": 128,
            "vocab_size": 163840,
        },
        "torch_dtype": "bfloat16",
        "vision_config": {"model_type": "moonvit"},
    },
    # Mixture of experts.
    "Qwen/Qwen1.5-MoE-A2.7B": {
        "architectures": ["Qwen2MoeForCausalLM"],
        "decoder_sparse_step": 1,
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "max_position_embeddings": 8192,
        "max_window_layers": 21,
        "model_type": "qwen2_moe",
        "moe_intermediate_size": 1408,
        "num_attention_heads": 16,
        "num_experts": 60,
        "num_experts_per_tok": 4,
        "num_hidden_layers": 24,
        "num_key_value_heads": 16,
        "shared_expert_intermediate_size": 5632,
        "sliding_window": 32768,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_sliding_window": False,
        "vocab_size": 151936,
    },
    "Qwen/Qwen3-30B-A3B": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "decoder_sparse_step": 1,
        "head_dim": 128,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "max_position_embeddings": 40960,
        "max_window_layers": 48,
        "model_type": "qwen3_moe",
        "moe_intermediate_size": 768,
        "num_attention_heads": 32,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 48,
        "num_key_value_heads": 4,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_sliding_window": False,
        "vocab_size": 151936,
    },
    "mistralai/Mixtral-8x7B-Instruct-v0.1": {
        "architectures": ["MixtralForCausalLM"],
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "max_position_embeddings": 32768,
        "model_type": "mixtral",
        "num_attention_heads": 32,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "num_local_experts": 8,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 32000,
    },
    # Sliding window every other layer, MXFP4 experts.
    "openai/gpt-oss-20b": {
        "architectures": ["GptOssForCausalLM"],
        "head_dim": 64,
        "hidden_size": 2880,
        "intermediate_size": 2880,
        "layer_types": _alternate("sliding_attention", "full_attention", 24),
        "max_position_embeddings": 131072,
        "model_type": "gpt_oss",
        "num_attention_heads": 64,
        "num_experts_per_tok": 4,
        "num_hidden_layers": 24,
        "num_key_value_heads": 8,
        "num_local_experts": 32,
        "quantization_config": {"quant_method": "mxfp4"},
        "sliding_window": 128,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 201088,
    },
    # Chunked local attention on RoPE layers, global on every 4th (NoPE).
    "meta-llama/Llama-4-Scout-17B-16E-Instruct": {
        "architectures": ["Llama4ForConditionalGeneration"],
        "model_type": "llama4",
        "text_config": {
            "attention_chunk_size": 8192,
            "head_dim": 128,
            "hidden_size": 5120,
            "interleave_moe_layer_step": 1,
            "intermediate_size": 8192,
            "intermediate_size_mlp": 16384,
            "max_position_embeddings": 10485760,
            "model_type": "llama4_text",
            "num_attention_heads": 40,
            "num_experts_per_tok": 1,
            "num_hidden_layers": 48,
            "num_key_value_heads": 8,
            "num_local_experts": 16,
            "vocab_size": 202048,
        },
        "torch_dtype": "bfloat16",
        "vision_config": {"model_type": "llama4_vision_model"},
    },
    # Dense, grouped-query and multi-head.
    "microsoft/phi-4": {
        "architectures": ["Phi3ForCausalLM"],
        "hidden_size": 5120,
        "intermediate_size": 17920,
        "max_position_embeddings": 16384,
        "model_type": "phi3",
        "num_attention_heads": 40,
        "num_hidden_layers": 40,
        "num_key_value_heads": 10,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 100352,
    },
    "microsoft/phi-2": {
        "architectures": ["PhiForCausalLM"],
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "max_position_embeddings": 2048,
        "model_type": "phi",
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": None,
        "partial_rotary_factor": 0.4,
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "vocab_size": 51200,
    },
    "ibm-granite/granite-3.1-2b-instruct": {
        "architectures": ["GraniteForCausalLM"],
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "max_position_embeddings": 131072,
        "model_type": "granite",
        "num_attention_heads": 32,
        "num_hidden_layers": 40,
        "num_key_value_heads": 8,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "vocab_size": 49155,
    },
    "ibm-granite/granite-3.1-8b-instruct": {
        "architectures": ["GraniteForCausalLM"],
        "hidden_size": 4096,
        "intermediate_size": 12800,
        "max_position_embeddings": 131072,
        "model_type": "granite",
        "num_attention_heads": 32,
        "num_hidden_layers": 40,
        "num_key_value_heads": 8,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "vocab_size": 49155,
    },
    "codellama/CodeLlama-7b-hf": {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "max_position_embeddings": 16384,
        "model_type": "llama",
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 32,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 32016,
    },
    "mistralai/Mistral-Small-3.1-24B-Instruct-2503": {
        "architectures": ["Mistral3ForConditionalGeneration"],
        "model_type": "mistral3",
        "text_config": {
            "head_dim": 128,
            "hidden_size": 5120,
            "intermediate_size": 32768,
            "max_position_embeddings": 131072,
            "model_type": "mistral",
            "num_attention_heads": 32,
            "num_hidden_layers": 40,
            "num_key_value_heads": 8,
            "sliding_window": None,
            "vocab_size": 131072,
        },
        "torch_dtype": "bfloat16",
        "vision_config": {"model_type": "pixtral"},
    },
}

# An AWQ checkpoint (no vLLM log in the sweep): its config's quantization_config, for the
# quantized-weights path. Qwen/Qwen2.5-72B-Instruct-AWQ's published config.json.
AWQ_72B = "Qwen/Qwen2.5-72B-Instruct-AWQ"
CONFIGS[AWQ_72B] = {
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 8192,
    "intermediate_size": 29696,
    "max_position_embeddings": 32768,
    "max_window_layers": 70,
    "model_type": "qwen2",
    "num_attention_heads": 64,
    "num_hidden_layers": 80,
    "num_key_value_heads": 8,
    "quantization_config": {
        "bits": 4,
        "group_size": 128,
        "modules_to_not_convert": None,
        "quant_method": "awq",
        "version": "gemm",
        "zero_point": True,
    },
    "sliding_window": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "use_sliding_window": False,
    "vocab_size": 152064,
}


@dataclass(frozen=True)
class Logged:
    """One vLLM 0.19.0 startup of the sweep (see the module docstring)."""

    model: str
    tp: int
    weights_gib: float
    """"Model loading took X GiB" (per GPU)."""
    kv_gib: float
    """"Available KV cache memory: X GiB" (per GPU)."""
    blocks: int
    """num_gpu_blocks."""
    tokens: int
    """"GPU KV cache size: N tokens"."""
    concurrency: float
    """"Maximum concurrency for max_model_len tokens per request: Cx"."""
    max_model_len: int = 8192
    utilization: float = 0.95
    in_catalog: bool = False
    """Whether llmop's built-in catalog knows the model (the set the issue measures is outside)."""


LOGGED: tuple[Logged, ...] = (
    Logged("google/gemma-3-4b-it", 1, 8.58, 62.51, 204817, 468144, 57.05),
    Logged("google/gemma-3-12b-it", 1, 23.31, 47.72, 48867, 130304, 15.88),
    Logged("google/gemma-3-27b-it", 1, 51.45, 19.53, 15997, 36560, 4.46),
    Logged("google/gemma-2-2b-it", 1, 4.90, 66.47, 83770, 670160, 81.73, in_catalog=True),
    Logged("google/gemma-2-9b-it", 1, 17.22, 54.12, 21110, 168880, 20.60, in_catalog=True),
    Logged("google/gemma-2-27b-it", 1, 50.72, 20.59, 7335, 58672, 7.16, in_catalog=True),
    Logged("google/gemma-7b", 1, 15.91, 55.44, 8110, 129760, 15.84),
    Logged("deepseek-ai/DeepSeek-V2-Lite-Chat", 1, 29.43, 43.61, 94097, 1505552, 183.78),
    Logged("moonshotai/Kimi-VL-A3B-Instruct", 1, 30.74, 41.32, 89148, 1426368, 174.12),
    Logged("moonshotai/Kimi-VL-A3B-Instruct", 2, 15.53, 54.78, 118181, 1890896, 230.82),
    Logged("Qwen/Qwen1.5-MoE-A2.7B", 1, 26.67, 45.83, 15644, 250304, 30.55),
    Logged("Qwen/Qwen3-30B-A3B", 1, 56.88, 15.41, 10518, 168288, 20.54),
    Logged(
        "mistralai/Mixtral-8x7B-Instruct-v0.1",
        2,
        43.51,
        28.44,
        29121,
        465936,
        56.88,
        in_catalog=True,
    ),
    Logged("openai/gpt-oss-20b", 2, 7.01, 59.32, 323972, 2591776, 316.07, utilization=0.90),
    Logged("meta-llama/Llama-4-Scout-17B-16E-Instruct", 4, 53.12, 16.75, 91495, 365968, 44.68),
    Logged("microsoft/phi-4", 1, 27.39, 46.08, 15098, 241568, 29.49),
    Logged("microsoft/phi-2", 1, 5.19, 69.00, 14132, 226112, 110.41, max_model_len=2048),
    Logged("ibm-granite/granite-3.1-2b-instruct", 1, 4.74, 69.28, 56753, 908048, 110.85),
    Logged("ibm-granite/granite-3.1-8b-instruct", 1, 15.25, 58.66, 24027, 384432, 46.93),
    Logged("codellama/CodeLlama-7b-hf", 1, 12.56, 61.66, 7891, 126256, 15.41),
    Logged("mistralai/Mistral-Small-3.1-24B-Instruct-2503", 1, 44.76, 28.19, 11547, 184752, 22.55),
)

CHECKPOINT_GIB: dict[str, float] = {
    "codellama/CodeLlama-7b-hf": 12.5515,
    "deepseek-ai/DeepSeek-V2-Lite-Chat": 29.2556,
    "ibm-granite/granite-3.1-2b-instruct": 4.7191,
    "ibm-granite/granite-3.1-8b-instruct": 15.2194,
    "meta-llama/Llama-4-Scout-17B-16E-Instruct": 202.3611,
    "microsoft/phi-2": 5.1776,
    "microsoft/phi-4": 27.3055,
    "mistralai/Mistral-Small-3.1-24B-Instruct-2503": 44.7246,
    "mistralai/Mixtral-8x7B-Instruct-v0.1": 86.9907,
    "moonshotai/Kimi-VL-A3B-Instruct": 30.5616,
    "openai/gpt-oss-20b": 12.8162,
    "Qwen/Qwen1.5-MoE-A2.7B": 26.6652,
}
