"""Request migration on real sockets: simulator replicas (which speak vLLM's token-id protocol
and fail at a chosen token: `X-Sim-Fault`) behind a real router with a static table, driven by a
real client. What it proves: a stream whose engine crashes, hangs or aborts mid-answer continues
on another replica, and the client reads the uninterrupted run's text and token ids, its usage
and finish reason, under one `id`; a request that cannot be continued, or has no replica left,
ends with one error event; a continuation never goes back to a pod that failed it; the gateway
meters the whole answer once."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmop_engine.simulator.server import SimServer
from llmop_engine.simulator.sim_config import SimConfig
from llmop_router.app import Router
from llmop_router.contract import api_key_hash
from llmop_router.gateway import Gateway
from llmop_router.metrics import GatewayMetrics
from llmop_router.migration import Settings
from llmop_router.routes import RouteTable
from llmop_router.store import Local
from llmop_router.tenants import parse_tenant

SIM = SimConfig(model="llama", max_num_seqs=8, load_seconds=0, decode_ms=1, decode_ms_per_seq=0.0)
SETTINGS = Settings(limit=2, inactivity_seconds=0.4, unready_idle_seconds=0.3)
COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"


KEY = "llmop_test-key-of-team-a-0123456789abcdef"


def tenant(name: str, key: str) -> dict[str, Any]:
    keys = [{"name": "main", "sha256": api_key_hash(key)}]
    return {"metadata": {"name": name}, "spec": {"apiKeys": keys}}


async def settled(gateway: Gateway) -> None:
    """Settlement runs in the background: wait for it."""
    for _ in range(100):
        if not gateway._settling:
            return
        await asyncio.sleep(0.01)


def synchronous(test: Callable[[], Awaitable[None]]) -> Callable[[], None]:
    @functools.wraps(test)
    def run() -> None:
        asyncio.run(asyncio.wait_for(test(), timeout=60))

    return run


@dataclass
class Replica:
    sim: SimServer
    address: str = ""
    seen: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    """(path, body) of every OpenAI request it got."""


@contextlib.asynccontextmanager
async def replica() -> AsyncIterator[Replica]:
    server = SimServer(SIM)
    found = Replica(server)

    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path.startswith("/v1/"):
            found.seen.append((request.path, json.loads(await request.read())))
        response: web.StreamResponse = await handler(request)
        return response

    app = server.app()
    app.middlewares.append(record)
    engine = asyncio.create_task(server.engine.run())
    site = TestServer(app, host="127.0.0.1")
    await site.start_server()
    found.address = f"127.0.0.1:{site.port}"
    try:
        yield found
    finally:
        await site.close()
        server.engine.stop()
        engine.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await engine


@dataclass
class Answer:
    events: list[dict[str, Any]]
    errors: list[dict[str, Any]]
    done: int

    @property
    def chunks(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("choices")]

    @property
    def text(self) -> str:
        parts = []
        for event in self.chunks:
            choice = event["choices"][0]
            parts.append(
                choice["delta"].get("content") or "" if "delta" in choice else choice["text"]
            )
        return "".join(parts)

    @property
    def ids(self) -> list[int]:
        return [i for e in self.chunks for i in (e["choices"][0].get("token_ids") or [])]

    @property
    def prompt_ids(self) -> list[int]:
        for event in self.events:
            if isinstance(event.get("prompt_token_ids"), list):
                return list(event["prompt_token_ids"])
            for choice in event.get("choices") or []:
                if isinstance(choice.get("prompt_token_ids"), list):
                    return list(choice["prompt_token_ids"])
        return []

    @property
    def finish(self) -> list[str]:
        return [
            c["finish_reason"] for e in self.chunks for c in e["choices"] if c.get("finish_reason")
        ]

    @property
    def usage(self) -> dict[str, Any] | None:
        found = [e["usage"] for e in self.events if e.get("usage")]
        return found[-1] if found else None

    @property
    def identities(self) -> set[tuple[Any, ...]]:
        return {(e["id"], e["created"], e["model"], e["object"]) for e in self.events}


def parse(text: str) -> Answer:
    events: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    done = 0
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        lines = block.strip().split("\n")
        data = next(line[5:].strip() for line in lines if line.startswith("data:"))
        if data == "[DONE]":
            done += 1
        elif any(line.startswith("event: error") for line in lines):
            errors.append(json.loads(data))
        else:
            events.append(json.loads(data))
    return Answer(events, errors, done)


@dataclass
class Rig:
    url: str
    router: Router
    replicas: list[Replica]
    http: aiohttp.ClientSession

    async def stream(
        self, path: str, body: dict[str, Any], fault: str | None = None
    ) -> tuple[str, Answer]:
        headers = {"X-Sim-Fault": fault} if fault else {}
        headers["Authorization"] = f"Bearer {KEY}"
        async with self.http.post(self.url + path, json=body, headers=headers) as answer:
            assert answer.status == 200, await answer.text()
            text = await answer.text()
        return text, parse(text)

    def metric(self, name: str, **labels: str) -> float:
        return self.router.metrics.registry.get_sample_value(name, labels) or 0.0


@contextlib.asynccontextmanager
async def rig(
    replicas: int = 2, settings: Settings = SETTINGS, gateway: bool = False
) -> AsyncIterator[Rig]:
    async with contextlib.AsyncExitStack() as stack:
        found = [await stack.enter_async_context(replica()) for _ in range(replicas)]
        table = RouteTable()
        table.set("llama", "team", "llama", [r.address for r in found])
        router = Router(table, migration=settings)
        router.ready = True
        if gateway:
            router.gateway = Gateway(Local(), GatewayMetrics(router.metrics.registry))
            router.gateway.set_tenants([parse_tenant(tenant("a", KEY))])
        site = TestServer(router.app(), host="127.0.0.1")
        await site.start_server()
        stack.push_async_callback(site.close)
        http = await stack.enter_async_context(aiohttp.ClientSession())
        yield Rig(f"http://127.0.0.1:{site.port}", router, found, http)


def completion(**extra: Any) -> dict[str, Any]:
    body = {"model": "llama", "prompt": "the quick brown fox", "max_tokens": 24, "stream": True}
    return {**body, "stream_options": {"include_usage": True}, **extra}


def chat(**extra: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": "tell me a story about a fox"}]
    body = {"model": "llama", "messages": messages, "max_tokens": 24, "stream": True}
    return {**body, "stream_options": {"include_usage": True}, **extra}


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
        for extra in ({"n": 2}, {"stop": ["zz"]}, {"seed": 3, "temperature": 0.7}):
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
