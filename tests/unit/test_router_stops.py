"""The router matches an eligible stream's stop strings itself (so that one spanning a seam is
found and no held-back text is lost), exactly as the engine would have: fed the events of an
answer generated without stop strings, it sends the same text chunk for chunk (the same
held-back tail), the same ids, finish and `stop_reason` as the simulator's engine-side rules
(which model vLLM 0.32's detokenizer: `llmop_engine.simulator.decoding`) with them."""

from __future__ import annotations

import random
from typing import Any

import pytest

from llmop_engine.simulator import decoding, tokens
from llmop_router.migration import (
    CHAT,
    COMPLETIONS,
    Record,
    Settings,
    StopChunk,
    Stops,
    Verdict,
    check_stop_strings,
)


def detokenize(ids: list[int]) -> str:
    """The simulator's `/detokenize`."""
    return "".join(tokens.word_text(i) for i in ids)


def routed(
    path: str, body: dict[str, Any], raw: decoding.Plan, interval: int = 1
) -> tuple[list[str], Record, Any]:
    """Feed the unstopped answer's events to a `Record`: the texts the client gets per event,
    the record, and the last event. An event carries one token, or with `interval` that many
    after the first (vLLM's `--stream-interval`); one crossing `min_tokens` is decoded first,
    as the router's relay does (`MinTokensSpan`)."""
    record = Record.of(path, body, Settings())
    assert record.refused is None
    assert record.stops is not None
    assert "stop" not in record.body  # the engine never sees them
    sent: list[str] = []
    doc: dict[str, Any] = {}
    starts = [0, *range(1, len(raw.ids), interval)]
    for start, end in zip(starts, [*starts[1:], len(raw.ids)], strict=True):
        text = "".join(raw.texts[start:end])
        finish = "length" if end == len(raw.ids) else None
        choice: dict[str, Any]
        if path == CHAT:
            choice = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "finish_reason": finish}
        choice["token_ids"] = list(raw.ids[start:end])
        doc = {"id": "cmpl-1", "created": 1, "model": "m", "choices": [choice]}
        span = record.min_tokens_span(doc)
        if span is not None:
            record.past_min_tokens(span.offset([detokenize(ids) for ids in span.prefixes()]))
        seen = record.see(doc)
        assert seen.verdict in (Verdict.FORWARD, Verdict.STOP)
        sent.append(choice["delta"].get("content", "") if path == CHAT else choice["text"])
        if seen.verdict is Verdict.STOP:
            break
    return sent, record, doc


def random_answer(shuffle: random.Random) -> tuple[list[int], int, decoding.Plan]:
    """A random context, budget, and the simulated model's unstopped answer to it."""
    context = [shuffle.randrange(3, 30_000) for _ in range(shuffle.randrange(1, 9))]
    max_tokens = shuffle.randrange(2, 40)
    greedy = decoding.SamplingSpec.from_body({})
    return context, max_tokens, decoding.plan(context, max_tokens, greedy)


def random_stops(shuffle: random.Random, whole: str) -> list[str]:
    """One to three stop strings, most of them somewhere in `whole`."""
    stops: list[str] = []
    for _ in range(shuffle.randrange(1, 4)):
        if whole and shuffle.random() < 0.8:
            at = shuffle.randrange(len(whole))
            stops.append(whole[at : at + shuffle.randrange(1, 9)])
        else:
            stops.append(f"~{shuffle.randrange(1000)}~")  # never in the text
    return stops


def random_body(
    shuffle: random.Random, path: str, context: list[int], max_tokens: int, stop: Any
) -> dict[str, Any]:
    """A streaming request with `stop`, sometimes `include_stop_str_in_output` (3 in 10) and
    sometimes `min_tokens` (1 in 2)."""
    body: dict[str, Any] = {"model": "m", "stream": True, "max_tokens": max_tokens, "stop": stop}
    body["include_stop_str_in_output"] = shuffle.random() < 0.3
    if shuffle.random() < 0.5:
        body["min_tokens"] = shuffle.randrange(0, max_tokens)
    if path == CHAT:
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = context
    return body


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
        context, max_tokens, raw = random_answer(shuffle)
        stops = random_stops(shuffle, raw.text)
        stop = stops if len(stops) > 1 or shuffle.random() < 0.5 else stops[0]
        body = random_body(shuffle, path, context, max_tokens, stop)
        engine = decoding.plan(context, max_tokens, decoding.SamplingSpec.from_body(body))
        sent, record, doc = routed(path, body, raw)
        last = doc["choices"][0]
        case = (stops, body.get("include_stop_str_in_output"), body.get("min_tokens"))
        assert sent == list(engine.texts), case
        assert record.generated == list(engine.ids), case
        assert last["finish_reason"] == engine.finish, case
        assert last.get("stop_reason") == engine.stop_reason, case
        stopped += engine.finish == "stop"
    assert stopped > 150, "too few answers ended by a stop string to prove anything"


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT])
def test_in_merged_events_the_router_keeps_the_ids_up_to_the_one_completing_the_stop(
    path: str,
) -> None:
    """Events of 2-5 tokens (an engine's `--stream-interval`): the event completing a stop
    string also carries the tokens after the one that completed it. Decoding its prefixes
    (here with the simulator's tokenizer, as `/detokenize` answers) keeps exactly the ids the
    engine keeps when it matches the strings itself; with `min_tokens`, the event crossing it
    is searched only from its first token past it, as the engine checks token by token."""
    shuffle = random.Random(11)
    trimmed = spanned = 0
    for _ in range(800):
        context, max_tokens, raw = random_answer(shuffle)
        body = random_body(shuffle, path, context, max_tokens, random_stops(shuffle, raw.text))
        engine = decoding.plan(context, max_tokens, decoding.SamplingSpec.from_body(body))
        interval = shuffle.randrange(2, 6)
        sent, record, doc = routed(path, body, raw, interval=interval)
        # Events: token 1, then `interval` tokens each; one crosses min_tokens inside it.
        minimum = body.get("min_tokens", 0)
        spanned += minimum > 1 and (minimum - 1) % interval != 0
        chunk = record.stop_chunk
        if chunk is not None:
            decoded = [detokenize(ids) for ids in chunk.prefixes()]
            before = len(record.generated)
            record.keep_stop_ids(doc, chunk.kept(decoded))
            trimmed += len(record.generated) < before
        case = (body["stop"], body["include_stop_str_in_output"], minimum)
        assert "".join(sent) + record.stops.flush() == engine.text, case  # type: ignore[union-attr]
        assert record.generated == list(engine.ids), case
        assert doc["choices"][0]["finish_reason"] == engine.finish, case
    assert trimmed > 100, "too few merged events held tokens after the stop to prove anything"
    assert spanned > 100, "too few events crossed min_tokens to prove anything"


def test_a_merged_event_keeps_every_id_when_its_prefixes_are_not_decoded() -> None:
    chunk = StopChunk(ids=(7, 8, 9), context=(1, 2), reach=4)
    assert chunk.prefixes() == [[1, 2], [1, 2, 7], [1, 2, 7, 8]]
    assert chunk.kept([" a", " a bc", " a bcdef"]) == 2  # the second token reaches 4 chars
    assert chunk.kept([" a", " a bcdef", None]) == 1
    assert chunk.kept([" a", " a b", " a bc"]) == 3  # none before the last: all kept
    assert chunk.kept([None, " a bc", " a bcdef"]) == 3  # not decoded: all kept
    assert chunk.kept([" a", None, " a bcdef"]) == 3
    assert chunk.kept([" a"]) == 3  # an answer of the wrong length


def test_a_decode_ending_inside_a_character_counts_what_the_stream_shows() -> None:
    """Seen on real vLLM (the tiny model, tokenizers' `DecodeStream`): token 242 is the first
    byte of a character that 956 ends as "\ufffd(_", and 151 starts another. The stream shows
    "che" after 242, "che\ufffd(_" after 956; a decode of a prefix ending at 242 (or 151) ends
    in a U+FFFD the stream holds back. The stop "\ufffd(_" completes with 956: one id kept."""
    chunk = StopChunk(ids=(956, 151), context=(1453, 569, 242), reach=3)
    assert chunk.kept(["ttributeche\ufffd", "ttributeche\ufffd(_"]) == 1
    assert chunk.kept(["ttributeche", "ttributeche\ufffd(_"]) == 1


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
