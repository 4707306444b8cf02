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
from llmop.planner.kv_layout import KVLayout, build_layout
from llmop.planner.models import ModelArchitecture
from llmop.planner.vllm_profile import VLLM_CURRENT, VllmProfile, profile_for

GIB = 1024**3

BLOCK_SIZE = 16
"""vLLM's default KV block size in tokens (CacheConfig.DEFAULT_BLOCK_SIZE, contract §4)."""

NON_TORCH_GIB = VLLM_CURRENT.non_torch_gib
"""CUDA context growth, cuBLAS/attention workspaces outside the torch allocator, at TP=1.
Measured 0.13 GiB (vLLM 0.11, llm-d empirical results) and 0.32 GiB (newer walk-through)."""

NCCL_GIB = VLLM_CURRENT.nccl_gib
"""Extra non-torch memory with TP > 1 (NCCL buffers, custom all-reduce): llm-d measured 0.55 GiB
at TP=2 against 0.13-0.14 at TP=1."""

ACTIVATION_BASE_GIB = VLLM_CURRENT.activation_base_gib
"""Activation peak that does not scale with the vocabulary (hidden states, MLP intermediates of
the profiling batch, sampler buffers)."""

LOGITS_BYTES = VLLM_CURRENT.logits_bytes
"""The activation peak is dominated by logits of the profiling batch: max_num_batched_tokens x
vocab. vLLM 0.11 measured ≈ 4.4 bytes per logit (fp32 copies: 8B 4.76 GiB, Qwen3 5.6 GiB,
gpt-oss 7.4 GiB scale with vocab); newer releases ≈ 0.6. We charge one bf16 tensor (2 bytes),
which lands between the two generations (see the module docstring)."""

DEFAULT_VOCAB = 128256
"""Vocabulary assumed when the architecture does not say (CR override): Llama 3's."""

CUDA_GRAPH_GIB = VLLM_CURRENT.cuda_graph_gib
"""CUDA-graph memory vLLM (≥ 0.21) estimates and subtracts before sizing the KV cache; zero with
--enforce-eager. Observed 0.84 GiB estimated / 0.94 GiB captured for an 8B model on H100."""

MXFP4_ALLOWANCE_GIB = 0.6
"""Per GPU beyond an MXFP4 checkpoint's share: vLLM 0.19 logged 7.01 GiB per GPU for gpt-oss-20b
at TP 2 against 6.41 GiB of checkpoint (llm-d-planner sweep, results_raw.csv @ d3121e05; the
reference calls the gap unexplained — one measurement, kept as an allowance)."""

_QUANT_FAMILY = {
    "awq_marlin": "awq",
    "gptq_marlin": "gptq",
    "compressed_tensors": "compressed-tensors",
    "w4a16": "compressed-tensors",
}

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
    vllm_version: str | None = None
    """The vLLM release the engine runs (vllm_profile.py); None: the engine image's."""


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
    max_num_batched_tokens: int | None = None
    """The scheduler's token budget per step vLLM will use (None: the CPU engine)."""
    kv_groups: int = 1
    """KV-cache groups vLLM makes (more than one for sliding-window/chunked hybrids)."""
    kv_blocks: int | None = None
    """Blocks in the KV pool (vLLM's num_gpu_blocks)."""
    vllm_profile: str = ""
    """The vLLM generation the arithmetic followed (vllm_profile.py)."""
    decode_ceiling_tokens_per_s: float | None = None
    """Output tokens/s one replica cannot exceed at its largest batch: memory bandwidth over the
    bytes read per decode step (active weights + every sequence's KV). A ceiling, not a
    forecast; None when the GPU's bandwidth is unknown or it does not fit."""
    decode_batch: int = 0
    """The batch the ceiling is computed at: min(max_num_seqs, max concurrency)."""
    active_weights_gib_per_gpu: float = 0.0
    """Weights each GPU reads per decode step (an MoE's active experts' share of its own)."""
    memory_bandwidth_gbs: float | None = None
    """The GPU's nameplate memory bandwidth (GB/s) the ceiling used (None: unknown, or it does
    not fit)."""


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


VOCAB_PADDING = 64
"""vLLM pads the vocabulary to a multiple of 64 before splitting it over TP ranks
(vocab_parallel_embedding.py DEFAULT_VOCAB_PADDING_SIZE)."""


def tensor_parallel_problem(arch: ModelArchitecture, tp: int) -> str | None:
    """Why vLLM refuses this TP for the model (None: it accepts it): TP must divide the
    attention heads and the padded vocabulary; KV heads are split or replicated whole."""
    heads = arch.attention_heads
    if heads is not None and heads % tp:
        return f"does not divide the {heads} attention heads"
    if arch.vocab_size:
        padded = -(-arch.vocab_size // VOCAB_PADDING) * VOCAB_PADDING
        if padded % tp:
            return f"does not divide the padded vocabulary of {padded:,}"
    if not arch.is_mla and arch.attention_heads is not None:
        kv = arch.kv_heads
        if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
            return f"does not split or replicate the {kv} KV heads evenly"
    for state in arch.state_layers[:1]:
        try:
            state.elements(tp)
        except ValueError as error:
            return f"does not divide the Mamba or linear-attention state ({error})"
    return None


def _same_quantization(runtime: str | None, checkpoint: str | None) -> bool:
    def family(value: str | None) -> str:
        norm = (value or "").strip().lower()
        return _QUANT_FAMILY.get(norm, norm) if norm not in {"", "none"} else ""

    return family(runtime) == family(checkpoint)


def _weights_gib(request: PlanRequest, quantization: str | None) -> tuple[float, float]:
    """(all weights, the heaviest GPU's share) in GiB. With the checkpoint's size known and the
    engine loading it as it is, the weights are those bytes (quantization scales included);
    otherwise parameters x bytes per parameter for the runtime dtype and quantization."""
    arch = request.architecture
    tp, pp = request.tensor_parallel_size, request.pipeline_parallel_size
    stage_share = stage_parameters(arch, pp) / arch.parameters
    as_stored = (
        arch.checkpoint_bytes is not None
        and _same_quantization(quantization, arch.default_quantization)
        and (
            request.dtype.strip().lower() in {"", "auto"}
            or arch.default_quantization is not None
            or dtype_bytes(resolve_dtype(request.dtype, arch.dtype))
            == dtype_bytes(resolve_dtype("auto", arch.dtype))
        )
    )
    if as_stored:
        assert arch.checkpoint_bytes is not None
        total = arch.checkpoint_bytes / GIB
        per_gpu = total * stage_share / tp
        if (quantization or "").lower() == "mxfp4":
            per_gpu += MXFP4_ALLOWANCE_GIB
        return total, per_gpu
    bytes_per_param = weight_bytes_per_param(request.dtype, quantization, arch.dtype)
    total = arch.parameters * bytes_per_param / GIB
    return total, stage_parameters(arch, pp) * bytes_per_param / GIB / tp


def _layout(
    arch: ModelArchitecture, stage_layers: int, tp: int, kv_element: float, state_element: float
) -> KVLayout | None:
    """vLLM's grouping of the first (fullest) stage's layers; None for catalog entries, which
    have no per-layer shapes (every layer full attention: the uniform formula). A Mamba or
    linear-attention state is kept at the model's dtype (`state_element` bytes; vLLM's
    `mamba_cache_dtype` auto), whatever the KV cache's."""
    if not arch.attention_layers:
        return None
    if arch.state_layers and tensor_parallel_problem(arch, tp) is not None:
        return None  # the plan is refused for it, with the reason
    # A hybrid's block size follows its attention and state shapes model-wide, and a stage may
    # hold no attention layer at all: sized as one stage with every layer (on the safe side).
    layers = arch.attention_layers if arch.state_layers else arch.attention_layers[:stage_layers]
    return build_layout(
        layers,
        tensor_parallel_size=tp,
        element_bytes=kv_element,
        block_size=BLOCK_SIZE,
        state_element_bytes=(state_element, state_element),
    )


def _overhead_gib(request: PlanRequest, profile: VllmProfile, batched_tokens: int) -> float:
    """Activation peak + non-torch + CUDA graphs per GPU, by the vLLM generation's constants."""
    arch = request.architecture
    tp, pp = request.tensor_parallel_size, request.pipeline_parallel_size
    vocab = arch.vocab_size or DEFAULT_VOCAB
    activation = profile.activation_base_gib + batched_tokens * vocab * profile.logits_bytes / GIB
    if arch.moe:
        activation += profile.moe_activation_gib
    multi_gpu = tp > 1 or (pp > 1 and profile.nccl_with_pipeline)
    non_torch = profile.non_torch_gib + (profile.nccl_gib if multi_gpu else 0.0)
    graphs = (
        profile.cuda_graph_gib
        if profile.subtracts_cuda_graphs and not request.enforce_eager
        else 0.0
    )
    return activation + non_torch + graphs


@dataclass(frozen=True)
class _KV:
    blocks: int
    tokens: int
    concurrency: float
    request_gib: float
    """What one sequence of max_model_len reserves on each GPU."""
    enough: bool
    groups: int


def _kv_capacity(
    layout: KVLayout | None,
    *,
    kv_gib: float,
    kv_per_token: int,
    max_model_len: int,
    reserve: int,
    profile: VllmProfile,
) -> _KV:
    """Blocks, tokens and concurrency of the KV memory left: the uniform formula for catalog
    entries, vLLM's per-layer-type grouping for facts read from the model's files."""
    if layout is None:
        page_bytes = kv_per_token * BLOCK_SIZE
        # (0 bytes a token: a state-space model whose TP is refused, so it has no layout.)
        blocks = int(kv_gib * GIB // page_bytes) if kv_gib > 0 and page_bytes else 0
        tokens = blocks * BLOCK_SIZE
        per_request = -(-max_model_len // BLOCK_SIZE)
        return _KV(
            blocks,
            tokens,
            tokens / max_model_len,
            per_request * page_bytes / GIB,
            tokens >= max_model_len,
            1,
        )
    blocks = layout.num_blocks(kv_gib * GIB)
    per_request = layout.blocks_per_request(max_model_len, reserve)
    concurrency = blocks / per_request
    if profile.logged_tokens_from_blocks:
        tokens = layout.logged_tokens_from_blocks(blocks)
    else:
        tokens = int(concurrency * max_model_len)
    return _KV(
        blocks,
        tokens,
        concurrency,
        per_request * layout.page_bytes * layout.group_size / GIB,
        blocks >= per_request,
        len(layout.groups),
    )


def _decode_ceiling(
    request: PlanRequest,
    *,
    weights_per_gpu: float,
    request_kv_gib: float,
    max_num_seqs: int,
    concurrency: float,
) -> tuple[float | None, int]:
    """(tokens/s, batch): at the largest batch the engine runs, each decode step reads every
    GPU's active weights once and each sequence's whole KV reserve; memory bandwidth bounds
    the step time from below, so this bounds throughput from above."""
    gpu = lookup_gpu(request.gpu_product) if request.gpu_product else None
    batch = min(max_num_seqs, int(concurrency))
    if gpu is None or not gpu.bandwidth_gbs or batch < 1:
        return None, max(batch, 0)
    step_bytes = (_active_weights(request, weights_per_gpu) + batch * request_kv_gib) * GIB
    return batch * gpu.bandwidth_gbs * 1e9 / step_bytes, batch


def _active_weights(request: PlanRequest, weights_per_gpu: float) -> float:
    """GiB of weights each GPU reads per decode step: an MoE reads its active experts only."""
    arch = request.architecture
    return weights_per_gpu * (arch.active_parameters or arch.parameters) / arch.parameters


def _bandwidth(request: PlanRequest) -> float | None:
    gpu = lookup_gpu(request.gpu_product) if request.gpu_product else None
    return gpu.bandwidth_gbs if gpu is not None and gpu.bandwidth_gbs else None


def cost_per_million_tokens(
    tokens_per_s: float, gpu_hour_price: float, gpus_per_replica: int
) -> float:
    """What a million output tokens cost at ``tokens_per_s`` for one replica's GPUs at
    ``gpu_hour_price`` per GPU-hour (a floor when tokens_per_s is the ceiling)."""
    return gpu_hour_price * gpus_per_replica / (tokens_per_s * 3600) * 1e6


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

    profile = profile_for(request.vllm_version)
    quantization = request.quantization
    if quantization is None:
        quantization = arch.default_quantization
    max_model_len = request.max_model_len or arch.max_position_embeddings
    default_seqs, default_tokens = _batch_defaults(request)
    max_num_seqs = request.max_num_seqs or default_seqs
    batched_tokens = request.max_num_batched_tokens or default_tokens
    # vLLM clamps the scheduler budget to what max_num_seqs full sequences could use.
    batched_tokens = min(batched_tokens, max_num_seqs * max_model_len)

    weights_total, weights_per_gpu = _weights_gib(request, quantization)

    kv_element = kv_cache_bytes_per_element(request.kv_cache_dtype, request.dtype, arch.dtype)
    # Each stage keeps KV only for its own layers.
    stage_layers = kv_layers_per_stage(arch, min(pp, arch.layers))
    stage_arch = replace(arch, layers=stage_layers)
    state_element = dtype_bytes(resolve_dtype(request.dtype, arch.dtype))
    layout = _layout(arch, stage_layers, tp, kv_element, state_element)
    kv_per_token = (
        layout.bytes_per_token
        if layout is not None
        else kv_bytes_per_token_per_gpu(stage_arch, tp, kv_element)
    )

    overhead = _overhead_gib(request, profile, batched_tokens)
    lora = lora_slots_gib_per_gpu(
        request, stage_arch.layers, dtype_bytes(resolve_dtype(request.dtype, arch.dtype))
    )
    overhead += lora

    requested = request.gpu_memory_gib * request.gpu_memory_utilization
    kv_gib = requested - weights_per_gpu - overhead
    kv = _kv_capacity(
        layout,
        kv_gib=kv_gib,
        kv_per_token=kv_per_token,
        max_model_len=max_model_len,
        reserve=profile.sliding_reserve_tokens(batched_tokens, pp),
        profile=profile,
    )
    blocks, kv_tokens, concurrency = kv.blocks, kv.tokens, kv.concurrency
    needed_kv_gib, enough, groups = kv.request_gib, kv.enough, kv.groups
    shortfall = max(0.0, needed_kv_gib - kv_gib)
    ceiling, batch = _decode_ceiling(
        request,
        weights_per_gpu=weights_per_gpu,
        request_kv_gib=needed_kv_gib,
        max_num_seqs=max_num_seqs,
        concurrency=concurrency,
    )

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
    if pp > arch.layers:
        reason = REASON_INVALID_PP
        fits = False
        message = (
            f"pipelineParallelSize {pp} exceeds the {arch.layers} layers of {model}; each "
            "pipeline stage needs at least one layer."
        )
    elif pp > 1 and arch.pipeline_parallel is not None:
        reason = REASON_INVALID_PP
        fits = False
        message = (
            f"vLLM's {arch.pipeline_parallel} ({model}) does not support pipeline parallelism "
            f"(pipelineParallelSize {pp}); vLLM refuses to start. Set pipelineParallelSize 1 "
            "and spread the model with tensorParallelSize instead."
        )
    elif (tp_problem := tensor_parallel_problem(arch, tp)) is not None:
        reason = REASON_INVALID_TP
        fits = False
        message = f"tensorParallelSize {tp} {tp_problem} of {model}; vLLM refuses to start."
    elif weights_per_gpu + overhead >= requested:
        reason = REASON_WEIGHTS
        fits = False
        message = (
            f"{model} does not fit on {where}: {numbers} — nothing is left for the KV cache; "
            f"each GPU is short by {_fmt_gib(shortfall)} for one sequence of maxModelLen "
            f"{max_model_len:,}."
        )
    elif not enough:
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
        max_num_batched_tokens=batched_tokens,
        kv_groups=groups,
        kv_blocks=blocks,
        vllm_profile=profile.name,
        decode_ceiling_tokens_per_s=ceiling if reason == REASON_FITS else None,
        decode_batch=batch if reason == REASON_FITS else 0,
        active_weights_gib_per_gpu=_active_weights(request, weights_per_gpu),
        memory_bandwidth_gbs=_bandwidth(request) if reason == REASON_FITS else None,
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
    arch = request.architecture
    return [
        size
        for size in (1, 2, 4, 8, 16, 32, 64)
        if size <= _node_gpus(request) and tensor_parallel_problem(arch, size) is None
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


FP8_COMPUTE = (8, 9)
"""vLLM's FP8 W8A8 kernels need Ada or Hopper (compute capability 8.9+)."""
FP8_WEIGHT_ONLY = (8, 0)
"""From Ampere, vLLM runs an FP8 checkpoint weight-only (FP8 Marlin), and an FP8 KV cache."""
AWQ_KERNELS = (7, 5)
"""vLLM's AWQ kernels need Turing or newer (compute capability 7.5+)."""
UNKNOWN_CAPABILITY = (99, 0)


def suggest_fixes(request: PlanRequest, limit: int = 5) -> tuple[str, ...]:  # noqa: C901, PLR0912
    """The smallest changes that make ``request`` fit, cheapest first (pure: re-plans only).

    Order: raise gpuMemoryUtilization to 0.95, fp8 KV cache, a shorter maxModelLen (all free),
    then more GPUs per pod (tensor parallelism), then quantized weights. Each suggestion names
    the CR fields to change; changes that fit only together with a shorter context say so.
    Only what vLLM's kernels run on the GPU is suggested (`FP8_COMPUTE`, `FP8_WEIGHT_ONLY`,
    `AWQ_KERNELS` against the catalog's compute capability).
    """
    plan = _plan_core(request)
    if plan.fits:
        return ()
    arch = request.architecture
    out: list[str] = []
    gpu = lookup_gpu(request.gpu_product) if request.gpu_product else None
    # Unknown GPU: no claim either way (every suggestion stays, as before the table knew it).
    capability = gpu.compute_capability if gpu is not None else UNKNOWN_CAPABILITY

    def add(text: str | None) -> None:
        if text is not None and text not in out:
            out.append(text)

    if plan.reason != REASON_INVALID_TP:
        if request.gpu_memory_utilization < SUGGESTED_UTILIZATION:
            changed = replace(request, gpu_memory_utilization=SUGGESTED_UTILIZATION)
            if _plan_core(changed).fits:
                add(f"engine.gpuMemoryUtilization: {SUGGESTED_UTILIZATION}")
        kv_element = kv_cache_bytes_per_element(request.kv_cache_dtype, request.dtype, arch.dtype)
        if (
            kv_element > 1
            and capability >= FP8_WEIGHT_ONLY
            and _plan_core(replace(request, kv_cache_dtype="fp8")).fits
        ):
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
    if current > 1 and capability >= FP8_COMPUTE:
        add(_with_context_fix(replace(request, quantization="fp8"), "engine.quantization: fp8"))
    elif current > 1 and capability >= FP8_WEIGHT_ONLY:
        text = (
            "engine.quantization: fp8 (weight-only on this GPU: vLLM's FP8 Marlin kernels; "
            "FP8 compute needs compute capability 8.9)"
        )
        add(_with_context_fix(replace(request, quantization="fp8"), text))
    if current > 0.6 and capability >= AWQ_KERNELS:
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
