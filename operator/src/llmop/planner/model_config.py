"""A model's own files → the planner's model facts (``ModelArchitecture``). Pure.

Reads what vLLM reads to size memory, from the parsed ``config.json`` and the checkpoint's size
(``model.safetensors.index.json`` ``metadata.total_size``, or the safetensors headers' dtype
counts), the way vLLM and transformers interpret them
(../shared/reference/planner-from-files.md §2.1 and §6):

* multimodal checkpoints keep the language model under ``text_config`` (``llm_config``,
  ``language_config``); the dtype and ``quantization_config`` may sit at the top level;
* keys a published config omits take transformers' defaults for that ``model_type`` (gemma-3's
  text_config omits ``head_dim``: 256, not hidden/heads; Gemma 2 and 3 derive which layers
  slide; Llama 4 derives its NoPE layers);
* head size: ``head_dim`` → ``hidden_size_per_head`` → hidden/heads; KV heads:
  ``num_key_value_heads`` and its aliases, else the attention heads; MLA when the text
  ``model_type`` is one of vLLM's MLA models and ``kv_lora_rank`` is set;
* per layer: full attention, sliding window (``layer_types``, Gemma 2/3, gpt-oss), chunked
  local attention (Llama 4), MLA.

Pure state-space models (Mamba, Falcon-Mamba, Mamba-2) are every layer a state layer and no
attention heads (``kv_heads`` and ``head_dim`` 0), their context vLLM's 2,048 when the config
has no length key.

Anything the planner cannot size is refused, never guessed: an unknown ``model_type``, a layer
type it does not know (a hybrid's it does not size, e.g. Kimi Linear's KDA), a config that
contradicts itself; an ``architectures`` entry vLLM no longer serves is refused saying up to
which release it did. The error names the file, the field and the fix.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmop.planner.dtypes import UnknownDtypeError, is_quantized, weight_bytes_per_param
from llmop.planner.kv_layout import (
    CHUNKED,
    FULL,
    GATED_DELTA_NET,
    MAMBA1,
    MAMBA2,
    MLA,
    SHORT_CONV,
    SLIDING,
    STATE,
    AttentionLayer,
    StateShape,
)
from llmop.planner.models import ATTENTION_GQA, ATTENTION_MLA, ModelArchitecture
from llmop.planner.vllm_profile import ENGINE_VLLM_VERSION

CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"

FIX = "set spec.model.architecture to plan it by hand"


class ModelConfigError(ValueError):
    """config.json cannot be planned from: names the file, the field and the fix."""


_TEXT_KEYS = ("text_config", "llm_config", "language_config")

# Multimodal wrappers whose text_config may omit its own model_type.
_TEXT_TYPE_OF: dict[str, str] = {
    "gemma3": "gemma3_text",
    "llama4": "llama4_text",
    "mistral3": "mistral",
    "llava": "llama",
    "llava_next": "llama",
    "kimi_vl": "deepseek_v3",
    "qwen3_5": "qwen3_5_text",
    "qwen3_5_moe": "qwen3_5_moe_text",
    "lfm2_vl": "lfm2",
    # Nemotron Nano VL's remote-code config builds its `llm_config` as a NemotronHConfig.
    "NemotronH_Nano_VL_V2": "nemotron_h",
}

# vLLM's MLA models (model_arch_config_convertor.py L215-234) that are plain MLA decoders.
_MLA_TYPES = frozenset({"deepseek_v2", "deepseek_v3", "kimi_k2", "longcat_flash", "glm4_moe_lite"})

# Text model types whose every layer is a softmax-attention layer vLLM sizes with the specs
# below (plus layer_types where a config has them). Anything else is refused.
_SUPPORTED = frozenset(
    {
        "llama",
        "mistral",
        "mixtral",
        "qwen2",
        "qwen2_moe",
        "qwen3",
        "qwen3_moe",
        "gemma",
        "gemma2",
        "gemma3_text",
        "phi",
        "phi3",
        "granite",
        "granitemoe",
        "olmo",
        "olmo2",
        "starcoder2",
        "gpt_oss",
        "llama4_text",
        *_MLA_TYPES,
    }
)

# Mamba / gated-delta-net hybrids the planner sizes (vLLM 0.32: granitemoehybrid.py,
# qwen3_next.py, qwen3_5.py, olmo_hybrid.py, nemotron_h.py, falcon_h1.py, jamba.py, zamba2.py):
# their state layers and full-attention layers, by `layer_types` (Nemotron-H:
# `layers_block_type`, or `hybrid_override_pattern`'s letters; Falcon-H1: every decoder layer
# both, side by side; Jamba: Mamba-1 layers and an attention layer every `attn_layer_period`;
# Zamba2: a Mamba-2 mixer in every layer and a shared attention block's own cache in each
# "hybrid" one).
_GATED_DELTA_NET_HYBRIDS = frozenset(
    {"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "olmo_hybrid"}
)
"""Qwen3-Next, Qwen3.5 (dense and MoE, text-only or under a multimodal wrapper's text_config)
and OLMo Hybrid: vLLM 0.32 (qwen3_5.py, olmo_hybrid.py) sizes their gated-delta-net state from
the same keys as qwen3_next.py, and transformers makes every 4th layer full attention when a
config lists no `layer_types`."""
_STATE_HYBRIDS = frozenset(
    {
        "granitemoehybrid",
        "nemotron_h",
        "falcon_h1",
        "jamba",
        "zamba2",
        "lfm2",
        "lfm2_moe",
        *_GATED_DELTA_NET_HYBRIDS,
    }
)
# Pure state-space models (vLLM 0.32 mamba.py, mamba2.py: `IsAttentionFree`): every layer a
# Mamba-1 (`mamba`, `falcon_mamba`: one MambaMixer class) or Mamba-2 mixer, no attention at all.
_STATE_MODELS = frozenset({"mamba", "falcon_mamba", "mamba2"})
_NO_PIPELINE_STAGES = {"mamba2": "Mamba2ForCausalLM", "zamba2": "Zamba2ForCausalLM"}
"""State models and hybrids whose vLLM 0.32 class does not implement `SupportsPP` (mamba2.py,
zamba2.py; mamba.py's `MambaForCausalLM` does): vLLM refuses pipeline stages for them
(config/model.py `verify_with_parallel_config`)."""
_CPU_UNSUPPORTED = {
    "olmo_hybrid": (
        "vLLM 0.32's CPU build fails to load it (its gated-delta-net layer, "
        "olmo_gdn_linear_attn.py, sets a Triton allocator, which the CPU build's Triton lacks)"
    ),
}
"""Model types whose layers vLLM's CPU build cannot construct, and why (seen starting it)."""
_ZAMBA2_LAYERS = (
    ["linear_attention"]
    + (["linear_attention"] * 5 + ["hybrid"]) * 7
    + ["linear_attention"] * 4
    + ["hybrid"]
    + ["linear_attention"] * 3
    + ["hybrid"]
    + ["linear_attention"] * 2
)
"""transformers' Zamba2Config `layers_block_type` when a config gives none (Zamba2-2.7B's 54
layers, whatever `num_hidden_layers` says)."""
DEFAULT_MAX_MODEL_LEN = 2048
"""vLLM's context for a config with none of the length keys (config/model.py
`_get_and_verify_max_len`: "Assuming the model's maximum length is 2048"): Mamba configs."""

# Architectures vLLM served once and no longer does, with the last release that did (vLLM 0.32
# vllm/model_executor/models/registry.py `_PREVIOUSLY_SUPPORTED_MODELS`; vLLM then refuses them
# at start: "Model architecture X was supported in vLLM until vY"). Keyed by `architectures`.
_PREVIOUSLY_SERVED: dict[str, str] = {
    "MotifForCausalLM": "0.10.2",
    "Phi3SmallForCausalLM": "0.9.2",
    "Phi4FlashForCausalLM": "0.10.2",
    "Phi4MultimodalForCausalLM": "0.12.0",
    "JAISLMHeadModel": "0.22.0",
    "ErnieModel": "0.23.0",
    "ErnieForSequenceClassification": "0.23.0",
    "ErnieForTokenClassification": "0.23.0",
    "InternLM2VEForCausalLM": "0.23.0",
    "QWenLMHeadModel": "0.23.0",
    "QwenVLForConditionalGeneration": "0.23.0",
    "InternLMForCausalLM": "0.23.0",
    "DonutForConditionalGeneration": "0.10.2",
    "MllamaForConditionalGeneration": "0.10.2",
    "XverseForCausalLM": "0.23.0",
    "Dots1ForCausalLM": "0.23.0",
    "BambaForCausalLM": "0.23.0",
    "MiniMaxForCausalLM": "0.23.0",
    "MiniMaxText01ForCausalLM": "0.23.0",
    "MiniMaxM1ForCausalLM": "0.23.0",
    "MiniMaxVL01ForConditionalGeneration": "0.23.0",
    "BaiChuanForCausalLM": "0.23.0",
    "BaichuanForCausalLM": "0.23.0",
    "AquilaModel": "0.24.0",
    "AquilaForCausalLM": "0.24.0",
    "Grok1ModelForCausalLM": "0.24.0",
    "Grok1ForCausalLM": "0.24.0",
    "TarsierForConditionalGeneration": "0.24.0",
    "Tarsier2ForConditionalGeneration": "0.23.0",
    "MantisForConditionalGeneration": "0.24.0",
    "MusicFlamingoForConditionalGeneration": "0.24.0",
    "AyaVisionForConditionalGeneration": "0.24.0",
    "TeleChatForCausalLM": "0.25.0",
    "PersimmonForCausalLM": "0.25.0",
    "FuyuForCausalLM": "0.25.0",
    "Plamo2ForCausalLM": "0.26.0",
    "OuroForCausalLM": "0.26.0",
    "ArcticForCausalLM": "0.28.0",
    "ChameleonForConditionalGeneration": "0.28.0",
    "Cheers": "0.28.0",
    "CheersForConditionalGeneration": "0.28.0",
    "Fairseq2LlamaForCausalLM": "0.28.0",
    "FireRedLIDForConditionalGeneration": "0.28.0",
    "GritLM": "0.28.0",
    "HCXVisionForCausalLM": "0.28.0",
    "MPTForCausalLM": "0.28.0",
    "MptForCausalLM": "0.28.0",
    "RWForCausalLM": "0.28.0",
    "StableLMEpochForCausalLM": "0.28.0",
    "PrithviGeoSpatialMAE": "0.28.0",
}
_STATE_LAYER_TYPES = frozenset({"linear_attention", "mamba"})
_FULL_LAYER_TYPES = frozenset({"full_attention", "attention"})
_CACHELESS_LAYER_TYPES = frozenset({"mlp", "moe"})
"""Nemotron-H's MLP and MoE layers: no KV cache, no state (vLLM gives them no cache spec)."""
_NEMOTRON_H_PATTERN = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
"""`hybrid_override_pattern`'s letters (vLLM nemotron_h.py `ALL_DECODER_LAYER_TYPES`)."""

# Layer types of Mamba / linear-attention hybrids, and config keys that only they carry.
_HYBRID_KEYS = (
    "mamba_d_state",
    "mamba_expand",
    "ssm_cfg",
    "layers_block_type",
    "hybrid_override_pattern",
    "linear_num_value_heads",
    "attn_layer_indices",
    "linear_attn_config",
)

_QWEN3_5_SHARED: dict[str, Any] = {
    "vocab_size": 248320,
    "num_attention_heads": 16,
    "head_dim": 256,
    "max_position_embeddings": 32768,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
}
"""The defaults Qwen3.5's dense and MoE text configs share in transformers."""

# transformers' configuration-class defaults for keys published configs omit.
_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {
        "vocab_size": 262208,
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "max_position_embeddings": 131072,
        "sliding_window": 4096,
        "sliding_window_pattern": 6,
        "tie_word_embeddings": True,
    },
    "gemma2": {
        "vocab_size": 256000,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "max_position_embeddings": 8192,
        "sliding_window": 4096,
        "tie_word_embeddings": True,
    },
    "gemma": {"head_dim": 256, "tie_word_embeddings": True},
    # transformers' NemotronHConfig (head_dim is its own default, not hidden / heads).
    "nemotron_h": {
        "vocab_size": 131072,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 4096,
        "ssm_state_size": 128,
        "mamba_num_heads": 128,
        "mamba_head_dim": 64,
        "n_groups": 8,
        "conv_kernel": 4,
        "mamba_ssm_cache_dtype": "float32",
    },
    # transformers' FalconH1Config: `mamba_d_ssm` 1024 when a config omits it (only an explicit
    # null falls back to mamba_expand x hidden_size), `mamba_d_head` "auto" (d_ssm / heads).
    "falcon_h1": {
        "vocab_size": 128000,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 8192,
        "mamba_d_ssm": 1024,
        "mamba_n_heads": 128,
        "mamba_d_head": "auto",
        "mamba_n_groups": 1,
        "mamba_d_state": 256,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
    },
    # transformers' Lfm2Config / Lfm2MoeConfig (neither has conv_dim, block_dim or head_dim).
    "lfm2": {
        "vocab_size": 65536,
        "hidden_size": 2560,
        "intermediate_size": 12288,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 128000,
        "conv_L_cache": 3,
        "tie_word_embeddings": True,
    },
    "lfm2_moe": {
        "vocab_size": 65536,
        "hidden_size": 2048,
        "intermediate_size": 7168,
        "moe_intermediate_size": 1792,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 128000,
        "conv_L_cache": 3,
        "num_dense_layers": 2,
        "num_experts": 32,
        "num_experts_per_tok": 4,
        "tie_word_embeddings": True,
    },
    # transformers' JambaConfig (its layer kinds come from the period and offset only).
    "jamba": {
        "vocab_size": 65536,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 262144,
        "num_experts": 16,
        "num_experts_per_tok": 2,
        "attn_layer_period": 8,
        "attn_layer_offset": 4,
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
    },
    # transformers' MambaConfig / FalconMambaConfig: the mixer's inner size is always
    # expand x hidden_size (`__post_init__` overwrites any `intermediate_size` a config gives).
    "mamba": {
        "vocab_size": 50280,
        "hidden_size": 768,
        "state_size": 16,
        "num_hidden_layers": 32,
        "expand": 2,
        "conv_kernel": 4,
        "tie_word_embeddings": True,
    },
    "falcon_mamba": {
        "vocab_size": 50280,
        "hidden_size": 768,
        "state_size": 16,
        "num_hidden_layers": 32,
        "expand": 2,
        "conv_kernel": 4,
        "tie_word_embeddings": True,
    },
    # transformers' Mamba2Config.
    "mamba2": {
        "vocab_size": 32768,
        "hidden_size": 4096,
        "num_heads": 128,
        "head_dim": 64,
        "state_size": 128,
        "num_hidden_layers": 64,
        "expand": 2,
        "conv_kernel": 4,
        "n_groups": 8,
        "tie_word_embeddings": False,
    },
    # transformers' Qwen3_5TextConfig and Qwen3_5MoeTextConfig (head_dim is its own default).
    "qwen3_5_text": {
        **_QWEN3_5_SHARED,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 32,
        "num_key_value_heads": 4,
    },
    "qwen3_5_moe_text": {
        **_QWEN3_5_SHARED,
        "hidden_size": 2048,
        "num_hidden_layers": 40,
        "num_key_value_heads": 2,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
        "num_experts_per_tok": 8,
        "num_experts": 256,
    },
    # transformers' OlmoHybridConfig (its linear-attention sizes derive from these: `_derived`).
    "olmo_hybrid": {
        "vocab_size": 100352,
        "hidden_size": 3840,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 30,
        "max_position_embeddings": 65536,
        "linear_conv_kernel_dim": 4,
    },
    # transformers' Zamba2Config (head sizes derive from these: `_derived`).
    "zamba2": {
        "vocab_size": 32000,
        "hidden_size": 2560,
        "num_hidden_layers": 54,
        "num_attention_heads": 32,
        "max_position_embeddings": 4096,
        "mamba_d_state": 64,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "mamba_ngroups": 1,
        "n_mamba_heads": 8,
        "tie_word_embeddings": True,
    },
    "llama4_text": {
        "vocab_size": 202048,
        "hidden_size": 5120,
        "intermediate_size": 8192,
        "intermediate_size_mlp": 16384,
        "num_hidden_layers": 48,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "num_local_experts": 16,
        "num_experts_per_tok": 1,
        "no_rope_layer_interval": 4,
        "attention_chunk_size": 8192,
        "interleave_moe_layer_step": 1,
    },
}

# vLLM takes the smallest of these as the model's context (config/model.py _get_and_verify_max_len).
_LENGTH_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)

_SAFETENSORS_DTYPE_BYTES: dict[str, float] = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F4": 0.5,
}

_TORCH_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float": 4, "half": 2}

# Two-matrix MLPs (fc1/fc2); the others are gated (gate, up, down).
_TWO_MATRIX_MLP = frozenset({"phi", "starcoder2"})


def _err(field: str, problem: str, fix: str = FIX) -> ModelConfigError:
    return ModelConfigError(f"{CONFIG_FILE}: {field}: {problem}; {fix}")


def _int(config: Mapping[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = config.get(key)
        if isinstance(value, bool):
            continue
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    return None


def _need(config: Mapping[str, Any], where: str, *keys: str) -> int:
    value = _int(config, *keys)
    if value is None or value <= 0:
        raise _err(f"{where}{keys[0]}", "missing or not a positive integer")
    return value


def text_config(config: Mapping[str, Any]) -> tuple[dict[str, Any], str, str]:
    """The language model's config with transformers' defaults filled in, its model_type, and
    the prefix its fields are found under (``text_config.`` or "") for messages."""
    top_type = str(config.get("model_type") or "")
    for key in _TEXT_KEYS:
        inner = config.get(key)
        if isinstance(inner, Mapping):
            text_type = str(inner.get("model_type") or _TEXT_TYPE_OF.get(top_type, top_type))
            merged = {**_DEFAULTS.get(text_type, {}), **inner}
            return _derived(merged, text_type), text_type, f"{key}."
    if not top_type:
        raise _err("model_type", "missing", "is this the model's config.json?")
    return _derived({**_DEFAULTS.get(top_type, {}), **config}, top_type), top_type, ""


def _derived(text: dict[str, Any], text_type: str) -> dict[str, Any]:
    """Keys transformers' config classes compute from others in `__post_init__`, as vLLM then
    reads them. Left as they are when the inputs are not numbers: the sizing refuses those."""
    hidden, heads = _int(text, "hidden_size"), _int(text, "num_attention_heads")
    if not hidden or not heads:
        return text
    if text_type == "olmo_hybrid":
        # OlmoHybridConfig: linear heads default to the attention heads, the key head to
        # 0.75 x hidden over them, the value head to twice that. vLLM's attention takes
        # hidden / heads as its head size, whatever `head_dim` says.
        key_heads = _int(text, "linear_num_key_heads") or heads
        key_dim = _int(text, "linear_key_head_dim") or int(0.75 * hidden / key_heads)
        return text | {
            "linear_num_key_heads": key_heads,
            "linear_num_value_heads": _int(text, "linear_num_value_heads") or heads,
            "linear_key_head_dim": key_dim,
            "linear_value_head_dim": _int(text, "linear_value_head_dim") or 2 * key_dim,
            "head_dim": hidden // heads,
        }
    if text_type == "zamba2":
        # Zamba2Config overwrites these whatever a config says: the shared attention block
        # works on the hidden state and the embeddings side by side (2 x hidden_size), and
        # vLLM's `Attention` there keeps a KV head for every attention head.
        expand, mamba_heads = _int(text, "mamba_expand"), _int(text, "n_mamba_heads")
        derived = {"head_dim": 2 * hidden // heads, "num_key_value_heads": heads}
        if expand and mamba_heads:
            derived["mamba_headdim"] = expand * hidden // mamba_heads
        return text | derived
    return text


def _refuse_retired(config: Mapping[str, Any]) -> None:
    """An architecture vLLM no longer serves (``_PREVIOUSLY_SERVED``) is refused saying so."""
    architectures = config.get("architectures")
    if not isinstance(architectures, list):
        return
    for architecture in architectures:
        version = _PREVIOUSLY_SERVED.get(str(architecture))
        if version is not None:
            raise _err(
                "architectures",
                f"{architecture} was served by vLLM up to {version}, not by the engine's vLLM "
                f"{ENGINE_VLLM_VERSION} (vLLM refuses it at start)",
                f"run it on an engine image with vLLM {version} or earlier (spec.engine.image) "
                "and set spec.model.architecture to plan it by hand, or serve another model",
            )


def _refuse_unknown(text: Mapping[str, Any], text_type: str, where: str) -> None:
    if text_type in _STATE_HYBRIDS or text_type in _STATE_MODELS:
        return
    for key in _HYBRID_KEYS:
        if key in text:
            raise _err(
                f"{where}{key}",
                f"model_type {text_type!r} has Mamba or linear-attention layers, which the "
                "planner does not size",
            )
    if text_type not in _SUPPORTED:
        raise _err(
            f"{where}model_type",
            f"{text_type!r} is not a model type the planner knows how vLLM sizes",
        )


def _layer_types(text: Mapping[str, Any], text_type: str, layers: int) -> list[str]:
    """Each layer's ``layer_types`` value, from the config or transformers' rule for it."""
    given = text.get("layer_types")
    if isinstance(given, list) and given:
        return [str(value) for value in given]
    if text_type == "gemma3_text":
        pattern = _int(text, "sliding_window_pattern") or 6
        return [
            "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)
        ]
    if text_type == "gemma2":
        return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
    if text_type == "gpt_oss":
        return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    if text_type.startswith("qwen") and text.get("use_sliding_window") is True:
        first = _int(text, "max_window_layers") or layers
        return ["sliding_attention" if i >= first else "full_attention" for i in range(layers)]
    if text_type == "llama4_text":
        interval = _int(text, "no_rope_layer_interval") or 4
        no_rope = text.get("no_rope_layers") or [
            int((i + 1) % interval != 0) for i in range(layers)
        ]
        # no_rope_layers[i] == 1: the layer uses RoPE and chunked attention; 0: NoPE, global.
        chunked = bool(_int(text, "attention_chunk_size"))
        return [
            "chunked_attention" if chunked and use_rope else "full_attention"
            for use_rope in no_rope
        ]
    return ["full_attention"] * layers


def _state_shape(text: Mapping[str, Any], text_type: str, where: str) -> StateShape:
    """A hybrid's state layer shape, from the keys vLLM reads for it."""
    if text_type in _GATED_DELTA_NET_HYBRIDS:
        return StateShape(
            GATED_DELTA_NET,
            heads=_need(text, where, "linear_num_value_heads"),
            head_dim=_need(text, where, "linear_value_head_dim"),
            state_size=_need(text, where, "linear_key_head_dim"),
            conv_kernel=_need(text, where, "linear_conv_kernel_dim"),
            groups=_need(text, where, "linear_num_key_heads"),
        )
    if text_type == "nemotron_h":
        heads, head_dim = (
            _need(text, where, "mamba_num_heads"),
            _need(text, where, "mamba_head_dim"),
        )
        return StateShape(
            MAMBA2,
            heads=heads,
            head_dim=head_dim,
            state_size=_need(text, where, "ssm_state_size"),
            conv_kernel=_need(text, where, "conv_kernel", "mamba_d_conv"),
            groups=_need(text, where, "n_groups", "mamba_n_groups"),
            intermediate=heads * head_dim,
            temporal_bytes=_ssm_cache_bytes(text, where),
        )
    if text_type == "falcon_h1":
        return _falcon_h1_state(text, where)
    if text_type == "jamba":
        # vLLM 0.32 jamba.py `get_mamba_state_shape_from_config`: Mamba-1, inner size
        # mamba_expand x hidden_size; its SSM state at the model's dtype (mamba1_state_dtype).
        inner = _need(text, where, "mamba_expand") * _need(text, where, "hidden_size")
        return StateShape(
            MAMBA1,
            heads=1,
            head_dim=1,
            state_size=_need(text, where, "mamba_d_state"),
            conv_kernel=_need(text, where, "mamba_d_conv"),
            groups=1,
            intermediate=inner,
        )
    if text_type in ("mamba", "falcon_mamba"):
        # vLLM 0.32 mamba.py (`MambaForCausalLM` serves both): `MambaMixer`'s
        # `mamba1_state_shape` with transformers' intermediate_size, expand x hidden_size.
        return StateShape(
            MAMBA1,
            heads=1,
            head_dim=1,
            state_size=_need(text, where, "state_size"),
            conv_kernel=_need(text, where, "conv_kernel"),
            groups=1,
            intermediate=_need(text, where, "expand") * _need(text, where, "hidden_size"),
        )
    if text_type == "mamba2":
        return _mamba2_state(text, where)
    if text_type == "zamba2":
        return _zamba2_state(text, where)
    hidden = _need(text, where, "hidden_size")
    intermediate = (_int(text, "mamba_expand") or 2) * hidden
    heads = _int(text, "mamba_n_heads") or 128
    head_dim = _int(text, "mamba_d_head") or intermediate // heads
    if heads * head_dim != intermediate:
        raise _err(
            f"{where}mamba_d_head",
            f"{heads} heads of {head_dim} do not make mamba_expand x hidden_size {intermediate}",
            "fix the config",
        )
    return StateShape(
        MAMBA2,
        heads=heads,
        head_dim=head_dim,
        state_size=_int(text, "mamba_d_state") or 256,
        conv_kernel=_int(text, "mamba_d_conv") or 4,
        groups=_int(text, "mamba_n_groups") or 1,
        intermediate=intermediate,
    )


def _zamba2_state(text: Mapping[str, Any], where: str) -> StateShape:
    """Zamba2's Mamba-2 mixer (vLLM 0.32 zamba2.py `get_mamba_state_shape_from_config`): inner
    size mamba_expand x hidden_size, `n_mamba_heads` heads of transformers' `mamba_headdim`;
    its SSM state at the model's dtype (`mamba2_state_dtype`)."""
    intermediate = _need(text, where, "mamba_expand") * _need(text, where, "hidden_size")
    heads = _need(text, where, "n_mamba_heads")
    if intermediate % heads:
        raise _err(
            f"{where}n_mamba_heads",
            f"{heads} heads do not divide the Mamba inner size {intermediate} "
            "(mamba_expand x hidden_size)",
            "fix the config",
        )
    return StateShape(
        MAMBA2,
        heads=heads,
        head_dim=intermediate // heads,
        state_size=_need(text, where, "mamba_d_state"),
        conv_kernel=_need(text, where, "mamba_d_conv"),
        groups=_need(text, where, "mamba_ngroups"),
        intermediate=intermediate,
    )


def _zamba2_types(text: Mapping[str, Any], where: str) -> list[str]:
    """Zamba2's layer kinds: `layers_block_type` (or its alias `layer_types`), "mamba" read as
    transformers' "linear_attention"; transformers' 54-layer list when a config gives none."""
    given = text.get("layers_block_type") or text.get("layer_types")
    if given is None:
        return list(_ZAMBA2_LAYERS)
    if not isinstance(given, list) or not given:
        raise _err(f"{where}layers_block_type", "not a list of layer kinds", "fix the config")
    return ["linear_attention" if value == "mamba" else str(value) for value in given]


def _zamba2_layers(
    text: Mapping[str, Any], where: str, *, kv_heads: int, head: int
) -> tuple[AttentionLayer, ...]:
    """Zamba2 (vLLM 0.32 zamba2.py `Zamba2Model`): every layer a Mamba-2 mixer; each "hybrid"
    layer also runs one of the `num_mem_blocks` shared attention blocks, whose weights are
    shared but whose KV cache is its own (`dpa_list`: an `Attention` per hybrid layer)."""
    state = AttentionLayer(STATE, 0, 0, 0, state=_zamba2_state(text, where))
    full = AttentionLayer(FULL, kv_heads, head, head)
    out: list[AttentionLayer] = []
    for value in _zamba2_types(text, where):
        if value == "hybrid":
            out.extend((full, state))
        elif value == "linear_attention":
            out.append(state)
        else:
            raise _err(
                f"{where}layers_block_type",
                f"layer kind {value!r} is not one the planner knows how vLLM sizes",
            )
    return tuple(out)


def _mamba2_state(text: Mapping[str, Any], where: str) -> StateShape:
    """Mamba2ForCausalLM's mixer (vLLM 0.32 mamba2.py `Mamba2DecoderLayer`: `MambaMixer2` of
    the config's `intermediate_size`, else expand x hidden_size); transformers refuses a
    config whose heads x head_dim is not expand x hidden_size (`validate_architecture`)."""
    hidden, expand = _need(text, where, "hidden_size"), _need(text, where, "expand")
    heads, head_dim = _need(text, where, "num_heads"), _need(text, where, "head_dim")
    if heads * head_dim != expand * hidden:
        raise _err(
            f"{where}head_dim",
            f"{heads} heads of {head_dim} do not make expand x hidden_size {expand * hidden}",
            "fix the config (transformers refuses it)",
        )
    return StateShape(
        MAMBA2,
        heads=heads,
        head_dim=head_dim,
        state_size=_need(text, where, "state_size"),
        conv_kernel=_need(text, where, "conv_kernel"),
        groups=_need(text, where, "n_groups"),
        intermediate=_int(text, "intermediate_size") or expand * hidden,
    )


def _falcon_h1_state(text: Mapping[str, Any], where: str) -> StateShape:
    """Falcon-H1's Mamba-2 mixer (vLLM 0.32 falcon_h1.py `get_mamba_state_shape_from_config`):
    its inner size is `mamba_d_ssm`, or `mamba_expand x hidden_size` when that is null. The SSM
    state follows the model's dtype (no per-model `mamba_ssm_cache_dtype` in vLLM's config.py)."""
    intermediate = _int(text, "mamba_d_ssm")
    if intermediate is None:
        intermediate = _need(text, where, "mamba_expand") * _need(text, where, "hidden_size")
    heads = _need(text, where, "mamba_n_heads")
    head_dim = _int(text, "mamba_d_head")
    if head_dim is None and text.get("mamba_d_head") == "auto" and intermediate % heads == 0:
        head_dim = intermediate // heads
    # transformers refuses such a config (`validate_architecture`), so vLLM never loads it.
    if head_dim is None or heads * head_dim != intermediate:
        raise _err(
            f"{where}mamba_d_head",
            f"{heads} heads of {text.get('mamba_d_head')!r} do not make the Mamba inner size "
            f"{intermediate} (mamba_d_ssm, or mamba_expand x hidden_size)",
            "fix the config",
        )
    return StateShape(
        MAMBA2,
        heads=heads,
        head_dim=head_dim,
        state_size=_need(text, where, "mamba_d_state"),
        conv_kernel=_need(text, where, "mamba_d_conv"),
        groups=_need(text, where, "mamba_n_groups"),
        intermediate=intermediate,
    )


def _jamba_layers(
    text: Mapping[str, Any], where: str, *, layers: int, kv_heads: int
) -> tuple[AttentionLayer, ...]:
    """Jamba's layers as transformers' `layers_block_type` property gives them (a config cannot
    set it): attention where `i % attn_layer_period == attn_layer_offset`, Mamba-1 elsewhere.
    vLLM's attention there takes hidden_size / heads as its head size, whatever `head_dim`
    says."""
    period = _need(text, where, "attn_layer_period")
    offset = _int(text, "attn_layer_offset")
    if offset is None or not 0 <= offset < period:
        raise _err(
            f"{where}attn_layer_offset",
            f"must be from 0 to attn_layer_period - 1 ({period - 1})",
            "fix the config (transformers refuses it)",
        )
    hidden, heads = _need(text, where, "hidden_size"), _need(text, where, "num_attention_heads")
    state = _state_shape(text, "jamba", where)
    full = AttentionLayer(FULL, kv_heads, hidden // heads, hidden // heads)
    mamba = AttentionLayer(STATE, 0, 0, 0, state=state)
    return tuple(full if i % period == offset else mamba for i in range(layers))


def _lfm2_layers(
    text: Mapping[str, Any], text_type: str, where: str, *, layers: int, kv_heads: int
) -> tuple[AttentionLayer, ...]:
    """LFM2 (vLLM 0.32 lfm2.py, lfm2_moe.py): a layer is attention where `layer_types` says
    "full_attention", a ShortConv elsewhere. Lfm2Config derives the list from `full_attn_idxs`
    (every layer attention when both are missing); Lfm2MoeConfig derives nothing (vLLM indexes
    the list). The attention head is hidden / heads whatever `head_dim` says; the conv state
    `conv_dim` channels (LFM2-MoE: hidden_size) x (conv_L_cache - 1)."""
    given = text.get("layer_types")
    if isinstance(given, list) and given:
        types = [str(value) for value in given]
    elif text_type == "lfm2":
        idxs = text.get("full_attn_idxs")
        if idxs is not None and not (
            isinstance(idxs, list) and all(_int({"i": i}, "i") is not None for i in idxs)
        ):
            raise _err(f"{where}full_attn_idxs", "not a list of layer indices", "fix the config")
        attention = set(range(layers)) if idxs is None else {_int({"i": i}, "i") for i in idxs}
        types = ["full_attention" if i in attention else "conv" for i in range(layers)]
    else:
        raise _err(f"{where}layer_types", "missing (vLLM's Lfm2MoeModel reads every layer's type)")
    if len(types) != layers:
        raise _err(
            f"{where}layer_types",
            f"{len(types)} entries for num_hidden_layers {layers}",
            "fix the config (the two must agree)",
        )
    unknown = sorted(set(types) - {"full_attention", "conv"})
    if unknown:
        raise _err(
            f"{where}layer_types",
            f"layer type {unknown[0]!r} is not one the planner knows how vLLM sizes",
        )
    if "full_attention" not in types:
        raise _err(
            f"{where}layer_types",
            "no full_attention layer: vLLM serves it as a hybrid with prefix caching (2 state "
            "pages a request, unpadded), which the planner does not size",
        )
    hidden, heads = _need(text, where, "hidden_size"), _need(text, where, "num_attention_heads")
    if hidden % heads:
        raise _err(f"{where}hidden_size", f"{hidden} is not a multiple of {heads} heads")
    conv_dim = hidden if text_type == "lfm2_moe" else _need(text, where, "conv_dim")
    state = StateShape(
        SHORT_CONV,
        heads=1,
        head_dim=1,
        state_size=0,
        conv_kernel=_need(text, where, "conv_L_cache"),
        groups=1,
        intermediate=conv_dim,
    )
    full = AttentionLayer(FULL, kv_heads, hidden // heads, hidden // heads)
    conv = AttentionLayer(STATE, 0, 0, 0, state=state)
    return tuple(full if value == "full_attention" else conv for value in types)


def _ssm_cache_bytes(text: Mapping[str, Any], where: str) -> float | None:
    """Nemotron-H's SSM state element: vLLM 0.32 sets `mamba_ssm_cache_dtype` from the config
    (float32 when it says none: `NemotronHForCausalLMConfig`); None: the model's dtype."""
    value = str(text.get("mamba_ssm_cache_dtype") or "float32")
    if value == "auto":
        return None
    if value not in _TORCH_DTYPE_BYTES:
        raise _err(f"{where}mamba_ssm_cache_dtype", f"{value!r} is not a dtype vLLM takes")
    return float(_TORCH_DTYPE_BYTES[value])


def _nemotron_h_types(text: Mapping[str, Any], where: str) -> list[str] | None:
    """Nemotron-H's layers from `hybrid_override_pattern` (transformers reads the pattern, and
    the layer count from it, when `layers_block_type` is not given)."""
    pattern = text.get("hybrid_override_pattern")
    if not isinstance(pattern, str) or not pattern:
        return None
    unknown = sorted(set(pattern) - set(_NEMOTRON_H_PATTERN))
    if unknown:
        raise _err(
            f"{where}hybrid_override_pattern",
            f"layer letter {unknown[0]!r} is not one the planner knows how vLLM sizes",
        )
    return [_NEMOTRON_H_PATTERN[letter] for letter in pattern]


def _layer_count(text: Mapping[str, Any], text_type: str, where: str) -> int:
    """The decoder layers: Nemotron-H's are its layer list's (transformers ignores
    `num_hidden_layers` there), every other model's `num_hidden_layers`."""
    if text_type == "nemotron_h":
        given = text.get("layers_block_type") or text.get("layer_types")
        types = given if isinstance(given, list) and given else _nemotron_h_types(text, where)
        if types:
            return len(types)
    if text_type == "zamba2":
        return len(_zamba2_types(text, where))
    return _need(text, where, "num_hidden_layers", "n_layer", "num_layers")


def _state_hybrid_layers(
    text: Mapping[str, Any], text_type: str, where: str, *, layers: int, kv_heads: int, head: int
) -> tuple[AttentionLayer, ...]:
    """A Mamba or gated-delta-net hybrid's layers with a cache (transformers' default
    `layer_types`: Qwen3-Next every 4th layer full attention, Granite 4.0 every layer a state
    layer; Nemotron-H's pattern; Falcon-H1 an attention and a state layer per decoder layer;
    Jamba's period). Nemotron-H's MLP and MoE layers hold none: left out."""
    if text_type == "falcon_h1":
        # vLLM builds every layer as `FalconH1ParallelHybrid` (an `Attention` and a
        # `MambaMixer2`), whatever a layer list says; transformers' `layers_block_type` is a
        # property that says "hybrid" for each.
        state = _state_shape(text, text_type, where)
        full = AttentionLayer(FULL, kv_heads, head, head)
        return (full, AttentionLayer(STATE, 0, 0, 0, state=state)) * layers
    if text_type == "jamba":
        return _jamba_layers(text, where, layers=layers, kv_heads=kv_heads)
    if text_type in ("lfm2", "lfm2_moe"):
        return _lfm2_layers(text, text_type, where, layers=layers, kv_heads=kv_heads)
    if text_type == "zamba2":
        return _zamba2_layers(text, where, kv_heads=kv_heads, head=head)
    return _listed_hybrid_layers(
        text, text_type, where, layers=layers, kv_heads=kv_heads, head=head
    )


def _hybrid_layer_kinds(
    text: Mapping[str, Any], text_type: str, where: str, layers: int
) -> list[str]:
    """A hybrid's layer kinds from its list, Nemotron-H's pattern, or transformers' default
    for the model type (a gated-delta-net model: every 4th layer full attention)."""
    given = text.get("layer_types") or text.get("layers_block_type")
    if isinstance(given, list) and given:
        return [str(value) for value in given]
    if text_type == "nemotron_h":
        pattern = _nemotron_h_types(text, where)
        if pattern is None:
            raise _err(f"{where}hybrid_override_pattern", "missing (and no layers_block_type)")
        return pattern
    if text_type not in _GATED_DELTA_NET_HYBRIDS:
        return ["linear_attention"] * layers
    interval = _int(text, "full_attention_interval") or 4
    types = [
        "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)
    ]
    if text_type == "olmo_hybrid" and "full_attention" not in types:
        # OlmoHybridConfig: at least one full-attention layer, the last.
        types[-1] = "full_attention"
    return types


def _listed_hybrid_layers(
    text: Mapping[str, Any], text_type: str, where: str, *, layers: int, kv_heads: int, head: int
) -> tuple[AttentionLayer, ...]:
    """Granite 4.0, Qwen3-Next, Qwen3.5, OLMo Hybrid and Nemotron-H: one kind a layer
    (`_hybrid_layer_kinds`)."""
    types = _hybrid_layer_kinds(text, text_type, where, layers)
    if len(types) != layers:
        raise _err(
            f"{where}layer_types",
            f"{len(types)} entries for num_hidden_layers {layers}",
            "fix the config (the two must agree)",
        )
    state = _state_shape(text, text_type, where)
    out: list[AttentionLayer] = []
    for value in types:
        if value in _CACHELESS_LAYER_TYPES and text_type == "nemotron_h":
            continue
        if value in _STATE_LAYER_TYPES:
            out.append(AttentionLayer(STATE, 0, 0, 0, state=state))
        elif value in _FULL_LAYER_TYPES:
            out.append(AttentionLayer(FULL, kv_heads, head, head))
        else:
            raise _err(
                f"{where}layer_types",
                f"layer type {value!r} is not one the planner knows how vLLM sizes",
            )
    return tuple(out)


def _attention_layers(
    text: Mapping[str, Any], text_type: str, where: str, *, layers: int, kv_heads: int, head: int
) -> tuple[AttentionLayer, ...]:
    if text_type in _STATE_HYBRIDS:
        return _state_hybrid_layers(
            text, text_type, where, layers=layers, kv_heads=kv_heads, head=head
        )
    if text_type in _MLA_TYPES and _int(text, "kv_lora_rank"):
        rank = _need(text, where, "kv_lora_rank")
        rope = _need(text, where, "qk_rope_head_dim")
        return (AttentionLayer(MLA, 1, rank + rope, 0),) * layers
    types = _layer_types(text, text_type, layers)
    if len(types) != layers:
        raise _err(
            f"{where}layer_types",
            f"{len(types)} entries for num_hidden_layers {layers}",
            "fix the config (the two must agree)",
        )
    window = _int(text, "sliding_window")
    chunk = _int(text, "attention_chunk_size")
    out: list[AttentionLayer] = []
    for value in types:
        if value == "full_attention":
            out.append(AttentionLayer(FULL, kv_heads, head, head))
        elif value == "sliding_attention":
            if not window:
                raise _err(f"{where}sliding_window", "sliding layers but no window")
            out.append(AttentionLayer(SLIDING, kv_heads, head, head, window))
        elif value == "chunked_attention":
            if not chunk:
                raise _err(f"{where}attention_chunk_size", "chunked layers but no chunk size")
            out.append(AttentionLayer(CHUNKED, kv_heads, head, head, chunk))
        else:
            raise _err(
                f"{where}layer_types",
                f"layer type {value!r} is not one the planner knows how vLLM sizes",
            )
    return tuple(out)


def _dtype(config: Mapping[str, Any], text: Mapping[str, Any]) -> str:
    for source in (config, text):
        for key in ("torch_dtype", "dtype"):
            value = source.get(key)
            if isinstance(value, str) and value:
                return value.removeprefix("torch.")
    return "bfloat16"


def _check_sizes(dtype: str, quantization: str | None) -> None:
    """The checkpoint's dtype and quantization are ones the planner has bytes for: anything
    else is refused naming the field, never sized as if it were 16 bit."""
    try:
        weight_bytes_per_param("auto", quantization, dtype)
    except UnknownDtypeError as error:
        field = "quantization_config.quant_method" if is_quantized(quantization) else "torch_dtype"
        raise _err(field, f"{error}: the planner has no size for it") from None


def quantization_of(config: Mapping[str, Any], text: Mapping[str, Any]) -> str | None:
    """The checkpoint's quantization, as a ``--quantization`` name the planner has bytes for."""
    qc = config.get("quantization_config") or text.get("quantization_config")
    if not isinstance(qc, Mapping):
        return None
    method = str(qc.get("quant_method") or "").lower()
    if method in ("compressed-tensors", "compressed_tensors"):
        bits = [
            group.get("weights", {}).get("num_bits")
            for group in (qc.get("config_groups") or {}).values()
            if isinstance(group, Mapping) and isinstance(group.get("weights"), Mapping)
        ]
        return "w4a16" if bits and max(b or 16 for b in bits) <= 4 else "compressed-tensors"
    if method == "bitsandbytes":
        return "bitsandbytes-8bit" if qc.get("load_in_8bit") else "bitsandbytes"
    if method == "modelopt":
        algo = str(qc.get("quant_algo") or "").upper()
        return "modelopt_fp4" if "FP4" in algo else "modelopt"
    return method or None


def _mlp_params(text: Mapping[str, Any], text_type: str, hidden: int) -> tuple[int, int, bool]:
    """(parameters of all MLPs, of what one token passes through, MoE?) per layer on average."""
    matrices = 2 if text_type in _TWO_MATRIX_MLP else 3
    experts = _int(text, "num_local_experts", "num_experts", "n_routed_experts") or 0
    inter = _int(text, "intermediate_size") or 4 * hidden
    if experts <= 1:
        dense = matrices * hidden * inter
        return dense, dense, False
    expert_inter = _int(text, "moe_intermediate_size") or inter
    per_expert = matrices * hidden * expert_inter
    active = _int(text, "num_experts_per_tok", "moe_topk") or 1
    shared = 0
    if _int(text, "shared_expert_intermediate_size"):
        shared = matrices * hidden * (_int(text, "shared_expert_intermediate_size") or 0)
    elif _int(text, "n_shared_experts"):
        shared = (_int(text, "n_shared_experts") or 0) * per_expert
    router = hidden * experts
    return experts * per_expert + shared + router, active * per_expert + shared + router, True


def _attention_params(text: Mapping[str, Any], hidden: int, heads: int, kv: int, head: int) -> int:
    rank = _int(text, "kv_lora_rank")
    if rank:
        rope = _int(text, "qk_rope_head_dim") or 0
        nope = _int(text, "qk_nope_head_dim") or 0
        v_head = _int(text, "v_head_dim") or nope
        q_rank = _int(text, "q_lora_rank")
        q = (
            hidden * heads * (nope + rope)
            if not q_rank
            else q_rank * (hidden + heads * (nope + rope))
        )
        return q + hidden * (rank + rope) + rank * heads * (nope + v_head) + heads * v_head * hidden
    return hidden * heads * head + 2 * hidden * kv * head + heads * head * hidden


def _parameters(
    text: Mapping[str, Any], text_type: str, *, hidden: int, heads: int, kv: int, head: int
) -> tuple[int, int, bool]:
    """(total, active per token, MoE?) from the config's shapes: the fallback when the
    checkpoint's size is not known, and the active share for the throughput ceiling."""
    layers = _int(text, "num_hidden_layers") or 1
    vocab = _int(text, "vocab_size") or 0
    embedding = vocab * hidden
    head_params = 0 if text.get("tie_word_embeddings", False) else embedding
    attention = _attention_params(text, hidden, heads, kv, head)
    mlp_all, mlp_active, moe = _mlp_params(text, text_type, hidden)
    dense_layers = (
        min(layers, _int(text, "first_k_dense_replace", "num_dense_layers") or 0) if moe else 0
    )
    if moe and text_type == "jamba":
        # transformers' `layers_num_experts`: experts only where i % period == offset.
        period = _int(text, "expert_layer_period") or 2
        offset = _int(text, "expert_layer_offset")
        offset = 1 if offset is None else offset
        dense_layers = layers - sum(1 for i in range(layers) if i % period == offset)
    dense_mlp = (
        (2 if text_type in _TWO_MATRIX_MLP else 3)
        * hidden
        * (_int(text, "intermediate_size") or 4 * hidden)
    )
    body_all = layers * attention + dense_layers * dense_mlp + (layers - dense_layers) * mlp_all
    body_active = (
        layers * attention + dense_layers * dense_mlp + (layers - dense_layers) * mlp_active
    )
    return embedding + head_params + body_all, embedding + head_params + body_active, moe


def checkpoint_bytes_from_dtypes(counts: Mapping[str, int]) -> int:
    """Bytes of a checkpoint from its safetensors headers' element counts per dtype (packed
    int4 in I32/U8 counted at its storage size: exact)."""
    total = 0.0
    for dtype, count in counts.items():
        size = _SAFETENSORS_DTYPE_BYTES.get(dtype.upper())
        if size is None:
            raise ModelConfigError(f"safetensors header: unknown dtype {dtype!r}")
        total += size * count
    return int(total)


_TOTAL_SIZE = re.compile(r'"total_size"\s*:\s*(\d+)')


def total_size_from_index(text: str) -> int | None:
    """``metadata.total_size`` of a safetensors index, from its text or a prefix of it (the
    metadata comes first; a 100B model's index is megabytes of weight map after it)."""
    match = _TOTAL_SIZE.search(text)
    return int(match.group(1)) if match else None


def max_length(text: Mapping[str, Any], where: str, *, default: int | None = None) -> int:
    lengths = [v for v in (_int(text, key) for key in _LENGTH_KEYS) if v and v > 0]
    if not lengths:
        if default is not None:
            return default
        raise _err(f"{where}max_position_embeddings", "missing")
    return min(lengths)


def _state_model_facts(
    config: Mapping[str, Any],
    text: Mapping[str, Any],
    text_type: str,
    where: str,
    *,
    name: str,
    checkpoint_bytes: int | None,
    source: str,
) -> ModelArchitecture:
    """A pure state-space model (`_STATE_MODELS`): every layer a state layer, no attention
    heads (kv_heads and head_dim 0), its parameters from the checkpoint's size."""
    layers = _layer_count(text, text_type, where)
    hidden = _need(text, where, "hidden_size")
    state = _state_shape(text, text_type, where)
    dtype = _dtype(config, text)
    quantization = quantization_of(config, text)
    _check_sizes(dtype, quantization)
    if checkpoint_bytes is None:
        raise ModelConfigError(
            f"{INDEX_FILE}: missing; the weights of a state-space model ({text_type}) are "
            f"sized from its checkpoint, not its config; {FIX}"
        )
    if checkpoint_bytes <= 0:
        raise ModelConfigError(f"{INDEX_FILE}: metadata.total_size: not a positive size")
    # Unquantized: the checkpoint's bytes at its dtype; quantized: at the bytes per parameter
    # the planner has for the method (weights are sized from the bytes either way).
    element = (
        _TORCH_DTYPE_BYTES.get(dtype, 2)
        if quantization is None
        else weight_bytes_per_param("auto", quantization, dtype)
    )
    parameters = math.ceil(checkpoint_bytes / element)
    return ModelArchitecture(
        name=name,
        parameters=max(1, parameters),
        layers=layers,
        kv_heads=0,
        head_dim=0,
        max_position_embeddings=max_length(text, where, default=DEFAULT_MAX_MODEL_LEN),
        dtype=dtype,
        vocab_size=_int(text, "vocab_size"),
        default_quantization=quantization,
        attention_layers=(AttentionLayer(STATE, 0, 0, 0, state=state),) * layers,
        checkpoint_bytes=checkpoint_bytes,
        hidden_size=hidden,
        source=source,
        pipeline_parallel=_NO_PIPELINE_STAGES.get(text_type),
    )


def facts_from_config(
    config: Mapping[str, Any],
    *,
    name: str,
    checkpoint_bytes: int | None = None,
    source: str = "files",
) -> ModelArchitecture:
    """The planner's facts for a model from its parsed config.json and, when known, the bytes
    of its checkpoint. Raises ModelConfigError (file, field, fix) when it cannot be planned."""
    if not isinstance(config, Mapping):
        raise _err("(top level)", "not a JSON object", "is this the model's config.json?")
    _refuse_retired(config)
    text, text_type, where = text_config(config)
    _refuse_unknown(text, text_type, where)
    if text_type in _STATE_MODELS:
        return _state_model_facts(
            config,
            text,
            text_type,
            where,
            name=name,
            checkpoint_bytes=checkpoint_bytes,
            source=source,
        )
    layers = _layer_count(text, text_type, where)
    heads = _need(text, where, "num_attention_heads", "n_head")
    hidden = _need(text, where, "hidden_size", "n_embd", "d_model")
    kv_heads = (
        _int(text, "num_key_value_heads", "n_head_kv", "num_kv_heads", "multi_query_group_num")
        or heads
    )
    if kv_heads <= 0 or heads % kv_heads:
        raise _err(
            f"{where}num_key_value_heads",
            f"{kv_heads} does not divide num_attention_heads {heads}",
            "fix the config (grouped-query attention needs whole groups)",
        )
    head = _int(text, "head_dim", "hidden_size_per_head")
    if head is None:
        if hidden % heads:
            raise _err(
                f"{where}head_dim",
                f"missing, and hidden_size {hidden} is not a multiple of {heads} heads",
            )
        head = hidden // heads
    attention_layers = _attention_layers(
        text, text_type, where, layers=layers, kv_heads=kv_heads, head=head
    )
    mla = attention_layers[0].kind == MLA
    attention = next((x for x in attention_layers if x.kind != STATE), None)
    dtype = _dtype(config, text)
    quantization = quantization_of(config, text)
    _check_sizes(dtype, quantization)
    total, active, moe = _parameters(
        text, text_type, hidden=hidden, heads=heads, kv=kv_heads, head=head
    )
    element = _TORCH_DTYPE_BYTES.get(dtype, 2)
    if checkpoint_bytes is not None and checkpoint_bytes <= 0:
        raise ModelConfigError(f"{INDEX_FILE}: metadata.total_size: not a positive size")
    if checkpoint_bytes is None and any(x.kind == STATE for x in attention_layers):
        # The parameter count from shapes knows attention and MLP layers, not Mamba mixers.
        raise ModelConfigError(
            f"{INDEX_FILE}: missing; the weights of a Mamba or linear-attention hybrid "
            f"({text_type}) are sized from its checkpoint, not its config; {FIX}"
        )
    if checkpoint_bytes is not None and quantization is None:
        # An unquantized checkpoint's bytes are its parameters at its dtype: exact count.
        scale = checkpoint_bytes / element / total if total else 1.0
        total, active = math.ceil(checkpoint_bytes / element), math.ceil(active * scale)
    return ModelArchitecture(
        name=name,
        parameters=max(1, total),
        layers=layers,
        kv_heads=1 if mla else kv_heads,
        head_dim=attention.head_size if attention is not None else head,
        max_position_embeddings=max_length(text, where),
        dtype=dtype,
        attention=ATTENTION_MLA if mla else ATTENTION_GQA,
        kv_lora_rank=_int(text, "kv_lora_rank") if mla else None,
        qk_rope_head_dim=_int(text, "qk_rope_head_dim") if mla else None,
        attention_heads=heads,
        vocab_size=_int(text, "vocab_size"),
        sliding_window=next((x.window for x in attention_layers if x.kind == SLIDING), None),
        default_quantization=quantization,
        attention_layers=attention_layers,
        checkpoint_bytes=checkpoint_bytes,
        hidden_size=hidden,
        active_parameters=active if moe else None,
        moe=moe,
        source=source,
        pipeline_parallel=_NO_PIPELINE_STAGES.get(text_type),
        cpu_unsupported=_CPU_UNSUPPORTED.get(text_type),
    )


MAX_INDEX_PREFIX = 64 * 1024
"""The most of a safetensors index the planner reads: ``metadata`` comes first."""


@dataclass(frozen=True)
class ModelFiles:
    """A model's files as read (from a directory or the Hub at a commit), before parsing."""

    config_text: str | None
    """config.json's text; None when the revision has none."""
    index_text: str | None = None
    """The start of model.safetensors.index.json (None: no index, e.g. a single-file model)."""
    dtype_counts: Mapping[str, int] | None = None
    """Element counts per dtype from the safetensors headers, when read instead of an index."""
    revision: str | None = None
    """The commit they were read at (Hub), for messages and the cache key."""


def facts_from_files(files: ModelFiles, *, name: str, source: str) -> ModelArchitecture:
    """Parse and read ``files`` (see ``facts_from_config``); errors name the file and field."""
    at = f" at {files.revision[:12]}" if files.revision else ""
    if files.config_text is None:
        raise ModelConfigError(
            f"{CONFIG_FILE}: no such file in {name}{at}; point spec.model.revision at a commit "
            "that has one, or set spec.model.architecture"
        )
    try:
        config = json.loads(files.config_text)
    except ValueError as error:
        raise ModelConfigError(f"{CONFIG_FILE}: not valid JSON ({error}); {FIX}") from None
    checkpoint: int | None = None
    if files.dtype_counts:
        checkpoint = checkpoint_bytes_from_dtypes(files.dtype_counts)
    elif files.index_text is not None:
        checkpoint = total_size_from_index(files.index_text)
    return facts_from_config(config, name=name, checkpoint_bytes=checkpoint, source=source)
