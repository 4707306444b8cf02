"""The agent relays the engine's output unchanged and reads where its start went from it.

Real processes: the relay on OS pipes and a child that writes like vLLM does (progress bars,
both streams, a line longer than any kept), and the agent in front of the simulator, which prints
vLLM's own start lines.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from engine.fleet import Fleet
from llmop_engine.startup_log import MAX_LINE
from llmop_engine.supervisor import relay

pytestmark = pytest.mark.engine

CHILD = r"""
import sys, time
out = sys.stdout.buffer
out.write(b"Loading safetensors checkpoint shards:   0%\r"); out.flush()
time.sleep(0.05)
out.write(b"Loading safetensors checkpoint shards: 100%\n"); out.flush()
sys.stderr.write("a warning on stderr\n"); sys.stderr.flush()
out.write(b"x" * 300000 + b"\n")
out.write("Loading weights took 0.01 seconds \u2713\n".encode())
out.write(b"no newline at the end")
"""


def run_relayed(target_closed: bool) -> tuple[bytes, list[str], float]:
    lines: list[str] = []
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    assert child.stdout is not None
    source = os.dup(child.stdout.fileno())
    child.stdout.close()
    read_end, write_end = os.pipe()
    if target_closed:
        os.close(read_end)
    received = bytearray()

    def drain() -> None:
        while chunk := os.read(read_end, 65536):
            received.extend(chunk)

    reader = None if target_closed else threading.Thread(target=drain, daemon=True)
    if reader is not None:
        reader.start()
    started = time.monotonic()
    relay(source, write_end, lambda line, _at: lines.append(line))
    took = time.monotonic() - started
    os.close(write_end)
    if reader is not None:
        reader.join(10)
    assert child.wait(10) == 0
    return bytes(received), lines, took


def test_the_relay_copies_every_byte_and_hands_over_each_line() -> None:
    received, lines, _ = run_relayed(target_closed=False)
    expected = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, check=True).stdout
    # Unchanged, in order (stderr was merged into the same pipe by the child's Popen here).
    assert received.replace(b"a warning on stderr\n", b"") == expected
    assert lines == [
        "Loading safetensors checkpoint shards: 100%",
        "a warning on stderr",
        "x" * MAX_LINE,
        "Loading weights took 0.01 seconds \u2713",
    ]


def test_a_target_that_takes_no_writes_never_blocks_the_engine() -> None:
    _, lines, took = run_relayed(target_closed=True)
    assert "Loading weights took 0.01 seconds \u2713" in lines
    assert took < 10


@pytest.mark.timeout(60)
def test_the_agent_reports_where_the_simulators_start_went(fleet: Fleet) -> None:
    r = fleet.start(["--sim-load-seconds", "2"])

    async def scenario() -> tuple[dict[str, object], str]:
        await r.wait_ready(40)
        async with aiohttp.ClientSession() as http:
            async with http.get(r.probe_url + "/status") as resp:
                status = await resp.json()
            async with http.get(r.probe_url + "/metrics") as resp:
                metrics = await resp.text()
        return status, metrics

    status, metrics = asyncio.run(scenario())
    startup = status["startup"]
    assert isinstance(startup, dict), status
    phases = startup["phases"]
    print(f"\nsimulator start: {startup}")
    assert set(phases) >= {
        "agentStart",
        "prepare",
        "engineStart",
        "weights",
        "warmup",
        "apiStart",
        "firstProbe",
        "untraced",
    }, startup
    assert 1.9 <= phases["weights"] <= 3.0, startup
    # Every second of the start is in a phase: nothing but rounding is left untraced.
    assert phases["untraced"] <= 0.5, startup
    assert abs(sum(phases.values()) - startup["totalSeconds"]) <= 0.5, startup
    assert 'llmop_engine_startup_phase_seconds{phase="weights"}' in metrics
    log = r.log_tail(200_000)
    # The engine's own lines reach the log through the relay, and the agent's summary too.
    assert "Starting vLLM server on http" in log, log[-3000:]
    assert "start: ready" in log, log[-3000:]


@pytest.mark.timeout(60)
def test_with_a_compile_cache_the_agent_seeds_before_it_spawns(
    fleet: Fleet, tmp_path: Path
) -> None:
    """The compile cache path: the agent's servers first (the kubelet probes them while a large
    cache is copied), then the seed, then the engine; the seconds between are `prepare`."""
    cache = tmp_path / "model-cache"
    cache.mkdir()
    r = fleet.start(
        ["--sim-load-seconds", "1"],
        LLMOP_COMPILE_CACHE_KEY="ab" * 32,
        LLMOP_MODEL_CACHE_DIR=str(cache),
        LLMOP_COMPILE_CACHE_LOCAL_DIR=str(tmp_path / "local"),
    )

    async def scenario() -> dict[str, Any]:
        await r.wait_ready(40)
        async with aiohttp.ClientSession() as http, http.get(r.probe_url + "/status") as resp:
            status: dict[str, Any] = await resp.json()
        return status

    status = asyncio.run(scenario())
    assert status["compileCache"]["seed"] == "miss", status["compileCache"]
    phases = status["startup"]["phases"]
    assert {"agentStart", "prepare", "engineStart", "weights"} <= phases.keys(), phases
    # Here the agent imported everything before it spawned: its start is longer than the
    # early spawn's (which the test above sees as ~0.1 s).
    assert phases["untraced"] <= 0.5, phases
