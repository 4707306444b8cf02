"""Rolling replacement under streaming load: the drain benchmark shared by the engine test and
`make bench-engine`.

Three replicas behind `Endpoints`; 32 clients stream for the whole run; each replica in turn is
terminated (preStop + SIGTERM with the agent, plain SIGTERM without), its successor started and
awaited ready, then the next. With the agent the loss must be zero; without it, in-flight streams
are aborted and requests routed in the propagation gap are refused.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

from support.harness.loadgen import Endpoints, LoadResult, run_clients
from support.harness.replicas import Replica

MODEL = "sim-model"


@dataclass
class RolloutResult:
    with_agent: bool
    load: LoadResult
    replaced: int
    seconds: float


@dataclass(frozen=True)
class RolloutConfig:
    replicas: int = 3
    concurrency: int = 32
    duration: float = 30.0
    max_tokens: int = 96
    warmup: float = 3.0
    poll_seconds: float = 0.5
    propagation_seconds: float = 2.0
    drain_seconds: float = 20.0
    load_seconds: float = 2.0


def _start(log_dir: Path, with_agent: bool, cfg: RolloutConfig) -> Replica:
    engine = ["--sim-load-seconds", f"{cfg.load_seconds:g}", "--max-num-seqs", "64"]
    if with_agent:
        env = {
            "LLMOP_ENDPOINT_PROPAGATION_SECONDS": f"{cfg.propagation_seconds:g}",
            "LLMOP_DRAIN_SECONDS": f"{cfg.drain_seconds:g}",
            "LLMOP_DEEP_PROBE_INTERVAL_SECONDS": "2",
            "LLMOP_POLL_INTERVAL_SECONDS": "0.5",
        }
        return Replica.start(log_dir, model=MODEL, engine_args=engine, env=env)
    # The baseline: vLLM's default --shutdown-timeout 0 and no readiness beyond "process is up".
    return Replica.start(
        log_dir, with_agent=False, model=MODEL, engine_args=[*engine, "--shutdown-timeout", "0"]
    )


async def rolling_replace(log_dir: Path, with_agent: bool, cfg: RolloutConfig) -> RolloutResult:
    started = time.monotonic()
    fleet = [_start(log_dir, with_agent, cfg) for _ in range(cfg.replicas)]
    everything = list(fleet)
    endpoints = Endpoints(cfg.poll_seconds)
    try:
        await asyncio.gather(*(r.wait_ready(120) for r in fleet))
        for r in fleet:
            endpoints.add(r.name, r.api_url, r.readiness_url)
        endpoints.start()
        await asyncio.sleep(cfg.poll_seconds * 2)
        load = asyncio.create_task(
            run_clients(endpoints, cfg.concurrency, cfg.duration, MODEL, cfg.max_tokens)
        )
        await asyncio.sleep(cfg.warmup)
        exits: list[asyncio.Task[int]] = []
        for old in list(fleet):
            await old.begin_drain()
            new = _start(log_dir, with_agent, cfg)
            everything.append(new)
            exits.append(asyncio.create_task(old.wait_exit(cfg.drain_seconds + 60)))
            await new.wait_ready(120)
            endpoints.add(new.name, new.api_url, new.readiness_url)
            fleet.remove(old)
            fleet.append(new)
        result = await load
        await asyncio.gather(*exits)
        return RolloutResult(with_agent, result, cfg.replicas, time.monotonic() - started)
    finally:
        await endpoints.stop()
        for r in everything:
            r.stop()
