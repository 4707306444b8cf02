"""vLLM's automatic prefix caching, modelled: full KV blocks keyed by a chain of content hashes,
kept in LRU order, matched from a prompt's start.

vLLM hashes each full block of `block_size` tokens together with its parent block's hash, so a
block hits only when everything before it matches too; a request's prefill computes only the
tokens after its longest cached prefix (at least its last token). Without a tokenizer the
simulator cuts the templated prompt text into blocks of `block_size` x 4 characters (its own
token estimate is 4 characters a token). Capacity is the engine's KV blocks: cached content
lives in free blocks until they are reused, so an engine whose working set of prefixes exceeds
its KV cache evicts the least recently used ones — which is what prefix-aware routing avoids.
The model keeps cached blocks apart from the blocks running requests reserve (vLLM shares them),
so an engine under load caches a little more than vLLM would.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

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


def chat_text(messages: Sequence[object]) -> str:
    """The text a chat template would produce: role markers around each message's content."""
    parts = []
    for message in messages:
        role, content = "user", ""
        if isinstance(message, dict):
            role = str(message.get("role", "user"))
            raw = message.get("content", "")
            if isinstance(raw, list):
                raw = " ".join(str(p.get("text", "")) for p in raw if isinstance(p, dict))
            content = str(raw)
        parts.append(f"<|{role}|>\n{content}<|end|>\n")
    return "".join(parts)


class PrefixCache:
    """LRU of cached block hashes, at most `capacity` blocks."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._blocks: OrderedDict[int, None] = OrderedDict()

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

    def add(self, blocks: Sequence[int]) -> None:
        """Cache `blocks` (a prefilled prompt) as the most recently used; evict the oldest."""
        for block in blocks:
            self._blocks[block] = None
            self._blocks.move_to_end(block)
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)
