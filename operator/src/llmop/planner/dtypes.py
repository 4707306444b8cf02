"""Bytes per parameter and per KV-cache element for the dtypes and quantizations vLLM accepts.

The capacity planner needs two numbers: how many bytes one weight parameter takes on the GPU
(``--dtype`` / ``--quantization``) and how many bytes one KV-cache element takes
(``--kv-cache-dtype``). Both come from the flag values the CR passes through, so this module
only normalises strings; it knows nothing about models or GPUs.

Sources: DESIGN.md §6 (bf16/fp16 2, fp8/int8 1, int4 AWQ/GPTQ ≈ 0.55 incl. scales) and
/work/shared/reference/vllm-contract.md §4 and §8.2 (``--kv-cache-dtype`` choices; ``auto`` =
model dtype; fp8 variants = 1 byte).
"""

from __future__ import annotations

# Bytes per parameter for a plain torch dtype (``--dtype``). ``auto`` is resolved by the caller
# to the model's ``torch_dtype`` before it gets here. vLLM serves float32 checkpoints of most
# decoder LMs in 16 bit under ``auto``, but an explicit ``float32`` really costs 4 bytes.
_DTYPE_BYTES: dict[str, float] = {
    "bfloat16": 2.0,
    "bf16": 2.0,
    "float16": 2.0,
    "fp16": 2.0,
    "half": 2.0,
    "float32": 4.0,
    "fp32": 4.0,
    "float": 4.0,
}

# Bytes per parameter for a quantization method (``--quantization``). Int4 methods store 0.5
# bytes per weight plus per-group scales/zeros (group size 128 in fp16: +2x2/128 ≈ 0.03) and
# keep embeddings, norms and usually the LM head in 16 bit, which is what brings the average
# to ≈ 0.55 for a 7-70B model (DESIGN §6). FP8/INT8 per-channel or per-block scales are
# negligible (< 1 %).
INT4_BYTES_PER_PARAM = 0.55
_QUANT_BYTES: dict[str, float] = {
    "fp8": 1.0,
    "fbgemm_fp8": 1.0,
    "fp8_per_tensor": 1.0,
    "fp8_per_block": 1.0,
    "mxfp8": 1.0,
    "modelopt": 1.0,  # ModelOpt FP8 checkpoints
    "compressed-tensors": 1.0,  # most common compressed-tensors checkpoints are W8A8/FP8
    "compressed_tensors": 1.0,
    "int8": 1.0,
    "w8a8": 1.0,
    "experts_int8": 1.0,
    "bitsandbytes-8bit": 1.0,
    "awq": INT4_BYTES_PER_PARAM,
    "awq_marlin": INT4_BYTES_PER_PARAM,
    "gptq": INT4_BYTES_PER_PARAM,
    "gptq_marlin": INT4_BYTES_PER_PARAM,
    "gptq_marlin_24": INT4_BYTES_PER_PARAM,
    "marlin": INT4_BYTES_PER_PARAM,
    "int4": INT4_BYTES_PER_PARAM,
    "w4a16": INT4_BYTES_PER_PARAM,
    "bitsandbytes": INT4_BYTES_PER_PARAM,  # vLLM's in-flight bnb default is 4-bit (nf4)
    "bitsandbytes-4bit": INT4_BYTES_PER_PARAM,
    "gguf": INT4_BYTES_PER_PARAM,  # Q4_K_M-class files; Q8 GGUF would be ~1.07
    "modelopt_fp4": INT4_BYTES_PER_PARAM,
    "nvfp4": INT4_BYTES_PER_PARAM,
    "mxfp4": INT4_BYTES_PER_PARAM,
}

# Values meaning "no quantization" in CR fields and flags.
_NO_QUANT = frozenset({"", "none", "null", "no", "off"})

# ``--kv-cache-dtype`` values (vllm-contract.md §4: fp8, fp8_e4m3, fp8_e5m2, fp8_ds_mla, nvfp4,
# int8_per_token_head, …). The per-token-head variants add a small scale per token and head,
# which we ignore (< 2 % for head_dim 128).
_KV_BYTES: dict[str, float] = {
    "fp8": 1.0,
    "fp8_e4m3": 1.0,
    "fp8_e5m2": 1.0,
    "fp8_inc": 1.0,
    "fp8_ds_mla": 1.0,
    "int8": 1.0,
    "int8_per_token_head": 1.0,
    "fp8_per_token_head": 1.0,
    "nvfp4": 0.5,
    # An explicit plain dtype costs what the same dtype costs for weights.
    **_DTYPE_BYTES,
}


class UnknownDtypeError(ValueError):
    """A dtype, quantization or KV-cache dtype string the planner has no size for."""


def _norm(value: str) -> str:
    return value.strip().lower()


def is_quantized(quantization: str | None) -> bool:
    """Whether ``quantization`` names a method (not None / "" / "none")."""
    return quantization is not None and _norm(quantization) not in _NO_QUANT


def resolve_dtype(dtype: str, model_dtype: str) -> str:
    """The torch dtype vLLM computes in: ``auto`` means the model's ``torch_dtype``.

    vLLM maps a float32 checkpoint to 16 bit under ``auto`` (ModelConfig dtype resolution), so
    ``auto`` never yields float32 here.
    """
    resolved = _norm(model_dtype) if _norm(dtype) in {"", "auto"} else _norm(dtype)
    if _norm(dtype) in {"", "auto"} and resolved in {"float32", "fp32", "float"}:
        return "bfloat16"
    if resolved not in _DTYPE_BYTES:
        raise UnknownDtypeError(f"unknown dtype {dtype!r}")
    return resolved


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of a resolved torch dtype name (see :func:`resolve_dtype`)."""
    try:
        return _DTYPE_BYTES[_norm(dtype)]
    except KeyError:
        raise UnknownDtypeError(f"unknown dtype {dtype!r}") from None


def weight_bytes_per_param(dtype: str, quantization: str | None, model_dtype: str) -> float:
    """Average bytes one parameter takes on the GPU for ``--dtype`` and ``--quantization``."""
    if is_quantized(quantization):
        assert quantization is not None  # narrowed by is_quantized
        try:
            return _QUANT_BYTES[_norm(quantization)]
        except KeyError:
            raise UnknownDtypeError(f"unknown quantization {quantization!r}") from None
    return dtype_bytes(resolve_dtype(dtype, model_dtype))


def kv_cache_bytes_per_element(kv_cache_dtype: str, dtype: str, model_dtype: str) -> float:
    """Bytes per KV-cache element: ``auto`` follows the compute dtype (not the quantization)."""
    kv = _norm(kv_cache_dtype)
    if kv in {"", "auto"}:
        return dtype_bytes(resolve_dtype(dtype, model_dtype))
    try:
        return _KV_BYTES[kv]
    except KeyError:
        raise UnknownDtypeError(f"unknown kv cache dtype {kv_cache_dtype!r}") from None
