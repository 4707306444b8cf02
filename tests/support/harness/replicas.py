"""Start, drain and stop local replicas: `llmop-engine run --backend simulator` (agent + simulator)
or a bare simulator, each on free loopback ports, with logs in a directory of the caller's choice.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import aiohttp

_names = itertools.count(1)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process so far, from /proc (what the benches charge a process)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


@dataclass
class Replica:
    name: str
    with_agent: bool
    api_port: int
    probe_port: int | None
    socket_path: str | None
    proc: subprocess.Popen[bytes]
    log_path: Path
    _log: IO[bytes] = field(repr=False)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def probe_url(self) -> str:
        assert self.probe_port is not None
        return f"http://127.0.0.1:{self.probe_port}"

    @property
    def readiness_url(self) -> str:
        """What the Service's endpoint controller watches: the agent's /readyz, or for a bare
        simulator its /health (the pod stays an endpoint until the process is gone)."""
        return self.probe_url + "/readyz" if self.with_agent else self.api_url + "/health"

    @classmethod
    def start(
        cls,
        log_dir: Path,
        *,
        with_agent: bool = True,
        model: str = "sim-model",
        engine_args: Sequence[str] = (),
        agent_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> Replica:
        name = f"replica-{next(_names)}"
        api_port = free_port()
        full_env = dict(os.environ)
        full_env.update(env or {})
        full_env.setdefault("PYTHONUNBUFFERED", "1")
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"{name}.log"
        log = log_path.open("wb")
        if with_agent:
            probe_port = free_port()
            socket_path = str(log_dir / f"{name}.sock")
            if len(socket_path) > 100:  # AF_UNIX paths are limited to 108 bytes
                socket_path = f"/tmp/llmop-{os.getpid()}-{name}.sock"
            full_env["LLMOP_AGENT_SOCKET"] = socket_path
            argv = [
                sys.executable,
                "-m",
                "llmop_engine",
                "run",
                "--backend",
                "simulator",
                "--port",
                str(api_port),
                "--probe-port",
                str(probe_port),
                "--probe-host",
                "127.0.0.1",
                *agent_args,
                "--",
                model,
                *engine_args,
            ]
        else:
            probe_port, socket_path = None, None
            argv = [
                sys.executable,
                "-m",
                "llmop_engine",
                "simulate",
                model,
                "--host",
                "127.0.0.1",
                "--port",
                str(api_port),
                *engine_args,
            ]
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=full_env)
        return cls(name, with_agent, api_port, probe_port, socket_path, proc, log_path, log)

    async def wait_ready(self, timeout: float = 60.0) -> float:
        """Seconds until the readiness URL answered 200."""
        started = time.monotonic()
        async with aiohttp.ClientSession() as http:
            while time.monotonic() - started < timeout:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited early: {self.log_tail()}")
                with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
                    async with http.get(
                        self.readiness_url, timeout=aiohttp.ClientTimeout(total=2)
                    ) as r:
                        if r.status == 200:
                            return time.monotonic() - started
                await asyncio.sleep(0.1)
        raise TimeoutError(f"{self.name} not ready after {timeout}s: {self.log_tail()}")

    async def begin_drain(self) -> None:
        """The rollout's termination of this pod: preStop (agent) or plain SIGTERM (bare sim)."""
        if not self.with_agent:
            self.proc.send_signal(signal.SIGTERM)
            return
        assert self.socket_path is not None
        hook = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "llmop_engine",
            "drain",
            "--socket",
            self.socket_path,
            "--no-wait",
        )
        await hook.wait()
        # The kubelet sends SIGTERM after the preStop hook returns; the agent treats it as the same
        # drain (idempotent).
        self.proc.send_signal(signal.SIGTERM)

    async def wait_exit(self, timeout: float = 60.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code = self.proc.poll()
            if code is not None:
                self._log.close()
                return code
            await asyncio.sleep(0.1)
        raise TimeoutError(f"{self.name} still running after {timeout}s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)
        self._log.close()

    def log_tail(self, chars: int = 2000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""

    async def sim_stats(self) -> dict[str, object]:
        async with (
            aiohttp.ClientSession() as http,
            http.get(self.api_url + "/sim/stats", timeout=aiohttp.ClientTimeout(total=5)) as r,
        ):
            body: dict[str, object] = await r.json()
            return body

    async def set_fault(self, mode: str) -> None:
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                self.api_url + "/sim/fault",
                json={"mode": mode},
                timeout=aiohttp.ClientTimeout(total=5),
            ) as r,
        ):
            r.raise_for_status()
