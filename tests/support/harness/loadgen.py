"""A load generator that routes like a Kubernetes Service and audits every streamed response.

`Endpoints` polls each replica's readiness URL every `poll_seconds` and round-robins only over those
it last saw answer 200 — the lag between a pod flipping readiness and the poll noticing is the
endpoint propagation delay the agent waits out. `ServiceEndpoint` is one fixed URL instead (a
Service's ClusterIP: kube-proxy does the routing, as clients in a cluster see it). `run_clients`
keeps N streaming completions in flight and classifies each: ok (HTTP 200, `max_tokens` tokens,
finish_reason `length`, `[DONE]`), truncated (the stream ended early, aborted, or was cut), failed
(no response: refused, reset, 5xx).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp


@dataclass
class Backend:
    name: str
    api_url: str
    readiness_url: str
    ready: bool = False


class Router(Protocol):
    """Picks the backend for the next request (None: nothing ready yet)."""

    def pick(self) -> Backend | None: ...


class ServiceEndpoint:
    """One fixed API URL, e.g. a Service's ClusterIP: the cluster does the routing."""

    def __init__(self, api_url: str) -> None:
        self.backend = Backend("service", api_url, readiness_url="", ready=True)

    def pick(self) -> Backend:
        return self.backend


class Endpoints:
    def __init__(self, poll_seconds: float = 0.5) -> None:
        self.poll_seconds = poll_seconds
        self.backends: dict[str, Backend] = {}
        self._rr = itertools.count()
        self._task: asyncio.Task[None] | None = None

    def add(self, name: str, api_url: str, readiness_url: str) -> None:
        self.backends[name] = Backend(name, api_url, readiness_url)

    def remove(self, name: str) -> None:
        self.backends.pop(name, None)

    def pick(self) -> Backend | None:
        ready = [b for b in self.backends.values() if b.ready]
        if not ready:
            return None
        return ready[next(self._rr) % len(ready)]

    async def _poll(self) -> None:
        async with aiohttp.ClientSession() as http:
            while True:
                for backend in list(self.backends.values()):
                    ok = False
                    with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
                        async with http.get(
                            backend.readiness_url, timeout=aiohttp.ClientTimeout(total=1)
                        ) as r:
                            ok = r.status == 200
                    backend.ready = ok
                await asyncio.sleep(self.poll_seconds)

    def start(self) -> None:
        self._task = asyncio.create_task(self._poll(), name="endpoints")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


@dataclass
class LoadResult:
    ok: int = 0
    truncated: int = 0
    failed: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    """Seconds from sending a request to its first streamed token (requests that got one)."""
    timeline: list[tuple[float, float, str]] = field(default_factory=list)
    """(sent, ended, outcome) of every request, in `time.monotonic()` seconds: what failed when."""

    @property
    def total(self) -> int:
        return self.ok + self.truncated + self.failed

    @property
    def lost(self) -> int:
        return self.truncated + self.failed

    def ttft_quantile(self, q: float) -> float:
        """The q-quantile (nearest rank) of the time to first token; NaN when none."""
        if not self.ttfts:
            return float("nan")
        ordered = sorted(self.ttfts)
        return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


async def sse_chunks(resp: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any] | None]:
    """The `data:` events of an OpenAI-style stream, parsed; None for the final `[DONE]`. A
    consumer that reads on past it drains the body, so its keep-alive connection is reusable."""
    async for raw in resp.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        yield None if data == b"[DONE]" else json.loads(data)


async def stream_completion(  # noqa: C901, PLR0912
    http: aiohttp.ClientSession,
    api_url: str,
    model: str,
    max_tokens: int,
    ttfts: list[float] | None = None,
) -> tuple[str, str]:
    """One streaming completion; returns (outcome, reason). Appends its TTFT to `ttfts`."""
    # Real vLLM, unlike the simulator: a model (a random test one above all) may emit EOS at any
    # step (finish_reason `stop`), and a token whose text the detokenizer holds back (part of a
    # multi-byte character, a special token) streams as a chunk with empty text. So EOS is
    # ignored and the count is the engine's own (the usage chunk), not the chunks with text.
    payload = {
        "model": model,
        "prompt": "Tell me a story.",
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    tokens, finish, done = 0, None, False
    usage_tokens: int | None = None
    started = time.monotonic()
    try:
        async with http.post(api_url + "/v1/completions", json=payload) as resp:
            if resp.status != 200:
                return "failed", f"HTTP {resp.status}"
            async for chunk in sse_chunks(resp):
                if chunk is None:
                    done = True
                    break
                usage = chunk.get("usage")
                if isinstance(usage, dict) and "completion_tokens" in usage:
                    usage_tokens = int(usage["completion_tokens"])
                for choice in chunk.get("choices", []):
                    if choice.get("text"):
                        if tokens == 0 and ttfts is not None:
                            ttfts.append(time.monotonic() - started)
                        tokens += 1
                    if choice.get("finish_reason"):
                        finish = choice["finish_reason"]
    except (aiohttp.ClientConnectorError, ConnectionRefusedError) as exc:
        return "failed", f"connect: {type(exc).__name__}"
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
        return ("truncated" if tokens else "failed"), type(exc).__name__
    if usage_tokens is not None:
        tokens = usage_tokens
    if finish == "length" and tokens == max_tokens and done:
        return "ok", ""
    if finish == "abort" and tokens == 0:
        return "failed", "aborted before any token"
    if finish is None and tokens == 0 and done:
        # vLLM 0.32 ends a request still queued when the engine aborts everything this way.
        return "failed", "no output before [DONE]"
    if finish != "length":
        return "truncated", f"finish_reason={finish}"
    return "truncated", f"{tokens}/{max_tokens} tokens, [DONE]={done}"


async def run_clients(
    endpoints: Router,
    concurrency: int,
    duration: float,
    model: str,
    max_tokens: int,
    *,
    should_stop: Callable[[], bool] = lambda: False,
    keepalive: bool = True,
    headers: Mapping[str, str] | None = None,
) -> LoadResult:
    """N clients, each sending one streaming request after another until `duration` ends or
    `should_stop()` says so (checked between requests; requests in flight always finish).

    `keepalive=False` opens a new connection per request. Through a ClusterIP this matters:
    kube-proxy picks the endpoint per connection, so a pooled keep-alive connection stays pinned
    to its pod after the pod left the Service, and its next request meets the draining engine.
    `headers` go with every request (e.g. a gateway's `Authorization`).
    """
    result = LoadResult()
    deadline = time.monotonic() + duration
    timeout = aiohttp.ClientTimeout(total=120, sock_connect=5)

    async def client(http: aiohttp.ClientSession) -> None:
        while time.monotonic() < deadline and not should_stop():
            backend = endpoints.pick()
            if backend is None:
                await asyncio.sleep(0.05)
                continue
            started = time.monotonic()
            outcome, reason = await stream_completion(
                http, backend.api_url, model, max_tokens, result.ttfts
            )
            result.timeline.append((started, time.monotonic(), outcome))
            if outcome == "ok":
                result.ok += 1
                result.latencies.append(time.monotonic() - started)
            else:
                if outcome == "truncated":
                    result.truncated += 1
                else:
                    result.failed += 1
                result.reasons[f"{outcome}: {reason}"] += 1

    connector = aiohttp.TCPConnector(limit=concurrency * 2, force_close=not keepalive)
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, headers=dict(headers or {})
    ) as http:
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
    return result
