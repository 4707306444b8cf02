"""Pure: the engine command line (vLLM flags) and environment built from the typed spec.

Typed fields come first; `engine.args` last, so a user flag overrides a generated one where vLLM
takes the last occurrence. The same flags go to the simulator, which models or ignores them.
Every name the agent reads back (its flags, its variables, the vLLM flags it inspects) comes from
`llmop_engine.contract`, the one module both sides import.
"""

from __future__ import annotations

import json
import math
from typing import Any

from llmop import names
from llmop.api.v1alpha1 import LLMDeployment, LLMDeploymentSpec, ModelSpec, SpeculativeSpec
from llmop.planner.cpu import default_kv_cache_gib
from llmop.quantity import quantity_gib, quantity_value
from llmop_engine import contract
from llmop_engine.contract import EngineFlag, Env

PVC_SCHEME = "pvc://"


def model_location(model: ModelSpec) -> str:
    """What vLLM loads: the repo id, or the path where the claim is mounted."""
    if model.name.startswith(PVC_SCHEME):
        claim, _, path = model.name[len(PVC_SCHEME) :].partition("/")
        return f"{names.PVC_MOUNT_ROOT}/{claim}/{path}".rstrip("/")
    return model.name


def pvc_claim(model: ModelSpec) -> str | None:
    """The PersistentVolumeClaim holding the weights, when the model lives on one."""
    if model.name.startswith(PVC_SCHEME):
        return model.name[len(PVC_SCHEME) :].partition("/")[0]
    return None


def served_model_name(deployment: LLMDeployment) -> str:
    """Name clients put in the OpenAI `model` field."""
    return deployment.spec.model.served_name or deployment.metadata.name


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


def tensor_parallel_size(spec: LLMDeploymentSpec) -> int:
    """TP degree: explicit, else every GPU of the pod (at least 1)."""
    return spec.engine.tensor_parallel_size or max(1, spec.resources.gpus)


def engine_flags(deployment: LLMDeployment) -> list[str]:
    """`vllm serve` arguments: the model, then typed flags, then the user's `engine.args`."""
    spec = deployment.spec
    engine = spec.engine
    flags: list[str] = [model_location(spec.model)]
    flags += [EngineFlag.SERVED_MODEL_NAME, served_model_name(deployment)]
    if spec.model.revision and not spec.model.name.startswith(PVC_SCHEME):
        flags += [EngineFlag.REVISION, spec.model.revision]
    if engine.dtype != "auto":
        flags += ["--dtype", engine.dtype]
    if engine.quantization != "none":
        flags += ["--quantization", engine.quantization]
    if engine.kv_cache_dtype != "auto":
        flags += ["--kv-cache-dtype", engine.kv_cache_dtype]
    if engine.max_model_len is not None:
        flags += ["--max-model-len", str(engine.max_model_len)]
    # Explicit even at the default: vLLM's own default moved (0.9 → 0.92) and the planner used ours.
    flags += ["--gpu-memory-utilization", _number(engine.gpu_memory_utilization)]
    if engine.max_num_seqs is not None:
        flags += ["--max-num-seqs", str(engine.max_num_seqs)]
    if engine.max_num_batched_tokens is not None:
        flags += ["--max-num-batched-tokens", str(engine.max_num_batched_tokens)]
    flags += _optional_bool("--enable-prefix-caching", engine.enable_prefix_caching)
    flags += _optional_bool("--enable-chunked-prefill", engine.enable_chunked_prefill)
    if spec.resources.gpus > 0:
        flags += ["--tensor-parallel-size", str(tensor_parallel_size(spec))]
    if engine.speculative is not None:
        speculative = json.dumps(_speculative_config(engine.speculative), separators=(",", ":"))
        flags += ["--speculative-config", speculative]
    # Drain mode: in-flight requests finish within drainSeconds instead of being aborted.
    flags += [EngineFlag.SHUTDOWN_TIMEOUT, str(spec.rollout.drain_seconds)]
    return flags + list(engine.args)


def agent_args(deployment: LLMDeployment) -> list[str]:
    """Container args: the agent's own flags, then `--` and the engine flags."""
    spec = deployment.spec
    return contract.run_args(
        backend=spec.engine.backend,
        api_port=spec.service.port,
        probe_port=names.PROBE_PORT,
        engine_args=engine_flags(deployment),
    )


def agent_env(deployment: LLMDeployment, *, load_timeout_seconds: int) -> list[dict[str, Any]]:
    """Environment of the engine container: the agent's settings, secrets, then the user's env."""
    spec = deployment.spec
    probe = spec.health.deep_probe
    plain = {
        Env.SERVED_MODEL_NAME: served_model_name(deployment),
        Env.STALL_SECONDS: str(spec.health.stall_seconds),
        Env.LOAD_TIMEOUT_SECONDS: str(spec.health.load_timeout_seconds or load_timeout_seconds),
        Env.DEEP_PROBE_ENABLED: contract.encode_bool(probe.enabled),
        Env.DEEP_PROBE_INTERVAL_SECONDS: str(probe.interval_seconds),
        Env.DEEP_PROBE_TIMEOUT_SECONDS: str(probe.timeout_seconds),
        Env.DEEP_PROBE_PROMPT: probe.prompt,
        Env.ENDPOINT_PROPAGATION_SECONDS: str(spec.rollout.endpoint_propagation_seconds),
        Env.DRAIN_SECONDS: str(spec.rollout.drain_seconds),
        Env.MODEL_CACHE_DIR: names.MODEL_CACHE_PATH,
        Env.AGENT_SOCKET: f"{names.AGENT_SOCKET_DIR}/agent.sock",
        Env.HF_HOME: names.MODEL_CACHE_PATH,
    }
    user_vars = {var.name for var in spec.engine.env}
    kv_gib = cpu_kv_cache_gib(spec)
    if kv_gib is not None and Env.VLLM_CPU_KVCACHE_SPACE not in user_vars:
        plain[Env.VLLM_CPU_KVCACHE_SPACE] = str(kv_gib)
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in plain.items()]
    if spec.model.token_secret_ref is not None:
        token = spec.model.token_secret_ref
        env.append(_secret_env(Env.HF_TOKEN, token.name, token.key))
    if spec.service.api_key_secret_ref is not None:
        ref = spec.service.api_key_secret_ref
        env.append(_secret_env(Env.API_KEY, ref.name, ref.key))
    env += [var.model_dump(by_alias=True, exclude_none=True) for var in spec.engine.env]
    return env


def _secret_env(name: str, secret: str, key: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def _optional_bool(flag: str, value: bool | None) -> list[str]:
    if value is None:
        return []
    return [flag] if value else ["--no-" + flag.removeprefix("--")]


_SPECULATIVE_METHODS = frozenset({"ngram", "eagle", "eagle3", "medusa", "mtp"})


def _speculative_config(speculative: SpeculativeSpec) -> dict[str, Any]:
    # vLLM takes a method name under "method" and a draft model under "model".
    key = "method" if speculative.model in _SPECULATIVE_METHODS else "model"
    return {key: speculative.model, "num_speculative_tokens": speculative.num_speculative_tokens}


def _number(value: float) -> str:
    return f"{value:g}"
