"""A standby's side of leader election: wait for the Lease, serving `/healthz` meanwhile.

A process that does not hold the `llmop-operator` Lease (`llmop.leader`) is healthy and Ready:
it is up and trying for the Lease. kopf's own liveness endpoint serves `/healthz` while the
process leads; between terms a small HTTP server of this module takes the port over.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from llmop.config import OperatorConfig
from llmop.leader import LeaderElector

BIND_SECONDS = 5.0
"""How long a standby tries for the liveness port (kopf's endpoint held it while leading)."""


class _StandbyHealth(BaseHTTPRequestHandler):
    """/healthz of a standby: the process is up and trying for the Lease (kopf's own endpoint
    takes the port over once this process leads)."""

    def do_GET(self) -> None:
        body = b"standby\n" if self.path == "/healthz" else b"not found\n"
        self.send_response(200 if self.path == "/healthz" else 404)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # one line per probe otherwise
        return


@contextlib.contextmanager
def health(config: OperatorConfig) -> Iterator[None]:
    """Serve a standby's `/healthz` on the liveness port (none without one) while inside."""
    if not config.liveness_port:
        yield
        return
    address = (config.bind_address, config.liveness_port)
    deadline = time.monotonic() + BIND_SECONDS
    while True:
        try:
            server = ThreadingHTTPServer(address, _StandbyHealth)
            break
        except OSError:  # a term's kopf may still be letting the port go
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    thread = threading.Thread(target=server.serve_forever, name="standby-health", daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


def wait_for_lease(config: OperatorConfig, elector: LeaderElector, stop: threading.Event) -> bool:
    """Block until this process leads (True) or `stop` is set (False: SIGINT/SIGTERM), serving
    /healthz meanwhile: a standby is healthy and Ready."""
    with health(config):
        return elector.acquire(stop)
