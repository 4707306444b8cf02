"""Scale to zero in the router on real sockets: a CR whose Ready condition says `ScaledToZero`
and has no ready pod gets its requests held (streams get SSE comment heartbeats), is woken once
however many arrive, and once a stand-in engine appears they are released in arrival order at
the engine's concurrency and all complete. The cap answers 429 with Retry-After, the hold timeout
504 (JSON naming the CR and the phase, or an SSE error event on a stream that got heartbeats),
a stopping router 503; a CR at zero that is not ScaledToZero is never woken. The waker here
records its calls (the scale patch against a real API server is tests/integration's)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from llmop_router.app import Router, serve
from llmop_router.discovery import Catalog
from llmop_router.hold import PHASE_REQUESTED, ScaleToZero
from llmop_router.routes import Backend, RouteTable, Wake
from llmop_router.scale_to_zero import MAX_START_PROBES, StartProbes
from router.test_proxy import FakeEngine, chat_body, engines, run, serving

HEARTBEAT = 0.2
CR = '{llmdeployment="llama",llmdeployment_namespace="team"}'


def refusals(reason: str) -> str:
    labels = f'llmdeployment="llama",llmdeployment_namespace="team",reason="{reason}"'
    return f"llmop_router_hold_refused_total{{{labels}}}"


CONCURRENCY = 4


@dataclass
class CountingEngine(FakeEngine):
    """A stand-in engine that also records its most requests at once."""

    active: int = 0
    peak: int = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            return await super().handle(request)
        finally:
            self.active -= 1


@dataclass
class Waker:
    calls: list[tuple[str, str, str]] = field(default_factory=list)

    async def __call__(self, backend: Backend) -> str:
        self.calls.append((backend.namespace, backend.name, backend.wake.workload))
        return PHASE_REQUESTED


def at_zero(**settings: Any) -> Wake:
    return Wake(scaled_to_zero=True, settings=ScaleToZero(**settings), concurrency=CONCURRENCY)


@dataclass
class ZeroRig:
    url: str
    admin: str
    """The admin port (`/llmop/activity`)."""
    router: Router
    waker: Waker
    client: aiohttp.ClientSession

    def post(self, payload: Any) -> Any:
        return self.client.post(f"http://{self.url}/v1/chat/completions", json=payload)

    async def activity(self) -> list[dict[str, Any]]:
        async with self.client.get(f"http://{self.admin}/llmop/activity") as answer:
            assert answer.status == 200
            models: list[dict[str, Any]] = (await answer.json())["models"]
            return models

    async def held(self, count: int) -> None:
        for _ in range(200):
            if self.router.holding.held(("team", "llama")) == count:
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"never {count} held: {self.router.holding.held(('team', 'llama'))}")


@asynccontextmanager
async def zero_rig(wake: Wake) -> AsyncIterator[ZeroRig]:
    table = RouteTable()
    table.set("llama", "team", "llama", [], wake)
    waker = Waker()
    router = Router(table, heartbeat=HEARTBEAT, waker=waker)
    async with AsyncExitStack() as stack:
        url = await stack.enter_async_context(serving(router.app()))
        admin = await stack.enter_async_context(serving(router.admin_app()))
        client = await stack.enter_async_context(aiohttp.ClientSession())
        yield ZeroRig(url, admin, router, waker, client)


def body_of(text: str, *, stream: bool) -> dict[str, Any]:
    return {**chat_body(text), "stream": stream}


async def answer_of(rig: ZeroRig, text: str, *, stream: bool) -> tuple[int, bytes]:
    async with rig.post(body_of(text, stream=stream)) as answer:
        return answer.status, await answer.read()


def test_twenty_held_requests_wake_the_cr_once_and_all_complete() -> None:
    async def body() -> None:
        async with zero_rig(at_zero()) as rig:
            sends = [
                asyncio.create_task(answer_of(rig, f"request {i}", stream=i % 2 == 0))
                for i in range(20)
            ]
            await rig.held(20)
            activity = await rig.activity()
            assert activity == [
                {
                    "namespace": "team",
                    "name": "llama",
                    "inFlight": 0,
                    "held": 20,
                    "lastRequestUnix": activity[0]["lastRequestUnix"],
                }
            ]
            assert isinstance(activity[0]["lastRequestUnix"], float)
            await asyncio.sleep(3 * HEARTBEAT)  # the streams get heartbeats meanwhile
            async with engines(CountingEngine("a", chunks=3)) as (engine,):
                # The engine turns ready: the watch would put its endpoint in the table.
                rig.router.table.set("llama", "team", "llama", [engine.address])
                answers = await asyncio.gather(*sends)
            assert rig.waker.calls == [("team", "llama", "deployments")]
            assert rig.router.holding.held(("team", "llama")) == 0
            exposition = rig.router.metrics.exposition().decode()
        assert [status for status, _ in answers] == [200] * 20
        for i, (_, text) in enumerate(answers):
            assert text.endswith(b"data: [DONE]\n\n"), text
            # Held streams got heartbeats before their answer; the others did not.
            assert (b": waiting for team/llama to wake\n\n" in text) == (i % 2 == 0), text
        assert engine.finished == 20
        assert engine.peak <= CONCURRENCY  # released at the engine's concurrency, not at once
        assert f"llmop_router_wakes_total{CR} 1.0" in exposition
        assert f"llmop_router_held_total{CR} 20.0" in exposition
        assert f"llmop_router_held_requests{CR} 0.0" in exposition
        assert "llmop_router_wake_seconds_count 1.0" in exposition

    run(body)


def test_the_cap_answers_429_and_the_timeout_504() -> None:
    async def body() -> None:
        async with zero_rig(at_zero(hold_timeout_seconds=1.0, max_pending_requests=3)) as rig:
            held = [
                asyncio.create_task(answer_of(rig, "a", stream=False)),
                asyncio.create_task(answer_of(rig, "b", stream=False)),
                asyncio.create_task(answer_of(rig, "c", stream=True)),
            ]
            await rig.held(3)
            async with rig.post(body_of("d", stream=False)) as refused:
                assert refused.status == 429
                assert int(refused.headers["Retry-After"]) > 0
                message = (await refused.json())["error"]["message"]
            assert "team/llama" in message
            assert "maxPendingRequests" in message
            (s1, b1), (s2, b2), (s3, b3) = await asyncio.gather(*held)
            exposition = rig.router.metrics.exposition().decode()
            assert len(rig.waker.calls) == 1
        # Not streamed: a 504 with a JSON error naming the CR and the phase it waited in.
        assert (s1, s2) == (504, 504)
        for text in (b1, b2):
            error = json.loads(text)["error"]
            assert error["code"] == 504
            assert "LLMDeployment team/llama did not wake within 1 s" in error["message"]
            assert PHASE_REQUESTED in error["message"]
        # Streamed, with heartbeats sent: the 200 headers went out, so the 504 is an SSE error
        # event and the stream ends.
        assert s3 == 200
        heartbeats, _, tail = b3.decode().rpartition(": waiting for team/llama to wake\n\n")
        assert heartbeats.count(": waiting for team/llama to wake") >= 2
        event, data = tail.strip().split("\n")
        assert event == "event: error"
        error = json.loads(data.removeprefix("data: "))["error"]
        assert error["code"] == 504
        assert PHASE_REQUESTED in error["message"]
        assert f"{refusals('timeout')} 3.0" in exposition
        assert f"{refusals('full')} 1.0" in exposition
        assert 'llmop_router_requests_total{code="504",model="llama"} 3.0' in exposition

    run(body)


def test_a_cr_at_zero_that_is_not_scaled_to_zero_is_never_woken() -> None:
    async def body() -> None:
        # A hand-set `spec.replicas: 0`: no endpoint, Ready for another reason.
        async with zero_rig(Wake(scaled_to_zero=False)) as rig:
            for _ in range(3):
                async with rig.post(body_of("hi", stream=True)) as answer:
                    assert answer.status == 503
                    assert answer.headers["Retry-After"]
            assert rig.waker.calls == []
            assert not rig.router.holding.holding(("team", "llama"))

    run(body)


def test_a_stopping_router_answers_its_held_requests_503() -> None:
    async def body() -> None:
        table = RouteTable()
        table.set("llama", "team", "llama", [], at_zero())
        router = Router(table, heartbeat=HEARTBEAT, waker=Waker())
        stop = asyncio.Event()
        port: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        server = asyncio.create_task(
            serve(
                router,
                "127.0.0.1",
                0,
                shutdown_delay=0.2,
                drain=5,
                stop=stop,
                listening=port.set_result,
            )
        )
        url = f"http://127.0.0.1:{await port}/v1/chat/completions"
        async with aiohttp.ClientSession() as client:

            async def send(stream: bool) -> tuple[int, str, bytes]:
                async with client.post(url, json=body_of("x", stream=stream)) as answer:
                    return answer.status, answer.headers.get("Retry-After", ""), await answer.read()

            sends = [asyncio.create_task(send(i == 0)) for i in range(3)]
            while router.holding.held(("team", "llama")) < 3:
                await asyncio.sleep(0.02)
            stop.set()
            answers = await asyncio.gather(*sends)
        await server
        assert [(status, retry) for status, retry, _ in answers] == [(503, "1")] * 3
        assert b"stopping" in answers[1][2]
        exposition = router.metrics.exposition().decode()
        assert f"{refusals('stopping')} 3.0" in exposition

    run(body)


def test_a_client_that_goes_away_while_held_leaves_the_queue() -> None:
    async def body() -> None:
        async with zero_rig(at_zero()) as rig:
            quiet = asyncio.create_task(answer_of(rig, "no heartbeats", stream=False))
            answer = await rig.post(body_of("with heartbeats", stream=True))
            assert answer.status == 200  # the first heartbeat sent the headers
            assert await answer.content.readline() == b": waiting for team/llama to wake\n"
            await rig.held(2)
            answer.close()
            quiet.cancel()
            await rig.held(0)
            assert not rig.router.holding.holding(("team", "llama"))
            assert rig.waker.calls == [("team", "llama", "deployments")]

    run(body)


@dataclass
class StandInAgent:
    """An engine agent's readiness route: 503 until `ready`, counting the questions."""

    ready: bool = False
    asked: int = 0

    async def readyz(self, _request: web.Request) -> web.Response:
        self.asked += 1
        return web.Response(status=200 if self.ready else 503, text="ok" if self.ready else "no")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/readyz", self.readyz)
        return app


def starting_slice(engine: str, agent: str, ready: bool) -> dict[str, Any]:
    """The woken CR's EndpointSlice with one pod on this machine: its API and agent ports."""
    host, _, api_port = engine.rpartition(":")
    return {
        "metadata": {
            "name": "llama-abcde",
            "namespace": "team",
            "labels": {"kubernetes.io/service-name": "llama"},
        },
        "addressType": "IPv4",
        "ports": [
            {"name": "http", "port": int(api_port)},
            {"name": "probe", "port": int(agent.rpartition(":")[2])},
        ],
        "endpoints": [{"addresses": [host], "conditions": {"ready": ready, "terminating": False}}],
    }


def test_held_requests_go_to_a_starting_pod_once_its_agent_answers_the_router_ready() -> None:
    """The woken CR's pod is listed as starting (not ready in its EndpointSlice): the router asks
    its agent `/readyz` itself while requests wait, holds them while it answers 503, and sends
    them the moment it answers 200, with no slice event saying ready (the kubelet's next probe
    and the slice's update come later). A slice that then says ready changes nothing."""

    async def body() -> None:
        table = RouteTable()
        catalog = Catalog(table)
        cr = {
            "metadata": {
                "name": "llama",
                "namespace": "team",
                "creationTimestamp": "2026-12-06T00:00:00Z",
            },
            "spec": {"model": {"name": "org/model"}, "autoscaling": {"minReplicas": 0}},
            "status": {
                "conditions": [{"type": "Ready", "status": "True", "reason": "ScaledToZero"}]
            },
        }
        catalog.on_llmdeployment("SYNC", {"items": [cr]})
        catalog.on_endpoint_slice("SYNC", {"items": []})
        waker = Waker()
        router = Router(table, heartbeat=HEARTBEAT, waker=waker)
        router.holder.starting = catalog
        agent = StandInAgent()
        async with AsyncExitStack() as stack:
            url = await stack.enter_async_context(serving(router.app()))
            agent_address = await stack.enter_async_context(serving(agent.app()))
            (engine,) = await stack.enter_async_context(engines(CountingEngine("a", chunks=3)))
            client = await stack.enter_async_context(aiohttp.ClientSession())

            async def send(i: int) -> tuple[int, bytes]:
                payload = body_of(f"request {i}", stream=i % 2 == 0)
                async with client.post(f"http://{url}/v1/chat/completions", json=payload) as a:
                    return a.status, await a.read()

            sends = [asyncio.create_task(send(i)) for i in range(3)]
            for _ in range(200):
                if router.holding.held(("team", "llama")) == 3:
                    break
                await asyncio.sleep(0.02)
            assert waker.calls == [("team", "llama", "deployments")]
            # The pod is scheduled and starting: listed, not ready.
            catalog.on_endpoint_slice("ADDED", starting_slice(engine.address, agent_address, False))
            await asyncio.sleep(0.6)
            assert agent.asked >= 3, agent.asked  # asked about every START_PROBE_SECONDS
            assert router.holding.held(("team", "llama")) == 3
            assert engine.seen == []
            agent.ready = True
            answers = await asyncio.wait_for(asyncio.gather(*sends), 5)
            assert [status for status, _ in answers] == [200, 200, 200]
            assert engine.finished == 3
            assert table.backends["llama"].ring.endpoints == (engine.address,)
            asked = agent.asked
            catalog.on_endpoint_slice(
                "MODIFIED", starting_slice(engine.address, agent_address, True)
            )
            assert table.backends["llama"].ring.endpoints == (engine.address,)
            await asyncio.sleep(0.3)
            assert agent.asked == asked  # nothing held: nobody asks any more

    run(body)


@dataclass
class ManyStarting:
    """A CR with many starting pods whose agents refuse connections."""

    count: int
    confirmed: list[str] = field(default_factory=list)

    def starting_agents(self, service: tuple[str, str]) -> dict[str, str]:
        return {f"127.0.0.{i + 2}:8000": "127.0.0.1:9" for i in range(self.count)}

    def confirm_ready(self, service: tuple[str, str], endpoint: str) -> None:
        self.confirmed.append(endpoint)


def test_a_cr_with_many_starting_pods_has_a_bounded_number_asked() -> None:
    async def body() -> None:
        starting = ManyStarting(count=3 * MAX_START_PROBES)
        probes = StartProbes(("team", "llama"), starting)
        probes.follow(())
        assert len(probes.asking) == MAX_START_PROBES
        await asyncio.sleep(0.3)  # refused, asked again: never confirmed
        assert starting.confirmed == []
        probes.follow(("10.0.0.1:8000",))  # an endpoint is routable: nobody is asked
        assert probes.asking == frozenset()
        await probes.close()

    run(body)
