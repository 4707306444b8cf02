"""Pure: the router's request-migration bookkeeping (`llmop_router.migration`): which streams can
be continued, what is recorded of the events forwarded, the continuation's body, and how its
events are rewritten as the first attempt's."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmop_router.migration import (
    CHAT,
    COMPLETIONS,
    Record,
    Settings,
    Verdict,
    cut_answer,
    first_body,
    refusal,
    stream_body,
)


def completion(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": "hi there", "stream": True, **extra}


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True, **extra}


def chunk(
    ids: list[int],
    text: str,
    *,
    prompt: list[int] | None = None,
    finish: str | None = None,
    rid: str = "cmpl-1",
    created: int = 7,
) -> dict[str, Any]:
    choice = {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": finish,
        "stop_reason": None,
        "prompt_token_ids": prompt,
        "token_ids": ids,
    }
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": "m",
        "choices": [choice],
    }


def test_only_streaming_completions_and_chat_are_parsed() -> None:
    assert stream_body("POST", COMPLETIONS, b'{"stream": true, "prompt": "x"}') is not None
    assert stream_body("POST", COMPLETIONS, b'{"stream": false}') is None
    assert stream_body("POST", "/v1/embeddings", b'{"stream": true}') is None
    assert stream_body("GET", CHAT, b'{"stream": true}') is None
    assert stream_body("POST", CHAT, b'{"stream": tru') is None


@pytest.mark.parametrize(
    ("path", "body", "why"),
    [
        (COMPLETIONS, completion(), None),
        (COMPLETIONS, completion(prompt=[1, 2, 3]), None),
        (COMPLETIONS, completion(temperature=0.8), None),  # unseeded: another valid answer
        (COMPLETIONS, completion(seed=1, temperature=0), None),  # greedy: the seed is moot
        (COMPLETIONS, completion(stop=["END"]), None),  # matched by the router
        (CHAT, chat(stop="END", include_stop_str_in_output=True), None),
        (COMPLETIONS, completion(n=2), "n > 1"),
        (COMPLETIONS, completion(best_of=3), "best_of or beam search"),
        (COMPLETIONS, completion(echo=True), "echo"),
        (COMPLETIONS, completion(logprobs=2), "logprobs"),
        (
            COMPLETIONS,
            completion(stop=["END"] * 17),
            "stop strings the router cannot match (not strings, or too many or too long)",
        ),
        (
            COMPLETIONS,
            completion(stop=[7]),
            "stop strings the router cannot match (not strings, or too many or too long)",
        ),
        (COMPLETIONS, completion(seed=4), "seeded sampling"),
        (COMPLETIONS, completion(presence_penalty=0.5), "frequency or presence penalty"),
        (COMPLETIONS, completion(prompt=["a", "b"]), "a batch of prompts"),
        (COMPLETIONS, completion(prompt=[[1], [2]]), "a batch of prompts"),
        (COMPLETIONS, completion(prompt_embeds="xx"), "prompt embeddings"),
        (CHAT, chat(), None),
        (CHAT, chat(tools=[{"type": "function"}], tool_choice="auto"), None),
        (CHAT, chat(tool_choice="required"), "forced tool choice"),
        (CHAT, chat(tool_choice={"type": "function"}), "forced tool choice"),
        (CHAT, chat(response_format={"type": "json_object"}), "structured output"),
        (CHAT, chat(response_format={"type": "text"}), None),
        (CHAT, chat(structured_outputs={"regex": "a+"}), "structured output"),
        (CHAT, chat(top_logprobs=2), "logprobs"),
        (
            CHAT,
            chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}]),
            "media input",
        ),
        (CHAT, chat(messages=[{"role": "user", "content": [{"type": "text"}]}]), None),
    ],
)
def test_eligibility_is_decided_from_the_body(
    path: str, body: dict[str, Any], why: str | None
) -> None:
    assert refusal(path, body) == why


def test_migration_off_refuses_everything() -> None:
    assert Record.of(COMPLETIONS, completion(), Settings(limit=0)).refused == "migration is off"


def test_the_first_attempt_asks_for_ids() -> None:
    assert b'"return_token_ids":true' in first_body(completion())


def test_completions_events_are_recorded_and_the_router_ids_hidden() -> None:
    record = Record.of(COMPLETIONS, completion(max_tokens=10, min_tokens=4, echo=False), Settings())
    first = chunk([1000], "a", prompt=[5, 6, 7])
    assert record.see(first).verdict is Verdict.FORWARD
    assert first["choices"][0]["prompt_token_ids"] is None
    assert first["choices"][0]["token_ids"] is None
    record.see(chunk([1001, 1002], "bc"))
    assert record.prompt_ids == [5, 6, 7]
    assert record.generated == [1000, 1001, 1002]
    body = record.continuation()
    assert body is not None
    assert body["prompt"] == [5, 6, 7, 1000, 1001, 1002]
    assert body["max_tokens"] == 7
    assert body["min_tokens"] == 1
    assert body["return_token_ids"] is True
    assert "echo" not in body


def test_an_omitted_completions_budget_is_vllms_16() -> None:
    record = Record.of(COMPLETIONS, completion(), Settings())
    record.see(chunk([1, 2, 3, 4, 5], "x", prompt=[9]))
    body = record.continuation()
    assert body is not None
    assert body["max_tokens"] == 11


def test_no_budget_left_means_the_answer_is_whole_at_its_length() -> None:
    record = Record.of(COMPLETIONS, completion(max_tokens=2), Settings())
    record.see(chunk([1, 2], "ab", prompt=[9]))
    assert record.continuation() is None
    end = record.ending("length")
    assert b'"finish_reason":"length"' in end
    assert end.endswith(b"data: [DONE]\n\n")


def test_failures_are_not_forwarded() -> None:
    record = Record.of(COMPLETIONS, completion(), Settings())
    assert record.see(chunk([], "", finish="abort")).verdict is Verdict.FAIL
    assert record.see({"error": {"code": 500}}).reason == "error"
    assert record.generated == []
    assert record.events == 0


def test_the_continuation_is_rewritten_as_the_first_attempt() -> None:
    record = Record.of(
        COMPLETIONS,
        completion(max_tokens=5, stream_options={"include_usage": True}, return_token_ids=True),
        Settings(),
    )
    record.see(chunk([1000], "a", prompt=[5, 6]))
    record.see(chunk([1001], "b"))
    record.next_attempt()
    follow = chunk([1002], "c", prompt=[5, 6, 1000, 1001], rid="cmpl-2", created=9)
    record.see(follow)
    assert (follow["id"], follow["created"]) == ("cmpl-1", 7)
    assert follow["choices"][0]["prompt_token_ids"] is None  # the client has P already
    assert follow["choices"][0]["token_ids"] == [1002]  # it asked for ids
    usage = {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}
    record.see({"id": "cmpl-2", "created": 9, "model": "m", "choices": [], "usage": usage})
    assert usage == {"prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7}


def test_a_chat_continuation_carries_the_ids_and_drops_its_role_chunk() -> None:
    record = Record.of(CHAT, chat(max_completion_tokens=8, kv_transfer_params={"x": 1}), Settings())
    role = {
        "id": "c1",
        "created": 1,
        "model": "m",
        "prompt_token_ids": [3, 4],
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
    }
    record.see(role)
    assert role["prompt_token_ids"] is None
    record.see(
        {
            "id": "c1",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "delta": {"content": "w"}, "token_ids": [1000]}],
        }
    )
    body = record.continuation()
    assert body is not None
    assert body["kv_transfer_params"] == {"x": 1, "prompt_token_ids": [3, 4, 1000]}
    assert body["max_completion_tokens"] == 7
    assert "max_tokens" not in body
    record.next_attempt()
    again = {
        "id": "c2",
        "created": 2,
        "model": "m",
        "prompt_token_ids": [3, 4, 1000],
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
    }
    assert record.see(again).verdict is Verdict.DROP


def test_a_tool_call_or_reasoning_on_the_way_stops_migration() -> None:
    record = Record.of(CHAT, chat(), Settings())
    record.see(
        {"id": "c", "choices": [{"index": 0, "delta": {"tool_calls": [{}]}, "token_ids": [1]}]}
    )
    assert record.refused == "a tool call or reasoning is in progress"


def test_text_without_ids_stops_migration() -> None:
    record = Record.of(COMPLETIONS, completion(), Settings())
    record.see({"id": "c", "choices": [{"index": 0, "text": "hello"}]})
    assert record.refused == "the engine sent no token ids"


def test_a_failure_before_any_event_restarts_the_original_request() -> None:
    body = completion(max_tokens=3)
    record = Record.of(COMPLETIONS, body, Settings())
    assert record.continuation() == body
    record.next_attempt()
    record.see(chunk([1], "a", prompt=[5]))
    assert record.attempt == 0
    assert record.prompt_ids == [5]


def _bytes(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def test_ordinary_events_take_the_byte_path_and_agree_with_the_parsed_one() -> None:
    body = completion(max_tokens=10)
    fast, slow = Record.of(COMPLETIONS, body, Settings()), Record.of(COMPLETIONS, body, Settings())
    first = chunk([1000], "a", prompt=[5, 6, 7])
    assert fast.see_bytes(_bytes(first)) is None  # the prompt's ids: parsed
    fast.see(first)
    slow.see(chunk([1000], "a", prompt=[5, 6, 7]))
    for ids, text in (([1001, 1002], 'b"c'), ([], ""), ([7], '"token_ids":[1,2]')):
        event = chunk(ids, text)
        forwarded = fast.see_bytes(_bytes(event))
        assert forwarded is not None, text
        slow.see(event)
        assert json.loads(forwarded) == event  # the same document the parsed path sends
    assert (fast.generated, fast.events) == (slow.generated, slow.events)
    assert fast.continuation() == slow.continuation()


@pytest.mark.parametrize(
    "event",
    [
        chunk([1], "a", finish="stop"),
        chunk([1], "a", finish="abort"),
        {**chunk([1], "a"), "usage": {"prompt_tokens": 1, "completion_tokens": 1}},
        {"error": {"code": 500}, "choices": [{"token_ids": [1]}]},
        {**chunk([1], ""), "choices": [{"delta": {"tool_calls": []}, "token_ids": [1]}]},
        {**chunk([1], ""), "choices": [{"delta": {"reasoning": "x"}, "token_ids": [1]}]},
        {**chunk([1], "a"), "choices": [chunk([1], "a")["choices"][0]] * 2},
        {**chunk([1], "a"), "choices": []},
        chunk(["x"], "a"),  # type: ignore[list-item]
    ],
)
def test_anything_but_an_ordinary_token_event_is_parsed(event: dict[str, Any]) -> None:
    record = Record.of(COMPLETIONS, completion(), Settings())
    record.see(chunk([9], "z", prompt=[1]))
    assert record.see_bytes(_bytes(event)) is None


def test_the_byte_path_is_off_after_a_seam_and_when_the_client_asked_for_ids() -> None:
    record = Record.of(COMPLETIONS, completion(), Settings())
    assert record.see_bytes(_bytes(chunk([1], "a"))) is None  # no identity yet
    record.see(chunk([9], "z", prompt=[1]))
    record.next_attempt()
    assert record.see_bytes(_bytes(chunk([1], "a"))) is None  # a continuation: rewritten
    asked = Record.of(COMPLETIONS, completion(return_token_ids=True), Settings())
    asked.see(chunk([9], "z", prompt=[1]))
    assert asked.see_bytes(_bytes(chunk([1], "a"))) is None


def test_a_refused_stream_without_ids_is_relayed_on_the_byte_path() -> None:
    record = Record.of(COMPLETIONS, completion(), Settings())
    first = chunk([], "a", prompt=[1])
    del first["choices"][0]["token_ids"]
    record.see(first)
    assert record.refused == "the engine sent no token ids"
    event = chunk([], "b")
    del event["choices"][0]["token_ids"]
    assert record.see_bytes(_bytes(event)) == _bytes(event)
    assert record.events == 2
    fresh = Record.of(COMPLETIONS, completion(), Settings())
    fresh.see(chunk([9], "z", prompt=[1]))
    assert fresh.see_bytes(_bytes(event)) is None  # `see` must look: text without its ids


def test_a_non_streaming_answer_is_cut_when_it_ended_in_abort_or_a_500() -> None:
    def answer(finish: str) -> bytes:
        return _bytes({"id": "x", "choices": [{"index": 0, "text": "ab", "finish_reason": finish}]})

    assert cut_answer(COMPLETIONS, 200, answer("abort")) == "abort"
    assert cut_answer(CHAT, 200, answer("error")) == "error"
    assert cut_answer(CHAT, 500, b"Internal Server Error") == "error"
    assert cut_answer(COMPLETIONS, 200, answer("length")) is None
    assert cut_answer(COMPLETIONS, 200, _bytes({"text": "the abort was an error"})) is None
    assert cut_answer(COMPLETIONS, 200, b'{"abort": ') is None
    assert cut_answer(COMPLETIONS, 400, answer("abort")) is None
    assert cut_answer("/v1/embeddings", 500, b"") is None


def test_an_engine_writing_spaced_json_never_takes_the_byte_path() -> None:
    record = Record.of(COMPLETIONS, completion(), Settings())
    record.see(chunk([9], "z", prompt=[1]))
    spaced = json.dumps(chunk([1], "a")).encode()
    assert b'"finish_reason": null' in spaced
    assert record.see_bytes(spaced) is None
    abort = json.dumps(chunk([], "", finish="abort")).encode()
    record.refused = "a tool call or reasoning is in progress"
    assert record.see_bytes(abort) is None  # its abort is seen by `see`, spaced or not
