"""The agent in front of the real engine: vLLM's CPU build serving a tiny random-weight model.

Real processes, no Kubernetes, no GPU, no model hub. Three engines, one after the other (each
~4.2 GiB and 60-100 s to start), each shared by the tests of one class:

- `TestServing` (metrics on, no API key): probes while loading / idle / busy, the agent's load
  figures equal vLLM's own, hangs of the EngineCore and of the API server (SIGSTOP) detected and
  recovered from (SIGCONT), then a drain within budget under streams: 0 lost, late requests
  served;
- `TestNoMetricsApiKey` (`--disable-log-stats`, `VLLM_API_KEY`): the deep probe with a key, a
  saturated engine without metrics is not killed, a crash (EngineCore killed; vLLM exits 0)
  makes the agent exit non-zero;
- `TestOverBudget`: a drain whose work outlasts the budget ends every stream cleanly, without
  SIGKILL, exit code 0, the cut reported;
- `TestKeepAliveClients`: clients pinned to the draining engine over keep-alive connections get
  `Connection: close` (the agent's `--middleware`), move to another replica, lose nothing, and
  the drain ends long before its budget.

Measured numbers are printed in the terminal summary (tests/engine/conftest.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import os
import re
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from engine import real_vllm
from engine.keepalive import Outcome, PinnedClient, Target, run_clients
from engine.real_vllm import (
    LIVENESS_FAILURE_THRESHOLD,
    MEASURED,
    Engine,
    http_get,
    metric_values,
    probe_failures,
    stream,
)
from engine.real_vllm import LIVEZ_TIMEOUT as LIVEZ
from engine.real_vllm import READYZ_TIMEOUT as READYZ
from llmop_engine import contract
from llmop_router.engine_load import Reading, parse
from support.harness.replicas import Replica

pytestmark = [pytest.mark.vllm, pytest.mark.engine]

STALL = 12.0
INTERVAL = 4.0
PROBE_TIMEOUT = 3.0
PROPAGATION = 1.0
AGENT_ENV = {
    "LLMOP_STALL_SECONDS": f"{STALL:g}",
    "LLMOP_DEEP_PROBE_INTERVAL_SECONDS": f"{INTERVAL:g}",
    "LLMOP_DEEP_PROBE_TIMEOUT_SECONDS": f"{PROBE_TIMEOUT:g}",
    "LLMOP_POLL_INTERVAL_SECONDS": "0.5",
    "LLMOP_ENDPOINT_PROPAGATION_SECONDS": f"{PROPAGATION:g}",
    "LLMOP_DRAIN_SECONDS": "30",
}
START_TIMEOUT = 300.0


def _engine(
    vllm_dir: Path,
    model_dir: Path,
    tmp: Path,
    name: str,
    engine_args: list[str],
    *,
    env: dict[str, str] | None = None,
    api_key: str | None = None,
) -> Iterator[Engine]:
    e = real_vllm.start(
        vllm_dir,
        model_dir,
        tmp,
        engine_args=engine_args,
        env={**AGENT_ENV, **(env or {})},
        api_key=api_key,
    )
    try:
        took = asyncio.run(real_vllm.wait_ready(e, START_TIMEOUT))
        MEASURED[f"{name}: start to ready"] = f"{took:.1f}s"
        yield e
    finally:
        e.stop()
        MEASURED[f"{name}: peak RSS of agent + vLLM tree"] = real_vllm.gib(e.peak_rss)


def secs(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f}s"


async def pending_streams(
    http: aiohttp.ClientSession, e: Engine, n: int, tokens: int
) -> list[asyncio.Task[real_vllm.StreamResult]]:
    return [asyncio.create_task(stream(http, e, tokens)) for _ in range(n)]


async def saturating_streams(
    http: aiohttp.ClientSession, e: Engine, n: int, tokens: int
) -> list[asyncio.Task[None]]:
    """`n` clients that each start a new long stream as soon as theirs ends, until cancelled:
    the engine stays saturated however fast it drains (a fixed batch of 24 streams over 2 slots
    once finished before the window did, and then no deep probe had anything to queue behind)."""

    async def client() -> None:
        while True:
            await stream(http, e, tokens)

    return [asyncio.create_task(client()) for _ in range(n)]


async def status(http: aiohttp.ClientSession, e: Engine) -> dict[str, object]:
    async with http.get(e.probes + "/status") as r:
        body: dict[str, object] = await r.json()
        return body


async def wait_for(
    http: aiohttp.ClientSession, url: str, want: int, timeout: float, step: float = 0.1
) -> float | None:
    """Seconds until `url` answers `want`, or None."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        code, _ = await http_get(http, url, timeout=2.0)
        if code == want:
            return time.monotonic() - started
        await asyncio.sleep(step)
    return None


@dataclasses.dataclass(frozen=True)
class Read:
    """One read of the busy test: when, the deep probes the agent had sent by then, vLLM's own
    (waiting, running) (None: its /metrics did not answer), the agent's, and the KV capacity the
    agent published."""

    at: float
    probes_sent: float
    vllm: tuple[float, float] | None
    agent: tuple[object, object]
    capacity: object


BUSY_WINDOWS = 3
"""Measurement windows of the busy test at most (each up to 120 s of reads)."""
BUSY_READ_GAP = 3.0
BUSY_PENDING = 6
"""An interval counts as busy throughout when both its reads saw at least BUSY_PENDING requests
in vLLM (more than its 4 slots: work queued) and were at most BUSY_READ_GAP apart. The clients run
in this process; when it is held up they stop replacing streams, and the engine can drain and go
idle, which the agent then rightly probes (CI once read 2 pending, then 10 pending 2.9 s later
with one probe between). Draining 6 streams of 1,500 tokens takes far longer than 3 s."""


PROBE_TIMED_OUT = "deep probe failed: timed out"
"""The agent's log line for a deep probe that got no answer in time."""


def busy_intervals(reads: list[Read]) -> list[tuple[Read, Read]]:
    return [
        (a, b)
        for a, b in itertools.pairwise(reads)
        if a.vllm
        and b.vllm
        and sum(a.vllm) >= BUSY_PENDING
        and sum(b.vllm) >= BUSY_PENDING
        and b.at - a.at <= BUSY_READ_GAP
    ]


def _reason(answer: str, prefixes: tuple[str, ...]) -> bool:
    """The agent's probe answer (`{"ok":..., "reason":...}`) gives one of these reasons."""
    with contextlib.suppress(ValueError, AttributeError):
        return str(json.loads(answer).get("reason", "")).startswith(prefixes)
    return False


def reads_line(reads: list[Read]) -> list[tuple[float, float, float | None]]:
    first = reads[0].at if reads else 0.0
    return [(round(r.at - first, 1), r.probes_sent, r.vllm and sum(r.vllm)) for r in reads]


class TestServing:
    @pytest.fixture(scope="class")
    @classmethod
    def engine(cls, vllm_dir: Path, model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
        yield from _engine(
            vllm_dir, model_dir, tmp_path_factory.mktemp("vllm-a"), "engine A",
            ["--max-num-seqs", "4"], env={"LLMOP_DRAIN_SECONDS": "60"},
        )  # fmt: skip

    @pytest.mark.timeout(420)
    def test_loading_is_alive_not_ready(self, engine: Engine) -> None:
        answered = [(live, ready) for live, ready in engine.loading_seen if live]
        print(f"\nloading: {len(answered)} probe pairs, ready after {engine.start_seconds:.0f}s")
        assert len(answered) >= 10  # the port does not listen for a minute or more
        assert all(pair == (200, 503) for pair in answered), engine.loading_seen

    @pytest.mark.timeout(60)
    def test_idle_deep_probe_without_api_key(self, engine: Engine) -> None:
        async def scenario() -> dict[str, object]:
            async with aiohttp.ClientSession() as http:
                await asyncio.sleep(INTERVAL + 1)
                return await status(http, engine)

        s = asyncio.run(scenario())
        probe = s["lastDeepProbe"]
        assert isinstance(probe, dict)
        assert probe["ok"] is True, probe
        assert (s["phase"], s["ready"], s["live"]) == ("ready", True, True)
        assert s["servedModelName"] == real_vllm.MODEL_NAME
        MEASURED["deep probe latency (idle, one token)"] = f"{probe['latencySeconds']}s"

    @pytest.mark.timeout(150 * BUSY_WINDOWS)
    def test_busy_metrics_equal_vllms_own_and_no_probe_while_busy(self, engine: Engine) -> None:  # noqa: C901, PLR0915
        """With 4 slots and 10 streams kept in flight: running 4, the rest waiting, read at one
        moment; no deep probe is sent while vLLM itself reports pending work."""

        async def probes_sent(http: aiohttp.ClientSession) -> float | None:
            # Until it answers: this process can be held up for seconds here (see probe_failures).
            # None: 10 tries in a row got nothing, which in CI was this process starved for 30 s
            # (its 10 clients left vLLM with 1 running request) while the agent polled on.
            for _ in range(10):
                _, text = await http_get(http, engine.probes + "/metrics")
                if values := metric_values(text, "llmop_engine_deep_probes_total"):
                    return values[0]
            return None

        async def scenario() -> tuple[
            list[Read], tuple[list[int], list[int]], list[tuple[str, int, int, str]]
        ]:
            async with aiohttp.ClientSession() as http:
                # 10 clients, each starting a new stream when one ends, so the engine stays busy
                # through the reads however fast it runs (a fixed batch drained before the reads
                # ended, on a quiet machine and in a CI run). Not more: with 24 streams vLLM's API
                # server (one event loop streaming ~1,400 tokens/s) left /metrics unanswered.
                keep_going = asyncio.Event()
                keep_going.set()

                async def client() -> None:
                    while keep_going.is_set():
                        await stream(http, engine, 1500)

                streams = [asyncio.create_task(client()) for _ in range(10)]
                await asyncio.sleep(4.0)
                reads: list[Read] = []
                lives: list[int] = []
                readies: list[int] = []
                # any answer other than 200: (path, read, code, the agent's JSON answer)
                refusals: list[tuple[str, int, int, str]] = []
                # 10 reads, and more while this process was held up too often for 5 busy
                # intervals (its clients then cannot keep the engine busy); no new read after
                # 120 s (reads took 8 s each at load average 11 once, past the test's timeout).
                first = time.monotonic()
                while (len(reads) < 10 or len(busy_intervals(reads)) < 5) and (
                    time.monotonic() - first < 120
                ):
                    at = time.monotonic()
                    sent = await probes_sent(http)
                    if sent is None:
                        # No read: the gap to the next one then spans the hold-up, so no busy
                        # interval is counted across it.
                        continue
                    _, text = await http_get(http, engine.api + "/metrics")
                    s = await status(http, engine)
                    waiting = metric_values(text, "vllm:num_requests_waiting")
                    running = metric_values(text, "vllm:num_requests_running")
                    vllm = (sum(waiting), sum(running)) if waiting and running else None
                    if vllm is not None:
                        # The router's fair queue reads the same page (`engine_load`).
                        assert parse(text) == Reading(int(vllm[1]), int(vllm[0])), text
                    agent = (s["queueDepth"], s["running"])
                    reads.append(Read(at, sent, vllm, agent, s["kvCacheCapacityTokens"]))
                    for path, timeout, codes in (
                        ("/livez", LIVEZ, lives),
                        ("/readyz", READYZ, readies),
                    ):
                        code, body = await http_get(http, engine.probes + path, timeout)
                        codes.append(code)
                        if code not in (0, 200):
                            refusals.append((path, len(codes), code, body))
                    await asyncio.sleep(0.5)
                keep_going.clear()
                for t in streams:
                    t.cancel()
                await asyncio.gather(*streams, return_exceptions=True)
            return reads, (lives, readies), refusals

        # A window in which this VM held the test process up so much that fewer than 3 busy
        # intervals were read (CI: reads 8-20 s apart for 90 s) has not tested the promise: it
        # is measured again, up to 3 windows. Every window's probe answers are asserted below.
        lives: list[int] = []
        readies: list[int] = []
        refusals: list[tuple[str, int, int, str]] = []
        # Busy intervals of every window (never across two): no probe may be sent inside one,
        # also in a window that read too few of them to stand as the premise.
        every_interval: list[tuple[Read, Read]] = []
        for window in range(1, BUSY_WINDOWS + 1):
            reads, (window_lives, window_readies), window_refusals = asyncio.run(scenario())
            lives, readies = lives + window_lives, readies + window_readies
            refusals += window_refusals
            every_interval += busy_intervals(reads)
            print(f"\nbusy {window}: {len(reads)} reads of (vLLM (waiting, running), agent's): ")
            print([(r.vllm, r.agent) for r in reads])
            print(f"busy {window}: (s after the first read, probes sent, pending): ", end="")
            print(reads_line(reads))
            for refusal in window_refusals:
                print(f"busy {window}: answered other than 200: {refusal}")
            if len(busy_intervals(reads)) >= 3:
                break
        # Busy and progressing: live whenever the agent answered, and never unanswered long
        # enough for the kubelet to restart it.
        for codes in (lives, readies):
            assert probe_failures(codes)[1] < LIVENESS_FAILURE_THRESHOLD, (lives, readies)
        assert [r for r in refusals if r[0] == "/livez"] == [], refusals
        # Ready too, unless vLLM itself stopped: this VM freezes every process for seconds under
        # vLLM's load (once vLLM's API server answered nothing and generated nothing for 11 s in
        # CI), and then "not answering" or "no progress" is the right verdict. Never for another
        # reason (a probe timed out behind the streams, a late poll, a stale reading).
        vllm_stopped = ("engine not answering", "no progress for")
        wrong = [r for r in refusals if r[0] == "/readyz" and not _reason(r[3], vllm_stopped)]
        assert wrong == [], refusals
        intervals = busy_intervals(reads)
        assert len(intervals) >= 3, reads_line(reads)  # the premise: the engine stayed busy
        probed = [(a.at, b.at) for a, b in every_interval if a.probes_sent != b.probes_sent]
        assert probed == [], reads_line(reads)
        # The agent publishes vLLM's figures as of its last poll: compared where vLLM's were
        # steady, at the reads that bound a busy interval. Elsewhere the poll can be seconds old
        # on this VM (held up with everything else: 5 of 7 reads differed in one run). With
        # streams ending and starting all the time, a read now and then falls between its polls
        # (2 of 10 once). Reads where either side's /metrics went unanswered compare nothing.
        steady = [r for r in reads if any(r is a or r is b for a, b in intervals)]
        both = [r for r in steady if r.vllm is not None and r.agent[0] is not None]
        assert len([r for r in both if r.vllm == r.agent]) >= 0.6 * len(both) > 0, reads
        # Every slot running and the rest waiting, as vLLM itself said.
        assert any(r.vllm[1] == 4.0 and r.vllm[0] > 0 for r in reads if r.vllm), reads
        # vLLM's own figure (vllm:cache_config_info kv_cache_size_tokens), read back unchanged
        # (None: the agent's latest read of vLLM's /metrics got no answer, so it publishes none).
        assert all(r.capacity in (524288, None) for r in reads), reads
        assert any(r.capacity == 524288 for r in reads), reads

    @pytest.mark.timeout(150)
    def test_engine_core_hang_detected_and_recovered(self, engine: Engine) -> None:
        core = engine.engine_core_pid()

        async def scenario() -> tuple[float | None, float | None, float | None, list[bool]]:
            async with aiohttp.ClientSession() as http:
                streams = await pending_streams(http, engine, 8, 400)
                await asyncio.sleep(2.0)
                os.kill(core, signal.SIGSTOP)
                try:
                    not_ready = await wait_for(http, engine.probes + "/readyz", 503, STALL + 10)
                    dead = await wait_for(http, engine.probes + "/livez", 503, STALL + 10)
                finally:
                    os.kill(core, signal.SIGCONT)
                back = await wait_for(http, engine.probes + "/readyz", 200, 20)
                results = await asyncio.gather(*streams)
            return not_ready, dead, back, [r.ok for r in results]

        not_ready, dead, back, oks = asyncio.run(scenario())
        MEASURED[
            "EngineCore SIGSTOP, 8 pending: readiness off / liveness off / ready after SIGCONT"
        ] = f"{secs(not_ready)} / {secs(dead)} / {secs(back)} (stall {STALL:g}s)"
        assert not_ready is not None
        assert dead is not None
        assert back is not None
        # Readiness goes before liveness. The margins hold one late wake-up of a few seconds of
        # this process or the agent (this VM delays sleepers under vLLM's load: see
        # real_vllm.probe_failures); 7.0 s was measured once against the former 6.5 s bound.
        assert not_ready <= min(STALL, INTERVAL) + 5.0 < STALL
        # liveness measured from readiness-off onwards: total since SIGSTOP within stall + polls.
        assert STALL - 1 <= not_ready + dead <= STALL + 6
        assert all(oks), oks  # every pending request completed after SIGCONT

    @pytest.mark.timeout(120)
    def test_api_server_hang_detected_and_recovered(self, engine: Engine) -> None:
        api = engine.vllm_pid()

        async def scenario() -> tuple[
            float | None, float | None, float | None, tuple[object, ...], tuple[object, ...]
        ]:
            async with aiohttp.ClientSession() as http:
                before = (await status(http, engine))["queueDepth"], "published"
                os.kill(api, signal.SIGSTOP)
                stopped = time.monotonic()
                try:
                    not_ready = await wait_for(http, engine.probes + "/readyz", 503, STALL + 10)
                    # Bug 7: what the agent publishes while it cannot read the engine.
                    _, text = await http_get(http, engine.probes + "/metrics")
                    stale = (
                        (await status(http, engine))["queueDepth"],
                        "llmop_engine_queue_depth " in text,
                    )
                    dead = await wait_for(http, engine.probes + "/livez", 503, STALL + 10)
                    dead = None if dead is None else time.monotonic() - stopped
                finally:
                    os.kill(api, signal.SIGCONT)
                back = await wait_for(http, engine.probes + "/livez", 200, 30)
                await wait_for(http, engine.probes + "/readyz", 200, 30)
            return not_ready, dead, back, before, stale

        not_ready, dead, back, before, stale = asyncio.run(scenario())
        MEASURED["API server SIGSTOP (idle): readiness off / liveness off / live after SIGCONT"] = (
            f"{secs(not_ready)} / {secs(dead)} / {secs(back)}; load published while stopped: "
            f"{stale}"
        )
        assert not_ready is not None
        assert dead is not None
        assert back is not None
        # Two /health polls in a row must go unanswered (one can be late from a busy server),
        # and readiness goes off well before liveness would (STALL). The slack is 4 s: 9.18 s
        # was measured once against a 9 s bound with the whole suite on 2 cores.
        assert not_ready <= 2 * PROBE_TIMEOUT + 4
        assert not_ready < STALL - 1
        assert STALL - 1 <= dead <= STALL + 6  # a /health call may be in flight for 3 s
        assert before == (0, "published")
        # Unknown while unreachable: no queue depth in /status, no series for the HPA.
        assert stale == (None, False)
        assert back <= 10

    @pytest.mark.timeout(180)
    def test_drain_within_budget_under_streams_loses_nothing(self, engine: Engine) -> None:
        """preStop + SIGTERM with 8 streams in flight and 3 late requests after the propagation
        window: all complete normally, the agent exits 0."""

        async def scenario() -> tuple[list[real_vllm.StreamResult], list[real_vllm.StreamResult],
                                      float | None, int | None, float]:  # fmt: skip
            async with aiohttp.ClientSession() as http:
                # 8 streams over 4 slots, 1200 tokens each: 10 s (quiet machine) to 30 s (loaded)
                # of work, so the late requests below still find the drain waiting on them, and
                # all of it inside the 60 s budget.
                streams = await pending_streams(http, engine, 8, 1200)
                await asyncio.sleep(1.0)
                exec_at = time.monotonic()
                # The kubelet's order: preStop hook (the agent's clock starts when it arrives),
                # then SIGTERM once the hook returned.
                hook = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "llmop_engine", "drain", "--socket",
                    engine.socket_path, "--no-wait",
                )  # fmt: skip
                not_ready = await wait_for(http, engine.probes + "/readyz", 503, 30, step=0.05)
                assert not_ready is not None
                started = time.monotonic()
                await hook.wait()
                engine.proc.send_signal(signal.SIGTERM)
                # Clients whose endpoint lists lag past the propagation window.
                await asyncio.sleep(max(0.0, PROPAGATION + 0.5 - (time.monotonic() - started)))
                late = await asyncio.gather(*(stream(http, engine, 20) for _ in range(3)))
                results = await asyncio.gather(*streams)
            code = await asyncio.to_thread(engine.wait_exit, 60)
            timeline.update(
                streams_ended=max(r.ended_at for r in results) - started,
                late_sent=min(r.sent_at for r in late) - started,
                late_ended=max(r.ended_at for r in late) - started,
            )
            return results, late, started - exec_at, code, time.monotonic() - started

        # Seconds after readiness went off, for the failure message.
        timeline: dict[str, float] = {}
        results, late, delivery, code, took = asyncio.run(scenario())
        drain_log = [ln for ln in engine.log_tail(200000).splitlines() if "drain" in ln]
        why = (timeline, late, drain_log)
        lost = [r for r in results if not r.ok]
        MEASURED["preStop hook: exec to readiness off (the drain reached the agent)"] = (
            f"{secs(delivery)}"
        )
        MEASURED["drain within budget: streams / lost / late served / agent exit after drain"] = (
            f"8 / {len(lost)} / {sum(r.ok for r in late)} of 3 / {took:.1f}s, code {code}"
        )
        assert lost == [], (lost, why)
        assert all(r.ok for r in late), why  # vLLM's own drain answered these HTTP 500
        assert code == 0, engine.log_tail()
        assert "killing it" not in engine.log_tail(100000)


class TestNoMetricsApiKey:
    KEY = "sk-llmop-test"

    @pytest.fixture(scope="class")
    @classmethod
    def engine(cls, vllm_dir: Path, model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
        yield from _engine(
            vllm_dir, model_dir, tmp_path_factory.mktemp("vllm-b"), "engine B",
            ["--max-num-seqs", "2", "--disable-log-stats"], api_key=cls.KEY,
        )  # fmt: skip

    @pytest.mark.timeout(420)
    def test_deep_probe_with_api_key(self, engine: Engine) -> None:
        async def scenario() -> tuple[int, dict[str, object]]:
            async with aiohttp.ClientSession() as http:
                async with http.post(
                    engine.api + "/v1/completions",
                    json={"model": real_vllm.MODEL_NAME, "prompt": "x", "max_tokens": 1},
                ) as r:
                    unauthenticated = r.status
                return unauthenticated, await status(http, engine)

        unauthenticated, s = asyncio.run(scenario())
        assert unauthenticated == 401  # the key is enforced...
        probe = s["lastDeepProbe"]
        assert isinstance(probe, dict)
        assert probe["ok"] is True, probe  # ...and the agent's probe carries it
        assert s["ready"] is True
        assert s["queueDepth"] is None  # no metrics: unknown, not 0

    @pytest.mark.timeout(210)
    def test_saturated_without_metrics_is_not_killed(self, engine: Engine) -> None:
        window = 2 * STALL + INTERVAL

        async def scenario() -> tuple[list[tuple[float, int, str]], list[str], list[str]]:
            async with aiohttp.ClientSession() as http:
                # 16 clients over 2 slots, each starting a new stream when its last ends: a
                # queue for the whole window, however fast the machine. Not 8: this process,
                # starved by the engine on 2 cores, once restarted its streams so late that the
                # queue kept running dry and no deep probe had anything to wait behind (7
                # liveness reads in 84 s, every probe answered in 6-20 ms).
                streams = await saturating_streams(http, engine, 16, 1500)
                lives: list[tuple[float, int, str]] = []
                probes: list[str] = []
                started = time.monotonic()
                log_from = len(engine.log_tail(10**9))

                # The window, and longer (up to 3 windows) while this process was held up so
                # often that it saw fewer than 20 liveness answers (2 in 28 s once), or no deep
                # probe has timed out behind the streams yet (the agent's log says, which covers
                # the time this process could not look: in CI it saw none of 5 timeouts).
                def timed_out() -> bool:
                    return PROBE_TIMED_OUT in engine.log_tail(10**9)[log_from:]

                while (elapsed := time.monotonic() - started) < window or (
                    (len(lives) < 20 or not timed_out()) and elapsed < 3 * window
                ):
                    code, body = await http_get(http, engine.probes + "/livez", LIVEZ)
                    lives.append((round(time.monotonic() - started, 1), code, body))
                    probes.append(str((await status(http, engine))["lastDeepProbe"]))
                    await asyncio.sleep(0.5)
                # A client that stopped (its stream raised) no longer keeps the engine busy.
                stopped = [repr(t.exception()) for t in streams if t.done() and not t.cancelled()]
                for t in streams:
                    t.cancel()
                await asyncio.gather(*streams, return_exceptions=True)
            return (
                lives,
                [*probes, f"clients stopped: {stopped}"],
                engine.log_tail(10**9)[log_from:].splitlines(),
            )

        lives, probes, log_lines = asyncio.run(scenario())
        timeouts = [line for line in log_lines if PROBE_TIMED_OUT in line]
        print(
            f"\nno metrics, saturated {window:.0f}s: {len(lives)} liveness checks; "
            f"{len(timeouts)} deep probes timed out (agent's log); last status {probes[-2]}; "
            f"{probes[-1]}"
        )
        assert timeouts, probes  # the probe did queue behind real work
        # Printed, not asserted: vLLM's API server under these 24 streams left /health
        # unanswered for the whole 12 s stall bound once (the agent then said live=False for a
        # moment); the kubelet's view below is what restarts a pod.
        not_live = [line for line in log_lines if "live=False" in line]
        print(f"no metrics, saturated: the agent's liveness-off verdicts: {not_live}")
        answered_failures, unanswered_run = probe_failures([code for _, code, _ in lives])
        assert answered_failures == [], (lives, engine.log_tail())
        assert unanswered_run < LIVENESS_FAILURE_THRESHOLD, (lives, engine.log_tail())
        assert "exports no vllm:* metrics" in engine.log_tail(200000)

    @pytest.mark.timeout(120)
    def test_crash_makes_the_agent_exit_nonzero(self, engine: Engine) -> None:
        core = engine.engine_core_pid()

        async def scenario() -> tuple[list[int], int | None, float]:
            async with aiohttp.ClientSession() as http:
                os.kill(core, signal.SIGKILL)
                killed = time.monotonic()
                lives = []
                while engine.proc.poll() is None and time.monotonic() - killed < 60:
                    lives.append((await http_get(http, engine.probes + "/livez", 1.0))[0])
                    await asyncio.sleep(0.2)
            return lives, engine.wait_exit(10), time.monotonic() - killed

        lives, code, took = asyncio.run(scenario())
        MEASURED["crash (EngineCore SIGKILL): agent exit code / after"] = f"{code} / {took:.1f}s"
        assert code not in (0, None), engine.log_tail()
        # From the first failure on, liveness never came back (the closing port is not recovery).
        first = lives.index(503) if 503 in lives else len(lives)
        assert all(c in (503, 0) for c in lives[first:]), lives


class TestOverBudget:
    DRAIN = 4.0

    @pytest.fixture(scope="class")
    @classmethod
    def engine(cls, vllm_dir: Path, model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
        yield from _engine(
            vllm_dir, model_dir, tmp_path_factory.mktemp("vllm-c"), "engine C",
            ["--max-num-seqs", "8"], env={"LLMOP_DRAIN_SECONDS": f"{cls.DRAIN:g}"},
        )  # fmt: skip

    # Three times the engine's 8 slots: however fast the machine, the deadline finds requests
    # running and queued (8 streams alone once all finished within a quiet 2 + 5 s).
    STREAMS = 24

    @pytest.mark.timeout(420)
    def test_over_budget_ends_streams_cleanly_exit_0_cut_reported(self, engine: Engine) -> None:
        async def scenario() -> tuple[list[real_vllm.StreamResult], float, int | None, float]:
            async with aiohttp.ClientSession() as http:
                streams = await pending_streams(http, engine, self.STREAMS, 1800)
                await asyncio.sleep(2.0)
                engine.proc.send_signal(signal.SIGTERM)
                started = time.monotonic()
                cut = 0.0
                while engine.proc.poll() is None and time.monotonic() - started < 60:
                    _, text = await http_get(http, engine.probes + "/metrics", 1.0)
                    cut = max([cut, *metric_values(text, "llmop_engine_drain_cut_requests")])
                    await asyncio.sleep(0.1)
                results = await asyncio.gather(*streams)
                ended = time.monotonic() - started
            return results, cut, await asyncio.to_thread(engine.wait_exit, 10), ended

        results, cut, code, ended = asyncio.run(scenario())
        reasons = sorted({(r.finish_reason, r.error) for r in results}, key=str)
        aborted = [r for r in results if r.finish_reason == "abort"]
        MEASURED[f"over budget ({self.STREAMS} streams, 8 slots, drain 4s): ends / cut / exit"] = (
            f"{reasons} / {cut:g} / {ended:.1f}s after SIGTERM, code {code}"
        )
        brief = [(r.status, r.finish_reason, r.tokens, r.done, r.error[:80]) for r in results]
        print(f"\nover budget, per stream (status, finish, tokens, [DONE], error): {brief}")
        # Running streams end with a reason; queued ones that never got a token see their stream
        # closed with [DONE] and no choice (vLLM 0.32). Either way nothing is cut mid-connection.
        queued = [r for r in results if r.finish_reason is None]
        assert all(r.status == 200 and not r.error and r.done for r in results), brief
        assert all(r.tokens == 0 for r in queued), brief
        reasons_given = [r.finish_reason for r in results if r.finish_reason is not None]
        assert set(reasons_given) <= {"length", "abort"}, brief
        assert len(aborted) >= 8, brief  # the round running at the deadline
        ended_by_deadline = len(aborted) + len(queued)
        assert code == 0, engine.log_tail()
        # The count is taken at the deadline from vLLM's gauges, which lag behind the EngineCore
        # while the API server is behind on delivering tokens: a request whose tokens were all
        # generated still counts and then ends `length` (8 of 24 once). So: at least what the
        # deadline ended, at most what was sent.
        assert ended_by_deadline <= cut <= self.STREAMS, brief
        # Within the budget plus the engine's exit grace (the agent's SIGKILL point).
        assert ended <= PROPAGATION + self.DRAIN + contract.ENGINE_EXIT_GRACE_SECONDS
        log = engine.log_tail(200000)
        assert "killing it" not in log
        assert f"exhausted with {cut:g} requests in the engine" in log


class TestKeepAliveClients:
    DRAIN = 60.0

    @pytest.fixture(scope="class")
    @classmethod
    def engine(cls, vllm_dir: Path, model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
        # vLLM's own idle keep-alive timeout (5 s) is left as it is: it is the drain's quiet period.
        yield from _engine(
            vllm_dir, model_dir, tmp_path_factory.mktemp("vllm-e"), "engine E",
            ["--max-num-seqs", "8"], env={"LLMOP_DRAIN_SECONDS": f"{cls.DRAIN:g}"},
        )  # fmt: skip

    @pytest.mark.timeout(420)  # the engine's start (60-250 s on a loaded 2-core machine) included
    def test_pinned_clients_move_away_and_the_drain_ends_early(
        self, engine: Engine, tmp_path: Path
    ) -> None:
        # The pod still in the Service, where a new connection of a moved client lands.
        other = Replica.start(tmp_path, with_agent=False, model=real_vllm.MODEL_NAME,
                              engine_args=["--sim-load-seconds", "0"])  # fmt: skip
        try:

            async def scenario() -> tuple[list[Outcome], float, int | None, int]:
                await other.wait_ready(30)
                stop = asyncio.Event()
                first = Target(engine.api, real_vllm.MODEL_NAME, engine.headers())
                clients = [
                    PinnedClient(first, Target(other.api_url, real_vllm.MODEL_NAME), 24)
                    for _ in range(4)
                ]
                load = asyncio.create_task(run_clients(clients, stop))
                await asyncio.sleep(3.0)
                hook = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "llmop_engine", "drain", "--socket",
                    engine.socket_path, "--no-wait",
                )  # fmt: skip
                launched = time.monotonic()
                await hook.wait()
                # `--no-wait` returns on the agent's 202: the drain has started. The hook's own
                # start (a Python process on two cores the engine keeps busy: 0.3-36 s seen) is
                # the kubelet's exec, not the drain, so it is reported but not timed against it.
                started = time.monotonic()
                engine.proc.send_signal(signal.SIGTERM)
                code = await asyncio.to_thread(engine.wait_exit, self.DRAIN + 30)
                took = time.monotonic() - started
                await asyncio.sleep(1.0)
                stop.set()
                outcomes = await load
                moved = sum(c.outcomes[-1].target == other.api_url for c in clients)
                return outcomes, took, started - launched, code, moved

            outcomes, took, hook_seconds, code, moved = asyncio.run(scenario())
        finally:
            other.stop()
        log = engine.log_tail(200000)
        drained = re.findall(r"drain: done in ([0-9.]+)s", log)
        failed = [o for o in outcomes if not o.ok]
        on_vllm = sum(o.target == engine.api for o in outcomes)
        MEASURED["keep-alive clients (4, pinned): requests (on vLLM) / failed / moved / drain"] = (
            f"{len(outcomes)} ({on_vllm}) / {len(failed)} / {moved} of 4 / {drained} s "
            f"(budget {self.DRAIN:g}s), agent exit {took:.1f}s after the drain started "
            f"(preStop hook: {hook_seconds:.1f}s to start it), code {code}"
        )
        assert failed == [], failed[:5]
        assert moved == 4, log[-3000:]
        assert code == 0, log[-3000:]
        assert "exhausted" not in log
        # Propagation (1 s) + the keep-alive quiet period (5 s) + exit, far from the 60 s budget.
        assert took < 25.0, log[-3000:]


class TestStopWhileLoading:
    @pytest.mark.timeout(240)
    def test_sigterm_while_loading_stops_in_seconds(
        self, vllm_dir: Path, model_dir: Path, tmp_path_factory: pytest.TempPathFactory
    ) -> None:
        """vLLM ignores SIGTERM while it loads; the agent used to wait drain + 10 s, then
        SIGKILL (exit 137). An engine that never listened has nothing to drain."""
        e = real_vllm.start(vllm_dir, model_dir, tmp_path_factory.mktemp("vllm-d"), env=AGENT_ENV)
        try:

            async def scenario() -> tuple[float, int | None, list[int]]:
                async with aiohttp.ClientSession() as http:
                    assert await wait_for(http, e.probes + "/livez", 200, 30) is not None
                    # Loading proper: the EngineCore runs (load + compile take a minute or more).
                    # Earlier, vLLM has no handler yet and simply dies of the SIGTERM.
                    deadline = time.monotonic() + 120
                    while time.monotonic() < deadline:
                        with contextlib.suppress(RuntimeError):
                            e.engine_core_pid()
                            break
                        await asyncio.sleep(0.5)
                    await asyncio.sleep(5.0)
                    code, _ = await http_get(http, e.probes + "/readyz")
                    assert code == 503
                tree = e.tree()
                e.proc.send_signal(signal.SIGTERM)
                started = time.monotonic()
                code = await asyncio.to_thread(e.wait_exit, 60)
                took = time.monotonic() - started
                # Killed processes re-parented to init are reaped by it: wait for that.
                deadline = time.monotonic() + 15
                left = tree
                while left and time.monotonic() < deadline:
                    await asyncio.sleep(0.5)
                    left = [pid for pid in tree if real_vllm.running(pid)]
                return took, code, left

            took, code, left = asyncio.run(scenario())
        finally:
            e.stop()
        MEASURED["SIGTERM while loading: agent exit after / code"] = f"{took:.1f}s / {code}"
        assert took < 5.0, e.log_tail()
        assert code == 0
        assert left == []  # no vLLM process outlives the agent
