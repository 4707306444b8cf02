"""Keep-alive clients pinned to a pod the way kube-proxy pins them, for the drain tests.

kube-proxy picks a backend when a connection opens and keeps it for the connection's life, also
after the pod left the Service; only a new connection reaches another pod. `PinnedClient` sends
streaming completions back to back over one pooled connection to `first`; once the server closes
that connection (`Connection: close`, or the socket found closed) its next connection goes to
`other`, the pod still in the Service. Without a Service in these process tests, that switch is
the whole of kube-proxy's part; the real-node e2e (tests/e2e/test_rollout.py) has the real one.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import aiohttp

from support.harness.loadgen import sse_chunks


@dataclass
class Target:
    url: str
    model: str
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Outcome:
    target: str
    ok: bool
    closed: bool  # the response said `Connection: close`
    error: str = ""


async def completion(
    http: aiohttp.ClientSession, t: Target, max_tokens: int
) -> tuple[bool, bool, str]:
    """(ok, connection closed by the server, error) of one streaming completion."""
    payload = {
        "model": t.model,
        "prompt": "def main():",
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
    }
    finish, done = None, False
    try:
        async with http.post(t.url + "/v1/completions", json=payload, headers=t.headers) as r:
            closed = r.headers.get("Connection", "").lower() == "close"
            if r.status != 200:
                return False, closed, f"HTTP {r.status}: {(await r.text())[:120]}"
            async for chunk in sse_chunks(r):
                if chunk is None:
                    done = True
                    continue
                for choice in chunk.get("choices") or []:
                    finish = choice.get("finish_reason") or finish
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
        return False, True, f"{type(exc).__name__}: {exc}"
    ok = finish == "length" and done
    return ok, closed, "" if ok else f"finish_reason={finish} done={done}"


class PinnedClient:
    def __init__(self, first: Target, other: Target, max_tokens: int) -> None:
        self.first, self.other, self.max_tokens = first, other, max_tokens
        self.outcomes: list[Outcome] = []

    async def run(self, until: asyncio.Event) -> None:
        target = self.first
        # One connection, reused while the server keeps it open (a pooled HTTP/1.1 client).
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as http:
            while not until.is_set():
                ok, closed, error = await completion(http, target, self.max_tokens)
                self.outcomes.append(Outcome(target.url, ok, closed, error))
                if closed:
                    target = self.other


async def run_clients(clients: list[PinnedClient], until: asyncio.Event) -> list[Outcome]:
    await asyncio.gather(*(c.run(until) for c in clients))
    return [o for c in clients for o in c.outcomes]


def since(started: float) -> float:
    return time.monotonic() - started
