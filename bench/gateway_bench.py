"""Gateway benchmark (`make bench-gateway`): does `llmop-router`'s gateway hold each tenant to
its limits across two router replicas, meter exactly, survive a store outage, and what it costs.

The rig, all on loopback (shared/reference/gateway.md section 9.1): a real `redis-server`
(tests/support/redis.py), two simulator engines (`--max-num-seqs 8`, the default 20 ms decode
step + 0.15 ms per running sequence), two `llmop-router serve --static … --static-tenants …
--store redis://… --replicas 2` (the chart's two replicas), one more router with the gateway
off (the floor of scenario G), and a counting proxy in front of the engines for model
`llama-counted` (how many of a tenant's requests the engines hold at once, exactly: it counts
a request from when it reaches the proxy until the engine's answer has gone through it, a
superset of the engine's own time). Each tenant's client is a pool of keep-alive connections
split evenly over the two routers' ports (kube-proxy pins a connection to one pod), sending
open-loop Poisson arrivals and recording, per request, its send time, status, the rate-limit
headers, time to the first token and the `usage` it saw. Every PASS/FAIL is computed from
those records, the routers' `/metrics`, Redis and the counting proxy.

Scenarios (section 9.2 of the design; each prints a table, target beside the measurement):
  A1  request limit: tenant H (120 rpm, burst 5 s) offers 10x through both routers, tenant L
      streams at 1 req/s beside it (and alone before and after, its TTFT floor).
  B1  token limit: 12,000 tokens/min, 100-token prompts + 64 output tokens, offered 10x.
  B2  the same limit with answers that end early (the simulators' `--sim-eos-probability`,
      requests without `ignore_eos`): 64 output tokens reserved, fewer used, the rest
      refunded at settlement; the admitted usage per minute within 5 %.
  B3  concurrency cap 4 under 32 streams, 20 % aborted mid-stream, one router SIGKILLed and
      restarted mid-run; then the tenant's live leases in Redis until they are 0.
  E   metering: the routers' token and cost counters against the usage the clients saw
      (A1's and B1's tenants, and a mix of JSON, streamed-with-usage, streamed-without and
      aborted answers).
  F1  Redis stopped for 20 s (SIGTERM, then started again empty) under an A1-like load
      (FailOpen): client 5xx, admitted share during the outage, recovery, store errors.
  F2  the same with Redis stalled (SIGSTOP/SIGCONT: calls time out; nothing is lost), and the
      usage Redis holds afterwards against the clients' (none lost, none counted twice).
  G   auth: 1,000 requests each with no key, a wrong key, an expired key, a forbidden model,
      with a raw keep-alive HTTP/1.1 client, beside the floor (a 404 of the gateway-off router).
  H   overhead: TTFT through the router with the gateway off and on (bench/router_bench.py's
      fixed-pace engine and load), at 10, 50 and 200 streams, with where the admission's time
      went (the router's own store histogram beside Redis' PING time from a bare client).

    python bench/gateway_bench.py [--only A1,B1,B2,B3,E,F1,F2,G,H] [--scale 0.3] [--logs DIR]
        [--strict]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import uvloop
import yaml
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import router_bench
from llmop_router.contract import api_key_hash
from llmop_router.store import tenant_key
from router_bench import start, stop_all, wait_listening
from support.harness.replicas import cpu_seconds, free_port
from support.redis import RedisServer

MODEL = "llama"
COUNTED = "llama-counted"
"""The same engines behind the counting proxy (scenario B3 and G's forbidden model)."""
PRICE_IN = Decimal("0.10")
PRICE_OUT = Decimal("0.30")
PRICING = {"currency": "USD", "inputPerMillion": str(PRICE_IN), "outputPerMillion": str(PRICE_OUT)}
EOS_PROBABILITY = 0.03
"""The simulators end an answer at each token with this chance (decided by the context, so a
prompt's answer always has the same length) unless the request sets `ignore_eos`, as every
scenario's requests do but B2's: a mean of ~29 of 64 tokens."""
ENGINE_ARGS = (
    "--max-num-seqs",
    "8",
    "--sim-load-seconds",
    "0",
    "--sim-eos-probability",
    str(EOS_PROBABILITY),
)
CONNECTIONS = 8
"""Keep-alive connections per tenant, half to each router (section 9.1)."""

RPM = 120
BURST_S = 5
TPM = 12_000
B1_PROMPT_CHARS = 400
"""100 tokens both by the router's estimate (ceil(chars / 4)) and the simulator's count of a
`prompt`, so the token estimate is exact and B1 measures the bucket, not the estimate."""
B1_MAX_TOKENS = 64
CONCURRENCY = 4


def key_of(tenant: str) -> str:
    return f"llmop_bench_{tenant}_00112233445566778899aabbccddeeff"


EXPIRED_KEY = "llmop_bench_expired_00112233445566778899aabbccddeeff"


def tenant_objects() -> list[dict[str, Any]]:
    """The LLMTenants of every scenario (one per role, so their counters never mix)."""
    rate = {"requestsPerMinute": RPM, "burstSeconds": BURST_S}
    specs: dict[str, dict[str, Any]] = {
        "a1-heavy": {"limits": rate},
        "a1-light": {"limits": rate},
        "b1-tokens": {"limits": {"tokensPerMinute": TPM, "burstSeconds": BURST_S}},
        "b2-early": {"limits": {"tokensPerMinute": TPM, "burstSeconds": BURST_S}},
        "b3-concurrency": {"models": [COUNTED], "limits": {"maxConcurrentRequests": CONCURRENCY}},
        "e-meter": {},
        "e-abort": {},
        "f-stopped": {"limits": rate},
        "f-stalled": {"limits": rate},
        "g-auth": {"models": [MODEL]},
    }
    objects = []
    for name, spec in specs.items():
        keys = [{"name": "main", "sha256": api_key_hash(key_of(name))}]
        if name == "g-auth":
            keys.append(
                {
                    "name": "old",
                    "sha256": api_key_hash(EXPIRED_KEY),
                    "notAfter": "2020-01-01T00:00:00Z",
                }
            )
        objects.append(
            {
                "apiVersion": "serving.llmop.dev/v1alpha1",
                "kind": "LLMTenant",
                "metadata": {"name": name},
                "spec": {"apiKeys": keys, "models": spec.get("models", ["*"]), **spec},
            }
        )
    return objects


@dataclass(frozen=True)
class Durations:
    light_alone: float = 20
    """Seconds of L alone, before A1 and again after it."""
    a1: float = 130
    steady_from: float = 10
    """Seconds into A1/B1 where the steady state starts (the burst is spent in the first)."""
    b1: float = 125
    b3: float = 45
    b3_kill_at: float = 12
    e_per_kind: int = 80
    f_before: float = 15
    f_outage: float = 20
    f_after: float = 30
    g_requests: int = 1000
    h_seconds: float = 6
    h_rounds: int = 3

    def scaled(self, k: float) -> Durations:
        if k == 1:
            return self
        return Durations(
            light_alone=self.light_alone * k,
            a1=self.a1 * k,
            steady_from=self.steady_from * k,
            b1=self.b1 * k,
            b3=self.b3 * k,
            b3_kill_at=self.b3_kill_at * k,
            e_per_kind=max(5, int(self.e_per_kind * k)),
            f_before=self.f_before * k,
            f_outage=self.f_outage * k,
            f_after=max(10.0, self.f_after * k),
            g_requests=max(50, int(self.g_requests * k)),
            h_seconds=self.h_seconds * k,
            h_rounds=max(1, int(self.h_rounds * k)),
        )


# --- results ------------------------------------------------------------------------------------


@dataclass
class Check:
    what: str
    measured: str
    target: str
    ok: bool | None
    """None: reported, not judged."""


@dataclass
class Table:
    name: str
    title: str
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, what: str, measured: str, target: str = "-", ok: bool | None = None) -> None:
        self.checks.append(Check(what, measured, target, ok))

    def print(self) -> None:
        print(f"\n### {self.name}: {self.title}\n")
        print("| check | measured | target | result |")
        print("|---|---|---|---|")
        for c in self.checks:
            verdict = "-" if c.ok is None else ("PASS" if c.ok else "**FAIL**")
            print(f"| {c.what} | {c.measured} | {c.target} | {verdict} |")
        for note in self.notes:
            print(f"\n{note}")
        sys.stdout.flush()

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.ok is False]


def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile (q in 0..1); nan when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def max_in_window(
    times: Sequence[float], width: float, weights: Sequence[int] | None = None
) -> int:
    """The most events (or weight) with times in any window [s, s + width)."""
    order = sorted(range(len(times)), key=lambda i: times[i])
    ts = [times[i] for i in order]
    ws = [1 if weights is None else weights[i] for i in order]
    best = total = lo = 0
    for hi in range(len(ts)):
        total += ws[hi]
        while ts[hi] - ts[lo] >= width:
            total -= ws[lo]
            lo += 1
        best = max(best, total)
    return best


class Busy:
    """The whole machine's CPU use between two reads of /proc/stat (others' work included: on
    a shared 2-core machine that is what the routers competed with)."""

    def __init__(self) -> None:
        self.start = self._read()

    @staticmethod
    def _read() -> tuple[int, int]:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + fields[4]
        return sum(fields), idle

    def percent(self) -> float:
        total, idle = self._read()
        spent = total - self.start[0]
        return 100.0 * (1 - (idle - self.start[1]) / spent) if spent else float("nan")


# --- the client ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ask:
    tenant: str
    model: str = MODEL
    prompt_chars: int = 100
    max_tokens: int = 16
    stream: bool = False
    include_usage: bool = False
    abort_after: int | None = None
    """Close the connection after this many content events (a client that gives up)."""
    ignore_eos: bool = True
    """False: the answer may end before `max_tokens` (the simulator's EOS)."""
    variant: int = 0
    """Written into the prompt's last characters (same length): a different answer length."""


@dataclass
class Record:
    tenant: str
    sent: float
    """Seconds since the scenario's start."""
    status: int = 0
    """0: no HTTP answer (refused, reset)."""
    latency: float = 0.0
    """Send → response headers."""
    ttft: float | None = None
    """Send → first content event (streams)."""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    events: int = 0
    usage_seen: bool = False
    aborted: bool = False
    retry_after: str | None = None
    retry_after_ms: str | None = None
    error: str = ""

    @property
    def admitted(self) -> bool:
        return self.status == 200


class Pool:
    """A tenant's client: `connections` keep-alive connections, split evenly over the routers'
    ports; requests take the ports in turn (so each router sees half)."""

    def __init__(self, ports: Sequence[int], connections: int = CONNECTIONS) -> None:
        per = max(1, connections // len(ports))
        timeout = aiohttp.ClientTimeout(total=120)
        self.sessions = [
            aiohttp.ClientSession(
                f"http://127.0.0.1:{port}",
                connector=aiohttp.TCPConnector(limit=per),
                timeout=timeout,
            )
            for port in ports
        ]
        self._turn = itertools.count()

    def next(self) -> aiohttp.ClientSession:
        return self.sessions[next(self._turn) % len(self.sessions)]

    async def __aenter__(self) -> Pool:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        for session in self.sessions:
            await session.close()


def body_of(ask: Ask) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": ask.model,
        "prompt": "x" * ask.prompt_chars,
        "max_tokens": ask.max_tokens,
    }
    if ask.variant:
        tag = str(ask.variant)
        body["prompt"] = "x" * max(0, ask.prompt_chars - len(tag)) + tag
    if ask.ignore_eos:
        body["ignore_eos"] = True
    if ask.stream:
        body["stream"] = True
        if ask.include_usage:
            body["stream_options"] = {"include_usage": True}
    return body


def take_usage(record: Record, usage: object) -> None:
    if isinstance(usage, dict):
        record.prompt_tokens = int(usage.get("prompt_tokens", 0))
        record.completion_tokens = int(usage.get("completion_tokens", 0))
        record.usage_seen = True


async def read_stream(
    answer: aiohttp.ClientResponse, ask: Ask, record: Record, started: float
) -> None:
    async for line in answer.content:
        if not line.startswith(b"data: "):
            continue
        data = line[6:].strip()
        if data == b"[DONE]":
            return
        event = json.loads(data)
        if event.get("choices"):
            record.events += 1
            if record.ttft is None:
                record.ttft = time.monotonic() - started
            if ask.abort_after is not None and record.events >= ask.abort_after:
                record.aborted = True
                answer.close()
                return
        take_usage(record, event.get("usage"))


async def send(
    session: aiohttp.ClientSession, ask: Ask, t0: float, key: str | None = None
) -> Record:
    started = time.monotonic()
    record = Record(ask.tenant, started - t0)
    headers = {"Authorization": f"Bearer {key or key_of(ask.tenant)}"}
    try:
        async with session.post("/v1/completions", json=body_of(ask), headers=headers) as answer:
            record.status = answer.status
            record.latency = time.monotonic() - started
            record.retry_after = answer.headers.get("Retry-After")
            record.retry_after_ms = answer.headers.get("retry-after-ms")
            if answer.status != 200:
                await answer.read()
            elif ask.stream:
                await read_stream(answer, ask, record, started)
            else:
                take_usage(record, (await answer.json()).get("usage"))
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        record.error = type(exc).__name__
    return record


async def open_loop(
    pool: Pool, make: Callable[[int], Ask], *, rate: float, seconds: float, t0: float, seed: int
) -> list[Record]:
    """Poisson arrivals at `rate` per second from `t0` for `seconds`, whatever the answers."""
    rng = random.Random(seed)
    tasks: list[asyncio.Task[Record]] = []
    at = 0.0
    for n in itertools.count():
        at += rng.expovariate(rate)
        if at >= seconds:
            break
        delay = t0 + at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(send(pool.next(), make(n), t0)))
    return list(await asyncio.gather(*tasks))


async def sleep_until(when: float) -> None:
    await asyncio.sleep(max(0.0, when - time.monotonic()))


# --- metrics ------------------------------------------------------------------------------------

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


async def scrape(
    session: aiohttp.ClientSession, admin_port: int
) -> list[tuple[str, dict[str, str], float]]:
    async with session.get(f"http://127.0.0.1:{admin_port}/metrics") as answer:
        text = await answer.text()
    samples = []
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match:
            labels = dict(LABEL.findall(match[2] or ""))
            samples.append((match[1], labels, float(match[3])))
    return samples


async def metric_sum(admin_ports: Sequence[int], name: str, **labels: str) -> float:
    """A family's samples summed over the routers, those carrying every label given."""
    total = 0.0
    async with aiohttp.ClientSession() as session:
        for port in admin_ports:
            for sample, have, value in await scrape(session, port):
                if sample == name and all(have.get(k) == v for k, v in labels.items()):
                    total += value
    return total


# --- the counting proxy -------------------------------------------------------------------------


@dataclass
class Count:
    now: int = 0
    most: int = 0
    total: int = 0
    changes: list[tuple[float, int]] = field(default_factory=list)

    def change(self, by: int) -> None:
        self.now += by
        self.most = max(self.most, self.now)
        self.total += max(0, by)
        self.changes.append((time.monotonic(), self.now))

    def above(self, cap: int) -> tuple[float, int]:
        """Seconds spent above `cap`, and how many times it went above."""
        seconds, times, since = 0.0, 0, None
        for at, n in self.changes:
            if n > cap and since is None:
                since, times = at, times + 1
            elif n <= cap and since is not None:
                seconds += at - since
                since = None
        if since is not None:
            seconds += time.monotonic() - since
        return seconds, times


def serve_counter(routes: Sequence[tuple[int, str]], admin_port: int) -> None:
    """Forward each port to its engine, counting the requests held by the engines together."""
    count = Count()

    async def main() -> None:
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

        def relay_to(upstream: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
            async def relay(request: web.Request) -> web.StreamResponse:
                body = await request.read()
                count.change(+1)
                try:
                    async with session.post(
                        f"http://{upstream}{request.path}",
                        data=body,
                        headers={"Content-Type": "application/json"},
                    ) as answer:
                        response = web.StreamResponse(
                            status=answer.status,
                            headers={"Content-Type": answer.headers.get("Content-Type", "")},
                        )
                        await response.prepare(request)
                        async for chunk in answer.content.iter_any():
                            await response.write(chunk)
                        await response.write_eof()
                        return response
                finally:
                    count.change(-1)

            return relay

        async def stats(request: web.Request) -> web.Response:
            seconds, times = count.above(int(request.query.get("cap", "1000000")))
            return web.json_response(
                {
                    "now": count.now,
                    "max": count.most,
                    "total": count.total,
                    "aboveSeconds": seconds,
                    "aboveTimes": times,
                }
            )

        async def reset(_request: web.Request) -> web.Response:
            count.most, count.total, count.changes = count.now, 0, [(time.monotonic(), count.now)]
            return web.json_response({"ok": True})

        for port, upstream in routes:
            app = web.Application()
            app.router.add_post("/{path:.*}", relay_to(upstream))
            # A request the router gave up on is cancelled here too (it left the engines).
            runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
        admin = web.Application()
        admin.router.add_get("/stats", stats)
        admin.router.add_post("/reset", reset)
        admin_runner = web.AppRunner(admin, access_log=None)
        await admin_runner.setup()
        await web.TCPSite(admin_runner, "127.0.0.1", admin_port).start()
        await asyncio.Event().wait()

    uvloop.run(main())


# --- the rig ------------------------------------------------------------------------------------


class Rig:
    """Redis, two simulators, the counting proxy, two gateway routers and a gateway-off one."""

    def __init__(self, workdir: Path) -> None:
        self.dir = workdir
        self.redis = RedisServer(log_dir=workdir / "redis")
        self.engine_ports = [free_port(), free_port()]
        self.counter_ports = [free_port(), free_port()]
        self.counter_admin = free_port()
        self.ports = [free_port(), free_port()]
        self.admin_ports = [free_port(), free_port()]
        self.plain_port, self.plain_admin = free_port(), free_port()
        self.table = workdir / "table.json"
        self.tenants = workdir / "tenants.yaml"
        self.routers: list[subprocess.Popen[bytes] | None] = [None, None]
        self.others: list[subprocess.Popen[bytes]] = []

    @property
    def engines(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.engine_ports]

    def write_files(self) -> None:
        counted = [f"127.0.0.1:{p}" for p in self.counter_ports]
        models = {
            MODEL: {
                "namespace": "team",
                "name": MODEL,
                "endpoints": self.engines,
                "pricing": PRICING,
            },
            COUNTED: {
                "namespace": "team",
                "name": COUNTED,
                "endpoints": counted,
                "pricing": PRICING,
            },
        }
        self.table.write_text(json.dumps({"models": models}))
        self.tenants.write_text(yaml.safe_dump_all(tenant_objects()))

    def router_argv(self, port: int, admin: int, gateway: bool) -> list[str]:
        argv = ["-m", "llmop_router", "serve", "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--admin-port", str(admin), "--static", str(self.table), "--shutdown-delay", "0"]
        if gateway:
            argv += ["--static-tenants", str(self.tenants), "--store", self.redis.url]
            argv += ["--store-on-error", "FailOpen", "--replicas", "2"]
        return argv

    def _process(self, argv: Sequence[str], log: str) -> subprocess.Popen[bytes]:
        with (self.dir / log).open("ab") as out:
            return subprocess.Popen([sys.executable, *argv], stdout=out, stderr=subprocess.STDOUT)

    def start_router(self, i: int) -> None:
        argv = self.router_argv(self.ports[i], self.admin_ports[i], gateway=True)
        self.routers[i] = self._process(argv, f"router-{i}.log")
        wait_listening(self.ports[i])
        wait_listening(self.admin_ports[i])

    def kill_router(self, i: int) -> None:
        process = self.routers[i]
        assert process is not None
        process.send_signal(signal.SIGKILL)
        process.wait()
        self.routers[i] = None

    def start(self) -> None:
        self.write_files()
        self.redis.start()
        for port in self.engine_ports:
            argv = ["-m", "llmop_engine", "simulate", MODEL, "--served-model-name", MODEL, COUNTED]
            self.others.append(
                start([*argv, "--host", "127.0.0.1", "--port", str(port), *ENGINE_ARGS])
            )
        routes = [f"{c}={e}" for c, e in zip(self.counter_ports, self.engines, strict=True)]
        counter = [str(Path(__file__).resolve()), "counter", "--admin", str(self.counter_admin)]
        self.others.append(self._process([*counter, *routes], "counter.log"))
        plain = self.router_argv(self.plain_port, self.plain_admin, gateway=False)
        self.others.append(self._process(plain, "router-plain.log"))
        for port in (*self.engine_ports, *self.counter_ports, self.counter_admin, self.plain_port):
            wait_listening(port)
        for i in range(2):
            self.start_router(i)

    def close(self) -> None:
        stop_all([p for p in (*self.routers, *self.others) if p is not None])
        self.redis.close()

    async def engine_requests(self) -> int:
        total = 0
        async with aiohttp.ClientSession() as session:
            for port in self.engine_ports:
                async with session.get(f"http://127.0.0.1:{port}/sim/stats") as answer:
                    total += int((await answer.json())["requestsTotal"])
        return total

    async def counter(self, path: str, method: str = "GET") -> dict[str, Any]:
        async with (
            aiohttp.ClientSession() as session,
            session.request(method, f"http://127.0.0.1:{self.counter_admin}{path}") as answer,
        ):
            found: dict[str, Any] = await answer.json()
            return found


@contextlib.contextmanager
def rig_running(logs: Path | None) -> Iterator[Rig]:
    workdir = logs or Path(tempfile.mkdtemp(prefix="llmop-gateway-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    rig = Rig(workdir)
    try:
        rig.start()
        yield rig
    finally:
        rig.close()
        if logs is None:
            shutil.rmtree(workdir, ignore_errors=True)


# --- shared measurements ------------------------------------------------------------------------


def per_minute(
    times: Sequence[float], weights: Sequence[int], begin: float, end: float
) -> list[int]:
    """The weight of the events in each whole minute from `begin`; with less than a minute, the
    rate over what there is, per minute."""
    if end - begin < 60:
        got = sum(w for t, w in zip(times, weights, strict=True) if begin <= t < end)
        return [round(got * 60 / (end - begin))] if end > begin else []
    out = []
    start_ = begin
    while start_ + 60 <= end + 1e-9:
        out.append(sum(w for t, w in zip(times, weights, strict=True) if start_ <= t < start_ + 60))
        start_ += 60
    return out


def within(value: float, target: float, tolerance: float) -> bool:
    return abs(value - target) <= tolerance * target


def limit_checks(
    table: Table,
    who: str,
    records: Sequence[Record],
    *,
    per_minute_limit: int,
    cost: Callable[[Record], int],
    unit: str,
    seconds: float,
    steady_from: float,
    tolerance: float = 0.02,
) -> None:
    """A rate limit's accuracy from the records: per steady minute, and at most rate x t + burst
    over any window (send times; GCRA admits at most 1 + (t + burst) / interval in t)."""
    admitted = [r for r in records if r.admitted]
    times = [r.sent for r in admitted]
    weights = [cost(r) for r in admitted]
    minutes = per_minute(times, weights, steady_from, seconds)
    low, high = per_minute_limit * (1 - tolerance), per_minute_limit * (1 + tolerance)
    table.add(
        f"{who} admitted {unit} per minute, steady state ({steady_from:.0f}-{seconds:.0f} s)",
        ", ".join(str(m) for m in minutes) or "-",
        f"{per_minute_limit} ± {tolerance * 100:.0f} % ({low:.0f}-{high:.0f})",
        bool(minutes) and all(low <= m <= high for m in minutes),
    )
    rate = per_minute_limit / 60
    one = max(weights) if weights else 0
    for width in (1.0, 10.0, 60.0):
        if width > seconds:
            continue
        most = max_in_window(times, width, weights)
        bound = rate * width + rate * BURST_S + one
        table.add(
            f"{who} most {unit} admitted in any {width:.0f} s",
            str(most),
            f"≤ rate x t + burst = {bound:.0f}",
            most <= bound,
        )


def refusal_checks(table: Table, who: str, records: Sequence[Record]) -> None:
    refused = [r for r in records if r.status == 429]
    headed = [
        r
        for r in refused
        if r.retry_after is not None
        and r.retry_after_ms is not None
        and int(r.retry_after) == math.ceil(int(r.retry_after_ms) / 1000)
    ]
    share = 100.0 * len(headed) / len(refused) if refused else float("nan")
    waits = [int(r.retry_after_ms) for r in refused if r.retry_after_ms]
    table.add(
        f"{who} 429s with Retry-After = ⌈retry-after-ms⌉",
        f"{len(headed)} of {len(refused)} ({share:.1f} %); retry-after-ms median "
        f"{pct(waits, 0.5):.0f}, max {max(waits, default=0)}",
        "100 %",
        len(headed) == len(refused),
    )
    other = [r for r in records if r.status not in (200, 429) or r.error]
    table.add(
        f"{who} answers other than 200/429 (5xx, resets)",
        f"{len(other)} of {len(records)}" + (f" ({describe_failures(other)})" if other else ""),
        "0",
        not other,
    )


async def store_errors(rig: Rig) -> float:
    return await metric_sum(rig.admin_ports, "llmop_gateway_store_errors_total")


def healthy_store_check(table: Table, errors: float) -> None:
    table.add(
        "store errors with Redis up (a call that failed or passed --store-timeout-ms)",
        f"{errors:.0f}",
        "0 (else requests were admitted by the local 1/2 split)",
        errors == 0,
    )


def describe_failures(records: Sequence[Record]) -> str:
    kinds: dict[str, int] = {}
    for r in records:
        name = r.error or str(r.status)
        kinds[name] = kinds.get(name, 0) + 1
    return ", ".join(f"{k} x {v}" for k, v in sorted(kinds.items()))


def ms(seconds: float, digits: int = 1) -> str:
    return f"{seconds * 1000:.{digits}f}"


# --- A1: request limit --------------------------------------------------------------------------


async def scenario_a1(rig: Rig, d: Durations, meter: Table) -> Table:
    table = Table(
        "A1",
        f"request limit through both routers: H {RPM} rpm (burst {BURST_S} s) offered 10x "
        f"(20 req/s, non-streaming, 8 connections over 2 routers) for {d.a1:.0f} s; L streams "
        f"1 req/s beside it (and alone for {d.light_alone:.0f} s before and after)",
    )

    def light(_n: int) -> Ask:
        return Ask("a1-light", stream=True, max_tokens=16)

    def heavy(_n: int) -> Ask:
        return Ask("a1-heavy", max_tokens=16)

    busy = Busy()
    async with Pool(rig.ports) as pool:
        alone = await open_loop(
            pool, light, rate=1.0, seconds=d.light_alone, t0=time.monotonic(), seed=1
        )
    busy_alone = busy.percent()
    cpu = [cpu_seconds(p.pid) for p in rig.routers if p is not None]
    errors = await store_errors(rig)
    busy = Busy()
    async with Pool(rig.ports) as light_pool, Pool(rig.ports) as heavy_pool:
        t0 = time.monotonic()
        heavy_records, light_records = await asyncio.gather(
            open_loop(heavy_pool, heavy, rate=20.0, seconds=d.a1, t0=t0, seed=2),
            open_loop(light_pool, light, rate=1.0, seconds=d.a1, t0=t0, seed=3),
        )
    busy_a1 = busy.percent()
    router_cpu = sum(cpu_seconds(p.pid) for p in rig.routers if p is not None) - sum(cpu)
    # L alone again: the machine's other work drifts, so the floor is taken on both sides.
    busy = Busy()
    async with Pool(rig.ports) as pool:
        alone += await open_loop(
            pool, light, rate=1.0, seconds=d.light_alone, t0=time.monotonic(), seed=4
        )
    busy_alone = (busy_alone + busy.percent()) / 2
    sent = len(heavy_records) + len(light_records)
    limit_checks(
        table,
        "H",
        heavy_records,
        per_minute_limit=RPM,
        cost=lambda _r: 1,
        unit="requests",
        seconds=d.a1,
        steady_from=d.steady_from,
    )
    refusal_checks(table, "H", heavy_records)
    healthy_store_check(table, await store_errors(rig) - errors)
    light_failed = [r for r in light_records if not r.admitted or r.error]
    table.add(
        "L rejections and failures",
        f"{len(light_failed)} of {len(light_records)}",
        "0",
        not light_failed,
    )
    alone_ttft = [r.ttft for r in alone if r.ttft is not None]
    beside_ttft = [r.ttft for r in light_records if r.ttft is not None]
    table.add(
        "L TTFT p50 / p99 ms, alone (before and after A1)",
        f"{ms(pct(alone_ttft, 0.5))} / {ms(pct(alone_ttft, 0.99))} ({len(alone_ttft)} requests)",
    )
    table.add(
        "L TTFT p50 / p99 ms, beside H",
        f"{ms(pct(beside_ttft, 0.5))} / {ms(pct(beside_ttft, 0.99))} ({len(beside_ttft)} requests)",
        f"p99 ≤ alone + 10 ms = {ms(pct(alone_ttft, 0.99) + 0.010)}",
        pct(beside_ttft, 0.99) <= pct(alone_ttft, 0.99) + 0.010,
    )
    table.add(
        "H requests sent / admitted; both routers' CPU",
        f"{len(heavy_records)} / {sum(r.admitted for r in heavy_records)}; "
        f"{router_cpu:.1f} CPU-s ({router_cpu * 1000 / max(1, sent):.2f} ms a request)",
    )
    table.add(
        "machine CPU busy (2 cores, all processes)", f"alone {busy_alone:.0f} %, A1 {busy_a1:.0f} %"
    )
    await metering_rows(meter, rig, "a1-heavy", heavy_records, "A1 H (JSON answers)")
    return table


# --- B1: token limit ----------------------------------------------------------------------------


async def scenario_b1(rig: Rig, d: Durations, meter: Table) -> Table:
    per_request = B1_PROMPT_CHARS // 4 + B1_MAX_TOKENS
    allowed = TPM / per_request / 60
    table = Table(
        "B1",
        f"token limit: {TPM} tokens/min (burst {BURST_S} s), {B1_PROMPT_CHARS // 4}-token prompts "
        f"+ {B1_MAX_TOKENS} output tokens (estimate exact), offered 10x ({10 * allowed:.1f} "
        f"req/s, non-streaming, both routers) for {d.b1:.0f} s",
    )

    def ask(_n: int) -> Ask:
        return Ask("b1-tokens", prompt_chars=B1_PROMPT_CHARS, max_tokens=B1_MAX_TOKENS)

    busy = Busy()
    errors = await store_errors(rig)
    async with Pool(rig.ports) as pool:
        records = await open_loop(
            pool, ask, rate=10 * allowed, seconds=d.b1, t0=time.monotonic(), seed=4
        )

    def used(r: Record) -> int:
        return (r.prompt_tokens or 0) + (r.completion_tokens or 0)

    limit_checks(
        table,
        "B",
        records,
        per_minute_limit=TPM,
        cost=used,
        unit="tokens (Σ usage)",
        seconds=d.b1,
        steady_from=d.steady_from,
    )
    admitted = [r for r in records if r.admitted]
    exact = [r for r in admitted if used(r) == per_request]
    table.add(
        "admitted answers whose usage = the router's estimate",
        f"{len(exact)} of {len(admitted)}",
        "all (the simulator counts a prompt as the router estimates it)",
        len(exact) == len(admitted),
    )
    refusal_checks(table, "B", records)
    healthy_store_check(table, await store_errors(rig) - errors)
    table.add("machine CPU busy", f"{busy.percent():.0f} %")
    await metering_rows(meter, rig, "b1-tokens", records, "B1 (JSON answers)")
    return table


async def scenario_b2(rig: Rig, d: Durations, meter: Table) -> Table:
    """B1's limit with answers that end early: each admission reserves the prompt and all 64
    output tokens, settlement refunds what was not used, so the tenant gets its limit in
    tokens used, not in tokens reserved."""
    mean_out = (1 - (1 - EOS_PROBABILITY) ** B1_MAX_TOKENS) / EOS_PROBABILITY
    allowed = TPM / (B1_PROMPT_CHARS // 4 + mean_out) / 60
    table = Table(
        "B2",
        f"token limit with early-ending answers: {TPM} tokens/min (burst {BURST_S} s), "
        f"{B1_PROMPT_CHARS // 4}-token prompts, max_tokens {B1_MAX_TOKENS} reserved, ~"
        f"{mean_out:.0f} used (EOS chance {EOS_PROBABILITY} a token), offered 10x "
        f"({10 * allowed:.1f} req/s, non-streaming, both routers) for {d.b1:.0f} s",
    )

    def ask(n: int) -> Ask:
        return Ask(
            "b2-early",
            prompt_chars=B1_PROMPT_CHARS,
            max_tokens=B1_MAX_TOKENS,
            ignore_eos=False,
            variant=n + 1,
        )

    busy = Busy()
    errors = await store_errors(rig)
    async with Pool(rig.ports) as pool:
        records = await open_loop(
            pool, ask, rate=10 * allowed, seconds=d.b1, t0=time.monotonic(), seed=5
        )

    def used(r: Record) -> int:
        return (r.prompt_tokens or 0) + (r.completion_tokens or 0)

    limit_checks(
        table,
        "B",
        records,
        per_minute_limit=TPM,
        cost=used,
        unit="tokens (Σ usage)",
        seconds=d.b1,
        steady_from=d.steady_from,
        tolerance=0.05,
    )
    admitted = [r for r in records if r.admitted]
    outputs = [r.completion_tokens or 0 for r in admitted]
    early = sum(1 for o in outputs if o < B1_MAX_TOKENS)
    table.add(
        "admitted answers that ended before max_tokens; mean output tokens (reserved 64)",
        f"{early} of {len(admitted)}; {statistics.mean(outputs) if outputs else 0:.1f}",
        "most end early",
        bool(outputs) and early >= len(outputs) / 2,
    )
    refusal_checks(table, "B", records)
    healthy_store_check(table, await store_errors(rig) - errors)
    table.add("machine CPU busy", f"{busy.percent():.0f} %")
    await metering_rows(meter, rig, "b2-early", records, "B2 (early-ending JSON answers)")
    return table


# --- B3: concurrency cap ------------------------------------------------------------------------


async def live_leases(url: str, tenant: str) -> tuple[int, int]:
    """(leases not yet expired by Redis' own clock, every member of the set)."""
    import redis.asyncio as aioredis

    client: Any = aioredis.Redis.from_url(url)
    try:
        seconds, micros = await client.time()
        now_ms = seconds * 1000 + micros / 1000
        key = tenant_key(tenant, "lease")
        return int(await client.zcount(key, f"({now_ms}", "+inf")), int(await client.zcard(key))
    finally:
        await client.aclose()


async def scenario_b3(rig: Rig, d: Durations) -> Table:
    tenant = "b3-concurrency"
    table = Table(
        "B3",
        f"concurrency cap {CONCURRENCY}: 32 streaming clients (closed loop, 64 tokens, a 429 "
        f"waits its retry-after-ms), 20 % abort mid-stream, router 0 SIGKILLed at "
        f"{d.b3_kill_at:.0f} s and restarted 2 s later; {d.b3:.0f} s",
    )
    await rig.counter("/reset", "POST")
    t0 = time.monotonic()
    stop_at = t0 + d.b3
    killed: list[float] = []

    async def client(n: int, pool: Pool) -> list[Record]:
        rng = random.Random(100 + n)
        records = []
        while time.monotonic() < stop_at:
            abort = rng.randint(1, 32) if rng.random() < 0.2 else None
            ask = Ask(tenant, COUNTED, max_tokens=64, stream=True, abort_after=abort)
            record = await send(pool.next(), ask, t0)
            records.append(record)
            if record.status == 429 and record.retry_after_ms:
                await asyncio.sleep(int(record.retry_after_ms) / 1000 * rng.uniform(1.0, 1.2))
            elif record.status != 200 or record.error:
                await asyncio.sleep(0.2)
        return records

    async def killer() -> None:
        await sleep_until(t0 + d.b3_kill_at)
        rig.kill_router(0)
        killed.append(time.monotonic())
        await asyncio.sleep(2)
        await asyncio.to_thread(rig.start_router, 0)

    async with Pool(rig.ports, 32) as pool:
        done = await asyncio.gather(killer(), *(client(n, pool) for n in range(32)))
    records = [r for rs in done[1:] if isinstance(rs, list) for r in rs]
    ended = time.monotonic()
    counted = await rig.counter(f"/stats?cap={CONCURRENCY}")
    table.add(
        "most H requests at the engines at once (counting proxy)",
        f"{counted['max']} ({counted['total']} requests reached them; above {CONCURRENCY} for "
        f"{counted['aboveSeconds'] * 1000:.1f} ms in {counted['aboveTimes']} episodes)",
        f"≤ {CONCURRENCY}",
        counted["max"] <= CONCURRENCY,
    )
    kinds = {
        "200 complete": sum(r.admitted and not r.aborted and not r.error for r in records),
        "200 aborted by the client": sum(r.aborted for r in records),
        "429": sum(r.status == 429 for r in records),
        "cut or refused (router killed)": sum(bool(r.error) for r in records),
        "other": sum(r.status not in (0, 200, 429) for r in records),
    }
    table.add(
        "client outcomes",
        ", ".join(f"{k}: {v}" for k, v in kinds.items()),
        "other: 0",
        kinds["other"] == 0,
    )
    while True:
        live, members = await live_leases(rig.redis.url, tenant)
        waited = time.monotonic() - killed[0]
        if live == 0 or waited > 90:
            break
        await asyncio.sleep(0.25)
    table.add(
        "live leases in Redis back to 0 (ZCOUNT of unexpired members)",
        f"{waited:.1f} s after the kill, {time.monotonic() - ended:.1f} s after the run "
        f"(ZCARD then {members}: expired members are pruned at the next admission)",
        "≤ 60 s after the kill (lease TTL)",
        live == 0 and waited <= 61,
    )
    async with Pool(rig.ports, 2) as pool:
        probes = [
            await send(pool.next(), Ask(tenant, COUNTED, max_tokens=4), time.monotonic())
            for _ in range(2)
        ]
    table.add(
        "a request through each router afterwards",
        ", ".join(str(p.status) for p in probes),
        "200, 200 (no stuck 429)",
        all(p.admitted for p in probes),
    )
    return table


# --- E: metering --------------------------------------------------------------------------------


async def settled(rig: Rig, tenant: str, expected: int) -> float:
    """Wait until the routers have settled `expected` answers of `tenant` (at most 10 s)."""
    deadline = time.monotonic() + 10
    while True:
        seen = await metric_sum(rig.admin_ports, "llmop_gateway_requests_total", tenant=tenant)
        if seen >= expected or time.monotonic() > deadline:
            return seen
        await asyncio.sleep(0.2)


async def metering_rows(
    meter: Table, rig: Rig, tenant: str, records: Sequence[Record], what: str
) -> None:
    """Σ the routers' token and cost counters against Σ the usage the clients saw."""
    admitted = [r for r in records if r.admitted]
    await settled(rig, tenant, len(admitted))
    seen = [r for r in admitted if r.usage_seen]
    prompt = sum(r.prompt_tokens or 0 for r in seen)
    output = sum(r.completion_tokens or 0 for r in seen)
    ports = rig.admin_ports
    metered_in = await metric_sum(ports, "llmop_gateway_tokens_total", tenant=tenant, kind="input")
    metered_in += await metric_sum(
        ports, "llmop_gateway_tokens_total", tenant=tenant, kind="cached_input"
    )
    metered_out = await metric_sum(
        ports, "llmop_gateway_tokens_total", tenant=tenant, kind="output"
    )
    meter.add(
        f"{what}: tokens in / out, counters vs clients",
        f"{metered_in:.0f} / {metered_out:.0f} vs {prompt} / {output} ({len(seen)} answers)",
        "equal",
        len(seen) == len(admitted) and metered_in == prompt and metered_out == output,
    )
    cost = Decimal(
        repr(await metric_sum(ports, "llmop_gateway_cost_total", tenant=tenant, currency="USD"))
    )
    expected = (prompt * PRICE_IN + output * PRICE_OUT) / Decimal(1_000_000)
    error = abs(cost - expected) / expected if expected else Decimal(0)
    meter.add(
        f"{what}: cost, counter vs Σ usage x price",
        f"{cost:.12g} vs {expected:.12g} USD (relative {float(error):.1e})",
        "≤ 1e-9 relative",
        error <= Decimal("1e-9"),
    )


async def scenario_e(rig: Rig, d: Durations, meter: Table) -> Table:
    n = d.e_per_kind
    rng = random.Random(5)
    kinds = {
        "JSON": (False, False),
        "stream + include_usage": (True, True),
        "stream, usage not asked": (True, False),
    }
    asks = [
        Ask(
            "e-meter",
            prompt_chars=rng.randint(20, 2000),
            max_tokens=rng.randint(1, 48),
            stream=stream,
            include_usage=usage,
        )
        for stream, usage in kinds.values()
        for _ in range(n)
    ]
    aborts = [
        Ask(
            "e-abort",
            prompt_chars=rng.randint(20, 2000),
            max_tokens=48,
            stream=True,
            abort_after=rng.randint(1, 24),
        )
        for _ in range(max(5, n // 4))
    ]
    rng.shuffle(asks)
    queue = iter([*asks, *aborts])
    records: list[tuple[Ask, Record]] = []
    async with Pool(rig.ports) as pool:
        t0 = time.monotonic()

        async def worker() -> None:
            for ask in queue:
                records.append((ask, await send(pool.next(), ask, t0)))

        await asyncio.gather(*(worker() for _ in range(CONNECTIONS)))
    meter.add(
        "E mix: answers",
        f"{len(asks)} to e-meter ({n} each: {', '.join(kinds)}; prompts 5-500 tokens, 1-48 "
        f"output), {len(aborts)} aborted streams to e-abort",
    )
    hidden = [
        (a, r) for a, r in records if a.tenant == "e-meter" and a.stream and not a.include_usage
    ]
    failed = [r for _a, r in records if not r.admitted or r.error]
    meter.add("E mix: failed answers", str(len(failed)), "0", not failed)
    leaked = sum(r.usage_seen for _a, r in hidden)
    meter.add(
        "streams that did not ask for usage and got a usage event",
        f"{leaked} of {len(hidden)}",
        "0 (the router strips what it injected)",
        leaked == 0,
    )
    # Those answers' usage is known without seeing it: the simulator counts a prompt as
    # ceil(chars / 4) and sends one event per generated token.
    for a, r in hidden:
        r.prompt_tokens = math.ceil(a.prompt_chars / 4)
        r.completion_tokens = r.events
        r.usage_seen = True
    mine = [r for a, r in records if a.tenant == "e-meter"]
    await metering_rows(
        meter, rig, "e-meter", mine, "E mix, all answers (the usage-less streams by their events)"
    )
    aborted = [(a, r) for a, r in records if a.tenant == "e-abort"]
    await settled(rig, "e-abort", len(aborted))
    ports = rig.admin_ports
    relayed = sum(r.events for _a, r in aborted)
    metered = await metric_sum(ports, "llmop_gateway_tokens_total", tenant="e-abort", kind="output")
    estimated = await metric_sum(ports, "llmop_gateway_tokens_estimated_total", tenant="e-abort")
    meter.add(
        "aborted streams: output tokens metered vs content events the clients read",
        f"{metered:.0f} vs {relayed} (estimated-tokens counter {estimated:.0f})",
        f"within ± 2 a stream (± {2 * len(aborted)})",
        abs(metered - relayed) <= 2 * len(aborted),
    )
    return meter


# --- F: store outage ----------------------------------------------------------------------------


async def sample_degraded(
    rig: Rig, stop: asyncio.Event, samples: list[tuple[float, float]], t0: float
) -> None:
    while not stop.is_set():
        with contextlib.suppress(aiohttp.ClientError):
            degraded = await metric_sum(rig.admin_ports, "llmop_gateway_store_degraded")
            samples.append((time.monotonic() - t0, degraded))
        await asyncio.sleep(0.25)


@dataclass
class Outage:
    """One store outage under load: the records, when it began and ended (seconds since t0), the
    routers' degraded gauge over time, and their store errors."""

    records: list[Record]
    down: float
    up: float
    total: float
    degraded: list[tuple[float, float]]
    errors: float


async def outage(rig: Rig, d: Durations, tenant: str, *, stall: bool) -> Outage:
    """`tenant` offered 20 req/s through both routers; the store stopped (SIGTERM, then started
    again empty) or stalled (SIGSTOP, then SIGCONT: every call hangs until it times out)."""
    total = d.f_before + d.f_outage + d.f_after
    errors_before = await metric_sum(rig.admin_ports, "llmop_gateway_store_errors_total")
    stop = asyncio.Event()
    samples: list[tuple[float, float]] = []
    async with Pool(rig.ports) as pool:
        t0 = time.monotonic()
        sampler = asyncio.create_task(sample_degraded(rig, stop, samples, t0))
        load = asyncio.create_task(
            open_loop(pool, lambda _n: Ask(tenant), rate=20.0, seconds=total, t0=t0, seed=6)
        )
        await sleep_until(t0 + d.f_before)
        await asyncio.to_thread(rig.redis.pause if stall else rig.redis.stop)
        down = time.monotonic() - t0
        await sleep_until(t0 + d.f_before + d.f_outage)
        await asyncio.to_thread(rig.redis.resume if stall else rig.redis.start)
        up = time.monotonic() - t0
        records = await load
        stop.set()
        await sampler
    errors = await metric_sum(rig.admin_ports, "llmop_gateway_store_errors_total") - errors_before
    return Outage(records, down, up, total, samples, errors)


def outage_checks(table: Table, o: Outage) -> None:
    admitted = [r.sent for r in o.records if r.admitted]
    rate = RPM / 60

    def count(a: float, b: float) -> int:
        return sum(a <= t < b for t in admitted)

    bad = [r for r in o.records if r.status >= 500 or r.error]
    table.add(
        "client 5xx and failures",
        f"{len(bad)} of {len(o.records)}" + (f" ({describe_failures(bad)})" if bad else ""),
        "0",
        not bad,
    )
    during = count(o.down, o.up)
    share = during / (rate * (o.up - o.down))
    table.add(
        f"admitted during the outage ({o.up - o.down:.1f} s)",
        f"{during} = {share:.2f} x the limit",
        "0.5-1.05 x the limit",
        0.5 <= share <= 1.05,
    )
    late = count(o.down + BURST_S, o.up)
    table.add(
        f"... leaving out its first {BURST_S} s (each router's local buckets start empty)",
        f"{late} = {late / (rate * (o.up - o.down - BURST_S)):.2f} x the limit",
    )
    back = next((t for t, v in o.degraded if t >= o.up and v == 0), float("nan"))
    table.add(
        "both routers back on Redis (store_degraded 0 on both)",
        f"{back - o.up:.1f} s after it returned",
        "≤ 5 s",
        back - o.up <= 5,
    )
    after_from = o.up + 5
    after = count(after_from, o.total)
    expected = rate * (o.total - after_from)
    table.add(
        f"admitted from 5 s after the return to the end ({o.total - after_from:.0f} s)",
        f"{after} (the limit: {expected:.0f}); in the first 5 s: {count(o.up, after_from)}",
        f"{expected:.0f} ± 2 % (± 1 request at least)",
        abs(after - expected) <= max(1.0, 0.02 * expected),
    )
    refusals = {
        "before": [r.latency for r in o.records if r.status == 429 and r.sent < o.down],
        "outage": [r.latency for r in o.records if r.status == 429 and o.down + 1 <= r.sent < o.up],
        "after": [r.latency for r in o.records if r.status == 429 and r.sent >= o.up + 5],
    }
    table.add(
        "429 latency p50 / p99 ms: before; in the outage from its 2nd second; after",
        "; ".join(f"{ms(pct(v, 0.5))} / {ms(pct(v, 0.99))}" for v in refusals.values()),
        "p50 in the outage ≤ before + 1 ms",
        pct(refusals["outage"], 0.5) <= pct(refusals["before"], 0.5) + 0.001,
    )
    table.add(
        "llmop_gateway_store_errors_total (both routers, this run)",
        f"{o.errors:.0f}",
        "> 0",
        o.errors > 0,
    )


async def stored_usage(url: str, tenant: str) -> dict[str, int]:
    import redis.asyncio as aioredis

    from llmop_router.gateway import month_of

    client: Any = aioredis.Redis.from_url(url, decode_responses=True)
    try:
        raw = await client.hgetall(tenant_key(tenant, f"usage:{month_of(time.time())}"))
        return {k: int(v) for k, v in raw.items()}
    finally:
        await client.aclose()


async def scenario_f1(rig: Rig, d: Durations) -> Table:
    table = Table(
        "F1",
        f"store stopped: f-stopped ({RPM} rpm, burst {BURST_S} s) offered 20 req/s for "
        f"{d.f_before + d.f_outage + d.f_after:.0f} s; redis-server stopped (SIGTERM) at "
        f"{d.f_before:.0f} s, started again {d.f_outage:.0f} s later (empty: no persistence); "
        "FailOpen, --replicas 2",
    )
    outage_checks(table, await outage(rig, d, "f-stopped", stall=False))
    return table


async def scenario_f2(rig: Rig, d: Durations) -> Table:
    tenant = "f-stalled"
    table = Table(
        "F2",
        f"store stalled: {tenant} as F1, redis-server SIGSTOPped for {d.f_outage:.0f} s (calls "
        "hang until --store-timeout-ms (250); nothing lost: then SIGCONT), and the usage Redis "
        "holds afterwards against the clients' (the usage hash is this tenant's alone)",
    )
    o = await outage(rig, d, tenant, stall=True)
    outage_checks(table, o)
    admitted = [r for r in o.records if r.admitted]
    want = {
        f"{MODEL}:in": sum(r.prompt_tokens or 0 for r in admitted),
        f"{MODEL}:out": sum(r.completion_tokens or 0 for r in admitted),
    }
    deadline = time.monotonic() + 15
    while True:  # usage kept through the outage is flushed once a call succeeds again
        stored = await stored_usage(rig.redis.url, tenant)
        got = {k: stored.get(k, 0) for k in want}
        if got == want or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    table.add(
        "usage in Redis afterwards, tokens in / out, vs Σ client usage",
        f"{got[f'{MODEL}:in']} / {got[f'{MODEL}:out']} vs {want[f'{MODEL}:in']} / "
        f"{want[f'{MODEL}:out']} ({len(admitted)} answers)",
        "equal (none lost, none counted twice)",
        got == want,
    )
    return table


# --- G: authentication --------------------------------------------------------------------------


class RawClient:
    """One keep-alive HTTP/1.1 connection, with nothing between the socket and the clock: the
    router's time, not a client library's, is what a 1 ms target can see."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, body: bytes, key: str | None, path: str = "/v1/completions") -> int:
        if self.writer is None or self.reader is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        auth = f"Authorization: Bearer {key}\r\n" if key else ""
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"{auth}Content-Length: {len(body)}\r\n\r\n"
        )
        self.writer.write(head.encode() + body)
        lines = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:] if h)}
        await self.reader.readexactly(int(headers.get("content-length", "0")))
        if headers.get("connection", "").lower() == "close":
            self.close()
        return status

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


@dataclass
class Timed:
    """One row of G: its client, what it sends, and what it measured."""

    what: str
    client: RawClient
    body: bytes
    key: str | None
    want: int
    latencies: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)

    async def run(self, count: int, *, keep: bool = True) -> None:
        for _ in range(count):
            started = time.perf_counter()
            status = await self.client.request(self.body, self.key)
            if keep:
                self.latencies.append(time.perf_counter() - started)
                self.statuses[status] = self.statuses.get(status, 0) + 1

    def summary(self) -> str:
        lat = self.latencies
        return (
            f"{ms(pct(lat, 0.5), 2)} / {ms(pct(lat, 0.99), 2)} / {ms(max(lat, default=0), 2)} "
            f"({', '.join(f'{s} x {c}' for s, c in self.statuses.items())})"
        )


G_BLOCKS = 10
"""Each row's requests are sent in this many blocks, the rows taking turns, so a burst of
other work on the machine lands on every row alike."""


async def scenario_g(rig: Rig, d: Durations) -> Table:
    n = d.g_requests
    table = Table(
        "G",
        f"authentication: {n} sequential requests per row (after 50 to warm up; the rows take "
        f"turns in {G_BLOCKS} blocks) each on its own keep-alive HTTP/1.1 connection to router "
        "0, body a 100-character completion; the floor: the gateway-off router",
    )
    engines_before = await rig.engine_requests()
    counted_before = (await rig.counter("/stats"))["total"]
    good = json.dumps(body_of(Ask("g-auth"))).encode()
    forbidden = json.dumps(body_of(Ask("g-auth", model=COUNTED))).encode()
    unknown = json.dumps(body_of(Ask("g-auth", model="no-such-model"))).encode()
    port, wrong = rig.ports[0], "llmop_bench_wrong_00112233445566778899aabbccddeeff"
    rows = [
        Timed("no key", RawClient(port), good, None, 401),
        Timed("wrong key", RawClient(port), good, wrong, 401),
        Timed("expired key", RawClient(port), good, EXPIRED_KEY, 401),
        Timed(
            "forbidden model (served, not in the tenant's list)",
            RawClient(port),
            forbidden,
            key_of("g-auth"),
            404,
        ),
        Timed("valid key, a model nobody serves", RawClient(port), unknown, key_of("g-auth"), 404),
    ]
    floor = Timed("floor", RawClient(rig.plain_port), unknown, None, 404)
    try:
        for row in (*rows, floor):
            await row.run(50, keep=False)
        for _ in range(G_BLOCKS):
            for row in (*rows, floor):
                await row.run(n // G_BLOCKS)
    finally:
        for row in (*rows, floor):
            row.client.close()
    for row in rows:
        table.add(
            f"{row.what} → {row.want}: p50 / p99 / max ms",
            row.summary(),
            f"all {row.want}; p99 ≤ 1 ms",
            row.statuses == {row.want: len(row.latencies)} and pct(row.latencies, 0.99) <= 0.001,
        )
    table.add("floor: gateway-off router, a model nobody serves → 404", floor.summary())
    reached = await rig.engine_requests() - engines_before
    reached += (await rig.counter("/stats"))["total"] - counted_before
    table.add("requests that reached an engine", str(reached), "0", reached == 0)
    refused = await metric_sum(rig.admin_ports, "llmop_gateway_rejected_total", tenant="-")
    table.add(
        'llmop_gateway_rejected_total{tenant="-"} (both routers)',
        f"{refused:.0f}",
        f"≥ {3 * (n + 50)}",
        refused >= 3 * (n + 50),
    )
    table.notes.append(
        "A revoked key (refused ≤ 2 s after the LLMTenant changes) needs the watched CRs, not "
        "a static file: not measured here."
    )
    return table


# --- H: overhead --------------------------------------------------------------------------------


H_STREAMS = (10, 50, 200)


@dataclass
class Diagnosis:
    """Where a gateway-on row's time went: the admission as the router timed it, and Redis as a
    bare client saw it at the same time."""

    admit_ms: float
    ping_p50_ms: float
    ping_p99_ms: float
    store_errors: float


def ping_store(port: int, seconds: float) -> None:
    """(Role `ping`.) PING the store every 5 ms over one connection for `seconds`; print the
    round trips' p50 and p99 in ms as JSON."""
    rtts = []
    with socket.create_connection(("127.0.0.1", port)) as conn:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            began = time.perf_counter()
            conn.sendall(b"PING\r\n")
            conn.recv(64)
            rtts.append(time.perf_counter() - began)
            time.sleep(0.005)
    print(json.dumps({"p50": pct(rtts, 0.5) * 1000, "p99": pct(rtts, 0.99) * 1000}))


def h_tenants(path: Path) -> None:
    """H's tenants: one with limits it never reaches (every request asks the store), and one
    without limits (only metered: its admission asks the store nothing)."""
    huge = {"requestsPerMinute": 10**9, "tokensPerMinute": 10**12, "maxConcurrentRequests": 10**6}
    documents = []
    for name, limits in (("h-overhead", huge), ("h-metered", None)):
        key = {"name": "main", "sha256": api_key_hash(key_of(name))}
        spec: dict[str, Any] = {"apiKeys": [key]}
        if limits is not None:
            spec["limits"] = limits
        documents.append({"metadata": {"name": name}, "spec": spec})
    path.write_text(yaml.safe_dump_all(documents))


def admit_seconds(admin_port: int) -> tuple[float, float, float]:
    """The router's admission histogram so far (sum of seconds, count), and its store errors."""
    name = "llmop_gateway_store_seconds"
    total = asyncio.run(metric_sum([admin_port], f"{name}_sum", op="admit"))
    count = asyncio.run(metric_sum([admin_port], f"{name}_count", op="admit"))
    return total, count, asyncio.run(metric_sum([admin_port], "llmop_gateway_store_errors_total"))


def scenario_h(rig: Rig, d: Durations) -> Table:
    """Gateway off and on over bench/router_bench.py's fixed-pace engine, with its load."""
    table = Table(
        "H",
        f"overhead: TTFT through one router, gateway off vs on (1 tenant, generous limits, the "
        f"rig's Redis), bench/router_bench.py's engine ({router_bench.CHUNKS} chunks "
        f"{router_bench.CHUNK_GAP * 1000:.0f} ms apart) and closed-loop streaming clients, "
        f"{d.h_seconds:.0f} s a row, median of {d.h_rounds} rounds",
    )
    tenants = rig.dir / "tenants-h.yaml"
    h_tenants(tenants)
    this = str(Path(__file__).resolve())
    engine_port, on_admin = free_port(), free_port()
    engine = start(
        [str(Path(router_bench.__file__).resolve()), "engine", "--port", str(engine_port)]
    )
    address = [f"127.0.0.1:{engine_port}"]
    off, off_port, off_table = router_bench.start_router(address)
    # The last --admin-port given wins: this one, so its histogram can be read.
    gateway = ["--static-tenants", str(tenants), "--store", rig.redis.url, "--replicas", "1"]
    on, on_port, on_table = router_bench.start_router(
        address, [*gateway, "--admin-port", str(on_admin)]
    )
    headers = {"Authorization": f"Bearer {key_of('h-overhead')}"}
    metered = {"Authorization": f"Bearer {key_of('h-metered')}"}
    paths = {
        "gateway off": (off, off_port, None),
        "gateway on": (on, on_port, headers),
        "gateway on, metered only": (on, on_port, metered),
    }
    results: list[router_bench.Result] = []
    diagnoses: dict[tuple[int, int], Diagnosis] = {}
    try:
        for port in (engine_port, off_port, on_port, on_admin):
            wait_listening(port)
        for _process, port, head in paths.values():  # warm the connections and code paths
            asyncio.run(router_bench.load(f"127.0.0.1:{port}", "warm", 20, 1.0, head))
        for round_ in range(d.h_rounds):
            for streams in H_STREAMS:
                for path, (process, port, head) in paths.items():
                    probe = None
                    if path == "gateway on":
                        admitted = admit_seconds(on_admin)
                        ping = [this, "ping", "--port", str(rig.redis.port), "--seconds"]
                        probe = subprocess.Popen(
                            [sys.executable, *ping, str(d.h_seconds)], stdout=subprocess.PIPE
                        )
                    before = cpu_seconds(process.pid)
                    result = asyncio.run(
                        router_bench.load(f"127.0.0.1:{port}", path, streams, d.h_seconds, head)
                    )
                    result.hop_cpu = cpu_seconds(process.pid) - before
                    result.round = round_
                    results.append(result)
                    if probe is not None:
                        rtt = json.loads(probe.communicate()[0])
                        now = admit_seconds(on_admin)
                        mean = (now[0] - admitted[0]) / max(1.0, now[1] - admitted[1])
                        diagnoses[(streams, round_)] = Diagnosis(
                            mean * 1000, rtt["p50"], rtt["p99"], now[2] - admitted[2]
                        )
    finally:
        stop_all([engine, off, on])
        os.unlink(off_table)
        os.unlink(on_table)
    overhead_rows(table, results, diagnoses, d.h_rounds)
    return table


def overhead_rows(
    table: Table,
    results: list[router_bench.Result],
    diagnoses: dict[tuple[int, int], Diagnosis],
    rounds: int,
) -> None:
    by = {(r.path, r.streams, r.round): r for r in results}
    median = statistics.median
    for streams in H_STREAMS:
        off = [by[("gateway off", streams, n)] for n in range(rounds)]
        on = [by[("gateway on", streams, n)] for n in range(rounds)]
        metered = [by[("gateway on, metered only", streams, n)] for n in range(rounds)]

        def cpu(rs: list[router_bench.Result]) -> float:
            return median((r.hop_cpu or 0) * 1000 / max(1, len(r.ttfts)) for r in rs)

        for name, rs in (("off", off), ("on", on), ("on, metered only", metered)):
            table.add(
                f"{streams} streams, gateway {name}: requests, errors, TTFT p50 / p99 ms, "
                "router CPU ms a request",
                f"{median(len(r.ttfts) for r in rs):.0f}, {median(r.errors for r in rs):.0f}, "
                f"{median(r.quantile(0.5) for r in rs) * 1000:.2f} / "
                f"{median(r.quantile(0.99) for r in rs) * 1000:.2f}, {cpu(rs):.2f}",
                "errors 0",
                all(r.errors == 0 for r in rs),
            )
        added = [(b.quantile(0.5) - a.quantile(0.5)) * 1000 for a, b in zip(off, on, strict=True)]
        table.add(
            f"{streams} streams: p50 TTFT added by the gateway",
            f"{median(added):+.2f} ms (rounds {', '.join(f'{x:+.2f}' for x in added)})",
            "≤ +1.5 ms",
            median(added) <= 1.5,
        )
        unlimited = [
            (b.quantile(0.5) - a.quantile(0.5)) * 1000 for a, b in zip(off, metered, strict=True)
        ]
        table.add(
            f"{streams} streams: p50 TTFT added for a tenant without limits (no store round trip)",
            f"{median(unlimited):+.2f} ms (rounds {', '.join(f'{x:+.2f}' for x in unlimited)})",
            "≤ +1.5 ms",
            median(unlimited) <= 1.5,
        )
        ratio = cpu(on) / cpu(off) if cpu(off) else float("nan")
        table.add(
            f"{streams} streams: router CPU per request, on / off",
            f"{ratio:.2f}x",
            "≤ 1.20x (design target)",
            ratio <= 1.2,
        )
        seen = [diagnoses[(streams, n)] for n in range(rounds)]
        table.add(
            f"{streams} streams: admission round trip as the router times it (mean); Redis PING "
            "from a bare client meanwhile (p50 / p99)",
            f"{median(x.admit_ms for x in seen):.2f} ms; {median(x.ping_p50_ms for x in seen):.2f}"
            f" / {median(x.ping_p99_ms for x in seen):.2f} ms",
        )
        errors = [x.store_errors for x in seen]
        table.add(
            f"{streams} streams: store errors with Redis up (each opens the breaker for 5 s: "
            "admission by the local split meanwhile)",
            ", ".join(f"{e:.0f}" for e in errors) + " (per round)",
            "0",
            not any(errors),
        )


# --- main ---------------------------------------------------------------------------------------

SCENARIOS = ("G", "A1", "B1", "B2", "E", "B3", "F1", "F2", "H")
"""In this order: E reads counters the B3 kill would lose, F1 empties Redis, H runs its own
routers (on the rig's Redis)."""


def run(rig: Rig, only: Sequence[str], d: Durations) -> list[Table]:
    """Each scenario in turn, its table printed as it ends; A1 and B1 add their metering rows
    to E's table, printed with E (or at the end when E itself is not run)."""
    meter = Table("E", "metering: the routers' counters (both, summed) against the clients' usage")
    tables: list[Table] = []
    steps: dict[str, Callable[[], Table]] = {
        "G": lambda: asyncio.run(scenario_g(rig, d)),
        "A1": lambda: asyncio.run(scenario_a1(rig, d, meter)),
        "B1": lambda: asyncio.run(scenario_b1(rig, d, meter)),
        "B2": lambda: asyncio.run(scenario_b2(rig, d, meter)),
        "E": lambda: asyncio.run(scenario_e(rig, d, meter)),
        "B3": lambda: asyncio.run(scenario_b3(rig, d)),
        "F1": lambda: asyncio.run(scenario_f1(rig, d)),
        "F2": lambda: asyncio.run(scenario_f2(rig, d)),
        "H": lambda: scenario_h(rig, d),
    }
    for name in SCENARIOS:
        if name not in only:
            continue
        began = time.monotonic()
        table = steps[name]()
        table.notes.append(f"({name}: {time.monotonic() - began:.0f} s wall)")
        if table is not meter or name == "E":
            table.print()
            tables.append(table)
    if "E" not in only and meter.checks:
        meter.print()
        tables.append(meter)
    return tables


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default=",".join(SCENARIOS), help="comma-separated scenarios")
    parser.add_argument(
        "--scale", type=float, default=1.0, help="durations x this (0.3: a quick look)"
    )
    parser.add_argument("--logs", type=Path, help="keep the processes' logs in this directory")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a check fails")
    sub = parser.add_subparsers(dest="role")
    counter = sub.add_parser("counter", help="(internal) the counting proxy")
    counter.add_argument("--admin", type=int, required=True)
    counter.add_argument("routes", nargs="+", help="PORT=HOST:PORT")
    ping = sub.add_parser("ping", help="(internal) Redis PING round trips")
    ping.add_argument("--port", type=int, required=True)
    ping.add_argument("--seconds", type=float, required=True)
    args = parser.parse_args()
    if args.role == "ping":
        ping_store(args.port, args.seconds)
        return
    if args.role == "counter":
        serve_counter([(int(p), u) for p, u in (r.split("=", 1) for r in args.routes)], args.admin)
        return
    only = [s.strip().upper() for s in args.only.split(",") if s.strip()]
    unknown = set(only) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}; known: {', '.join(SCENARIOS)}")
    d = Durations().scaled(args.scale)
    uvloop.install()
    began = time.monotonic()
    started = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"gateway bench: {os.cpu_count()} CPUs, everything on loopback (redis-server, 2 "
        "simulators, 2 gateway routers sharing Redis, a gateway-off router, the counting proxy, "
        "the clients)"
    )
    with rig_running(args.logs) as rig:
        tables = run(rig, only, d)
    failed = [(t.name, c.what) for t in tables for c in t.failed]
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"\n{sum(len(t.checks) for t in tables)} rows, {len(failed)} failed, "
        f"{time.monotonic() - began:.0f} s; load average at the end {load} (started {started})"
    )
    for name, what in failed:
        print(f"- FAIL {name}: {what}")
    if failed and args.strict:
        sys.exit(1)


if __name__ == "__main__":
    main()
