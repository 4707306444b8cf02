"""Capacity planning for vLLM's CPU build (`resources.gpus: 0`, backend vllm): pure.

On CPU the KV cache is not "what is left of the device": vLLM allocates exactly
`VLLM_CPU_KVCACHE_SPACE` GiB of it in host memory, next to the weights and the runtime of its
three processes (API server, EngineCore, worker). So the plan checks that budget against the
pod's memory limit rather than deriving it::

    needed    = weights + VLLM_CPU_KVCACHE_SPACE + runtime overhead
    budget    = pod memory x CPU_MEMORY_UTILIZATION
    KV tokens = ⌊KV bytes / (block_size x KV bytes per token)⌋ x block_size

It does not fit when `needed > budget` (the OOM killer ends the engine) or when KV tokens <
maxModelLen (vLLM refuses to start). Calibration: vllm-cpu 0.32.0 serving a 3.8 MB float32
model with `VLLM_CPU_KVCACHE_SPACE=1` and `--dtype float32` logs "CPU KV cache size: 524,288
tokens" (2 layers x 4 KV heads x 32 head dim x fp32 = 2,048 bytes per token: 1 GiB / 2,048
exactly), and 1,048,576 under `--dtype auto`, which computes it in bfloat16; its process tree
holds 4.2 GiB RSS (API server 1.0, EngineCore 1.0, worker 2.1 with the 1 GiB cache). A Mamba
or linear-attention hybrid is grouped as vLLM groups it (kv_layout.py, block 128), its tokens
those of vLLM 0.32's log line: max concurrency x maxModelLen. A pure Mamba model (no attention)
holds one state page per request: its tokens are the pages x maxModelLen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmop.planner.capacity import (
    GIB,
    REASON_FITS,
    REASON_KV,
    CapacityPlan,
    kv_bytes_per_token_per_gpu,
)
from llmop.planner.dtypes import (
    dtype_bytes,
    kv_cache_bytes_per_element,
    resolve_dtype,
    weight_bytes_per_param,
)
from llmop.planner.kv_layout import build_layout
from llmop.planner.models import ModelArchitecture

CPU_RUNTIME_OVERHEAD_GIB = 3.5
"""Memory of vLLM's CPU processes besides weights and KV cache: 4.2 GiB measured minus the 1 GiB
cache and the 3.8 MB model is 3.2 GiB (torch, compiled kernels, the profiling batch); rounded up."""
CPU_MEMORY_UTILIZATION = 0.9
"""Share of the pod's memory limit the engine may plan for; the rest is headroom before the OOM
killer (page cache of the weights, allocator fragmentation)."""
CPU_BLOCK_SIZE = 128
"""vLLM's CPU backend KV block size (`vllm:cache_config_info{block_size="128"}`)."""
DEFAULT_KV_SHARE = 0.5
"""Without an explicit `VLLM_CPU_KVCACHE_SPACE`, the share of the memory left after the runtime
that goes to the KV cache; the other half is for the weights (the renderer does not know them)."""

REASON_CPU_MEMORY = "CPUMemoryTooSmall"
REASON_CPU_UNSUPPORTED = "UnsupportedOnCPU"


def default_kv_cache_gib(memory_gib: float) -> int:
    """`VLLM_CPU_KVCACHE_SPACE` for a pod of `memory_gib` when the spec sets none: half of what
    the runtime leaves, whole GiB, at least 1 (vLLM's variable takes whole GiB)."""
    usable = memory_gib * CPU_MEMORY_UTILIZATION - CPU_RUNTIME_OVERHEAD_GIB
    return max(1, math.floor(usable * DEFAULT_KV_SHARE))


@dataclass(frozen=True)
class CpuPlanRequest:
    """One CPU engine: the model, the pod's memory limit and the KV budget it is given."""

    architecture: ModelArchitecture
    memory_gib: float
    kv_cache_gib: float
    dtype: str = "auto"
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    max_model_len: int | None = None


def plan_cpu_capacity(request: CpuPlanRequest) -> CapacityPlan:
    """Will the model, its KV budget and vLLM's runtime fit the pod's memory? (module docstring)"""
    arch = request.architecture
    if request.memory_gib <= 0:
        raise ValueError("memory_gib must be positive")
    quantization = request.quantization or arch.default_quantization
    max_model_len = request.max_model_len or arch.max_position_embeddings
    weights = arch.parameters * weight_bytes_per_param(request.dtype, quantization, arch.dtype)
    if arch.checkpoint_bytes is not None and request.quantization is None:
        weights = arch.checkpoint_bytes
    weights_gib = weights / GIB
    # Under --dtype auto the CPU build, like the GPU one, computes a float32 checkpoint in
    # bfloat16 (its first supported dtype): resolve_dtype's rule.
    kv_element = kv_cache_bytes_per_element(request.kv_cache_dtype, request.dtype, arch.dtype)
    kv_per_token = kv_bytes_per_token_per_gpu(arch, 1, kv_element)
    kv_gib = request.kv_cache_gib
    # (A state-space model has no per-token KV at all: sized by its layout below.)
    blocks = (
        int(kv_gib * GIB // (kv_per_token * CPU_BLOCK_SIZE)) if kv_gib > 0 and kv_per_token else 0
    )
    kv_tokens = blocks * CPU_BLOCK_SIZE
    concurrency = kv_tokens / max_model_len
    request_bytes = max_model_len * kv_per_token
    if arch.state_layers:
        # A Mamba or linear-attention hybrid, or a pure Mamba model: vLLM's groups (kv_layout),
        # and its 0.32 log line's tokens (max concurrency x max_model_len).
        # The conv state at the model's dtype; the SSM state in float32, which the CPU build
        # sets on every CPU with AVX512-BF16 ("Reset SSM cache type to float32"; elsewhere it
        # follows the model's dtype, so float32 errs on the safe side).
        conv = dtype_bytes(resolve_dtype(request.dtype, arch.dtype))
        layout = build_layout(
            arch.attention_layers,
            tensor_parallel_size=1,
            element_bytes=kv_element,
            block_size=CPU_BLOCK_SIZE,
            state_element_bytes=(conv, 4.0),
        )
        kv_per_token = layout.bytes_per_token
        blocks = layout.num_blocks(kv_gib * GIB)
        per_request = layout.blocks_per_request(max_model_len, 0)
        concurrency = blocks / per_request
        kv_tokens = int(concurrency * max_model_len) if blocks >= per_request else 0
        request_bytes = per_request * layout.page_bytes * layout.group_size
    needed = weights_gib + kv_gib + CPU_RUNTIME_OVERHEAD_GIB
    budget = request.memory_gib * CPU_MEMORY_UTILIZATION
    model = arch.name or "the model"
    numbers = (
        f"weights {weights_gib:.2f} GiB + KV cache {kv_gib:g} GiB (VLLM_CPU_KVCACHE_SPACE) + "
        f"runtime {CPU_RUNTIME_OVERHEAD_GIB:g} GiB = {needed:.2f} GiB of "
        f"{budget:.2f} GiB usable ({CPU_MEMORY_UTILIZATION:.0%} of resources.memory "
        f"{request.memory_gib:g} GiB)"
    )
    if arch.cpu_unsupported is not None:
        fits, reason = False, REASON_CPU_UNSUPPORTED
        message = (
            f"{model} cannot run on the CPU engine: {arch.cpu_unsupported}. Serve it on GPUs "
            "(spec.resources.gpus)."
        )
    elif needed > budget:
        memory = math.ceil(needed / CPU_MEMORY_UTILIZATION)
        fits, reason = False, REASON_CPU_MEMORY
        message = (
            f"{model} does not fit a CPU engine: {numbers}; the OOM killer would end it. Set "
            f"spec.resources.memory to at least {memory}Gi or lower VLLM_CPU_KVCACHE_SPACE."
        )
    elif kv_tokens < max_model_len:
        want = math.ceil(request_bytes / GIB)
        fits, reason = False, REASON_KV
        message = (
            f"{model} on CPU: the KV cache of {kv_gib:g} GiB holds {kv_tokens:,} tokens but one "
            f"sequence of maxModelLen {max_model_len:,} needs {max_model_len:,}; vLLM refuses to "
            f"start. Set VLLM_CPU_KVCACHE_SPACE to at least {want} (spec.engine.env) or lower "
            f"spec.engine.maxModelLen ({numbers})."
        )
    else:
        fits, reason = True, REASON_FITS
        message = (
            f"{model} fits a CPU engine: KV cache {kv_tokens:,} tokens, {concurrency:.1f} "
            f"concurrent sequences at maxModelLen {max_model_len:,} ({numbers})."
        )
    return CapacityPlan(
        weights_gib_per_gpu=weights_gib,
        weights_gib_total=weights_gib,
        kv_bytes_per_token=kv_per_token,
        overhead_gib_per_gpu=CPU_RUNTIME_OVERHEAD_GIB,
        kv_cache_gib_per_gpu=kv_gib,
        kv_cache_tokens=kv_tokens,
        max_concurrency=concurrency,
        max_model_len=max_model_len,
        fits=fits,
        reason=reason,
        message=message,
    )
