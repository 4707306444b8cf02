"""vLLM's automatic prefix caching, modelled: full KV blocks keyed by a chain of content hashes,
kept in LRU order, matched from a prompt's start.

vLLM hashes each full block of `block_size` tokens together with its parent block's hash, so a
block hits only when everything before it matches too. A request hits whole blocks only, at most
the ones before its last prompt token (vLLM recomputes that token for its logits, so a prompt of
exactly n blocks hits at most n - 1), and prefills the tokens after its hit. Without a tokenizer
the simulator cuts the templated prompt text into blocks of `block_size` x 4 characters (its own
token estimate is 4 characters a token); a prompt sent as token ids is cut into blocks of ids
(`id_blocks`), so it shares no block with the same prompt sent as text.

Capacity is the engine's KV blocks less vLLM's reserved null block: cached content lives in free
blocks until they are reused, so an engine whose working set of prefixes exceeds its KV cache
evicts the least recently used ones — which is what prefix-aware routing avoids. vLLM frees a
finished request's blocks last block first, so the head of a prefix is evicted last and a partly
evicted prompt still hits its first blocks. Blocks without content hash (a partial last block)
go to the front of vLLM's free queue and are reused before any cached block, so they displace
nothing; full blocks of generated tokens, and the fresh copy of a cached block vLLM recomputes
(the last prompt token's), are cached too but hit no later prompt here: they take LRU slots as
anonymous blocks. The model keeps cached blocks apart from the blocks running requests reserve
(vLLM shares them), so an engine under load caches a little more than vLLM would.

Checked against real vLLM's CPU build on the same prompts: tests/engine/test_prefix_cache_vllm.py.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import OrderedDict
from collections.abc import Sequence

from llmop_engine.simulator.tokens import role_and_content

CHARS_PER_TOKEN = 4


def prompt_blocks(text: str, block_size: int) -> tuple[int, ...]:
    """Chained hashes of the full blocks of a templated prompt."""
    width = block_size * CHARS_PER_TOKEN
    parent = b""
    hashes = []
    for start in range(0, len(text) - width + 1, width):
        digest = hashlib.blake2b(parent + text[start : start + width].encode(), digest_size=8)
        parent = digest.digest()
        hashes.append(int.from_bytes(parent, "big"))
    return tuple(hashes)


def id_blocks(ids: Sequence[int], block_size: int) -> tuple[int, ...]:
    """Chained hashes of the full blocks of a prompt given as token ids (vLLM hashes ids)."""
    parent = b""
    hashes = []
    for start in range(0, len(ids) - block_size + 1, block_size):
        chunk = b",".join(str(t).encode() for t in ids[start : start + block_size])
        parent = hashlib.blake2b(b"ids:" + parent + chunk, digest_size=8).digest()
        hashes.append(int.from_bytes(parent, "big"))
    return tuple(hashes)


def cached_tokens(hit_blocks: int, prompt_tokens: int, block_size: int) -> int:
    """Tokens a prompt reads from the cache when its first `hit_blocks` blocks are cached."""
    return min(hit_blocks, max(0, prompt_tokens - 1) // block_size) * block_size


def chat_text(messages: Sequence[object]) -> str:
    """The text a chat template would produce: role markers around each message's content."""
    parts = []
    for message in messages:
        role, raw = role_and_content(message)
        content = str(raw) if isinstance(message, dict) else ""
        parts.append(f"<|{role}|>\n{content}<|end|>\n")
    return "".join(parts)


class PrefixCache:
    """LRU of cached KV blocks, at most `capacity`: prompt blocks by hash, and anonymous blocks
    that take a slot but never hit."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._blocks: OrderedDict[int, None] = OrderedDict()
        # Hashes are unsigned, so negative keys never collide with cached content.
        self._anonymous = itertools.count(-1, -1)

    def __len__(self) -> int:
        return len(self._blocks)

    def match(self, blocks: Sequence[int]) -> int:
        """How many of `blocks`, from the first, are cached."""
        hits = 0
        for block in blocks:
            if block not in self._blocks:
                break
            hits += 1
        return hits

    def add(self, blocks: Sequence[int], anonymous: int = 0, partial: int = 0) -> None:
        """Keep a request's blocks as the most recently used, freed as vLLM frees them: first its
        `anonymous` blocks (generated tokens, recomputed copies), then the prompt's from last to
        first (its head is used last, evicted last). Evicts the least recently used past
        capacity, less the `partial` blocks the request holds uncached while it runs (vLLM
        evicts to make room for them too; once freed they cache nothing)."""
        for _ in range(anonymous):
            self._blocks[next(self._anonymous)] = None
        for block in reversed(blocks):
            self._blocks[block] = None
            self._blocks.move_to_end(block)
        while self._blocks and len(self._blocks) > self.capacity - partial:
            self._blocks.popitem(last=False)
