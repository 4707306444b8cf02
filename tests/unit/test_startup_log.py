"""The engine's start read from its own lines (`llmop_engine.startup_log`).

The CPU lines are copied from a real start of vLLM 0.32's CPU build (the agent in front of
`vllm serve` on the tiny model, compile cache cold, 2026-12-05); the GPU lines are vLLM 0.32's
format strings (`gpu_model_runner.py`, `compilation/monitor.py`, `compilation/backends.py`,
`v1/engine/core.py`) filled in.
"""

from __future__ import annotations

import random
import threading

import pytest

from llmop_engine import contract
from llmop_engine.startup_log import (
    MAX_LINE,
    EngineLog,
    LineSplitter,
    Mark,
    Moments,
    Phase,
    observe,
    phases,
    starts_serving,
    untraced,
)
from llmop_engine.supervisor import EngineLines

CPU_COLD = [
    # (seconds after the agent started, line)
    (7.0, "(APIServer pid=6465) INFO 12-05 22:04:44 [api_utils.py:347]  version 0.32.0"),
    (
        27.0,
        "(Worker pid=6561) INFO 12-05 22:05:04 [cpu_model_runner.py:68] Starting to load model "
        "/root/.cache/llmop/models/tiny-llama-7e20ae8bf4b1...",
    ),
    (
        27.6,
        "(Worker pid=6561) INFO 12-05 22:05:05 [base_loader.py:82] Initializing model took "
        "0.082125 seconds",
    ),
    (28.0, "Loading safetensors checkpoint shards:   0% Completed | 0/1 [00:00<?, ?it/s]"),
    (
        28.1,
        "(Worker pid=6561) INFO 12-05 22:05:05 [default_loader.py:501] Loading weights took "
        "0.01 seconds",
    ),
    (
        28.2,
        "(Worker pid=6561) INFO 12-05 22:05:05 [cpu_model_runner.py:87] Warming up model for the "
        "compilation...",
    ),
    (43.0, "(Worker pid=6561) INFO 12-05 22:05:20 [cpu_model_runner.py:91] Warming up done."),
    (
        43.1,
        "(EngineCore pid=6523) INFO 12-05 22:05:20 [kv_cache_utils.py:2327] CPU KV cache size: "
        "524,288 tokens, Maximum concurrency for 2,048 tokens per request: 256.00x",
    ),
    (
        43.2,
        "(EngineCore pid=6523) INFO 12-05 22:05:20 [core.py:402] init engine (profile, create kv "
        "cache, warmup model) took 14.78 s",
    ),
    (44.5, "INFO:     Application startup complete."),
]

GPU_TP2 = [
    (
        20.0,
        "(Worker_TP0 pid=1) INFO [gpu_model_runner.py:5040] Starting to load model m...",
    ),
    (
        20.5,
        "(Worker_TP1 pid=2) INFO [gpu_model_runner.py:5040] Starting to load model m...",
    ),
    (50.0, "(Worker_TP0 pid=1) INFO [default_loader.py:502] Loading weights took 29.10 seconds"),
    (
        52.0,
        "(Worker_TP1 pid=2) INFO [gpu_model_runner.py:5150] Model loading took 17.2 GiB memory "
        "and 31.400000 seconds",
    ),
    (53.0, "(Worker_TP0 pid=1) INFO [monitor.py:40] Starting torch.compile"),
    (
        60.0,
        "(Worker_TP0 pid=1) INFO [backends.py:295] Directly load the compiled graph(s) for compile "
        "range (1, 8192) from the cache, took 6.512 s",
    ),
    (61.0, "(Worker_TP0 pid=1) INFO [monitor.py:62] torch.compile took 7.84 s in total"),
    (61.5, "(Worker_TP1 pid=2) INFO [monitor.py:62] torch.compile took 5.02 s in total"),
    (61.6, "(Worker_TP1 pid=2) INFO [monitor.py:62] [encoder] torch.compile took 3.00 s in total"),
    (
        80.0,
        "(Worker_TP0 pid=1) INFO [gpu_model_runner.py:6582] Graph capturing finished in 12 secs, "
        "took 0.52 GiB",
    ),
    (
        81.0,
        "(EngineCore pid=9) INFO [core.py:386] init engine (profile, create kv cache, warmup "
        "model) took 29.00 s (compilation: 7.84 s)",
    ),
]


def read(lines: list[tuple[float, str]]) -> EngineLog:
    log = EngineLog()
    for at, line in lines:
        log = observe(log, line, at)
    return log


def test_a_cold_cpu_start_is_told_phase_by_phase_and_adds_up() -> None:
    log = read(CPU_COLD)
    moments = Moments(agent_started=0.0, spawned=0.4, listening=44.6, ready=45.7)
    found = phases(log, moments)
    assert found == {
        Phase.PREPARE: 0.4,
        Phase.ENGINE_START: 26.6,  # importing torch and vLLM, three processes
        Phase.WEIGHTS: 1.1,
        Phase.COMPILE: 14.8,  # the CPU build's compile warm-up
        Phase.WARMUP: 0.3,
        Phase.API_START: 1.4,
        Phase.FIRST_PROBE: 1.1,
    }
    assert untraced(found, moments) == 0.0
    assert log.compile_hit is None  # the CPU build says neither hit nor miss


def test_a_gpu_start_takes_the_compile_seconds_vllm_reports_and_the_last_worker() -> None:
    log = read(GPU_TP2)
    found = phases(log, Moments(agent_started=0.0, spawned=1.0, listening=83.0, ready=84.0))
    assert found[Phase.ENGINE_START] == 19.0
    assert found[Phase.WEIGHTS] == 32.0  # first worker's start → last worker's end
    assert found[Phase.COMPILE] == 8.0  # the ranks compile side by side: the longer one
    assert found[Phase.WARMUP] == 21.0  # the rest of the init: profiling, KV, graph capture
    assert log.compile_hit is True
    assert log.graph_capture_seconds == 12.0


def test_a_compile_that_misses_says_so() -> None:
    line = "INFO [backends.py:927] Compiling a graph for compile range (1, 8192) takes 41.20 s"
    assert observe(EngineLog(), line, 1.0).compile_hit is False
    again = "WARNING [decorators.py] Compiling model again due to a load failure from /x"
    assert observe(observe(EngineLog(), CPU_COLD[1][1], 0), again, 1).compile_hit is False


def test_a_line_never_printed_leaves_its_neighbours_out_and_the_rest_untraced() -> None:
    without_weights = [(at, line) for at, line in CPU_COLD if "Loading weights" not in line]
    log = read(without_weights)
    moments = Moments(agent_started=0.0, spawned=0.4, listening=44.6, ready=45.7)
    found = phases(log, moments)
    assert Phase.WEIGHTS not in found
    assert Phase.WARMUP not in found
    assert found[Phase.COMPILE] == 14.8  # bracketed by its own two lines
    assert untraced(found, moments) == pytest.approx(45.7 - sum(found.values()), abs=0.1)


def test_an_engine_that_prints_nothing_known_has_only_the_agents_moments() -> None:
    log = read([(1.0, "hello"), (2.0, "INFO:     Application startup complete.")])
    moments = Moments(agent_started=0.0, spawned=0.2, listening=5.0, ready=6.0)
    found = phases(log, moments)
    assert found == {Phase.PREPARE: 0.2, Phase.FIRST_PROBE: 1.0}
    assert untraced(found, moments) == 4.8
    assert untraced(found, Moments(agent_started=0.0)) is None  # not ready yet


def test_the_first_mark_is_kept_and_the_last_updated() -> None:
    log = read([(1.0, CPU_COLD[1][1]), (5.0, CPU_COLD[1][1])])
    assert log.first[Mark.LOAD_STARTED] == 1.0
    assert log.last[Mark.LOAD_STARTED] == 5.0


def test_lines_are_split_across_chunks_and_bounded() -> None:
    splitter = LineSplitter()
    assert splitter.feed(b"abc") == []
    assert splitter.feed(b"def\nxy") == ["abcdef"]
    # A progress bar's carriage-return updates: the last one is the line.
    assert splitter.feed(b"z\r10%\r100%\n") == ["100%"]
    huge = b"q" * (MAX_LINE * 3)
    assert splitter.feed(huge) == []
    assert splitter.feed(huge + b"\nnext\n") == ["q" * MAX_LINE, "next"]
    assert splitter.feed(b"\xff\xfe bad utf-8\n") == ["\ufffd\ufffd bad utf-8"]


def test_random_chunking_gives_the_same_lines() -> None:
    text = b"".join(line.encode() + b"\n" for _, line in CPU_COLD + GPU_TP2)
    expected = [line for _, line in CPU_COLD + GPU_TP2]
    rng = random.Random(7)
    for _ in range(200):
        splitter, got, at = LineSplitter(), [], 0
        while at < len(text):
            step = rng.randint(1, 300)
            got += splitter.feed(text[at : at + step])
            at += step
        assert got == expected


def test_the_phases_are_the_ones_the_contract_names_in_order() -> None:
    assert (*(p.value for p in Phase), "untraced") == contract.STARTUP_PHASES


def test_the_api_server_starting_is_told_once() -> None:
    before = read(CPU_COLD[:-1])
    line = (
        "(APIServer pid=6465) INFO 12-05 22:05:21 [entry.py:140] Starting vLLM server on http://0"
    )
    after = observe(before, line, 44.0)
    assert starts_serving(before, after)
    assert not starts_serving(after, observe(after, CPU_COLD[-1][1], 44.5))


def test_the_agent_waits_for_an_early_engines_first_line_and_no_longer() -> None:
    """The agent imports its own servers once the engine printed its first line (past its
    imports), or after `FIRST_LINE_WAIT_SECONDS`, so the two do not share a small CPU quota
    on the engine's path to its first token."""
    lines = EngineLines()
    assert not lines.wait_first(0.01)  # silent: the wait ends by its bound
    thread = threading.Timer(0.05, lambda: lines.line("Starting to load model m...", 1.0))
    thread.start()
    assert lines.wait_first(5.0)
    thread.join()
    assert lines.wait_first(0.0)  # told once, told for good
