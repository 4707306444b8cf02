"""The engine child process: start it, forward signals, reap it (and orphans, as PID 1), report its
exit code.

The child runs in its own session so that a SIGKILL escalation reaches its whole process tree
(vLLM's EngineCore and workers). Reaping is done here with `waitpid(-1)` when the agent is PID 1,
because orphaned grandchildren are re-parented to PID 1 and would otherwise stay zombies.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from llmop_engine import contract
from llmop_engine.agent_settings import AgentSettings, flag_value, has_flag
from llmop_engine.contract import EngineFlag, Env
from llmop_engine.startup_log import EngineLog, LineSplitter, observe, starts_serving

log = logging.getLogger("llmop_engine.supervisor")

PR_SET_PDEATHSIG = 1
# Resolved before any fork: only async-signal-safe work may run between fork and exec.
_LIBC: ctypes.CDLL | None
try:
    _LIBC = ctypes.CDLL(None, use_errno=True)
except OSError:
    _LIBC = None

# Signals passed straight through; SIGTERM is not among them because it starts the drain sequence.
FORWARDED = (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def without_flag(args: Sequence[str], flag: str) -> list[str]:
    """`args` minus `--flag value` / `--flag=value`."""
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg == flag:
            skip = True
        elif not arg.startswith(flag + "="):
            out.append(arg)
    return out


def engine_command(settings: AgentSettings, python: str = sys.executable) -> list[str]:
    """The child's argv: `vllm serve …` or the built-in simulator, with the agent's defaults added.

    `--host/--port` are appended when absent (contract). The drain is the agent's (see drain.py):
    it waits for in-flight work itself, counted by vLLM's `/load`
    (`--enable-server-load-tracking`, added), and SIGTERMs the engine only once idle or out of
    budget, so a SIGTERM must abort at once: `--shutdown-timeout 0`, replacing any value in the
    engine flags (vLLM's own drain answers late requests HTTP 500 and, past its timeout, never
    exits while streams are open).

    vLLM also gets the agent's `--middleware` (`contract.CLOSE_ON_DRAIN_MIDDLEWARE`): once the pod
    drains, every response closes its connection, so that keep-alive clients pinned to this pod
    move to another and in-flight work can reach zero (`llmop_engine.connection_close`). The
    simulator does the same by itself.
    """
    args = list(settings.engine_args)
    if not has_flag(args, EngineFlag.HOST):
        args += [EngineFlag.HOST, "0.0.0.0"]
    if not has_flag(args, EngineFlag.PORT):
        args += [EngineFlag.PORT, str(settings.api_port)]
    if not has_flag(args, EngineFlag.ENABLE_SERVER_LOAD_TRACKING):
        args += [EngineFlag.ENABLE_SERVER_LOAD_TRACKING]
    if settings.backend != "simulator" and contract.CLOSE_ON_DRAIN_MIDDLEWARE not in args:
        args += [EngineFlag.MIDDLEWARE, contract.CLOSE_ON_DRAIN_MIDDLEWARE]
    args = [*without_flag(args, EngineFlag.SHUTDOWN_TIMEOUT), EngineFlag.SHUTDOWN_TIMEOUT, "0"]
    if settings.backend == "simulator":
        return [python, "-m", "llmop_engine", "simulate", *args]
    return ["vllm", "serve", *args]


def engine_env(settings: AgentSettings, environ: Mapping[str, str]) -> dict[str, str]:
    """The child's environment: the agent's, plus where the drain flag will appear and, when the
    agent runs from a source tree (tests, `make dev`), that tree on `PYTHONPATH` so vLLM's own
    interpreter can import the middleware. In the images both share one interpreter with
    `llmop_engine` on `PYTHONPATH` already; an installed package's site-packages is never added
    (it would shadow vLLM's own dependencies)."""
    env = dict(environ)
    env[Env.DRAIN_FLAG] = contract.drain_flag_path(settings.agent_socket)
    src = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if os.path.basename(src) not in ("site-packages", "dist-packages") and src not in paths:
        env["PYTHONPATH"] = os.pathsep.join([*paths, src])
    return env


def mark_draining(path: str) -> None:
    """Create the drain flag the engine's `Connection: close` reads (see `engine_env`)."""
    try:
        with open(path, "w"):
            pass
    except OSError as exc:  # keep-alive clients then stay pinned; the drain still runs
        log.error("cannot create the drain flag %s: %s", path, exc)


def clear_drain_mark(path: str) -> None:
    """Remove a flag left by an earlier run of the agent in the same volume (a restart)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def engine_port(settings: AgentSettings) -> int:
    """The port the engine really listens on (engine flags win over `--port` of the agent)."""
    raw = flag_value(settings.engine_args, EngineFlag.PORT)
    return int(raw) if raw else settings.api_port


def _die_with_parent() -> None:
    """In the child before exec: get SIGKILL if the agent dies, so an engine never outlives its
    supervisor (in a container PID 1's death ends everything anyway; outside one it would not)."""
    if _LIBC is not None:
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def exit_status(status: int) -> int:
    """A waitpid status as a shell-style exit code (128 + N for death by signal N)."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    return 1


def live_members(pgid: int) -> list[int]:
    """PIDs in process group `pgid` that are not zombies (Linux /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{entry}/stat") as f:
                # pid (comm) state ppid pgrp …; comm may hold spaces and parentheses.
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                found.append(int(entry))
    return found


OnLine = Callable[[str, float], None]
"""Called with each complete line the engine writes (cut to `startup_log.MAX_LINE`) and the
monotonic moment it arrived, from the relay's thread."""


def relay(source: int, target: int, on_line: OnLine) -> None:
    """Copy every byte from `source` to `target` as it comes (the container log sees the engine's
    output unchanged and undelayed, progress bars included), and hand each line to
    `on_line`. Runs until the engine and everything that inherited its output are gone. A target
    that stops taking writes is given up, never the reading: an engine blocked on a full pipe
    would stop serving."""
    splitter = LineSplitter()
    writing = True
    with contextlib.suppress(OSError), open(source, "rb", buffering=0, closefd=True) as pipe:
        while chunk := pipe.read(65536):
            if writing:
                try:
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(target, view) :]
                except OSError:
                    writing = False
            now = time.monotonic()
            for line in splitter.feed(chunk):
                try:
                    on_line(line, now)
                except Exception:  # a reader's bug must never stop the relay
                    log.exception("reading the engine's output failed")


class EngineLines:
    """What the engine's lines told so far, for the agent (`startup_log`): the relay threads
    write it, the agent reads it; `on_serving` (set by the agent once its loop runs) is called,
    from a relay thread, when the engine says its API server starts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._log = EngineLog()
        self._first = threading.Event()
        self.on_serving: Callable[[], None] | None = None

    def line(self, text: str, now: float) -> None:
        self._first.set()
        with self._lock:
            before = self._log
            after = self._log = observe(before, text, now)
        if starts_serving(before, after) and (callback := self.on_serving) is not None:
            callback()

    @property
    def log(self) -> EngineLog:
        with self._lock:
            return self._log

    def wait_first(self, timeout: float) -> bool:
        """Until the engine's first line (it got past its own imports), at most `timeout`."""
        return self._first.wait(timeout)


class Supervisor:
    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        on_line: OnLine | None = None,
    ) -> None:
        self.argv = list(argv)
        self.env = None if env is None else dict(env)
        self.on_line = on_line
        self.spawned_at: float | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.returncode: int | None = None
        self._exited = asyncio.Event()
        self._reap_all = os.getpid() == 1

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def spawn(self) -> None:
        """Start the engine process (and its output relays); no event loop needed, so the agent
        can do it before importing the rest of itself. `start` then watches it."""
        log.info("starting engine: %s", " ".join(self.argv))
        # Without a reader, stdout/stderr are inherited; with one, each goes through a pipe and
        # a relay thread to the agent's own (the container log gets the same bytes).
        piped = subprocess.PIPE if self.on_line is not None else None
        # preexec_fn is safe here: the engine is spawned once, before the agent starts any thread.
        self.proc = subprocess.Popen(
            self.argv,
            start_new_session=True,
            env=self.env,
            stdout=piped,
            stderr=piped,
            preexec_fn=_die_with_parent,  # noqa: PLW1509
        )
        if self.on_line is not None:
            for stream, target in ((self.proc.stdout, 1), (self.proc.stderr, 2)):
                assert stream is not None
                # The relay owns the read end from here (Popen's file object must not close it).
                source = os.dup(stream.fileno())
                stream.close()
                threading.Thread(
                    target=relay,
                    args=(source, target, self.on_line),
                    name=f"engine-output-{target}",
                    daemon=True,
                ).start()
        self.spawned_at = time.monotonic()

    def start(self) -> None:
        """Spawn the engine unless `spawn` already did, and reap it when it exits."""
        if self.proc is None:
            self.spawn()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGCHLD, self.reap)
        # An engine that exited before the handler existed (an early spawn) is reaped now.
        self.reap()

    def alive(self) -> bool:
        return self.proc is not None and self.returncode is None

    def reap(self) -> None:
        """Collect exited children without blocking; record the engine's status."""
        if self.proc is None:
            return
        while True:
            target = -1 if self._reap_all else self.proc.pid
            try:
                pid, status = os.waitpid(target, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.proc.pid and self.returncode is None:
                self.returncode = exit_status(status)
                # Tell Popen not to wait for it again.
                self.proc.returncode = self.returncode
                log.info("engine exited with code %d", self.returncode)
                self._exited.set()
            if not self._reap_all:
                return

    async def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the engine to exit; polls as a backstop in case a SIGCHLD was coalesced."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while self.returncode is None:
            remaining = 0.5 if deadline is None else min(0.5, deadline - loop.time())
            if remaining <= 0:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._exited.wait(), remaining)
            self.reap()
        return self.returncode

    def send(self, sig: int) -> None:
        if self.proc is not None and self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)

    def engine_cores(self) -> list[int]:
        """PIDs of vLLM's EngineCore processes in the engine's process group (none for the
        simulator). Linux /proc; vLLM names them `VLLM::EngineCore` (setproctitle)."""
        if self.proc is None or self.returncode is not None:
            return []
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == self.proc.pid:
                continue
            with contextlib.suppress(OSError):
                if os.getpgid(int(entry)) != self.proc.pid:
                    continue
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if b"EngineCore" in f.read():
                        found.append(int(entry))
        return found

    def signal_engine_cores(self, sig: int) -> list[int]:
        """Send `sig` to the EngineCore processes; returns those signalled."""
        pids = self.engine_cores()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        return pids

    def kill_tree(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    def end_leftovers(self) -> bool:
        """Once the engine's own process has exited: SIGKILL what is left of its process group.

        vLLM's API server can exit while a worker of its EngineCore is still blocked in a
        collective with another node's rank; that orphan keeps the GPU memory and the rendezvous
        port, so the other ranks of the group go on seeing their leader. In a container the
        runtime ends it with PID 1; under `shareProcessNamespace` or outside a container nothing
        would. Returns whether anything was left."""
        if self.proc is None or self.returncode is None:
            return False
        left = live_members(self.proc.pid)
        if not left:
            return False
        log.warning(
            "the engine exited leaving %d process(es) in its group (%s): killing them",
            len(left),
            ", ".join(map(str, left)),
        )
        # The group's id stays reserved while any member lives, so this reaches only it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        return True


FIRST_LINE_WAIT_SECONDS = 1.5
"""How long the agent lets an early engine import alone before importing its own servers: in a
container with a small CPU limit both share one CFS quota, and the engine's imports are on the
path to its first token while the agent's are not (the simulator at 250m, `make bench-wake`:
engine start 1.0 to 1.4 s importing beside the agent, 0.5 to 0.6 s alone). The engine's first
line ends the wait; vLLM, whose imports take longer than this, shares the CPU after it as
before."""


@dataclass(frozen=True)
class EarlyStart:
    """An engine spawned before the agent imported its servers, for the agent to adopt."""

    supervisor: Supervisor
    lines: EngineLines
    prepared_at: float
    """When the agent began preparing the engine's start (its own start ends there)."""


def start_early(settings: AgentSettings) -> EarlyStart | None:
    """Spawn the engine first thing, so importing the agent's servers and metrics (about a
    second on a busy node) overlaps the engine's own start instead of preceding it (the agent
    then waits for the engine's first line: `FIRST_LINE_WAIT_SECONDS`). Not with a
    compile cache: seeding it can take long, and the kubelet's startup probe needs the agent's
    servers meanwhile (the agent seeds, then spawns, as before). None then."""
    if settings.compile_cache_key and settings.model_cache_dir:
        return None
    prepared_at = time.monotonic()
    clear_drain_mark(contract.drain_flag_path(settings.agent_socket))
    lines = EngineLines()
    supervisor = Supervisor(engine_command(settings), engine_env(settings, os.environ), lines.line)
    supervisor.spawn()
    return EarlyStart(supervisor, lines, prepared_at)
