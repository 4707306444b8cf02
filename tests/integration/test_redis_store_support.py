"""The router gateway's store as tests and benches get it: Debian's redis-server started by
support.redis on loopback, reached with redis.asyncio (the router's client): PING, a Lua script
on the server's clock (`redis.call('TIME')`, as the limiter's scripts use it), and the outages
the gateway must survive: a stop, a crash, a stall, each followed by recovery on the same URL.

What it pins down for the gateway code: a script registered once keeps working after a restart
(the server forgets it; register_script reloads on NOSCRIPT); a restart loses every counter
(`--save ''`); a client made with one retry on ConnectionError carries its first command past a
restart on a pooled connection that died with the old server (redis-py's from_url default is no
retry: that first command fails and the next one reconnects); a stalled server is a timeout
after socket_timeout, a stopped one a ConnectionError at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from support.redis import RedisServer, require_redis_server

# The server's clock in ms, stored with a TTL, the way the limiter's scripts will use it
# (gateway.md §8.5): TIME inside a script is allowed since Redis 5 (effects replication).
NOW_MS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('SET', KEYS[1], now, 'PX', tonumber(ARGV[1]))
return {now, redis.call('PTTL', KEYS[1])}
"""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    with RedisServer(binary=require_redis_server(), log_dir=tmp_path) as s:
        yield s


def _client(url: str, socket_timeout: float) -> aioredis.Redis:
    # One retry, on ConnectionError only: a timeout may mean the script ran, and a charge must
    # not be applied twice.
    retry = Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,))
    return aioredis.Redis.from_url(url, retry=retry, socket_timeout=socket_timeout)


async def _now_ms(script: AsyncScript, key: str) -> tuple[int, int]:
    now, pttl = await script(keys=[key], args=[60_000])
    return int(now), int(pttl)


@pytest.mark.timeout(60)
def test_ping_server_clock_script_and_recovery_on_the_same_port(server: RedisServer) -> None:
    assert server.url == f"redis://127.0.0.1:{server.port}/0"
    assert server.port > 0
    asyncio.run(_scenario(server))
    assert server.starts == 3
    assert "Ready to accept connections" in server.log_tail(200)


async def _scenario(server: RedisServer) -> None:  # noqa: PLR0915
    port = server.port
    client = _client(server.url, socket_timeout=1.0)
    plain = aioredis.Redis.from_url(server.url)  # redis-py's defaults
    try:
        assert await client.ping() is True
        assert await plain.ping() is True
        script = client.register_script(NOW_MS)

        # The server's clock (same machine: our clock too), and it moves forward.
        first, pttl = await _now_ms(script, "llmop:test:now")
        assert abs(first - time.time() * 1000) < 1000
        assert 59_000 < pttl <= 60_000
        await asyncio.sleep(0.01)
        second, _ = await _now_ms(script, "llmop:test:now")  # EVALSHA: the script is cached
        assert second >= first + 10
        assert await client.incr("llmop:test:counter") == 1

        # Stopped: every command fails at once (no hang), with a ConnectionError.
        server.stop()
        assert not server.running
        t0 = time.monotonic()
        with pytest.raises(RedisConnectionError):
            await client.ping()
        assert time.monotonic() - t0 < 1.0

        # Back on the same port: the same client works again; the data and the script cache
        # are gone (no persistence), and the script is reloaded transparently.
        server.start()
        assert server.port == port
        assert await client.ping() is True
        assert await client.get("llmop:test:counter") is None
        third, _ = await _now_ms(script, "llmop:test:now")
        assert third >= second

        # Crashed and back while the pool holds a live-looking connection: with one retry on
        # ConnectionError the first command goes through on a new connection.
        assert await plain.ping() is True
        server.kill()
        server.start()
        assert server.port == port
        assert await client.incr("llmop:test:counter") == 1
        # Without a retry (from_url's default) the dead connection fails one command at most.
        try:
            await plain.ping()
        except RedisConnectionError:
            assert await plain.ping() is True

        # Stalled (SIGSTOP): a command times out after socket_timeout instead of failing fast.
        short = _client(server.url, socket_timeout=0.2)
        try:
            assert await short.ping() is True
            server.pause()
            t0 = time.monotonic()
            with pytest.raises(RedisTimeoutError):
                await short.ping()
            assert 0.15 < time.monotonic() - t0 < 1.0
            server.resume()
            assert await short.ping() is True
        finally:
            await short.aclose()
    finally:
        await client.aclose()
        await plain.aclose()
