"""The operator's one reader of the pods it runs: the only module importing an HTTP client.

Three readers: the engine agents' `GET /status` (the fleet loop), the model downloader's
`GET /progress` (bytes done/total, rate, ETA; see `llmop_engine.download`), which the reconcile
reads while a download Job runs, and llmop-router pods' `GET /llmop/activity` (the scale-to-zero
idle check).

`AgentClient.read_all` asks each engine pod's agent for `GET /status` on its probe port (the pod
IP, as the kubelet's probes do) and returns `llmop.agents.AgentReading`s. Reads are bounded
twice: at most `concurrency` in flight (one connection pool of that size), and each within
`timeout` seconds — a hung or unreachable agent costs one timeout, never a stuck operator. A
failed read is simply absent from the result (and counted), never a guess.

aiohttp rather than httpx (both are dependencies; kopf runs on aiohttp): one round over 100
aiohttp stand-in agents cost the reader 29 ms of CPU with aiohttp and 333 ms with httpx, same
concurrency bound (`bench/fleet_bench.py`, docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from llmop.agents import AgentReading, parse_status
from llmop_engine import contract
from llmop_router import contract as router_contract

log = logging.getLogger("llmop.pod_client")

DEFAULT_TIMEOUT_SECONDS = 2.0
"""The agent answers `/status` from memory in well under a millisecond; two seconds is a hung
agent or an unreachable pod, not a slow one."""
DEFAULT_CONCURRENCY = 32
PROGRESS_PATH = contract.PROGRESS_PATH
ROUTER_ACTIVITY_PATH = router_contract.ACTIVITY_PATH
"""llmop-router's per-CR traffic (in flight, held, newest request), read for scale to zero."""


@dataclass(frozen=True)
class Target:
    """One engine pod to read."""

    namespace: str
    parent: str
    pod: str
    ip: str
    port: int = contract.PROBE_PORT

    @property
    def url(self) -> str:
        host = f"[{self.ip}]" if ":" in self.ip else self.ip  # IPv6 pod IPs
        return f"http://{host}:{self.port}{contract.STATUS_PATH}"


@dataclass(frozen=True)
class ReadResult:
    """What one round of reads got: the readings by target, and how many failed."""

    readings: dict[Target, AgentReading]
    failed: int


class AgentClient:
    """Reads agents over one shared connection pool (use inside one event loop)."""

    def __init__(
        self, *, concurrency: int = DEFAULT_CONCURRENCY, timeout: float = DEFAULT_TIMEOUT_SECONDS
    ) -> None:
        self._concurrency = concurrency
        # Bounds the reads in flight before each one's timeout starts: a good agent queued
        # behind hung ones must not time out while it waits for a turn.
        self._limit = asyncio.Semaphore(concurrency)
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        # Created on first use, inside the running event loop (aiohttp binds to it).
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._concurrency),
                timeout=self._timeout,
                headers={"User-Agent": "llmop"},
                # Pod IPs are never behind a proxy; HTTP(S)_PROXY is not for them.
                trust_env=False,
            )
        return self._session

    async def close(self) -> None:
        """Close the connection pool."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def read(self, target: Target) -> AgentReading | None:
        """One agent's reading, or None when it could not be read."""
        try:
            async with self._limit, self._client().get(target.url) as response:
                response.raise_for_status()
                payload = await response.json(content_type=None)
            return parse_status(target.pod, payload)
        except (aiohttp.ClientError, TimeoutError, ValueError) as error:
            log.debug("could not read agent of %s/%s: %r", target.namespace, target.pod, error)
            return None

    async def read_all(self, targets: Sequence[Target]) -> ReadResult:
        """Every target's reading, read concurrently (at most `concurrency` at once)."""
        results = await asyncio.gather(*(self.read(t) for t in targets))
        readings = {t: r for t, r in zip(targets, results, strict=True) if r is not None}
        return ReadResult(readings, failed=len(targets) - len(readings))


def read_progress(host: str, port: int = contract.PROBE_PORT, timeout: float = 2.0) -> Any:
    """The downloader's progress JSON, or None when it cannot be read (not up yet, restarting,
    gone): best effort, the status then keeps what the Job's own status says.

    Synchronous: the reconcile calls it from its worker thread, which has no event loop."""
    return asyncio.run(_read_json(f"http://{host}:{port}{PROGRESS_PATH}", timeout))


async def read_router_activity(host: str, port: int, timeout: float = 2.0) -> Any:
    """A router pod's `GET /llmop/activity` JSON, or None when it cannot be read (the idle
    check then keeps the model up)."""
    host = f"[{host}]" if ":" in host else host
    return await _read_json(f"http://{host}:{port}{ROUTER_ACTIVITY_PATH}", timeout)


async def _read_json(url: str, timeout: float) -> Any:
    try:
        async with (
            aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=timeout), trust_env=False
            ) as session,
            session.get(url) as response,
        ):
            if response.status != 200:
                return None
            return await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
