"""Pure: where an engine's start went, read from the lines the engine itself logs.

The pod's timestamps say when the container started and when it was Ready; what happened between
(importing torch and vLLM, loading the weights, compiling, warming up) only the engine says, in
its log. The agent relays every byte of the engine's output unchanged and hands each complete
line here with the moment it arrived; this module keeps the first and last arrival of each line
it knows and turns them into consecutive phases that add up to the engine's whole start.

The lines are vLLM 0.32's own (`vllm/v1/worker/cpu_model_runner.py`, `gpu_model_runner.py`,
`model_executor/model_loader/default_loader.py`, `compilation/monitor.py`, `v1/engine/core.py`),
matched by their message text wherever the prefix puts them (`(Worker pid=…) INFO 12-05 …`).
A line vLLM stops printing leaves its boundary unseen: the phases around it merge into the next
one seen, and nothing is guessed. The simulator prints the same lines.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field, replace
from typing import Final


class Mark(enum.StrEnum):
    """A moment in the engine's start that a log line tells."""

    LOAD_STARTED = "loadStarted"
    WEIGHTS_LOADED = "weightsLoaded"
    COMPILE_STARTED = "compileStarted"
    COMPILE_DONE = "compileDone"
    INIT_DONE = "initDone"
    SERVING = "serving"


_RULES: Final[tuple[tuple[Mark, re.Pattern[str]], ...]] = (
    # Every worker (tensor/pipeline parallel rank) logs its own: first and last are both kept.
    (Mark.LOAD_STARTED, re.compile(r"Starting to load model ")),
    (Mark.WEIGHTS_LOADED, re.compile(r"Loading weights took |Model loading took ")),
    # CPU: compiling happens in this warm-up (compilation mode DYNAMO_TRACE_ONCE logs no
    # "torch.compile took"); GPU: torch.compile brackets its own work.
    (
        Mark.COMPILE_STARTED,
        re.compile(r"Warming up model for the compilation|Starting torch\.compile"),
    ),
    (Mark.COMPILE_DONE, re.compile(r"Warming up done\.|torch\.compile took [0-9.]+ s in total")),
    (Mark.INIT_DONE, re.compile(r"init engine \(profile, create kv cache, warmup model\) took ")),
    # The API server is about to answer (vLLM's entrypoint, then uvicorn): the agent looks at
    # once rather than at its next poll.
    (Mark.SERVING, re.compile(r"Starting vLLM server on |Application startup complete\.")),
)
_COMPILE_SECONDS: Final = re.compile(r"torch\.compile took ([0-9.]+) s in total")
_GRAPH_CAPTURE: Final = re.compile(r"Graph capturing finished in ([0-9.]+) secs")
_PROCESS: Final = re.compile(r"\bpid=(\d+)")
"""vLLM's prefix names the process: `(Worker_TP1 pid=2) INFO …`."""
_COMPILE_HIT: Final = re.compile(
    r"Directly load the compiled graph|Directly load AOT compilation from path"
)
_COMPILE_MISS: Final = re.compile(
    r"Compiling a graph for compile range|Compiling model again due to a load failure"
)

MAX_LINE: Final = 4096
"""Bytes of a line that are matched: every line above is short; a longer one (a config dump) is
cut, never held whole."""


class Phase(enum.StrEnum):
    """The engine's part of a start, in order; the names docs/operations.md uses."""

    AGENT_START = "agentStart"
    """The agent's process started → it prepares the engine's start (Python's own start and
    imports; without a compile cache the agent spawns the engine first and imports the rest of
    itself while the engine starts)."""
    PREPARE = "prepare"
    """→ engine spawned (the compile cache seeded)."""
    ENGINE_START = "engineStart"
    """Engine spawned → its first worker starts loading the model (importing torch and vLLM,
    reading the config and tokenizer, starting the engine core and workers)."""
    WEIGHTS = "weights"
    """Loading the model's weights, every worker."""
    COMPILE = "compile"
    """Compiling the model (torch.compile; on CPU, the compile warm-up)."""
    WARMUP = "warmup"
    """The rest of the engine's init: memory profiling, KV cache, warm-up, CUDA graph capture."""
    API_START = "apiStart"
    """The engine's init done → its API server answers `/health`."""
    FIRST_PROBE = "firstProbe"
    """`/health` answers → the agent's first good deep probe (the pod reports ready)."""


@dataclass(frozen=True)
class EngineLog:
    """What the lines said so far: per mark, when it was first and last seen (seconds on the
    agent's monotonic clock), plus the durations the engine reported itself."""

    first: dict[Mark, float] = field(default_factory=dict)
    last: dict[Mark, float] = field(default_factory=dict)
    compile_by_process: dict[str, float] = field(default_factory=dict)
    """"torch.compile took X s in total" (GPU), summed per process (one line per compiled graph
    family, one after the other) by the `pid=` of the line's prefix."""
    capture_by_process: dict[str, float] = field(default_factory=dict)
    """"Graph capturing finished in X secs", the same way."""
    compile_hit: bool | None = None
    """True when vLLM loaded compiled graphs from its cache, False when it compiled; None
    when it said neither (the CPU build says neither)."""

    @property
    def compile_seconds(self) -> float:
        """The workers compile side by side: the longest one's sum."""
        return max(self.compile_by_process.values(), default=0.0)

    @property
    def graph_capture_seconds(self) -> float | None:
        return max(self.capture_by_process.values(), default=None)


def _added(by_process: dict[str, float], line: str, seconds: float) -> dict[str, float]:
    process = m[1] if (m := _PROCESS.search(line)) is not None else ""
    return {**by_process, process: by_process.get(process, 0.0) + seconds}


def starts_serving(before: EngineLog, after: EngineLog) -> bool:
    """The line that made `after` from `before` says the engine's API is about to answer."""
    return Mark.SERVING in after.first and Mark.SERVING not in before.first


def observe(log: EngineLog, line: str, now: float) -> EngineLog:
    """`log` after one complete line (without its newline) arrived at `now`."""
    line = line[:MAX_LINE]
    first, last = log.first, log.last
    changed = False
    for mark, pattern in _RULES:
        if pattern.search(line):
            if not changed:
                first, last = dict(first), dict(last)
                changed = True
            first.setdefault(mark, now)
            last[mark] = now
    out = replace(log, first=first, last=last) if changed else log
    if (m := _COMPILE_SECONDS.search(line)) is not None:
        out = replace(out, compile_by_process=_added(out.compile_by_process, line, float(m[1])))
    if (m := _GRAPH_CAPTURE.search(line)) is not None:
        out = replace(out, capture_by_process=_added(out.capture_by_process, line, float(m[1])))
    if out.compile_hit is None and _COMPILE_HIT.search(line):
        out = replace(out, compile_hit=True)
    elif _COMPILE_MISS.search(line):
        out = replace(out, compile_hit=False)
    return out


@dataclass(frozen=True)
class Moments:
    """What the agent saw itself, on the same clock as the log."""

    agent_started: float
    spawned: float | None = None
    process_started: float | None = None
    """When the agent's process was created (the kernel's record), before its imports."""
    prepared: float | None = None
    """When the agent began preparing the engine's start (default: `agent_started`)."""
    listening: float | None = None
    ready: float | None = None


def _between(start: float | None, end: float | None) -> float | None:
    if start is None or end is None:
        return None
    return max(0.0, end - start)


def phases(log: EngineLog, moments: Moments) -> dict[Phase, float]:
    """Seconds per phase, for the phases whose both ends were seen. Consecutive and
    non-overlapping: with every line seen they add up to agent start → ready. A missing line
    leaves its two neighbours out, and `untraced` says how much that is."""
    weights_end = log.last.get(Mark.WEIGHTS_LOADED)
    init_done = log.first.get(Mark.INIT_DONE)
    prepared = moments.prepared if moments.prepared is not None else moments.agent_started
    out: dict[Phase, float | None] = {
        Phase.AGENT_START: _between(moments.process_started, prepared),
        Phase.PREPARE: _between(prepared, moments.spawned),
        Phase.ENGINE_START: _between(moments.spawned, log.first.get(Mark.LOAD_STARTED)),
        Phase.WEIGHTS: _between(log.first.get(Mark.LOAD_STARTED), weights_end),
        Phase.API_START: _between(init_done, moments.listening),
        Phase.FIRST_PROBE: _between(moments.listening, moments.ready),
    }
    init = _between(weights_end, init_done)
    compiled = _compile(log)
    if init is None:
        out[Phase.COMPILE] = compiled
    else:
        # Compiling happens inside the init (vLLM's "init engine … took" covers it): the
        # rest of the init is the warm-up.
        out[Phase.COMPILE] = None if compiled is None else min(init, compiled)
        out[Phase.WARMUP] = init - (out[Phase.COMPILE] or 0.0)
    return {phase: round(out[phase] or 0.0, 1) for phase in Phase if out.get(phase) is not None}


def _compile(log: EngineLog) -> float | None:
    if log.compile_seconds > 0:
        return log.compile_seconds
    return _between(log.first.get(Mark.COMPILE_STARTED), log.last.get(Mark.COMPILE_DONE))


def untraced(found: dict[Phase, float], moments: Moments) -> float | None:
    """Agent start → ready minus the phases found: the seconds no line accounts for."""
    total = _between(moments.process_started or moments.agent_started, moments.ready)
    if total is None:
        return None
    return round(max(0.0, total - sum(found.values())), 1)


class LineSplitter:
    """Complete lines out of a byte stream, each cut to `MAX_LINE`; a line longer than that
    is cut and the rest of it dropped until its newline, so memory stays bounded."""

    def __init__(self) -> None:
        self._partial = bytearray()
        self._skipping = False

    def feed(self, chunk: bytes) -> list[str]:
        lines: list[str] = []
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            if not self._skipping:
                room = MAX_LINE - len(self._partial)
                self._partial += piece[:room]
                if len(piece) > room:
                    self._skipping = True
            if end < 0:
                return lines
            # tqdm's progress bars end their updates with \r: the last one is the line.
            text = bytes(self._partial).rsplit(b"\r", 1)[-1]
            lines.append(text.decode("utf-8", "replace"))
            self._partial.clear()
            self._skipping = False
            start = end + 1
