"""The router process stopping on SIGTERM, as the kubelet stops a router pod: it turns unready
but keeps answering new requests for `--shutdown-delay` (with `Connection: close`, so clients
reconnect elsewhere), then refuses new connections while the stream in flight finishes."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from router.test_proxy import FakeEngine, chat_body, engines, run
from support.harness.replicas import free_port

DELAY = 1.5


async def _stream(
    client: aiohttp.ClientSession, url: str, started: asyncio.Event
) -> tuple[str, list[bytes]]:
    """A streaming completion; `started` is set at its first event. Returns its `Connection`
    header and its events."""
    events = []
    async with client.post(f"{url}/v1/chat/completions", json=chat_body("long")) as response:
        assert response.status == 200
        async for line in response.content:
            if line.startswith(b"data:"):
                events.append(line.strip())
                started.set()
    return response.headers.get("Connection", "").lower(), events


async def _wait_ready(client: aiohttp.ClientSession, url: str) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            async with client.get(f"{url}/readyz") as response:
                if response.status == 200:
                    return
        except aiohttp.ClientConnectionError:
            pass
        await asyncio.sleep(0.05)
    raise AssertionError("the router never became ready")


def test_sigterm_keeps_serving_unready_then_drains_the_streams_in_flight(tmp_path: Path) -> None:
    async def body() -> None:
        # 15 events 0.2 s apart: the stream outlives the delay, so it is in flight at the close.
        async with engines(FakeEngine("a", chunks=15)) as (engine,):
            table = tmp_path / "table.json"
            entry = {"namespace": "team", "name": "llama", "endpoints": [engine.address]}
            table.write_text(json.dumps({"models": {"llama": entry}}))
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            process = subprocess.Popen(
                [
                    *(sys.executable, "-m", "llmop_router", "serve", "--static", str(table)),
                    *("--host", "127.0.0.1", "--port", str(port)),
                    *("--admin-port", str(free_port())),
                    *("--shutdown-delay", str(DELAY), "--drain", "10"),
                ],
            )
            try:
                async with aiohttp.ClientSession() as client:
                    await _wait_ready(client, url)
                    started = asyncio.Event()
                    long = asyncio.create_task(_stream(client, url, started))
                    await started.wait()
                    process.send_signal(signal.SIGTERM)
                    sent = time.monotonic()
                    await asyncio.sleep(0.3)

                    # Within the delay: unready, yet a new request is answered, and its
                    # connection is not kept.
                    async with client.get(f"{url}/readyz") as response:
                        assert response.status == 503
                    answering = asyncio.Event()
                    new = asyncio.create_task(_stream(client, url, answering))
                    await answering.wait()
                    assert time.monotonic() - sent < DELAY

                    # After it: no new connections...
                    await asyncio.sleep(DELAY + 0.3 - (time.monotonic() - sent))
                    with pytest.raises(aiohttp.ClientConnectorError):
                        async with client.get(f"{url}/healthz"):
                            pass
                    # ...while both streams in flight finish whole.
                    (_, before), (connection, during) = await long, await new
                    for events in (before, during):
                        assert len(events) == 16, events
                        assert events[-1] == b"data: [DONE]", events
                    assert connection == "close"
                assert process.wait(timeout=10) == 0
                assert engine.finished == 2
            finally:
                if process.poll() is None:
                    process.kill()
                    process.wait()

    run(body)
