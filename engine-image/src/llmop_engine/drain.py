"""Drain: the sequence the agent runs on SIGTERM or a preStop call, and the `llmop-engine drain`
client that the preStop hook executes.

The client only speaks to the agent's unix socket (`LLMOP_AGENT_SOCKET`): drain is never reachable
from the pod network.

The sequence (readiness is already off when it runs; the caller flips it first), within one
budget, `deadline = start + propagation + drain`:

1. An engine that never listened (still loading) has nothing to drain: SIGTERM, which vLLM and
   the simulator answer by exiting at once (vLLM's start-up handler raises
   `KeyboardInterrupt("terminated")`: exit by SIGINT, 130), and SIGKILL its process tree after
   `LOADING_STOP_SECONDS` if it is still there (vLLM 0.32's CPU build was once seen not to exit
   while it loaded).
2. Wait for endpoint propagation, so that no Service still routes here.
3. The agent owns the drain (the engine runs with `--shutdown-timeout 0` and
   `--enable-server-load-tracking`, see `supervisor.engine_command`): the engine keeps serving
   normally while the agent reads its in-flight HTTP requests (`GET /load`), so requests that
   still arrive late (slow endpoint propagation) are served rather than refused. vLLM in its own
   drain mode answers them HTTP 500 ("cannot schedule new futures after shutdown"), and past its
   `--shutdown-timeout` it kills its EngineCore and then never exits while streams are open,
   leaving every client hanging without a finish reason.
   From the start of the drain the engine answers every response `Connection: close`
   (`llmop_engine.connection_close`): keep-alive clients pinned to this pod get their answer and
   reconnect elsewhere, so in-flight work reaches zero instead of being topped up by them.
4. When no request has been in flight for the engine's idle keep-alive timeout
   (`quiet_seconds`, vLLM's `VLLM_HTTP_TIMEOUT_KEEP_ALIVE`, 5 s; at least two reads in a row),
   or sooner once, idle, no client connection to the engine is open at all
   (`llmop_engine.connections`: none left to reuse), SIGTERM: vLLM exits. By then the engine
   has closed every pooled connection: those used since the drain began after their response,
   the others on their idle timeout. Without the quiet period a client that reuses an idle
   connection just after the SIGTERM finds it closed under its request.
5. At the deadline with requests left, what is cut (`Load.in_engine`) is logged and returned,
   and the agent ends them cleanly: SIGTERM to vLLM's EngineCore first, which (with
   `--shutdown-timeout 0`) aborts every request and sends each stream its `finish_reason:
   "abort"` through the still-running API server; once `/load` shows nothing in flight (at most
   `CORE_ABORT_SECONDS`), SIGTERM to the API server. SIGTERM to the API server alone is not
   reliably clean: its process manager SIGTERMs the EngineCore and force-kills it at once
   (timeout 0), racing the abort outputs; when the kill wins, the streams hang until the process
   is killed and are cut without a finish reason.
6. SIGKILL the tree if it has not exited `EXIT_GRACE_SECONDS` after the last SIGTERM.

In flight is `/load`'s count: requests from their arrival at the HTTP server to the end of their
response. vLLM's own queue gauges (`vllm:num_requests_*`, the fallback when `/load` does not
answer) miss requests still being tokenised in the API server: with those alone a drain SIGTERMed
an engine whose 8 fresh streams had not reached the scheduler yet. With neither, the agent waits
for the whole budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

import aiohttp

from llmop_engine import contract
from llmop_engine.supervisor import Supervisor
from llmop_engine.vllm_metrics import EngineMetrics

log = logging.getLogger("llmop_engine.drain")

# After the final SIGTERM, how long the engine gets to exit before its process tree is killed
# (a contract value: the renderer's grace-period margin counts it).
EXIT_GRACE_SECONDS = float(contract.ENGINE_EXIT_GRACE_SECONDS)
# An engine still loading that has not exited this long after SIGTERM is killed (it holds no
# requests); vLLM and the simulator normally exit at once.
LOADING_STOP_SECONDS = 2.0
# Over budget: how long the EngineCore's aborts get to reach the clients before the API server is
# stopped too (they take milliseconds; the rest is slack for a loaded node).
CORE_ABORT_SECONDS = 3.0
# How often the queue is read while the agent waits for in-flight work to finish.
DRAIN_POLL_SECONDS = 0.25


@dataclass(frozen=True)
class Load:
    """One reading of what the engine holds."""

    in_flight: int | None = None  # `/load`: HTTP requests in flight (None: no answer)
    metrics: EngineMetrics | None = None  # `/metrics`: the fallback

    @property
    def requests(self) -> int | None:
        if self.in_flight is not None:
            return self.in_flight
        pending = None if self.metrics is None else self.metrics.pending
        return None if pending is None else int(pending)

    @property
    def in_engine(self) -> int | None:
        """What ending the engine cuts: the requests its scheduler still holds (running +
        waiting), never more than are in flight; the in-flight count when the gauges did not
        answer. A request whose tokens were all generated can still be in flight to a client
        that reads slowly, and the API server, which outlives the EngineCore, delivers it
        (measured on vLLM: 16 in flight at the deadline, 8 in the scheduler; 8 streams ended
        `abort`, the other 16 ended `length` with every token). A request still being
        tokenised is in flight but not yet in the scheduler: that window is milliseconds.
        An upper bound still: the gauges lag behind the EngineCore while the API server is
        behind on delivering tokens, so a request counted here can end `length` during the
        abort (measured: 24 counted, 16 ended by the abort)."""
        pending = None if self.metrics is None else self.metrics.pending
        if pending is None:
            return self.in_flight
        return int(pending) if self.in_flight is None else min(int(pending), self.in_flight)

    @property
    def signature(self) -> tuple[float | None, ...]:
        """Changes whenever work arrives or moves (so "idle twice" means nothing happened)."""
        m = self.metrics
        return (self.requests, None if m is None else m.progress_tokens)


LoadReader = Callable[[], Awaitable[Load]]
ConnectionCounter = Callable[[], int | None]
"""Client connections open to the engine now (None: unknown)."""


@dataclass(frozen=True)
class DrainOutcome:
    duration: float
    # The budget ran out with work still in the engine, which the agent then ended.
    over_budget: bool = False
    # Requests the engine still held at the deadline (None: unknown, the engine exports no load).
    cut_requests: int | None = 0
    # The engine exited before the agent signalled it: it failed on its own during the drain.
    exited_on_its_own: bool = False
    # SIGKILL was needed.
    killed: bool = False
    # The engine was hung when the stop came (a liveness failure): ended without a drain.
    hung: bool = False


async def stop_hung(supervisor: Supervisor) -> DrainOutcome:
    """End an engine the agent already judged hung (no progress with work pending, or dead):
    there is nothing to drain and nothing to wait for, so it is stopped at once (SIGKILL after
    `LOADING_STOP_SECONDS`). This is what a liveness failure leads to; the faster it goes, the
    sooner the kubelet restarts the container."""
    started = time.monotonic()
    log.error("drain: the engine is hung: ending it without a drain")
    killed = supervisor.alive() and await _stop(supervisor, LOADING_STOP_SECONDS, "hung")
    return DrainOutcome(time.monotonic() - started, killed=killed, hung=True)


async def _stop(supervisor: Supervisor, grace: float, why: str) -> bool:
    """SIGTERM, then SIGKILL the tree after `grace`; True when SIGKILL was needed."""
    supervisor.send(signal.SIGTERM)
    if await supervisor.wait(timeout=grace) is not None:
        return False
    log.error("drain: engine still running %.1fs after SIGTERM (%s); killing it", grace, why)
    supervisor.kill_tree()
    await supervisor.wait(timeout=5.0)
    return True


async def _until_aborted(supervisor: Supervisor, read_load: LoadReader, deadline: float) -> None:
    """After the EngineCore's SIGTERM: until the API server has nothing in flight."""
    while supervisor.alive() and time.monotonic() < deadline:
        with contextlib.suppress(TimeoutError):
            load = await asyncio.wait_for(read_load(), max(0.05, deadline - time.monotonic()))
            if load.in_flight == 0:
                return
        await supervisor.wait(timeout=0.1)


async def _until_idle(
    supervisor: Supervisor,
    read_load: LoadReader,
    deadline: float,
    quiet_seconds: float = 0.0,
    open_connections: ConnectionCounter | None = None,
) -> Load | None:
    """Wait until the engine has held no work for `quiet_seconds` (and at least two readings in a
    row) or, idle, has no client connection open (`open_connections` says 0), it exits, or the
    deadline; returns the last reading."""
    last: Load | None = None
    previous: tuple[float | None, ...] | None = None
    quiet_since: float | None = None
    while supervisor.alive() and time.monotonic() < deadline:
        try:
            # A slow answer must not carry the wait past the deadline.
            load: Load | None = await asyncio.wait_for(
                read_load(), max(0.05, deadline - time.monotonic())
            )
        except TimeoutError:
            load = None
        if load is not None and load.requests is not None:
            last = load
            # Twice idle with nothing moving in between: nothing arrived meanwhile either.
            if load.requests == 0 and load.signature == previous:
                if quiet_since is None:
                    quiet_since = time.monotonic()
                if time.monotonic() - quiet_since >= quiet_seconds:
                    return load
                if open_connections is not None and open_connections() == 0:
                    log.info("drain: idle with no client connection open: no quiet period left")
                    return load
            else:
                quiet_since = None
            previous = load.signature
        remaining = deadline - time.monotonic()
        if remaining > 0:
            await supervisor.wait(timeout=min(DRAIN_POLL_SECONDS, remaining))
    return last


async def drain_sequence(  # noqa: C901
    supervisor: Supervisor,
    propagation_seconds: float,
    drain_seconds: float,
    *,
    read_load: LoadReader,
    listened: bool = True,
    skip_propagation: bool = False,
    quiet_seconds: float = 0.0,
    open_connections: ConnectionCounter | None = None,
    on_cut: Callable[[int | None], None] | None = None,
    on_stop: Callable[[], None] | None = None,
) -> DrainOutcome:
    """Run the drain after readiness went off (see the module docstring).

    `on_cut` hears about work cut at the deadline before the engine is ended, so the agent's
    metric shows it while the pod still exists to be scraped. `on_stop` is called just before the
    SIGTERM that ends the engine: what the engine does after it (vLLM answers /health 503 while
    it tears down) is the stop the agent asked for, not a failure.
    """

    def stop(grace: float, why: str) -> Awaitable[bool]:
        if on_stop is not None:
            on_stop()
        return _stop(supervisor, grace, why)

    started = time.monotonic()

    def done(result: DrainOutcome | None = None) -> DrainOutcome:
        outcome = replace(result or DrainOutcome(0.0), duration=time.monotonic() - started)
        log.info(
            "drain: done in %.1fs (engine exit code %s)", outcome.duration, supervisor.returncode
        )
        return outcome

    if not listened:
        log.info("drain: the engine never listened (still loading): nothing to drain; stopping it")
        killed = supervisor.alive() and await stop(LOADING_STOP_SECONDS, "loading")
        return done(DrainOutcome(0.0, killed=killed))

    if not skip_propagation and propagation_seconds > 0:
        log.info(
            "drain: readiness off; waiting %.1fs for endpoint propagation", propagation_seconds
        )
        await supervisor.wait(timeout=propagation_seconds)  # returns early if the engine dies
    deadline = time.monotonic() + drain_seconds
    if not supervisor.alive():
        log.error("drain: the engine exited on its own during the drain")
        return done(DrainOutcome(0.0, exited_on_its_own=True))

    log.info(
        "drain: waiting up to %.0fs for in-flight requests to finish (then %.0fs without any: the "
        "engine's keep-alive timeout)",
        drain_seconds,
        quiet_seconds,
    )
    last = await _until_idle(supervisor, read_load, deadline, quiet_seconds, open_connections)
    if not supervisor.alive():
        log.error("drain: the engine exited on its own during the drain")
        return done(DrainOutcome(0.0, exited_on_its_own=True))
    # Out of time, unless the last reading was idle (the quiet period did not fit in the budget).
    over = time.monotonic() >= deadline and (last is None or last.requests != 0)
    cut: int | None = 0
    if over:
        cut = None if last is None else last.in_engine
        m = None if last is None else last.metrics
        running = "?" if m is None or m.running is None else f"{m.running:.0f}"
        waiting = "?" if m is None or m.waiting is None else f"{m.waiting:.0f}"
        log.warning(
            "drain: budget of %.0fs exhausted with %s requests in the engine (%s running, %s "
            "waiting; %s HTTP requests in flight); ending the engine: running streams end with "
            "finish_reason=abort, queued ones closed without a token",
            drain_seconds,
            "?" if cut is None else cut,
            running,
            waiting,
            "?" if last is None or last.in_flight is None else last.in_flight,
        )
        if on_cut is not None:
            on_cut(cut)
        if on_stop is not None:
            on_stop()
        if supervisor.signal_engine_cores(signal.SIGTERM):
            await _until_aborted(supervisor, read_load, time.monotonic() + CORE_ABORT_SECONDS)
    else:
        log.info("drain: no request left in the engine; SIGTERM")
    killed = await stop(EXIT_GRACE_SECONDS, "over budget" if over else "idle")
    return done(DrainOutcome(0.0, over_budget=over, cut_requests=cut, killed=killed))


async def request_drain(socket_path: str, wait: bool = True, timeout: float = 600.0) -> int:
    """Ask the agent to drain over its unix socket; with `wait`, block until the agent is done.

    Exit status for the preStop hook: 0 when the drain started (and, with `wait`, finished or the
    agent went away, which is what a finished drain looks like), 1 when the agent is unreachable.
    """
    connector = aiohttp.UnixConnector(path=socket_path)
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession(connector=connector) as http:
        try:
            async with http.post(
                "http://agent/drain", timeout=aiohttp.ClientTimeout(total=10)
            ) as r:
                if r.status != 202:
                    log.error("agent refused the drain: HTTP %d", r.status)
                    return 1
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.error("cannot reach the agent on %s: %s", socket_path, exc)
            return 1
        if not wait:
            return 0
        while time.monotonic() < deadline:
            try:
                async with http.get(
                    "http://agent/drain", timeout=aiohttp.ClientTimeout(total=5)
                ) as r:
                    body = await r.json()
                    if body.get("done"):
                        return 0
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
                return 0  # the agent exited: its engine is gone and the drain is over
            await asyncio.sleep(0.5)
    log.error("drain still running after %.0fs", timeout)
    return 1
