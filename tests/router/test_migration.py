"""Request migration on real sockets: simulator replicas (which speak vLLM's token-id protocol
and fail at a chosen token: `X-Sim-Fault`) behind a real router with a static table, driven by a
real client. What it proves: a stream whose engine crashes, hangs or aborts mid-answer continues
on another replica, and the client reads the uninterrupted run's text and token ids, its usage
and finish reason, under one `id`; a request that cannot be continued, or has no replica left,
ends with one error event; a continuation never goes back to a pod that failed it; the gateway
meters the whole answer once."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from typing import Any

import pytest
from aiohttp import web

from llmop_engine.simulator import tokens
from llmop_engine.simulator.server import SimServer
from llmop_router.discovery import Claim, served_revisions
from llmop_router.migration import Settings
from llmop_router.routes import Wake
from support.migration_rig import (
    CHAT,
    COMPLETIONS,
    KEY,
    SIM,
    Answer,
    Rig,
    chat,
    completion,
    parse,
    rig,
    settled,
    synchronous,
)


def assert_same(migrated: Answer, reference: Answer) -> None:
    assert migrated.errors == []
    assert migrated.text == reference.text
    assert migrated.ids == reference.ids
    assert migrated.prompt_ids == reference.prompt_ids
    assert migrated.usage == reference.usage
    assert migrated.finish == reference.finish == ["length"]
    assert migrated.done == 1
    assert len(migrated.identities) == 1


@synchronous
async def test_crash_hang_and_cut_at_random_tokens_continue_token_for_token() -> None:
    shuffle = random.Random(51)
    async with rig() as r:
        for path, body in ((COMPLETIONS, completion), (CHAT, chat)):
            _, reference = await r.stream(path, body(return_token_ids=True))
            assert len(reference.ids) == 24
            assert reference.errors == []
            prompt = len(reference.prompt_ids)
            for kind in ("crash", "hang", "cut", "error"):
                k = shuffle.randrange(1, 24)
                fault = f"{kind}@ctx:{prompt + k}"
                _, migrated = await r.stream(path, body(return_token_ids=True), fault)
                assert_same(migrated, reference)
                # The client did not ask for ids: the same text, the keys null as vLLM sends them.
                _, plain = await r.stream(path, body(), fault)
                assert plain.text == reference.text
                assert plain.usage == reference.usage
                assert all(c["choices"][0].get("token_ids") is None for c in plain.chunks)
                assert plain.prompt_ids == []
                assert len(plain.identities) == 1
        continued = sum(
            r.metric("llmop_router_migrations_total", reason=reason, outcome="continued")
            for reason in ("reset", "idle", "abort", "error")
        )
        assert continued == 16
        assert r.metric("llmop_router_migration_seam_seconds_count", reason="idle") == 4


@synchronous
async def test_the_continuation_asks_for_the_rest_from_prompt_and_forwarded_ids() -> None:
    async with rig() as r:
        _, reference = await r.stream(COMPLETIONS, completion(return_token_ids=True))
        prompt = reference.prompt_ids
        await r.stream(COMPLETIONS, completion(min_tokens=20), f"cut@ctx:{len(prompt) + 7}")
        sent = [b for rep in r.replicas for p, b in rep.seen if isinstance(b["prompt"], list)]
        assert len(sent) == 1
        assert sent[0]["prompt"] == prompt + reference.ids[:7]
        assert sent[0]["max_tokens"] == 17
        assert sent[0]["min_tokens"] == 13
        assert sent[0]["return_token_ids"] is True
        # Chat continues on its own route, with the ids in `kv_transfer_params`.
        _, reference = await r.stream(CHAT, chat(return_token_ids=True))
        prompt = reference.prompt_ids
        await r.stream(CHAT, chat(), f"crash@ctx:{len(prompt) + 5}")
        kv = [
            b for rep in r.replicas for p, b in rep.seen if p == CHAT and "kv_transfer_params" in b
        ]
        assert kv[0]["kv_transfer_params"]["prompt_token_ids"] == prompt + reference.ids[:5]
        assert kv[0]["max_tokens"] == 19
        assert kv[0]["messages"] == chat()["messages"]


@synchronous
async def test_a_continuation_never_goes_back_to_a_failed_replica() -> None:
    async with rig(replicas=3) as r:
        _, reference = await r.stream(COMPLETIONS, completion(return_token_ids=True))
        n = len(reference.prompt_ids)
        for rep in r.replicas:
            rep.seen.clear()
        fault = f"crash@ctx:{n + 4},hang@ctx:{n + 11}"
        _, migrated = await r.stream(COMPLETIONS, completion(return_token_ids=True), fault)
        assert_same(migrated, reference)
        assert sorted(len(rep.seen) for rep in r.replicas) == [1, 1, 1]


@synchronous
async def test_no_replica_left_ends_with_one_error_event() -> None:
    async with rig(replicas=2) as r:
        _, reference = await r.stream(COMPLETIONS, completion(return_token_ids=True))
        n = len(reference.prompt_ids)
        fault = f"crash@ctx:{n + 4},crash@ctx:{n + 9}"
        text, answer = await r.stream(COMPLETIONS, completion(return_token_ids=True), fault)
        assert len(answer.errors) == 1
        assert text.count("event: error") == 1
        assert "no other ready replica" in answer.errors[0]["error"]["message"]
        assert answer.ids == reference.ids[:9]
        assert answer.done == 0
        assert answer.finish == []
        assert r.metric("llmop_router_migrations_total", reason="reset", outcome="no_replica") == 1


@synchronous
async def test_a_request_that_cannot_be_continued_ends_with_one_error_event() -> None:
    async with rig() as r:
        _, reference = await r.stream(COMPLETIONS, completion(return_token_ids=True))
        n = len(reference.prompt_ids)
        for extra in ({"n": 2}, {"stop": ["zz"] * 17}, {"seed": 3, "temperature": 0.7}):
            text, answer = await r.stream(COMPLETIONS, completion(**extra), f"crash@ctx:{n + 6}")
            assert text.count("event: error") == 1
            assert answer.done == 0
            assert "cannot be continued" in answer.errors[0]["error"]["message"]
        # Off: the same, saying so.
    async with rig(settings=Settings(limit=0)) as r:
        text, answer = await r.stream(COMPLETIONS, completion(), f"crash@ctx:{n + 6}")
        assert text.count("event: error") == 1
        assert "migration is off" in answer.errors[0]["error"]["message"]
        assert r.metric("llmop_router_migrations_total", reason="reset", outcome="limit") == 1


@synchronous
async def test_the_limit_bounds_migrations_per_request() -> None:
    async with rig(replicas=3, settings=Settings(limit=1, inactivity_seconds=0.4)) as r:
        _, reference = await r.stream(COMPLETIONS, completion(return_token_ids=True))
        n = len(reference.prompt_ids)
        fault = f"cut@ctx:{n + 3},cut@ctx:{n + 8}"
        _, answer = await r.stream(COMPLETIONS, completion(), fault)
        assert "limit (1)" in answer.errors[0]["error"]["message"]
        assert answer.text == reference.text[: len(answer.text)]
        assert len(answer.chunks) == 8


@synchronous
async def test_the_gateway_meters_the_whole_answer_once_across_attempts() -> None:
    async with rig(gateway=True) as r:
        assert r.router.gateway is not None
        _, reference = await r.stream(COMPLETIONS, completion(return_token_ids=True))
        assert reference.usage is not None
        n = len(reference.prompt_ids)
        body = completion()
        del body["stream_options"]  # the gateway asks for usage, and hides it from the client
        _, migrated = await r.stream(COMPLETIONS, body, f"cut@ctx:{n + 10}")
        assert migrated.text == reference.text
        assert migrated.usage is None
        assert r.metric("llmop_router_migrations_total", reason="abort", outcome="continued") == 1
        await settled(r.router.gateway)
        tokens = "llmop_gateway_tokens_total"
        output = r.metric(tokens, tenant="a", model="llama", kind="output")
        assert output == 2 * 24
        assert r.metric(tokens, tenant="a", model="llama", kind="input") == 2 * n


@synchronous
async def test_an_unfaulted_stream_keeps_the_engines_shape() -> None:
    async with rig() as r:
        for path, body in ((COMPLETIONS, completion()), (CHAT, chat())):
            _, routed = await r.stream(path, body)
            async with r.http.post(f"http://{r.replicas[0].address}{path}", json=body) as direct:
                engine = parse(await direct.text())
            assert [sorted(e) for e in routed.events] == [sorted(e) for e in engine.events]
            assert [sorted(c) for e in routed.chunks for c in e["choices"]] == [
                sorted(c) for e in engine.chunks for c in e["choices"]
            ]
            assert routed.text == engine.text
            assert routed.done == 1


@synchronous
async def test_a_hung_stream_whose_pod_left_the_table_moves_before_the_inactivity_bound() -> None:
    settings = Settings(limit=2, inactivity_seconds=30, unready_idle_seconds=0.3)
    async with rig(settings=settings) as r:
        _, reference = await r.stream(COMPLETIONS, completion(return_token_ids=True))
        n = len(reference.prompt_ids)
        table = r.router.table

        async def unroute_the_serving_pod() -> None:
            while not table.in_flight:
                await asyncio.sleep(0.01)
            serving = next(iter(table.in_flight))
            others = [rep.address for rep in r.replicas if rep.address != serving]
            table.set("llama", "team", "llama", others)

        mover = asyncio.create_task(unroute_the_serving_pod())
        started = asyncio.get_running_loop().time()
        _, migrated = await r.stream(
            COMPLETIONS, completion(return_token_ids=True), f"hang@ctx:{n + 12}"
        )
        await mover
        assert asyncio.get_running_loop().time() - started < 5
        assert_same(migrated, reference)
        assert r.metric("llmop_router_migrations_total", reason="unready", outcome="continued") == 1


@synchronous
async def test_a_crs_migration_limit_overrides_the_routers() -> None:
    async with rig() as r:
        _, reference = await r.stream(COMPLETIONS, completion(return_token_ids=True))
        n = len(reference.prompt_ids)
        endpoints = [rep.address for rep in r.replicas]
        r.router.table.set("llama", "team", "llama", endpoints, Wake(), migration_limit=0)
        text, answer = await r.stream(COMPLETIONS, completion(), f"crash@ctx:{n + 6}")
        assert text.count("event: error") == 1
        assert "migration is off" in answer.errors[0]["error"]["message"]
        r.router.table.set("llama", "team", "llama", endpoints, Wake(), migration_limit=None)
        _, migrated = await r.stream(COMPLETIONS, completion(), f"crash@ctx:{n + 6}")
        assert migrated.text == reference.text


@synchronous
async def test_a_non_streaming_answer_cut_mid_generation_runs_again_once_elsewhere() -> None:
    async with rig() as r:
        faulted, healthy = r.replicas
        for kind, reason in (("cut", "abort"), ("error", "error")):
            for rep in r.replicas:
                rep.seen.clear()
            async with r.http.post(
                f"http://{faulted.address}/sim/fault", json={"requestFault": f"{kind}@3"}
            ) as set_fault:
                assert set_fault.status == 200
            for n in range(8):
                body = completion(prompt=f"question {n} about foxes", stream=False)
                del body["stream_options"]
                async with r.http.post(
                    f"http://{healthy.address}{COMPLETIONS}", json=body
                ) as direct:
                    want = await direct.json()
                async with r.http.post(
                    r.url + COMPLETIONS, json=body, headers={"Authorization": f"Bearer {KEY}"}
                ) as routed:
                    assert routed.status == 200, await routed.text()
                    got = await routed.json()
                assert got["choices"][0]["text"] == want["choices"][0]["text"]
                assert got["choices"][0]["finish_reason"] == "length"
            cut = len(faulted.seen)
            assert cut >= 1, "no request landed first on the faulted replica"
            assert r.metric("llmop_router_migrations_total", reason=reason, outcome="rerun") == cut
        # Never twice: with every replica cutting, the second answer goes to the client as it is.
        for rep in r.replicas:
            async with r.http.post(
                f"http://{rep.address}/sim/fault", json={"requestFault": "cut@3"}
            ) as set_fault:
                assert set_fault.status == 200
        body = completion(stream=False)
        del body["stream_options"]
        async with r.http.post(
            r.url + COMPLETIONS, json=body, headers={"Authorization": f"Bearer {KEY}"}
        ) as routed:
            assert (await routed.json())["choices"][0]["finish_reason"] == "abort"
        # Off for the model: not run again.
        endpoints = [rep.address for rep in r.replicas]
        r.router.table.set("llama", "team", "llama", endpoints, Wake(), migration_limit=0)
        before = r.metric("llmop_router_migrations_total", reason="abort", outcome="rerun")
        async with r.http.post(
            r.url + COMPLETIONS, json=body, headers={"Authorization": f"Bearer {KEY}"}
        ) as routed:
            assert (await routed.json())["choices"][0]["finish_reason"] == "abort"
        assert r.metric("llmop_router_migrations_total", reason="abort", outcome="rerun") == before


@synchronous
async def test_a_continuation_goes_only_to_a_pod_of_the_revision_that_began_it() -> None:
    async with rig(replicas=3) as r:
        _, reference = await r.stream(COMPLETIONS, completion(return_token_ids=True))
        n = len(reference.prompt_ids)
        began = next(rep for rep in r.replicas if rep.seen)
        same, other = [rep for rep in r.replicas if rep is not began]
        endpoints = [rep.address for rep in r.replicas]

        def revisions(**by_address: str) -> None:
            r.router.table.set(
                "llama", "team", "llama", endpoints, Wake(), revisions=dict(by_address)
            )

        # The same prompt is picked to the same pod first; the other two serve r1 and r2.
        revisions(**{began.address: "r1", same.address: "r1", other.address: "r2"})
        for rep in r.replicas:
            rep.seen.clear()
        _, migrated = await r.stream(
            COMPLETIONS, completion(return_token_ids=True), f"crash@ctx:{n + 5}"
        )
        assert_same(migrated, reference)
        assert (len(began.seen), len(same.seen), len(other.seen)) == (1, 1, 0)

        # No pod of r1 left but the one that failed: an error event, never the other revision.
        revisions(**{began.address: "r1", same.address: "r2", other.address: "r2"})
        for rep in r.replicas:
            rep.seen.clear()
        text, answer = await r.stream(
            COMPLETIONS, completion(return_token_ids=True), f"crash@ctx:{n + 5}"
        )
        assert text.count("event: error") == 1
        assert "serves the model revision that began it" in answer.errors[0]["error"]["message"]
        assert answer.ids == reference.ids[:5]
        assert (len(same.seen), len(other.seen)) == (0, 0)
        assert (
            r.metric("llmop_router_migrations_total", reason="reset", outcome="other_revision") == 1
        )

        # A pod the status does not list (its revision not known yet) is no target either.
        revisions(**{began.address: "r1"})
        text, answer = await r.stream(
            COMPLETIONS, completion(return_token_ids=True), f"crash@ctx:{n + 5}"
        )
        assert text.count("event: error") == 1

        # A status without revisions (an older operator): not pinned, as before.
        r.router.table.set("llama", "team", "llama", endpoints, Wake(), revisions=None)
        _, migrated = await r.stream(
            COMPLETIONS, completion(return_token_ids=True), f"crash@ctx:{n + 5}"
        )
        assert_same(migrated, reference)


async def direct(r: Rig, path: str, body: dict[str, Any]) -> Answer:
    """The engine's own answer (its own stop rules), past the router."""
    async with r.http.post(f"http://{r.replicas[0].address}{path}", json=body) as answer:
        assert answer.status == 200, await answer.text()
        return parse(await answer.text())


def counts(usage: dict[str, Any] | None) -> tuple[Any, ...]:
    assert usage is not None
    return tuple(usage[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens"))


@synchronous
async def test_a_stop_string_spanning_the_seam_ends_the_answer_where_the_engine_would_have() -> (
    None
):
    """The router matches an eligible stream's stop strings itself: a stream cut inside a stop
    string (part of it sent, part held back) continues elsewhere and still stops there, with
    the text, ids, finish, `stop_reason` and usage the engine gives an uncut request."""
    async with rig() as r:
        for path, body in ((COMPLETIONS, completion), (CHAT, chat)):
            _, plain = await r.stream(path, body(return_token_ids=True, max_tokens=40))
            n = len(plain.prompt_ids)
            middle = plain.text.index(" ", len(plain.text) // 2)
            stop = plain.text[middle - 2 : middle + 3]  # across a word boundary
            for include in (False, True):
                extra = {"return_token_ids": True, "max_tokens": 40, "stop": [stop, "~never~"]}
                extra["include_stop_str_in_output"] = include
                reference = await direct(r, path, body(**extra))
                assert reference.finish == ["stop"], reference.text
                k = len(reference.ids)  # the stop string completes with token k
                _, uncut = await r.stream(path, body(**extra))
                for fault in (None, f"crash@ctx:{n + k - 1}", f"cut@ctx:{n + k - 2}"):
                    _, migrated = await r.stream(path, body(**extra), fault)
                    case = (path, include, fault)
                    for answer in (migrated, uncut):
                        assert answer.text == reference.text, case
                        assert answer.ids == reference.ids, case
                        assert answer.finish == ["stop"], case
                        assert answer.chunks[-1]["choices"][0]["stop_reason"] == stop, case
                        assert counts(answer.usage) == counts(reference.usage), case
                        assert answer.done == 1
                    assert migrated.errors == []
        assert r.metric("llmop_router_migrations_total", reason="reset", outcome="continued") == 4


@synchronous
async def test_a_stop_string_completed_inside_a_merged_event_keeps_only_the_tokens_up_to_it() -> (
    None
):
    """An engine that sends several tokens an event (vLLM's `--stream-interval`, or its output
    collector merging steps when the reader lags) also sends, in the event that completes a stop
    string, the tokens after the one that completed it; vLLM itself keeps only those up to it.
    The router asks the engine's tokenizer (`/detokenize`) which one it was, so the ids and the
    usage equal the engine's own stop, wherever in the event the string completes."""
    config = dataclasses.replace(SIM, stream_interval=4)
    async with rig(config=config) as r:
        for path, body in ((COMPLETIONS, completion), (CHAT, chat)):
            _, plain = await r.stream(path, body(return_token_ids=True, max_tokens=40))
            n = len(plain.prompt_ids)
            ends = sorted({plain.text.index(" ", 12 + 5 * i) for i in range(6)})
            for include in (False, True):
                for end in ends:
                    stop = plain.text[end - 2 : end + 3]  # across a word boundary
                    extra = {"return_token_ids": True, "max_tokens": 40, "stop": [stop]}
                    extra["include_stop_str_in_output"] = include
                    reference = await direct(r, path, body(**extra))
                    assert reference.finish == ["stop"], reference.text
                    k = len(reference.ids)
                    for fault in (None, f"crash@ctx:{n + k - 2}"):
                        _, answer = await r.stream(path, body(**extra), fault)
                        case = (path, include, stop, fault)
                        assert answer.errors == [], case
                        assert answer.text == reference.text, case
                        assert answer.ids == reference.ids, case
                        assert counts(answer.usage) == counts(reference.usage), case
                        assert answer.chunks[-1]["choices"][0]["stop_reason"] == stop, case


@synchronous
async def test_a_merged_event_crossing_min_tokens_is_searched_from_the_token_past_it() -> None:
    """With `min_tokens`, vLLM checks the stop strings token by token once more than
    `min_tokens` exist: a match ending in the text of an earlier token of the same event does
    not count. The router decodes where the event's first token past `min_tokens` begins in its
    text (`/detokenize`) and searches from there, so its answer equals the engine's own."""
    async with rig(config=dataclasses.replace(SIM, stream_interval=4)) as r:
        _, plain = await r.stream(COMPLETIONS, completion(return_token_ids=True, max_tokens=30))
        ignored = 0
        for minimum in (2, 3, 4, 7, 8):  # events: token 1, tokens 2-5, 6-9, ...
            through = "".join(tokens.word_text(i) for i in plain.ids[:minimum])
            stop = through[-3:]  # ends in the last token not yet checked
            extra = {"return_token_ids": True, "max_tokens": 30, "min_tokens": minimum}
            extra["stop"] = [stop]
            reference = await direct(r, COMPLETIONS, completion(**extra))
            _, answer = await r.stream(COMPLETIONS, completion(**extra))
            case = (minimum, stop)
            assert answer.errors == [], case
            assert answer.text == reference.text, case
            assert answer.ids == reference.ids, case
            assert answer.finish == reference.finish, case
            assert counts(answer.usage) == counts(reference.usage), case
            ignored += len(reference.ids) > minimum
        assert ignored >= 3, "too few answers went past the early match to prove anything"


def test_an_engine_that_cannot_decode_keeps_every_id_of_the_merged_event(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No `/detokenize` (an engine older than the route, or one that fails it): the answer still
    ends at its stop string with the text the engine would give, and keeps the merged event's
    ids, as before the router could decode them, never an error."""

    async def missing(self: SimServer, request: web.Request) -> web.Response:
        return web.json_response({"detail": "Not Found"}, status=404)

    monkeypatch.setattr(SimServer, "detokenize", missing)

    async def run() -> None:
        async with rig(config=dataclasses.replace(SIM, stream_interval=4)) as r:
            _, plain = await r.stream(COMPLETIONS, completion(return_token_ids=True))
            stop = plain.text[8:12]
            extra = {"return_token_ids": True, "stop": [stop]}
            reference = await direct(r, COMPLETIONS, completion(**extra))
            _, answer = await r.stream(COMPLETIONS, completion(**extra))
            assert answer.errors == []
            assert answer.text == reference.text
            assert answer.finish == ["stop"]
            assert answer.ids[: len(reference.ids)] == reference.ids
            assert len(answer.ids) > len(reference.ids), "the stop completes mid-event"
            assert counts(answer.usage)[1] == len(answer.ids)

    asyncio.run(run())


@synchronous
async def test_a_stream_of_an_adapter_continues_only_while_the_adapter_stays_settled() -> None:
    """An adapter's files change in place (a new revision loaded under the same name, no new
    pod): the router pins a stream of it to the adapter's revision as well as the model's
    (`status.routing.adapterRevisions`, through `discovery.served_revisions`), and continues it
    only while the adapter is settled at the revision it had when the stream began."""
    config = dataclasses.replace(SIM, served_model_names=("llama", "sql"))
    async with rig(config=config) as r:
        endpoints = [rep.address for rep in r.replicas]
        pods = {rep.address: f"pod-{i}" for i, rep in enumerate(r.replicas)}

        def route(pin: str | None) -> None:
            claim = Claim(
                "team",
                "llama",
                "llama",
                "",
                adapters=("sql",),
                revisions=tuple((pod, "m1") for pod in pods.values()),
                adapter_revisions={"sql": pin},
            )
            for model in claim.models:
                revisions = served_revisions(pods, claim, model)
                r.router.table.set(model, "team", "llama", endpoints, Wake(), revisions=revisions)

        def body() -> dict[str, Any]:
            return completion(model="sql", return_token_ids=True)

        route("revision:a1")
        _, reference = await r.stream(COMPLETIONS, body())
        n = len(reference.prompt_ids)
        _, migrated = await r.stream(COMPLETIONS, body(), f"crash@ctx:{n + 5}")
        assert_same(migrated, reference)

        # Replaced in place while the stream runs (the engine hangs, the router waits out its
        # inactivity bound meanwhile): one error event, never the other files.
        streaming = asyncio.create_task(r.stream(COMPLETIONS, body(), f"hang@ctx:{n + 5}"))
        await asyncio.sleep(0.15)
        route(None)  # the new revision asked for, not yet on every replica
        text, answer = await streaming
        assert text.count("event: error") == 1
        assert answer.ids == reference.ids[:5]
        await asyncio.sleep(0)
        streaming = asyncio.create_task(r.stream(COMPLETIONS, body(), f"hang@ctx:{n + 5}"))
        await asyncio.sleep(0.15)
        route("revision:a2")  # settled again, at another revision
        text, answer = await streaming
        assert text.count("event: error") == 1

        # A stream begun while the adapter is not settled is not continued either; the base
        # model's streams are (its pins are the model's only).
        route(None)
        text, _ = await r.stream(COMPLETIONS, body(), f"crash@ctx:{n + 5}")
        assert text.count("event: error") == 1
        _, base = await r.stream(COMPLETIONS, completion(return_token_ids=True))
        _, continued = await r.stream(
            COMPLETIONS, completion(return_token_ids=True), f"crash@ctx:{n + 5}"
        )
        assert continued.errors == []
        assert continued.ids == base.ids
        assert (
            r.metric("llmop_router_migrations_total", reason="reset", outcome="other_revision") == 1
        )
