"""Router benchmark (`make bench-router`): what the router adds to time-to-first-token.

Three paths to one streaming engine, measured in the same run on this machine: `direct` (client →
engine), `passthrough` (client → a bare aiohttp streaming proxy: same HTTP stack and event loop,
no parsing, no routing) and `router` (client → `llmop-router`: reads the body, parses it, hashes
the conversation head, picks a pod). The engine is a fixed-pace SSE server (16 chunks 20 ms
apart), so the only thing that differs between rows is the hop. Each path runs C concurrent
streaming clients for D seconds, each request a 2 KiB system prompt plus its own question; the
paths take turns, `--repeat` rounds of them (3), and each figure is the median over the rounds.
Goals (issue 25): router p50 ≤ direct p50 + 2 ms, router p99 ≤ 1.25 times passthrough p99.

Routing quality (`--only workloads`): three simulator replicas (vLLM's prefix cache modelled, each
with a KV cache that holds about half of the workload's distinct prefixes, the fleet all of them),
driven once through `service` (a random replica per request, as kube-proxy spreads new
connections) and once through `router`, on three workloads: `multi-turn` (conversations sharing
one system prompt, each turn resending the history; every user sends its next turn the moment
an answer ends, so both paths run saturated and a faster path is offered more requests),
`multi-turn, 4 s think` (the same conversations with a pause between an answer and the next
turn, exponential with a 4 s mean, as people read and type: both paths are offered closer
loads, but a faster path still gets more), `multi-turn, 3 req/s` (the same conversations paced:
each user sends a turn every 8 s, or when the answer ends if later, so while a path keeps up
both are offered exactly 3 requests/s and TTFT compares at equal load; the requests column
shows a path that fell behind) and `system-prompts` (many one-turn users over a few long
system prompts; `system-prompts, 8 req/s` paced the same way, a request per user every 4 s).
`--workload NAME` runs only the named workloads. Reported: prefix-cache hit rate (the engines'
own counters), mean, p90 and p99 TTFT, the mean in flight per replica (running + waiting, from
the engines' metrics every 0.5 s), and the busiest replica's in-flight over the mean: averaged
over every sample with anything in flight, and over the samples where the mean is at least
`LOADED` (with the share of samples that were). Prints Markdown tables; not a timed test.

    python bench/router_bench.py [--only overhead|workloads] [--workload NAME]... [--streams 50,200]
        [--seconds 15] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import uvloop
from aiohttp import web

# The harness is test code (tests/support), shipped in no image.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.harness.replicas import cpu_seconds, free_port, port_open

CHUNKS = 16
CHUNK_GAP = 0.02
SYSTEM_PROMPT = "You answer questions about the llmop operator precisely. " * 36


# --- the processes ----------------------------------------------------------------------------


def _chunk(delta: dict[str, str], ids: list[int] | None, finish: str | None = None) -> bytes:
    """One event in vLLM's chat chunk shape (what the router parses for migration)."""
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    if ids is not None:
        choice["token_ids"] = ids
    doc = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "bench",
        "choices": [choice],
    }
    return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"


async def _engine(request: web.Request) -> web.StreamResponse:
    """A stand-in engine: `CHUNKS` chat chunks `CHUNK_GAP` apart, each with its token id when
    the request asks for ids (the router does for migration), as vLLM ≥ 0.10.2 does."""
    body = await request.json()
    with_ids = body.get("return_token_ids") is True
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(_chunk({"role": "assistant", "content": ""}, [] if with_ids else None))
    for i in range(CHUNKS - 1):
        finish = "stop" if i == CHUNKS - 2 else None
        await response.write(
            _chunk({"content": f" w{i}"}, [1000 + i] if with_ids else None, finish)
        )
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
    hop_cpu: float | None = None
    """CPU seconds the proxy in between (passthrough or router) spent on this row."""
    round: int = 0
    """Which round of `--repeat` measured it."""

    def quantile(self, q: float) -> float:
        if len(self.ttfts) < 2:
            return float("nan")
        return statistics.quantiles(self.ttfts, n=1000, method="inclusive")[int(q * 1000) - 1]


async def load(
    address: str,
    path: str,
    streams: int,
    seconds: float,
    headers: Mapping[str, str] | None = None,
) -> Result:
    """`streams` clients, each streaming one request after another for `seconds`; `headers`
    go with every request (an API key, for the gateway bench)."""
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
                        f"http://{address}/v1/chat/completions", json=payload, headers=headers
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


# --- routing quality ----------------------------------------------------------------------------

REPLICAS = 3
KV_BLOCKS = 4000
"""Per replica, 16-token blocks: under half of each workload's distinct prefixes (24 conversations
of up to ~6,500 tokens, about 9,000 blocks; 12 system prompts of 125 blocks for the other), so
the fleet holds them and one replica does not."""
PREFILL_TOKENS_PER_S = 5000
MAX_TOKENS = 24
USER_CHARS = 4000
"""Characters of each user message (about 1,000 tokens): the history, not the shared system
prompt, is most of a later turn's prompt."""
WORDS = (
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
)


def text(rng: random.Random, characters: int) -> str:
    out: list[str] = []
    size = 0
    while size < characters:
        word = rng.choice(WORDS)
        out.append(word)
        size += len(word) + 1
    return " ".join(out)


@dataclass
class Workload:
    name: str
    users: int
    system_prompts: list[str]
    turns: int
    """Turns per conversation (1: every request is a new conversation)."""
    think_seconds: float = 0.0
    """Mean pause between an answer and the user's next request (exponential; 0: none)."""
    pace_seconds: float = 0.0
    """A user's next request is sent this long after its previous one was (or when the answer
    ends, if later), from a random first offset: an offered load fixed by the workload, the same
    on every path while the path keeps up (0: none)."""


def workloads() -> list[Workload]:
    rng = random.Random(42)
    shared = text(rng, 2000)
    prompts = [text(rng, 8000) for _ in range(6)]
    return [
        Workload("multi-turn", users=24, system_prompts=[shared], turns=6),
        Workload(
            "multi-turn, 4 s think", users=24, system_prompts=[shared], turns=6, think_seconds=4.0
        ),
        Workload(
            "multi-turn, 3 req/s", users=24, system_prompts=[shared], turns=6, pace_seconds=8.0
        ),
        Workload("system-prompts", users=32, system_prompts=prompts, turns=1),
        Workload(
            "system-prompts, 8 req/s", users=32, system_prompts=prompts, turns=1, pace_seconds=4.0
        ),
    ]


@dataclass
class Served:
    ttfts: list[float]
    failed: int = 0


async def drive(workload: Workload, pick: Callable[[], str], seconds: float) -> Served:
    """Each user runs conversations back to back until the deadline; `pick` names where a
    request goes (`host:port`)."""
    served = Served([])
    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as client:

        async def user(n: int) -> None:
            rng = random.Random(n)
            if workload.pace_seconds:
                await asyncio.sleep(rng.uniform(0, workload.pace_seconds))
            while time.monotonic() < deadline:
                system = rng.choice(workload.system_prompts)
                messages = [{"role": "system", "content": system}]
                for turn in range(workload.turns):
                    if time.monotonic() >= deadline:
                        return
                    messages.append(
                        {
                            "role": "user",
                            "content": f"user {n} turn {turn}: " + text(rng, USER_CHARS),
                        }
                    )
                    sent = time.monotonic()
                    reply = await one(client, pick(), messages, served)
                    messages.append({"role": "assistant", "content": reply})
                    if workload.think_seconds:
                        await asyncio.sleep(rng.expovariate(1 / workload.think_seconds))
                    if workload.pace_seconds:
                        await asyncio.sleep(
                            max(0.0, sent + workload.pace_seconds - time.monotonic())
                        )

        await asyncio.gather(*(user(n) for n in range(workload.users)))
    return served


async def one(
    client: aiohttp.ClientSession, address: str, messages: list[dict[str, str]], served: Served
) -> str:
    payload = {"model": "bench", "stream": True, "max_tokens": MAX_TOKENS, "messages": messages}
    started = time.perf_counter()
    parts: list[str] = []
    try:
        async with client.post(f"http://{address}/v1/chat/completions", json=payload) as answer:
            if answer.status != 200:
                served.failed += 1
                return ""
            first = True
            async for line in answer.content:
                if not line.startswith(b"data: {"):
                    continue
                if first:
                    served.ttfts.append(time.perf_counter() - started)
                    first = False
                delta = json.loads(line[6:])["choices"][0].get("delta", {})
                parts.append(delta.get("content") or "")
    except aiohttp.ClientError:
        served.failed += 1
    return "".join(parts)


METRIC = re.compile(rb"^(vllm:[a-z_]+)\{[^}]*\} ([0-9.e+-]+)$", re.MULTILINE)


async def engine_metrics(client: aiohttp.ClientSession, address: str) -> dict[str, float]:
    async with client.get(f"http://{address}/metrics") as answer:
        body = await answer.read()
    return {m.group(1).decode(): float(m.group(2)) for m in METRIC.finditer(body)}


LOADED = 4.0
"""The balance that counts (issue 48: the busiest replica at most 1.3 times the mean) is taken
where the mean is at least this many in flight: below it one request more is a large ratio."""


async def sample_balance(
    addresses: list[str], stop: asyncio.Event, samples: list[tuple[float, float]]
) -> None:
    """Every 0.5 s: the busiest replica's and the mean replica's running + waiting."""
    async with aiohttp.ClientSession() as client:
        while not stop.is_set():
            loads = []
            for address in addresses:
                m = await engine_metrics(client, address)
                loads.append(
                    m.get("vllm:num_requests_running", 0) + m.get("vllm:num_requests_waiting", 0)
                )
            samples.append((max(loads), sum(loads) / len(loads)))
            await asyncio.sleep(0.5)


@dataclass
class QualityRow:
    workload: str
    path: str
    requests: int
    failed: int
    hit_rate: float
    mean_ttft: float
    p90_ttft: float
    p99_ttft: float
    mean_in_flight: float
    """Per replica, averaged over the samples."""
    balance: float
    """Busiest over mean, averaged over the samples with anything in flight."""
    balance_loaded: float
    """The same over the samples with a mean of at least `LOADED` (nan: none)."""
    loaded_share: float
    """The share of samples with a mean of at least `LOADED`."""


async def measure(
    workload: Workload, path: str, engines: list[str], router: str, seconds: float
) -> QualityRow:
    async with aiohttp.ClientSession() as client:
        before = [await engine_metrics(client, e) for e in engines]
    rng = random.Random(7)
    pick = (lambda: router) if path == "router" else (lambda: rng.choice(engines))
    stop = asyncio.Event()
    samples: list[tuple[float, float]] = []
    sampler = asyncio.create_task(sample_balance(engines, stop, samples))
    served = await drive(workload, pick, seconds)
    stop.set()
    await sampler
    async with aiohttp.ClientSession() as client:
        after = [await engine_metrics(client, e) for e in engines]

    def delta(name: str) -> float:
        return sum(a.get(name, 0) - b.get(name, 0) for a, b in zip(after, before, strict=True))

    queries = delta("vllm:prefix_cache_queries_total")
    ttfts = sorted(served.ttfts)
    ratios = [busiest / mean for busiest, mean in samples if mean > 0]
    loaded = [busiest / mean for busiest, mean in samples if mean >= LOADED]
    nan = float("nan")
    return QualityRow(
        workload.name,
        path,
        len(ttfts) + served.failed,
        served.failed,
        delta("vllm:prefix_cache_hits_total") / queries if queries else 0.0,
        statistics.fmean(ttfts) if ttfts else nan,
        ttfts[int(0.9 * (len(ttfts) - 1))] if ttfts else nan,
        ttfts[int(0.99 * (len(ttfts) - 1))] if ttfts else nan,
        statistics.fmean(mean for _, mean in samples) if samples else nan,
        statistics.fmean(ratios) if ratios else nan,
        statistics.fmean(loaded) if loaded else nan,
        len(loaded) / len(samples) if samples else 0.0,
    )


def run_workloads(seconds: float, only: Sequence[str] = ()) -> list[QualityRow]:
    rows: list[QualityRow] = []
    for workload in workloads():
        if only and workload.name not in only:
            continue
        for path in ("service", "router"):
            # Fresh engines per row: no row starts with another row's cache.
            ports = [free_port() for _ in range(REPLICAS)]
            engines = [f"127.0.0.1:{port}" for port in ports]
            processes = [
                start(
                    [
                        *("-m", "llmop_engine", "simulate", "bench"),
                        *("--host", "127.0.0.1", "--port", str(port)),
                        *("--sim-load-seconds", "0", "--sim-kv-blocks", str(KV_BLOCKS)),
                        *("--sim-prefill-tokens-per-s", str(PREFILL_TOKENS_PER_S)),
                        *("--max-model-len", "32768"),
                    ]
                )
                for port in ports
            ]
            router, router_port, table_file = start_router(engines)
            processes.append(router)
            try:
                for port in (*ports, router_port):
                    wait_listening(port)
                rows.append(
                    asyncio.run(
                        measure(workload, path, engines, f"127.0.0.1:{router_port}", seconds)
                    )
                )
            finally:
                stop_all(processes)
                os.unlink(table_file)
    return rows


def report_quality(rows: list[QualityRow], seconds: float) -> None:
    print(
        f"\nrouting quality: {REPLICAS} simulator replicas, {KV_BLOCKS} KV blocks each, prefill "
        f"{PREFILL_TOKENS_PER_S} tokens/s, {MAX_TOKENS} output tokens, {seconds:.0f} s per row\n"
    )
    header = (
        "workload | path | requests | failed | prefix hit % | mean TTFT ms | p90 TTFT ms | "
        f"p99 TTFT ms | mean in flight | max/mean in flight | max/mean where mean ≥ {LOADED:.0f} "
        "(share of time)"
    )
    print(f"| {header} |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r.workload} | {r.path} | {r.requests} | {r.failed} | {r.hit_rate * 100:.1f} | "
            f"{r.mean_ttft * 1000:.0f} | {r.p90_ttft * 1000:.0f} | {r.p99_ttft * 1000:.0f} | "
            f"{r.mean_in_flight:.1f} | {r.balance:.2f} | {r.balance_loaded:.2f} "
            f"({r.loaded_share * 100:.0f} %) |"
        )
    by = {(r.workload, r.path): r for r in rows}
    print()
    for workload in dict.fromkeys(r.workload for r in rows):
        service, router = by.get((workload, "service")), by.get((workload, "router"))
        if service is None or router is None:
            continue
        print(
            f"- {workload}: router/service mean TTFT {router.mean_ttft / service.mean_ttft:.2f}x, "
            f"p90 {router.p90_ttft / service.p90_ttft:.2f}x, hit rate "
            f"{router.hit_rate * 100:.1f} vs {service.hit_rate * 100:.1f} %, requests "
            f"{router.requests} vs {service.requests}"
        )


# --- orchestration ----------------------------------------------------------------------------


def wait_listening(port: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not port_open(port):
        if time.monotonic() > deadline:
            raise RuntimeError(f"nothing listens on :{port}")
        time.sleep(0.05)


def start_router(
    endpoints: Sequence[str], extra_args: Sequence[str] = ()
) -> tuple[subprocess.Popen[bytes], int, str]:
    """`llmop-router serve` over a static table routing model `bench` to `endpoints`, with
    `extra_args` (the gateway's, for the gateway bench): (process, port, the table file to
    delete afterwards)."""
    port = free_port()
    table = {"models": {"bench": {"namespace": "bench", "name": "bench", "endpoints": endpoints}}}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(table, handle)
    argv = ["-m", "llmop_router", "serve", "--host", "127.0.0.1", "--port", str(port)]
    # Its own admin port: two benches (or a router) on one machine must not collide on 8081.
    argv += ["--admin-port", str(free_port())]
    # No Service in front: stop at once on SIGTERM.
    argv += ["--static", handle.name, "--shutdown-delay", "0", *extra_args]
    return start(argv), port, handle.name


def start(argv: Sequence[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def stop_all(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        process.wait(timeout=15)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", default="50,200")
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="overhead: rounds of every path (each figure the median over them) [3]",
    )
    parser.add_argument("--only", choices=("overhead", "workloads"), default=None)
    parser.add_argument(
        "--workload",
        action="append",
        default=[],
        help="run only this workload (by name; repeatable); default: all",
    )
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

    if args.only != "overhead":
        quality = run_workloads(args.seconds * 2, args.workload)
        report_quality(quality, args.seconds * 2)
        if args.only == "workloads":
            return
    this = str(Path(__file__).resolve())
    engine_port, pass_port = free_port(), free_port()
    engine = f"127.0.0.1:{engine_port}"
    router, router_port, table_file = start_router([engine])
    # The same router with migration off: what parsing every event for migration costs.
    plain, plain_port, plain_table = start_router([engine], ["--migration-limit", "0"])
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
        router,
        plain,
    ]
    try:
        for port in (engine_port, pass_port, router_port, plain_port):
            wait_listening(port)
        paths = {
            "direct": f"127.0.0.1:{engine_port}",
            "passthrough": f"127.0.0.1:{pass_port}",
            "router": f"127.0.0.1:{router_port}",
            "router, migration off": f"127.0.0.1:{plain_port}",
        }
        hop = {
            "direct": None,
            "passthrough": processes[1].pid,
            "router": router.pid,
            "router, migration off": plain.pid,
        }
        results: list[Result] = []
        uvloop.install()
        for round_ in range(max(1, args.repeat)):
            for streams in (int(s) for s in args.streams.split(",")):
                for path, address in paths.items():
                    pid = hop[path]
                    cpu_before = cpu_seconds(pid) if pid else 0.0
                    result = asyncio.run(load(address, path, streams, args.seconds))
                    result.hop_cpu = cpu_seconds(pid) - cpu_before if pid else None
                    result.round = round_
                    results.append(result)
    finally:
        stop_all(processes)
        os.unlink(table_file)
        os.unlink(plain_table)
    report(results, args.seconds)


def report(results: list[Result], seconds: float) -> None:
    """One row per path and streams, each figure the median over the rounds; the added p50 and
    the p99 ratio are taken within each round (against that round's direct and passthrough)."""
    rounds = sorted({r.round for r in results})
    print(
        f"\nrouter bench: {CHUNKS} chunks {CHUNK_GAP * 1000:.0f} ms apart per answer, "
        f"{seconds:.0f} s per row, median of {len(rounds)} rounds, {os.cpu_count()} CPUs, "
        "engine, proxy and clients on this machine\n"
    )
    columns = (
        "path | streams | requests | errors | TTFT p50 ms | TTFT p99 ms | p50 added vs direct ms | "
        "proxy CPU ms per request"
    )
    print(f"| {columns} |")
    print("|---|---|---|---|---|---|---|---|")
    by = {(r.path, r.streams, r.round): r for r in results}
    rows = dict.fromkeys((r.path, r.streams) for r in results)
    median = statistics.median

    def added(r: Result) -> float:
        return (r.quantile(0.5) - by[("direct", r.streams, r.round)].quantile(0.5)) * 1000

    for path, streams in rows:
        runs = [by[(path, streams, n)] for n in rounds]
        cpus = [r.hop_cpu * 1000 / max(1, len(r.ttfts)) for r in runs if r.hop_cpu is not None]
        cpu = f"{median(cpus):.2f}" if cpus else "-"
        print(
            f"| {path} | {streams} | {median(len(r.ttfts) for r in runs):.0f} | "
            f"{median(r.errors for r in runs):.0f} | "
            f"{median(r.quantile(0.5) for r in runs) * 1000:.2f} | "
            f"{median(r.quantile(0.99) for r in runs) * 1000:.2f} | "
            f"{median(added(r) for r in runs):+.2f} | {cpu} |"
        )
    print()
    for streams in sorted({r.streams for r in results}):
        adds = [added(by[("router", streams, n)]) for n in rounds]
        ratios = [
            by[("router", streams, n)].quantile(0.99)
            / by[("passthrough", streams, n)].quantile(0.99)
            for n in rounds
        ]
        print(
            f"- {streams} streams: router adds {median(adds):.2f} ms to p50 TTFT (goal ≤ 2; "
            f"rounds {', '.join(f'{a:.2f}' for a in adds)}), p99 {median(ratios):.2f}x the bare "
            f"passthrough's (goal ≤ 1.25; rounds {', '.join(f'{x:.2f}' for x in ratios)})"
        )
        on, off = (
            median(
                r.hop_cpu * 1000 / max(1, len(r.ttfts))
                for n in rounds
                if (r := by[(path, streams, n)]).hop_cpu is not None
            )
            for path in ("router", "router, migration off")
        )
        print(
            f"  migration (every event parsed for it) costs the router {on - off:+.2f} ms CPU a "
            f"request: {on:.2f} vs {off:.2f} ms with it off"
        )


if __name__ == "__main__":
    main()
