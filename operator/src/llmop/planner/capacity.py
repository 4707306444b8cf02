"""Capacity planning: will a model fit a GPU under given vLLM settings, and how much KV cache?

Pure functions: values in, values out. The model follows how vLLM sizes its KV cache
(vllm-contract.md §8.1) and DESIGN.md §6::

    requested   = GPU memory x gpu_memory_utilization          (vLLM request_memory())
    weights     = parameters x bytes/param / TP                 (per GPU)
                  with PP > 1 stages: (body / PP + one vocab x hidden matrix) / TP
    overhead    = non-torch + activation peak + CUDA graphs     (per GPU)
    KV memory   = requested - weights - overhead
    KV tokens   = ⌊KV memory / (block_size x KV bytes per token per GPU)⌋ x block_size

It does not fit when the weights (plus overhead) exceed the requested memory, or when KV tokens
< max_model_len (vLLM refuses to start: ``_check_enough_kv_cache_memory``).

Calibration (the constants below). Real vLLM numbers for Llama-3.1-8B-Instruct bf16 on one
H100-80GB (79.18 GiB), gpu_memory_utilization 0.9, H100 defaults (max_num_seqs 1024,
max_num_batched_tokens 8192):

* llm-d/llm-d-benchmark ``config_explorer/empirical-vllm-memory-results.md`` (vLLM 0.11.0, real
  DEBUG logs): weights 14.99 GiB, activation peak 4.76, non-torch 0.13, CUDA graphs not yet
  subtracted in that version → "Available KV cache memory: 51.38 GiB" = 420,896 tokens
  (16-token blocks).
  The same file: Llama-3.3-70B-FP8 TP=2 non-torch 0.55 GiB, activation 4.84 GiB; Qwen3
  activation 5.56-5.64 GiB (bigger vocabulary).
* Newer vLLM (≥ 0.21, CUDA-graph memory estimated and subtracted) logs a much smaller
  activation peak: "torch peak memory increase: 1.21GiB", non-torch 0.32 GiB, graphs ≈ 1 GiB,
  "Available KV cache memory: 55.05 GiB", "GPU KV cache size: 450,816 tokens" at utilization
  0.92 (vLLM startup walk-through quoted in a public course text; parse_log.py in another
  public repo quotes "Estimated CUDA graph memory: 0.84 GiB total" for the same model).

This planner gives 433,744 tokens for that setup (52.95 GiB): +3.1 % against the measured
0.11.0 figure (420,896 tokens); at utilization 0.92 it gives 446,704 tokens, -0.9 % against
450,816 (tests/unit/test_planner.py pins both).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from llmop.planner.dtypes import (
    dtype_bytes,
    kv_cache_bytes_per_element,
    resolve_dtype,
    weight_bytes_per_param,
)
from llmop.planner.gpus import gpus_per_node, lookup_gpu
from llmop.planner.models import ModelArchitecture

GIB = 1024**3

BLOCK_SIZE = 16
"""vLLM's default KV block size in tokens (CacheConfig.DEFAULT_BLOCK_SIZE, contract §4)."""

NON_TORCH_GIB = 0.25
"""CUDA context growth, cuBLAS/attention workspaces outside the torch allocator, at TP=1.
Measured 0.13 GiB (vLLM 0.11, llm-d empirical results) and 0.32 GiB (newer walk-through)."""

NCCL_GIB = 0.4
"""Extra non-torch memory with TP > 1 (NCCL buffers, custom all-reduce): llm-d measured 0.55 GiB
at TP=2 against 0.13-0.14 at TP=1."""

ACTIVATION_BASE_GIB = 0.25
"""Activation peak that does not scale with the vocabulary (hidden states, MLP intermediates of
the profiling batch, sampler buffers)."""

LOGITS_BYTES = 2
"""The activation peak is dominated by logits of the profiling batch: max_num_batched_tokens x
vocab. vLLM 0.11 measured ≈ 4.4 bytes per logit (fp32 copies: 8B 4.76 GiB, Qwen3 5.6 GiB,
gpt-oss 7.4 GiB scale with vocab); newer releases ≈ 0.6. We charge one bf16 tensor (2 bytes),
which lands between the two generations (see the module docstring)."""

DEFAULT_VOCAB = 128256
"""Vocabulary assumed when the architecture does not say (CR override): Llama 3's."""

CUDA_GRAPH_GIB = 0.9
"""CUDA-graph memory vLLM (≥ 0.21) estimates and subtracts before sizing the KV cache; zero with
--enforce-eager. Observed 0.84 GiB estimated / 0.94 GiB captured for an 8B model on H100."""

MIN_SUGGESTED_MAX_MODEL_LEN = 1024
"""Below this a shorter context is not a useful fix."""

SUGGESTED_UTILIZATION = 0.95
"""Highest gpuMemoryUtilization we propose on our own (the CRD allows up to 0.98)."""

REASON_FITS = "Fits"
REASON_WEIGHTS = "WeightsExceedMemory"
REASON_KV = "KVCacheTooSmall"
REASON_INVALID_TP = "InvalidTensorParallelSize"
REASON_INVALID_PP = "InvalidPipelineParallelSize"


@dataclass(frozen=True)
class PlanRequest:
    """Engine settings to plan for; field names follow the vLLM flags."""

    architecture: ModelArchitecture
    gpu_memory_gib: float
    """Total memory of one GPU as torch reports it (see gpus.py)."""
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    """Pods (pipeline stages) per replica, each with tensor_parallel_size GPUs."""
    dtype: str = "auto"
    quantization: str | None = None
    """None → the checkpoint's own (``architecture.default_quantization``)."""
    kv_cache_dtype: str = "auto"
    max_model_len: int | None = None
    """None → ``architecture.max_position_embeddings``."""
    gpu_memory_utilization: float = 0.9
    enforce_eager: bool = False
    max_num_seqs: int | None = None
    """None → vLLM's hardware default (contract §4: 1024 on ≥70 GiB non-A100, else 256)."""
    max_num_batched_tokens: int | None = None
    """None → vLLM's hardware default (16384 on ≥160 GiB, 8192 on ≥70 GiB non-A100, else 2048)."""
    gpu_product: str | None = None
    """GFD product label, for messages and the A100 batch-default rule."""
    gpus_per_node: int | None = None
    """The most GPUs one pod can have (one node's); None → the product's in the catalog (8)."""
    max_loras: int = 0
    """LoRA slots (`--max-loras`; 0: LoRA off). vLLM allocates every slot at start."""
    max_lora_rank: int = 0
    """Rank each slot is sized for (`--max-lora-rank`)."""


@dataclass(frozen=True)
class CapacityPlan:
    """The planner's verdict for one replica (one vLLM engine on tensor_parallel_size GPUs)."""

    weights_gib_per_gpu: float
    weights_gib_total: float
    kv_bytes_per_token: int
    """KV-cache bytes one token takes on each GPU."""
    overhead_gib_per_gpu: float
    kv_cache_gib_per_gpu: float
    """Memory left for the KV cache on each GPU (0 when nothing is left)."""
    kv_cache_tokens: int
    """Tokens the replica's KV cache holds (each TP rank holds its slice of every token)."""
    max_concurrency: float
    """kv_cache_tokens / max_model_len: full-length sequences that fit at once."""
    max_model_len: int
    fits: bool
    reason: str
    message: str
    suggestions: tuple[str, ...] = ()
    shortfall_gib_per_gpu: float = 0.0
    """When it does not fit for memory: what each GPU lacks for the weights, overhead and one
    sequence of max_model_len (0 when it fits)."""
    max_num_seqs: int | None = None
    """The batch the engine runs with: the request's, else vLLM's default for the GPU (None:
    not planned for, the CPU engine)."""


def _batch_defaults(request: PlanRequest) -> tuple[int, int]:
    """vLLM's default (max_num_seqs, max_num_batched_tokens) for ``vllm serve`` on this GPU."""
    product = request.gpu_product or ""
    gpu = lookup_gpu(product) if product else None
    is_a100 = (gpu is not None and gpu.vllm_a100) or "A100" in product.upper()
    if request.gpu_memory_gib >= 160:
        return 1024, 16384
    if request.gpu_memory_gib >= 70 and not is_a100:
        return 1024, 8192
    return 256, 2048


def kv_bytes_per_token_per_gpu(
    arch: ModelArchitecture, tensor_parallel_size: int, kv_element_bytes: float
) -> int:
    """KV-cache bytes per token on each GPU (contract §8.2).

    GQA/MHA: K and V for this rank's KV heads in every layer; with TP > kv_heads vLLM replicates
    heads so each rank keeps at least one. MLA: one latent of kv_lora_rank + qk_rope_head_dim
    per layer, replicated on every rank.
    """
    if arch.is_mla:
        assert arch.kv_lora_rank is not None
        assert arch.qk_rope_head_dim is not None
        latent = arch.kv_lora_rank + arch.qk_rope_head_dim
        return int(arch.layers * latent * kv_element_bytes)
    heads_per_rank = max(1, arch.kv_heads // tensor_parallel_size)
    return int(2 * arch.layers * heads_per_rank * arch.head_dim * kv_element_bytes)


def kv_layers_per_stage(arch: ModelArchitecture, pipeline_parallel_size: int) -> int:
    """Layers the fullest pipeline stage holds: vLLM splits them as evenly as it can."""
    return -(-arch.layers // pipeline_parallel_size)


def _embedding_params(arch: ModelArchitecture) -> int:
    """Parameters of one vocab x hidden matrix (the embedding, or the untied LM head). hidden is
    heads x head_dim where the catalog has both (Llama, Qwen); 0 otherwise (MLA models, where
    it is under 1 % of the weights), which spreads those weights over the stages."""
    if arch.is_mla or arch.attention_heads is None:
        return 0
    return (arch.vocab_size or DEFAULT_VOCAB) * arch.attention_heads * arch.head_dim


def lora_slots_gib_per_gpu(request: PlanRequest, layers: int, element_bytes: float) -> float:
    """Memory of the LoRA slots on one GPU: vLLM 0.32 allocates, per slot, A [rank, in] and
    B [out, rank] for each of the seven projections of every layer it holds (q, k, v, o, gate,
    up, down), whatever the adapters target, sharded by tensor parallelism. Per layer that is
    rank x (9 hidden + 2 kv_dim + 3 intermediate) elements. hidden is heads x head_dim; the
    intermediate size is what the layer's parameters leave after the attention projections
    (the catalog has no field for it), so the figure is an estimate within a few percent for
    Llama-like models. 0 when LoRA is off or hidden is unknown (MLA)."""
    arch = request.architecture
    if request.max_loras <= 0 or request.max_lora_rank <= 0:
        return 0.0
    if arch.is_mla or arch.attention_heads is None:
        return 0.0
    hidden = arch.attention_heads * arch.head_dim
    kv_dim = arch.kv_heads * arch.head_dim
    per_layer_params = max(0.0, (arch.parameters - 2 * _embedding_params(arch)) / arch.layers)
    attention = 2 * hidden * hidden + 2 * hidden * kv_dim
    intermediate = max(0.0, (per_layer_params - attention) / (3 * hidden))
    per_layer = 9 * hidden + 2 * kv_dim + 3 * intermediate
    elements = request.max_loras * request.max_lora_rank * layers * per_layer
    return elements * element_bytes / request.tensor_parallel_size / GIB


def stage_parameters(arch: ModelArchitecture, pipeline_parallel_size: int) -> float:
    """Parameters of the heaviest pipeline stage. The first stage carries the embedding and the
    last the LM head, each on top of its share of the layers, so it is the body's share plus one
    vocab x hidden matrix; with one stage it is all of them."""
    if pipeline_parallel_size == 1:
        return float(arch.parameters)
    embedding = min(_embedding_params(arch), arch.parameters // 2)
    body = arch.parameters - 2 * embedding
    return body / pipeline_parallel_size + embedding


def _fmt_gib(value: float) -> str:
    return f"{value:.2f} GiB"


def _plan_core(request: PlanRequest) -> CapacityPlan:  # noqa: C901, PLR0915
    """Plan without suggestions (the suggestion search calls this repeatedly)."""
    arch = request.architecture
    tp = request.tensor_parallel_size
    pp = request.pipeline_parallel_size
    if tp < 1:
        raise ValueError("tensor_parallel_size must be at least 1")
    if pp < 1:
        raise ValueError("pipeline_parallel_size must be at least 1")
    if request.gpu_memory_gib <= 0:
        raise ValueError("gpu_memory_gib must be positive")
    if not 0 < request.gpu_memory_utilization <= 1:
        raise ValueError("gpu_memory_utilization must be in (0, 1]")

    quantization = request.quantization
    if quantization is None:
        quantization = arch.default_quantization
    max_model_len = request.max_model_len or arch.max_position_embeddings
    default_seqs, default_tokens = _batch_defaults(request)
    max_num_seqs = request.max_num_seqs or default_seqs
    batched_tokens = request.max_num_batched_tokens or default_tokens
    # vLLM clamps the scheduler budget to what max_num_seqs full sequences could use.
    batched_tokens = min(batched_tokens, max_num_seqs * max_model_len)

    bytes_per_param = weight_bytes_per_param(request.dtype, quantization, arch.dtype)
    weights_total = arch.parameters * bytes_per_param / GIB
    weights_per_gpu = stage_parameters(arch, pp) * bytes_per_param / GIB / tp

    kv_element = kv_cache_bytes_per_element(request.kv_cache_dtype, request.dtype, arch.dtype)
    # Each stage keeps KV only for its own layers.
    stage_arch = replace(arch, layers=kv_layers_per_stage(arch, min(pp, arch.layers)))
    kv_per_token = kv_bytes_per_token_per_gpu(stage_arch, tp, kv_element)

    vocab = arch.vocab_size or DEFAULT_VOCAB
    activation = ACTIVATION_BASE_GIB + batched_tokens * vocab * LOGITS_BYTES / GIB
    non_torch = NON_TORCH_GIB + (NCCL_GIB if tp * pp > 1 else 0.0)
    graphs = 0.0 if request.enforce_eager else CUDA_GRAPH_GIB
    # LoRA weights take the activation/weight dtype (vLLM's --lora-dtype auto).
    compute_bytes = dtype_bytes(resolve_dtype(request.dtype, arch.dtype))
    lora = lora_slots_gib_per_gpu(request, stage_arch.layers, compute_bytes)
    overhead = activation + non_torch + graphs + lora

    requested = request.gpu_memory_gib * request.gpu_memory_utilization
    kv_gib = requested - weights_per_gpu - overhead
    page_bytes = kv_per_token * BLOCK_SIZE
    blocks = int(kv_gib * GIB // page_bytes) if kv_gib > 0 else 0
    kv_tokens = blocks * BLOCK_SIZE
    concurrency = kv_tokens / max_model_len
    # What one full-length sequence needs on each GPU beyond what is left (rounded up to blocks).
    needed_kv_gib = -(-max_model_len // BLOCK_SIZE) * page_bytes / GIB
    shortfall = max(0.0, needed_kv_gib - kv_gib)

    where = f"{tp}x {request.gpu_product or 'GPU'} ({request.gpu_memory_gib:.2f} GiB each)"
    if pp > 1:
        where = f"{pp} pods x {where}"
    model = arch.name or "the model"
    lora_note = f" (LoRA slots {_fmt_gib(lora)})" if lora > 0 else ""
    numbers = (
        f"weights {_fmt_gib(weights_per_gpu)}/GPU, runtime overhead {_fmt_gib(overhead)}/GPU"
        f"{lora_note}, "
        f"usable {_fmt_gib(requested)}/GPU at gpuMemoryUtilization "
        f"{request.gpu_memory_utilization:g}"
    )
    heads = arch.attention_heads
    if pp > arch.layers:
        reason = REASON_INVALID_PP
        fits = False
        message = (
            f"pipelineParallelSize {pp} exceeds the {arch.layers} layers of {model}; each "
            "pipeline stage needs at least one layer."
        )
    elif heads is not None and heads % tp != 0:
        reason = REASON_INVALID_TP
        fits = False
        message = (
            f"tensorParallelSize {tp} does not divide the {heads} attention heads of {model}; "
            "vLLM refuses to start."
        )
    elif weights_per_gpu + overhead >= requested:
        reason = REASON_WEIGHTS
        fits = False
        message = (
            f"{model} does not fit on {where}: {numbers} — nothing is left for the KV cache; "
            f"each GPU is short by {_fmt_gib(shortfall)} for one sequence of maxModelLen "
            f"{max_model_len:,}."
        )
    elif kv_tokens < max_model_len:
        reason = REASON_KV
        fits = False
        message = (
            f"{model} on {where}: the KV cache holds {kv_tokens:,} tokens "
            f"({_fmt_gib(kv_gib)}/GPU) but one sequence of maxModelLen {max_model_len:,} needs "
            f"{max_model_len:,} ({_fmt_gib(shortfall)}/GPU more); vLLM refuses to start "
            f"({numbers})."
        )
    else:
        reason = REASON_FITS
        fits = True
        message = (
            f"{model} fits on {where}: KV cache {kv_tokens:,} tokens ({_fmt_gib(kv_gib)}/GPU), "
            f"{concurrency:.1f} concurrent sequences at maxModelLen {max_model_len:,} ({numbers})."
        )

    return CapacityPlan(
        weights_gib_per_gpu=weights_per_gpu,
        weights_gib_total=weights_total,
        kv_bytes_per_token=kv_per_token,
        overhead_gib_per_gpu=overhead,
        kv_cache_gib_per_gpu=max(kv_gib, 0.0),
        kv_cache_tokens=kv_tokens,
        max_concurrency=concurrency,
        max_model_len=max_model_len,
        fits=fits,
        reason=reason,
        message=message,
        shortfall_gib_per_gpu=(
            0.0 if reason in (REASON_FITS, REASON_INVALID_TP, REASON_INVALID_PP) else shortfall
        ),
        max_num_seqs=max_num_seqs,
    )


def round_max_model_len(limit: int) -> int | None:
    """Largest "round" context ≤ limit: a power of two or 1.5x one (8192, 12288, 16384, …)."""
    best: int | None = None
    power = MIN_SUGGESTED_MAX_MODEL_LEN
    while power <= limit:
        best = power
        if power * 3 // 2 <= limit:
            best = power * 3 // 2
        power *= 2
    return best


def _fitting_max_model_len(request: PlanRequest, plan: CapacityPlan) -> int | None:
    """Largest round maxModelLen below the current one that fits, if weights fit at all."""
    if plan.reason != REASON_KV or plan.kv_cache_tokens < MIN_SUGGESTED_MAX_MODEL_LEN:
        return None
    limit = min(plan.kv_cache_tokens, plan.max_model_len - 1)
    candidate = round_max_model_len(limit)
    while candidate is not None:
        if _plan_core(replace(request, max_model_len=candidate)).fits:
            return candidate
        candidate = round_max_model_len(candidate - 1)
    return None


def _with_context_fix(request: PlanRequest, text: str) -> str | None:
    """``text`` if the changed request fits; ``text`` + a maxModelLen when only that is missing."""
    plan = _plan_core(request)
    if plan.fits:
        return text
    length = _fitting_max_model_len(request, plan)
    if length is None:
        return None
    return f"{text} and engine.maxModelLen: {length}"


def _node_gpus(request: PlanRequest) -> int:
    return request.gpus_per_node or gpus_per_node(request.gpu_product)


def _tensor_parallel_sizes(request: PlanRequest) -> list[int]:
    """Tensor-parallel sizes vLLM accepts for the model that one pod can have: a pod's GPUs are
    on one node, so never more than a node has."""
    heads = request.architecture.attention_heads
    return [
        size
        for size in (1, 2, 4, 8, 16, 32, 64)
        if size <= _node_gpus(request) and (heads is None or heads % size == 0)
    ]


MAX_SUGGESTED_PIPELINE_PARALLEL = 8
"""Most pods per replica the planner proposes on its own (the CRD allows 64)."""


def _pipeline_fix(request: PlanRequest, sizes: list[int]) -> str | None:
    """When no TP on one node holds the model, the fewest pods (PP) with TP = a whole node."""
    if request.pipeline_parallel_size > 1 or not sizes:
        return None
    node_tp = max(sizes)
    if _plan_core(replace(request, tensor_parallel_size=node_tp)).fits:
        return None
    for pp in range(2, min(MAX_SUGGESTED_PIPELINE_PARALLEL, request.architecture.layers) + 1):
        text = (
            f"engine.pipelineParallelSize: {pp} with engine.tensorParallelSize: {node_tp} and "
            f"resources.gpus: {node_tp} ({pp} pods × {node_tp} GPUs per replica)"  # noqa: RUF001
        )
        changed = replace(request, tensor_parallel_size=node_tp, pipeline_parallel_size=pp)
        if _plan_core(changed).fits:
            return text
    return None


def suggest_fixes(request: PlanRequest, limit: int = 5) -> tuple[str, ...]:  # noqa: C901, PLR0912
    """The smallest changes that make ``request`` fit, cheapest first (pure: re-plans only).

    Order: raise gpuMemoryUtilization to 0.95, fp8 KV cache, a shorter maxModelLen (all free),
    then more GPUs per pod (tensor parallelism), then quantized weights. Each suggestion names
    the CR fields to change; changes that fit only together with a shorter context say so.
    """
    plan = _plan_core(request)
    if plan.fits:
        return ()
    arch = request.architecture
    out: list[str] = []

    def add(text: str | None) -> None:
        if text is not None and text not in out:
            out.append(text)

    if plan.reason != REASON_INVALID_TP:
        if request.gpu_memory_utilization < SUGGESTED_UTILIZATION:
            changed = replace(request, gpu_memory_utilization=SUGGESTED_UTILIZATION)
            if _plan_core(changed).fits:
                add(f"engine.gpuMemoryUtilization: {SUGGESTED_UTILIZATION}")
        kv_element = kv_cache_bytes_per_element(request.kv_cache_dtype, request.dtype, arch.dtype)
        if kv_element > 1 and _plan_core(replace(request, kv_cache_dtype="fp8")).fits:
            add("engine.kvCacheDtype: fp8")
        length = _fitting_max_model_len(request, plan)
        if length is not None:
            add(f"engine.maxModelLen: {length}")

    tp = request.tensor_parallel_size
    sizes = _tensor_parallel_sizes(request)
    if plan.reason == REASON_INVALID_TP:
        # Any valid size is a fix; the nearest ones (smaller first) are the cheapest.
        candidates = sorted(sizes, key=lambda size: (abs(size - tp), size))
    else:
        candidates = [size for size in sizes if size > tp]
    for candidate_tp in candidates:
        if candidate_tp == tp:
            continue
        text = (
            f"engine.tensorParallelSize: {candidate_tp} with resources.gpus: {candidate_tp} "
            f"({candidate_tp} GPU{'s' if candidate_tp > 1 else ''} per pod)"
        )
        result = _with_context_fix(replace(request, tensor_parallel_size=candidate_tp), text)
        if result is not None:
            add(result)
            # Stop at the first TP that fits without shortening the context; smaller ones that
            # need a shorter context were added before it.
            if result == text:
                break

    add(_pipeline_fix(request, sizes))

    quantization = request.quantization or arch.default_quantization
    current = weight_bytes_per_param(request.dtype, quantization, arch.dtype)
    if current > 1:
        add(_with_context_fix(replace(request, quantization="fp8"), "engine.quantization: fp8"))
    if current > 0.6:
        add(
            _with_context_fix(
                replace(request, quantization="awq"),
                "engine.quantization: awq (needs an AWQ int4 checkpoint as model.name)",
            )
        )
    return tuple(out[:limit])


def plan_capacity(request: PlanRequest) -> CapacityPlan:
    """Plan one replica; when it does not fit, ``suggestions`` lists the smallest fixes."""
    plan = _plan_core(request)
    if plan.fits:
        return plan
    message = plan.message
    sizes = _tensor_parallel_sizes(request)
    largest = max(sizes, default=1)
    if (
        plan.reason in (REASON_WEIGHTS, REASON_KV)
        and not _plan_core(replace(request, tensor_parallel_size=largest)).fits
    ):
        node_gpus = _node_gpus(request)
        message += (
            f" A pod's GPUs are on one node ({node_gpus} GPUs), and tensor parallelism up to "
            f"{largest} does not hold it at this precision and context either."
        )
    return replace(plan, message=message, suggestions=suggest_fixes(request))
