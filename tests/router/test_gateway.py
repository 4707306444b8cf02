"""The gateway in the router's request path, on real sockets: the simulator engine behind a
real router, a real client. What it proves: a request without a valid key (none, wrong,
expired, disabled) is answered 401 before its body is read and never reaches the engine; a
model outside the tenant's list is a 404 like a model that does not exist, and `/v1/models`
lists only what the tenant may use; a request limit answers 429 with an exact Retry-After and
the request refused consumes nothing; usage is asked of every stream and the usage event is
removed again when the client did not ask for it; the metered tokens equal the usage the
client saw, and the cost follows the price; the client's key never reaches the engine; a
tenant in Shadow mode is counted, never refused."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmop_engine.simulator.server import SimServer
from llmop_engine.simulator.sim_config import SimConfig
from llmop_router.app import Router
from llmop_router.contract import api_key_hash
from llmop_router.gateway import Gateway, GpuHourPrice
from llmop_router.gpu_price import GpuTime, plan_facts
from llmop_router.metrics import GatewayMetrics
from llmop_router.quota import Usage
from llmop_router.routes import RouteTable
from llmop_router.store import Local
from llmop_router.tenants import parse_tenant
from support.migration_rig import replica

KEY = "llmop_test-key-of-team-a-0123456789abcdef"
OTHER_KEY = "llmop_test-key-of-team-b-0123456789abcdef"
SIM = SimConfig(model="llama", max_num_seqs=8, load_seconds=0, decode_ms=2, decode_ms_per_seq=0.0)


def synchronous(test: Callable[[], Awaitable[None]]) -> Callable[[], None]:
    """Run an async test on its own event loop, bounded in time."""

    @functools.wraps(test)
    def run() -> None:
        asyncio.run(asyncio.wait_for(test(), timeout=60))

    return run


def tenant(name: str, key: str, **spec: Any) -> dict[str, Any]:
    keys = [{"name": "main", "sha256": api_key_hash(key)}]
    return {"metadata": {"name": name}, "spec": {"apiKeys": keys, **spec}}


@contextlib.asynccontextmanager
async def simulator() -> AsyncIterator[tuple[SimServer, str]]:
    async with replica(SIM) as found:
        yield found.sim, found.address


@dataclass
class Rig:
    url: str
    router: Router
    gateway: Gateway
    sim: SimServer
    http: aiohttp.ClientSession

    async def post(
        self, body: dict[str, Any], key: str | None = KEY, path: str = "/v1/completions"
    ) -> tuple[int, dict[str, str], str]:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        async with self.http.post(self.url + path, json=body, headers=headers) as answer:
            return answer.status, dict(answer.headers), await answer.text()

    def metric(self, name: str, **labels: str) -> float:
        value = self.router.metrics.registry.get_sample_value(name, labels)
        return value or 0.0


@contextlib.asynccontextmanager
async def rig(
    *tenants: dict[str, Any],
    pricing: Any = None,
    gpu_hour: GpuHourPrice | None = None,
    status: dict[str, Any] | None = None,
) -> AsyncIterator[Rig]:
    async with simulator() as (sim, address):
        table = RouteTable()
        table.set("llama", "team", "llama", [address])
        router = Router(table)
        router.ready = True
        gateway = Gateway(Local(), GatewayMetrics(router.metrics.registry))
        gateway.set_tenants([parse_tenant(t) for t in tenants])
        gateway.gpu_hour = gpu_hour
        if pricing is not None or gpu_hour is not None:
            gateway.set_price(("team", "llama"), pricing, gpus=2, status=status)
        router.gateway = gateway
        site = TestServer(router.app(), host="127.0.0.1")
        await site.start_server()
        try:
            async with aiohttp.ClientSession() as http:
                yield Rig(f"http://127.0.0.1:{site.port}", router, gateway, sim, http)
        finally:
            await site.close()


def completion(max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    return {"model": "llama", "prompt": "hello there", "max_tokens": max_tokens, **extra}


async def settled(gateway: Gateway) -> None:
    """Settlement runs in the background: wait for it."""
    for _ in range(100):
        if not gateway._settling:
            return
        await asyncio.sleep(0.01)


@synchronous
async def test_keys_are_checked_before_anything_reaches_the_engine() -> None:
    expired = tenant("old", OTHER_KEY)
    expired["spec"]["apiKeys"][0]["notAfter"] = "2020-01-01T00:00:00Z"
    async with rig(tenant("a", KEY), expired) as r:
        for key, why in (
            (None, "no API key"),
            ("llmop_wrong", "not valid"),
            (OTHER_KEY, "expired"),
        ):
            status, headers, text = await r.post(completion(), key=key)
            assert status == 401, text
            assert why in json.loads(text)["error"]["message"]
            assert headers["WWW-Authenticate"].startswith("Bearer")
        assert r.sim.stats["requests"] == 0
        assert r.metric("llmop_gateway_rejected_total", tenant="-", reason="key_expired") == 1
        status, _, _ = await r.post(completion())
        assert status == 200


@synchronous
async def test_a_model_outside_the_list_is_not_found_and_not_listed() -> None:
    async with rig(tenant("a", KEY, models=["mistral-*"]), tenant("b", OTHER_KEY)) as r:
        status, _, text = await r.post(completion())
        assert status == 404
        assert json.loads(text)["error"]["code"] == "model_not_found"
        status, _, missing = await r.post(completion() | {"model": "nope"}, key=OTHER_KEY)
        assert status == 404
        assert (
            json.loads(missing)["error"]["message"].replace("'nope'", "'llama'")
            == (json.loads(text)["error"]["message"])
        ), "a forbidden model must read like one that does not exist"
        for key, expected in ((KEY, []), (OTHER_KEY, ["llama"])):
            async with r.http.get(
                r.url + "/v1/models", headers={"Authorization": f"Bearer {key}"}
            ) as answer:
                assert [m["id"] for m in (await answer.json())["data"]] == expected
        assert r.sim.stats["requests"] == 0


@synchronous
async def test_a_model_whose_engine_wants_its_own_key_is_refused_with_the_fix() -> None:
    """The gateway sends engines no key: an engine with `spec.service.apiKeySecretRef` would
    answer 401, which reads as "your key is wrong". The gateway says what is wrong instead,
    before admission (nothing charged) and without sending."""
    async with rig(tenant("a", KEY, limits={"requestsPerMinute": 1})) as r:
        backend = r.router.table.backends["llama"]
        backend.engine_key = True
        for _ in range(2):  # a limit of 1 a minute: the refusal charged nothing
            status, _, text = await r.post(completion())
            assert status == 503, text
            message = json.loads(text)["error"]["message"]
            assert "spec.service.apiKeySecretRef" in message
            assert "EngineKeyBehindGateway" in message
        assert r.sim.stats["requests"] == 0
        backend.engine_key = False
        status, _, _ = await r.post(completion())
        assert status == 200


@synchronous
async def test_a_request_limit_answers_429_with_the_exact_wait() -> None:
    limits = {"requestsPerMinute": 60, "burstSeconds": 2}
    async with rig(tenant("a", KEY, limits=limits)) as r:
        codes = [(await r.post(completion(1)))[0] for _ in range(2)]
        assert codes == [200, 200], "a burst of 2 s at 1 request/s"
        status, headers, text = await r.post(completion(1))
        assert status == 429, text
        wait_ms = int(headers["retry-after-ms"])
        assert 0 < wait_ms <= 1000
        assert headers["Retry-After"] == "1"
        assert headers["x-ratelimit-limit-requests"] == "60"
        assert json.loads(text)["error"]["code"] == "rate_limit_exceeded"
        await asyncio.sleep(wait_ms / 1000 + 0.05)
        assert (await r.post(completion(1)))[0] == 200
        assert r.metric("llmop_gateway_rejected_total", tenant="a", reason="requests") == 1


@synchronous
async def test_a_refused_request_consumes_nothing_of_the_other_limits() -> None:
    limits = {"requestsPerMinute": 600, "tokensPerMinute": 60, "burstSeconds": 1}
    async with rig(tenant("a", KEY, limits=limits)) as r:
        # 3 prompt tokens + 4 reserved = 7 of a 1 s burst of 1 token/s (a request larger than
        # the burst passes on a full bucket, then waits it out).
        assert (await r.post(completion(4)))[0] == 200
        for _ in range(3):
            assert (await r.post(completion(4)))[0] == 429
        tats = dict(r.gateway.store.tats)  # type: ignore[attr-defined]
        for _ in range(3):
            await r.post(completion(4))
        assert r.gateway.store.tats == tats  # type: ignore[attr-defined]


@synchronous
async def test_usage_is_metered_in_streams_and_hidden_when_not_asked_for() -> None:
    pricing = {"currency": "EUR", "inputPerMillion": "0.15", "outputPerMillion": "0.60"}
    async with rig(tenant("a", KEY), pricing=pricing) as r:
        status, _, plain = await r.post(completion(5, stream=True))
        assert status == 200
        events = [e for e in plain.split("\n\n") if e.startswith("data: {")]
        assert all(json.loads(e[6:])["choices"] for e in events), "no usage-only event"
        assert plain.rstrip().endswith("data: [DONE]")
        status, _, asked = await r.post(
            completion(5, stream=True, stream_options={"include_usage": True})
        )
        usage_events = [json.loads(e[6:]) for e in asked.split("\n\n") if e.startswith("data: {")]
        usage = usage_events[-1]["usage"]
        status, _, whole = await r.post(completion(5))
        whole_usage = json.loads(whole)["usage"]
        await settled(r.gateway)
        prompt = usage["prompt_tokens"] * 2 + whole_usage["prompt_tokens"]
        output = usage["completion_tokens"] * 2 + whole_usage["completion_tokens"]
        assert output == 15
        tokens = "llmop_gateway_tokens_total"
        assert r.metric(tokens, tenant="a", model="llama", kind="input") == prompt
        assert r.metric(tokens, tenant="a", model="llama", kind="output") == output
        expected = (Decimal(prompt) * Decimal("0.15") + Decimal(output) * Decimal("0.60")) / (10**6)
        cost = r.metric("llmop_gateway_cost_total", tenant="a", model="llama", currency="EUR")
        assert abs(cost - float(expected)) <= float(expected) * 1e-9
        spent = await r.gateway.store.usage("a", time.strftime("%Y-%m", time.gmtime()))
        assert spent["llama:out"] == output
        assert Decimal(spent["total:picos"]) / 10**12 == expected


PLAN = {
    "memoryBandwidthGBs": 3350,
    "activeWeightsGiBPerGPU": 7.48,
    "kvBytesPerToken": 65536,
    "maxNumSeqs": 1024,
    "kvCacheTokens": 900_000,
    "maxNumBatchedTokens": 8192,
}


@synchronous
async def test_a_model_without_prices_is_charged_its_gpu_time_at_a_gpu_hour_price() -> None:
    """No `spec.router.pricing`, a GPU-hour price: each request is charged the GPU time its
    tokens take at the plan (two GPUs at 2.49 USD an hour), in the access log's figure, the
    cost counter and the tenant's usage in the store alike; a model's own prices still win."""
    async with rig(
        tenant("a", KEY), gpu_hour=GpuHourPrice(Decimal("2.49"), "USD"), status={"plan": PLAN}
    ) as r:
        answers = [json.loads((await r.post(completion(n)))[2]) for n in (3, 9)]
        await settled(r.gateway)
        facts = plan_facts({"plan": PLAN})
        price = GpuTime.of(Decimal("2.49"), 2, facts)
        assert price is not None
        expected = sum(
            price.cost_picos(Usage(a["usage"]["prompt_tokens"], a["usage"]["completion_tokens"]))
            for a in answers
        )
        assert expected > 0
        cost = r.metric("llmop_gateway_cost_total", tenant="a", model="llama", currency="USD")
        assert cost == pytest.approx(expected / 10**12, rel=1e-9)
        spent = await r.gateway.store.usage("a", time.strftime("%Y-%m", time.gmtime()))
        assert int(spent["total:picos"]) == expected
    pricing = {"currency": "EUR", "inputPerMillion": "0", "outputPerMillion": "1"}
    async with rig(
        tenant("a", KEY),
        pricing=pricing,
        gpu_hour=GpuHourPrice(Decimal("2.49"), "USD"),
        status={"plan": PLAN},
    ) as r:
        answer = json.loads((await r.post(completion(4)))[2])
        await settled(r.gateway)
        cost = r.metric("llmop_gateway_cost_total", tenant="a", model="llama", currency="EUR")
        assert cost == pytest.approx(answer["usage"]["completion_tokens"] / 10**6)


async def engine_headers(request: web.Request) -> web.Response:
    return web.json_response(
        {"headers": dict(request.headers), "usage": {"prompt_tokens": 1, "completion_tokens": 1}}
    )


@synchronous
async def test_the_client_key_never_reaches_the_engine() -> None:
    app = web.Application()
    app.router.add_post("/v1/completions", engine_headers)
    engine = TestServer(app, host="127.0.0.1")
    await engine.start_server()
    try:
        async with rig(tenant("a", KEY)) as r:
            r.router.table.set("llama", "team", "llama", [f"127.0.0.1:{engine.port}"])
            headers = {"Authorization": f"Bearer {KEY}", "x-llmop-tenant": "b", "x-api-key": KEY}
            async with r.http.post(
                r.url + "/v1/completions", json=completion(), headers=headers
            ) as answer:
                seen = (await answer.json())["headers"]
            lowered = {k.lower(): v for k, v in seen.items()}
            assert "authorization" not in lowered
            assert "x-api-key" not in lowered
            assert "x-llmop-tenant" not in lowered
            assert len(lowered["x-request-id"]) == 32
            # A client's id passes to the engine, but the store keys on the router's own: one
            # reused on purpose must not share a lease or skip its metering.
            headers["X-Request-Id"] = "mine"
            async with r.http.post(
                r.url + "/v1/completions", json=completion(), headers=headers
            ) as answer:
                seen = {k.lower(): v for k, v in (await answer.json())["headers"].items()}
                assert seen["x-request-id"] == "mine"
    finally:
        await engine.close()


@synchronous
async def test_each_request_has_one_access_log_line_without_prompt_or_key() -> None:
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    keep = Keep()
    access = logging.getLogger("llmop_router.access")
    access.addHandler(keep)
    access.setLevel(logging.INFO)
    try:
        async with rig(tenant("a", KEY)) as r:
            await r.post(completion(3, stream=True), path="/v1/completions")
            await settled(r.gateway)
    finally:
        access.removeHandler(keep)
    (line,) = lines
    entry = json.loads(line)
    assert entry["tenant"] == "a"
    assert entry["key"] == "main"
    assert entry["outputTokens"] == 3
    assert entry["usageExact"] is True
    assert entry["ttftMs"] is not None
    assert entry["ttftMs"] <= entry["durationMs"]
    assert KEY not in line
    assert "hello there" not in line


@synchronous
async def test_a_reused_client_request_id_neither_shares_a_lease_nor_skips_metering() -> None:
    async with rig(tenant("a", KEY, limits={"maxConcurrentRequests": 1})) as r:
        headers = {"Authorization": f"Bearer {KEY}", "X-Request-Id": "same"}
        long = completion(100)

        async def send() -> int:
            async with r.http.post(r.url + "/v1/completions", json=long, headers=headers) as a:
                await a.read()
                return a.status

        assert sorted(await asyncio.gather(send(), send())) == [200, 429]
        assert (await send()) == 200
        await settled(r.gateway)
        month = time.strftime("%Y-%m", time.gmtime())
        assert (await r.gateway.store.usage("a", month))["llama:out"] == 200


@synchronous
async def test_shadow_mode_counts_and_refuses_nothing() -> None:
    limits = {"requestsPerMinute": 60, "burstSeconds": 1, "mode": "Shadow"}
    async with rig(tenant("a", KEY, limits=limits)) as r:
        codes = [(await r.post(completion(1)))[0] for _ in range(4)]
        assert codes == [200] * 4
        assert r.metric("llmop_gateway_shadow_rejected_total", tenant="a", reason="requests") == 3


@synchronous
async def test_admitted_answers_say_what_is_left_of_each_limit() -> None:
    """OpenAI's `x-ratelimit-*` on every admitted answer, JSON or stream: 2 s of burst at 1
    request/s leaves 1 request after the first and 0 after the second; 3 prompt tokens + 4
    reserved of a 200-token burst at 100 tokens/s leave 193, full again in 70 ms."""
    limits = {"requestsPerMinute": 60, "tokensPerMinute": 6000, "burstSeconds": 2}
    async with rig(tenant("a", KEY, limits=limits)) as r:
        status, headers, _ = await r.post(completion(4))
        assert status == 200
        assert headers["x-ratelimit-limit-requests"] == "60"
        assert headers["x-ratelimit-remaining-requests"] == "1"
        assert headers["x-ratelimit-reset-requests"] == "1s"
        assert headers["x-ratelimit-limit-tokens"] == "6000"
        assert headers["x-ratelimit-remaining-tokens"] == "193"
        assert headers["x-ratelimit-reset-tokens"] == "70ms"
        status, headers, text = await r.post(completion(4, stream=True))
        assert status == 200
        assert text.rstrip().endswith("data: [DONE]")
        assert headers["x-ratelimit-remaining-requests"] == "0"
        assert headers["x-ratelimit-reset-requests"].endswith("s")
        assert int(headers["x-ratelimit-remaining-tokens"]) < 193
        status, headers, _ = await r.post(completion(4))
        assert status == 429
        assert "x-ratelimit-remaining-requests" not in headers
