"""The operator's one reader of engine agents: the only module importing `httpx`.

`AgentClient.read_all` asks each engine pod's agent for `GET /status` on its probe port (the pod
IP, as the kubelet's probes do) and returns `llmop.agents.AgentReading`s. Reads are bounded
twice: at most `concurrency` in flight (one connection pool of that size), and each within
`timeout` seconds — a hung or unreachable agent costs one timeout, never a stuck operator. A
failed read is simply absent from the result (and counted), never a guess.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from llmop.agents import AgentReading, parse_status
from llmop_engine import contract

log = logging.getLogger("llmop.engine_client")

DEFAULT_TIMEOUT_SECONDS = 2.0
"""The agent answers `/status` from memory in well under a millisecond; two seconds is a hung
agent or an unreachable pod, not a slow one."""
DEFAULT_CONCURRENCY = 32


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
    """Reads agents over one shared async connection pool (use inside one event loop)."""

    def __init__(
        self,
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._limit = asyncio.Semaphore(concurrency)
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout),
            limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
            transport=transport,
            headers={"User-Agent": "llmop"},
            # Pod IPs are never behind a proxy; HTTP(S)_PROXY in the operator's env is for
            # the API server, if anything.
            trust_env=False,
        )

    async def close(self) -> None:
        """Close the connection pool."""
        await self._client.aclose()

    async def read(self, target: Target) -> AgentReading | None:
        """One agent's reading, or None when it could not be read."""
        async with self._limit:
            try:
                response = await self._client.get(target.url)
                response.raise_for_status()
                return parse_status(target.pod, response.json())
            except (httpx.HTTPError, ValueError) as error:
                log.debug("could not read agent of %s/%s: %r", target.namespace, target.pod, error)
                return None

    async def read_all(self, targets: Sequence[Target]) -> ReadResult:
        """Every target's reading, read concurrently (at most `concurrency` at once)."""
        results = await asyncio.gather(*(self.read(t) for t in targets))
        readings = {t: r for t, r in zip(targets, results, strict=True) if r is not None}
        return ReadResult(readings, failed=len(targets) - len(readings))
