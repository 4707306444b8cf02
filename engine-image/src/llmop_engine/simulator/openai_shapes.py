"""vLLM's OpenAI response shapes, field for field, for the simulator's answers.

Streams serialize as vLLM 0.32's do (`model_dump_json(exclude_unset=True)`: a field the serving
code passes explicitly is present even when null):

- completions chunk (`completion/serving.py::completion_stream_generator`): each choice has
  `index, text, logprobs, finish_reason, stop_reason, prompt_token_ids, token_ids`;
  with `return_token_ids` the first chunk of each choice carries the prompt's ids in
  `choices[i].prompt_token_ids` and every chunk its own ids in `choices[i].token_ids`
  (null otherwise);
- chat (`chat_completion/serving.py::chat_completion_stream_generator`): a first chunk with
  `delta: {role, content: ""}` and, at the top level, `prompt_token_ids` (the prompt's ids with
  `return_token_ids`, else null) and `prompt_text: null`; then chunks whose choice has
  `index, delta: {content}, logprobs, finish_reason, token_ids`, the finishing one
  `stop_reason` too. A chunk is sent for every token even when its text is held back
  (`content: ""`), so the ids are never behind;
- the usage chunk (`stream_options.include_usage`): `choices: []` and `usage`;
- a generation error: `data: {"error": {message, type, param, code}}` then `[DONE]`.

Non-streaming answers (`model_dump()`: every field, nulls included) carry `token_ids` per choice,
and `prompt_token_ids` per choice (completions) or at the top level (chat).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def _dump(document: object) -> str:
    return json.dumps(document, separators=(",", ":"))


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    }


def error_event(message: str, kind: str = "InternalServerError", code: int = 500) -> str:
    """vLLM's in-band stream error (`create_streaming_error_response`), then `[DONE]`."""
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return f"data: {_dump(body)}\n\ndata: [DONE]\n\n"


DONE = "data: [DONE]\n\n"


@dataclass(frozen=True)
class StreamShape:
    """The events of one streamed answer."""

    chat: bool
    rid: str
    created: int
    model: str
    return_token_ids: bool

    def _event(self, choices: list[dict[str, Any]], **top: Any) -> str:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        doc = {"id": self.rid, "object": obj, "created": self.created, "model": self.model}
        doc["choices"] = choices
        doc.update(top)
        return f"data: {_dump(doc)}\n\n"

    def role(self, index: int, prompt_ids: Sequence[int]) -> str:
        """Chat's first chunk."""
        choice = {
            "index": index,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        ids = list(prompt_ids) if self.return_token_ids else None
        return self._event([choice], prompt_token_ids=ids, prompt_text=None)

    def token(
        self,
        index: int,
        text: str,
        ids: Sequence[int],
        *,
        finish: str | None = None,
        stop_reason: str | int | None = None,
        prompt_ids: Sequence[int] | None = None,
    ) -> str:
        """One output chunk; `prompt_ids` on a completions choice's first chunk."""
        token_ids = list(ids) if self.return_token_ids else None
        choice: dict[str, Any]
        if self.chat:
            choice = {"index": index, "delta": {"content": text}, "logprobs": None}
            choice["finish_reason"] = finish
            if finish is not None:
                choice["stop_reason"] = stop_reason
            choice["token_ids"] = token_ids
        else:
            choice = {
                "index": index,
                "text": text,
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": stop_reason,
                "prompt_token_ids": (
                    list(prompt_ids) if self.return_token_ids and prompt_ids is not None else None
                ),
                "token_ids": token_ids,
            }
        return self._event([choice])

    def usage(self, prompt: int, completion: int) -> str:
        return self._event([], usage=usage(prompt, completion))


@dataclass(frozen=True)
class Choice:
    """One finished choice of a non-streaming answer."""

    text: str
    ids: Sequence[int]
    prompt_ids: Sequence[int]
    finish: str | None
    stop_reason: str | int | None


def response(
    *,
    chat: bool,
    rid: str,
    created: int,
    model: str,
    choices: Sequence[Choice],
    return_token_ids: bool,
) -> dict[str, Any]:
    """A non-streaming answer as vLLM's `model_dump()` writes it."""
    out: list[dict[str, Any]] = []
    for index, c in enumerate(choices):
        ids = list(c.ids) if return_token_ids else None
        if chat:
            message = {
                "role": "assistant",
                "content": c.text,
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
                "reasoning": None,
            }
            choice: dict[str, Any] = {"index": index, "message": message, "logprobs": None}
        else:
            choice = {"index": index, "text": c.text, "logprobs": None}
        choice.update(finish_reason=c.finish, stop_reason=c.stop_reason, token_ids=ids)
        if not chat:
            choice["prompt_logprobs"] = None
            choice["prompt_token_ids"] = list(c.prompt_ids) if return_token_ids else None
        choice["routed_experts"] = None
        out.append(choice)
    prompt = (
        sum(len(c.prompt_ids) for c in choices[:1])
        if chat
        else sum(len(c.prompt_ids) for c in choices)
    )
    completion = sum(len(c.ids) for c in choices)
    doc: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": out,
        "service_tier": None,
        "system_fingerprint": None,
        "usage": {
            **usage(prompt, completion),
            "prompt_tokens_details": None,
            "completion_tokens_details": None,
        },
    }
    if chat:
        doc["prompt_logprobs"] = None
        doc["prompt_token_ids"] = (
            list(choices[0].prompt_ids) if return_token_ids and choices else None
        )
        doc["prompt_text"] = None
    doc.update(kv_transfer_params=None, ec_transfer_params=None, metrics=None)
    return doc
