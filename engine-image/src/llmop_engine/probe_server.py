"""HTTP surfaces of the agent.

- The probe app on the probe port (pod network): `/livez`, `/readyz`, `/status`, `/metrics`.
  Read-only; answers from the agent's current state without touching the engine, so a kubelet
  probe never waits on a busy engine.
- The control app on the unix socket: `POST /drain` (start), `GET /drain` (progress), `GET /status`.
  Only processes in the container can reach it.
"""

from __future__ import annotations

import contextlib
import os
from typing import Protocol

from aiohttp import web

from llmop_engine.health import Verdict


class AgentView(Protocol):
    def verdict(self) -> Verdict: ...
    def status(self) -> dict[str, object]: ...
    def metrics_text(self) -> bytes: ...
    def request_drain(self, source: str) -> None: ...
    def drain_progress(self) -> dict[str, object]: ...


def _verdict_response(v: Verdict, ok: bool) -> web.Response:
    return web.json_response(
        {"ok": ok, "phase": v.phase.value, "reason": v.reason}, status=200 if ok else 503
    )


def probe_app(agent: AgentView) -> web.Application:
    async def livez(request: web.Request) -> web.Response:
        v = agent.verdict()
        return _verdict_response(v, v.live)

    async def readyz(request: web.Request) -> web.Response:
        v = agent.verdict()
        return _verdict_response(v, v.ready)

    async def status(request: web.Request) -> web.Response:
        return web.json_response(agent.status())

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(
            body=agent.metrics_text(), headers={"Content-Type": "text/plain; version=0.0.4"}
        )

    app = web.Application()
    app.router.add_get("/livez", livez)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/status", status)
    app.router.add_get("/metrics", metrics)
    return app


def control_app(agent: AgentView) -> web.Application:
    async def start_drain(request: web.Request) -> web.Response:
        agent.request_drain("preStop (llmop-engine drain)")
        return web.json_response(agent.drain_progress(), status=202)

    async def drain_progress(request: web.Request) -> web.Response:
        return web.json_response(agent.drain_progress())

    async def status(request: web.Request) -> web.Response:
        return web.json_response(agent.status())

    app = web.Application()
    app.router.add_post("/drain", start_drain)
    app.router.add_get("/drain", drain_progress)
    app.router.add_get("/status", status)
    return app


async def start(agent: AgentView, host: str, port: int, socket_path: str) -> list[web.AppRunner]:
    """Start both apps; returns their runners for cleanup."""
    probe_runner = web.AppRunner(probe_app(agent), handle_signals=False, access_log=None)
    await probe_runner.setup()
    await web.TCPSite(probe_runner, host, port, reuse_address=True).start()
    control_runner = web.AppRunner(control_app(agent), handle_signals=False, access_log=None)
    await control_runner.setup()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket_path)  # a stale socket from a previous run in the same container
    await web.UnixSite(control_runner, socket_path).start()
    os.chmod(socket_path, 0o600)
    return [probe_runner, control_runner]
