"""Pure: the routing key of an OpenAI request body, as a chain of block hashes.

The key must send every turn of one conversation to the same engine (its prefix cache holds the
turns before), spread different conversations even when they share a long system prompt (one
shared prompt must not pin all traffic to one pod: production-stack#957, llm-d#669), and be the
same on every router replica (no learned index: aibrix#917). So the key covers the conversation's
*head*: for chat, the serialized messages (roles and the system prompt included) up to and
including the first user message; for completions, the first `PROMPT_HEAD_BLOCKS` blocks of the
prompt. Later turns only append messages, so the head, and the key, stay the same.

The head is cut into `BLOCK_CHARS`-character blocks and hashed as a chain (h0 = H(model),
h_i = H(block_i ‖ h_{i-1}); at most `MAX_BLOCKS` blocks), the shape of llm-d's approximate prefix
index, so a later prefix-match scorer can reuse the same hashes. No tokenizer: characters are a
stable stand-in for tokens (about 4 per token) and cost nothing to compute.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

BLOCK_CHARS = 64
"""Characters per block (16 tokens, vLLM's default KV block, at ~4 characters a token)."""
MAX_BLOCKS = 256
"""At most this many blocks are hashed (16 KiB of head): the cost of a key stays bounded."""
PROMPT_HEAD_BLOCKS = 16
"""A completion prompt has no turns: its first 1 KiB is its head."""


@dataclass(frozen=True)
class RoutingInfo:
    """What the router reads from a request body."""

    model: str | None
    """The OpenAI `model` field: which LLMDeployment (or adapter) serves it."""
    blocks: tuple[int, ...]
    """Chained block hashes of the head; empty when the body has no text to route by."""

    @property
    def key(self) -> int | None:
        """The routing key: the head's last chained hash (None: route by load alone)."""
        return self.blocks[-1] if self.blocks else None


def hash_bytes(data: bytes) -> int:
    """64-bit hash, the same on every replica and every run (unlike Python's `hash`)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def block_hashes(text: str, seed: str, *, max_blocks: int = MAX_BLOCKS) -> tuple[int, ...]:
    """Chained hashes of `text` cut into `BLOCK_CHARS` blocks (the last may be partial)."""
    previous = hash_bytes(seed.encode())
    hashes = []
    for start in range(0, min(len(text), max_blocks * BLOCK_CHARS), BLOCK_CHARS):
        block = text[start : start + BLOCK_CHARS].encode()
        previous = hash_bytes(block + previous.to_bytes(8, "big"))
        hashes.append(previous)
    return tuple(hashes)


def conversation_head(messages: Sequence[Any]) -> str:
    """The messages up to and including the first user message, serialized canonically."""
    head: list[Any] = []
    for message in messages:
        head.append(message)
        if isinstance(message, Mapping) and message.get("role") == "user":
            break
    return json.dumps(head, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def prompt_head(prompt: Any) -> str:
    """The first blocks of a completion prompt (a string, or the first of a list)."""
    if isinstance(prompt, list) and prompt:
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt[: PROMPT_HEAD_BLOCKS * BLOCK_CHARS]
    if isinstance(prompt, list):  # token ids
        return json.dumps(prompt[: PROMPT_HEAD_BLOCKS * BLOCK_CHARS // 4])
    return ""


def routing_info(body: bytes) -> RoutingInfo:
    """The model and the head's block hashes of a request body; a body that is not a JSON object
    routes by load alone (the engine answers it with its own error)."""
    try:
        parsed = json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError):
        return RoutingInfo(None, ())
    if not isinstance(parsed, dict):
        return RoutingInfo(None, ())
    model = parsed.get("model")
    model = model if isinstance(model, str) else None
    messages = parsed.get("messages")
    if isinstance(messages, list) and messages:
        head = conversation_head(messages)
    else:
        head = prompt_head(parsed.get("prompt", parsed.get("input")))
    return RoutingInfo(model, block_hashes(head, model or "") if head else ())
