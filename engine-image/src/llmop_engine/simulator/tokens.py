"""The simulated model's tokenizer and next-token function: ids a router can carry between replicas.

Tokenizer. A text prompt is cut into pieces of 4 characters, each one id in
`[PIECE_BASE, VOCAB_SIZE)` (a CRC of the piece), so a prompt has `max(1, ceil(len / 4))` ids: the
simulator's long-standing estimate of 4 characters a token, which its prefix cache and the
real-vLLM comparisons are calibrated on. A chat prompt is 4 template ids per message (as if a
chat template wrapped each message) followed by the message's content ids. Encoding is stable
across processes and runs. Prompt ids are one-way (a CRC cannot be decoded); the ids the model
*generates* are words, `WORD_BASE + i`, and decode exactly: the text of a stream is the
concatenation of `word_text(id)` over its token ids.

Model. The next token is a function of the whole context (prompt ids and every id generated so
far): a 64-bit rolling hash of the ids, mixed, picks one of the `WORDS`. So a continuation sent as
`prompt ids + generated ids` produces exactly the tokens the uninterrupted run would have produced
next, and a seam that drops, duplicates or changes one id changes every token after it. Sampling
(`temperature > 0`) mixes a per-request draw into each pick: `seed` makes it reproducible for
one request, but the draw is indexed by the output position of *that* request, so a continuation
restarts it, as vLLM's per-request generator does; without a seed each request draws anew.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence

WORDS = (
    " the",
    " model",
    " is",
    " serving",
    " tokens",
    " from",
    " a",
    " simulated",
    " GPU",
    " with",
    " continuous",
    " batching",
    ".",
    " It",
    " keeps",
    " going",
)
EOS = 2
"""The end-of-sequence id (`--sim-eos-probability`); its text is empty, as a special token's."""
VOCAB_SIZE = 32000
"""Token ids a prompt may carry: vLLM answers 400 for an id outside the vocabulary."""
WORD_BASE = 1000
PIECE_BASE = 2048
CHARS_PER_PIECE = 4
_TEMPLATE_BASE = 100
"""Ids of the simulated chat template's markers (role start, role, newline, end)."""
_ROLES = ("system", "user", "assistant", "tool", "developer")
_MASK = (1 << 64) - 1
_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_GOLDEN = 0x9E3779B97F4A7C15


def word_id(index: int) -> int:
    return WORD_BASE + index % len(WORDS)


def word_text(token_id: int) -> str:
    """The text of a generated id; "" for ids the model never generates (prompt pieces)."""
    index = token_id - WORD_BASE
    return WORDS[index] if 0 <= index < len(WORDS) else ""


def encode(text: str) -> list[int]:
    """A text prompt's ids: one per 4 characters, at least one."""
    span = PIECE_BASE, VOCAB_SIZE - PIECE_BASE
    ids = [
        span[0] + zlib.crc32(text[i : i + CHARS_PER_PIECE].encode()) % span[1]
        for i in range(0, len(text), CHARS_PER_PIECE)
    ]
    return ids or [span[0]]


def role_and_content(message: object) -> tuple[str, object]:
    """A chat message's role and content as the simulator's template reads them: a content
    made of parts is their texts joined by spaces (None stays None)."""
    if not isinstance(message, dict):
        return "user", ""
    raw = message.get("content", "")
    if isinstance(raw, list):
        raw = " ".join(str(p.get("text", "")) for p in raw if isinstance(p, dict))
    return str(message.get("role", "user")), raw


def chat_ids(messages: Sequence[object]) -> list[int]:
    """A chat prompt's ids: per message 4 template ids, then its content's ids."""
    ids: list[int] = []
    for message in messages:
        role, raw = role_and_content(message)
        content = str(raw or "")
        role_id = _ROLES.index(role) if role in _ROLES else len(_ROLES)
        ids += [
            _TEMPLATE_BASE,
            _TEMPLATE_BASE + 1 + role_id,
            _TEMPLATE_BASE + 10,
            _TEMPLATE_BASE + 11,
        ]
        ids += encode(content)
    return ids


def check_ids(ids: Iterable[object]) -> list[int]:
    """Token ids as vLLM accepts them in a prompt, else ValueError with vLLM's message."""
    out: list[int] = []
    for token in ids:
        if isinstance(token, bool) or not isinstance(token, int):
            raise ValueError("prompt token ids must be integers")
        if not 0 <= token < VOCAB_SIZE:
            raise ValueError(f"Token id {token} is out of vocabulary")
        out.append(token)
    if not out:
        raise ValueError("The decoder prompt cannot be empty")
    return out


def absorb(state: int, token_id: int) -> int:
    """The context hash after one more id (FNV-1a over ids)."""
    return ((state ^ (token_id + 1)) * _FNV_PRIME) & _MASK


def context_hash(ids: Iterable[int]) -> int:
    state = _FNV_OFFSET
    for token_id in ids:
        state = absorb(state, token_id)
    return state


def mix(x: int) -> int:
    """The pick's hash of a context hash: one multiply, the high bits taken (FNV-1a leaves its
    low bits weak)."""
    return ((x * _GOLDEN) & _MASK) >> 32


def _splitmix(x: int) -> int:
    x = (x + _GOLDEN) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def next_id(
    state: int, *, draw: int = 0, shift: int = 0, banned: frozenset[int] = frozenset()
) -> int:
    """The model's token after a context with hash `state`. `draw`: the sampler's noise (0 for
    greedy); `shift`: a LoRA adapter's offset; `banned`: ids masked out (`stop_token_ids` before
    `min_tokens`), the next word taking their place."""
    index = (mix(state ^ draw) + shift) % len(WORDS)
    for step in range(len(WORDS)):
        token = word_id(index + step)
        if token not in banned:
            return token
    return word_id(index)


def run(state: int, count: int, *, salt: int | None = None, shift: int = 0) -> list[int]:
    """`count` ids after a context with hash `state`, nothing masked: `next_id` and `absorb` in
    one loop (most requests have no stop rule, and this runs once per request)."""
    out: list[int] = []
    words = len(WORDS)
    for position in range(count):
        draw = 0 if salt is None else sample_draw(salt, position)
        token = WORD_BASE + (((((state ^ draw) * _GOLDEN) & _MASK) >> 32) + shift) % words
        state = ((state ^ (token + 1)) * _FNV_PRIME) & _MASK
        out.append(token)
    return out


def ends(state: int, probability: float) -> bool:
    """Whether the model ends its answer after a context with hash `state`."""
    return _splitmix(state) < probability * 2.0**64


def sample_draw(salt: int, position: int) -> int:
    """The sampler's noise for output `position` of a request whose generator started at `salt`."""
    return _splitmix((salt * _FNV_PRIME + position) & _MASK) | 1
