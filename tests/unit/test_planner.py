"""Capacity planner: fit verdicts, KV math, overhead knobs and suggestions (pure, fast)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from llmop.planner import (
    REASON_FITS,
    REASON_INVALID_TP,
    REASON_KV,
    REASON_WEIGHTS,
    GPUProduct,
    ModelArchitecture,
    PlanRequest,
    kv_bytes_per_token_per_gpu,
    lookup_gpu,
    lookup_model,
    plan_capacity,
    round_max_model_len,
    suggest_fixes,
)
from llmop.planner.capacity import (
    CUDA_GRAPH_GIB,
    NCCL_GIB,
    REASON_INVALID_PP,
    kv_layers_per_stage,
    stage_parameters,
)


def _gpu(product: str) -> GPUProduct:
    gpu = lookup_gpu(product)
    assert gpu is not None, product
    return gpu


H100 = _gpu("NVIDIA-H100-80GB-HBM3")
H200 = _gpu("NVIDIA-H200")
A100_80 = _gpu("NVIDIA-A100-SXM4-80GB")
L4 = _gpu("NVIDIA-L4")


def _arch(repo: str) -> ModelArchitecture:
    arch = lookup_model(repo)
    assert arch is not None, repo
    return arch


LLAMA_8B = _arch("meta-llama/Llama-3.1-8B-Instruct")
LLAMA_70B = _arch("meta-llama/Llama-3.1-70B-Instruct")
DEEPSEEK_V3 = _arch("deepseek-ai/DeepSeek-V3")


def _h100(arch: ModelArchitecture, **kwargs: object) -> PlanRequest:
    return PlanRequest(
        architecture=arch,
        gpu_memory_gib=H100.memory_gib,
        gpu_product=H100.product,
        **kwargs,  # type: ignore[arg-type]
    )


# Real vLLM numbers for Llama-3.1-8B-Instruct bf16 on one H100-80GB (79.18 GiB), H100 batch
# defaults. Tokens = available KV GiB x 2**30 / 131,072 bytes per token, floored to 16-token blocks.
# - vLLM 0.11.0, utilization 0.9: "Available KV cache memory: 51.38 GiB" (llm-d/llm-d-benchmark,
#   config_explorer/empirical-vllm-memory-results.md, real DEBUG logs).
VLLM_0_11_TOKENS_AT_0_9 = 420_896
# - Newer vLLM (CUDA graphs estimated), utilization 0.92: "GPU KV cache size: 450,816 tokens"
#   (startup walk-through in a public course text; non-KV 16.51 GiB + ≈1.2 GiB graphs).
VLLM_NEW_TOKENS_AT_0_92 = 450_816


@pytest.mark.parametrize(
    ("utilization", "vllm_tokens"),
    [(0.9, VLLM_0_11_TOKENS_AT_0_9), (0.92, VLLM_NEW_TOKENS_AT_0_92)],
    ids=["vllm-0.11-util-0.90", "vllm-new-util-0.92"],
)
def test_llama_8b_on_h100_matches_vllm_within_10_percent(
    utilization: float, vllm_tokens: int
) -> None:
    plan = plan_capacity(_h100(LLAMA_8B, max_model_len=8192, gpu_memory_utilization=utilization))
    assert plan.fits
    assert plan.reason == REASON_FITS
    assert plan.kv_bytes_per_token == 131_072
    assert abs(plan.kv_cache_tokens - vllm_tokens) / vllm_tokens < 0.10
    assert plan.kv_cache_tokens % 16 == 0
    assert plan.max_concurrency == pytest.approx(plan.kv_cache_tokens / 8192)


def test_llama_70b_bf16_on_one_h100_does_not_fit_and_suggests_tp2_and_fp8() -> None:
    plan = plan_capacity(_h100(LLAMA_70B, max_model_len=8192))
    assert not plan.fits
    assert plan.reason == REASON_WEIGHTS
    assert plan.weights_gib_per_gpu == pytest.approx(131.4, abs=0.1)
    assert "131.42 GiB" in plan.message
    joined = " | ".join(plan.suggestions)
    assert plan.suggestions[0].startswith("engine.tensorParallelSize: 2 with resources.gpus: 2")
    assert "engine.quantization: fp8" in joined


def test_llama_70b_default_context_suggestions_combine_tp_with_shorter_context() -> None:
    plan = plan_capacity(_h100(LLAMA_70B))  # maxModelLen → 131072
    assert plan.max_model_len == 131_072
    assert not plan.fits
    assert plan.suggestions[0] == (
        "engine.tensorParallelSize: 2 with resources.gpus: 2 (2 GPUs per pod) "
        "and engine.maxModelLen: 8192"
    )
    assert "engine.tensorParallelSize: 4 with resources.gpus: 4 (4 GPUs per pod)" in (
        plan.suggestions
    )
    for suggestion in plan.suggestions:
        # Every suggestion must actually fit when applied (checked for the TP=4 one).
        if suggestion.startswith("engine.tensorParallelSize: 4"):
            assert plan_capacity(_h100(LLAMA_70B, tensor_parallel_size=4)).fits


def test_llama_70b_bf16_on_two_h100_tp2_fits() -> None:
    plan = plan_capacity(_h100(LLAMA_70B, tensor_parallel_size=2, max_model_len=8192))
    assert plan.fits, plan.message
    assert plan.weights_gib_per_gpu == pytest.approx(plan.weights_gib_total / 2)
    # 8 KV heads / TP 2 = 4 heads per rank: 2 x 80 x 4 x 128 x 2 bytes.
    assert plan.kv_bytes_per_token == 163_840
    assert plan.overhead_gib_per_gpu > plan_capacity(_h100(LLAMA_8B)).overhead_gib_per_gpu


@pytest.mark.parametrize(
    ("tp", "expected"),
    [(1, 327_680), (2, 163_840), (4, 81_920), (8, 40_960), (16, 40_960)],
    ids=["tp1", "tp2", "tp4", "tp8", "tp16-replicates-heads"],
)
def test_kv_bytes_split_across_tp_ranks(tp: int, expected: int) -> None:
    assert kv_bytes_per_token_per_gpu(LLAMA_70B, tp, 2) == expected


@pytest.mark.parametrize(
    ("kv_dtype", "expected"),
    [("auto", 70_272), ("bfloat16", 70_272), ("fp8", 35_136), ("fp8_ds_mla", 35_136)],
    ids=["auto", "bf16", "fp8", "fp8-ds-mla"],
)
def test_mla_kv_is_one_latent_per_layer_replicated_per_rank(kv_dtype: str, expected: int) -> None:
    for tp in (1, 8):
        plan = plan_capacity(PlanRequest(DEEPSEEK_V3, H200.memory_gib, tp, kv_cache_dtype=kv_dtype))
        assert plan.kv_bytes_per_token == expected  # same on every rank: not divided by TP


def test_deepseek_v3_uses_fp8_checkpoint_and_fits_on_8x_h200() -> None:
    plan = plan_capacity(PlanRequest(DEEPSEEK_V3, H200.memory_gib, 8, gpu_product=H200.product))
    assert plan.fits, plan.message
    assert plan.weights_gib_total == pytest.approx(671e9 / 2**30, rel=1e-6)  # 1 byte/param


@pytest.mark.parametrize(
    ("quantization", "bytes_per_param"),
    [(None, 2.0), ("fp8", 1.0), ("compressed-tensors", 1.0), ("awq", 0.55), ("gptq", 0.55)],
    ids=["bf16", "fp8", "compressed-tensors", "awq", "gptq"],
)
def test_quantization_scales_weights(quantization: str | None, bytes_per_param: float) -> None:
    plan = plan_capacity(_h100(LLAMA_8B, quantization=quantization, max_model_len=8192))
    assert plan.weights_gib_total == pytest.approx(LLAMA_8B.parameters * bytes_per_param / 2**30)
    # The KV cache stays in the compute dtype under --kv-cache-dtype auto.
    assert plan.kv_bytes_per_token == 131_072


def test_fp8_kv_cache_doubles_tokens() -> None:
    base = plan_capacity(_h100(LLAMA_8B, max_model_len=8192))
    fp8 = plan_capacity(_h100(LLAMA_8B, max_model_len=8192, kv_cache_dtype="fp8"))
    assert fp8.kv_bytes_per_token == base.kv_bytes_per_token // 2
    assert fp8.kv_cache_tokens == pytest.approx(2 * base.kv_cache_tokens, abs=32)


def test_enforce_eager_frees_cuda_graph_memory() -> None:
    graphs = plan_capacity(_h100(LLAMA_8B, max_model_len=8192))
    eager = plan_capacity(_h100(LLAMA_8B, max_model_len=8192, enforce_eager=True))
    assert graphs.overhead_gib_per_gpu - eager.overhead_gib_per_gpu == pytest.approx(CUDA_GRAPH_GIB)
    assert eager.kv_cache_tokens > graphs.kv_cache_tokens


def test_tensor_parallel_adds_nccl_overhead() -> None:
    one = plan_capacity(_h100(LLAMA_8B, tensor_parallel_size=1, max_num_batched_tokens=2048))
    two = plan_capacity(_h100(LLAMA_8B, tensor_parallel_size=2, max_num_batched_tokens=2048))
    assert two.overhead_gib_per_gpu - one.overhead_gib_per_gpu == pytest.approx(NCCL_GIB)


def test_a100_gets_small_batch_defaults_and_less_activation() -> None:
    h100 = plan_capacity(_h100(LLAMA_8B))
    a100 = plan_capacity(PlanRequest(LLAMA_8B, A100_80.memory_gib, gpu_product=A100_80.product))
    assert a100.overhead_gib_per_gpu < h100.overhead_gib_per_gpu


def test_max_model_len_defaults_to_model_context() -> None:
    plan = plan_capacity(_h100(LLAMA_8B))
    assert plan.max_model_len == 131_072
    assert plan.fits  # 433k tokens ≥ 131k: ~3.3 full-length sequences
    assert plan.max_concurrency == pytest.approx(plan.kv_cache_tokens / 131_072)


def test_kv_too_small_suggests_fp8_kv_and_shorter_context() -> None:
    # Llama-3.1-8B at its full 131k context on one L4 (22 GiB): weights fit, one sequence doesn't.
    request = PlanRequest(LLAMA_8B, L4.memory_gib, gpu_product=L4.product)
    plan = plan_capacity(request)
    assert not plan.fits
    assert plan.reason == REASON_KV
    assert "vLLM refuses to start" in plan.message
    assert plan.kv_cache_tokens < plan.max_model_len
    suggested_lengths = [s for s in plan.suggestions if s.startswith("engine.maxModelLen: ")]
    assert suggested_lengths
    length = int(suggested_lengths[0].rsplit(" ", 1)[1])
    assert plan_capacity(replace(request, max_model_len=length)).fits
    assert length in {2**k for k in range(10, 18)} | {3 * 2**k for k in range(9, 17)}
    assert plan.suggestions == suggest_fixes(request)
    assert all(
        s.split(":")[0].split(" ")[0].startswith(("engine.", "resources."))
        for s in plan.suggestions
    )


def test_utilization_bump_is_suggested_first_when_it_is_enough() -> None:
    # Pick the context so it fits at 0.95 but not at 0.9.
    at_90 = plan_capacity(PlanRequest(LLAMA_8B, L4.memory_gib, gpu_product=L4.product))
    at_95 = plan_capacity(
        PlanRequest(LLAMA_8B, L4.memory_gib, gpu_memory_utilization=0.95, gpu_product=L4.product)
    )
    length = (at_90.kv_cache_tokens + at_95.kv_cache_tokens) // 2
    plan = plan_capacity(PlanRequest(LLAMA_8B, L4.memory_gib, max_model_len=length))
    assert not plan.fits
    assert plan.suggestions[0] == "engine.gpuMemoryUtilization: 0.95"


def test_fitting_plan_has_no_suggestions() -> None:
    plan = plan_capacity(_h100(LLAMA_8B, max_model_len=8192))
    assert plan.suggestions == ()
    assert suggest_fixes(_h100(LLAMA_8B, max_model_len=8192)) == ()


def test_tp_must_divide_attention_heads() -> None:
    qwen_7b = _arch("Qwen/Qwen2.5-7B-Instruct")  # 28 heads: TP 8 is invalid, 4 is the nearest
    plan = plan_capacity(_h100(qwen_7b, tensor_parallel_size=8, max_model_len=8192))
    assert not plan.fits
    assert plan.reason == REASON_INVALID_TP
    assert plan.suggestions[0].startswith("engine.tensorParallelSize: 4 with resources.gpus: 4")


def test_cr_override_architecture_without_optional_fields() -> None:
    arch = ModelArchitecture(
        parameters=8_030_261_248, layers=32, kv_heads=8, head_dim=128, max_position_embeddings=8192
    )
    plan = plan_capacity(_h100(arch))
    catalog = plan_capacity(_h100(LLAMA_8B, max_model_len=8192))
    assert plan.fits
    # Default vocabulary is Llama 3's, so the override plans like the catalog entry.
    assert plan.kv_cache_tokens == catalog.kv_cache_tokens
    assert "the model fits" in plan.message


@pytest.mark.parametrize(
    "kwargs",
    [
        {"tensor_parallel_size": 0},
        {"gpu_memory_gib": 0.0},
        {"gpu_memory_utilization": 1.5},
        {"dtype": "float8_weird"},
        {"quantization": "mystery"},
        {"kv_cache_dtype": "int3"},
    ],
    ids=["tp0", "no-memory", "utilization>1", "bad-dtype", "bad-quant", "bad-kv-dtype"],
)
def test_invalid_requests_raise(kwargs: dict[str, object]) -> None:
    request = replace(_h100(LLAMA_8B), **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError):  # noqa: PT011 - UnknownDtypeError is a ValueError
        plan_capacity(request)


@pytest.mark.parametrize(
    ("limit", "expected"),
    [
        (1000, None),
        (1024, 1024),
        (1535, 1024),
        (1536, 1536),
        (12000, 8192),
        (12288, 12288),
        (131072, 131072),
        (200000, 196608),
    ],
    ids=["too-small", "1k", "just-under-1.5k", "1.5k", "12000", "12k", "128k", "200k"],
)
def test_round_max_model_len(limit: int, expected: int | None) -> None:
    assert round_max_model_len(limit) == expected


def test_weights_exceed_message_and_field_names() -> None:
    plan = plan_capacity(PlanRequest(LLAMA_70B, L4.memory_gib, gpu_product=L4.product))
    assert plan.reason == REASON_WEIGHTS
    assert "NVIDIA-L4" in plan.message
    assert plan.kv_cache_tokens == 0
    assert plan.max_concurrency == 0


LLAMA_405B = _arch("meta-llama/Llama-3.1-405B-Instruct")


def test_a_model_bigger_than_one_node_gets_no_impossible_gpu_count_and_no_negative_size() -> None:
    # 405B in BF16 is 756 GiB: 8 H100s (one node) do not hold it. The planner once suggested 16
    # GPUs per pod, which no node has, and reported a negative KV cache.
    plan = plan_capacity(_h100(LLAMA_405B, tensor_parallel_size=8))
    assert plan.reason == REASON_WEIGHTS
    assert plan.kv_cache_gib_per_gpu == 0
    # Short by what is missing for the weights, the overhead and one sequence of maxModelLen.
    assert plan.shortfall_gib_per_gpu == pytest.approx(
        plan.weights_gib_per_gpu
        + plan.overhead_gib_per_gpu
        - H100.memory_gib * 0.9
        + -(-plan.max_model_len // 16) * 16 * plan.kv_bytes_per_token / 2**30,
        abs=0.01,
    )
    assert f"short by {plan.shortfall_gib_per_gpu:.2f} GiB" in plan.message
    assert "one node (8 GPUs)" in plan.message
    assert not any("tensorParallelSize: 16" in s for s in plan.suggestions), plan.suggestions
    # More hardware (two nodes per replica) comes before quantized weights, as TP does.
    assert plan.suggestions[0].startswith("engine.pipelineParallelSize: 2")
    assert plan.suggestions[1].startswith("engine.quantization: fp8")


@pytest.mark.parametrize(("node_gpus", "suggested"), [(4, None), (8, 8), (16, 8)])
def test_tensor_parallel_suggestions_stop_at_the_gpus_of_one_node(
    node_gpus: int, suggested: int | None
) -> None:
    # FP8 405B needs 8 H100s: a node of 4 gets no TP suggestion, and one of 16 gets the smallest.
    request = _h100(LLAMA_405B, quantization="fp8", max_model_len=8192, gpus_per_node=node_gpus)
    plan = plan_capacity(request)
    sizes = [
        int(s.split(":")[1].split()[0])
        for s in plan.suggestions
        if s.startswith("engine.tensorParallelSize")
    ]
    assert sizes == ([] if suggested is None else [suggested]), plan.suggestions
    assert (f"one node ({node_gpus} GPUs)" in plan.message) == (suggested is None)


def test_kv_too_small_says_by_how_much() -> None:
    plan = plan_capacity(PlanRequest(LLAMA_8B, L4.memory_gib, gpu_product=L4.product))
    assert plan.reason == REASON_KV
    needed = 131_072 * plan.kv_bytes_per_token / 2**30
    assert plan.shortfall_gib_per_gpu == pytest.approx(needed - plan.kv_cache_gib_per_gpu, abs=0.01)
    assert f"({plan.shortfall_gib_per_gpu:.2f} GiB/GPU more)" in plan.message


# --- Pipeline parallelism (pods per replica) -----------------------------------------------

DEEPSEEK_R1 = _arch("deepseek-ai/DeepSeek-R1")


@pytest.mark.parametrize(
    ("arch", "quantization", "pods"),
    [
        (LLAMA_405B, None, 2),  # BF16 756 GiB: two nodes of 8 H100s
        (LLAMA_405B, "fp8", 1),  # FP8 fits one node: no pipeline suggestion
        (DEEPSEEK_R1, None, 2),  # its FP8 checkpoint, 671B: two nodes
    ],
    ids=["405b-bf16", "405b-fp8", "deepseek-r1-fp8"],
)
def test_models_bigger_than_one_node_get_the_fewest_pods_at_tp_8(
    arch: ModelArchitecture, quantization: str | None, pods: int
) -> None:
    request = _h100(arch, tensor_parallel_size=8, quantization=quantization)
    plan = plan_capacity(request)
    pipeline = [s for s in plan.suggestions if s.startswith("engine.pipelineParallelSize")]
    if pods == 1:
        assert plan.fits, plan.message
        assert pipeline == []
        return
    assert not plan.fits
    assert pipeline == [
        f"engine.pipelineParallelSize: {pods} with engine.tensorParallelSize: 8 and "
        f"resources.gpus: 8 ({pods} pods × 8 GPUs per replica)"  # noqa: RUF001
    ]
    # And the suggested shape does fit.
    assert plan_capacity(replace(request, pipeline_parallel_size=pods)).fits


def test_pipeline_stages_split_weights_and_kv_layers() -> None:
    one = plan_capacity(_h100(LLAMA_405B, tensor_parallel_size=8))
    two = plan_capacity(_h100(LLAMA_405B, tensor_parallel_size=8, pipeline_parallel_size=2))
    three = plan_capacity(_h100(LLAMA_405B, tensor_parallel_size=8, pipeline_parallel_size=3))
    # Two stages: each holds half the layers plus the embedding or the LM head, i.e. half.
    assert two.weights_gib_per_gpu == pytest.approx(one.weights_gib_per_gpu / 2)
    # Three: the first stage holds a third of the body plus the embedding, more than a third.
    embedding = 128256 * 128 * 128
    assert stage_parameters(LLAMA_405B, 3) == pytest.approx(
        (LLAMA_405B.parameters - 2 * embedding) / 3 + embedding
    )
    assert three.weights_gib_per_gpu > one.weights_gib_per_gpu / 3
    # KV per token: ceil(126 / 2) = 63 and ceil(126 / 3) = 42 layers of 126, per TP rank.
    assert kv_layers_per_stage(LLAMA_405B, 2) == 63
    assert kv_layers_per_stage(LLAMA_405B, 4) == 32
    assert two.kv_bytes_per_token * 2 == one.kv_bytes_per_token
    assert three.kv_bytes_per_token * 3 == one.kv_bytes_per_token
    assert two.fits
    assert "2 pods x 8x" in two.message


def test_pipeline_parallel_size_must_not_exceed_the_layers() -> None:
    arch = ModelArchitecture(
        parameters=1000, layers=2, kv_heads=2, head_dim=64, max_position_embeddings=4096
    )
    plan = plan_capacity(_h100(arch, pipeline_parallel_size=3))
    assert plan.reason == REASON_INVALID_PP
    assert "exceeds the 2 layers" in plan.message
    assert plan_capacity(_h100(arch, pipeline_parallel_size=2)).fits
    with pytest.raises(ValueError, match="pipeline_parallel_size"):
        plan_capacity(_h100(arch, pipeline_parallel_size=0))


@pytest.mark.parametrize(
    ("product", "fp8", "awq", "kv_fp8"),
    [
        ("NVIDIA-H100-80GB-HBM3", "engine.quantization: fp8", True, True),
        ("NVIDIA-L40S", "engine.quantization: fp8", True, True),
        ("NVIDIA-A100-SXM4-80GB", "engine.quantization: fp8 (weight-only", True, True),
        ("Tesla-T4", None, True, False),
        ("Tesla-V100-SXM2-32GB", None, False, False),
        ("a GPU the catalog does not know", "engine.quantization: fp8", True, True),
    ],
)
def test_suggestions_are_only_what_vllm_runs_on_the_gpu(
    product: str, fp8: str | None, awq: bool, kv_fp8: bool
) -> None:
    """FP8 compute from compute capability 8.9, FP8 weight-only (Marlin) and an FP8 KV cache
    from 8.0, AWQ from 7.5: a V100 is never told to quantize to FP8 or AWQ. The memory is the
    same in every row, so only the GPU's capability differs."""

    def fixes(arch: ModelArchitecture, memory: float, max_model_len: int) -> tuple[str, ...]:
        request = PlanRequest(
            architecture=arch,
            gpu_memory_gib=memory,
            gpu_product=product,
            max_model_len=max_model_len,
        )
        assert not plan_capacity(request).fits
        return suggest_fixes(request, limit=99)

    weights = fixes(LLAMA_70B, H100.memory_gib, 131_072)  # weights that need quantizing
    fp8_rows = [s for s in weights if "quantization: fp8" in s]
    if fp8 is None:
        assert fp8_rows == [], weights
    else:
        assert fp8_rows, weights
        assert fp8_rows[0].startswith(fp8), fp8_rows
    assert any("quantization: awq" in s for s in weights) == awq, weights
    kv = fixes(LLAMA_8B, 28.0, 131_072)  # a KV cache an FP8 one would hold
    assert ("engine.kvCacheDtype: fp8" in kv) == kv_fp8, kv
