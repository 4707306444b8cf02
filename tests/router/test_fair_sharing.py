"""Priority and fair sharing in the router's request path, on real sockets: the simulator engine
behind a real router with the gateway on, the model's slots cut to one (`status.plan
.maxNumSeqs` 1) so it saturates at once, and three `LLMPriorityClass`es. What it proves: a
higher class's request overtakes the lower one's already waiting; a request cannot move to a
higher class with `X-Llmop-Priority-Class` but can move to a lower one, down to sheddable; a
sheddable request is answered 429 with Retry-After while the model is saturated and never
reaches the engine; a wait past its class's bound is a 429; a header naming no class, or a
higher one, is a 400; the queue's metrics count it all; and 20 requests of two tenants held
for a model at zero are answered, once it wakes, interactive ones first."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from llmop_engine.simulator.sim_config import SimConfig
from llmop_router.app import Router
from llmop_router.gateway import Gateway
from llmop_router.limits import DEFAULT as DEFAULT_LIMITS
from llmop_router.limits import Limits
from llmop_router.metrics import GatewayMetrics
from llmop_router.priorities import parse_priority_class
from llmop_router.routes import RouteTable, Wake
from llmop_router.store import Local
from llmop_router.tenants import parse_tenant
from router.test_gateway import KEY, OTHER_KEY, Rig, synchronous, tenant
from support.migration_rig import Replica, replica

SCRAPER_KEY = "llmop_test-key-of-scraper-0123456789abcdef"
SIM = SimConfig(model="llama", max_num_seqs=8, load_seconds=0, decode_ms=10, decode_ms_per_seq=0.0)
TENANTS = (
    tenant("batch", KEY),  # no class named: the global default, "standard"
    tenant("chat", OTHER_KEY, priorityClassName="interactive"),
    tenant("scraper", SCRAPER_KEY, priorityClassName="best-effort"),
)


def priority_class(name: str, **spec: Any) -> dict[str, Any]:
    return {"kind": "LLMPriorityClass", "metadata": {"name": name}, "spec": spec}


CLASSES = (
    priority_class("interactive", value=100, queue={"maxWaitSeconds": 5}),
    priority_class("standard", value=0, globalDefault=True),
    priority_class("best-effort", value=-100, sheddable=True),
)


def gateway_router(table: RouteTable, limits: Limits = DEFAULT_LIMITS) -> tuple[Router, Gateway]:
    """A ready router over `table` with the gateway on: the tenants and classes above, counted
    alone (no store)."""
    router = Router(table, limits=limits)
    router.ready = True
    gateway = Gateway(Local(), GatewayMetrics(router.metrics.registry))
    gateway.set_tenants([parse_tenant(t) for t in TENANTS])
    gateway.set_classes([parse_priority_class(c) for c in CLASSES])
    router.gateway = gateway
    return router, gateway


@contextlib.asynccontextmanager
async def served(table: RouteTable, sim: Replica, limits: Limits) -> AsyncIterator[Rig]:
    """A gateway router over `table`, with the tenants and classes above."""
    router, gateway = gateway_router(table, limits)
    site = TestServer(router.app(), host="127.0.0.1")
    await site.start_server()
    try:
        async with aiohttp.ClientSession() as http:
            yield Rig(f"http://127.0.0.1:{site.port}", router, gateway, sim.sim, http)
    finally:
        await site.close()


@contextlib.asynccontextmanager
async def rig(limits: Limits = DEFAULT_LIMITS) -> AsyncIterator[Rig]:
    async with replica(SIM) as found:
        table = RouteTable()
        table.set("llama", "team", "llama", [found.address], Wake(concurrency=1))
        async with served(table, found, limits) as r:
            yield r


def completion(max_tokens: int) -> dict[str, Any]:
    return {"model": "llama", "prompt": "hello there", "max_tokens": max_tokens}


async def timed(r: Rig, key: str, max_tokens: int, **headers: str) -> tuple[int, float, str]:
    """Status, when the answer ended (monotonic), and its text."""
    sent = {"Authorization": f"Bearer {key}", **headers}
    async with r.http.post(
        r.url + "/v1/completions", json=completion(max_tokens), headers=sent
    ) as a:
        text = await a.text()
        return a.status, time.monotonic(), text


async def waiting(r: Rig, count: int) -> None:
    for _ in range(200):
        if r.router.sharing.queues.total == count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{r.router.sharing.queues.total} waiting, not {count}")


@synchronous
async def test_a_higher_priority_overtakes_what_waits_and_a_header_cannot_raise_one() -> None:
    async with rig() as r:
        first = asyncio.create_task(timed(r, KEY, 40))  # the one slot, ~0.4 s
        await waiting(r, 0)
        await asyncio.sleep(0.05)
        # Batch may not move up to "interactive": refused, and its others wait.
        up = await timed(r, KEY, 5, **{"X-Llmop-Priority-Class": "interactive"})
        assert up[0] == 400
        assert "may only lower its priority" in up[2]
        batch = [asyncio.create_task(timed(r, KEY, 5, **{"X-Llmop-Priority-Class": "standard"}))]
        await waiting(r, 1)
        batch += [asyncio.create_task(timed(r, KEY, 5)) for _ in range(2)]
        await waiting(r, 3)
        chat = asyncio.create_task(timed(r, OTHER_KEY, 5))
        await waiting(r, 4)
        done = await asyncio.gather(first, *batch, chat)
        assert [status for status, _, _ in done] == [200] * 5, done
        chat_end = done[-1][1]
        assert all(chat_end < end for _, end, _ in done[1:-1]), "chat before the batch waiting"
        assert r.metric("llmop_gateway_queue_total", outcome="dispatched") == 5
        assert r.metric("llmop_gateway_queue_wait_seconds_count") == 5
        assert r.router.sharing.queues.models == {}, "an idle model is forgotten"


@synchronous
async def test_sheddable_requests_are_refused_while_saturated_never_reaching_the_engine() -> None:
    async with rig() as r:
        status, _, _ = await timed(r, SCRAPER_KEY, 2)
        assert status == 200, "a free slot serves even a sheddable tenant"
        busy = asyncio.create_task(timed(r, KEY, 40))
        await asyncio.sleep(0.1)
        requests = r.sim.stats["requests"]
        status, headers, text = await r.post(completion(2), key=SCRAPER_KEY)
        assert status == 429, text
        assert headers["Retry-After"] == "1"
        assert "sheddable LLMPriorityClass 'best-effort'" in json.loads(text)["error"]["message"]
        # Chat moves its own request down to the sheddable class: shed the same way.
        lowered = {"Authorization": f"Bearer {OTHER_KEY}", "X-Llmop-Priority-Class": "best-effort"}
        async with r.http.post(r.url + "/v1/completions", json=completion(2), headers=lowered) as a:
            assert a.status == 429
        assert r.sim.stats["requests"] == requests
        assert (await busy)[0] == 200
        assert r.metric("llmop_gateway_queue_total", outcome="shed") == 2
        assert (
            r.metric("llmop_gateway_requests_total", tenant="scraper", model="llama", code="429")
            == 1
        )


@synchronous
async def test_a_wait_past_its_bound_is_a_429_and_a_bad_header_a_400() -> None:
    async with rig(Limits(queue_wait_seconds=0.2)) as r:
        busy = asyncio.create_task(timed(r, KEY, 60))
        await asyncio.sleep(0.1)
        status, headers, text = await r.post(completion(2), key=KEY)
        assert status == 429, text
        assert headers["Retry-After"] == "1"
        assert "--queue-wait-seconds 0.2" in json.loads(text)["error"]["message"]
        assert r.metric("llmop_gateway_queue_total", outcome="timeout") == 1
        assert (await busy)[0] == 200
        bad = {"Authorization": f"Bearer {KEY}", "X-Llmop-Priority-Class": "urgent"}
        async with r.http.post(r.url + "/v1/completions", json=completion(2), headers=bad) as a:
            assert a.status == 400
            assert "no LLMPriorityClass is named 'urgent'" in (await a.text())
        assert r.router.sharing.queues.total == 0


@synchronous
async def test_a_wake_answers_what_was_held_in_class_order() -> None:
    async with replica(SIM) as found:
        table = RouteTable()
        table.set("llama", "team", "llama", [], Wake(scaled_to_zero=True, concurrency=1))
        async with served(table, found, DEFAULT_LIMITS) as r:

            async def held(count: int) -> None:
                for _ in range(200):
                    if r.router.holding.held(("team", "llama")) == count:
                        return
                    await asyncio.sleep(0.01)
                raise AssertionError(f"not {count} held")

            batch = [asyncio.create_task(timed(r, KEY, 3)) for _ in range(10)]
            await held(10)
            chat = [asyncio.create_task(timed(r, OTHER_KEY, 3)) for _ in range(10)]
            await held(20)
            table.set("llama", "team", "llama", [found.address])  # the replica is ready
            chat_done = await asyncio.gather(*chat)
            batch_done = await asyncio.gather(*batch)
    assert [s for s, _, _ in chat_done + batch_done] == [200] * 20
    assert max(end for _, end, _ in chat_done) < min(end for _, end, _ in batch_done)


def test_a_turn_goes_to_a_pod_with_a_free_slot_of_this_routers_share() -> None:
    table = RouteTable()
    table.set("llama", "team", "llama", ["10.0.0.1:8000", "10.0.0.2:8000"], Wake(concurrency=4))
    router = Router(table)
    router.sharing.replicas = 2  # each router pod: 2 of each engine's 4 slots
    choice = table.choose("llama", None)
    assert choice is not None
    first, second = choice.pick.order
    table.in_flight[first] = 2
    assert router.sharing.free_first(choice).pick.order == (second, first)
    table.in_flight[first] = 1
    assert router.sharing.free_first(choice) is choice, "a free slot where the ring chose"


async def streamed(r: Rig, max_tokens: int, *, stop_after: float | None = None) -> str:
    """A streaming request's raw answer (SSE comments included); with `stop_after`, the client
    goes away after that many seconds."""
    body = {**completion(max_tokens), "stream": True}
    sent = {"Authorization": f"Bearer {KEY}"}
    async with r.http.post(r.url + "/v1/completions", json=body, headers=sent) as answer:
        assert answer.status == 200
        if stop_after is None:
            return await answer.text()
        await asyncio.sleep(stop_after)
        return ""


@synchronous
async def test_a_stream_waiting_for_a_slot_gets_heartbeats_and_its_answer_in_them() -> None:
    """A streaming request queued for a saturated model gets its 200 headers and an SSE comment
    every heartbeat (proxies cut idle streams), then the answer; one whose wait runs out gets
    the queue's 429 as an error event; one whose client leaves frees its place; a
    non-streaming one waits silently."""
    async with rig(Limits(queue_wait_seconds=1.5)) as r:
        r.router.holder.heartbeat = 0.1
        first = asyncio.create_task(timed(r, KEY, 40))  # the one slot, ~0.4 s
        await waiting(r, 0)
        await asyncio.sleep(0.05)
        quiet = asyncio.create_task(timed(r, KEY, 3))
        await waiting(r, 1)
        text = await streamed(r, 3)
        assert text.startswith(": waiting for a slot\n\n"), text[:200]
        assert text.count(": waiting for a slot") >= 2
        assert "data: [DONE]" in text
        assert '"finish_reason":"length"' in text
        status, _, plain = await quiet
        assert status == 200
        assert ": waiting" not in plain
        assert (await first)[0] == 200

        # Its wait runs out: the 429 comes as one error event in the stream already open.
        hold = asyncio.create_task(timed(r, KEY, 300))  # ~3 s on the one slot
        await waiting(r, 0)
        await asyncio.sleep(0.05)
        expired = await streamed(r, 3)
        assert expired.count(": waiting for a slot") >= 5
        assert "event: error" in expired
        assert "rate_limit_exceeded" in expired or "429" in expired
        assert "data: [DONE]" not in expired

        # A client that leaves while it waits leaves the queue.
        await streamed(r, 3, stop_after=0.35)
        await waiting(r, 0)
        assert (await hold)[0] == 200
        after = await streamed(r, 3)
        assert "data: [DONE]" in after
        assert r.router.sharing.queues.total == 0
