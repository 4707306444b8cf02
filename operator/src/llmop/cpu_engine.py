"""Pure: what a CPU engine (vLLM's CPU build: backend vllm with `resources.gpus: 0`) gets,
decided once for the renderer (image, env, /dev/shm) and the planner adapter (the KV budget it
checks against the pod's memory), so the two never disagree."""

from __future__ import annotations

import math

from llmop.api.v1alpha1 import LLMDeploymentSpec
from llmop.planner.cpu import default_kv_cache_gib
from llmop.quantity import quantity_gib, quantity_value
from llmop_engine.contract import Env


def cpu_engine(spec: LLMDeploymentSpec) -> bool:
    """vLLM's CPU build: backend vllm with no GPUs (the engine-cpu image)."""
    return spec.engine.backend == "vllm" and spec.resources.gpus == 0


def cpu_kv_cache_gib(spec: LLMDeploymentSpec) -> int | None:
    """`VLLM_CPU_KVCACHE_SPACE` of a CPU engine: the user's (spec.engine.env) when set, else a
    default from the pod's memory (planner.default_kv_cache_gib); None for GPU engines. The
    planner checks this same value against the pod's memory."""
    if not cpu_engine(spec):
        return None
    for var in spec.engine.env:
        if var.name == Env.VLLM_CPU_KVCACHE_SPACE and var.value:
            number = quantity_value(var.value)
            return None if number is None else math.ceil(number)
    memory = quantity_gib(spec.resources.memory)
    return None if memory is None else default_kv_cache_gib(memory)
