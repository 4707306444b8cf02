"""The fair queue's slots measured at the engine, on real sockets: a gateway router whose plan
says the engine runs 4 requests at once, in front of a simulator that runs 2 (a KV-bound
engine, or one that takes requests past the router). The router reads the engine's own
`/metrics`; once the engine queues requests, the router sends no more than it can run, so
later requests wait in the router, where priority holds, and an interactive request goes
before a batch one that came first. The same load with the readings off puts the interactive
request behind the batch one in the engine's first-come-first-served queue (the control)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import aiohttp
from aiohttp.test_utils import TestServer

from llmop_engine.simulator.sim_config import SimConfig
from llmop_router.engine_load import STALE_SECONDS
from llmop_router.engine_readings import Readings
from llmop_router.routes import RouteTable, Wake
from router.test_fair_sharing import gateway_router, timed
from router.test_gateway import KEY, OTHER_KEY, Rig, synchronous
from router.test_slot_loans import until
from support.migration_rig import replica

SIM = SimConfig(model="llama", max_num_seqs=2, load_seconds=0, decode_ms=50, decode_ms_per_seq=0.0)
"""Runs 2 at once, 50 ms a token: 20 tokens hold a slot 1 s, 60 tokens 3 s."""
MODEL = ("team", "llama")


@contextlib.asynccontextmanager
async def rig(*, readings: bool) -> AsyncIterator[Rig]:
    async with replica(SIM) as found, aiohttp.ClientSession() as http:
        table = RouteTable()
        table.set("llama", "team", "llama", [found.address], Wake(concurrency=4))
        router, gateway = gateway_router(table)
        if readings:
            router.sharing.readings = Readings(0.1)
        site = TestServer(router.app(), host="127.0.0.1")
        await site.start_server()
        try:
            yield Rig(f"http://127.0.0.1:{site.port}", router, gateway, found.sim, http)
        finally:
            await site.close()


async def batch_then_interactive(r: Rig) -> tuple[float, float, float]:
    """Three batch requests (the engine runs two, one waits in it), a fourth batch one, then an
    interactive one: when the interactive one ended, when the third batch one ended (both
    after the start), and the slots the router had for the model when the fourth was sent."""
    started = time.monotonic()
    batch = []
    for count, tokens in enumerate((20, 40, 60), start=1):
        batch.append(asyncio.create_task(timed(r, KEY, tokens)))
        await until(lambda c=count: r.router.table.total_in_flight() == c)  # type: ignore[misc]
    backend = r.router.table.backends["llama"]
    if r.router.sharing.readings is not None:
        # Two readings with one request waiting in the engine: 2 of the plan's 4 slots.
        await until(lambda: r.router.sharing.slots(backend) == 2, seconds=2.0)
        assert r.metric("llmop_gateway_engine_slots_withheld") == 2
    slots = r.router.sharing.slots(backend)
    fourth = asyncio.create_task(timed(r, KEY, 60))
    if slots == 2:
        await until(lambda: r.router.sharing.queues.total == 1)  # held here
    else:
        await until(lambda: r.router.table.total_in_flight() == 4)  # into the engine's queue
    chat = asyncio.create_task(timed(r, OTHER_KEY, 4))
    await until(lambda: r.router.sharing.queues.total >= 1)
    done = await asyncio.gather(*batch, fourth, chat)
    assert [status for status, _, _ in done] == [200] * 5, done
    return done[4][1] - started, done[2][1] - started, slots


@synchronous
async def test_an_engine_that_queues_gets_fewer_requests_and_priority_holds_in_the_router() -> None:
    async with rig(readings=True) as r:
        chat_end, third_end, slots = await batch_then_interactive(r)
        assert slots == 2
        # The first batch request ends at ~1 s and the engine starts the one it queued; the
        # router sends the interactive request (not the fourth batch one, which came first)
        # and it runs when the second ends at ~2 s.
        assert chat_end < third_end, (chat_end, third_end)
        assert chat_end < 3.2, f"it waited behind a batch request: {chat_end:.2f} s"
        # Nothing in flight: the engine is no longer read, and the correction runs out.
        await until(lambda: not r.router.sharing.load.limits, seconds=STALE_SECONDS + 1.5)
        assert r.metric("llmop_gateway_engine_slots_withheld") == 0


@synchronous
async def test_without_the_readings_the_engine_queues_the_interactive_request_behind() -> None:
    async with rig(readings=False) as r:
        chat_end, third_end, slots = await batch_then_interactive(r)
        assert slots == 4
        # The fourth batch request went into the engine's queue before it: the interactive
        # one starts only when the third batch one ends (~4 s).
        assert chat_end > third_end, (chat_end, third_end)


@synchronous
async def test_the_share_suggested_for_batch_comes_from_the_interactive_load_in_flight() -> None:
    async with rig(readings=False) as r:
        chat = asyncio.create_task(timed(r, OTHER_KEY, 40))  # interactive, ~2 s in flight
        batch = asyncio.create_task(timed(r, KEY, 40))
        await until(lambda: r.router.table.total_in_flight() == 2)
        name = "llmop_gateway_suggested_max_share_percent"
        labels = {"llmdeployment": "team/llama", "priority_class": "standard"}
        await until(lambda: r.metric(name, **labels) > 0, seconds=3.0)
        # 4 slots, one interactive request in flight all along (a load of 1): 4 held back
        # would keep its wait under 5 % (Erlang C 2 %), so batch keeps its one slot: 25 %.
        assert r.metric(name, **labels) == 25
        assert r.metric(name, llmdeployment="team/llama", priority_class="interactive") == 0
        assert [s for s, _, _ in await asyncio.gather(chat, batch)] == [200, 200]
