"""A multi-node group on real vLLM CPU processes: a leader and a worker agent (issue 23 item 4).

Two `vllm serve` processes form one engine with `--nnodes 2` and pipeline parallelism 2 (vLLM's
native multiprocess multi-node mode, `--distributed-executor-backend mp`) on the tiny model,
127.0.0.1 as the master address: rank 0 under a leader agent (the API, deep probe, drain), rank 1
`--headless` under a worker agent (`LLMOP_ROLE=worker`). Two pairs, one after the other (each
engine ~3.6 GiB, never two pairs at once):

- `TestServingAndDrain`: a completion through the leader; the worker's probes and metrics as
  designed (ready, no queue depth); then SIGTERM to both agents at the same moment under
  streaming requests: 0 lost, the worker outlives the leader's drain.
- `TestWorkerKilled`: `kill -9` of the worker's vLLM tree: the worker agent exits non-zero at once
  (its container restarts, so LWS recreates the group); the leader's deep probe hangs and its
  readiness goes off; the seconds are printed in the terminal summary.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from engine import real_vllm
from engine.real_vllm import MEASURED, Engine, http_get, metric_values, stream
from llmop_engine import contract

pytestmark = [pytest.mark.vllm, pytest.mark.engine]

START_TIMEOUT = 300.0
# Default health settings (the measurement is of the defaults), faster polling only.
AGENT_ENV = {
    "LLMOP_POLL_INTERVAL_SECONDS": "0.5",
    "LLMOP_ENDPOINT_PROPAGATION_SECONDS": "1",
    # A bound, not a wait: the drain ends when the streams do. PP=2 over gloo between two
    # processes makes about 2-3 tokens/s on 2 shared cores; 3 streams of 60 tokens once
    # outlasted the default 30 s under the full suite's load and were cut.
    "LLMOP_DRAIN_SECONDS": "90",
}
DRAIN_STREAM_TOKENS = 16
"""Short enough to end well inside the drain bound however loaded the machine, long enough to
be mid-stream when SIGTERM comes 2 s after they start."""
WORKER_EXIT_BOUND = (
    float(AGENT_ENV["LLMOP_ENDPOINT_PROPAGATION_SECONDS"])
    + float(AGENT_ENV["LLMOP_DRAIN_SECONDS"])
    + contract.HTTP_KEEP_ALIVE_SECONDS
    + 2 * contract.ENGINE_EXIT_GRACE_SECONDS
    + 20.0
)
"""How long both agents may take after SIGTERM: the worker's whole drain budget when it never
sees its leader go, then its rank's SIGTERM grace, plus slack. The worker normally stops seconds
after the leader; why it stopped is printed in the summary (its log says)."""
READY_OFF_BOUND = 30.0
"""Issue 23's goal: a dead worker takes its group out of service within 30 s."""


def secs(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f}s"


def group_args(rank: int, master_port: int) -> list[str]:
    args = [
        "--pipeline-parallel-size",
        "2",
        "--nnodes",
        "2",
        "--node-rank",
        str(rank),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(master_port),
        "--distributed-executor-backend",
        "mp",
    ]
    return [*args, "--headless"] if rank else args


@contextlib.contextmanager
def pair(vllm_dir: Path, model_dir: Path, tmp: Path, name: str) -> Iterator[tuple[Engine, Engine]]:
    master = real_vllm.free_port()
    leader = real_vllm.start(
        vllm_dir,
        model_dir,
        tmp / "leader",
        engine_args=group_args(0, master),
        env=AGENT_ENV,
        compiled=True,
    )
    worker = real_vllm.start(
        vllm_dir,
        model_dir,
        tmp / "worker",
        engine_args=group_args(1, master),
        env={**AGENT_ENV, "LLMOP_ROLE": "worker"},
        compiled=True,
    )
    try:
        started = time.monotonic()

        async def both() -> None:
            await asyncio.gather(
                real_vllm.wait_ready(leader, START_TIMEOUT),
                real_vllm.wait_ready(worker, START_TIMEOUT),
            )

        try:
            asyncio.run(both())
        except Exception as exc:
            raise AssertionError(
                f"group did not start: {exc}\nLEADER:\n{leader.log_tail()}\n"
                f"WORKER:\n{worker.log_tail()}"
            ) from exc
        MEASURED[f"group {name}: start to both ready"] = f"{time.monotonic() - started:.1f}s"
        yield leader, worker
    finally:
        worker.stop()
        leader.stop()
        MEASURED[f"group {name}: peak RSS leader / worker"] = (
            f"{real_vllm.gib(leader.peak_rss)} / {real_vllm.gib(worker.peak_rss)}"
        )


@pytest.fixture(scope="class")
def group(
    vllm_dir: Path, model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Engine, Engine]]:
    """Class-scoped: ended before the next class starts its pair (never two pairs at once)."""
    with pair(vllm_dir, model_dir, tmp_path_factory.mktemp("group-a"), "A") as engines:
        yield engines


class TestServingAndDrain:
    def test_serves_and_worker_probes(self, group: tuple[Engine, Engine]) -> None:
        leader, worker = group

        async def go() -> None:
            async with aiohttp.ClientSession() as http:
                result = await stream(http, leader, 16)
                assert result.ok, (result, leader.log_tail(), worker.log_tail())
                live, _ = await http_get(http, worker.probes + contract.LIVEZ_PATH)
                ready, body = await http_get(http, worker.probes + contract.READYZ_PATH)
                assert (live, ready) == (200, 200), body
                assert "leader's rendezvous port answers" in body
                _, metrics = await http_get(http, worker.probes + contract.METRICS_PATH)
                assert metric_values(metrics, "llmop_engine_ready") == [1.0]
                assert contract.QUEUE_DEPTH_METRIC not in metrics
                _, leader_metrics = await http_get(http, leader.probes + contract.METRICS_PATH)
                assert metric_values(leader_metrics, contract.QUEUE_DEPTH_METRIC) != []
                api, _ = await http_get(http, f"http://127.0.0.1:{worker.api_port}/health", 1.0)
                assert api == 0, "a headless rank has no API server"

        asyncio.run(go())

    def test_sigterm_to_both_drains_with_nothing_lost(self, group: tuple[Engine, Engine]) -> None:
        leader, worker = group

        async def go() -> tuple[list[real_vllm.StreamResult], float, float]:
            async with aiohttp.ClientSession() as http:
                streams = [
                    asyncio.create_task(stream(http, leader, DRAIN_STREAM_TOKENS)) for _ in range(3)
                ]
                await asyncio.sleep(2.0)
                sent = time.monotonic()
                # Kubernetes signals every pod of the group at once.
                leader.proc.send_signal(signal.SIGTERM)
                worker.proc.send_signal(signal.SIGTERM)
                results = await asyncio.gather(*streams)
                # Each exit timed on its own: the worker must still run when the leader is gone.
                exits: dict[str, float] = {}
                while len(exits) < 2 and time.monotonic() - sent < WORKER_EXIT_BOUND:
                    for name, e in (("leader", leader), ("worker", worker)):
                        if name not in exits and e.proc.poll() is not None:
                            exits[name] = time.monotonic() - sent
                    await asyncio.sleep(0.1)
                leader_code, worker_code = leader.proc.poll(), worker.proc.poll()
                leader_done = exits.get("leader", float("inf"))
                worker_done = exits.get("worker", float("inf"))
                assert (leader_code, worker_code) == (0, 0), (
                    leader_code,
                    worker_code,
                    leader.log_tail(),
                    worker.log_tail(),
                )
                return results, leader_done, worker_done

        results, leader_done, worker_done = asyncio.run(go())
        lost = [r for r in results if not r.ok]
        MEASURED["group drain: streams / lost / leader exit / worker exit after SIGTERM"] = (
            f"{len(results)} / {len(lost)} / {leader_done:.1f}s / {worker_done:.1f}s"
        )
        said = [line for line in worker.log_tail(200_000).splitlines() if "drain: stop" in line]
        MEASURED["group drain: why the worker stopped its rank"] = (
            said[-1].split("drain: ", 1)[1] if said else "its rank had already exited"
        )
        MEASURED["group drain: processes the leader's engine left in its group (killed)"] = (
            "yes" if "exited leaving" in leader.log_tail(200_000) else "none"
        )
        assert lost == [], (lost, leader.log_tail(), worker.log_tail())
        assert worker_done > leader_done, (leader_done, worker_done)


class TestWorkerKilled:
    def test_worker_killed_takes_the_group_out(
        self, vllm_dir: Path, model_dir: Path, tmp_path: Path
    ) -> None:
        with pair(vllm_dir, model_dir, tmp_path, "B") as (leader, worker):

            async def go() -> dict[str, float | None]:
                out: dict[str, float | None] = {"worker exit": None, "leader unready": None}
                async with aiohttp.ClientSession() as http:
                    assert (await stream(http, leader, 4)).ok
                    tree = [worker.vllm_pid(), *real_vllm.descendants(worker.vllm_pid())]
                    killed = time.monotonic()
                    for pid in tree:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                    while time.monotonic() - killed < 90:
                        now = time.monotonic() - killed
                        if out["worker exit"] is None and worker.proc.poll() is not None:
                            out["worker exit"] = now
                        code, _ = await http_get(http, leader.probes + contract.READYZ_PATH)
                        if out["leader unready"] is None and code == 503:
                            out["leader unready"] = now
                        # The leader's liveness then fails after the stall budget (60 s by
                        # default; measured 60.9 s): not waited for, the test's time is dear.
                        if out["worker exit"] is not None and out["leader unready"] is not None:
                            break
                        await asyncio.sleep(0.5)
                out["worker exit code"] = worker.proc.poll()
                return out

            out = asyncio.run(go())
            MEASURED["worker kill -9: worker agent exit / leader unready after"] = (
                f"{secs(out['worker exit'])} / {secs(out['leader unready'])}"
            )
            why = (out, leader.log_tail(), worker.log_tail())
            worker_exit, unready = out["worker exit"], out["leader unready"]
            assert worker_exit is not None, why
            assert worker_exit < 10.0, why
            assert out["worker exit code"] not in (0, None), why
            assert unready is not None, why
            assert unready < READY_OFF_BOUND, why
