"""The agent's main loop: supervise the engine, poll it, run deep probes, serve verdicts, drain.

All judgement lives in `health` (pure); this module only gathers observations on a timer, starts
one-token probes when `health.deep_probe_due` says so, and turns SIGTERM / preStop into the drain
sequence. With `adapters_dir` set it also runs the LoRA adapter loader (`adapter_loader`), whose
gate holds the first readiness back until the desired adapters are loaded (`adapter_rules`).

Exit code: non-zero exactly when the engine failed. vLLM exits 0 after its EngineCore died, so an
engine that exits without being asked to, or that reported itself dead (/health 503), makes the
agent exit with the engine's code or 1; an engine the agent ended (drain, over-budget end, a stop
while loading) exits 0 unless the engine itself returned an error code.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from llmop_engine import connections, health, startup_log
from llmop_engine.agent_metrics import AgentMetrics
from llmop_engine.agent_settings import AgentSettings, flag_value
from llmop_engine.compile_cache import CompileCache
from llmop_engine.contract import (
    STARTUP_KEY,
    STARTUP_PHASES_KEY,
    EngineFlag,
    drain_flag_path,
)
from llmop_engine.drain import DrainOutcome, Load, drain_sequence, stop_hung
from llmop_engine.engine_client import EngineClient
from llmop_engine.health import Observation, Phase, Policy, Reach, Verdict
from llmop_engine.probe_server import start as start_servers
from llmop_engine.startup_log import EngineLog, Moments
from llmop_engine.supervisor import (
    FORWARDED,
    EarlyStart,
    EngineLines,
    Supervisor,
    clear_drain_mark,
    engine_command,
    engine_env,
    engine_port,
    mark_draining,
)
from llmop_engine.vllm_metrics import EngineMetrics

if TYPE_CHECKING:
    from llmop_engine.adapter_loader import AdapterLoader

log = logging.getLogger("llmop_engine.agent")

FAST_POLL_SECONDS = 0.1
FAST_POLL_WINDOW_SECONDS = 5.0
"""Once the engine logs that its API server starts, the agent reads `/health` every 0.1 s for up
to 5 s instead of every `poll_interval_seconds`: a refused connection costs nothing, and the
pod's Ready (a wake's held request) no longer waits for the next poll."""

STOPPED_CODES = (128 + signal.SIGTERM, 128 + signal.SIGKILL, 128 + signal.SIGINT)
"""Engine exit codes that mean "ended by the agent's stop" once the agent sent one. 130 (death by
SIGINT) is vLLM's answer to SIGTERM before it serves: its start-up handler raises
`KeyboardInterrupt("terminated")`, and Python ends an uncaught one by SIGINT."""


def process_started() -> float | None:
    """When this process was created, on the monotonic clock: the kernel's start time (clock
    ticks since boot) against the uptime now, both since the same boot (in a container too).
    None where /proc cannot say."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
            up = float(uptime.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    age = up - ticks / os.sysconf("SC_CLK_TCK")
    return time.monotonic() - age if 0 <= age < 3600 else None


def directory_bytes(path: str) -> int:
    """Total size of the files under `path` (download progress of the model cache)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


class Agent:
    def __init__(self, settings: AgentSettings, early: EarlyStart | None = None) -> None:
        self.settings = settings
        self.policy: Policy = settings
        self.metrics = AgentMetrics()
        # Where the start went: the engine's own lines (read on the relay's threads) and the
        # agent's moments, on one monotonic clock.
        now = time.monotonic()
        if early is not None:
            self.lines, self.supervisor = early.lines, early.supervisor
        else:
            self.lines = EngineLines()
            self.supervisor = Supervisor(
                engine_command(settings), engine_env(settings, os.environ), self.lines.line
            )
        self.moments = Moments(
            agent_started=now,
            process_started=process_started(),
            prepared=early.prepared_at if early is not None else now,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._poll_now = asyncio.Event()
        self._fast_until = 0.0
        self.drain_flag = drain_flag_path(settings.agent_socket)
        self.client = EngineClient(engine_port(settings), settings.api_key)
        self.state = health.initial(time.monotonic())
        self.model_name = settings.served_model_name
        self.ever_ready = False
        self.drain_task: asyncio.Task[DrainOutcome] | None = None
        self.drain_duration: float | None = None
        self.drain_cut: int | None = None
        self._warned_no_metrics = False
        self._probe_task: asyncio.Task[None] | None = None
        self._last: Verdict | None = None
        self.adapters: AdapterLoader | None = None
        if settings.adapters_dir is not None:
            # Imported only here: it pulls huggingface_hub in, 40 % of the agent's imports,
            # and every second of a start counts (a wake's request waits on it).
            from llmop_engine.adapter_loader import AdapterLoader

            self.adapters = AdapterLoader(settings, self.client)
        self._adapter_task: asyncio.Task[None] | None = None
        self.compile_cache = compile_cache(settings)
        self._publish_task: asyncio.Task[None] | None = None

    # -- views for the probe server ---------------------------------------------------------

    def verdict(self) -> Verdict:
        v = health.verdict(self.state, self.policy, time.monotonic())
        if v.ready and self.adapters is not None:
            # Only a pod that was never ready waits for its adapters: once in the Service,
            # adapter changes never take it out (the base and the other adapters still serve).
            reason = self.adapters.gate_reason(
                ever_ready=self.ever_ready, healthy_since=self.state.listening_since
            )
            if reason is not None:
                return Verdict(phase=Phase.LOADING, live=v.live, ready=False, reason=reason)
        if v.ready and not self.ever_ready:
            self._first_ready()
        if v.ready:
            self.ever_ready = True
        return v

    def _serving_soon(self) -> None:
        """From a relay thread: the engine says its API server starts. Every second of a start
        counts (a wake's request waits on it): look now, not at the next poll."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._look_soon)

    def _look_soon(self) -> None:
        self._fast_until = time.monotonic() + FAST_POLL_WINDOW_SECONDS
        self._poll_now.set()

    def _start_phases(self) -> tuple[dict[str, float], Moments, EngineLog]:
        """Seconds per phase found so far (`untraced` once ready), the moments, the lines."""
        moments = replace(self.moments, listening=self.state.listening_since)
        engine_log = self.lines.log
        found = startup_log.phases(engine_log, moments)
        phases = {phase.value: seconds for phase, seconds in found.items()}
        if (rest := startup_log.untraced(found, moments)) is not None:
            phases["untraced"] = rest
        return phases, moments, engine_log

    def startup(self) -> dict[str, object]:
        """Where this start's seconds went, as far as it got (`/status.startup`)."""
        phases, moments, engine_log = self._start_phases()
        return {
            STARTUP_PHASES_KEY: phases,
            "totalSeconds": None
            if moments.ready is None
            else round(moments.ready - (moments.process_started or moments.agent_started), 1),
            "compileHit": engine_log.compile_hit,
            "graphCaptureSeconds": engine_log.graph_capture_seconds,
        }

    def _first_ready(self) -> None:
        self.moments = replace(self.moments, ready=time.monotonic())
        phases, moments, _ = self._start_phases()
        self.metrics.startup(phases)
        log.info(
            "start: ready %.1fs after the agent's process started: %s",
            (moments.ready or 0.0) - (moments.process_started or moments.agent_started),
            ", ".join(f"{name} {seconds}s" for name, seconds in phases.items()),
        )

    def status(self) -> dict[str, object]:
        v = self.verdict()
        # Only what the latest poll read: an unreachable engine's last queue is not its queue.
        m = self.published_load()
        probe = self.state.last_probe
        status: dict[str, object] = {
            "phase": v.phase.value,
            "ready": v.ready,
            "live": v.live,
            "reason": v.reason,
            "queueDepth": None if m is None else m.waiting,
            "running": None if m is None else m.running,
            "kvCacheUsage": None if m is None else m.kv_usage,
            "kvCacheCapacityTokens": None if m is None else m.kv_capacity_tokens,
            "lastDeepProbe": None
            if probe is None
            else {
                "ok": probe.ok,
                "latencySeconds": round(probe.latency, 4),
                "ageSeconds": round(time.monotonic() - probe.finished_at, 1),
                "error": probe.error or None,
            },
            # Bytes in the model cache directory, measured until the engine first listens: while
            # vLLM downloads the weights itself, how far the download got.
            "modelCacheBytes": self.state.cache_bytes,
            "servedModelName": self.model_name,
            "modelRevision": flag_value(self.settings.engine_args, EngineFlag.REVISION),
            "backend": self.settings.backend,
            "enginePid": self.supervisor.pid,
            "engineExitCode": self.supervisor.returncode,
            "drainDurationSeconds": self.drain_duration,
            "drainCutRequests": self.drain_cut,
        } | ({} if self.adapters is None else {"adapters": self.adapters.statuses()})
        if self.compile_cache is not None:
            status["compileCache"] = self.compile_cache.status()
        status[STARTUP_KEY] = self.startup()
        return status

    def metrics_text(self) -> bytes:
        self.metrics.update(self.verdict(), self.published_load())
        if self.adapters is not None:
            self.metrics.adapters(self.adapters.loaded())
        return self.metrics.render()

    def published_load(self) -> EngineMetrics | None:
        # Two polls' worth plus a second of slack: a poll stuck on a hung engine ages it out.
        max_age = 2 * self.settings.poll_interval_seconds + 1.0
        return health.published_load(self.state, time.monotonic(), max_age)

    def drain_progress(self) -> dict[str, object]:
        return {
            "draining": self.state.draining,
            "done": self.drain_task is not None and self.drain_task.done(),
            "durationSeconds": self.drain_duration,
        }

    # -- drain ------------------------------------------------------------------------------

    def request_drain(self, source: str) -> None:
        if self.drain_task is not None:
            return
        log.info("drain requested by %s", source)
        # Judged before draining masks it: a hung engine gets no drain (see _drain).
        hung = not self.verdict().live
        # Readiness goes off before anything else: the very next /readyz answers 503.
        self.state = health.start_drain(self.state, time.monotonic())
        self._after_change()
        # From now on the engine closes each connection after its response: keep-alive clients
        # pinned to this pod reconnect through the Service (connection_close).
        mark_draining(self.drain_flag)
        self.drain_task = asyncio.create_task(self._drain(hung=hung), name="drain")

    async def _read_load(self) -> Load:
        in_flight, metrics = await asyncio.gather(
            self.client.in_flight(1.0), self.client.metrics(1.0)
        )
        return Load(in_flight=in_flight, metrics=metrics)

    async def _drain(self, *, hung: bool = False) -> DrainOutcome:
        if hung and self.supervisor.alive():
            # Hung or dead (the kubelet's liveness probe is the usual sender of this SIGTERM):
            # no request can finish, so waiting out propagation and the drain only delays the
            # restart.
            self._stop_sent()
            outcome = await stop_hung(self.supervisor)
            self.drain_duration = outcome.duration
            self.metrics.drained(outcome)
            return outcome
        outcome = await drain_sequence(
            self.supervisor,
            self.settings.endpoint_propagation_seconds,
            self.settings.drain_seconds,
            read_load=self._read_load,
            listened=self.state.listening_since is not None,
            # A pod that never was ready is in no Service's endpoints: nothing to wait for.
            skip_propagation=not self.ever_ready,
            quiet_seconds=self.settings.engine_keep_alive_seconds,
            open_connections=self._client_connections,
            on_cut=self.metrics.cut,
            on_stop=self._stop_sent,
        )
        self.drain_duration = outcome.duration
        self.drain_cut = outcome.cut_requests
        self.metrics.drained(outcome)
        return outcome

    def _client_connections(self) -> int | None:
        return connections.open_client_connections(engine_port(self.settings))

    def _stop_sent(self) -> None:
        self.state = health.stop_sent(self.state)

    def exit_code(self, code: int | None, outcome: DrainOutcome | None) -> int:
        """The agent's exit status: non-zero exactly when the engine failed (module docstring)."""
        engine_code = 1 if code is None else code
        if outcome is None:
            log.error("engine exited on its own with code %s: failed", code)
            return engine_code or 1
        if self.state.dead_at is not None:
            log.error("engine reported itself dead (/health 503) before the drain ended: failed")
            return engine_code or 1
        if outcome.exited_on_its_own:
            return engine_code or 1
        if outcome.hung:
            log.error("engine was hung when stopped: failed")
            return 1
        if outcome.killed or engine_code in STOPPED_CODES:
            # The agent ended it: killed after the grace, dead of the agent's own SIGTERM (an
            # engine that installs no handler yet, early in its start), or ended by SIGINT, as
            # vLLM (and the simulator) answer a SIGTERM while loading. No fault.
            return 0
        return engine_code

    # -- polling ----------------------------------------------------------------------------

    def _after_change(self) -> None:
        v = self.verdict()
        self.metrics.update(v, self.published_load())
        if v.ready:
            self.ever_ready = True
            self._publish_compile_cache()
        last = self._last
        if last is None or (last.phase, last.live, last.ready) != (v.phase, v.live, v.ready):
            log.info("phase=%s live=%s ready=%s: %s", v.phase.value, v.live, v.ready, v.reason)
        self._last = v

    def _publish_compile_cache(self) -> None:
        """Once, when the engine is first ready: its compile warm-up is over, so what it compiled
        is complete. In a thread: copying and hashing must not hold the probes up."""
        if self.compile_cache is None or self._publish_task is not None or self.state.draining:
            return
        self._publish_task = asyncio.create_task(
            asyncio.to_thread(self.compile_cache.publish), name="compile-cache-publish"
        )

    async def poll_once(self) -> None:
        s = self.settings
        timeout = max(1.0, min(5.0, s.deep_probe_timeout_seconds))
        alive = self.supervisor.alive()
        reach = await self.client.health(timeout)
        metrics, answered = None, False
        if reach is health.Reach.OK:
            answered, metrics = await self.client.read_metrics(timeout)
            if self.model_name is None:
                self.model_name = await self.client.first_model(timeout)
        no_series = reach is health.Reach.OK and answered and metrics is None
        if no_series and not self._warned_no_metrics:
            self._warned_no_metrics = True
            log.warning(
                "the engine serves but exports no vllm:* metrics (--disable-log-stats?): queue "
                "depth, KV usage and progress are unknown, so a busy engine cannot be told from a "
                "hung one; deep-probe timeouts will not fail liveness and hangs go undetected"
            )
        cache_bytes = None
        if s.model_cache_dir and self.state.listening_since is None:
            cache_bytes = await asyncio.to_thread(directory_bytes, s.model_cache_dir)
        self.state = health.observe(
            self.state,
            Observation(
                now=time.monotonic(),
                process_alive=alive and self.supervisor.alive(),
                reach=reach,
                metrics=metrics,
                metrics_answered=answered,
                cache_bytes=cache_bytes,
                exit_code=self.supervisor.returncode,
            ),
        )
        self._after_change()
        if self.model_name and health.deep_probe_due(self.state, self.policy, time.monotonic()):
            self.state = health.probe_started(self.state)
            self._probe_task = asyncio.create_task(self._deep_probe(self.model_name))

    async def _deep_probe(self, model: str) -> None:
        s = self.settings
        result = await self.client.deep_probe(
            model, s.deep_probe_prompt, s.deep_probe_timeout_seconds
        )
        if not result.ok:
            log.warning("deep probe failed: %s", result.error)
        self.metrics.probe(result)
        self.state = health.record_probe(self.state, result)
        self._after_change()

    def engine_serving(self) -> bool:
        """The engine answers `/health` and the pod is not draining: adapters may be loaded."""
        s = self.state
        return s.reach is Reach.OK and not s.draining and not s.stopping and s.dead_at is None

    async def _monitor(self) -> None:
        while True:
            try:
                await self.poll_once()
            except Exception:  # never let one bad poll kill the probes
                log.exception("poll failed")
            delay = self.settings.poll_interval_seconds
            now = time.monotonic()
            due = health.next_probe_at(self.state, self.policy)
            if due is not None and not self.state.probe_in_flight:
                delay = min(delay, max(0.05, due - now))
            if self.state.listening_since is None and now < self._fast_until:
                delay = min(delay, FAST_POLL_SECONDS)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._poll_now.wait(), delay)
            self._poll_now.clear()

    # -- main -------------------------------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        s = self.settings
        self._loop = loop
        self.lines.on_serving = self._serving_soon
        runners = await start_servers(self, s.probe_host, s.probe_port, s.agent_socket)
        log.info(
            "agent probes on %s:%d, drain socket %s", s.probe_host, s.probe_port, s.agent_socket
        )
        clear_drain_mark(self.drain_flag)
        if self.compile_cache is not None:
            # Before the engine exists: it reads the variables once, at its start.
            extra = await asyncio.to_thread(self.compile_cache.prepare, os.environ)
            self.supervisor.env = {**(self.supervisor.env or os.environ), **extra}
        self.supervisor.start()
        self.moments = replace(self.moments, spawned=self.supervisor.spawned_at)
        self.state = health.initial(time.monotonic())
        loop.add_signal_handler(signal.SIGTERM, self.request_drain, "SIGTERM")
        for sig in FORWARDED:
            loop.add_signal_handler(sig, self.supervisor.send, sig)
        monitor = asyncio.create_task(self._monitor(), name="monitor")
        if self.adapters is not None:
            self._adapter_task = asyncio.create_task(
                self.adapters.run(self.engine_serving), name="adapters"
            )
        try:
            code = await self.supervisor.wait()
            self.supervisor.end_leftovers()
            outcome = await self.drain_task if self.drain_task is not None else None
            return self.exit_code(code, outcome)
        finally:
            if self.compile_cache is not None:
                # A publish still copying gives up at its next chunk: the pod is going away.
                self.compile_cache.stop.set()
            monitor.cancel()
            if self._probe_task is not None:
                self._probe_task.cancel()
            if self._adapter_task is not None:
                self._adapter_task.cancel()
            if self.adapters is not None:
                self.adapters.close()
            with contextlib.suppress(asyncio.CancelledError):
                await monitor
            if self._adapter_task is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await self._adapter_task
            await self.client.close()
            for runner in runners:
                await runner.cleanup()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(s.agent_socket)
            clear_drain_mark(self.drain_flag)


def compile_cache(settings: AgentSettings) -> CompileCache | None:
    """The persistent compile cache, when the operator rendered its key (a model cache is
    mounted and `model.cache.compileCache` is on)."""
    if not settings.compile_cache_key or not settings.model_cache_dir:
        return None
    return CompileCache.from_settings(
        settings.model_cache_dir,
        settings.compile_cache_key,
        settings.compile_cache_local_dir,
        settings.compile_cache_keep,
    )


def run(settings: AgentSettings, early: EarlyStart | None = None) -> int:
    return asyncio.run(Agent(settings, early).run())
