"""Pure: the key of the engine's persistent compile cache (`LLMOP_COMPILE_CACHE_KEY`).

The agent keeps what the engine compiled (vLLM's torch.compile cache with TorchInductor's and
Triton's artifacts) on the model cache under this key (`llmop_engine.compile_cache`), so the key
must change whenever the compiled code could: the model and its resolved revision, the engine
image (which fixes the vLLM release and its torch: the renderer may not import the planner's
idea of the release, and the image is the fact anyway), the GPU count and product, and every
engine flag on the command line except those known not to touch the graph
(`GRAPH_NEUTRAL_FLAGS`: names, ports, timeouts, the memory share). Keeping every other flag,
the user's `engine.args` included, errs towards a fresh compile: an unknown flag costs one
compile, never a wrong reuse. So dtype,
quantization, kv-cache dtype, max-model-len, max-num-seqs, max-num-batched-tokens, prefix
caching, chunked prefill, tensor and pipeline parallelism, speculative decoding, LoRA slots,
`-O`/`--compilation-config`/`--enforce-eager` all enter it. Variables the user sets for vLLM
(`engine.env`, `VLLM_*`) enter it too, except those vLLM's own compile hash ignores.

The agent adds what only the node knows to the entry's name: the vLLM release it really runs
and the CPU instruction sets and GPU models (`llmop_engine.compile_cache_rules.platform_id`).
vLLM hashes its own cache directories by config, code and environment as well, so a key that is
too coarse costs a compile, never a wrong graph; the key decides which entry a pod starts from.
No key without a model cache: the mount is then a per-pod emptyDir, which dies with the pod.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Final

from llmop.api.v1alpha1 import LLMDeployment
from llmop.cpu_engine import cpu_engine
from llmop_engine.contract import EngineFlag

KEY_VERSION: Final = 1
"""Bumped when what the key covers changes, so old entries are not taken for new ones."""
KEY_HEX_CHARS: Final = 32
"""128 bits of the sha256: collisions are out of reach, the directory names stay short."""

GRAPH_NEUTRAL_FLAGS: Final = frozenset(
    {
        EngineFlag.SERVED_MODEL_NAME,
        EngineFlag.SHUTDOWN_TIMEOUT,
        EngineFlag.HOST,
        EngineFlag.PORT,
        EngineFlag.API_KEY,
        EngineFlag.MIDDLEWARE,
        EngineFlag.MASTER_ADDR,
        EngineFlag.MASTER_PORT,
        EngineFlag.NUM_GPU_BLOCKS_OVERRIDE,
        "--gpu-memory-utilization",
        "--uvicorn-log-level",
    }
)
"""Flags with a value that only name, place, time or size the server (not the graph): the
served name, addresses and ports (a multi-node group's leader address differs per group),
the API key, the drain timeout, the middleware, the KV cache's share of memory."""
GRAPH_NEUTRAL_SWITCHES: Final = frozenset(
    {
        EngineFlag.ENABLE_SERVER_LOAD_TRACKING,
        "--disable-log-stats",
        "--disable-log-requests",
        "--enable-log-requests",
    }
)
"""Flags without a value that only change logging or request accounting."""
GRAPH_NEUTRAL_ENV: Final = frozenset(
    {
        "VLLM_API_KEY",
        "VLLM_CPU_KVCACHE_SPACE",
        "VLLM_HTTP_TIMEOUT_KEEP_ALIVE",
        "VLLM_LOGGING_LEVEL",
        "VLLM_NO_USAGE_STATS",
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING",
    }
)
"""`VLLM_*` variables vLLM 0.32's own compile hash ignores (`vllm.envs.compute_hash`) or that
only switch an endpoint on."""


def graph_flags(flags: Sequence[str]) -> list[str]:
    """`flags` without the graph-neutral ones (either spelling: `--flag value`, `--flag=value`)."""
    out: list[str] = []
    skip = False
    for arg in flags:
        if skip:
            skip = False
            continue
        name = arg.partition("=")[0]
        if arg in GRAPH_NEUTRAL_FLAGS:
            skip = True
        elif name in GRAPH_NEUTRAL_FLAGS or arg in GRAPH_NEUTRAL_SWITCHES:
            continue
        else:
            out.append(arg)
    return out


def compile_cache_enabled(llmd: LLMDeployment) -> bool:
    """A model cache to keep it on, the switch on, and an engine that compiles (vLLM)."""
    cache = llmd.spec.model.cache
    return cache is not None and cache.compile_cache and llmd.spec.engine.backend == "vllm"


AOT_COMPILE_ENV: Final = "VLLM_USE_AOT_COMPILE"
"""vLLM's switch between its AOT-compiled function (default on) and TorchInductor's own cache."""


def compile_cache_env(llmd: LLMDeployment) -> dict[str, str]:
    """Variables a kept compile cache needs to be of use. vLLM 0.32's CPU build saves its
    AOT-compiled function but cannot load it back (`'function' object has no attribute
    'finalize_loading'`: it compiles again on every start, 10-14 s instead of 18-20 s with the
    rest of the cache warm); with AOT off, TorchInductor's FX-graph cache is hit and the warm-up
    takes 4.0-4.4 s instead of 21.9 s (tiny model, 2 cores, measured). CPU engines only, and
    never over the user's own setting."""
    spec = llmd.spec
    if not compile_cache_enabled(llmd) or not cpu_engine(spec):
        return {}
    if any(var.name == AOT_COMPILE_ENV for var in spec.engine.env):
        return {}
    return {AOT_COMPILE_ENV: "0"}


def compile_cache_key(llmd: LLMDeployment, *, image: str, flags: Sequence[str]) -> str | None:
    """The key for this engine (`flags`: its rendered command line), or None when off."""
    if not compile_cache_enabled(llmd):
        return None
    spec = llmd.spec
    user_env = {
        var.name: var.value
        for var in spec.engine.env
        if var.name.startswith("VLLM_") and var.name not in GRAPH_NEUTRAL_ENV
    }
    parts = {
        "v": KEY_VERSION,
        "model": spec.model.name,
        "revision": spec.model.revision,
        "image": image,
        "gpus": spec.resources.gpus,
        "gpuProduct": spec.resources.gpu_product,
        "flags": graph_flags(flags),
        "env": user_env,
    }
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:KEY_HEX_CHARS]
