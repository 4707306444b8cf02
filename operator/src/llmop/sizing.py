"""Pure: an LLMDeployment spec → a capacity plan, with the facts looked up from the catalogs
or handed in as read from the model's own files (`FactsVerdict`, decided by
`llmop.model_facts`).

The planner itself knows nothing of the API; this module maps spec fields onto a planner request,
decides when there are too few facts to plan (unknown model or GPU), and derives the engine's load
budget from the model's size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from llmop.api.v1alpha1 import FactsSource, LLMDeploymentSpec, PlanStatus
from llmop.cpu_engine import cpu_engine, cpu_kv_cache_gib
from llmop.planner import (
    CapacityPlan,
    CpuPlanRequest,
    ModelArchitecture,
    PlanRequest,
    lookup_gpu,
    lookup_model,
    plan_capacity,
    plan_cpu_capacity,
)
from llmop.quantity import quantity_gib
from llmop_engine import contract

REASON_FITS = "Fits"
REASON_MODEL_UNKNOWN = "ModelUnknown"
REASON_GPU_MEMORY_UNKNOWN = "GPUMemoryUnknown"
REASON_NO_GPUS = "NoGPUs"
REASON_CPU_MEMORY_UNKNOWN = "CPUMemoryUnknown"

BASE_LOAD_SECONDS = 600
"""Engine start, CUDA graph capture and torch.compile take minutes even for small models."""
LOAD_SECONDS_PER_GIB = 20
"""~50 MiB/s effective read and shard speed: slow network volumes, not local NVMe."""
UNKNOWN_SIZE_LOAD_SECONDS = int(contract.DEFAULTS.load_timeout_seconds)
"""The agent's own default budget when the model's size is unknown."""


@dataclass(frozen=True)
class SizingResult:
    """The planner's verdict for one spec, or why there is none."""

    plan: CapacityPlan | None
    reason: str
    message: str
    gpu_memory_gib: float | None
    load_timeout_seconds: int
    max_num_seqs: int | None = None
    """The batch the engine runs with (`effective_max_num_seqs`); None: unknown."""
    facts_source: FactsSource | None = None
    """Where the model facts came from: spec, catalog, files or hub (None: no facts)."""
    facts_revision: str | None = None
    """The commit the model's files were read at (facts from the hub)."""
    waiting: bool = False
    """No plan yet: the model's files are being read, or the Hub cannot be reached now. Nothing
    is created or changed until there is one (`reason`, `message` say why)."""
    refused: bool = False
    """The model's files say it cannot be planned (none at that revision, no access, a layer
    type or quantization the planner cannot size): stalled, nothing created."""
    held: PlanStatus | None = None
    """status.plan as last written from the model's files, kept while they are read again."""

    @property
    def fits(self) -> bool | None:
        """True/False from the planner (False also when the files refuse it); None when it
        could not plan."""
        if self.refused:
            return False
        return None if self.plan is None else self.plan.fits

    def plan_status(self) -> PlanStatus | None:
        """The `status.plan` stanza (without a plan, the one held while the model's files are
        read again, else only the engine's batch when known)."""
        if self.plan is None:
            if self.held is not None:
                return self.held
            return None if self.max_num_seqs is None else PlanStatus(max_num_seqs=self.max_num_seqs)
        plan = self.plan
        return PlanStatus(
            gpu_memory_gib=self.gpu_memory_gib,
            weights_gib_per_gpu=round(plan.weights_gib_per_gpu, 2),
            kv_bytes_per_token=plan.kv_bytes_per_token,
            kv_cache_tokens=plan.kv_cache_tokens,
            max_model_len=plan.max_model_len,
            max_concurrency=round(plan.max_concurrency, 2),
            max_num_seqs=self.max_num_seqs,
            fits=plan.fits,
            facts_source=self.facts_source,
            facts_revision=self.facts_revision,
            max_num_batched_tokens=plan.max_num_batched_tokens,
            decode_ceiling_tokens_per_second=(
                None
                if plan.decode_ceiling_tokens_per_s is None
                else round(plan.decode_ceiling_tokens_per_s)
            ),
            active_weights_gib_per_gpu=(
                None
                if plan.memory_bandwidth_gbs is None
                else round(plan.active_weights_gib_per_gpu, 3)
            ),
            memory_bandwidth_gbs=plan.memory_bandwidth_gbs,
        )


FactsOutcome = Literal["plan", "wait", "refuse"]


@dataclass(frozen=True)
class FactsVerdict:
    """For a model outside the catalog: the facts read from its files, or why there are none
    (`llmop.model_facts` decides it). `plan`: plan with `architecture` (None: without facts,
    `message` saying why); `wait`: no plan until the files are read; `refuse`: stall."""

    outcome: FactsOutcome = "plan"
    architecture: ModelArchitecture | None = None
    revision: str | None = None
    """The commit the files were read at."""
    reason: str = ""
    message: str = ""
    held: PlanStatus | None = None
    """With `wait`: status.plan as last written from the files (see `SizingResult.held`)."""


def architecture_for(
    spec: LLMDeploymentSpec, facts: ModelArchitecture | None = None
) -> ModelArchitecture | None:
    """The spec's architecture override, else the facts read from the model's files, else the
    catalog entry, else None."""
    override = spec.model.architecture
    if override is None:
        return facts if facts is not None else lookup_model(spec.model.name)
    return ModelArchitecture(
        source="spec",
        name=spec.model.name,
        parameters=override.parameters,
        layers=override.layers,
        kv_heads=override.kv_heads,
        head_dim=override.head_dim,
        max_position_embeddings=override.max_position_embeddings,
        kv_lora_rank=override.kv_lora_rank,
        qk_rope_head_dim=override.qk_rope_head_dim,
        attention="mla" if override.kv_lora_rank is not None else "gqa",
    )


def gpu_memory_for(spec: LLMDeploymentSpec) -> float | None:
    """`resources.gpuMemoryGiB` wins over the catalog entry of `resources.gpuProduct`."""
    if spec.resources.gpu_memory_gib is not None:
        return spec.resources.gpu_memory_gib
    if spec.resources.gpu_product is None:
        return None
    product = lookup_gpu(spec.resources.gpu_product)
    return None if product is None else product.memory_gib


def load_timeout_seconds(weights_gib_total: float | None) -> int:
    """Load budget from the model's size: a base for engine start plus time per GiB."""
    if weights_gib_total is None:
        return UNKNOWN_SIZE_LOAD_SECONDS
    return BASE_LOAD_SECONDS + math.ceil(weights_gib_total * LOAD_SECONDS_PER_GIB)


def effective_max_num_seqs(spec: LLMDeploymentSpec, plan: CapacityPlan | None) -> int | None:
    """`--max-num-seqs` as the engine gets it: the last one in `engine.args` (the renderer puts
    them after the typed flags; vLLM takes the last), else `engine.maxNumSeqs`, else vLLM's
    default for the GPU the plan was made for; None when none of these is known."""
    value = contract.flag_value(spec.engine.args, "--max-num-seqs")
    if value is not None and value.isdigit() and int(value) > 0:
        return int(value)
    if spec.engine.max_num_seqs is not None:
        return spec.engine.max_num_seqs
    return None if plan is None else plan.max_num_seqs


def plan_for(
    spec: LLMDeploymentSpec,
    *,
    facts: ModelArchitecture | None = None,
    vllm_version: str | None = None,
) -> SizingResult:
    """Plan one replica of `spec`; explain when the facts to plan are missing. `facts`: the
    model's own files read (planner.model_config), used unless spec.model.architecture is set;
    `vllm_version`: the engine's (None: the engine image's). The result carries the engine's
    effective `max_num_seqs` (what llmop-router reads in status.plan)."""
    architecture = architecture_for(spec, facts)
    result = _plan_for(spec, architecture, vllm_version)
    return replace(
        result,
        max_num_seqs=effective_max_num_seqs(spec, result.plan),
        facts_source=None if architecture is None else _source(architecture.source),
    )


def plan_from(
    spec: LLMDeploymentSpec, verdict: FactsVerdict | None, *, vllm_version: str | None = None
) -> SizingResult:
    """Plan `spec` as `plan_for` does, with the facts `verdict` gives for a model outside the
    catalog (None: the catalog or spec.model.architecture alone). Waiting for the files or
    refused by them, the result keeps the GPU memory and load budget of the plan without
    facts, with the verdict's reason and message."""
    if verdict is None:
        return plan_for(spec, vllm_version=vllm_version)
    if verdict.outcome == "plan":
        result = plan_for(spec, facts=verdict.architecture, vllm_version=vllm_version)
        if verdict.architecture is not None:
            return replace(result, facts_revision=verdict.revision)
        if verdict.message and result.reason == REASON_MODEL_UNKNOWN:
            return replace(result, message=f"{result.message} {verdict.message}")
        return result
    return replace(
        plan_for(spec, vllm_version=vllm_version),
        reason=verdict.reason,
        message=verdict.message,
        waiting=verdict.outcome == "wait",
        refused=verdict.outcome == "refuse",
        held=verdict.held if verdict.outcome == "wait" else None,
    )


def _source(value: str) -> FactsSource | None:
    for known in ("spec", "catalog", "files", "hub"):
        if value == known:
            return known
    return None


def _plan_for(
    spec: LLMDeploymentSpec, architecture: ModelArchitecture | None, vllm_version: str | None
) -> SizingResult:
    gpu_memory = gpu_memory_for(spec)
    if cpu_engine(spec):
        return _plan_cpu(spec, architecture)
    if spec.resources.gpus == 0:
        return SizingResult(
            plan=None,
            reason=REASON_NO_GPUS,
            message="No GPUs requested (simulator backend): nothing to plan.",
            gpu_memory_gib=None,
            load_timeout_seconds=load_timeout_seconds(None),
        )
    if architecture is None:
        return SizingResult(
            plan=None,
            reason=REASON_MODEL_UNKNOWN,
            message=(
                f"Model {spec.model.name!r} is not in the planner's catalog and its files "
                "were not read; set spec.model.architecture (parameters, layers, kvHeads, "
                "headDim, maxPositionEmbeddings) to get a capacity check."
            ),
            gpu_memory_gib=gpu_memory,
            load_timeout_seconds=load_timeout_seconds(None),
        )
    if gpu_memory is None:
        return SizingResult(
            plan=None,
            reason=REASON_GPU_MEMORY_UNKNOWN,
            message=(
                "GPU memory is unknown: set spec.resources.gpuProduct to a known product "
                "(e.g. NVIDIA-H100-80GB-HBM3) or spec.resources.gpuMemoryGiB."
            ),
            gpu_memory_gib=None,
            load_timeout_seconds=load_timeout_seconds(None),
        )
    engine = spec.engine
    plan = plan_capacity(
        PlanRequest(
            architecture=architecture,
            gpu_memory_gib=gpu_memory,
            tensor_parallel_size=spec.tensor_parallel_size,
            pipeline_parallel_size=spec.pipeline_parallel_size,
            dtype=engine.dtype,
            quantization=None if engine.quantization == "none" else engine.quantization,
            kv_cache_dtype=engine.kv_cache_dtype,
            max_model_len=engine.max_model_len,
            gpu_memory_utilization=engine.gpu_memory_utilization,
            enforce_eager="--enforce-eager" in engine.args,
            max_num_seqs=engine.max_num_seqs,
            max_num_batched_tokens=engine.max_num_batched_tokens,
            gpu_product=spec.resources.gpu_product,
            max_loras=0 if spec.lora_slots is None else spec.lora_slots.max_loras,
            max_lora_rank=0 if spec.lora_slots is None else spec.lora_slots.max_lora_rank,
            vllm_version=vllm_version,
        )
    )
    return SizingResult(
        plan=plan,
        reason=plan.reason,
        message=plan.message,
        gpu_memory_gib=gpu_memory,
        load_timeout_seconds=load_timeout_seconds(plan.weights_gib_total),
    )


def _plan_cpu(spec: LLMDeploymentSpec, architecture: ModelArchitecture | None) -> SizingResult:
    """vLLM's CPU build: the KV budget the renderer gives it (VLLM_CPU_KVCACHE_SPACE) plus the
    weights and vLLM's runtime against the pod's memory (planner.cpu)."""
    memory = quantity_gib(spec.resources.memory)
    kv_gib = cpu_kv_cache_gib(spec)
    if memory is None or kv_gib is None:
        return SizingResult(
            plan=None,
            reason=REASON_CPU_MEMORY_UNKNOWN,
            message=(
                "A CPU engine (backend vllm, resources.gpus 0) needs spec.resources.memory as a "
                "quantity (e.g. 16Gi) and a numeric VLLM_CPU_KVCACHE_SPACE if spec.engine.env "
                "sets one: they bound the weights, the KV cache and vLLM's runtime."
            ),
            gpu_memory_gib=None,
            load_timeout_seconds=load_timeout_seconds(None),
        )
    if architecture is None:
        return SizingResult(
            plan=None,
            reason=REASON_MODEL_UNKNOWN,
            message=(
                f"Model {spec.model.name!r} is not in the planner's catalog; set "
                "spec.model.architecture to check it against the CPU engine's memory "
                f"({memory:g} GiB, KV cache {kv_gib} GiB)."
            ),
            gpu_memory_gib=None,
            load_timeout_seconds=load_timeout_seconds(None),
        )
    engine = spec.engine
    plan = plan_cpu_capacity(
        CpuPlanRequest(
            architecture=architecture,
            memory_gib=memory,
            kv_cache_gib=kv_gib,
            dtype=engine.dtype,
            quantization=None if engine.quantization == "none" else engine.quantization,
            kv_cache_dtype=engine.kv_cache_dtype,
            max_model_len=engine.max_model_len,
        )
    )
    return SizingResult(
        plan=plan,
        reason=plan.reason,
        message=plan.message,
        gpu_memory_gib=None,
        load_timeout_seconds=load_timeout_seconds(plan.weights_gib_total),
    )
