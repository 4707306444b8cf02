"""Planner catalogs: model architectures, GPU products and dtype sizes are sane and findable."""

from __future__ import annotations

import pytest

from llmop.planner import (
    GPU_CATALOG,
    MODEL_CATALOG,
    ModelArchitecture,
    kv_cache_bytes_per_element,
    lookup_gpu,
    lookup_model,
    weight_bytes_per_param,
)


@pytest.mark.parametrize("arch", MODEL_CATALOG, ids=lambda a: a.name)
def test_every_model_entry_is_positive_and_plausible(arch: ModelArchitecture) -> None:
    assert arch.name
    assert arch.parameters > 0
    assert arch.layers > 0
    assert arch.kv_heads > 0
    assert arch.head_dim > 0
    assert arch.max_position_embeddings >= 8192
    assert arch.vocab_size is not None
    assert arch.vocab_size > 30_000
    assert (arch.attention_heads and arch.attention_heads % arch.kv_heads == 0) or arch.is_mla
    if arch.is_mla:
        return
    # Attention alone (q, k, v, o) is a lower bound on the parameters per layer.
    hidden = arch.attention_heads * arch.head_dim if arch.attention_heads else 0
    attn = hidden * hidden * 2 + 2 * hidden * arch.kv_heads * arch.head_dim
    assert arch.parameters > arch.layers * attn
    # …and a dense layer with a 2-6x MLP (8 experts for Mixtral) bounds it from above.
    experts = 8 if "Mixtral" in arch.name else 1
    # hidden_size may exceed heads x head_dim (Gemma 2 27B: 4608 vs 4096): allow 1.5x slack.
    upper = arch.layers * (attn + experts * 3 * 6 * hidden * hidden) + 2 * arch.vocab_size * hidden
    assert arch.parameters < 1.5 * upper


@pytest.mark.parametrize(
    ("repo", "layers", "kv_heads", "head_dim", "max_pos"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", 32, 8, 128, 131072),
        ("meta-llama/Llama-3.2-1B", 16, 8, 64, 131072),
        ("meta-llama/Llama-3.3-70B-Instruct", 80, 8, 128, 131072),
        ("meta-llama/Llama-3.1-405B", 126, 8, 128, 131072),
        ("Qwen/Qwen2.5-0.5B-Instruct", 24, 2, 64, 32768),
        ("Qwen/Qwen2.5-72B-Instruct", 80, 8, 128, 32768),
        ("Qwen/Qwen3-0.6B", 28, 8, 128, 40960),
        ("Qwen/Qwen3-32B", 64, 8, 128, 40960),
        ("mistralai/Mistral-7B-Instruct-v0.3", 32, 8, 128, 32768),
        ("mistralai/Mixtral-8x22B-Instruct-v0.1", 56, 8, 128, 65536),
        ("google/gemma-2-9b-it", 42, 8, 256, 8192),
        ("google/gemma-2-27b-it", 46, 16, 128, 8192),
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-14B", 48, 8, 128, 131072),
        ("deepseek-ai/DeepSeek-R1", 61, 1, 576, 163840),
    ],
    ids=str,
)
def test_catalog_matches_published_configs(
    repo: str, layers: int, kv_heads: int, head_dim: int, max_pos: int
) -> None:
    arch = lookup_model(repo)
    assert arch is not None
    assert (arch.layers, arch.kv_heads, arch.head_dim, arch.max_position_embeddings) == (
        layers,
        kv_heads,
        head_dim,
        max_pos,
    )


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B-Instruct"),
        ("META-LLAMA/LLAMA-3.1-8B-INSTRUCT", "meta-llama/Llama-3.1-8B-Instruct"),
        ("meta-llama/Meta-Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B-Instruct"),
        ("meta-llama/Meta-Llama-3.1-8B", "meta-llama/Llama-3.1-8B-Instruct"),
        ("Llama-3.1-8B", "meta-llama/Llama-3.1-8B-Instruct"),
        ("Meta-Llama-3.1-70B-Instruct", "meta-llama/Llama-3.1-70B-Instruct"),
        ("Qwen/Qwen3-8B-Base", "Qwen/Qwen3-8B"),
        ("qwen2.5-7b", "Qwen/Qwen2.5-7B-Instruct"),
        ("google/gemma-2-9b", "google/gemma-2-9b-it"),
        ("deepseek-ai/DeepSeek-R1", "deepseek-ai/DeepSeek-V3"),
        ("DeepSeek-V3-Base", "deepseek-ai/DeepSeek-V3"),
        ("mistralai/Mistral-7B-Instruct-v0.2", "mistralai/Mistral-7B-Instruct-v0.3"),
    ],
    ids=str,
)
def test_model_lookup_aliases(query: str, expected: str) -> None:
    arch = lookup_model(query)
    assert arch is not None
    assert arch.name == expected


@pytest.mark.parametrize(
    "query",
    ["", "pvc://models/llama", "s3://bucket/llama", "someone/unknown-model-13B"],
    ids=["empty", "pvc", "s3", "unknown"],
)
def test_model_lookup_misses(query: str) -> None:
    assert lookup_model(query) is None


def test_architecture_validation() -> None:
    with pytest.raises(ValueError, match="layers"):
        ModelArchitecture(parameters=1, layers=0, kv_heads=1, head_dim=1, max_position_embeddings=1)
    with pytest.raises(ValueError, match="MLA"):
        ModelArchitecture(
            parameters=1,
            layers=1,
            kv_heads=1,
            head_dim=1,
            max_position_embeddings=1,
            attention="mla",
        )
    with pytest.raises(ValueError, match="attention"):
        ModelArchitecture(
            parameters=1,
            layers=1,
            kv_heads=1,
            head_dim=1,
            max_position_embeddings=1,
            attention="linear",
        )


@pytest.mark.parametrize("gpu", GPU_CATALOG, ids=lambda g: g.product)
def test_every_gpu_is_below_its_nameplate(gpu: object) -> None:
    from llmop.planner import GPUProduct

    assert isinstance(gpu, GPUProduct)
    # torch sees a little less than the nameplate (which is really GiB of HBM), never 15 % less.
    assert gpu.marketing_gb * 0.85 < gpu.memory_gib < gpu.marketing_gb
    assert lookup_gpu(gpu.product) is gpu


@pytest.mark.parametrize(
    ("query", "product"),
    [
        ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-80GB-HBM3"),
        ("h100", "NVIDIA-H100-80GB-HBM3"),
        ("H100-80GB", "NVIDIA-H100-80GB-HBM3"),
        ("NVIDIA-H100-PCIe", "NVIDIA-H100-PCIe"),
        ("H100 NVL", "NVIDIA-H100-NVL"),
        ("A100-80GB", "NVIDIA-A100-SXM4-80GB"),
        ("NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-SXM4-40GB"),
        ("NVIDIA-A100-PCIE-40GB", "NVIDIA-A100-PCIE-40GB"),
        ("L4", "NVIDIA-L4"),
        ("nvidia-l40s", "NVIDIA-L40S"),
        ("A10G", "NVIDIA-A10G"),
        ("A10", "NVIDIA-A10"),
        ("H200", "NVIDIA-H200"),
        ("B200", "NVIDIA-B200"),
        ("NVIDIA-GeForce-RTX-4090", "NVIDIA-GeForce-RTX-4090"),
        ("RTX-4090", "NVIDIA-GeForce-RTX-4090"),
    ],
    ids=str,
)
def test_gpu_lookup(query: str, product: str) -> None:
    gpu = lookup_gpu(query)
    assert gpu is not None
    assert gpu.product == product


def test_gpu_lookup_miss() -> None:
    assert lookup_gpu("NVIDIA-Imaginary-9000") is None


@pytest.mark.parametrize(
    ("dtype", "quantization", "model_dtype", "expected"),
    [
        ("auto", None, "bfloat16", 2.0),
        ("auto", None, "float32", 2.0),  # vLLM serves fp32 checkpoints in 16 bit under auto
        ("float32", None, "bfloat16", 4.0),
        ("float16", None, "bfloat16", 2.0),
        ("auto", "fp8", "bfloat16", 1.0),
        ("auto", "FP8", "bfloat16", 1.0),
        ("auto", "compressed-tensors", "bfloat16", 1.0),
        ("auto", "awq", "float16", 0.55),
        ("auto", "gptq_marlin", "float16", 0.55),
        ("auto", "bitsandbytes", "bfloat16", 0.55),
        ("auto", "none", "bfloat16", 2.0),
        ("auto", "", "bfloat16", 2.0),
    ],
    ids=str,
)
def test_weight_bytes(
    dtype: str, quantization: str | None, model_dtype: str, expected: float
) -> None:
    assert weight_bytes_per_param(dtype, quantization, model_dtype) == expected


@pytest.mark.parametrize(
    ("kv", "dtype", "expected"),
    [
        ("auto", "auto", 2.0),
        ("auto", "float32", 4.0),
        ("fp8", "auto", 1.0),
        ("fp8_e4m3", "auto", 1.0),
        ("fp8_e5m2", "auto", 1.0),
        ("bfloat16", "auto", 2.0),
    ],
    ids=str,
)
def test_kv_cache_bytes(kv: str, dtype: str, expected: float) -> None:
    assert kv_cache_bytes_per_element(kv, dtype, "bfloat16") == expected
