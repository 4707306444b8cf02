"""Agent-reading benchmark: what one round of `GET /status` over N engine agents costs the
operator (`llmop.pod_client.AgentClient`, the code `llmop.fleet` runs). Not a test: prints a
table.

    python bench/fleet_bench.py --agents 100 --rounds 20

The agents are stand-ins answering the real agent's JSON (`tests/support/standin_agents.py`)
from aiohttp, as the real agent does, in a separate process, one server per agent on its own
port, so the numbers are the reader's alone: wall time of a round, requests per second, the
reader's CPU time per round (its process only) and its peak RSS. Rows vary the concurrency
bound and add hung agents (they cost one timeout each round, bounded by the concurrency). The
fleet loop reads every `max(interval, N / READS_PER_SECOND)` seconds, so its steady-state CPU
share is the per-round CPU time divided by that period, printed last.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from llmop.fleet import READS_PER_SECOND, period
from llmop.pod_client import AgentClient, Target

ROOT = Path(__file__).resolve().parents[1]

_SERVE = """
import asyncio, json, sys
sys.path.insert(0, {tests!r})
from aiohttp import web
from support.standin_agents import agent_status

async def main(count, hung):
    runners, ports = [], []
    for i in range(count):
        body = agent_status(running=i % 7, waiting=i % 3, kv_tokens=100_000 + i)

        async def status(request, body=body, stall=i < hung):
            if stall:
                await asyncio.sleep(3600)
            return web.json_response(body)

        app = web.Application()
        app.router.add_get("/status", status)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        ports.append(site._server.sockets[0].getsockname()[1])
    print(json.dumps(ports), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
"""


def serve(count: int, hung: int) -> tuple[subprocess.Popen[str], list[int]]:
    process = subprocess.Popen(
        [sys.executable, "-c", _SERVE.format(tests=str(ROOT / "tests")), str(count), str(hung)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    ports: list[int] = json.loads(process.stdout.readline())
    return process, ports


async def measure(
    ports: list[int], *, concurrency: int, timeout: float, rounds: int
) -> tuple[float, float, int]:
    """(median wall seconds per round, CPU seconds per round, readings per round)."""
    targets = [Target("bench", "p", f"pod-{i}", "127.0.0.1", port) for i, port in enumerate(ports)]
    client = AgentClient(concurrency=concurrency, timeout=timeout)
    try:
        await client.read_all(targets)  # warm the connection pool, as a running operator has
        walls = []
        cpu_started = time.process_time()
        read = 0
        for _ in range(rounds):
            started = time.perf_counter()
            result = await client.read_all(targets)
            walls.append(time.perf_counter() - started)
            read = len(result.readings)
        cpu = (time.process_time() - cpu_started) / rounds
    finally:
        await client.close()
    walls.sort()
    return walls[len(walls) // 2], cpu, read


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=2.0)
    parser.add_argument("--interval", type=float, default=10.0)
    args = parser.parse_args()
    cases = [(8, 0), (32, 0), (100, 0), (32, args.agents // 10)]
    print(
        f"{args.agents} stand-in agents, {args.rounds} rounds each, "
        f"timeout {args.timeout:g}s (hung agents never answer)\n"
    )
    header = (
        f"{'concurrency':>11} {'hung':>4} {'round ms':>9} {'reads/s':>8} "
        f"{'CPU ms/round':>12} {'read':>5}"
    )
    print(header)
    print("-" * len(header))
    steady_cpu = 0.0
    for concurrency, hung in cases:
        process, ports = serve(args.agents, hung)
        try:
            rounds = args.rounds if hung == 0 else max(2, args.rounds // 10)
            wall, cpu, read = asyncio.run(
                measure(ports, concurrency=concurrency, timeout=args.timeout, rounds=rounds)
            )
        finally:
            assert process.stdin is not None
            process.stdin.close()
            process.kill()
            process.wait()
        if (concurrency, hung) == (32, 0):
            steady_cpu = cpu
        print(
            f"{concurrency:>11} {hung:>4} {wall * 1000:>9.1f} {args.agents / wall:>8.0f} "
            f"{cpu * 1000:>12.1f} {read:>5}"
        )
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    every = period(args.agents, args.interval)
    print(
        f"\nreader peak RSS {rss_mib:.0f} MiB (whole benchmark process). At the default "
        f"concurrency 32 the fleet loop reads {args.agents} agents every {every:g} s "
        f"(interval {args.interval:g} s, at most {READS_PER_SECOND:g} reads/s): "
        f"{steady_cpu / every * 100:.2f}% of one core."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
