"""The agent's main loop in a group's worker pod (`--role worker`): supervise the headless rank,
watch the leader's rendezvous port, serve the verdicts of `worker`, drain after the leader.

Same probe server, drain socket and signal handling as the leader's agent (`agent`), but no
engine HTTP client, no deep probe and no load gauges: a headless rank has no API, and a worker's
`llmop_engine_queue_depth` would be counted by the HPA and the router beside its leader's.

Exit code: non-zero exactly when the rank failed: it exited without being asked to while its
leader still answered (it crashed). A rank the agent stopped on the drain exits 0, and so does
the agent of a rank that ended after its leader went: it waits, rank-less, for its pod's
deletion (`worker`: orphaned) and then exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time

from llmop_engine import worker
from llmop_engine.agent_metrics import AgentMetrics
from llmop_engine.agent_settings import AgentSettings
from llmop_engine.contract import ENGINE_EXIT_GRACE_SECONDS
from llmop_engine.engine_client import reachable
from llmop_engine.health import Verdict
from llmop_engine.probe_server import start as start_servers
from llmop_engine.supervisor import FORWARDED, Supervisor, engine_command, engine_env

log = logging.getLogger("llmop_engine.worker")

CONNECT_TIMEOUT_SECONDS = 2.0
"""One look at the leader's port; a loaded leader still accepts within milliseconds."""
LEADER_CHECKS_AFTER_EXIT = 2
"""Looks at the leader's port once the rank ended on its own, half a second apart: it is gone
when any fails (a leader that stopped closes its port before the ranks' connections)."""


def drain_budget(settings: AgentSettings) -> float:
    """How long a draining worker keeps its rank up for the leader: the leader's whole drain
    (propagation, in-flight work, keep-alive quiet period, its engine's exit). The worker pod's
    grace period must be at least this plus `ENGINE_EXIT_GRACE_SECONDS`."""
    return (
        settings.endpoint_propagation_seconds
        + settings.drain_seconds
        + settings.engine_keep_alive_seconds
        + ENGINE_EXIT_GRACE_SECONDS
    )


class WorkerAgent:
    def __init__(self, settings: AgentSettings) -> None:
        self.settings = settings
        self.leader = worker.rendezvous(settings.engine_args)
        self.metrics = AgentMetrics()
        self.supervisor = Supervisor(engine_command(settings), engine_env(settings, os.environ))
        self.state = worker.WorkerState(started_at=time.monotonic())
        self.drain_task: asyncio.Task[bool] | None = None
        self.drain_started: float | None = None
        self.drain_duration: float | None = None
        self._last: Verdict | None = None

    # -- views for the probe server ---------------------------------------------------------

    def verdict(self) -> Verdict:
        s = self.settings
        return worker.verdict(
            self.state,
            time.monotonic(),
            stall_seconds=s.stall_seconds,
            load_timeout_seconds=s.load_timeout_seconds,
        )

    def status(self) -> dict[str, object]:
        v = self.verdict()
        now = time.monotonic()
        reached = self.state.reached_at
        return {
            "role": "worker",
            "phase": v.phase.value,
            "ready": v.ready,
            "live": v.live,
            "reason": v.reason,
            "leader": f"{self.leader.host}:{self.leader.port}",
            "leaderReachedAgeSeconds": None if reached is None else round(now - reached, 1),
            "backend": self.settings.backend,
            "enginePid": self.supervisor.pid,
            "engineExitCode": self.supervisor.returncode,
            "drainDurationSeconds": self.drain_duration,
        }

    def metrics_text(self) -> bytes:
        self.metrics.update(self.verdict(), None)
        return self.metrics.render()

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
        log.info("drain requested by %s: the rank stays up while the leader answers", source)
        self.state = worker.start_drain(self.state)
        self.drain_started = time.monotonic()
        self._after_change()
        self.drain_task = asyncio.create_task(self._drain(self.drain_started), name="drain")

    async def _drain(self, started: float) -> bool:
        budget = drain_budget(self.settings)
        while self.supervisor.alive() and not worker.may_stop(
            self.state, time.monotonic(), started, budget
        ):
            await asyncio.sleep(min(0.5, self.settings.poll_interval_seconds))
        killed = False
        if self.supervisor.alive():
            log.info(
                "drain: stopping the rank after %.1fs: %s",
                time.monotonic() - started,
                "its leader's port stopped answering"
                if self.state.unreachable_polls >= worker.LEADER_GONE_POLLS
                else f"the drain budget ({budget:.0f}s) ran out while the leader still answered",
            )
            self.supervisor.send(signal.SIGTERM)
            if await self.supervisor.wait(timeout=ENGINE_EXIT_GRACE_SECONDS) is None:
                log.error("drain: rank still running after SIGTERM; killing it")
                self.supervisor.kill_tree()
                await self.supervisor.wait(timeout=5.0)
                killed = True
        self.drain_duration = time.monotonic() - started
        self.metrics.drain_duration.set(self.drain_duration)
        return killed

    # -- polling ----------------------------------------------------------------------------

    def _after_change(self) -> None:
        v = self.verdict()
        self.metrics.update(v, None)
        last = self._last
        if last is None or (last.phase, last.live, last.ready) != (v.phase, v.live, v.ready):
            log.info("phase=%s live=%s ready=%s: %s", v.phase.value, v.live, v.ready, v.reason)
        self._last = v

    async def poll_once(self) -> None:
        reached = await reachable(self.leader.host, self.leader.port, CONNECT_TIMEOUT_SECONDS)
        self.state = worker.observe(
            self.state,
            time.monotonic(),
            alive=self.supervisor.alive(),
            reached=reached,
            exit_code=self.supervisor.returncode,
        )
        self._after_change()

    async def _monitor(self) -> None:
        while True:
            try:
                await self.poll_once()
            except Exception:  # never let one bad poll kill the probes
                log.exception("poll failed")
            await asyncio.sleep(self.settings.poll_interval_seconds)

    async def _leader_answers(self) -> bool:
        for look in range(LEADER_CHECKS_AFTER_EXIT):
            if look:
                await asyncio.sleep(0.5)
            if not await reachable(self.leader.host, self.leader.port, CONNECT_TIMEOUT_SECONDS):
                return False
        return True

    async def _wait_as_orphan(self, code: int | None) -> asyncio.Task[bool]:
        """The rank ended after its leader went: no restart (a new rank would join the next
        group's leader), wait for the stop that comes with this pod's deletion; returns its
        drain."""
        log.warning(
            "headless rank exited with code %s after its leader went: not restarting it; "
            "waiting for this pod to be deleted with its group",
            code,
        )
        self.state = worker.orphan(self.state, time.monotonic(), code)
        self._after_change()
        # The monitor keeps polling and publishing the verdict meanwhile.
        while self.drain_task is None:
            await asyncio.sleep(self.settings.poll_interval_seconds)
        return self.drain_task

    # -- main -------------------------------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        s = self.settings
        runners = await start_servers(self, s.probe_host, s.probe_port, s.agent_socket)
        log.info(
            "worker agent probes on %s:%d, leader's rendezvous %s:%d",
            s.probe_host,
            s.probe_port,
            self.leader.host,
            self.leader.port,
        )
        self.supervisor.start()
        self.state = worker.WorkerState(started_at=time.monotonic())
        loop.add_signal_handler(signal.SIGTERM, self.request_drain, "SIGTERM")
        for sig in FORWARDED:
            loop.add_signal_handler(sig, self.supervisor.send, sig)
        monitor = asyncio.create_task(self._monitor(), name="monitor")
        try:
            code = await self.supervisor.wait()
            self.supervisor.end_leftovers()
            drain = self.drain_task
            if drain is None:
                if await self._leader_answers():
                    log.error("headless rank exited on its own with code %s: failed", code)
                    return code or 1
                drain = await self._wait_as_orphan(code)
            await drain
            return 0
        finally:
            monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await monitor
            for runner in runners:
                await runner.cleanup()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(s.agent_socket)


def run(settings: AgentSettings) -> int:
    return asyncio.run(WorkerAgent(settings).run())
