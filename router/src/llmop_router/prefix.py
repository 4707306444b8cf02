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

Beside the key, the body gives the request's `Prefill`: how many characters of prompt it brings
in all, and how many of them come after the conversation's last answer. The pod that served the
turns before holds their prompt in its prefix cache and prefills only the second; any other pod
prefills the whole. The ring (`ring.pick`) weighs that against the prefill already queued on
each pod.
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
class Prefill:
    """The prompt a request brings, in characters of text (about 4 a token; a token id counts 4):
    what a pod has to prefill for it, depending on what that pod's prefix cache holds."""

    total: int = 0
    """All of it: what a pod that holds none of the conversation prefills."""
    new: int = 0
    """From the last assistant message on (the last answer and what follows it; all of it when
    there is no answer yet): what the pod that served the turns before prefills."""


NO_PREFILL = Prefill()


@dataclass(frozen=True)
class RoutingInfo:
    """What the router reads from a request body."""

    model: str | None
    """The OpenAI `model` field: which LLMDeployment (or adapter) serves it."""
    key: int | None
    """The routing key (None: no text to route by; route by load alone)."""
    stream: bool = False
    """`stream: true`: the answer is SSE (a held request then gets heartbeats)."""
    prefill: Prefill = NO_PREFILL
    """The prompt's size, whole and after the last answer."""
    max_tokens: int | None = None
    """`max_completion_tokens`, else `max_tokens` (the gateway reserves output by it)."""
    include_usage: bool = False
    """`stream_options.include_usage: true`: the client asked for the usage event itself."""


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


def text_chars(value: Any, depth: int = 0) -> int:
    """Characters of text in a message's `content`, a prompt or an input: strings, lists of them,
    content parts (`{"type": "text", "text": …}`), token ids (4 characters each)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return 4
    if depth >= 3:
        return 0
    if isinstance(value, list):
        return sum(text_chars(item, depth + 1) for item in value)
    if isinstance(value, Mapping):
        return text_chars(value.get("content", value.get("text")), depth + 1)
    return 0


def messages_prefill(messages: Sequence[Any]) -> Prefill:
    """The prefill of a chat request: every message's text, and the text from the last assistant
    message on."""
    total = new = 0
    for message in messages:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        size = len(content) if isinstance(content, str) else text_chars(content)
        if message.get("role") == "assistant":
            new = 0
        total += size
        new += size
    return Prefill(total, new)


def routing_info(body: bytes) -> RoutingInfo:
    """The model and the routing key of a request body; one that is not a JSON object has
    neither (the router refuses such a body before it gets here: `body.scan`)."""
    try:
        parsed = json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError, RecursionError):
        # RecursionError: JSON nested deeper than the parser's stack (`[[[[…`).
        return RoutingInfo(None, None)
    if not isinstance(parsed, dict):
        return RoutingInfo(None, None)
    return routing_of(parsed)


def routing_of(parsed: Mapping[str, Any]) -> RoutingInfo:
    """The model and the routing key of a parsed request body (a JSON object)."""
    model = parsed.get("model")
    model = model if isinstance(model, str) else None
    messages = parsed.get("messages")
    if isinstance(messages, list) and messages:
        head = conversation_head(messages)
        prefill = messages_prefill(messages)
    else:
        prompt = parsed.get("prompt", parsed.get("input"))
        head = prompt_head(prompt)
        size = text_chars(prompt)
        prefill = Prefill(size, size)
    key = head_key(head, model or "") if head else None
    max_tokens = parsed.get("max_completion_tokens", parsed.get("max_tokens"))
    options = parsed.get("stream_options")
    return RoutingInfo(
        model,
        key,
        parsed.get("stream") is True,
        prefill,
        max_tokens if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) else None,
        isinstance(options, dict) and options.get("include_usage") is True,
    )
