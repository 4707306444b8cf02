"""Priority and fair sharing benchmark (`make bench-fairness`): when two simulator engines are
saturated, does an interactive tenant still get its first token fast, do batch tenants share
fairly, and is every refusal a 429 with Retry-After?

The rig, all on loopback: two simulator engines (`--max-num-seqs 8`: 16 slots in all; the
default 20 ms decode step + 0.15 ms per running sequence), two `llmop-router serve --static …
--static-tenants … --replicas 2 --store redis://…` (the chart's two replicas sharing a real
redis-server: each owns half of the slots and lends freed ones to the other when its waiting
work outranks), tenants without limits (the store's limits are not what is measured). Each
tenant's client is a pool of up to 512 keep-alive connections split evenly over the two routers
(never short of one), sending open-loop Poisson arrivals. The engines' `running` is sampled
every 100 ms (slot use).

Each configuration restarts the routers with its own files:
  before    the model's `maxNumSeqs` set past any load and the engines' readings off
            (`--engine-readings-seconds 0`): nothing waits in the router, every request goes to
            the engines' first-come-first-served queue (the router before the fair queue; the
            same load)
  static    `maxNumSeqs` 8, the classes of `strict`, but routers without a store: each holds
            its static half of the slots (no loans; the router before slots were lent)
  strict    `maxNumSeqs` 8: LLMPriorityClass interactive (value 100) over batch (value 0,
            queue.maxWaitSeconds 5)
  capped    the same, batch with maxSharePercent 88 (one of a router pod's 8 slots kept back)
  overplanned, plan only
            `strict`, but the plan says each engine runs 16 (`maxNumSeqs` 16) where it runs 8
            (a KV-bound engine, or one taking requests past the router), and the routers
            trust the plan (`--engine-readings-seconds 0`): half of what they send waits in
            the engines' first-come-first-served queues
  overplanned
            the same, the routers reading the engines' running and waiting counts (the
            default): an engine that queues gets fewer requests until it has room

Scenarios:
  P1  priority: two batch tenants at 2x capacity together (capacity measured first, closed
      loop), an interactive tenant streaming at 1 req/s; interactive success and TTFT, slot
      use, how batch was refused. Per config. 120 s each. Batch answers vary from 32 to 96
      tokens (mean 64): answers of one length that start in one engine step all end in one,
      so slots would free in waves that a waiting request must wait out (measured: one router
      holding all 16 slots, p99 881 ms over 120 s at 64 tokens each, 438 ms varied).
  P2  fairness: two backlogged batch tenants of one class, one sending twice the other, equal
      weights (Jain's index of their service per 10 s window, before and with the queue), then
      both sending alike with weights 2:1 (their service ratio); a light tenant below
      its fair share (0.2x capacity) beside a heavy one at 2x (its success), before and with
      the queue.
      120 s each.
  P3  fallback: `llama`'s engines stopped (connection refused) or failing (each answers 503,
      `--sim-fault refuse`), a fallback to an LLMExternalModel (a third simulator with its own
      `--api-key`, the "managed API"); a tenant allowed to fall back (`fallback: Allowed`) and
      one that is not (`Never`). Requests one at a time, alternating with the same request sent
      straight to the external API (its own latency: the floor), 100 of each per config; then
      streams cut after their first bytes on `llama`'s live engines, which must not fall back.

    python bench/fairness_bench.py [--only P1,P2,P3] [--configs strict,capped] [--scale 0.5]
        [--logs DIR] [--strict]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import uvloop
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_bench import Ask, Pool, Record, Table, key_of, ms, open_loop, pct, send
from llmop_router.contract import api_key_hash
from router_bench import start, stop_all, wait_listening
from support.harness.replicas import free_port
from support.redis import RedisServer

MODEL = "llama"
SEQS = 8
"""Each engine's batch: 2 engines, 16 slots (8 a router pod)."""
ENGINE_ARGS = ("--max-num-seqs", str(SEQS), "--sim-load-seconds", "0")
BATCH_TOKENS = 64
INTERACTIVE_TOKENS = 16
PROMPT_CHARS = 100
BATCH_WAIT_SECONDS = 5
CLIENT_CONNECTIONS = 512
CAPPED_SHARE = 88
"""The batch class's share in the capped configuration: 7 of a router pod's 8 slots."""
WINDOW = 10.0
SCENARIOS = ("P1", "P2", "P3")
PROVIDER_KEY = "provider-key-of-the-managed-api"
"""The external API's own key (its LLMExternalModel's Secret, inline in a static table)."""
UPSTREAM = "upstream-model"
FALLBACK_REQUESTS = 100


def priority_class(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "serving.llmop.dev/v1alpha1",
        "kind": "LLMPriorityClass",
        "metadata": {"name": name},
        "spec": spec,
    }


def tenant(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "serving.llmop.dev/v1alpha1",
        "kind": "LLMTenant",
        "metadata": {"name": name},
        "spec": {"apiKeys": [{"name": "main", "sha256": api_key_hash(key_of(name))}], **spec},
    }


def objects(share: int = 100, weights: tuple[int, int] = (1, 1)) -> list[dict[str, Any]]:
    batch_queue = {"maxWaitSeconds": BATCH_WAIT_SECONDS}
    return [
        priority_class("interactive", value=100),
        priority_class(
            "batch", value=0, globalDefault=True, maxSharePercent=share, queue=batch_queue
        ),
        tenant("chat", priorityClassName="interactive"),
        tenant("batch-1", weight=weights[0]),
        tenant("batch-2", weight=weights[1]),
        tenant("light"),
        tenant("heavy"),
        tenant("spender", fallback="Allowed"),
        tenant("inhouse", fallback="Never"),
    ]


@dataclass
class Config:
    name: str
    seqs: int
    objects: list[dict[str, Any]]
    endpoints: list[str] | None = None
    """`llama`'s endpoints (None: the two engines)."""
    external_port: int | None = None
    """Set: `llama` falls back to the LLMExternalModel `managed` on this port."""
    store: bool = True
    """The routers share the rig's redis-server (and lend each other slots); else each
    counts alone, with its static half of the slots."""
    readings: bool = True
    """The routers read the engines' running and waiting counts and send an engine that
    queues fewer requests (`--engine-readings-seconds`); else the plan's slots only."""


class Rig:
    def __init__(self, workdir: Path) -> None:
        self.dir = workdir
        self.engine_ports = [free_port(), free_port()]
        self.ports = [free_port(), free_port()]
        self.admin_ports: list[int] = []
        self.routers: list[subprocess.Popen[bytes]] = []
        self.engines: list[subprocess.Popen[bytes]] = []
        self.redis = RedisServer(log_dir=workdir / "redis")

    def start_engines(self) -> None:
        for port in self.engine_ports:
            argv = ["-m", "llmop_engine", "simulate", MODEL, "--served-model-name", MODEL]
            self.engines.append(
                start([*argv, "--host", "127.0.0.1", "--port", str(port), *ENGINE_ARGS])
            )
        for port in self.engine_ports:
            wait_listening(port)

    def configure(self, config: Config) -> None:
        """(Re)start both routers with this configuration's table and objects."""
        stop_all(self.routers)
        self.routers = []
        endpoints = [f"127.0.0.1:{p}" for p in self.engine_ports]
        entry: dict[str, Any] = {
            "namespace": "team",
            "name": MODEL,
            "endpoints": endpoints if config.endpoints is None else config.endpoints,
            "maxNumSeqs": config.seqs,
        }
        document: dict[str, Any] = {"models": {MODEL: entry}}
        if config.external_port is not None:
            entry["fallback"] = [{"externalModel": "managed"}]
            document["externalModels"] = {
                "managed": {
                    "baseURL": f"http://127.0.0.1:{config.external_port}/v1",
                    "model": UPSTREAM,
                    "apiKey": PROVIDER_KEY,
                    "pricing": {"inputPerMillion": "0.15", "outputPerMillion": "0.60"},
                }
            }
        table = self.dir / f"table-{config.name}.json"
        table.write_text(json.dumps(document))
        tenants = self.dir / f"tenants-{config.name}.yaml"
        tenants.write_text(yaml.safe_dump_all(config.objects))
        self.admin_ports = [free_port() for _ in self.ports]
        for port, admin in zip(self.ports, self.admin_ports, strict=True):
            argv = ["-m", "llmop_router", "serve", "--host", "127.0.0.1", "--port", str(port)]
            argv += ["--admin-port", str(admin), "--static", str(table)]
            argv += ["--static-tenants", str(tenants), "--replicas", "2", "--shutdown-delay", "0"]
            if config.store:
                argv += ["--store", self.redis.url]
            if not config.readings:
                argv += ["--engine-readings-seconds", "0"]
            with (self.dir / f"router-{port}.log").open("ab") as out:
                process = subprocess.Popen(
                    [sys.executable, *argv], stdout=out, stderr=subprocess.STDOUT
                )
            self.routers.append(process)
        for port in self.ports:
            wait_listening(port)

    def close(self) -> None:
        stop_all([*self.routers, *self.engines])
        self.redis.close()


@contextlib.contextmanager
def rig_running(logs: Path | None) -> Iterator[Rig]:
    workdir = logs or Path(tempfile.mkdtemp(prefix="llmop-fairness-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    rig = Rig(workdir)
    try:
        rig.redis.start()
        rig.start_engines()
        yield rig
    finally:
        rig.close()
        if logs is None:
            shutil.rmtree(workdir, ignore_errors=True)


async def sample_running(ports: Sequence[int], until: float, into: list[int]) -> None:
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < until:
            total = 0
            for port in ports:
                async with session.get(f"http://127.0.0.1:{port}/sim/stats") as answer:
                    total += int((await answer.json())["running"])
            into.append(total)
            await asyncio.sleep(0.1)


def batch_ask(name: str, *, varied: bool = False) -> Any:
    """Request n of a batch tenant. Prompts differ (as real ones do): the ring spreads them
    rather than keep one prefix home. `varied`: its output length drawn from 32-96 tokens
    (mean 64, the same for every run), as real answers vary; else exactly 64."""

    def ask(n: int) -> Ask:
        tokens = BATCH_TOKENS
        if varied:
            tokens = random.Random(f"{name}-{n}").randint(BATCH_TOKENS // 2, 3 * BATCH_TOKENS // 2)
        return Ask(name, prompt_chars=PROMPT_CHARS, max_tokens=tokens, variant=n + 1)

    return ask


async def capacity(rig: Rig, seconds: float = 8.0) -> float:
    """Batch requests a second the engines finish when every slot is busy: closed-loop clients,
    two per slot, straight through the routers of the `before` configuration."""
    rig.configure(Config("calibrate", 1_000_000, objects(), readings=False))
    done = 0
    until = time.monotonic() + seconds
    async with Pool(rig.ports, connections=4 * SEQS) as pool:

        async def worker(i: int) -> None:
            nonlocal done
            n = 0
            while time.monotonic() < until:
                n += 1
                record = await send(pool.next(), batch_ask("batch-1")(i * 10_000 + n), 0.0)
                done += record.status == 200

        await asyncio.gather(*(worker(i) for i in range(4 * SEQS)))
    return done / seconds


@dataclass
class Run:
    records: dict[str, list[Record]]
    running: list[int]
    seconds: float


async def idle(ports: Sequence[int], timeout: float = 300.0) -> None:
    """Until the engines run and queue nothing: a configuration without the router's queue
    leaves a backlog (requests whose clients gave up included) that would steal the next one's
    slots."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            busy = 0
            for port in ports:
                async with session.get(f"http://127.0.0.1:{port}/sim/stats") as answer:
                    stats = await answer.json()
                    busy += int(stats["running"]) + int(stats["waiting"])
            if not busy:
                return
            await asyncio.sleep(0.5)
    raise RuntimeError(f"the engines were still busy after {timeout:.0f} s")


async def load(
    rig: Rig, rates: dict[str, float], seconds: float, *, stream: set[str], varied: bool = False
) -> Run:
    """Each tenant at its rate (req/s) for `seconds`, together, from idle engines; the engines'
    slots sampled (`varied`: batch output lengths vary, `batch_ask`)."""
    await idle(rig.engine_ports)
    t0 = time.monotonic() + 0.2
    running: list[int] = []
    # Open loop for real: enough connections that no request waits in the client for one
    # (a pool of 8 would hold each tenant to 8 in flight, and the overload would never reach
    # the routers).
    pools = {name: Pool(rig.ports, connections=CLIENT_CONNECTIONS) for name in rates}
    try:

        def make(name: str) -> Any:
            if name in stream:
                return lambda n: Ask(
                    name,
                    prompt_chars=PROMPT_CHARS,
                    max_tokens=INTERACTIVE_TOKENS,
                    stream=True,
                    variant=n + 1,
                )
            return batch_ask(name, varied=varied)

        sampler = asyncio.create_task(sample_running(rig.engine_ports, t0 + seconds, running))
        found = await asyncio.gather(
            *(
                open_loop(pools[n], make(n), rate=r, seconds=seconds, t0=t0, seed=i)
                for i, (n, r) in enumerate(rates.items())
            )
        )
        await sampler
    finally:
        for pool in pools.values():
            await pool.__aexit__()
    return Run(dict(zip(rates, found, strict=True)), running, seconds)


async def suggested_shares(admin_ports: Sequence[int]) -> list[float]:
    """Each router's `llmop_gateway_suggested_max_share_percent` for the batch class."""
    found = []
    async with aiohttp.ClientSession() as session:
        for port in admin_ports:
            async with session.get(f"http://127.0.0.1:{port}/metrics") as answer:
                text = await answer.text()
            for line in text.splitlines():
                if line.startswith("llmop_gateway_suggested_max_share_percent{") and (
                    'priority_class="batch"' in line
                ):
                    found.append(float(line.rsplit(" ", 1)[1]))
    return found


def refused(records: Sequence[Record]) -> tuple[int, int, int]:
    """(429s with Retry-After, 429s without, other failures)."""
    with_retry = sum(1 for r in records if r.status == 429 and r.retry_after)
    without = sum(1 for r in records if r.status == 429 and not r.retry_after)
    other = sum(1 for r in records if r.status not in (200, 429))
    return with_retry, without, other


OVERPLANNED = "overplanned"
OVERPLANNED_PLAN_ONLY = "overplanned, plan only"
UNJUDGED = {"before", "static", OVERPLANNED_PLAN_ONLY}


def p1_rows(table: Table, config: str, run: Run) -> None:
    chat = run.records["chat"]
    ok = [r for r in chat if r.status == 200 and r.ttft is not None]
    ttft = [r.ttft for r in ok if r.ttft is not None]
    success = 100.0 * len(ok) / max(1, len(chat))
    p50, p99 = pct(ttft, 0.5), pct(ttft, 0.99)
    judged = config not in UNJUDGED
    table.add(
        f"{config}: interactive success",
        f"{success:.1f} % of {len(chat)}",
        "100 %",
        (success == 100.0) if judged else None,
    )
    p99_target = 0.25 if config == "capped" else 0.6
    slowest = max(ok, key=lambda r: r.ttft or 0.0, default=None)
    when = "" if slowest is None else f" (slowest sent {slowest.sent:.1f} s in)"
    table.add(
        f"{config}: interactive TTFT p50 / p99 (ms)",
        f"{ms(p50, 0)} / {ms(p99, 0)}{when}",
        "≤ 150 / ≤ 250" if config == "capped" else "≤ 150 / ≤ 600",
        (p50 <= 0.15 and p99 <= p99_target) if judged else None,
    )
    busy = 100.0 * statistics.fmean(run.running) / (2 * SEQS) if run.running else float("nan")
    table.add(
        f"{config}: slots busy (mean of the engines' running)",
        f"{busy:.0f} %",
        "≥ 80 %",
        busy >= 80 if judged else None,
    )
    batch = run.records["batch-1"] + run.records["batch-2"]
    served = sum(1 for r in batch if r.status == 200)
    with_retry, without, other = refused(batch)
    table.add(
        f"{config}: batch served / 429 with Retry-After / 429 without / other failures",
        f"{served} / {with_retry} / {without} / {other}",
        "429s all with Retry-After, 0 other",
        (without == 0 and other == 0) if judged else None,
    )


async def scenario_p1(
    rig: Rig, seconds: float, measured: float, only: set[str] | None = None
) -> Table:
    table = Table("P1", "priority: 2 batch tenants at 2x capacity together, interactive at 1 req/s")
    configs = [
        Config("before", 1_000_000, objects(), readings=False),
        Config("static", SEQS, objects(), store=False),
        Config("strict", SEQS, objects()),
        Config("capped", SEQS, objects(share=CAPPED_SHARE)),
        Config(OVERPLANNED_PLAN_ONLY, 2 * SEQS, objects(), readings=False),
        Config(OVERPLANNED, 2 * SEQS, objects()),
    ]
    rates = {"batch-1": measured, "batch-2": measured, "chat": 1.0}
    for config in configs:
        if only is not None and config.name not in only:
            continue
        rig.configure(config)
        run = await load(rig, rates, seconds, stream={"chat"}, varied=True)
        p1_rows(table, config.name, run)
        if config.name == "strict":
            suggested = await suggested_shares(rig.admin_ports)
            table.add(
                "strict: maxSharePercent the routers suggest for batch (each router)",
                " / ".join(f"{v:.0f} %" for v in suggested) or "none",
                f"≈ {CAPPED_SHARE} % (capped's, which meets p99 ≤ 250 ms)",
                None,
            )
    table.notes.append(
        f"capacity {measured:.1f} batch requests/s, measured ({2 * SEQS} slots, {BATCH_TOKENS} "
        f"tokens each); batch answers of {BATCH_TOKENS // 2}-{3 * BATCH_TOKENS // 2} tokens "
        f"(mean {BATCH_TOKENS}); batch queue bound {BATCH_WAIT_SECONDS} s; capped: batch "
        f"maxSharePercent {CAPPED_SHARE}; {seconds:.0f} s per configuration"
    )
    return table


def served_per_window(records: Sequence[Record], seconds: float) -> list[float]:
    """Output tokens of each tenant's answers, by the 10 s window their answer ended in."""
    windows = [0.0] * max(1, int(seconds // WINDOW))
    for r in records:
        if r.status != 200:
            continue
        end = r.sent + r.latency
        index = int(end // WINDOW)
        if 0 <= index < len(windows):
            windows[index] += BATCH_TOKENS
    return windows


def jain(values: Sequence[float]) -> float:
    total = sum(values)
    squares = sum(v * v for v in values)
    return (total * total) / (len(values) * squares) if squares else 1.0


async def scenario_p2(rig: Rig, seconds: float, measured: float) -> Table:
    table = Table("P2", "fairness between tenants of one class")
    # Both above their fair half, one sending twice the other: first come first served gives
    # service 2:1 (Jain 0.90), the fair queue 1:1.
    unequal = {"batch-1": 2.0 * measured, "batch-2": 1.0 * measured}
    for name, seqs in (("before", 1_000_000), ("fair", SEQS)):
        rig.configure(Config(name, seqs, objects(), readings=name != "before"))
        run = await load(rig, unequal, seconds, stream=set())
        per = [served_per_window(run.records[n], seconds) for n in unequal]
        steady = list(zip(*per, strict=True))[1:]  # the first window fills the queue
        indexes = [jain(w) for w in steady]
        good = sum(1 for j in indexes if j >= 0.97)
        share = 100.0 * good / max(1, len(indexes))
        served = "/".join(f"{sum(p[1:]):.0f}" for p in per)
        busy = 100.0 * statistics.fmean(run.running) / (2 * SEQS) if run.running else 0.0
        table.add(
            f"{name}: equal weights, sending 2:1: windows with Jain's index ≥ 0.97",
            f"{good} of {len(indexes)} ({share:.0f} %; lowest {min(indexes, default=1.0):.3f}; "
            f"tokens served {served}; slots busy {busy:.0f} %)",
            "≥ 95 %" if name == "fair" else "-",
            share >= 95 if name == "fair" else None,
        )
    both = {"batch-1": 1.5 * measured, "batch-2": 1.5 * measured}
    rig.configure(Config("weighted", SEQS, objects(weights=(2, 1))))
    run = await load(rig, both, seconds, stream=set())
    a = sum(served_per_window(run.records["batch-1"], seconds)[1:])
    b = sum(served_per_window(run.records["batch-2"], seconds)[1:])
    ratio = a / b if b else float("inf")
    table.add("weights 2:1: service ratio", f"{ratio:.2f}", "2.0 ± 0.1", abs(ratio - 2.0) <= 0.1)
    rates = {"heavy": 2 * measured, "light": 0.2 * measured}
    for name, seqs in (("before", 1_000_000), ("fair", SEQS)):
        rig.configure(Config(name, seqs, objects(), readings=name != "before"))
        run = await load(rig, rates, seconds, stream=set())
        light = run.records["light"]
        ok = 100.0 * sum(1 for r in light if r.status == 200) / max(1, len(light))
        latency = pct([r.latency for r in light if r.status == 200], 0.99)
        heavy_refused = sum(1 for r in run.records["heavy"] if r.status != 200)
        table.add(
            f"{name}: light tenant (0.2x) beside heavy (2x): success, p99 latency",
            f"{ok:.1f} % of {len(light)}, {latency:.2f} s (heavy refused {heavy_refused})",
            "≥ 99 %" if name == "fair" else "-",
            ok >= 99 if name == "fair" else None,
        )
    table.notes.append(
        f"{seconds:.0f} s per configuration; service counted per {WINDOW:.0f} s window"
    )
    return table


async def timed_post(
    session: aiohttp.ClientSession, url: str, key: str, body: dict[str, Any]
) -> tuple[int, float, dict[str, str], str]:
    """Status, seconds to the whole answer, headers, text."""
    started = time.perf_counter()
    headers = {"Authorization": f"Bearer {key}"}
    async with session.post(url, json=body, headers=headers) as answer:
        text = await answer.text()
        return answer.status, time.perf_counter() - started, dict(answer.headers), text


async def served_by(session: aiohttp.ClientSession, port: int) -> int:
    async with session.get(f"http://127.0.0.1:{port}/sim/stats") as answer:
        return int((await answer.json())["clientRequestsTotal"])


async def fallback_rows(table: Table, rig: Rig, name: str, external_port: int, count: int) -> None:
    """One configuration of P3: `llama` cannot answer; the spender's requests go to the external
    API, alternating with the same request sent to it straight."""
    router = f"http://127.0.0.1:{rig.ports[0]}/v1/completions"
    direct = f"http://127.0.0.1:{external_port}/v1/completions"
    ask = {"prompt": "x" * PROMPT_CHARS, "max_tokens": 4, "ignore_eos": True}
    through: list[float] = []
    straight: list[float] = []
    errors = marked = 0
    async with aiohttp.ClientSession() as session:
        for _ in range(3):  # warm both paths' connections
            await timed_post(session, direct, PROVIDER_KEY, {**ask, "model": UPSTREAM})
            await timed_post(session, router, key_of("spender"), {**ask, "model": MODEL})
        before = await served_by(session, external_port)
        for _ in range(count):
            status, seconds, _, _ = await timed_post(
                session, direct, PROVIDER_KEY, {**ask, "model": UPSTREAM}
            )
            if status == 200:
                straight.append(seconds)
            status, seconds, headers, _ = await timed_post(
                session, router, key_of("spender"), {**ask, "model": MODEL}
            )
            if status == 200:
                through.append(seconds)
                marked += headers.get("X-Llmop-Fallback") == "managed"
            else:
                errors += 1
        served = await served_by(session, external_port) - before
        refusals = []
        for _ in range(20):
            status, _, headers, _ = await timed_post(
                session, router, key_of("inhouse"), {**ask, "model": MODEL}
            )
            refusals.append((status, "Retry-After" in headers, "X-Llmop-Fallback" in headers))
        leaked = await served_by(session, external_port) - before - served
    table.add(
        f"{name}: allowed tenant, errors (of {count}); answers marked X-Llmop-Fallback",
        f"{errors}; {marked}",
        "0; all",
        errors == 0 and marked == count,
    )
    # It counts only requests carrying its own key (any other is refused 401 before counting);
    # the straight ones are counted too.
    relayed = served - len(straight)
    table.add(
        f"{name}: of those, served by the external API with its own key",
        f"{relayed} of {count}",
        f"{count}",
        relayed == count,
    )
    added = (statistics.median(through) - statistics.median(straight)) * 1000
    table.add(
        f"{name}: added p50 over the external API's own (through the router vs straight)",
        f"{ms(statistics.median(through))} vs {ms(statistics.median(straight))}: +{added:.2f} ms",
        "≤ 5 ms",
        added <= 5.0,
    )
    ok = sum(1 for r in refusals if r == (503, True, False))
    table.add(
        f"{name}: tenant not allowed (fallback: Never): 503 with Retry-After, not sent out",
        f"{ok} of {len(refusals)}; {leaked} reached the external API",
        "all; 0",
        ok == len(refusals) and leaked == 0,
    )


async def no_fallback_after_first_byte(table: Table, rig: Rig, external_port: int) -> None:
    """Streams on `llama`'s live engines, each cut after 3 tokens on every engine (the header
    goes with each continuation): migration's, never the fallback's."""
    router = f"http://127.0.0.1:{rig.ports[0]}/v1/completions"
    body = {"model": MODEL, "prompt": "x" * PROMPT_CHARS, "max_tokens": 16, "stream": True}
    headers = {"Authorization": f"Bearer {key_of('spender')}", "X-Sim-Fault": "crash@3"}
    marked = 0
    async with aiohttp.ClientSession() as session:
        before = await served_by(session, external_port)
        for _ in range(10):
            async with session.post(router, json=body, headers=headers) as answer:
                await answer.read()
                marked += "X-Llmop-Fallback" in answer.headers
        sent = await served_by(session, external_port) - before
    table.add(
        "live engines, streams cut after their first bytes: answers from a fallback",
        f"{marked} of 10 marked; {sent} requests reached the external API",
        "0; 0",
        marked == 0 and sent == 0,
    )


async def scenario_p3(rig: Rig, count: int) -> Table:
    table = Table("P3", "fallback to an external API when the model cannot answer")
    external_port, failing_port = free_port(), free_port()
    sim = ["-m", "llmop_engine", "simulate", UPSTREAM, "--served-model-name", UPSTREAM]
    extra = [
        start(
            [
                *sim,
                "--host",
                "127.0.0.1",
                "--port",
                str(external_port),
                "--api-key",
                PROVIDER_KEY,
                *ENGINE_ARGS,
            ]
        ),
        start(
            [
                "-m",
                "llmop_engine",
                "simulate",
                MODEL,
                "--served-model-name",
                MODEL,
                "--host",
                "127.0.0.1",
                "--port",
                str(failing_port),
                "--sim-fault",
                "refuse",
                *ENGINE_ARGS,
            ]
        ),
    ]
    try:
        wait_listening(external_port)
        wait_listening(failing_port)
        for name, endpoints in (
            ("stopped", [f"127.0.0.1:{free_port()}"]),
            ("failing", [f"127.0.0.1:{failing_port}"]),
        ):
            rig.configure(Config(f"fallback-{name}", SEQS, objects(), endpoints, external_port))
            await fallback_rows(table, rig, name, external_port, count)
        rig.configure(Config("fallback-live", SEQS, objects(), None, external_port))
        await no_fallback_after_first_byte(table, rig, external_port)
    finally:
        stop_all(extra)
    table.notes.append(
        f"{count} requests of 4 tokens per config, one at a time, each beside the same request "
        "sent straight to the external API"
    )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default=",".join(SCENARIOS))
    parser.add_argument(
        "--scale", type=float, default=1.0, help="P1 and P2: 120 s per configuration x this"
    )
    parser.add_argument(
        "--configs", help="P1: only these configurations (comma-separated names, e.g. strict)"
    )
    parser.add_argument("--logs", type=Path)
    parser.add_argument("--strict", action="store_true", help="exit 1 when a check fails")
    args = parser.parse_args()
    only = [s.strip().upper() for s in args.only.split(",") if s.strip()]
    seconds = 60.0 * args.scale
    uvloop.install()
    began = time.monotonic()
    print(
        f"fairness bench: {os.cpu_count()} CPUs, everything on loopback (2 simulators of "
        f"{SEQS} sequences, 2 gateway routers, the clients)"
    )
    tables = []
    with rig_running(args.logs) as rig:
        measured = asyncio.run(capacity(rig))
        print(f"capacity: {measured:.1f} batch requests/s with every slot busy")
        if "P1" in only:
            configs = None if args.configs is None else set(args.configs.split(","))
            tables.append(asyncio.run(scenario_p1(rig, 2 * seconds, measured, configs)))
            tables[-1].print()
        if "P2" in only:
            tables.append(asyncio.run(scenario_p2(rig, 2 * seconds, measured)))
            tables[-1].print()
        if "P3" in only:
            count = max(20, round(FALLBACK_REQUESTS * args.scale))
            tables.append(asyncio.run(scenario_p3(rig, count)))
            tables[-1].print()
    failed = [(t.name, c.what) for t in tables for c in t.failed]
    rows = sum(len(t.checks) for t in tables)
    print(f"\n{rows} rows, {len(failed)} failed, {time.monotonic() - began:.0f} s")
    for name, what in failed:
        print(f"- FAIL {name}: {what}")
    if failed and args.strict:
        sys.exit(1)


if __name__ == "__main__":
    main()
