"""A generation request's body, read as vLLM 0.32 reads it: prompts as token ids, budget, stops.

Prompts (`completion/protocol.py`: `prompt: list[int] | list[list[int]] | str | list[str]`):
a string or a list of ids is one prompt; a list of strings or of id lists is a batch, one choice
per prompt (choice `i` answers prompt `i`). Ids are used verbatim and must be in the vocabulary.
Chat prompts are the messages through the simulated chat template (`tokens.chat_ids`), or, as vLLM
0.32 accepts on the chat route (PR #48145, `renderers/online_renderer.py`), the ids in
`kv_transfer_params.prompt_token_ids` verbatim (ignored when a message has non-text content,
`drop_prompt_token_ids_with_media`).

Budget: completions default to 16 tokens (vLLM's `CompletionRequest.max_tokens`); chat takes
`max_completion_tokens`, else `max_tokens`, else the simulator's `--sim-default-max-tokens`.
`ignore_eos` matters only with `--sim-eos-probability` (the simulated model emits no
end-of-sequence token otherwise: it stops by length, `stop` or `stop_token_ids`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from llmop_engine.simulator import tokens
from llmop_engine.simulator.decoding import SamplingSpec
from llmop_engine.simulator.prefix_cache import chat_text, id_blocks, prompt_blocks


@dataclass(frozen=True)
class Prompt:
    ids: tuple[int, ...]
    prefix: tuple[int, ...]
    """Chained block hashes for the prefix cache: of the text for text prompts (the simulator's
    calibrated model), of the ids for id prompts."""


@dataclass(frozen=True)
class Generation:
    prompts: tuple[Prompt, ...]
    max_tokens: int
    spec: SamplingSpec
    stream: bool
    include_usage: bool
    return_token_ids: bool


def read(
    body: Mapping[str, object], *, chat: bool, default_max_tokens: int, block_size: int
) -> Generation:
    """The generation `body` asks for; ValueError (a 400) for what vLLM rejects."""
    prompts = _chat_prompt(body, block_size) if chat else _completion_prompts(body, block_size)
    raw_max = body.get("max_completion_tokens") if chat else None
    raw_max = raw_max or body.get("max_tokens")
    default = default_max_tokens if chat else 16  # vLLM's completions default
    if raw_max is not None and (isinstance(raw_max, bool) or not isinstance(raw_max, int | float)):
        raise ValueError("max_tokens must be an integer")
    max_tokens = int(raw_max) if raw_max is not None else default
    if max_tokens < 1:
        raise ValueError("max_tokens must be at least 1")
    opts = body.get("stream_options")
    return Generation(
        prompts=prompts,
        max_tokens=max_tokens,
        spec=SamplingSpec.from_body(body),
        stream=bool(body.get("stream")),
        include_usage=bool(isinstance(opts, dict) and opts.get("include_usage")),
        return_token_ids=bool(body.get("return_token_ids")),
    )


def _is_ids(value: object) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    )


def _completion_prompts(body: Mapping[str, object], block_size: int) -> tuple[Prompt, ...]:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return (_text_prompt(prompt, block_size),)
    if isinstance(prompt, list) and prompt:
        if _is_ids(prompt):
            return (_ids_prompt(prompt, block_size),)
        if all(isinstance(p, str) for p in prompt):
            return tuple(_text_prompt(str(p), block_size) for p in prompt)
        if all(isinstance(p, list) for p in prompt):
            return tuple(_ids_prompt(p, block_size) for p in prompt if isinstance(p, list))
    raise ValueError(
        "prompt must be a string, a list of strings, a list of token ids or a list of such lists"
    )


def _text_prompt(text: str, block_size: int) -> Prompt:
    return Prompt(tuple(tokens.encode(text)), prompt_blocks(text, block_size))


def _ids_prompt(ids: list[object], block_size: int) -> Prompt:
    checked = tokens.check_ids(ids)
    return Prompt(tuple(checked), id_blocks(checked, block_size))


def _chat_prompt(body: Mapping[str, object], block_size: int) -> tuple[Prompt, ...]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    params = body.get("kv_transfer_params")
    forwarded = params.get("prompt_token_ids") if isinstance(params, dict) else None
    if forwarded is not None and not _has_media(messages):
        if not isinstance(forwarded, list):
            raise ValueError("kv_transfer_params.prompt_token_ids must be a list of token ids")
        return (_ids_prompt(forwarded, block_size),)
    ids = tokens.chat_ids(messages)
    return (Prompt(tuple(ids), prompt_blocks(chat_text(messages), block_size)),)


def _has_media(messages: list[object]) -> bool:
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and any(
            isinstance(part, dict) and part.get("type", "text") != "text" for part in content
        ):
            return True
    return False
