"""Priority across router pods, on real sockets: two gateway routers (`--replicas 2`) in front
of one simulator engine of 2 sequences (each router owns one slot), sharing a real
redis-server for their messages (`store.Bus`). What it proves: an interactive request waiting
on router A, whose one slot a long batch request holds, gets the slot router B frees first,
though B has a batch request of its own waiting (strict priority across the pods, not per
pod); B's waiting request gets the slot back once A's interactive one is done; every loan is
settled afterwards; and a router that leaves without a word has its borrowed slot taken back
within `SILENT_SECONDS`."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any, cast

import aiohttp
import pytest
import redis.asyncio as aioredis
from aiohttp.test_utils import TestServer

from llmop_engine.simulator.sim_config import SimConfig
from llmop_router.app import Router
from llmop_router.loans import BEAT_SECONDS, SILENT_SECONDS
from llmop_router.priorities import PriorityClass
from llmop_router.routes import RouteTable, Wake
from llmop_router.sharing import Refusal, Turn
from llmop_router.store import Bus, Redis
from router.test_fair_sharing import gateway_router, timed
from router.test_gateway import KEY, OTHER_KEY, Rig, synchronous
from support.migration_rig import replica
from support.redis import RedisServer

SIM = SimConfig(model="llama", max_num_seqs=2, load_seconds=0, decode_ms=50, decode_ms_per_seq=0.0)
"""50 ms a token: 40 tokens hold a slot 2 s, 8 tokens 0.4 s."""


@pytest.fixture
def redis_server() -> Any:
    with RedisServer() as server:
        yield server


@contextlib.asynccontextmanager
async def two_routers(url: str) -> AsyncIterator[tuple[Rig, Rig]]:
    """Routers A and B over one engine of 2 sequences, each owning one slot, lending through
    the store at `url`."""
    async with replica(SIM) as found, aiohttp.ClientSession() as http:
        rigs, sites, stores = [], [], []
        try:
            for _ in range(2):
                table = RouteTable()
                table.set("llama", "team", "llama", [found.address], Wake(concurrency=2))
                router, gateway = gateway_router(table)
                router.sharing.replicas = 2
                store = Redis(url, timeout=1.0)
                router.sharing.bus = Bus(store)
                site = TestServer(router.app(), host="127.0.0.1")
                await site.start_server()
                url_of = f"http://127.0.0.1:{site.port}"
                rigs.append(Rig(url_of, router, gateway, found.sim, http))
                sites.append(site)
                stores.append(store)
            await asyncio.sleep(0.3)  # both subscribed
            yield rigs[0], rigs[1]
        finally:
            for site in sites:
                await site.close()
            for store in stores:
                await store.close()


async def until(check: Any, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "not within the bound"
        await asyncio.sleep(0.02)


def test_a_waiting_interactive_request_gets_the_slot_another_router_frees_first(
    redis_server: RedisServer,
) -> None:
    synchronous(lambda: interactive_first(redis_server.url))()


async def interactive_first(url: str) -> None:
    async with two_routers(url) as (a, b):
        started = time.monotonic()
        long_batch = asyncio.create_task(timed(a, KEY, 40))  # A's slot for ~2 s
        short_batch = asyncio.create_task(timed(b, KEY, 8))  # B's slot for ~0.4 s
        await until(lambda: a.router.sharing.queues.running(("team", "llama")) == 1)
        await until(lambda: b.router.sharing.queues.running(("team", "llama")) == 1)
        b_waiting = asyncio.create_task(timed(b, KEY, 4))
        await until(lambda: b.router.sharing.queues.total == 1)
        chat = asyncio.create_task(timed(a, OTHER_KEY, 4))
        await until(lambda: a.router.sharing.queues.total == 1)
        done = await asyncio.gather(long_batch, short_batch, b_waiting, chat)
        assert [status for status, _, _ in done] == [200] * 4, done
        (_, long_end, _), _, (_, b_end, _), (_, chat_end, _) = done
        # B's slot freed at ~0.4 s went to A's interactive request (~0.2 s more), not to B's
        # own batch request, and long before A's own slot freed (~2 s).
        assert chat_end < b_end, "the interactive request before B's batch"
        assert chat_end - started < 1.6, f"waited for A's own slot: {chat_end - started:.2f} s"
        assert chat_end < long_end
        assert b.metric("llmop_gateway_slot_loans_total", kind="lend") == 1
        assert a.metric("llmop_gateway_slot_loans_total", kind="return") == 1
        await until(lambda: not a.router.sharing.loans.net(("team", "llama")))
        assert not b.router.sharing.loans.net(("team", "llama")), "every loan settled"


def test_a_router_that_leaves_without_a_word_gives_its_borrowed_slot_back(
    redis_server: RedisServer,
) -> None:
    synchronous(lambda: silent_borrower(redis_server.url))()


async def silent_borrower(url: str) -> None:
    async with two_routers(url) as (a, b):
        key = ("team", "llama")
        long_batch = asyncio.create_task(timed(a, KEY, 40))
        await until(lambda: a.router.sharing.queues.running(key) == 1)
        # B has nothing waiting: its free slot goes to A's waiting batch request.
        a_waiting = asyncio.create_task(timed(a, KEY, 30))
        await until(lambda: b.router.sharing.loans.net(key) == -1)
        assert b.router.sharing.slots(b.router.table.backends["llama"]) == 0
        # A stops talking (its tasks cancelled, no reset said) while it holds B's slot.
        for task in a.router.sharing._tasks:
            task.cancel()
        a.router.sharing.bus = None
        gone = time.monotonic()
        await until(
            lambda: b.router.sharing.slots(b.router.table.backends["llama"]) == 1,
            seconds=SILENT_SECONDS + 3 * BEAT_SECONDS,
        )
        assert time.monotonic() - gone >= SILENT_SECONDS - BEAT_SECONDS
        await asyncio.gather(long_batch, a_waiting)


class Recorder:
    """A bus that keeps what is published (the peers' side is played by the test)."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.waiting: list[asyncio.Future[Any]] = []
        """The test's own waiting requests (kept, so they are not collected)."""

    def publish(self, message: dict[str, Any], failed: Any) -> None:
        self.sent.append(message)


def sharing_with_bus() -> tuple[Any, Recorder]:
    """A router pod's sharing of `llama` (2 endpoints x 2 sequences, one pod of 2: 2 slots of
    its own), both slots busy and one request waiting, so a slot lent to it is used."""
    table = RouteTable()
    table.set("llama", "team", "llama", ["e1:8000", "e2:8000"], Wake(concurrency=2))
    router = Router(table)
    sharing = router.sharing
    sharing.replicas = 2
    bus = Recorder()
    sharing.bus = cast(Bus, bus)
    sharing._subscribed = True
    backend = table.backends["llama"]
    terms = PriorityClass(name="batch")
    for _ in range(3):
        turn = sharing.turn(
            backend, "llama", tenant="t", priority=terms, weight=1, cost=1.0, size=0
        )
        if not isinstance(turn, Turn | Refusal):
            bus.waiting.append(asyncio.ensure_future(turn))
    assert (sharing.slots(backend), sharing.queues.total) == (2, 1)
    return sharing, bus


LEND = {"kind": "lend", "from": "peer", "epoch": 0, "to_epoch": 0, "model": ["team", "llama"]}


def test_loans_addressed_to_an_old_epoch_or_malformed_are_ignored_and_unknown_models_returned() -> (
    None
):
    async def run() -> None:
        sharing, bus = sharing_with_bus()
        backend = sharing.table.backends["llama"]
        lend = {**LEND, "to": sharing.me}
        sharing._received({**lend, "endpoint": "e1:8000"})
        assert (sharing.slots(backend), sharing.queues.total) == (3, 0), "the waiting one went"
        # This pod may have missed messages: its loans are forgotten, a new epoch begins, and
        # a loan sent to the old one (before the peer heard of the new) is not counted.
        sharing._lost()
        assert (sharing.epoch, sharing.slots(backend)) == (1, 2)
        sharing._received({**lend, "endpoint": "e1:8000"})
        assert sharing.slots(backend) == 2
        for bad in (
            {**lend, "to_epoch": 1, "model": "team/llama", "endpoint": "e1:8000"},
            {**lend, "to_epoch": 1, "endpoint": "e" * 300},
            {**lend, "to_epoch": 1, "epoch": "0", "endpoint": "e1:8000"},
            {**lend, "to_epoch": 1, "from": sharing.me, "endpoint": "e1:8000"},
            {**lend, "to_epoch": 1, "to": "another pod", "endpoint": "e1:8000"},
        ):
            sharing._received(bad)
        assert sharing.slots(backend) == 2, "none of them counted"
        # A model this pod does not route: the slot goes straight back to its lender.
        bus.sent.clear()
        sharing._received({**lend, "to_epoch": 1, "model": ["team", "gone"], "endpoint": "e9"})
        assert [(m["kind"], m["to"], m["model"]) for m in bus.sent] == [
            ("return", "peer", ["team", "gone"])
        ]
        assert not sharing.loans.net(("team", "gone"))
        # A peer's new epoch forgets what this pod held of it, and a message from an epoch
        # it has left is not read.
        sharing._received({**lend, "to_epoch": 1, "endpoint": "e2:8000"})
        assert sharing.slots(backend) == 3
        sharing._received({"kind": "state", "from": "peer", "epoch": 1, "waiting": []})
        assert sharing.slots(backend) == 2
        sharing._received({**lend, "to_epoch": 1, "endpoint": "e2:8000"})
        assert sharing.slots(backend) == 2, "epoch 0 is over for that peer"
        sharing.close()

    asyncio.run(run())


def test_a_stopping_pod_tells_its_peers_to_take_back_what_it_borrowed() -> None:
    async def run() -> None:
        sharing, bus = sharing_with_bus()
        sharing._received({**LEND, "to": sharing.me, "endpoint": "e1:8000"})
        assert sharing.loans.busy()
        bus.sent.clear()
        sharing.stop()
        assert [(m["kind"], m["epoch"]) for m in bus.sent] == [("state", 1)]
        sharing.close()

    asyncio.run(run())


def test_a_dropped_subscription_forgets_every_loan_on_both_routers(
    redis_server: RedisServer,
) -> None:
    """Messages sent while a pod was not subscribed are lost: when the store drops the pods'
    subscriptions (`CLIENT KILL TYPE pubsub`; nothing else fails), each pod must notice the
    gap, where redis-py would subscribe again without a word, and start a new epoch,
    forgetting its loans, so that the two sides cannot disagree about a slot for good."""

    async def run() -> None:
        async with two_routers(redis_server.url) as (a, b):
            key = ("team", "llama")
            long_batch = asyncio.create_task(timed(a, KEY, 40))
            await until(lambda: a.router.sharing.queues.running(key) == 1)
            a_waiting = asyncio.create_task(timed(a, KEY, 30))
            await until(lambda: b.router.sharing.loans.net(key) == -1)
            admin: Any = aioredis.Redis.from_url(redis_server.url)
            try:
                assert await admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub") == 2
            finally:
                await admin.aclose()
            await until(lambda: a.router.sharing.epoch >= 1 and b.router.sharing.epoch >= 1)
            assert b.router.sharing.loans.net(key) == 0, "B forgot what it lent"
            assert a.router.sharing.loans.net(key) == 0, "A forgot what it borrowed"
            await asyncio.gather(long_batch, a_waiting)

    synchronous(run)()
