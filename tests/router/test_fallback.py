"""Fallback to another routed model or an API outside the cluster (`spec.router.fallback`), on
real sockets: simulator engines serving `llama` and `qwen` behind a real router with the gateway
on, and a third simulator with its own API key as the external API. What it proves: a model
with no ready replica, whose every replica fails before answering, or whose engine refuses with
its own 5xx or 429 before the first byte, is answered by its fallback (the body's `model`
rewritten, the answer marked `X-Llmop-Fallback`, metered at the fallback's price), but only for
a tenant allowed to use the fallback (an external API only for a tenant whose `spec.fallback` is
Allowed); the external API receives its own key, never the tenant's; an external API that cannot
be reached leaves the model's own answer; a request that waits past `afterSeconds` for a slot of
a saturated model goes to its fallback instead; and what the engine of the fallback receives
never carries the client's key."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from llmop_engine.simulator.sim_config import SimConfig
from llmop_router.app import Router
from llmop_router.externals import ExternalModel, SecretRef
from llmop_router.gateway import Gateway
from llmop_router.metrics import GatewayMetrics
from llmop_router.routes import Fallback, RouteTable, Wake
from llmop_router.store import Local
from llmop_router.tenants import parse_tenant
from router.test_gateway import KEY, OTHER_KEY, Rig, synchronous, tenant
from support.harness.replicas import free_port
from support.migration_rig import Replica, replica

PRIMARY = SimConfig(
    model="llama", max_num_seqs=8, load_seconds=0, decode_ms=10, decode_ms_per_seq=0.0
)
BACKUP = SimConfig(model="qwen", max_num_seqs=8, load_seconds=0, decode_ms=2, decode_ms_per_seq=0.0)
PRICING = {"currency": "USD", "inputPerMillion": "1000000", "outputPerMillion": "1000000"}
PROVIDER_KEY = "provider-secret-key-of-the-external-api"
EXTERNAL = SimConfig(
    model="upstream-model",
    max_num_seqs=8,
    load_seconds=0,
    decode_ms=2,
    decode_ms_per_seq=0.0,
    api_key=PROVIDER_KEY,
)
SPENDER_KEY = "llmop_test-key-of-spender-0123456789abcdef"


@contextlib.asynccontextmanager
async def rig(primary: list[str], fallback: Fallback) -> AsyncIterator[tuple[Rig, Replica]]:
    """`llama` on `primary` (its endpoints; the real engine's address is `{llama}`) with one
    fallback to `qwen`; tenant a may use both, tenant b only llama."""
    async with replica(PRIMARY) as llama, replica(BACKUP) as qwen:
        endpoints = [e.format(llama=llama.address) for e in primary]
        table = RouteTable()
        table.set("llama", "team", "llama", endpoints, Wake(concurrency=1), fallback=(fallback,))
        table.set("qwen", "team", "qwen", [qwen.address])
        router = Router(table, connect_timeout=1.0)
        router.ready = True
        gateway = Gateway(Local(), GatewayMetrics(router.metrics.registry))
        gateway.set_tenants(
            [
                parse_tenant(tenant("a", KEY)),
                parse_tenant(tenant("b", OTHER_KEY, models=["llama"])),
                parse_tenant(tenant("spender", SPENDER_KEY, fallback="Allowed")),
            ]
        )
        gateway.set_price(("team", "qwen"), PRICING)
        router.gateway = gateway
        site = TestServer(router.app(), host="127.0.0.1")
        await site.start_server()
        try:
            async with aiohttp.ClientSession() as http:
                yield Rig(f"http://127.0.0.1:{site.port}", router, gateway, llama.sim, http), qwen
        finally:
            await site.close()


def completion(max_tokens: int = 3) -> dict[str, Any]:
    return {"model": "llama", "prompt": "hello there", "max_tokens": max_tokens}


@synchronous
async def test_a_model_without_a_replica_is_answered_by_its_fallback_for_whom_may_use_it() -> None:
    async with rig([], Fallback("qwen")) as (r, qwen):
        status, headers, text = await r.post(completion())
        assert status == 200, text
        assert headers["X-Llmop-Fallback"] == "qwen"
        assert json.loads(text)["model"] == "qwen"
        path, sent = qwen.seen[-1]
        assert (path, sent["model"]) == ("/v1/completions", "qwen")
        assert r.metric("llmop_gateway_fallbacks_total", reason="unavailable") == 1
        cost = r.metric("llmop_gateway_cost_total", tenant="a", model="llama", currency="USD")
        assert cost > 0, "metered at the fallback's price (llama has none)"
        # Tenant b may not use qwen: the model's own answer, a 503 with Retry-After.
        status, headers, text = await r.post(completion(), key=OTHER_KEY)
        assert status == 503, text
        assert "Retry-After" in headers
        assert "X-Llmop-Fallback" not in headers
        assert len(qwen.seen) == 1


@synchronous
async def test_replicas_that_all_fail_before_answering_go_to_the_fallback() -> None:
    closed = f"127.0.0.1:{free_port()}"  # nothing listens: connection refused
    async with rig([closed], Fallback("qwen")) as (r, qwen):
        status, headers, text = await r.post(completion())
        assert status == 200, text
        assert headers["X-Llmop-Fallback"] == "qwen"
        assert r.metric("llmop_gateway_fallbacks_total", reason="unavailable") == 1
        assert all("Authorization" not in json.dumps(sent) for _, sent in qwen.seen)
        # Without a fallback it may use: nothing reached an engine, so 503 with Retry-After.
        status, headers, text = await r.post(completion(), key=OTHER_KEY)
        assert status == 503, text
        assert headers["Retry-After"] == "5"


@synchronous
async def test_a_request_that_waits_too_long_for_a_slot_goes_to_the_fallback() -> None:
    saturated = Fallback("qwen", unavailable=False, saturated_after=0.3)
    async with rig(["{llama}"], saturated) as (r, qwen):
        busy = asyncio.create_task(r.post(completion(80)))  # llama's one slot, ~0.8 s
        for _ in range(100):
            if r.router.sharing.queues.running(("team", "llama")) == 1:
                break
            await asyncio.sleep(0.01)
        status, headers, text = await r.post(completion())
        assert status == 200, text
        assert headers["X-Llmop-Fallback"] == "qwen"
        assert not busy.done(), "answered by qwen while llama's slot was still busy"
        assert (await busy)[0] == 200
        assert r.metric("llmop_gateway_fallbacks_total", reason="saturated") == 1
        assert r.metric("llmop_gateway_queue_total", outcome="saturated") == 1
        assert r.router.sharing.queues.total == 0
        assert len(qwen.seen) == 1


def managed(address: str, **changes: Any) -> ExternalModel:
    """The external API at `address` (the third simulator), as an LLMExternalModel."""
    fields: dict[str, Any] = {
        "namespace": "llmop-system",
        "name": "managed",
        "base_url": f"http://{address}/v1",
        "model": "upstream-model",
        "pricing": PRICING,
        **changes,
    }
    return ExternalModel(**fields)


@synchronous
async def test_an_external_api_answers_with_its_own_key_for_a_tenant_allowed_to_spend() -> None:
    external = Fallback("managed", external=True)
    async with rig([], external) as (r, _qwen), replica(EXTERNAL) as provider:
        r.router.externals.put(managed(provider.address))
        r.router.externals.key_read("managed", PROVIDER_KEY, None)
        r.gateway.set_price(r.router.externals.models["managed"].key, PRICING)
        for stream in (False, True):
            body = {**completion(), "stream": stream}
            status, headers, text = await r.post(body, key=SPENDER_KEY)
            assert status == 200, text
            assert headers["X-Llmop-Fallback"] == "managed"
            assert "upstream-model" in text
        assert [sent["model"] for _, sent in provider.seen] == ["upstream-model"] * 2
        # The provider's key, never the tenant's: the tenant's key never leaves the cluster.
        assert {h["Authorization"] for h in provider.headers} == {f"Bearer {PROVIDER_KEY}"}
        assert all(SPENDER_KEY not in json.dumps(h) for h in provider.headers)
        cost = r.metric("llmop_gateway_cost_total", tenant="spender", model="llama", currency="USD")
        assert cost > 0, "metered at the external model's price"
        assert r.metric("llmop_gateway_fallbacks_total", reason="unavailable") == 2
        # Tenant a (InClusterOnly, the default) is never sent outside: the model's own 503.
        status, headers, text = await r.post(completion())
        assert status == 503, text
        assert "Retry-After" in headers
        assert "X-Llmop-Fallback" not in headers
        assert len(provider.seen) == 2


@synchronous
async def test_an_external_api_out_of_reach_or_without_its_key_leaves_the_models_answer() -> None:
    external = Fallback("managed", external=True)
    async with rig([], external) as (r, _qwen):
        closed = f"127.0.0.1:{free_port()}"
        r.router.externals.put(managed(closed))
        status, headers, text = await r.post(completion(), key=SPENDER_KEY)
        assert (status, "X-Llmop-Fallback" in headers) == (503, False), text
        assert r.router.externals.in_flight == {}
        # A Secret not read yet (or unreadable): the fallback is skipped, not sent keyless.
        ref = managed(closed).secret
        assert ref is None
        with_secret = managed(closed, secret=SecretRef("provider-key"))
        r.router.externals.put(with_secret)
        assert r.router.externals.usable("managed") is None
        status, _, text = await r.post(completion(), key=SPENDER_KEY)
        assert status == 503, text


@synchronous
async def test_an_engine_refusing_before_the_first_byte_goes_to_the_fallback() -> None:
    async with rig(["{llama}"], Fallback("qwen")) as (r, qwen):
        for fault, refused in (("refuse", 503), ("dead", 500)):
            if fault == "dead":
                r.sim.apply_fault("none")
                r.sim.engine.dead = True  # EngineDeadError: vLLM's 500 before any byte
            else:
                r.sim.apply_fault(fault)
            for stream in (False, True):
                status, headers, text = await r.post({**completion(), "stream": stream})
                assert status == 200, (fault, stream, text)
                assert headers["X-Llmop-Fallback"] == "qwen"
            # A tenant that may not use qwen gets the engine's own refusal, as it was (a 503
            # with a Retry-After: the engine's, or the router's when it sent none).
            status, headers, text = await r.post(completion(), key=OTHER_KEY)
            assert status == refused, text
            assert "X-Llmop-Fallback" not in headers
            assert ("Retry-After" in headers) == (refused == 503)
        assert len(qwen.seen) == 4
        assert r.metric("llmop_gateway_fallbacks_total", reason="unavailable") == 4


@synchronous
async def test_an_external_api_sees_none_of_the_clients_headers_and_its_own_stay_outside() -> None:
    """Outbound, the client's cookies, forwarding and tracing headers and its own organization
    stay in the cluster and the answer is asked uncompressed (the gateway meters its bytes);
    inbound, the provider's cookies, account and rate limits for the platform's key do not
    reach the client."""
    seen: list[dict[str, str]] = []

    async def provider_answer(request: aiohttp.web.Request) -> aiohttp.web.Response:
        seen.append({k.lower(): v for k, v in request.headers.items()})
        answer = {
            "id": "cmpl-x",
            "object": "text_completion",
            "created": 1,
            "model": "upstream-model",
            "choices": [{"index": 0, "text": " hi", "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
        }
        return aiohttp.web.json_response(
            answer,
            headers={
                "Set-Cookie": "__cf_bm=tracking; Path=/",
                "OpenAI-Organization": "org-platform-account",
                "OpenAI-Project": "proj-platform",
                "x-ratelimit-limit-requests": "10000",
                "X-Request-Id": "req_provider",
                "Server": "cloudflare",
                "Cache-Control": "no-store",
            },
        )

    app = aiohttp.web.Application()
    app.router.add_post("/v1/completions", provider_answer)
    provider = TestServer(app, host="127.0.0.1")
    await provider.start_server()
    try:
        async with rig([], Fallback("managed", external=True)) as (r, _qwen):
            r.router.externals.put(managed(f"127.0.0.1:{provider.port}"))
            r.router.externals.key_read("managed", PROVIDER_KEY, None)
            client_headers = {
                "Authorization": f"Bearer {SPENDER_KEY}",
                "Cookie": "session=the-clients",
                "X-Forwarded-For": "10.1.2.3",
                "Traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                "OpenAI-Organization": "org-of-the-client",
                "Accept-Encoding": "gzip, br",
            }
            async with r.http.post(
                r.url + "/v1/completions", json=completion(), headers=client_headers
            ) as answer:
                status, headers, text = answer.status, answer.headers, await answer.text()
            assert status == 200, text
            assert headers["X-Llmop-Fallback"] == "managed"
            for kept in ("Content-Type", "Cache-Control"):
                assert kept in headers, kept
            for gone in ("Set-Cookie", "OpenAI-Organization", "OpenAI-Project"):
                assert gone not in headers, gone
            assert headers.get("Server") != "cloudflare"  # the router's own, not the provider's
            assert "x-ratelimit-limit-requests" not in headers
            assert headers.get("X-Request-Id") != "req_provider"
            [sent] = seen
            assert sent["authorization"] == f"Bearer {PROVIDER_KEY}"
            assert sent["accept-encoding"] == "identity"
            for gone in ("cookie", "x-forwarded-for", "traceparent", "openai-organization"):
                assert gone not in sent, gone
            assert "x-request-id" in sent  # the gateway's id, for the provider's support
    finally:
        await provider.close()
