"""Request migration's rig on real sockets, for its tests and `make bench-migration`: simulator
replicas (vLLM's token-id protocol, a fault at a chosen token: `X-Sim-Fault`) behind a real
router with a static table, a real client, and the parsed SSE answer."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
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
    headers: list[dict[str, str]] = field(default_factory=list)
    """The headers of each of those requests."""


@contextlib.asynccontextmanager
async def replica(config: SimConfig = SIM) -> AsyncIterator[Replica]:
    """A simulator on a loopback port, its engine loop running, recording what it is sent."""
    server = SimServer(config)
    found = Replica(server)

    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path.startswith("/v1/"):
            found.seen.append((request.path, json.loads(await request.read())))
            found.headers.append(dict(request.headers))
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
    replicas: int = 2, settings: Settings = SETTINGS, gateway: bool = False, config: SimConfig = SIM
) -> AsyncIterator[Rig]:
    async with contextlib.AsyncExitStack() as stack:
        found = [await stack.enter_async_context(replica(config)) for _ in range(replicas)]
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
