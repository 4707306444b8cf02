"""Agent + simulator as real processes: loading, idle probing, saturation, hang and crash."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from pathlib import Path

import aiohttp
import pytest

from engine.fleet import Fleet, http_status
from support.harness.loadgen import Endpoints, run_clients, stream_completion
from support.harness.replicas import port_open

pytestmark = pytest.mark.engine

STALL = 5.0
INTERVAL = 2.0
MODEL = "sim-model"


@pytest.mark.timeout(90)
def test_loading_is_alive_not_ready_then_ready_within_one_interval(fleet: Fleet) -> None:
    load_seconds = 20.0
    r = fleet.start(["--sim-load-seconds", f"{load_seconds:g}"])

    async def scenario() -> tuple[float, float, list[tuple[int, int]]]:
        seen: list[tuple[int, int]] = []
        started = time.monotonic()
        listen_at = ready_at = None
        async with aiohttp.ClientSession() as http:
            while time.monotonic() - started < load_seconds + 30:
                if listen_at is None and port_open(r.api_port):
                    listen_at = time.monotonic()
                live = await http_status(http, r.probe_url + "/livez")
                ready = await http_status(http, r.probe_url + "/readyz")
                if listen_at is None:
                    seen.append((live, ready))
                if ready == 200:
                    ready_at = time.monotonic()
                    break
                await asyncio.sleep(0.2)
            async with http.get(r.probe_url + "/status") as resp:
                assert (await resp.json())["phase"] == "ready"
        assert listen_at is not None, r.log_tail()
        assert ready_at is not None, r.log_tail()
        return listen_at - started, ready_at - listen_at, seen

    loading_for, ready_after_listen, seen = asyncio.run(scenario())
    print(f"\nport listened after {loading_for:.1f}s; ready {ready_after_listen:.2f}s later")
    assert loading_for >= load_seconds - 2
    # During the load every liveness check passed and no readiness check did (0 = probe server
    # not up yet in the first instant after exec, also not ready).
    answered = [(live, ready) for live, ready in seen if live]
    assert len(answered) >= 10
    assert all(live == 200 and ready == 503 for live, ready in answered), seen
    assert ready_after_listen <= INTERVAL


@pytest.mark.timeout(60)
def test_idle_sends_one_probe_per_interval_and_crash_exits_nonzero(fleet: Fleet) -> None:
    r = fleet.start(["--sim-load-seconds", "0.5"])

    async def scenario() -> tuple[int, int, int]:
        await r.wait_ready(30)
        await asyncio.sleep(0.5)
        before = await r.sim_stats()
        window = 5 * INTERVAL
        await asyncio.sleep(window)
        after = await r.sim_stats()
        probes = int(str(after["probeRequestsTotal"])) - int(str(before["probeRequestsTotal"]))
        clients = int(str(after["clientRequestsTotal"]))
        await r.set_fault("crash")
        code = await r.wait_exit(20)
        return probes, clients, code

    probes, clients, code = asyncio.run(scenario())
    print(f"\nidle: {probes} one-token probes in {5 * INTERVAL:.0f}s; crash exit code {code}")
    assert clients == 0
    assert 4 <= probes <= 6  # one per interval (5 intervals, ± the window's phase)
    # The simulator exits 0 after a crash, as vLLM does once its EngineCore died; the agent must
    # not turn that into success (the pod would read Completed instead of restarting).
    assert code == 1


@pytest.mark.timeout(60)
def test_hang_with_pending_work_fails_liveness_within_stall(fleet: Fleet) -> None:
    r = fleet.start(["--sim-load-seconds", "0.5"])

    async def scenario() -> tuple[float, float, int, float, int | None]:
        await r.wait_ready(30)
        async with aiohttp.ClientSession() as http:
            streams = [
                asyncio.create_task(stream_completion(http, r.api_url, MODEL, 2000))
                for _ in range(4)
            ]
            await asyncio.sleep(1.0)
            assert await http_status(http, r.probe_url + "/livez") == 200
            await r.set_fault("hang")
            hung_at = time.monotonic()
            not_ready_at = None
            while time.monotonic() - hung_at < STALL + INTERVAL + 10:
                if not_ready_at is None and await http_status(http, r.probe_url + "/readyz") == 503:
                    not_ready_at = time.monotonic()
                if await http_status(http, r.probe_url + "/livez") == 503:
                    break
                await asyncio.sleep(0.1)
            dead_at = time.monotonic()
            ready = await http_status(http, r.probe_url + "/readyz")
            # What the kubelet does on the liveness failure: SIGTERM. A hung engine gets no
            # drain: the agent ends it at once and exits non-zero (the pod's lastState: Error).
            r.proc.send_signal(signal.SIGTERM)
            stop_sent = time.monotonic()
            code = await asyncio.to_thread(r.proc.wait, 15)
            stopped_after = time.monotonic() - stop_sent
            for s in streams:
                s.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*streams, return_exceptions=True)
        assert not_ready_at is not None
        return not_ready_at - hung_at, dead_at - hung_at, ready, stopped_after, code

    not_ready_after, dead_after, ready, stopped_after, code = asyncio.run(scenario())
    print(
        f"\nhang: /readyz 503 after {not_ready_after:.1f}s, /livez 503 after {dead_after:.1f}s "
        f"(stallSeconds {STALL:g}, interval {INTERVAL:g}); SIGTERM -> exit {code} in "
        f"{stopped_after:.1f}s"
    )
    assert STALL - 1.0 <= dead_after <= STALL + INTERVAL
    assert ready == 503
    assert not_ready_after <= dead_after
    assert code == 1, r.log_tail()
    # No propagation wait and no drain budget for a hung engine: SIGTERM, SIGKILL after 2 s.
    assert stopped_after < 5.0, r.log_tail()


@pytest.mark.timeout(120)
def test_saturation_never_fails_probes_and_sends_no_probe_requests(fleet: Fleet) -> None:
    max_num_seqs = 4
    r = fleet.start(["--sim-load-seconds", "0.5", "--max-num-seqs", str(max_num_seqs)])
    duration = 60.0

    async def scenario() -> tuple[list[tuple[float, int, int]], int, int, list[int], int]:
        await r.wait_ready(30)
        endpoints = Endpoints(0.5)
        endpoints.add(r.name, r.api_url, r.readiness_url)
        endpoints.start()
        await asyncio.sleep(1.0)
        load = asyncio.create_task(
            run_clients(endpoints, 3 * max_num_seqs, duration, MODEL, max_tokens=32)
        )
        await asyncio.sleep(3.0)  # saturation established: the queue never drains from here on
        before = int(str((await r.sim_stats())["probeRequestsTotal"]))
        bad: list[tuple[float, int, int]] = []
        waiting: list[int] = []
        checks = 0
        async with aiohttp.ClientSession() as http:
            while not load.done():
                live = await http_status(http, r.probe_url + "/livez")
                ready = await http_status(http, r.probe_url + "/readyz")
                checks += 1
                if (live, ready) != (200, 200):
                    bad.append((time.monotonic(), live, ready))
                stats = await r.sim_stats()
                if not load.done():
                    waiting.append(int(str(stats["waiting"])))
                    after = int(str(stats["probeRequestsTotal"]))
                await asyncio.sleep(0.5)
        result = await load
        await endpoints.stop()
        assert result.lost == 0, result.reasons
        return bad, after - before, checks, waiting, result.ok

    bad, probes, checks, waiting, ok = asyncio.run(scenario())
    saturated = sum(1 for w in waiting if w > 0)
    print(
        f"\nsaturation {duration:.0f}s: {checks} probe checks, {len(bad)} failed; "
        f"{probes} agent probe requests while busy; {ok} requests served; queue > 0 in "
        f"{saturated}/{len(waiting)} samples"
    )
    assert bad == []
    assert probes == 0
    assert checks >= 50
    assert saturated >= 0.9 * len(waiting)


@pytest.mark.timeout(90)
def test_saturated_engine_without_metrics_is_not_killed(fleet: Fleet) -> None:
    """--disable-log-stats: no queue, no progress counters. The idle probe queues behind real
    work and times out; that must not fail liveness (it did: the agent read "idle")."""
    r = fleet.start(
        ["--sim-load-seconds", "0.5", "--max-num-seqs", "2", "--disable-log-stats"],
    )
    window = 3 * STALL

    async def scenario() -> tuple[list[int], int, str]:
        await r.wait_ready(30)
        async with aiohttp.ClientSession() as http:
            # 16 clients over 2 slots, ~4 s each: a probe waits ~30 s for a slot (timeout 2 s).
            load = [
                asyncio.create_task(stream_completion(http, r.api_url, MODEL, 200))
                for _ in range(16)
            ]
            lives: list[int] = []
            started = time.monotonic()
            while time.monotonic() - started < window:
                lives.append(await http_status(http, r.probe_url + "/livez"))
                await asyncio.sleep(0.25)
            async with http.get(r.probe_url + "/status") as resp:
                probe = (await resp.json())["lastDeepProbe"]
            for t in load:
                t.cancel()
            await asyncio.gather(*load, return_exceptions=True)
        return lives, len(lives), str(probe)

    lives, checks, probe = asyncio.run(scenario())
    print(f"\nno metrics, saturated {window:.0f}s: {checks} liveness checks; last probe {probe}")
    assert "timed out" in probe  # the situation the agent must tolerate did arise
    assert all(code == 200 for code in lives), lives
    assert "exports no vllm:* metrics" in r.log_tail(50000)


@pytest.mark.timeout(60)
def test_download_progress_in_status_while_the_cache_grows(fleet: Fleet, tmp_path: Path) -> None:
    cache = tmp_path / "models"
    cache.mkdir()
    r = fleet.start(["--sim-load-seconds", "40"], LLMOP_MODEL_CACHE_DIR=str(cache))
    weights = cache / "model.safetensors"

    async def scenario() -> dict[str, object]:
        deadline = time.monotonic() + 30
        async with aiohttp.ClientSession() as http:
            while time.monotonic() < deadline:
                with weights.open("ab") as f:  # what a download looks like from outside
                    f.write(b"\0" * (1 << 20))
                await asyncio.sleep(0.5)
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(r.probe_url + "/status") as resp:
                        status = await resp.json()
                    if status["phase"] == "downloading" and status["modelCacheBytes"]:
                        return dict(status)
        raise AssertionError(f"no download progress in /status\n{r.log_tail()}")

    status = asyncio.run(scenario())
    got = status["modelCacheBytes"]
    assert isinstance(got, int)
    # Measured at the agent's last poll: at most the size now, and whole MiB written by then.
    assert 0 < got <= weights.stat().st_size
    assert got % (1 << 20) == 0
