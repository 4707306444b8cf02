"""What changes with the vLLM version the engine runs: the KV reserve rules and the overheads.

vLLM sized its KV cache differently across releases (../shared/reference/planner-from-files.md
§2.3-2.6): a sliding-window layer reserves ``window - 1 + max_num_batched_tokens`` tokens per
request in 0.19 and ``window - 1 + max_in_flight_tokens`` (twice the batch with async scheduling)
from 0.32 on; 0.19 logs "GPU KV cache size" as ``blocks // groups x block_size`` and 0.32 as
``max concurrency x max_model_len``; 0.19 does not subtract the CUDA-graph estimate before sizing
the KV cache, newer releases do. A ``VllmProfile`` holds those rules and the overhead constants
measured for that generation, and :func:`profile_for` picks one from a version string or an
engine image reference. Pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ENGINE_VLLM_VERSION = "0.33.0"
"""The vLLM release the llmop engine image carries (engine-image/Dockerfile,
``vllm/vllm-openai:v0.33.0``): what an image whose tag names no vLLM version is planned for."""


@dataclass(frozen=True)
class VllmProfile:
    """One generation of vLLM as the planner models it."""

    name: str
    """The versions it stands for, for messages (``0.19``, ``>=0.21``)."""
    sliding_in_flight_batches: int
    """Batches in flight a sliding-window layer reserves room for (0.19: 1; 0.32: 2, async
    scheduling with one pipeline stage)."""
    logged_tokens_from_blocks: bool
    """True: the logged "KV cache size" is ``num_blocks // groups x block_size`` (0.19);
    False: ``int(max_concurrency x max_model_len)`` (0.32)."""
    subtracts_cuda_graphs: bool
    """Whether the CUDA-graph estimate comes off the KV budget (0.19: no, VLLM_MEMORY_PROFILER_
    ESTIMATE_CUDAGRAPHS defaults to 0; newer: yes)."""
    activation_base_gib: float
    """Profiled activation peak that does not scale with the vocabulary."""
    logits_bytes: float
    """Activation bytes per (batched token x vocabulary entry): the logits of the profiling batch
    dominate the peak."""
    moe_activation_gib: float
    """Extra activation peak of a mixture-of-experts model (routing buffers)."""
    non_torch_gib: float
    """Non-torch memory at TP = 1 (CUDA context growth, workspaces)."""
    nccl_gib: float
    """Extra non-torch memory with TP > 1 (NCCL buffers, custom all-reduce)."""
    nccl_with_pipeline: bool
    """Whether pipeline stages alone (TP 1) also pay ``nccl_gib`` (0.19 measured 0.07 GiB of
    non-torch memory at PP 2-4, TP 1: no)."""
    cuda_graph_gib: float
    """CUDA-graph estimate subtracted when ``subtracts_cuda_graphs``."""

    def sliding_reserve_tokens(self, max_num_batched_tokens: int, pipeline_parallel: int) -> int:
        """Tokens beyond the window a sliding layer keeps per request."""
        batches = self.sliding_in_flight_batches if pipeline_parallel == 1 else 1
        return batches * max_num_batched_tokens


VLLM_0_19 = VllmProfile(
    name="0.19",
    sliding_in_flight_batches=1,
    logged_tokens_from_blocks=True,
    subtracts_cuda_graphs=False,
    # Fitted to the 0.19.0 startup logs of llm-d-planner's sweep on H100 (accuracy/results/
    # v0.19.0/results_raw.csv @ d3121e05, "torch peak memory increase" at max_num_batched_tokens
    # 8192): Llama-3.1-8B 1.89 GiB (vocab 128,256), Qwen2.5-7B 2.21 (152,064), gemma-2 3.62-3.66
    # (256,000), granite 0.75-0.85 (49,155): 0.17 GiB + 1.76 bytes per logit; MoE models sit
    # 0.3-0.6 GiB above that line (Mixtral 1.21, Qwen1.5-MoE 2.47, DeepSeek-V2-Lite 1.93).
    activation_base_gib=0.17,
    logits_bytes=1.76,
    moe_activation_gib=0.4,
    # Same sweep: non-torch 0.24-0.27 GiB at TP 1, 2.06-2.21 at TP 2-4.
    non_torch_gib=0.25,
    nccl_gib=1.85,
    nccl_with_pipeline=False,
    cuda_graph_gib=0.0,
)

VLLM_CURRENT = VllmProfile(
    name=">=0.21",
    sliding_in_flight_batches=2,
    logged_tokens_from_blocks=False,
    subtracts_cuda_graphs=True,
    # The planner's long-standing calibration for newer releases (capacity.py docstring): an
    # 8B model logs a 1.21 GiB activation peak, non-torch 0.32 GiB and ~0.9 GiB of CUDA graphs.
    activation_base_gib=0.25,
    logits_bytes=2.0,
    moe_activation_gib=0.0,
    non_torch_gib=0.25,
    nccl_gib=0.4,
    nccl_with_pipeline=True,
    cuda_graph_gib=0.9,
)

_VERSION = re.compile(r"^v?(\d+)\.(\d+)")


def parse_version(text: str) -> tuple[int, int] | None:
    """(major, minor) of a version string (``0.19.0``, ``v0.33.0``); None when it is none."""
    match = _VERSION.match(text.strip())
    return None if match is None else (int(match.group(1)), int(match.group(2)))


def image_vllm_version(image: str) -> str | None:
    """The vLLM version an image reference names: the tag of a repository called ``*vllm*``
    (``vllm/vllm-openai:v0.19.0`` → ``0.19.0``); None for any other image (llmop's own engine
    image is tagged with llmop's version, not vLLM's)."""
    name, _, tag = image.rpartition(":")
    if not name or "/" in tag or "vllm" not in name.rsplit("/", 1)[-1].lower():
        return None
    tag = tag.split("@", 1)[0]
    return tag.lstrip("v") if parse_version(tag) is not None else None


def profile_for(version: str | None) -> VllmProfile:
    """The profile of a vLLM version; None or an unreadable one → the version the engine image
    carries (``ENGINE_VLLM_VERSION``). Releases before 0.21 get the 0.19 rules."""
    parsed = parse_version(version) if version else None
    if parsed is None:
        parsed = parse_version(ENGINE_VLLM_VERSION)
    assert parsed is not None
    return VLLM_0_19 if parsed < (0, 21) else VLLM_CURRENT
