"""Engine benchmark (`make bench-engine`): drain loss with and without the agent, probe overhead,
agent CPU and memory. Prints a table; not a timed test.

Drain: three replicas behind a readiness-polling round-robin, 32 streaming clients for 30 s, rolling
replacement of all three; once with the agent (preStop + SIGTERM, endpoint propagation wait,
`--shutdown-timeout`), once with bare simulators (plain SIGTERM, vLLM's default abort).
Overhead: what the agent sends to the engine and what it costs itself, idle and under saturation.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

# The harness is test code (tests/support), shipped in no image.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.harness.loadgen import Endpoints, run_clients
from support.harness.replicas import Replica, cpu_seconds
from support.harness.rollout import RolloutConfig, rolling_replace


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@dataclass
class Window:
    label: str
    seconds: float
    agent_cpu_pct: float
    agent_rss_mib: float
    probe_requests: int
    client_requests: int


async def measure(replica: Replica, label: str, seconds: float, clients: int) -> Window:
    endpoints = Endpoints(0.5)
    endpoints.add(replica.name, replica.api_url, replica.readiness_url)
    endpoints.start()
    await asyncio.sleep(1.0)
    load = None
    if clients:
        load = asyncio.create_task(run_clients(endpoints, clients, seconds + 3, "sim-model", 32))
        await asyncio.sleep(2.0)
    before = await replica.sim_stats()
    cpu0, t0 = cpu_seconds(replica.proc.pid), time.monotonic()
    await asyncio.sleep(seconds)
    cpu1, t1 = cpu_seconds(replica.proc.pid), time.monotonic()
    after = await replica.sim_stats()
    if load is not None:
        await load
    await endpoints.stop()

    def delta(key: str) -> int:
        return int(str(after[key])) - int(str(before[key]))

    return Window(
        label,
        t1 - t0,
        100 * (cpu1 - cpu0) / (t1 - t0),
        rss_mib(replica.proc.pid),
        delta("probeRequestsTotal"),
        delta("clientRequestsTotal"),
    )


async def probe_latency(replica: Replica) -> str:
    async with aiohttp.ClientSession() as http, http.get(replica.probe_url + "/status") as r:
        probe = (await r.json()).get("lastDeepProbe") or {}
    latency = probe.get("latencySeconds")
    return "n/a" if latency is None else f"{latency * 1000:.0f} ms"


async def main(duration: float, window: float) -> None:
    logs = Path(tempfile.mkdtemp(prefix="llmop-bench-engine-"))
    cfg = RolloutConfig(duration=duration)
    print(
        f"drain: 3 replicas, {cfg.concurrency} streaming clients, {cfg.duration:.0f}s, "
        f"rolling replacement (logs in {logs})",
        flush=True,
    )
    rows = []
    for with_agent in (True, False):
        r = await rolling_replace(logs / ("agent" if with_agent else "bare"), with_agent, cfg)
        rows.append(r)
    print()
    print(f"{'drain':<34}{'requests':>10}{'ok':>8}{'failed':>8}{'truncated':>11}{'lost %':>8}")
    for r in rows:
        label = "with agent" if r.with_agent else "bare simulator (SIGTERM, abort)"
        lost = 100 * r.load.lost / max(1, r.load.total)
        print(
            f"{label[:33]:<34}{r.load.total:>10}{r.load.ok:>8}{r.load.failed:>8}"
            f"{r.load.truncated:>11}{lost:>7.1f}%"
        )

    env = {"LLMOP_DEEP_PROBE_INTERVAL_SECONDS": "10", "LLMOP_POLL_INTERVAL_SECONDS": "1"}
    replica = Replica.start(
        logs / "overhead", engine_args=["--sim-load-seconds", "0.5", "--max-num-seqs", "8"], env=env
    )
    try:
        await replica.wait_ready(60)
        idle = await measure(replica, "idle", window, 0)
        busy = await measure(replica, "saturated (24 clients, 8 seqs)", window, 24)
        latency = await probe_latency(replica)
    finally:
        replica.stop()
    print()
    print("agent overhead (deep-probe interval 10s, engine poll 1s: /health + /metrics)")
    print(
        f"{'window':<32}{'seconds':>8}{'probes':>8}{'probes/min':>12}{'client reqs':>13}"
        f"{'agent CPU':>11}{'agent RSS':>11}"
    )
    for w in (idle, busy):
        per_min = 60 * w.probe_requests / w.seconds
        print(
            f"{w.label:<32}{w.seconds:>8.0f}{w.probe_requests:>8}{per_min:>12.1f}"
            f"{w.client_requests:>13}{w.agent_cpu_pct:>10.1f}%{w.agent_rss_mib:>8.0f} MiB"
        )
    print(f"last deep-probe latency (idle, one token): {latency}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--duration", type=float, default=30.0, help="load per drain run")
    parser.add_argument("--window", type=float, default=30.0, help="overhead sample window")
    args = parser.parse_args()
    asyncio.run(main(args.duration, args.window))
