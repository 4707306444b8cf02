"""Router replay (`make bench-router`'s workloads in virtual time): routing policies compared
without CPU noise.

`bench/router_bench.py` runs three simulator processes, a router and the clients on one machine,
so its TTFT moves with whatever else runs, and a Service row depends on the order its random
picks happened to fall in: on an idle 2-core machine the same workload gave the Service 1,897 ms
one day and 2,112 ms another. This replays the same workloads (`router_bench.workloads()`, the
same users, turns, think times and pacing) against the simulator's own batching model and prefix
cache (`llmop_engine.simulator.batching.BatchEngine`, three of them, the bench's flags) on an
event loop whose clock jumps to the next timer instead of sleeping: a 60 s row takes about a
second, the same seed gives the same figures, and each policy is run over several seeds (each
seed draws other questions, prompts and think times, and other random picks for the Service).

Policies: `service` (a random replica per request, as kube-proxy), `router` (`ring.pick` as the
router calls it: bounded load, then the least prefill to wait for and do), `before` (what the
router did up to c3c05e4: the first pod on the key's walk whose in-flight count stays within 1.25
times the mean, rounded up) and `least-in-flight` (the replica with the fewest requests in
flight, whatever the key). A request counts in flight from its
pick to its last token and as queued prefill until its first, as the router counts them. Not
modelled: HTTP, the router's own CPU, the clients' (what `router_bench.py`'s overhead rows
measure).

    python bench/router_replay.py [--workload NAME]... [--seeds 5] [--seconds 60]
        [--policy service,router,before]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import selectors
import statistics
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import router_bench
from llmop_engine.simulator.batching import BatchEngine
from llmop_engine.simulator.faults import FaultState
from llmop_engine.simulator.metrics import SimMetrics
from llmop_engine.simulator.prefix_cache import chat_text, prompt_blocks
from llmop_engine.simulator.server import estimate_tokens, token_text
from llmop_engine.simulator.sim_config import SimConfig
from llmop_router.prefix import routing_info
from llmop_router.ring import Ring, pick
from router_bench import KV_BLOCKS, MAX_TOKENS, PREFILL_TOKENS_PER_S, REPLICAS, Workload, text

Messages = list[dict[str, str]]
Policy = Callable[[Ring, Messages, Counter[str], Counter[str], random.Random], tuple[str, int]]
"""(ring, messages, in flight, queued prefill, the Service's random) -> (pod, its prefill)."""


# --- virtual time -------------------------------------------------------------------------------


class _Clock:
    now = 0.0


class _JumpingSelector(selectors.SelectSelector):
    """Nothing ever waits on a socket here: a wait for the next timer moves the clock instead."""

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise RuntimeError("nothing scheduled: every user and engine is waiting")
        _Clock.now += max(0.0, timeout)
        return []


class _VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        super().__init__(selector=_JumpingSelector())

    def time(self) -> float:
        return _Clock.now


# --- policies -----------------------------------------------------------------------------------


def _body(messages: Messages) -> bytes:
    payload = {"model": "bench", "stream": True, "max_tokens": MAX_TOKENS, "messages": messages}
    return json.dumps(payload).encode()


def service(
    ring: Ring, _m: Messages, _l: Counter[str], _q: Counter[str], rng: random.Random
) -> tuple[str, int]:
    return rng.choice(ring.endpoints), 0


def router(
    ring: Ring, messages: Messages, load: Counter[str], queued: Counter[str], _r: random.Random
) -> tuple[str, int]:
    info = routing_info(_body(messages))
    choice = pick(ring, info.key, load, queued, info.prefill)
    return choice.order[0], choice.prefill_on(choice.order[0])


def before(
    ring: Ring, messages: Messages, load: Counter[str], _q: Counter[str], _r: random.Random
) -> tuple[str, int]:
    key = routing_info(_body(messages)).key
    walk = ring.walk(key if key is not None else 0)
    total = sum(load.values())
    bound = math.ceil((total + 1) / len(walk) * 1.25)
    return next((e for e in walk if total == 0 or load[e] + 1 <= bound), walk[0]), 0


def least_in_flight(
    ring: Ring, _m: Messages, load: Counter[str], _q: Counter[str], _r: random.Random
) -> tuple[str, int]:
    return pick(ring, None, load).order[0], 0


POLICIES: dict[str, Policy] = {
    "service": service,
    "router": router,
    "before": before,
    "least-in-flight": least_in_flight,
}


# --- one row ------------------------------------------------------------------------------------


@dataclass
class Row:
    requests: int
    hit_rate: float
    mean_ttft: float
    p90_ttft: float
    mean_in_flight: float
    balance: float
    balance_loaded: float
    loaded_share: float


class _Replay:
    """One row: the workload's users against `REPLICAS` batching engines, through `policy`."""

    def __init__(self, workload: Workload, policy: Policy, seed: int, seconds: float) -> None:
        self.loop = asyncio.get_running_loop()
        self.cfg = SimConfig(
            num_gpu_blocks=KV_BLOCKS,
            prefill_tokens_per_s=PREFILL_TOKENS_PER_S,
            max_model_len=32768,
        )
        self.engines = {
            f"10.0.0.{i}:8000": BatchEngine(
                self.cfg, SimMetrics(self.cfg), FaultState(), clock=self.loop.time
            )
            for i in range(REPLICAS)
        }
        self.ring = Ring.of(self.engines)
        self.workload, self.policy, self.seed = workload, policy, seed
        self.load: Counter[str] = Counter()
        self.queued: Counter[str] = Counter()
        self.picks = random.Random(seed)
        self.ttfts: list[float] = []
        self.samples: list[tuple[int, float]] = []
        self.deadline = self.loop.time() + seconds

    async def run(self) -> Row:
        schedulers = [asyncio.create_task(e.run()) for e in self.engines.values()]
        sampler = asyncio.create_task(self.sample())
        await asyncio.gather(*(self.user(n) for n in range(self.workload.users)))
        await sampler
        for engine in self.engines.values():
            engine.stop()
        for task in schedulers:
            task.cancel()
        await asyncio.gather(*schedulers, return_exceptions=True)
        return self.row()

    async def one(self, messages: Messages) -> str:
        """One request, counted as the router counts it; its answer's text."""
        pod, prefill = self.policy(self.ring, messages, self.load, self.queued, self.picks)
        self.load[pod] += 1
        self.queued[pod] += prefill
        prompt = sum(estimate_tokens(m["content"]) + 4 for m in messages)
        blocks = prompt_blocks(chat_text(messages), self.cfg.block_size)
        request = self.engines[pod].submit(prompt, MAX_TOKENS, prefix=blocks)
        sent = self.loop.time()
        while not request.finished and not request.generated:
            await request.changed.wait()
            request.changed.clear()
        if request.generated:
            self.ttfts.append(self.loop.time() - sent)
        self.queued[pod] -= prefill
        while not request.finished:
            await request.changed.wait()
            request.changed.clear()
        self.load[pod] -= 1
        return "".join(token_text(i) for i in range(request.generated))

    async def user(self, n: int) -> None:
        """`router_bench.drive`'s user, in virtual time, with the seed in its random."""
        workload = self.workload
        rng = random.Random(n + 1000 * self.seed)
        if workload.pace_seconds:
            await asyncio.sleep(rng.uniform(0, workload.pace_seconds))
        while self.loop.time() < self.deadline:
            messages = [{"role": "system", "content": rng.choice(workload.system_prompts)}]
            for turn in range(workload.turns):
                if self.loop.time() >= self.deadline:
                    return
                question = f"user {n} turn {turn}: " + text(rng, router_bench.USER_CHARS)
                messages.append({"role": "user", "content": question})
                sent = self.loop.time()
                messages.append({"role": "assistant", "content": await self.one(messages)})
                if workload.think_seconds:
                    await asyncio.sleep(rng.expovariate(1 / workload.think_seconds))
                if workload.pace_seconds:
                    await asyncio.sleep(max(0.0, sent + workload.pace_seconds - self.loop.time()))

    async def sample(self) -> None:
        """Every 0.5 s, as the bench samples the engines' metrics."""
        while self.loop.time() < self.deadline:
            loads = [len(e.running) + len(e.waiting) for e in self.engines.values()]
            self.samples.append((max(loads), sum(loads) / len(loads)))
            await asyncio.sleep(0.5)

    def counted(self, name: str) -> float:
        labels = {"model_name": self.cfg.served_model_name, "engine": "0"}
        return sum(
            e.metrics.registry.get_sample_value(name, labels) or 0.0 for e in self.engines.values()
        )

    def row(self) -> Row:
        ttfts, samples = sorted(self.ttfts), self.samples
        ratios = [busiest / mean for busiest, mean in samples if mean > 0]
        loaded = [busiest / mean for busiest, mean in samples if mean >= router_bench.LOADED]
        queries = self.counted("vllm:prefix_cache_queries_total")
        nan = float("nan")
        return Row(
            len(ttfts),
            self.counted("vllm:prefix_cache_hits_total") / queries if queries else 0.0,
            statistics.fmean(ttfts) if ttfts else nan,
            ttfts[int(0.9 * (len(ttfts) - 1))] if ttfts else nan,
            statistics.fmean(mean for _, mean in samples) if samples else nan,
            statistics.fmean(ratios) if ratios else nan,
            statistics.fmean(loaded) if loaded else nan,
            len(loaded) / len(samples) if samples else 0.0,
        )


async def _replay(workload: Workload, policy: Policy, seed: int, seconds: float) -> Row:
    return await _Replay(workload, policy, seed, seconds).run()


def replay(workload: Workload, policy: str, seed: int, seconds: float) -> Row:
    _Clock.now = 0.0
    loop = _VirtualLoop()
    try:
        return loop.run_until_complete(_replay(workload, POLICIES[policy], seed, seconds))
    finally:
        loop.close()


# --- report -------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", action="append", default=[], help="by name; default all")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--policy", default="service,router,before")
    args = parser.parse_args()
    policies = args.policy.split(",")
    if "service" not in policies:
        policies.insert(0, "service")
    seeds = range(args.seeds)
    print(
        f"\nrouter replay: {REPLICAS} simulated replicas, {KV_BLOCKS} KV blocks each, prefill "
        f"{PREFILL_TOKENS_PER_S} tokens/s, {args.seconds:.0f} s of virtual time per row, seeds "
        f"0-{args.seeds - 1}; TTFT x: mean TTFT over the Service's with the same seed (median, "
        "and the worst seed); balance: the busiest replica's running + waiting over the mean, "
        f"where the mean is at least {router_bench.LOADED:.0f} (median over seeds)\n"
    )
    print(
        "| workload | policy | requests | prefix hit % | mean TTFT ms | p90 TTFT ms | TTFT x "
        "(worst) | p90 x | mean in flight | max/mean | max/mean where mean ≥ 4 (share) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    median = statistics.median
    for workload in router_bench.workloads():
        if args.workload and workload.name not in args.workload:
            continue
        rows = {p: [replay(workload, p, s, args.seconds) for s in seeds] for p in policies}
        base = rows["service"]
        for policy, runs in rows.items():
            ratios = [r.mean_ttft / b.mean_ttft for r, b in zip(runs, base, strict=True)]
            p90s = [r.p90_ttft / b.p90_ttft for r, b in zip(runs, base, strict=True)]
            loaded = [r.balance_loaded for r in runs if r.balance_loaded == r.balance_loaded]
            print(
                f"| {workload.name} | {policy} | {median(r.requests for r in runs):.0f} | "
                f"{median(r.hit_rate for r in runs) * 100:.1f} | "
                f"{median(r.mean_ttft for r in runs) * 1000:.0f} | "
                f"{median(r.p90_ttft for r in runs) * 1000:.0f} | "
                f"{median(ratios):.2f} ({max(ratios):.2f}) | {median(p90s):.2f} | "
                f"{median(r.mean_in_flight for r in runs):.1f} | "
                f"{median(r.balance for r in runs):.2f} | "
                f"{median(loaded) if loaded else float('nan'):.2f} "
                f"({median(r.loaded_share for r in runs) * 100:.0f} %) |"
            )


if __name__ == "__main__":
    main()
