"""Capacity planner: pure functions that predict whether a model fits a GPU under vLLM.

Used by the operator (the ``CapacityPlanned`` condition and ``status.plan``) and by
``llmop plan``. No I/O, no clock, no Kubernetes: values in, values out (DESIGN.md §6).
"""

from llmop.planner.capacity import (
    REASON_FITS,
    REASON_INVALID_TP,
    REASON_KV,
    REASON_WEIGHTS,
    CapacityPlan,
    PlanRequest,
    kv_bytes_per_token_per_gpu,
    plan_capacity,
    round_max_model_len,
    suggest_fixes,
)
from llmop.planner.cpu import (
    REASON_CPU_MEMORY,
    REASON_CPU_UNSUPPORTED,
    CpuPlanRequest,
    default_kv_cache_gib,
    plan_cpu_capacity,
)
from llmop.planner.dtypes import (
    UnknownDtypeError,
    kv_cache_bytes_per_element,
    weight_bytes_per_param,
)
from llmop.planner.gpus import GPU_CATALOG, GPUProduct, lookup_gpu
from llmop.planner.models import (
    ATTENTION_GQA,
    ATTENTION_MLA,
    MODEL_CATALOG,
    ModelArchitecture,
    lookup_model,
)

__all__ = [
    "ATTENTION_GQA",
    "ATTENTION_MLA",
    "GPU_CATALOG",
    "MODEL_CATALOG",
    "REASON_CPU_MEMORY",
    "REASON_CPU_UNSUPPORTED",
    "REASON_FITS",
    "REASON_INVALID_TP",
    "REASON_KV",
    "REASON_WEIGHTS",
    "CapacityPlan",
    "CpuPlanRequest",
    "GPUProduct",
    "ModelArchitecture",
    "PlanRequest",
    "UnknownDtypeError",
    "default_kv_cache_gib",
    "kv_bytes_per_token_per_gpu",
    "kv_cache_bytes_per_element",
    "lookup_gpu",
    "lookup_model",
    "plan_capacity",
    "plan_cpu_capacity",
    "round_max_model_len",
    "suggest_fixes",
    "weight_bytes_per_param",
]
