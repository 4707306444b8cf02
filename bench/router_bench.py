"""Router benchmark (`make bench-router`): what the router adds to time-to-first-token.

Three paths to one streaming engine, measured in the same run on this machine: `direct` (client →
engine), `passthrough` (client → a bare aiohttp streaming proxy: same HTTP stack and event loop,
no parsing, no routing) and `router` (client → `llmop-router`: reads the body, parses it, hashes
the conversation head, picks a pod). The engine is a fixed-pace SSE server (16 chunks 20 ms
apart), so the only thing that differs between rows is the hop. Each path runs C concurrent
streaming clients for D seconds, each request a 2 KiB system prompt plus its own question.
Goals (issue 25): router p50 ≤ direct p50 + 2 ms, router p99 ≤ 1.25 times passthrough p99. Prints a
Markdown table; not a timed test.

    python bench/router_bench.py [--streams 50,200] [--seconds 15]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import uvloop
from aiohttp import web

CHUNKS = 16
CHUNK_GAP = 0.02
SYSTEM_PROMPT = "You answer questions about the llmop operator precisely. " * 36


# --- the processes ----------------------------------------------------------------------------


async def _engine(request: web.Request) -> web.StreamResponse:
    await request.read()
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for i in range(CHUNKS):
        await response.write(f'data: {{"i": {i}}}\n\n'.encode())
        await asyncio.sleep(CHUNK_GAP)
    await response.write(b"data: [DONE]\n\n")
    return response


def serve_engine(port: int) -> None:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _engine)
    uvloop.install()
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


def serve_passthrough(port: int, upstream: str) -> None:
    session: aiohttp.ClientSession | None = None

    async def start(_app: web.Application) -> None:
        nonlocal session
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    async def relay(request: web.Request) -> web.StreamResponse:
        assert session is not None
        body = await request.read()
        async with session.post(f"http://{upstream}{request.path}", data=body) as answer:
            response = web.StreamResponse(status=answer.status)
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    app = web.Application()
    app.on_startup.append(start)
    app.router.add_post("/v1/chat/completions", relay)
    uvloop.install()
    web.run_app(
        app, host="127.0.0.1", port=port, access_log=None, print=None, handler_cancellation=True
    )


# --- the load ---------------------------------------------------------------------------------


@dataclass
class Result:
    path: str
    streams: int
    ttfts: list[float]
    errors: int

    def quantile(self, q: float) -> float:
        if len(self.ttfts) < 2:
            return float("nan")
        return statistics.quantiles(self.ttfts, n=1000, method="inclusive")[int(q * 1000) - 1]


async def load(address: str, path: str, streams: int, seconds: float) -> Result:
    result = Result(path, streams, [], 0)
    deadline = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as client:

        async def one_client(n: int) -> None:
            turn = 0
            while time.monotonic() < deadline:
                turn += 1
                payload = {
                    "model": "bench",
                    "stream": True,
                    "messages": [
                        {"role": "system", "content": SYSTEM_PROMPT},
                        {"role": "user", "content": f"client {n} question {turn}"},
                    ],
                }
                started = time.perf_counter()
                try:
                    async with client.post(
                        f"http://{address}/v1/chat/completions", json=payload
                    ) as answer:
                        first = True
                        async for _chunk in answer.content.iter_any():
                            if first:
                                result.ttfts.append(time.perf_counter() - started)
                                first = False
                        if answer.status != 200:
                            result.errors += 1
                except aiohttp.ClientError:
                    result.errors += 1

        await asyncio.gather(*(one_client(n) for n in range(streams)))
    return result


# --- orchestration ----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(port: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on :{port}")


def start(argv: Sequence[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, *argv], stdout=subprocess.DEVNULL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", default="50,200")
    parser.add_argument("--seconds", type=float, default=15)
    sub = parser.add_subparsers(dest="role")
    engine = sub.add_parser("engine")
    engine.add_argument("--port", type=int, required=True)
    passthrough = sub.add_parser("passthrough")
    passthrough.add_argument("--port", type=int, required=True)
    passthrough.add_argument("--upstream", required=True)
    args = parser.parse_args()
    if args.role == "engine":
        serve_engine(args.port)
        return
    if args.role == "passthrough":
        serve_passthrough(args.port, args.upstream)
        return

    this = str(Path(__file__).resolve())
    engine_port, pass_port, router_port = free_port(), free_port(), free_port()
    table = {"models": {"bench": {"namespace": "bench", "name": "bench", "endpoints": []}}}
    table["models"]["bench"]["endpoints"] = [f"127.0.0.1:{engine_port}"]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(table, handle)
    processes = [
        start([this, "engine", "--port", str(engine_port)]),
        start(
            [
                this,
                "passthrough",
                "--port",
                str(pass_port),
                "--upstream",
                f"127.0.0.1:{engine_port}",
            ]
        ),
        start(
            [
                "-m",
                "llmop_router",
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(router_port),
                "--static",
                handle.name,
            ]
        ),
    ]
    try:
        for port in (engine_port, pass_port, router_port):
            wait_listening(port)
        paths = {
            "direct": f"127.0.0.1:{engine_port}",
            "passthrough": f"127.0.0.1:{pass_port}",
            "router": f"127.0.0.1:{router_port}",
        }
        results: list[Result] = []
        uvloop.install()
        for streams in (int(s) for s in args.streams.split(",")):
            for path, address in paths.items():
                results.append(asyncio.run(load(address, path, streams, args.seconds)))
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=10)
        os.unlink(handle.name)
    report(results, args.seconds)


def report(results: list[Result], seconds: float) -> None:
    print(
        f"\nrouter bench: {CHUNKS} chunks {CHUNK_GAP * 1000:.0f} ms apart per answer, "
        f"{seconds:.0f} s per row, {os.cpu_count()} CPUs, engine, proxy and clients on this "
        "machine\n"
    )
    columns = (
        "path | streams | requests | errors | TTFT p50 ms | TTFT p99 ms | p50 added vs direct ms"
    )
    print(f"| {columns} |")
    print("|---|---|---|---|---|---|---|")
    by = {(r.path, r.streams): r for r in results}
    for r in results:
        direct = by[("direct", r.streams)]
        added = (r.quantile(0.5) - direct.quantile(0.5)) * 1000
        print(
            f"| {r.path} | {r.streams} | {len(r.ttfts)} | {r.errors} | "
            f"{r.quantile(0.5) * 1000:.2f} | {r.quantile(0.99) * 1000:.2f} | {added:+.2f} |"
        )
    print()
    for streams in sorted({r.streams for r in results}):
        router, bare, direct = (
            by[("router", streams)],
            by[("passthrough", streams)],
            by[("direct", streams)],
        )
        added = (router.quantile(0.5) - direct.quantile(0.5)) * 1000
        ratio = router.quantile(0.99) / bare.quantile(0.99)
        print(
            f"- {streams} streams: router adds {added:.2f} ms to p50 TTFT (goal ≤ 2), "
            f"p99 {ratio:.2f}x the bare passthrough's (goal ≤ 1.25)"
        )


if __name__ == "__main__":
    main()
