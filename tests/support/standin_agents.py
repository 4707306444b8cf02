"""Stand-in engine agents: HTTP servers answering `GET /status` with the real agent's JSON shape
(`llmop_engine.agent.Agent.status()`), for tests and benchmarks of the operator's agent reader
where no real engine can run (kwok pods have no containers). Each one's answer is a dict the
test edits; `hang` makes it stall like a wedged agent."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from llmop_engine import contract


def agent_status(
    *,
    running: int = 0,
    waiting: int = 0,
    kv_tokens: int | None = 100_000,
    probe_ok: bool = True,
    probe_error: str | None = None,
) -> dict[str, Any]:
    """A serving agent's `/status` (every field the real one has)."""
    return {
        "phase": "ready",
        "ready": True,
        "live": True,
        "reason": "serving",
        "queueDepth": waiting,
        "running": running,
        "kvCacheUsage": 0.1,
        "kvCacheCapacityTokens": kv_tokens,
        "lastDeepProbe": {
            "ok": probe_ok,
            "latencySeconds": 0.02,
            "ageSeconds": 1.0,
            "error": probe_error,
        },
        "servedModelName": "qwen",
        "modelRevision": None,
        "backend": "simulator",
        "enginePid": 7,
        "engineExitCode": None,
        "drainDurationSeconds": None,
        "drainCutRequests": None,
    }


class StandinAgent:
    """One stand-in agent on `host:port`, serving in a thread."""

    def __init__(self, host: str, port: int = contract.PROBE_PORT) -> None:
        self.status = agent_status()
        self.hang = 0.0
        self.requests = 0
        self.in_flight = 0
        self.max_in_flight = 0
        lock = threading.Lock()
        agent = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with lock:
                    agent.requests += 1
                    agent.in_flight += 1
                    agent.max_in_flight = max(agent.max_in_flight, agent.in_flight)
                try:
                    if agent.hang:
                        time.sleep(agent.hang)
                    if self.path != contract.STATUS_PATH:
                        self.send_error(404)
                        return
                    body = json.dumps(agent.status).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                finally:
                    with lock:
                        agent.in_flight -= 1

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.host, self.port = host, int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def standin_agents(
    hosts: list[str], port: int = contract.PROBE_PORT
) -> Iterator[list[StandinAgent]]:
    """Stand-in agents on each of `hosts` (distinct loopback addresses: 127.0.0.0/8 is all
    local on Linux), closed afterwards."""
    agents: list[StandinAgent] = []
    try:
        for host in hosts:
            agents.append(StandinAgent(host, port))
        yield agents
    finally:
        for agent in agents:
            agent.close()
