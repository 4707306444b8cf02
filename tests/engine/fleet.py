"""Helpers for the engine tests: a set of agent + simulator replicas, and a status probe."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from support.harness.replicas import Replica

# Short budgets so hangs and probes show up in seconds; polling twice a second.
FAST_AGENT_ENV = {
    "LLMOP_STALL_SECONDS": "5",
    "LLMOP_DEEP_PROBE_INTERVAL_SECONDS": "2",
    "LLMOP_DEEP_PROBE_TIMEOUT_SECONDS": "2",
    "LLMOP_POLL_INTERVAL_SECONDS": "0.5",
    "LLMOP_ENDPOINT_PROPAGATION_SECONDS": "1",
    "LLMOP_DRAIN_SECONDS": "10",
}


class Fleet:
    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.replicas: list[Replica] = []

    def start(self, engine_args: list[str] | None = None, **env: str) -> Replica:
        replica = Replica.start(
            self.log_dir, engine_args=engine_args or [], env={**FAST_AGENT_ENV, **env}
        )
        self.replicas.append(replica)
        return replica

    def stop(self) -> None:
        for r in self.replicas:
            r.stop()


async def http_status(http: aiohttp.ClientSession, url: str) -> int:
    """HTTP status, or 0 when nothing answered."""
    try:
        async with http.get(url, timeout=aiohttp.ClientTimeout(total=3)) as r:
            await r.read()
            return r.status
    except (aiohttp.ClientError, TimeoutError, OSError):
        return 0
