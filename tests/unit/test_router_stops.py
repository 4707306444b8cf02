"""The router matches an eligible stream's stop strings itself (so that one spanning a seam is
found and no held-back text is lost), exactly as the engine would have: fed the events of an
answer generated without stop strings, it sends the same text chunk for chunk (the same
held-back tail), the same ids, finish and `stop_reason` as the simulator's engine-side rules
(which model vLLM 0.32's detokenizer: `llmop_engine.simulator.decoding`) with them."""

from __future__ import annotations

import random
from typing import Any

import pytest

from llmop_engine.simulator import decoding
from llmop_router.migration import (
    CHAT,
    COMPLETIONS,
    Record,
    Settings,
    Stops,
    Verdict,
    check_stop_strings,
)


def routed(path: str, body: dict[str, Any], raw: decoding.Plan) -> tuple[list[str], Record, Any]:
    """Feed the unstopped answer's events to a `Record`: the texts the client gets per event,
    the record, and the last choice."""
    record = Record.of(path, body, Settings())
    assert record.refused is None
    assert record.stops is not None
    assert "stop" not in record.body  # the engine never sees them
    sent: list[str] = []
    choice: dict[str, Any] = {}
    for i, (token, text) in enumerate(zip(raw.ids, raw.texts, strict=True)):
        finish = "length" if i == len(raw.ids) - 1 else None
        if path == CHAT:
            choice = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "finish_reason": finish}
        choice["token_ids"] = [token]
        doc = {"id": "cmpl-1", "created": 1, "model": "m", "choices": [choice]}
        seen = record.see(doc)
        assert seen.verdict in (Verdict.FORWARD, Verdict.STOP)
        sent.append(choice["delta"].get("content", "") if path == CHAT else choice["text"])
        if seen.verdict is Verdict.STOP:
            break
    return sent, record, choice


@pytest.mark.parametrize("keep", [Stops.KEEP, 9], ids=["keep-4096", "keep-9"])
@pytest.mark.parametrize("path", [COMPLETIONS, CHAT])
def test_the_router_stops_where_the_engine_would_have(
    path: str, keep: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # keep-9: the text already sent is dropped as the answer goes (stops here are <= 8 long).
    monkeypatch.setattr(Stops, "KEEP", keep)
    shuffle = random.Random(7)
    stopped = 0
    for _ in range(400):
        context = [shuffle.randrange(3, 30_000) for _ in range(shuffle.randrange(1, 9))]
        max_tokens = shuffle.randrange(2, 40)
        raw = decoding.plan(context, max_tokens, decoding.SamplingSpec.from_body({}))
        whole = raw.text
        stops: list[str] = []
        for _ in range(shuffle.randrange(1, 4)):
            if whole and shuffle.random() < 0.8:
                at = shuffle.randrange(len(whole))
                stops.append(whole[at : at + shuffle.randrange(1, 9)])
            else:
                stops.append(f"~{shuffle.randrange(1000)}~")  # never in the text
        body: dict[str, Any] = {"model": "m", "stream": True, "max_tokens": max_tokens}
        body["stop"] = stops if len(stops) > 1 or shuffle.random() < 0.5 else stops[0]
        if shuffle.random() < 0.3:
            body["include_stop_str_in_output"] = True
        if shuffle.random() < 0.3:
            body["min_tokens"] = shuffle.randrange(0, max_tokens)
        if path == CHAT:
            body["messages"] = [{"role": "user", "content": "hi"}]
        else:
            body["prompt"] = context
        engine = decoding.plan(context, max_tokens, decoding.SamplingSpec.from_body(body))
        sent, record, last = routed(path, body, raw)
        case = (stops, body.get("include_stop_str_in_output"), body.get("min_tokens"))
        assert sent == list(engine.texts), case
        assert record.generated == list(engine.ids), case
        assert last["finish_reason"] == engine.finish, case
        assert last.get("stop_reason") == engine.stop_reason, case
        stopped += engine.finish == "stop"
    assert stopped > 150, "too few answers ended by a stop string to prove anything"


def test_a_finish_the_router_writes_flushes_the_held_back_text() -> None:
    record = Record.of(COMPLETIONS, {"prompt": [1], "stream": True, "stop": "xyz"}, Settings())
    doc = {"id": "c", "created": 1, "model": "m"}
    record.see({**doc, "choices": [{"index": 0, "text": " abcde", "token_ids": [5]}]})
    held = doc | {"choices": [{"index": 0, "text": "x", "token_ids": [6]}]}
    record.see(held)
    assert held["choices"][0]["text"] == "d"  # "ex" may start "xyz": held back
    ending = record.ending("length")
    assert b'"text":"ex"' in ending
    assert b'"finish_reason":"length"' in ending


def test_the_search_covers_the_new_text_and_what_a_stop_could_start_in() -> None:
    assert check_stop_strings("hello world", 1, ("ld",), False) == ("ld", 9)
    assert check_stop_strings("hello world", 1, ("lo",), False) is None  # searched before
    assert check_stop_strings("hello world", 3, ("o w", "wor"), False) == ("wor", 6)
    assert check_stop_strings("hello world", 5, ("wor", "o w"), False) == ("o w", 4)
    assert check_stop_strings("abcd", 2, ("cd", "bc"), False) == ("bc", 1)  # earliest end
    assert check_stop_strings("abcd", 1, ("cd",), True) == ("cd", -1)
    assert check_stop_strings("abcde", 2, ("cd",), True) == ("cd", 4)
    assert check_stop_strings("abc", 0, ("c",), False) is None
