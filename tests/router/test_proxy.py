"""The router's proxy on real sockets: fake engines (aiohttp servers speaking the OpenAI
streaming protocol, with faults on demand) behind a real router, driven by a real client.
What it proves: chunks pass as the engine writes them; a failure before the first byte is
retried once on another pod; a client that goes away cancels the engine's request; headers
pass; admin routes and unknown models are refused; a conversation stays on one pod; a pod's
queued prefill counts a request until its first byte."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from llmop_router.app import Router
from llmop_router.routes import RouteTable

CHUNK_GAP = 0.2


@dataclass
class FakeEngine:
    """An engine pod: streams `chunks` SSE events `CHUNK_GAP` apart, or fails as told."""

    name: str
    chunks: int = 3
    status: int = 200
    first_delay: float = 0.0
    """Seconds between the response headers and the first event (a prefill)."""
    seen: list[dict[str, Any]] = field(default_factory=list)
    cancelled: int = 0
    finished: int = 0
    address: str = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.seen.append({"body": body, "headers": dict(request.headers)})
        if self.status != 200:
            return web.json_response({"error": "draining"}, status=self.status)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            await asyncio.sleep(self.first_delay)
            for i in range(self.chunks):
                event = {"engine": self.name, "i": i}
                await response.write(f"data: {json.dumps(event)}\n\n".encode())
                await asyncio.sleep(CHUNK_GAP)
            await response.write(b"data: [DONE]\n\n")
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        self.finished += 1
        return response


@asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    sockets = site._server.sockets if site._server else []
    host, port = sockets[0].getsockname()[:2]
    try:
        yield f"{host}:{port}"
    finally:
        await runner.cleanup()


@asynccontextmanager
async def engines(*fakes: FakeEngine) -> AsyncIterator[list[FakeEngine]]:
    async with _serve_all(list(fakes)) as served:
        yield served


@asynccontextmanager
async def _serve_all(fakes: list[FakeEngine]) -> AsyncIterator[list[FakeEngine]]:
    if not fakes:
        yield []
        return
    head, *rest = fakes
    app = web.Application()
    app.router.add_post("/v1/chat/completions", head.handle)
    app.router.add_post("/v1/completions", head.handle)
    async with serving(app) as address:
        head.address = address
        async with _serve_all(rest) as others:
            yield [head, *others]


@asynccontextmanager
async def router_for(endpoints: list[str]) -> AsyncIterator[tuple[str, Router]]:
    table = RouteTable()
    table.set("llama", "team", "llama", endpoints)
    router = Router(table)
    async with serving(router.app()) as address:
        yield address, router


@dataclass
class Rig:
    url: str
    router: Router
    engines: list[FakeEngine]
    client: aiohttp.ClientSession

    def post(self, path: str, payload: Any, **kwargs: Any) -> Any:
        return self.client.post(f"http://{self.url}{path}", json=payload, **kwargs)


@asynccontextmanager
async def rig(*fakes: FakeEngine, extra: tuple[str, ...] = ()) -> AsyncIterator[Rig]:
    """Fake engines, a router over them (and `extra` endpoints), a client."""
    async with AsyncExitStack() as stack:
        served = await stack.enter_async_context(engines(*fakes))
        endpoints = [f.address for f in served] + list(extra)
        url, router = await stack.enter_async_context(router_for(endpoints))
        client = await stack.enter_async_context(aiohttp.ClientSession())
        yield Rig(url, router, served, client)


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), timeout=60))


def chat_body(text: str, model: str = "llama") -> dict[str, Any]:
    return {"model": model, "stream": True, "messages": [{"role": "user", "content": text}]}


def test_chunks_pass_as_the_engine_writes_them() -> None:
    async def body() -> None:
        async with rig(FakeEngine("a", chunks=4)) as r:
            started = time.monotonic()
            arrivals = []
            async with r.post("/v1/chat/completions", chat_body("hi")) as answer:
                assert answer.status == 200
                assert answer.headers["X-Accel-Buffering"] == "no"
                async for chunk in answer.content.iter_any():
                    arrivals.append((time.monotonic() - started, chunk))
        # The first event arrives long before the engine finished (4 x 0.2 s): nothing buffers.
        assert arrivals[0][0] < CHUNK_GAP, arrivals
        assert b"[DONE]" in b"".join(chunk for _, chunk in arrivals)

    run(body)


def test_a_refused_pod_is_retried_once_on_another() -> None:
    async def body() -> None:
        dead = await _closed_port()  # a port nothing listens on
        async with rig(FakeEngine("a", chunks=1), extra=(dead,)) as r:
            for i in range(8):
                async with r.post("/v1/chat/completions", chat_body(f"conversation {i}")) as a:
                    assert a.status == 200
                    await a.read()
            exposition = r.router.metrics.exposition().decode()
            assert len(r.engines[0].seen) == 8
            # The refused attempts left nothing queued on the dead pod.
            assert not r.router.table.queued
            assert not r.router.table.in_flight
        assert 'llmop_router_routed_total{reason="retry"}' in exposition
        assert "llmop_router_upstream_errors_total" in exposition

    run(body)


def test_a_draining_pod_answering_503_is_retried_on_another() -> None:
    async def body() -> None:
        async with rig(FakeEngine("d", status=503), FakeEngine("h", chunks=1)) as r:
            draining, healthy = r.engines
            sent = 0
            # Which pod is a conversation's home depends on the ring of the engines' (random)
            # ports: send conversations until the draining pod has been asked twice, so the
            # retry is taken whatever the ring (8 fixed ones all went home to one pod 1 run in
            # ~128).
            while len(draining.seen) < 2 and sent < 64:
                async with r.post("/v1/chat/completions", chat_body(f"c{sent}")) as a:
                    assert a.status == 200
                sent += 1
        assert len(draining.seen) == 2
        assert len(healthy.seen) == sent

    run(body)


def test_a_request_is_queued_on_its_pod_until_its_first_byte() -> None:
    """The router's load per pod: in flight until the answer ends, and the prompt as queued
    prefill until the answer's first byte (headers alone do not count: an engine sends them
    before it prefills)."""

    async def body() -> None:
        question = "q" * 1_000
        async with rig(FakeEngine("a", chunks=3, first_delay=0.5)) as r:
            table, pod = r.router.table, r.engines[0].address
            async with r.post("/v1/chat/completions", chat_body(question)) as answer:
                assert answer.status == 200
                assert (table.queued[pod], table.in_flight[pod]) == (len(question), 1)
                await answer.content.readany()
                assert (table.queued[pod], table.in_flight[pod]) == (0, 1)
                await answer.read()
            for _ in range(50):
                if not table.in_flight:
                    break
                await asyncio.sleep(0.02)
            assert not table.queued
            assert not table.in_flight

    run(body)


def test_a_client_that_goes_away_cancels_the_engine_request() -> None:
    async def body() -> None:
        async with rig(FakeEngine("a", chunks=50)) as r:
            answer = await r.post("/v1/chat/completions", chat_body("long"))
            await answer.content.readany()
            answer.close()  # the client hangs up mid-stream
            engine = r.engines[0]
            for _ in range(50):
                if engine.cancelled:
                    break
                await asyncio.sleep(0.1)
        assert engine.cancelled == 1
        assert engine.finished == 0

    run(body)


def test_headers_pass_and_a_conversation_stays_on_one_pod() -> None:
    async def body() -> None:
        async with rig(*(FakeEngine(n, chunks=1) for n in "abc")) as r:
            messages: list[dict[str, str]] = [{"role": "user", "content": "tell me a story"}]
            for turn in range(4):
                payload = {"model": "llama", "stream": True, "messages": messages}
                auth = {"Authorization": "Bearer sk-test"}
                async with r.post("/v1/chat/completions", payload, headers=auth) as a:
                    assert a.status == 200
                    await a.read()
                messages += [
                    {"role": "assistant", "content": f"part {turn}"},
                    {"role": "user", "content": "go on"},
                ]
            used = [f for f in r.engines if f.seen]
        assert len(used) == 1, [len(f.seen) for f in r.engines]
        assert all(s["headers"]["Authorization"] == "Bearer sk-test" for s in used[0].seen)

    run(body)


def test_admin_routes_unknown_models_and_the_model_list() -> None:
    async def body() -> None:
        async with rig(FakeEngine("a")) as r:
            async with r.post("/v1/load_lora_adapter", {"lora_name": "x"}) as a:
                assert a.status == 403
                assert "not routed" in (await a.json())["error"]["message"]
            async with r.post("/v1/chat/completions", chat_body("hi", model="nope")) as a:
                assert a.status == 404
                assert "'nope' is not served here" in (await a.json())["error"]["message"]
            async with r.client.get(f"http://{r.url}/v1/models") as a:
                listed = await a.json()
            assert r.engines[0].seen == []
        assert [m["id"] for m in listed["data"]] == ["llama"]
        assert listed["data"][0]["owned_by"] == "team/llama"

    run(body)


def test_a_model_with_no_ready_pod_answers_503_with_retry_after() -> None:
    async def body() -> None:
        async with rig() as r, r.post("/v1/chat/completions", chat_body("hi")) as a:
            assert a.status == 503
            assert a.headers["Retry-After"]
            assert "team/llama" in (await a.json())["error"]["message"]

    run(body)


async def _closed_port() -> str:
    server = await asyncio.start_server(lambda _r, _w: None, "127.0.0.1", 0)
    host, port = server.sockets[0].getsockname()[:2]
    server.close()
    await server.wait_closed()
    return f"{host}:{port}"
