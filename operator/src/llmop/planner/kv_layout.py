"""vLLM's KV-cache arithmetic per layer type: pages, groups, blocks, per-request reserve. Pure.

Mirrors vLLM's v1 KV manager (../shared/reference/planner-from-files.md §2, file references to
vLLM 0.19.0 ``v1/kv_cache_interface.py`` and ``v1/core/kv_cache_utils.py``):

* every attention layer gets a spec: full attention, sliding window, chunked local attention or
  MLA; its page (one block of ``block_size`` tokens) is ``block x kv_heads_per_rank x
  (head_size + head_size_v) x bytes`` — MLA ``block x (kv_lora_rank + rope) x bytes``, one
  latent replicated on every tensor-parallel rank;
* one type → one group of all layers; several types with one page size → groups of
  ``group_size`` layers (the fewest layers of a type, or the most when max < 1.5 x min), each
  type split into ``ceil(n / group_size)`` groups; pages of different sizes are made equal by
  growing the smaller blocks (``unify_kv_cache_spec_page_size``);
* ``num_blocks = available // page // group_size``; every group draws from that pool;
* one request of ``max_model_len`` reserves per group: full/MLA ``ceil(len / block)``,
  sliding ``ceil(min(window - 1 + reserve, len) / block) + 1``, chunked
  ``ceil(min(chunk + reserve, len) / block)`` blocks, where reserve is the batch in flight
  (``VllmProfile.sliding_reserve_tokens``); max concurrency = num_blocks / Σ groups' blocks.

Mamba, linear-attention (gated delta net) and short-convolution (LFM2) layers keep a state per
request instead of a page per token (vLLM 0.32 ``MambaSpec``; shapes from
``MambaStateShapeCalculator``). In a hybrid, vLLM raises the attention block size to the
smallest multiple of the kernel block size (16 on GPU, the CPU backend's 128) whose page holds
the largest state, and pads the state pages to it (``Platform._align_hybrid_block_size``): then
every page is one size and the groups form as above. With prefix caching on (vLLM's default for
hybrids: ``mamba_cache_mode`` ``align``) a state group reserves 2 pages per request, and a
Mamba-2 one a third for its prefill checkpoint (``MambaMixer2.get_kv_cache_spec``:
``num_prefill_checkpoint_blocks=1``; Mamba-1's ``MambaMixer`` keeps ``MambaSpec``'s 0); without,
1 page.

A pure state-space model (Mamba-1, Falcon-Mamba, Mamba-2: ``IsAttentionFree``) has no attention
block to grow: vLLM leaves the state pages unpadded (``update_block_size_for_backend`` aligns
hybrids only), puts all layers, one spec, in one group (``is_kv_cache_spec_uniform``), and with
prefix caching off (its default for attention-free models: ``is_prefix_caching_supported``;
``MambaModelConfig`` then sets ``mamba_cache_mode`` ``none`` and the Mamba block to
``max_model_len``) a request holds 1 page: ``num_blocks = available // state // layers``, max
concurrency = num_blocks, and the logged tokens num_blocks x max_model_len.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

FULL = "full"
SLIDING = "sliding"
CHUNKED = "chunked"
MLA = "mla"
STATE = "state"
KINDS = (FULL, SLIDING, CHUNKED, MLA, STATE)

MAMBA1 = "mamba1"
MAMBA2 = "mamba2"
GATED_DELTA_NET = "gated_delta_net"
SHORT_CONV = "short_conv"

StateBytes = tuple[float, float]
"""Bytes of one element of a state layer's (conv state, temporal state)."""


def _divide(total: int, parts: int, what: str) -> int:
    if total % parts:
        raise ValueError(f"tensor parallel size {parts} does not divide {what} {total}")
    return total // parts


@dataclass(frozen=True)
class StateShape:
    """A Mamba-1, Mamba-2 or gated-delta-net layer's state per request, before tensor
    parallelism (vLLM 0.32 ``MambaStateShapeCalculator.mamba1_state_shape`` /
    ``mamba2_state_shape`` / ``gated_delta_net_state_shape``): a convolution state of
    ``conv_kernel - 1`` steps and a temporal (SSM) state."""

    family: str
    heads: int
    """Mamba-2: SSM heads; gated delta net: value heads; Mamba-1: 1 (it has none)."""
    head_dim: int
    """Mamba-2: head dimension; gated delta net: value head dimension; Mamba-1: 1."""
    state_size: int
    """Mamba-1 and -2: SSM state size; gated delta net: key head dimension."""
    conv_kernel: int
    groups: int
    """Mamba-2: ``n_groups``; gated delta net: key heads; Mamba-1: 1."""
    intermediate: int = 0
    """Mamba-1 and -2: the mixer's inner size (``mamba_expand x hidden_size``; Falcon-H1's
    ``mamba_d_ssm``)."""
    temporal_bytes: float | None = None
    """Bytes of a temporal (SSM) state element when the model sets its own (Nemotron-H:
    float32 by default); None: the caller's (the model's dtype)."""

    @property
    def checkpoint_blocks(self) -> int:
        """Pages beyond the 2 of prefix caching's ``align`` mode (a Mamba-2 prefill
        checkpoint)."""
        return 1 if self.family == MAMBA2 else 0

    def elements(self, tensor_parallel_size: int) -> tuple[int, int]:
        """(conv state, temporal state) elements on one rank."""
        tp = tensor_parallel_size
        steps = self.conv_kernel - 1
        if self.family == MAMBA1:
            # Mamba-1 splits its inner channels, conv and SSM state alike, over the ranks.
            inner = _divide(self.intermediate, tp, "mamba inner size")
            return inner * steps, inner * self.state_size
        if self.family == SHORT_CONV:
            # LFM2's ShortConv (vLLM 0.32 `short_conv_state_shape`): one conv state of
            # conv_dim / TP channels x (conv_L_cache - 1) steps, no temporal state.
            return _divide(self.intermediate, tp, "short conv dim") * steps, 0
        if self.family == MAMBA2:
            # vLLM's `extra_groups_for_head_shards`: groups TP does not divide are extended to
            # TP of them, so that every rank holds the groups of its heads.
            groups = self.groups if self.groups % tp == 0 else tp
            conv = _divide(self.intermediate + 2 * groups * self.state_size, tp, "conv dim")
            heads = _divide(self.heads, tp, "mamba heads")
            return conv * steps, heads * self.head_dim * self.state_size
        conv_dim = self.state_size * self.groups * 2 + self.head_dim * self.heads
        conv = _divide(conv_dim, tp, "conv dim")
        heads = _divide(self.heads, tp, "linear value heads")
        return conv * steps, heads * self.head_dim * self.state_size


@dataclass(frozen=True)
class AttentionLayer:
    """One layer's KV shape, before tensor parallelism."""

    kind: str
    kv_heads: int
    """Total KV heads (1 for MLA)."""
    head_size: int
    """K head size (MLA: kv_lora_rank + qk_rope_head_dim)."""
    head_size_v: int
    """V head size (0 for MLA: the latent is stored once)."""
    window: int | None = None
    """Sliding window or attention chunk, in tokens (None for full and MLA)."""
    state: StateShape | None = None
    """A state layer's (Mamba-2, gated delta net) per-request state; it has no KV heads."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown attention layer kind {self.kind!r}")
        if self.kind in (SLIDING, CHUNKED) and not self.window:
            raise ValueError(f"a {self.kind} layer needs a window")
        if (self.kind == STATE) != (self.state is not None):
            raise ValueError("a state layer, and only one, carries a state shape")

    def state_bytes(self, tensor_parallel_size: int, state_element_bytes: StateBytes) -> int:
        """A state layer's state per request on one rank (0 for attention layers)."""
        if self.state is None:
            return 0
        conv, temporal = self.state.elements(tensor_parallel_size)
        # The model's own SSM dtype where it sets one, unless the caller's is wider: the CPU
        # build keeps SSM states in float32 (cpu.py), and the wider errs on the safe side.
        temporal_bytes = max(self.state.temporal_bytes or 0.0, state_element_bytes[1])
        return int(conv * state_element_bytes[0] + temporal * temporal_bytes)

    def kv_heads_per_rank(self, tensor_parallel_size: int) -> int:
        """vLLM keeps at least one KV head per rank (replicates when TP > heads); MLA's latent
        is not split at all."""
        if self.kind == MLA:
            return 1
        return max(1, self.kv_heads // tensor_parallel_size)

    def bytes_per_token(self, tensor_parallel_size: int, element_bytes: float) -> float:
        if self.kind == STATE:
            return 0.0
        heads = self.kv_heads_per_rank(tensor_parallel_size)
        return heads * (self.head_size + self.head_size_v) * element_bytes


def full_layers(count: int, kv_heads: int, head_size: int) -> tuple[AttentionLayer, ...]:
    """``count`` plain full-attention layers (the legacy uniform model)."""
    return (AttentionLayer(FULL, kv_heads, head_size, head_size),) * count


@dataclass(frozen=True)
class KVGroup:
    kind: str
    window: int | None
    layers: int
    """Layers in this group (the last group of a type may be padded; vLLM pads it)."""


@dataclass(frozen=True)
class KVLayout:
    """The KV cache of one pipeline stage on one tensor-parallel rank."""

    block_size: int
    page_bytes: int
    """Bytes of one block of one layer (after page unification)."""
    group_size: int
    groups: tuple[KVGroup, ...]
    block_sizes: tuple[int, ...]
    """Per group: tokens per block (grows for layers whose page was unified upward)."""
    bytes_per_token: int
    """Sum over the stage's layers of what one token costs on this rank."""
    state_blocks: int = 3
    """Pages a state group reserves per request (module docstring)."""

    def num_blocks(self, available_bytes: float) -> int:
        """Blocks the pool holds: every block is one page in each of group_size tensors."""
        if available_bytes <= 0:
            return 0
        return int(available_bytes // self.page_bytes // self.group_size)

    def blocks_per_request(
        self, max_model_len: int, reserve_tokens: int, *, uncapped: bool = False
    ) -> int:
        """Blocks one request of max_model_len holds across all groups (what max concurrency
        divides by). ``uncapped``: sliding/chunked layers cost like full ones (the hybrid
        manager off)."""
        total = 0
        for group, block in zip(self.groups, self.block_sizes, strict=True):
            if group.kind == STATE:
                total += self.state_blocks
                continue
            total += _group_blocks(group, block, max_model_len, reserve_tokens, uncapped)
        return total

    def logged_tokens_from_blocks(self, num_blocks: int) -> int:
        """vLLM 0.19's "GPU KV cache size": blocks per group times the smallest block."""
        return num_blocks // len(self.groups) * min(self.block_sizes)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _group_blocks(
    group: KVGroup, block: int, max_model_len: int, reserve: int, uncapped: bool
) -> int:
    if uncapped or group.kind in (FULL, MLA):
        return _cdiv(max_model_len, block)
    assert group.window is not None
    if group.kind == SLIDING:
        return _cdiv(min(group.window - 1 + reserve, max_model_len), block) + 1
    return _cdiv(min(group.window + reserve, max_model_len), block)


def _group_size(counts: list[int]) -> int:
    """vLLM's ``_get_kv_cache_groups_uniform_page_size``: the fewest layers of a type, unless
    the most is under 1.5x that (then the most: fewer padded groups)."""
    smallest, largest = min(counts), max(counts)
    return largest if largest < 1.5 * smallest else smallest


def _state_layout(
    layers: tuple[AttentionLayer, ...],
    *,
    tp: int,
    element_bytes: float,
    state_element_bytes: StateBytes,
    block_size: int,
    prefix_caching: bool,
) -> KVLayout:
    """A model with state layers (the module docstring): attention blocks grown until a page
    holds the largest state, state pages padded to that page, then uniform-page groups."""
    shapes = [layer.state for layer in layers if layer.state is not None]
    states = [layer.state_bytes(tp, state_element_bytes) for layer in layers if layer.state]
    attention = [layer for layer in layers if layer.kind != STATE]
    largest_state = max(states)
    extra = max(shape.checkpoint_blocks for shape in shapes)
    state_blocks = 2 + extra if prefix_caching and attention else 1
    if not attention:
        # Attention-free (module docstring): one group, unpadded state pages, 1 page a request
        # (vLLM's default keeps prefix caching off for these models).
        group = KVGroup(STATE, None, len(layers))
        return KVLayout(block_size, largest_state, len(layers), (group,), (block_size,), 0, 1)
    if any(layer.kind != FULL for layer in attention):
        raise ValueError("the planner sizes Mamba hybrids with full attention layers only")
    per_token = {layer.bytes_per_token(tp, element_bytes) for layer in attention}
    if len(per_token) != 1:
        raise ValueError("the attention layers of a Mamba hybrid differ in shape")
    token_bytes = per_token.pop()
    block = max(block_size, block_size * -(-largest_state // int(block_size * token_bytes)))
    page = int(block * token_bytes)
    size = _group_size([len(attention), len(states)])
    groups = [KVGroup(FULL, None, size)] * _cdiv(len(attention), size)
    groups += [KVGroup(STATE, None, size)] * _cdiv(len(states), size)
    bytes_per_token = int(token_bytes * len(attention))
    return KVLayout(
        block, page, size, tuple(groups), (block,) * len(groups), bytes_per_token, state_blocks
    )


def build_layout(
    layers: tuple[AttentionLayer, ...],
    *,
    tensor_parallel_size: int,
    element_bytes: float,
    block_size: int,
    hybrid: bool = True,
    state_element_bytes: StateBytes = (2.0, 2.0),
    prefix_caching: bool = True,
) -> KVLayout:
    """Group one stage's layers as vLLM does. ``hybrid`` False (the hybrid KV manager off):
    sliding and chunked layers become full attention. State layers (Mamba-2, gated delta net)
    cost ``state_element_bytes`` per element, and their pages per request depend on
    ``prefix_caching`` (vLLM's default: on)."""
    if not layers:
        raise ValueError("a KV layout needs at least one layer")
    tp = tensor_parallel_size
    if any(layer.kind == STATE for layer in layers):
        return _state_layout(
            layers,
            tp=tp,
            element_bytes=element_bytes,
            state_element_bytes=state_element_bytes,
            block_size=block_size,
            prefix_caching=prefix_caching,
        )
    # A type is (kind, window, page): layers of one kind with different shapes are one group in
    # vLLM (UniformTypeKVCacheSpecs) whose page is their sum; with one shape that sum is
    # page x layers, which the group arithmetic below gives as well.
    specs: list[tuple[str, int | None, int]] = []
    for layer in layers:
        kind, window = (layer.kind, layer.window) if hybrid or layer.kind == MLA else (FULL, None)
        page = int(block_size * layer.bytes_per_token(tp, element_bytes))
        specs.append((kind, window, page))
    per_token = int(sum(layer.bytes_per_token(tp, element_bytes) for layer in layers))
    counts = Counter(specs)
    kinds = {(kind, window) for kind, window, _ in counts}
    if len(kinds) == 1:
        pages = {page for _, _, page in counts}
        (kind, window) = next(iter(kinds))
        if len(pages) == 1:
            group = KVGroup(kind, window, len(layers))
            return KVLayout(
                block_size, pages.pop(), len(layers), (group,), (block_size,), per_token
            )
        total_page = sum(page for _, _, page in specs)
        group = KVGroup(kind, window, len(layers))
        return KVLayout(block_size, total_page, 1, (group,), (block_size,), per_token)
    # Page unification: the largest page wins; smaller pages grow their block size to match.
    largest = max(page for _, _, page in counts)
    by_type: Counter[tuple[str, int | None, int]] = Counter()
    for (kind, window, page), n in counts.items():
        if largest % page:
            raise ValueError(
                "vLLM cannot give these layers one page size "
                f"({page} and {largest} bytes per block)"
            )
        by_type[(kind, window, block_size * largest // page)] += n
    size = _group_size(list(by_type.values()))
    groups: list[KVGroup] = []
    blocks: list[int] = []
    for (kind, window, block), n in sorted(by_type.items(), key=lambda item: item[0][0] != FULL):
        for _ in range(_cdiv(n, size)):
            groups.append(KVGroup(kind, window, size))
            blocks.append(block)
    return KVLayout(block_size, largest, size, tuple(groups), tuple(blocks), per_token)
