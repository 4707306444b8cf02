"""The gateway's own connection to the store (`store.Pipe`, `resp`): replies parsed however the
bytes arrive, a store that stops answering or drops the connection fails the waiting calls at
once or within the bound (never a request hung on it), the next call connects again, and the
URL's user, password and database are honoured by a real redis-server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import pytest
import redis.asyncio as aioredis
import uvloop

from llmop_router.quota import Estimate, admission
from llmop_router.resp import Parser, ProtocolError, ReplyError, pack
from llmop_router.store import Pipe, Redis, StoreAddress, tenant_key
from llmop_router.tenants import parse_tenant
from router.test_gateway import KEY, tenant
from support.redis import RedisServer

REPLIES = (
    b"+OK\r\n:42\r\n$5\r\nhello\r\n$-1\r\n$0\r\n\r\n"
    b"*2\r\n$1\r\na\r\n*1\r\n:-7\r\n-NOSCRIPT No matching script\r\n"
)
PARSED = ["OK", 42, "hello", None, "", ["a", [-7]]]


def test_replies_parse_the_same_however_the_bytes_arrive() -> None:
    whole = Parser().feed(REPLIES)
    parser = Parser()
    trickled: list[Any] = []
    for byte in REPLIES:
        trickled += parser.feed(bytes([byte]))
    for replies in (whole, trickled):
        assert replies[:-1] == PARSED
        assert isinstance(replies[-1], ReplyError)
        assert replies[-1].no_script


def test_packed_commands_are_what_redis_reads() -> None:
    """A command is an array of bulk strings: parsed back, it is its arguments as text."""
    assert Parser().feed(pack([("EVALSHA", "ab", 2, "k1", "k2"), ("PING",)])) == [
        ["EVALSHA", "ab", "2", "k1", "k2"],
        ["PING"],
    ]


def test_bytes_that_are_not_resp_are_refused() -> None:
    with pytest.raises(ProtocolError, match="starting with"):
        Parser().feed(b"HTTP/1.1 200 OK\r\n")
    with pytest.raises(ProtocolError, match="bulk reply"):
        Parser().feed(b"$999999999999\r\n")


@pytest.mark.parametrize(
    ("url", "password", "expected"),
    [
        ("redis://store:6380/2", None, StoreAddress("store", 6380, db=2)),
        ("redis://store", None, StoreAddress("store")),
        (
            "rediss://u:p%40ss@store/1",
            None,
            StoreAddress("store", tls=True, db=1, username="u", password="p@ss"),
        ),
        ("redis://:inurl@store/0", "fromfile", StoreAddress("store", password="fromfile")),
        ("unix:///run/redis.sock?db=4", None, StoreAddress(path="/run/redis.sock", db=4)),
    ],
)
def test_store_urls(url: str, password: str | None, expected: StoreAddress) -> None:
    assert StoreAddress.of(url, password) == expected


def test_a_store_url_of_another_scheme_is_refused_with_the_forms() -> None:
    with pytest.raises(ValueError, match=r"redis://host:port/db"):
        StoreAddress.of("http://store:6379")


Runner = Callable[[Callable[[], Coroutine[Any, Any, None]]], None]


@pytest.fixture(params=["asyncio", "uvloop"])
def on_loop(request: pytest.FixtureRequest) -> Runner:
    """Run a test's coroutine on asyncio's loop and on uvloop's (the router's): their
    transports and clocks differ."""

    def run(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
        if request.param == "uvloop":
            uvloop.run(main())
        else:
            asyncio.run(main())

    return run


@asynccontextmanager
async def fake_store(
    answer: Callable[[int, asyncio.StreamReader, asyncio.StreamWriter], Any],
) -> AsyncIterator[tuple[StoreAddress, list[int]]]:
    """A TCP server on loopback; `answer(n, reader, writer)` serves its n-th connection."""
    seen: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(len(seen))
        try:
            await answer(seen[-1], reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield StoreAddress("127.0.0.1", port), seen
    finally:
        server.close()


async def pong_each_ping(
    _n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    parser = Parser()
    while data := await reader.read(4096):
        writer.write(b"+PONG\r\n" * len(parser.feed(data)))
        await writer.drain()


def test_a_store_that_stops_answering_fails_the_batch_within_the_bound_then_is_left(
    on_loop: Runner,
) -> None:
    """The first connection reads and never answers: every waiting call fails at the bound, the
    connection is dropped, and the next call is answered on a new one."""

    async def answer(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if n == 0:
            while await reader.read(4096):
                pass  # silence
            return
        await pong_each_ping(n, reader, writer)

    async def run() -> None:
        async with fake_store(answer) as (address, seen):
            pipe = Pipe(address, timeout=0.2)
            began = time.monotonic()
            calls = [pipe.call("PING") for _ in range(3)]
            results = await asyncio.gather(*calls, return_exceptions=True)
            assert all(isinstance(r, TimeoutError) for r in results), results
            # uvloop's clock has millisecond steps, read at the start of a loop iteration
            assert 0.19 <= time.monotonic() - began < 1.0
            assert await asyncio.wait_for(pipe.call("PING"), 2) == "PONG"
            assert len(seen) == 2
            await pipe.close()

    on_loop(run)


def test_a_connection_dropped_mid_batch_fails_its_calls_at_once(on_loop: Runner) -> None:
    async def answer(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if n == 0:
            await reader.read(4096)
            writer.write(b"+PONG\r\n")  # one of two answered, then gone
            await writer.drain()
            return
        await pong_each_ping(n, reader, writer)

    async def run() -> None:
        async with fake_store(answer) as (address, _seen):
            pipe = Pipe(address, timeout=30)
            first, second = pipe.call("PING"), pipe.call("PING")
            results = await asyncio.wait_for(
                asyncio.gather(first, second, return_exceptions=True), 5
            )
            assert results[0] == "PONG"
            assert isinstance(results[1], ConnectionError)
            assert await asyncio.wait_for(pipe.call("PING"), 2) == "PONG"
            await pipe.close()

    on_loop(run)


def test_a_store_that_refuses_the_connection_fails_the_call_at_once(on_loop: Runner) -> None:
    async def run() -> None:
        async with fake_store(pong_each_ping) as (address, _seen):
            pass  # closed: nothing listens on its port any more
        pipe = Pipe(address, timeout=30)
        with pytest.raises(ConnectionRefusedError):
            await asyncio.wait_for(pipe.call("PING"), 5)
        await pipe.close()

    on_loop(run)


def test_the_urls_user_password_and_database_are_used(on_loop: Runner) -> None:
    """An ACL user (`--store redis://alice:…@host/3`): admissions run as that user in database
    3; a wrong password is refused by the server, and the call says so."""
    acl = ["--user", "alice", "on", ">s3cret", "~*", "&*", "+@all"]

    async def run(port: int) -> None:
        store = Redis(f"redis://alice:s3cret@127.0.0.1:{port}/3", timeout=2.0)
        peek = aioredis.Redis(host="127.0.0.1", port=port, db=3, decode_responses=True)
        default = aioredis.Redis(host="127.0.0.1", port=port, db=0, decode_responses=True)
        try:
            tenant_ = parse_tenant(tenant("a", KEY, limits={"maxConcurrentRequests": 2}))
            ask = admission(tenant_, "llama", "r1", Estimate(3, 4), "2026-12")
            assert (await store.admit(ask)).admitted
            assert await peek.zcard(tenant_key("a", "lease")) == 1
            assert await default.zcard(tenant_key("a", "lease")) == 0
        finally:
            await store.close()
            await peek.aclose()
            await default.aclose()
        wrong = Redis(f"redis://alice:nope@127.0.0.1:{port}/3", timeout=2.0)
        try:
            with pytest.raises(ReplyError, match="WRONGPASS"):
                await wrong.admit(ask)
        finally:
            await wrong.close()

    with RedisServer(args=acl) as server:
        on_loop(lambda: run(server.port))
