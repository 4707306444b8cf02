"""Pure: the engine command line (vLLM flags) and environment built from the typed spec.

Typed fields come first; `engine.args` last, so a user flag overrides a generated one where vLLM
takes the last occurrence. The same flags go to the simulator, which models or ignores them, plus
one of its own: the planned KV cache as `--num-gpu-blocks-override` (`simulated_kv_flags`).
Every name the agent reads back (its flags, its variables, the vLLM flags it inspects) comes from
`llmop_engine.contract`, the one module both sides import.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from llmop import names
from llmop.api.v1alpha1 import LLMDeployment, SecretKeyRef, SpeculativeSpec
from llmop.cpu_engine import cpu_kv_cache_gib
from llmop.render import adapters
from llmop.render.compile_cache_key import compile_cache_env
from llmop.render.model_source import PVC_SCHEME, hub_token_env, model_location
from llmop_engine import contract
from llmop_engine.contract import EngineFlag, Env


def served_model_name(llmd: LLMDeployment) -> str:
    """Name clients put in the OpenAI `model` field."""
    return llmd.spec.model.served_name or llmd.metadata.name


def engine_flags(
    llmd: LLMDeployment, role_flags: Sequence[str] = (), *, kv_cache_tokens: int | None = None
) -> list[str]:
    """`vllm serve` arguments: the model, then typed flags (`role_flags` last among them: a
    multi-node pod's pipeline flags), then the user's `engine.args`. `kv_cache_tokens` is the
    planned KV cache of one replica (None: no plan), which only the simulator is given."""
    spec = llmd.spec
    engine = spec.engine
    flags: list[str] = [model_location(spec.model)]
    flags += [EngineFlag.SERVED_MODEL_NAME, served_model_name(llmd)]
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
        flags += ["--tensor-parallel-size", str(spec.tensor_parallel_size)]
    if engine.speculative is not None:
        speculative = json.dumps(_speculative_config(engine.speculative), separators=(",", ":"))
        flags += ["--speculative-config", speculative]
    flags += adapters.lora_flags(spec)
    flags += simulated_kv_flags(llmd, kv_cache_tokens)
    # Drain mode: in-flight requests finish within drainSeconds instead of being aborted.
    flags += [EngineFlag.SHUTDOWN_TIMEOUT, str(spec.rollout.drain_seconds)]
    return flags + list(role_flags) + list(engine.args)


def simulated_kv_flags(llmd: LLMDeployment, kv_cache_tokens: int | None) -> list[str]:
    """The simulator's KV cache: as many blocks as the planned `kv_cache_tokens` fill, so that it
    reports (in `vllm:cache_config_info`, read back into status.plan.actual) and admits requests
    against the capacity the planner computed for its GPU, not a fixed default. vLLM's own flag
    for a fixed block count; never given to vLLM, which profiles its GPU. Blocks of the engine's
    `--block-size` when `engine.args` sets one (the planner counts in vLLM's default): the
    tokens then round down by less than a block."""
    if llmd.spec.engine.backend != "simulator" or not kv_cache_tokens:
        return []
    block_size = (
        _int_flag(llmd.spec.engine.args, EngineFlag.BLOCK_SIZE) or contract.DEFAULT_BLOCK_SIZE
    )
    blocks = max(1, kv_cache_tokens // block_size)
    return [EngineFlag.NUM_GPU_BLOCKS_OVERRIDE, str(blocks)]


def _int_flag(args: Sequence[str], flag: str) -> int | None:
    """The positive integer value of `flag` in `args` (`contract.flag_value`: the last one, as
    vLLM takes it); None when absent or not such a number."""
    value = contract.flag_value(args, flag)
    if value is None or not value.isdigit() or int(value) < 1:
        return None
    return int(value)


def agent_args(
    llmd: LLMDeployment, role_flags: Sequence[str] = (), *, kv_cache_tokens: int | None = None
) -> list[str]:
    """Container args: the agent's own flags, then `--` and the engine flags."""
    spec = llmd.spec
    return contract.run_args(
        backend=spec.engine.backend,
        api_port=spec.service.port,
        probe_port=names.PROBE_PORT,
        engine_args=engine_flags(llmd, role_flags, kv_cache_tokens=kv_cache_tokens),
    )


def agent_env(
    llmd: LLMDeployment, *, load_timeout_seconds: int, compile_cache_key: str | None = None
) -> list[dict[str, Any]]:
    """Environment of the engine container: the agent's settings, secrets, then the user's env.
    `compile_cache_key`: the persistent compile cache's (`render.compile_cache_key`; None: off)."""
    spec = llmd.spec
    # The rows the CR has no field for, and the fallback of a field left unset.
    derived: dict[str, object] = {
        "served_model_name": served_model_name(llmd),
        "load_timeout_seconds": load_timeout_seconds,
        "model_cache_dir": names.MODEL_CACHE_PATH,
        "agent_socket": f"{names.AGENT_SOCKET_DIR}/agent.sock",
        "compile_cache_key": compile_cache_key,
    }
    plain: dict[str, str] = {}
    for setting in contract.SETTINGS:
        value = spec_value(spec, setting.spec) if setting.spec is not None else None
        if value is None:
            value = derived.get(setting.name)
        if setting.env is not None and value is not None:
            plain[setting.env] = _encode(value)
    plain[Env.HF_HOME] = names.MODEL_CACHE_PATH
    user_vars = {var.name for var in spec.engine.env}
    kv_gib = cpu_kv_cache_gib(spec)
    if kv_gib is not None and Env.VLLM_CPU_KVCACHE_SPACE not in user_vars:
        plain[Env.VLLM_CPU_KVCACHE_SPACE] = str(kv_gib)
    plain |= adapters.lora_env(spec)
    plain |= compile_cache_env(llmd)
    if spec.model.cache is not None:
        # The download Job filled the cache: the engine reads it and never the network, so a
        # restart or a new replica cannot stall on the Hub (and needs no token).
        plain[Env.HF_HUB_OFFLINE] = "1"
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in plain.items()]
    if engine_hub_token(llmd) is not None:
        env.append(hub_token_env())
    if spec.service.api_key_secret_ref is not None:
        ref = spec.service.api_key_secret_ref
        env.append(_secret_env(Env.API_KEY, ref.name, ref.key))
    env += [var.model_dump(by_alias=True, exclude_none=True) for var in spec.engine.env]
    return env


def engine_hub_token(llmd: LLMDeployment) -> SecretKeyRef | None:
    """The Hub token the engine pod mounts, if it needs one. With a cache the engine needs none
    (offline); the agent still fetches gated Hub adapters (so it is mounted whenever LoRA is on:
    adding the first Hub adapter is then no template change)."""
    spec = llmd.spec
    lora = adapters.lora_enabled(spec)
    if spec.model.token_secret_ref is not None and (spec.model.cache is None or lora):
        return spec.model.token_secret_ref
    return None


def spec_value(spec: BaseModel, path: str) -> object:
    """The value at a CR field path (`health.deepProbe.intervalSeconds`, as in the CRD)."""
    value: object = spec
    for key in path.split("."):
        if not isinstance(value, BaseModel):
            raise KeyError(f"spec.{path}: {key!r} is under a value, not an object")
        value = getattr(value, _attribute(type(value), key))
    return value


def _attribute(model: type[BaseModel], alias: str) -> str:
    for name, info in model.model_fields.items():
        if (info.alias or name) == alias:
            return name
    raise KeyError(f"{model.__name__} has no field {alias!r}")


def _encode(value: object) -> str:
    return contract.encode_bool(value) if isinstance(value, bool) else str(value)


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
