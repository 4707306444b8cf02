"""Drain: the sequence the agent runs on SIGTERM or a preStop call, and the `llmop-engine drain`
client that the preStop hook executes.

The client only speaks to the agent's unix socket (`LLMOP_AGENT_SOCKET`): drain is never reachable
from the pod network. The sequence: readiness is already off when this runs (the caller flips it
first), then wait for endpoint propagation so that no Service still routes here, SIGTERM the engine
(which runs with `--shutdown-timeout`, so it finishes in-flight work and rejects nothing that was
routed to it), wait for it to exit, SIGKILL its process tree past the budget.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time

import aiohttp

from llmop_engine.supervisor import Supervisor

log = logging.getLogger("llmop_engine.drain")

# After the engine's own shutdown timeout, how long before the agent kills it: the engine needs a
# moment to abort leftovers and close its socket (vLLM joins its EngineCore, then stops uvicorn).
EXIT_GRACE_SECONDS = 10.0


async def drain_sequence(
    supervisor: Supervisor,
    propagation_seconds: float,
    drain_seconds: float,
    skip_propagation: bool = False,
) -> float:
    """Run the drain after readiness went off; returns its duration in seconds."""
    started = time.monotonic()
    if not skip_propagation and propagation_seconds > 0:
        log.info(
            "drain: readiness off; waiting %.1fs for endpoint propagation", propagation_seconds
        )
        # Returns early if the engine dies meanwhile.
        await supervisor.wait(timeout=propagation_seconds)
    if supervisor.alive():
        log.info(
            "drain: SIGTERM to the engine (it finishes in-flight work within %.0fs)", drain_seconds
        )
        supervisor.send(signal.SIGTERM)
        code = await supervisor.wait(timeout=drain_seconds + EXIT_GRACE_SECONDS)
        if code is None:
            log.error(
                "drain: engine still running after %.0fs; killing it",
                drain_seconds + EXIT_GRACE_SECONDS,
            )
            supervisor.kill_tree()
            await supervisor.wait(timeout=5.0)
    duration = time.monotonic() - started
    log.info("drain: done in %.1fs (engine exit code %s)", duration, supervisor.returncode)
    return duration


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
