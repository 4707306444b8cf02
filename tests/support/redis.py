"""A real redis-server on loopback for tests and benches: the router gateway's shared store.

The binary is ``$LLMOP_REDIS_SERVER`` when set (any redis-server or valkey-server), else Debian's
redis-server unpacked into the cache by ``e2e/redis/redis.sh ensure`` (nothing installed on the
machine; a few seconds cold, milliseconds warm; `make test` runs it before pytest: mk/redis.mk).

``RedisServer`` starts it on 127.0.0.1 on a free port (``--port 0`` would turn TCP off), without
persistence (``--save '' --appendonly no``), and returns once PING answers. ``stop()``/``kill()``
then ``start()`` bring it back on the same port, so a client that keeps its URL sees a store
outage and a recovery; ``pause()``/``resume()`` make it hang instead (SIGSTOP), so a client sees
timeouts rather than refused connections.

A binary that cannot be had fails the test in CI (`CI` set) and is a loud skip elsewhere (a
machine without apt), as for the metrics binaries (support.metrics); benches get the
``RedisUnavailableError`` itself.

This module needs no Redis client (PING is three lines of RESP), so benches can use it anywhere.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

import pytest

from support.harness.replicas import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
REDIS_SH = REPO_ROOT / "e2e" / "redis" / "redis.sh"
ENV_BINARY = "LLMOP_REDIS_SERVER"
HOST = "127.0.0.1"
_PR_SET_PDEATHSIG = 1
_START_TIMEOUT_S = 10.0
_STOP_TIMEOUT_S = 5.0
# Every server still running, killed when the interpreter exits (a test that forgot, Ctrl-C).
_running: set[subprocess.Popen[bytes]] = set()
# Loaded here, not in the forked child (dlopen between fork and exec can deadlock).
_LIBC = ctypes.CDLL(None, use_errno=True)


class RedisUnavailableError(RuntimeError):
    """No redis-server binary here, and why."""


class RedisStartError(RuntimeError):
    """The server exited at start or did not answer PING; the message ends with its log."""


@functools.cache
def redis_server_path() -> Path:
    """The redis-server to run: $LLMOP_REDIS_SERVER, or the cached Debian one (made if needed)."""
    chosen = os.environ.get(ENV_BINARY)
    if chosen:
        path = Path(chosen)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise RedisUnavailableError(f"{ENV_BINARY}={chosen} is not an executable file")
        return path
    # stderr is inherited: a cold run's download shows in the log, not inside a test's output.
    res = subprocess.run(
        [str(REDIS_SH), "ensure"], stdout=subprocess.PIPE, text=True, check=False, timeout=600
    )
    lines = res.stdout.strip().splitlines()
    if res.returncode != 0 or not lines:
        raise RedisUnavailableError(
            f"{REDIS_SH.relative_to(REPO_ROOT)} ensure failed (exit {res.returncode}); see its "
            f"output above, or point {ENV_BINARY} at a redis-server binary"
        )
    return Path(lines[-1])


def require_redis_server() -> Path:
    """redis_server_path() for a test: fails it in CI, skips it loudly elsewhere."""
    try:
        return redis_server_path()
    except RedisUnavailableError as e:
        if os.environ.get("CI"):
            pytest.fail(f"CI must have a redis-server: {e}")
        pytest.skip(f"SKIPPED LOUDLY: no redis-server: {e}")


def _ping(port: int, timeout: float) -> bool:
    """PING over RESP; True on +PONG (a server still loading answers -LOADING)."""
    try:
        with socket.create_connection((HOST, port), timeout=timeout) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _die_with_owner() -> None:
    """In the child before exec: SIGTERM when the thread that started it (the main thread: see
    RedisServer.start) dies, so a SIGKILLed test session leaves no server behind."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@atexit.register
def _stop_all() -> None:
    for proc in list(_running):
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
        _running.discard(proc)


class RedisServer:
    """One redis-server on 127.0.0.1; a context manager (start on enter, stop and clean up on
    exit). The port is chosen at the first start and kept for every restart."""

    def __init__(
        self,
        *,
        port: int | None = None,
        binary: Path | None = None,
        log_dir: Path | None = None,
        args: Sequence[str] = (),
    ) -> None:
        self._fixed_port = port is not None
        self.port = port or 0
        self._binary = binary
        self._own_dir = log_dir is None
        self.dir = Path(tempfile.mkdtemp(prefix="llmop-redis-")) if log_dir is None else log_dir
        self.log_path = self.dir / "redis.log"
        self.args = list(args)
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.starts = 0

    @property
    def host(self) -> str:
        return HOST

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def command(self) -> list[str]:
        binary = self._binary or redis_server_path()
        return [
            str(binary),
            "--bind",
            HOST,
            "--port",
            str(self.port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.dir),
            "--logfile",
            "",  # stdout, into log_path
            *self.args,
        ]

    def start(self, timeout: float = _START_TIMEOUT_S) -> RedisServer:
        """Start (or restart on the same port) and wait until PING answers."""
        if self.running:
            return self
        # A port picked here can be taken before redis binds it: pick another, a few times.
        # A restart keeps its port whatever happens: the clients under test hold that URL.
        pick = not (self._fixed_port or self.starts)
        for attempt in range(3 if pick else 1, 0, -1):
            if pick:
                self.port = free_port()
            try:
                self._spawn_and_wait(timeout)
                break
            except RedisStartError:
                if attempt == 1:
                    raise
        self.starts += 1
        return self

    def _spawn_and_wait(self, timeout: float) -> None:
        cmd = self.command()
        self.dir.mkdir(parents=True, exist_ok=True)
        if self._log is None:
            self._log = self.log_path.open("ab")
        self._log.write(f"--- start on port {self.port}: {' '.join(cmd)}\n".encode())
        self._log.flush()
        main = threading.current_thread() is threading.main_thread()
        # PDEATHSIG follows the starting *thread*; only the main thread lives as long as the
        # process (a server started from a worker thread is stopped by atexit instead).
        self._proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C to the session is not a store outage
            preexec_fn=_die_with_owner if main else None,  # noqa: PLW1509
        )
        _running.add(self._proc)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self._forget()
                raise RedisStartError(f"redis-server exited at start:\n{self.log_tail()}")
            if _ping(self.port, 0.5):
                return
            time.sleep(0.01)
        self.kill()
        raise RedisStartError(f"redis-server did not answer PING in {timeout}s:\n{self.log_tail()}")

    def stop(self, timeout: float = _STOP_TIMEOUT_S) -> None:
        """SIGTERM (a clean shutdown: nothing to save), SIGKILL after `timeout`."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._proc.pid, signal.SIGCONT)  # a paused server cannot act on SIGTERM
            self._proc.terminate()
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._forget()

    def kill(self) -> None:
        """SIGKILL: the store vanishes at once, as in a crash or an evicted pod."""
        if self._proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            self._proc.kill()
        self._proc.wait()
        self._forget()

    def pause(self) -> None:
        """SIGSTOP: connections stay open and requests hang (a stalled store, not a dead one)."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, sig: signal.Signals) -> None:
        if self._proc is None or self._proc.poll() is not None:
            raise RuntimeError("redis-server is not running")
        os.kill(self._proc.pid, sig)

    def ping(self, timeout: float = 0.5) -> bool:
        return _ping(self.port, timeout)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError as e:
            return f"(no log: {e})"

    def close(self) -> None:
        """Stop, close the log, and remove the directory when this object made it."""
        self.stop()
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def _forget(self) -> None:
        if self._proc is not None:
            _running.discard(self._proc)

    def __enter__(self) -> RedisServer:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
