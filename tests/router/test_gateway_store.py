"""The gateway's limits held across two router replicas by a real redis-server: a tenant's
limit is its limit, not twice it; a concurrency cap holds across replicas and its leases come
back; a store outage costs no client a 5xx in fail-open mode (each replica admits its share),
loses no usage (it is added to the store when it returns), and is a 503 in fail-closed mode."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from llmop_router.app import Router
from llmop_router.gateway import Gateway, store_health
from llmop_router.metrics import GatewayMetrics
from llmop_router.quota import Estimate, Usage, admission
from llmop_router.routes import RouteTable
from llmop_router.store import Guarded, Redis, tenant_key
from llmop_router.tenants import parse_tenant
from router.test_gateway import KEY, OTHER_KEY, completion, settled, simulator, synchronous, tenant
from support.redis import RedisServer


@pytest.fixture
def redis_server() -> Any:
    with RedisServer() as server:
        yield server


@contextlib.asynccontextmanager
async def replicas(
    url: str, *tenants: dict[str, Any], fail_open: bool = True
) -> AsyncIterator[tuple[list[str], list[Router]]]:
    """Two routers over one simulator, sharing the store at `url`."""
    async with simulator() as (_sim, address), contextlib.AsyncExitStack() as stack:
        urls, routers = [], []
        for _ in range(2):
            table = RouteTable()
            table.set("llama", "team", "llama", [address])
            router = Router(table)
            router.ready = True
            metrics = GatewayMetrics(router.metrics.registry)
            store = Guarded(
                Redis(url, timeout=0.2),
                fail_open=fail_open,
                replicas=2,
                timeout=0.2,
                health=store_health(metrics),
            )
            router.gateway = Gateway(store, metrics)
            router.gateway.set_tenants([parse_tenant(t) for t in tenants])
            site = TestServer(router.app(), host="127.0.0.1")
            await site.start_server()
            stack.push_async_callback(site.close)
            urls.append(f"http://127.0.0.1:{site.port}")
            routers.append(router)
        yield urls, routers


async def leases_held(router: Router, count: int, within: float = 10.0) -> None:
    """Wait until the store holds `count` leases of tenant a (a fixed sleep raced a busy CI)."""
    assert router.gateway is not None
    assert isinstance(router.gateway.store, Guarded)
    client = router.gateway.store.shared.client
    deadline = time.monotonic() + within
    while await client.zcard(tenant_key("a", "lease")) < count:
        assert time.monotonic() < deadline, f"{count} leases not held within {within} s"
        await asyncio.sleep(0.01)


async def post(http: aiohttp.ClientSession, url: str, body: dict[str, Any], key: str = KEY) -> int:
    headers = {"Authorization": f"Bearer {key}"}
    async with http.post(url + "/v1/completions", json=body, headers=headers) as answer:
        await answer.read()
        return answer.status


def test_a_request_limit_is_shared_by_both_replicas(redis_server: RedisServer) -> None:
    @synchronous
    async def run() -> None:
        limits = {"requestsPerMinute": 60, "burstSeconds": 3}
        async with (
            replicas(redis_server.url, tenant("a", KEY, limits=limits)) as (urls, _),
            aiohttp.ClientSession() as http,
        ):
            codes = [await post(http, urls[i % 2], completion(1)) for i in range(8)]
        assert codes == [200, 200, 200] + [429] * 5, "3 s of burst at 1/s, on either replica"

    run()


def test_what_is_left_of_a_limit_is_the_tenants_across_replicas(redis_server: RedisServer) -> None:
    """The `x-ratelimit-remaining-*` of admitted answers count down across both replicas."""

    @synchronous
    async def run() -> None:
        limits = {"requestsPerMinute": 60, "burstSeconds": 3}
        headers = {"Authorization": f"Bearer {KEY}"}
        async with (
            replicas(redis_server.url, tenant("a", KEY, limits=limits)) as (urls, _),
            aiohttp.ClientSession() as http,
        ):
            left = []
            for i in range(3):
                async with http.post(
                    urls[i % 2] + "/v1/completions", json=completion(1), headers=headers
                ) as answer:
                    await answer.read()
                    assert answer.headers["x-ratelimit-limit-requests"] == "60"
                    left.append(answer.headers["x-ratelimit-remaining-requests"])
        assert left == ["2", "1", "0"]

    run()


def test_a_concurrency_cap_holds_across_replicas_and_leases_return(
    redis_server: RedisServer,
) -> None:
    @synchronous
    async def run() -> None:
        limits = {"maxConcurrentRequests": 2}
        async with (
            replicas(redis_server.url, tenant("a", KEY, limits=limits)) as (urls, routers),
            aiohttp.ClientSession() as http,
        ):
            long = completion(150)
            first = [asyncio.create_task(post(http, urls[i % 2], long)) for i in range(2)]
            await leases_held(routers[0], 2)
            refused = [await post(http, url, completion(1)) for url in urls]
            assert refused == [429, 429]
            assert await asyncio.gather(*first) == [200, 200]
            for router in routers:
                assert router.gateway is not None
                await settled(router.gateway)
            assert await post(http, urls[0], completion(1)) == 200
            store = routers[0].gateway.store  # type: ignore[union-attr]
            assert isinstance(store, Guarded)
            await settled(routers[0].gateway)  # type: ignore[arg-type]
            assert await store.shared.client.zcard(tenant_key("a", "lease")) == 0

    run()


def test_a_store_outage_fails_open_and_loses_no_usage(redis_server: RedisServer) -> None:
    @synchronous
    async def run() -> None:
        limits = {"maxConcurrentRequests": 100}
        async with (
            replicas(redis_server.url, tenant("a", KEY, limits=limits)) as (urls, routers),
            aiohttp.ClientSession() as http,
        ):
            assert await post(http, urls[0], completion(3)) == 200
            await settled(routers[0].gateway)  # type: ignore[arg-type]
            redis_server.stop()
            during = [await post(http, urls[i % 2], completion(3)) for i in range(6)]
            assert during == [200] * 6
            gateways = [r.gateway for r in routers]
            assert all(g is not None for g in gateways)
            for gateway in gateways:
                assert gateway is not None
                degraded = gateway.metrics.store_degraded._value.get()
                assert degraded == 1
            redis_server.start()
            for gateway in gateways:
                assert gateway is not None
                assert isinstance(gateway.store, Guarded)
                gateway.store.open_until = 0  # the next call tries the store again
            assert await post(http, urls[0], completion(3)) == 200
            assert await post(http, urls[1], completion(3)) == 200
            for gateway in gateways:
                assert gateway is not None
                await settled(gateway)
            await asyncio.sleep(0.2)  # the flush follows the first call that succeeds
            store = gateways[0].store  # type: ignore[union-attr]
            assert isinstance(store, Guarded)
            month = time.strftime("%Y-%m", time.gmtime())
            usage = await store.shared.usage("a", month)
            # 9 requests of 3 tokens each; the one before the outage was settled in the store,
            # which restarted empty (no persistence): the 8 since are all there, the 6 of the
            # outage added when it came back.
            assert usage["llama:out"] == 8 * 3

    run()


def test_a_store_outage_fails_closed_when_told(redis_server: RedisServer) -> None:
    """Fail closed: a tenant with limits is refused 503 while the store is down. A tenant
    without limits has nothing to exceed and asks the store nothing before its request goes:
    it is served, and its usage reaches the store once the store answers again."""

    @synchronous
    async def run() -> None:
        limited = tenant("a", KEY, limits={"requestsPerMinute": 1000})
        async with (
            replicas(redis_server.url, limited, tenant("b", OTHER_KEY), fail_open=False) as (
                urls,
                routers,
            ),
            aiohttp.ClientSession() as http,
        ):
            assert await post(http, urls[0], completion(1)) == 200
            redis_server.stop()
            assert await post(http, urls[0], completion(1)) == 503
            assert await post(http, urls[0], completion(2), key=OTHER_KEY) == 200
            redis_server.start()
            assert await post(http, urls[0], completion(1)) == 200  # the store answers again
            gateway = routers[0].gateway
            assert gateway is not None
            month = time.strftime("%Y-%m", time.gmtime())
            deadline = time.monotonic() + 10
            while (await gateway.store.usage("b", month)).get("llama:out") != 2:
                assert time.monotonic() < deadline, "the unlimited tenant's usage never arrived"
                await asyncio.sleep(0.05)

    run()


def test_a_settlement_counts_once_however_often_it_is_sent(redis_server: RedisServer) -> None:
    """A settlement that timed out on the router's side may still run when the store resumes,
    and the router sends it again: the store counts it once."""

    async def run() -> None:
        store = Redis(redis_server.url, timeout=1.0)
        try:
            tenant_ = parse_tenant(tenant("a", KEY, limits={"maxConcurrentRequests": 2}))
            ask = admission(tenant_, "llama", "r1", Estimate(3, 4), "2026-12")
            assert (await store.admit(ask)).admitted
            for _ in range(3):
                await store.settle(ask, Usage(3, 4), 7, charged=True)
            assert await store.usage("a", "2026-12") == {
                "llama:in": 3,
                "llama:out": 4,
                "llama:picos": 7,
                "total:picos": 7,
            }
            assert await store.client.zcard(tenant_key("a", "lease")) == 0
        finally:
            await store.close()

    asyncio.run(run())


def test_admissions_share_round_trips_and_survive_a_flushed_script_cache(
    redis_server: RedisServer,
) -> None:
    """50 admissions asked for at once go to Redis in one batch (one write, one read), not 50
    round trips; a store that forgot the scripts (a restart, SCRIPT FLUSH) still runs them."""

    async def run() -> None:
        store = Redis(redis_server.url, timeout=1.0)
        sent: list[int] = []
        send = store.pipe._send

        def counting(connection: Any, batch: Any) -> None:
            sent.append(len(batch))
            send(connection, batch)

        store.pipe._send = counting  # type: ignore[method-assign]
        try:
            tenant_ = parse_tenant(tenant("a", KEY, limits={"requestsPerMinute": 1000}))
            asks = [
                admission(tenant_, "llama", f"r{i}", Estimate(3, 4), "2026-12") for i in range(50)
            ]
            decisions = await asyncio.gather(*(store.admit(a) for a in asks))
            assert all(d.admitted for d in decisions)
            assert sent == [50]
            await store.client.script_flush()
            assert (await store.admit(asks[0])).admitted
        finally:
            await store.close()

    asyncio.run(run())


def test_an_admission_nobody_waits_for_gives_its_lease_back(redis_server: RedisServer) -> None:
    """A client that goes away while its admission is at the store (or a call that timed out
    while the script ran) must not hold one of the tenant's concurrent slots until the lease
    expires: the admission's answer, when it comes, releases the lease."""

    async def run() -> None:
        store = Redis(redis_server.url, timeout=1.0)
        answers: list[str] = []
        release = store._release

        def recording(ask: Any) -> Any:
            def answered(answer: str) -> None:
                answers.append(answer)
                release(ask)(answer)

            return answered

        store._release = recording  # type: ignore[method-assign]
        try:
            tenant_ = parse_tenant(tenant("a", KEY, limits={"maxConcurrentRequests": 1}))
            ask = admission(tenant_, "llama", "gone", Estimate(3, 4), "2026-12")
            waiting = asyncio.ensure_future(store.admit(ask))
            await asyncio.sleep(0)  # queued for the next batch
            waiting.cancel()
            deadline = time.monotonic() + 5
            while not answers:
                assert time.monotonic() < deadline, "the admission never reached the store"
                await asyncio.sleep(0.001)
            assert answers == ["ok"], "admitted: it took the lease"
            while await store.client.zcard(tenant_key("a", "lease")) != 0:
                assert time.monotonic() < deadline, "the abandoned admission kept its lease"
                await asyncio.sleep(0.005)
            again = admission(tenant_, "llama", "next", Estimate(3, 4), "2026-12")
            assert (await store.admit(again)).admitted
        finally:
            await store.close()

    asyncio.run(run())
