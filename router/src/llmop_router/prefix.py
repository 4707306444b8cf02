"""Pure: the routing key of an OpenAI request body: a hash of the conversation's head.

The key must send every turn of one conversation to the same engine (its prefix cache holds the
turns before), spread different conversations even when they share a long system prompt (one
shared prompt must not pin all traffic to one pod: production-stack#957, llm-d#669), and be the
same on every router replica (no learned index: aibrix#917). So the key covers the conversation's
*head*: for chat, the serialized messages (roles and the system prompt included) up to and
including the first user message; for completions, the first `PROMPT_HEAD_CHARS` characters of the
prompt. Later turns only append messages, so the head, and the key, stay the same.

The key is one 64-bit hash of the model and the head's first `MAX_HEAD_CHARS` characters (a chain
of per-block hashes, as llm-d's approximate prefix index keeps, would only matter to a scorer that
matches partial prefixes; one hash costs a tenth of it). No tokenizer: characters are a stable
stand-in for tokens (about 4 per token) and cost nothing to compute.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MAX_HEAD_CHARS = 16 * 1024
"""At most this much of the head is hashed: the cost of a key stays bounded."""
PROMPT_HEAD_CHARS = 1024
"""A completion prompt has no turns: its first KiB is its head."""


@dataclass(frozen=True)
class RoutingInfo:
    """What the router reads from a request body."""

    model: str | None
    """The OpenAI `model` field: which LLMDeployment (or adapter) serves it."""
    key: int | None
    """The routing key (None: no text to route by; route by load alone)."""
    stream: bool = False
    """`stream: true`: the answer is SSE (a held request then gets heartbeats)."""


def hash_bytes(data: bytes) -> int:
    """64-bit hash, the same on every replica and every run (unlike Python's `hash`)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def head_key(head: str, model: str) -> int:
    """The key of a conversation head (its first `MAX_HEAD_CHARS` characters) for `model`."""
    return hash_bytes(model.encode() + b"\0" + head[:MAX_HEAD_CHARS].encode())


def conversation_head(messages: Sequence[Any]) -> str:
    """The messages up to and including the first user message, serialized canonically."""
    head: list[Any] = []
    for message in messages:
        head.append(message)
        if isinstance(message, Mapping) and message.get("role") == "user":
            break
    return json.dumps(head, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def prompt_head(prompt: Any) -> str:
    """The head of a completion prompt (a string, or the first of a list)."""
    if isinstance(prompt, list) and prompt:
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt[:PROMPT_HEAD_CHARS]
    if isinstance(prompt, list):  # token ids, about 4 characters each
        return json.dumps(prompt[: PROMPT_HEAD_CHARS // 4])
    return ""


def routing_info(body: bytes) -> RoutingInfo:
    """The model and the routing key of a request body; a body that is not a JSON object routes
    by load alone (the engine answers it with its own error)."""
    try:
        parsed = json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError):
        return RoutingInfo(None, None)
    if not isinstance(parsed, dict):
        return RoutingInfo(None, None)
    model = parsed.get("model")
    model = model if isinstance(model, str) else None
    messages = parsed.get("messages")
    if isinstance(messages, list) and messages:
        head = conversation_head(messages)
    else:
        head = prompt_head(parsed.get("prompt", parsed.get("input")))
    key = head_key(head, model or "") if head else None
    return RoutingInfo(model, key, parsed.get("stream") is True)
