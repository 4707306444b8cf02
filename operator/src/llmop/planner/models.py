"""Built-in catalog of model architectures for the capacity planner.

The planner needs only what sizes memory: the parameter count (weights), and the attention
shape (KV cache per token). Entries are keyed by Hugging Face repo id; lookup is
case-insensitive, accepts the id without its org, ignores instruct/base/chat suffixes (they
share an architecture) and knows the renamed Llama ids (``Meta-Llama-3.1-8B-Instruct`` ↔
``Llama-3.1-8B-Instruct``).

Field values are copied from each repo's published ``config.json``; the sources are noted per
family below. Parameter counts are the safetensors totals shown on the model pages (the
embedding and, when untied, the LM head are included: vLLM loads them).

Sliding-window models (Gemma 2: every other layer has a 4096-token window; Mistral v0.1): the
catalog records ``sliding_window`` but the planner charges every layer for the full context,
as DESIGN §6 prescribes. vLLM's hybrid KV manager caps the sliding layers at the window
(vllm-contract.md §8.2), so for Gemma 2 at 8192 tokens the real per-request cost is ≈ 25 %
lower; the plan errs on the safe side.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from llmop.planner.kv_layout import AttentionLayer, StateShape

ATTENTION_GQA = "gqa"
"""Multi-head or grouped-query attention: K and V per KV head per layer."""
ATTENTION_MLA = "mla"
"""DeepSeek multi-head latent attention: one compressed latent per layer."""


@dataclass(frozen=True)
class ModelArchitecture:
    """What the planner needs to know about a model.

    The first five fields mirror the CR's ``model.architecture`` override (``parameters``,
    ``layers``, ``kvHeads``, ``headDim``, ``maxPositionEmbeddings``); everything after them is
    optional and has a safe default.
    """

    parameters: int
    """Total parameter count (all experts for MoE models)."""
    layers: int
    """``num_hidden_layers``."""
    kv_heads: int
    """``num_key_value_heads`` (== attention heads for MHA; 1 for MLA; 0 for a state-space
    model, which has no attention)."""
    head_dim: int
    """``head_dim``, else ``hidden_size // num_attention_heads`` (0 for a state-space model)."""
    max_position_embeddings: int
    """Context length vLLM uses when ``--max-model-len`` is not given."""
    dtype: str = "bfloat16"
    """``torch_dtype`` from config.json: what ``--dtype auto`` resolves to."""
    attention: str = ATTENTION_GQA
    kv_lora_rank: int | None = None
    """MLA only: ``kv_lora_rank`` (512 for DeepSeek V2/V3)."""
    qk_rope_head_dim: int | None = None
    """MLA only: ``qk_rope_head_dim`` (64 for DeepSeek V2/V3)."""
    attention_heads: int | None = None
    """``num_attention_heads``; vLLM requires tensor-parallel size to divide it."""
    vocab_size: int | None = None
    """``vocab_size``; the profiled activation peak grows with it (see capacity.py)."""
    sliding_window: int | None = None
    """Window of the sliding-window layers, for information (see module docstring)."""
    default_quantization: str | None = None
    """``quantization_config.quant_method`` of the published checkpoint (DeepSeek V3: fp8)."""
    name: str = ""
    """Canonical repo id, for messages."""
    attention_layers: tuple[AttentionLayer, ...] = ()
    """Per-layer KV shapes read from the model's files (full, sliding, chunked, MLA), planned
    the way vLLM groups them (kv_layout.py); empty: ``layers`` uniform layers (the catalog)."""
    checkpoint_bytes: int | None = None
    """Bytes of the checkpoint's tensors (safetensors index ``metadata.total_size`` or header
    dtype counts): exact weights, quantization scales included. None: parameters x bytes."""
    hidden_size: int | None = None
    active_parameters: int | None = None
    """Parameters one token passes through (MoE: the routed experts only); None: all."""
    moe: bool = False
    """A mixture-of-experts model (its activation peak is a little higher)."""
    source: str = "catalog"
    """Where the facts came from: ``catalog``, ``spec`` (model.architecture), ``files``
    (a directory) or ``hub`` (the model's files at a revision)."""
    pipeline_parallel: str | None = None
    """vLLM's model class that does not implement ``SupportsPP`` (vLLM refuses pipeline stages
    for it: "Pipeline parallelism is not supported for this model"); None: it does."""
    cpu_unsupported: str | None = None
    """Why vLLM's CPU build cannot load this model (a layer only its GPU kernels run), for the
    CPU engine's refusal; None: it can."""

    def __post_init__(self) -> None:
        # A state-space model (Mamba) has no attention heads: kv_heads and head_dim are 0, and
        # its every layer is a state layer (the planner sizes it from attention_layers).
        attention_free = bool(self.attention_layers) and all(
            layer.state is not None for layer in self.attention_layers
        )
        for field in ("parameters", "layers", "kv_heads", "head_dim", "max_position_embeddings"):
            value = getattr(self, field)
            if value <= 0 and not (attention_free and value == 0 and "head" in field):
                raise ValueError(f"ModelArchitecture.{field} must be positive")
        if self.attention not in (ATTENTION_GQA, ATTENTION_MLA):
            raise ValueError(f"attention must be {ATTENTION_GQA!r} or {ATTENTION_MLA!r}")
        if self.attention == ATTENTION_MLA and (not self.kv_lora_rank or not self.qk_rope_head_dim):
            raise ValueError("MLA architectures need kv_lora_rank and qk_rope_head_dim")

    @property
    def is_mla(self) -> bool:
        return self.attention == ATTENTION_MLA

    @property
    def state_layers(self) -> tuple[StateShape, ...]:
        """The state shapes of its Mamba or linear-attention layers (none: a transformer)."""
        return tuple(layer.state for layer in self.attention_layers if layer.state is not None)


def _gqa(  # noqa: PLR0917 - positional on purpose: each catalog row reads like a table line
    name: str,
    parameters: int,
    layers: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    max_pos: int,
    vocab: int,
    *,
    sliding_window: int | None = None,
) -> ModelArchitecture:
    return ModelArchitecture(
        name=name,
        parameters=parameters,
        layers=layers,
        kv_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_pos,
        attention_heads=heads,
        vocab_size=vocab,
        sliding_window=sliding_window,
    )


_CATALOG: tuple[ModelArchitecture, ...] = (
    # --- Llama 3.x. config.json of meta-llama/Llama-3.1-8B and Llama-3.2-3B vendored verbatim
    # in citsjtu2020/LLM-Prof sglang/Model_Config.md; 1B/70B/405B per vllm-contract.md §8.3
    # (confirmed there against the published config.json). 3.3-70B has the 3.1-70B config.
    _gqa("meta-llama/Llama-3.2-1B-Instruct", 1_235_814_400, 16, 32, 8, 64, 131072, 128256),
    _gqa("meta-llama/Llama-3.2-3B-Instruct", 3_212_749_824, 28, 24, 8, 128, 131072, 128256),
    _gqa("meta-llama/Llama-3.1-8B-Instruct", 8_030_261_248, 32, 32, 8, 128, 131072, 128256),
    _gqa("meta-llama/Llama-3.1-70B-Instruct", 70_553_706_496, 80, 64, 8, 128, 131072, 128256),
    _gqa("meta-llama/Llama-3.3-70B-Instruct", 70_553_706_496, 80, 64, 8, 128, 131072, 128256),
    _gqa("meta-llama/Llama-3.1-405B-Instruct", 405_853_388_800, 126, 128, 8, 128, 131072, 128256),
    # --- Qwen2.5. 3B/7B/14B/32B config.json vendored in citsjtu2020/LLM-Prof
    # sglang/Model_Config.md (base repos: max_position_embeddings 131072 for 7B+ there); the
    # -Instruct repos publish 32768 (vllm-contract.md §8.3), which is what we use: vLLM reads it
    # as the default max-model-len. 0.5B/1.5B/72B per §8.3.
    _gqa("Qwen/Qwen2.5-0.5B-Instruct", 494_032_768, 24, 14, 2, 64, 32768, 151936),
    _gqa("Qwen/Qwen2.5-1.5B-Instruct", 1_543_714_304, 28, 12, 2, 128, 32768, 151936),
    _gqa("Qwen/Qwen2.5-3B-Instruct", 3_085_938_688, 36, 16, 2, 128, 32768, 151936),
    _gqa("Qwen/Qwen2.5-7B-Instruct", 7_615_616_512, 28, 28, 4, 128, 32768, 152064),
    _gqa("Qwen/Qwen2.5-14B-Instruct", 14_770_033_664, 48, 40, 8, 128, 32768, 152064),
    _gqa("Qwen/Qwen2.5-32B-Instruct", 32_763_876_352, 64, 40, 8, 128, 32768, 152064),
    _gqa("Qwen/Qwen2.5-72B-Instruct", 72_706_203_648, 80, 64, 8, 128, 32768, 152064),
    # --- Qwen3 (dense). 4B/8B/14B/32B config.json vendored in citsjtu2020/LLM-Prof
    # sglang/Model_Config.md; 1.7B from zyzshishui/slime scripts/models/qwen3-1.7B.sh (28
    # layers, 16 heads, 8 query groups, kv-channels 128); 0.6B per vllm-contract.md §8.3.
    # Explicit head_dim 128 even where hidden/heads is 64 (0.6B) or 80 (4B).
    _gqa("Qwen/Qwen3-0.6B", 596_049_920, 28, 16, 8, 128, 40960, 151936),
    _gqa("Qwen/Qwen3-1.7B", 2_031_739_904, 28, 16, 8, 128, 40960, 151936),
    _gqa("Qwen/Qwen3-4B", 4_022_468_096, 36, 32, 8, 128, 40960, 151936),
    _gqa("Qwen/Qwen3-8B", 8_190_735_360, 36, 32, 8, 128, 40960, 151936),
    _gqa("Qwen/Qwen3-14B", 14_768_307_200, 40, 40, 8, 128, 40960, 151936),
    _gqa("Qwen/Qwen3-32B", 32_762_123_264, 64, 64, 8, 128, 40960, 151936),
    # --- Mistral / Mixtral: vllm-contract.md §8.3 (from the published config.json).
    # Mistral-7B-v0.3 has no sliding window (v0.1 had 4096); vocab 32768 from v0.3 on.
    _gqa("mistralai/Mistral-7B-Instruct-v0.3", 7_248_023_552, 32, 32, 8, 128, 32768, 32768),
    _gqa("mistralai/Mixtral-8x7B-Instruct-v0.1", 46_702_792_704, 32, 32, 8, 128, 32768, 32000),
    _gqa("mistralai/Mixtral-8x22B-Instruct-v0.1", 140_630_071_296, 56, 48, 8, 128, 65536, 32768),
    # --- Gemma 2: vllm-contract.md §8.3 (9B confirmed against config.json there). head_dim is
    # explicit (256 for 2B/9B although hidden/heads = 288/224). torch_dtype is float32 in some
    # of these repos; vLLM serves them in 16 bit under --dtype auto, so we record bfloat16.
    _gqa("google/gemma-2-2b-it", 2_614_341_888, 26, 8, 4, 256, 8192, 256000, sliding_window=4096),
    _gqa("google/gemma-2-9b-it", 9_241_705_984, 42, 16, 8, 256, 8192, 256000, sliding_window=4096),
    _gqa(
        "google/gemma-2-27b-it", 27_227_128_320, 46, 32, 16, 128, 8192, 256000, sliding_window=4096
    ),
    # --- DeepSeek-R1 distills: same shapes as their bases (Qwen2.5-Math-1.5B, Qwen2.5-7B/14B/32B,
    # Llama-3.1-8B, Llama-3.3-70B) per vllm-contract.md §8.3; the distill repos publish
    # max_position_embeddings 131072. The 1.5B unties the embeddings (1.78B total).
    _gqa(
        "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", 1_777_088_000, 28, 12, 2, 128, 131072, 151936
    ),
    _gqa("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", 7_615_616_512, 28, 28, 4, 128, 131072, 152064),
    _gqa(
        "deepseek-ai/DeepSeek-R1-Distill-Qwen-14B", 14_770_033_664, 48, 40, 8, 128, 131072, 152064
    ),
    _gqa(
        "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B", 32_763_876_352, 64, 40, 8, 128, 131072, 152064
    ),
    _gqa("deepseek-ai/DeepSeek-R1-Distill-Llama-8B", 8_030_261_248, 32, 32, 8, 128, 131072, 128256),
    _gqa(
        "deepseek-ai/DeepSeek-R1-Distill-Llama-70B", 70_553_706_496, 80, 64, 8, 128, 131072, 128256
    ),
    # --- DeepSeek V3 / R1 (MLA): vllm-contract.md §8.2/§8.3 (confirmed against config.json):
    # 61 layers, kv_lora_rank 512, qk_rope_head_dim 64, 128 heads, max_position_embeddings
    # 163840, vocab 129280. The checkpoint is block-FP8 (quantization_config.quant_method
    # "fp8"), so weights cost 1 byte/param by default. 671B without the MTP module, which vLLM
    # loads only for speculative decoding.
    ModelArchitecture(
        name="deepseek-ai/DeepSeek-V3",
        parameters=671_000_000_000,
        layers=61,
        kv_heads=1,
        head_dim=576,
        max_position_embeddings=163840,
        attention=ATTENTION_MLA,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        attention_heads=128,
        vocab_size=129280,
        default_quantization="fp8",
    ),
)

# Repo ids that are renames or siblings of a catalog entry (same weights shape).
_ALIASES: dict[str, str] = {
    "deepseek-ai/DeepSeek-R1": "deepseek-ai/DeepSeek-V3",
    "deepseek-ai/DeepSeek-R1-0528": "deepseek-ai/DeepSeek-V3",
    "deepseek-ai/DeepSeek-V3-0324": "deepseek-ai/DeepSeek-V3",
    "deepseek-ai/DeepSeek-V3-Base": "deepseek-ai/DeepSeek-V3",
    "mistralai/Mistral-7B-Instruct-v0.2": "mistralai/Mistral-7B-Instruct-v0.3",
    "Qwen/Qwen2.5-Coder-7B-Instruct": "Qwen/Qwen2.5-7B-Instruct",
    "Qwen/Qwen2.5-Coder-14B-Instruct": "Qwen/Qwen2.5-14B-Instruct",
    "Qwen/Qwen2.5-Coder-32B-Instruct": "Qwen/Qwen2.5-32B-Instruct",
}

# Suffixes that do not change the architecture. Order matters: longest first.
_VARIANT_SUFFIXES = ("-instruct", "-chat", "-base", "-it", "-hf")


def _normalise(repo_id: str) -> str:
    """Lower-case key without org, variant suffix or the ``meta-`` prefix of old Llama ids."""
    name = repo_id.strip().lower().rstrip("/")
    name = name.split("/")[-1]
    name = re.sub(r"^meta-llama-3", "llama-3", name)
    for suffix in _VARIANT_SUFFIXES:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return name


def _build_index() -> dict[str, ModelArchitecture]:
    index: dict[str, ModelArchitecture] = {}
    by_name = {arch.name: arch for arch in _CATALOG}
    for arch in _CATALOG:
        index[arch.name.lower()] = arch
        index.setdefault(_normalise(arch.name), arch)
    for alias, target in _ALIASES.items():
        index[alias.lower()] = by_name[target]
        index.setdefault(_normalise(alias), by_name[target])
    return index


_INDEX = _build_index()

MODEL_CATALOG: tuple[ModelArchitecture, ...] = _CATALOG
"""All built-in entries (one per architecture; aliases resolve to these)."""


def lookup_model(repo_id: str) -> ModelArchitecture | None:
    """Architecture for a Hugging Face repo id, or None when the catalog does not know it.

    Accepts any case, the id with or without org, instruct/base/chat variants and the old
    ``Meta-Llama-3.1-*`` names. ``pvc://`` / ``s3://`` sources are not repo ids: None.
    """
    key = repo_id.strip().lower()
    if "://" in key or not key:
        return None
    return _INDEX.get(key) or _INDEX.get(_normalise(repo_id))
