"""Keep-alive clients during a drain, with real servers and real sockets.

- uvicorn (vLLM's HTTP server, both its protocols: httptools, vLLM's default here, and h11) with
  `CloseOnDrain`: before the drain flag a connection serves request after request; after it,
  the response says `Connection: close` and the server closes the socket;
- the simulator does the same by itself, and closes idle keep-alive connections after
  `VLLM_HTTP_TIMEOUT_KEEP_ALIVE` as vLLM does;
- the agent and the simulator: clients pinned to the draining replica over keep-alive connections
  move to the other replica after their next response, every request succeeds, and the drain
  ends once the clients left, long before its budget. The same with real vLLM is in
  test_real_vllm.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.fleet import Fleet
from engine.keepalive import PinnedClient, Target, run_clients
from support.harness.replicas import free_port, port_open

pytestmark = pytest.mark.engine

UVICORN_APP = """
import sys
import uvicorn
from llmop_engine.connection_close import CloseOnDrain

async def app(scope, receive, send):
    await receive()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})

uvicorn.run(CloseOnDrain(app), host="127.0.0.1", port=int(sys.argv[1]), http=sys.argv[2],
            lifespan="off", timeout_keep_alive=30, log_level="warning")
"""


class Conn:
    """One raw HTTP/1.1 connection: what the server sends, and whether it closed the socket."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.buf = b""

    def get(self, path: str = "/health") -> dict[str, str]:
        self.sock.sendall(f"GET {path} HTTP/1.1\r\nHost: engine\r\n\r\n".encode())
        while b"\r\n\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            assert chunk, "the server closed the connection before answering"
            self.buf += chunk
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
        headers[":status"] = lines[0].split()[1]
        length = int(headers.get("content-length", "0"))
        while len(self.buf) < length:
            chunk = self.sock.recv(65536)
            assert chunk, "the server closed the connection inside a response"
            self.buf += chunk
        self.buf = self.buf[length:]
        return headers

    def closed_by_server(self, wait: float) -> bool:
        """True when the server closed the socket within `wait` seconds (EOF or reset)."""
        self.sock.settimeout(wait)
        try:
            return self.sock.recv(1) == b""
        except TimeoutError:
            return False
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.sock.close()


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not port_open(port):
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        assert time.monotonic() < deadline, f"nothing listens on {port}"
        time.sleep(0.05)


@contextlib.contextmanager
def server(argv: list[str], port: int, env: dict[str, str]) -> Iterator[None]:
    proc = subprocess.Popen(
        argv, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        wait_port(port, proc)
        yield
    finally:
        proc.kill()
        proc.wait(10)


def check_close_after_flag(port: int, flag: Path) -> None:
    c = Conn(port)
    try:
        for _ in range(3):  # keep-alive: the same socket serves request after request
            assert "close" not in c.get().get("connection", "")
        assert not c.closed_by_server(0.3)
        flag.touch()  # the agent's drain
        h = c.get()
        assert h[":status"] == "200"  # still served in full
        assert h["connection"] == "close"
        assert c.closed_by_server(5.0)
    finally:
        c.close()
    # Every later connection gets the same: one response, then closed.
    c = Conn(port)
    try:
        assert c.get()["connection"] == "close"
        assert c.closed_by_server(5.0)
    finally:
        c.close()


uvicorn_protocols = pytest.mark.parametrize("protocol", ["httptools", "h11"])


@uvicorn_protocols
@pytest.mark.timeout(60)
def test_uvicorn_closes_the_connection_after_the_middlewares_close(
    tmp_path: Path, protocol: str
) -> None:
    port, flag = free_port(), tmp_path / "agent.sock.draining"
    argv = [sys.executable, "-c", UVICORN_APP, str(port), protocol]
    with server(argv, port, {"LLMOP_DRAIN_FLAG": str(flag)}):
        check_close_after_flag(port, flag)


@pytest.mark.timeout(60)
def test_simulator_closes_connections_once_draining(tmp_path: Path) -> None:
    port, flag = free_port(), tmp_path / "agent.sock.draining"
    argv = [sys.executable, "-m", "llmop_engine", "simulate", "m", "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--sim-load-seconds", "0"]
    with server(argv, port, {"LLMOP_DRAIN_FLAG": str(flag)}):
        check_close_after_flag(port, flag)


@pytest.mark.timeout(60)
def test_simulator_closes_idle_keepalive_connections_like_vllm() -> None:
    port = free_port()
    argv = [sys.executable, "-m", "llmop_engine", "simulate", "m", "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--sim-load-seconds", "0"]
    with server(argv, port, {"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "1"}):
        c = Conn(port)
        try:
            assert "close" not in c.get().get("connection", "")
            started = time.monotonic()
            assert c.closed_by_server(10.0)
            idle = time.monotonic() - started
        finally:
            c.close()
    print(f"\nsimulator closed an idle keep-alive connection after {idle:.1f}s (timeout 1 s)")
    assert 0.5 <= idle <= 4.0


@pytest.mark.timeout(120)
def test_pinned_keepalive_clients_move_away_and_the_drain_ends_early(fleet: Fleet) -> None:
    budget = 30.0
    keep_alive = 2.0
    env = {
        "LLMOP_DRAIN_SECONDS": f"{budget:g}",
        "LLMOP_ENDPOINT_PROPAGATION_SECONDS": "1",
        "VLLM_HTTP_TIMEOUT_KEEP_ALIVE": f"{keep_alive:g}",
    }
    # To show the test failing before the fix: the agent and simulator of another checkout.
    if os.environ.get("LLMOP_TEST_AGENT_PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["LLMOP_TEST_AGENT_PYTHONPATH"]
    draining = fleet.start(["--sim-load-seconds", "0.5"], **env)
    other = fleet.start(["--sim-load-seconds", "0.5"], **env)

    async def scenario() -> tuple[list, float, int, list[str]]:  # type: ignore[type-arg]
        await asyncio.gather(draining.wait_ready(30), other.wait_ready(30))
        stop = asyncio.Event()
        clients = [
            PinnedClient(Target(draining.api_url, "sim-model"), Target(other.api_url, "sim-model"),
                         max_tokens=30)
            for _ in range(6)
        ]  # fmt: skip
        load = asyncio.create_task(run_clients(clients, stop))
        await asyncio.sleep(2.0)
        started = time.monotonic()
        await draining.begin_drain()
        code = await draining.wait_exit(budget + 20)
        took = time.monotonic() - started
        await asyncio.sleep(1.0)  # the clients keep going on the other replica
        stop.set()
        outcomes = await load
        return outcomes, took, code, [c.outcomes[-1].target for c in clients]

    outcomes, took, code, last = asyncio.run(scenario())
    failed = [o for o in outcomes if not o.ok]
    moved = sum(t == other.api_url for t in last)
    log = draining.log_tail(20000)
    drained = re.findall(r"drain: done in ([0-9.]+)s", log)
    print(
        f"\nkeep-alive drain: {len(outcomes)} requests, {len(failed)} failed, {moved}/6 clients "
        f"moved; drain {drained} s, agent exited {took:.1f}s after the preStop (budget "
        f"{budget:g}s)"
    )
    assert failed == [], failed[:5]
    assert moved == 6
    assert code == 0, log
    assert "exhausted" not in log
    # Propagation (1 s) + the clients' last requests + exit, far from the 30 s budget: once the
    # clients left, no connection is open for anyone to reuse, so the drain does not wait out
    # the keep-alive quiet period (the next test shows it waiting while one is open).
    assert took < 12.0, log
    assert len(drained) == 1
    assert float(drained[0]) >= 1.0, log
    assert "no client connection open" in log


def _request_keeping_the_connection(port: int) -> socket.socket:
    """One completion over a raw keep-alive connection, read to its end; the socket stays open
    and idle, as a client's connection pool keeps it."""
    body = b'{"model": "sim-model", "prompt": "hi", "max_tokens": 2}'
    conn = socket.create_connection(("127.0.0.1", port))
    conn.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    answer = b""
    conn.settimeout(10)
    while b"\r\n\r\n" not in answer:
        answer += conn.recv(4096)
    head, _, rest = answer.partition(b"\r\n\r\n")
    length = int(re.search(rb"content-length: *([0-9]+)", head, re.IGNORECASE)[1])  # type: ignore[index]
    while len(rest) < length:
        rest += conn.recv(4096)
    assert head.startswith(b"HTTP/1.1 200"), head
    return conn


def test_an_idle_pooled_connection_holds_the_drain_until_the_engine_closes_it(
    fleet: Fleet,
) -> None:
    keep_alive = 3.0
    replica = fleet.start(
        ["--sim-load-seconds", "0.5"],
        LLMOP_DRAIN_SECONDS="30",
        LLMOP_ENDPOINT_PROPAGATION_SECONDS="0.5",
        VLLM_HTTP_TIMEOUT_KEEP_ALIVE=f"{keep_alive:g}",
    )

    async def scenario() -> tuple[float, float, int]:
        await replica.wait_ready(30)
        conn = await asyncio.to_thread(_request_keeping_the_connection, replica.api_port)
        started = time.monotonic()
        await replica.begin_drain()

        def engine_closes_it() -> float:
            conn.settimeout(30)
            assert conn.recv(1) == b""  # closed by the engine on its idle timeout
            return time.monotonic()

        closed_at = await asyncio.to_thread(engine_closes_it)
        code = await replica.wait_exit(40)
        conn.close()
        return closed_at - started, time.monotonic() - started, code

    closed, exited, code = asyncio.run(scenario())
    print(
        f"\nidle pooled connection: closed by the engine {closed:.1f}s into the drain, "
        f"agent exited {exited:.1f}s"
    )
    assert code == 0
    # Idle from the start of the drain (after 0.5 s of propagation), the engine was SIGTERMed
    # only after its idle timeout had closed the pooled connection.
    assert exited >= closed, replica.log_tail()
    assert closed >= keep_alive - 1.0
