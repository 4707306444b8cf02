"""Pure: what the engine agents' `GET /status` answers mean for the operator.

`llmop.pod_client` fetches the JSON; this module turns it into an `AgentReading` (the few
fields the operator acts on: load, KV capacity, deep probe, phase) and decides from readings:

- the KV cache the engines actually have (`actual_kv_tokens`) and how far it falls short of the
  plan (`capacity_shortfall`);
- pods whose agent's deep probe (a real completion) fails (`probe_issue`), Ready in Kubernetes
  or already taken out of the Service: the engine accepts connections but does not generate;
- the `controller.kubernetes.io/pod-deletion-cost` of each pod (`deletion_cost`) and whether a
  new value is worth a write (`cost_changed`), so a scale-down removes the idlest pods first.

Field names are the agent's (`llmop_engine.agent.Agent.status`); a reading that lacks one is
treated as "not reported", never as zero.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from llmop.conditions import REASON_DEEP_PROBE_FAILING
from llmop.pods import PodIssue
from llmop_engine.contract import (
    STARTUP_KEY,
    STARTUP_PHASES,
    STARTUP_PHASES_KEY,
    AdapterStatusKey,
)

CAPACITY_MARGIN = 0.10
"""Actual KV capacity may fall this far below the plan before it counts as a shortfall: the
planner's estimate and vLLM's profiling differ by a few percent (CUDA graphs, activations)."""
COST_STEP = 0.25
"""A deletion cost is rewritten only when it moved by at least this fraction (and by at least
one request): one patch per pod per read at most, none while the load only jitters."""


@dataclass(frozen=True)
class PodAdapter:
    """One adapter as one pod's agent reported it."""

    name: str
    phase: str
    message: str | None = None
    revision: str | None = None
    rank: int | None = None


def parse_pod_adapters(raw: object) -> tuple[PodAdapter, ...] | None:
    """The agent's `/status` `adapters` list (None: the agent reported none, e.g. LoRA off or
    an agent from before adapters)."""
    if not isinstance(raw, list):
        return None
    out = []
    for entry in raw:
        if not isinstance(entry, Mapping) or not isinstance(entry.get(AdapterStatusKey.NAME), str):
            continue
        rank = entry.get(AdapterStatusKey.RANK)
        message = entry.get(AdapterStatusKey.MESSAGE)
        revision = entry.get(AdapterStatusKey.REVISION)
        out.append(
            PodAdapter(
                name=entry[AdapterStatusKey.NAME],
                phase=str(entry.get(AdapterStatusKey.PHASE) or "Pending"),
                message=str(message) if message else None,
                revision=str(revision) if revision else None,
                rank=rank if isinstance(rank, int) and not isinstance(rank, bool) else None,
            )
        )
    return tuple(out)


@dataclass(frozen=True)
class AgentReading:
    """One agent's `/status`, reduced to what the operator uses."""

    pod: str
    phase: str | None = None
    ready: bool = False
    running: int | None = None
    waiting: int | None = None
    kv_capacity_tokens: int | None = None
    model_cache_bytes: int | None = None
    deep_probe_ok: bool | None = None
    deep_probe_error: str | None = None
    adapters: tuple[PodAdapter, ...] | None = None
    """The pod's LoRA adapters as its agent reported them (None: none reported)."""
    compile_cache: str | None = None
    """How this start used the compile cache (`COMPILE_CACHE_OUTCOMES`); None without one."""
    start_phases: Mapping[str, float] | None = None
    """Seconds per phase of the engine's start (`STARTUP_PHASES`), as far as it got; None
    from an agent that does not report them."""

    @property
    def load(self) -> int | None:
        """Requests in the engine (running + waiting), None when the agent had no fresh read."""
        if self.running is None and self.waiting is None:
            return None
        return (self.running or 0) + (self.waiting or 0)


def _count(value: Any) -> int | None:
    # bool is an int in Python; the agent never sends one here, but a stand-in might.
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return max(0, int(value))


def parse_status(pod: str, payload: Any) -> AgentReading:
    """The reading of `pod` from its agent's `/status` JSON; raises ValueError when the
    payload is not the agent's shape at all (another server on that port)."""
    if not isinstance(payload, Mapping) or "phase" not in payload:
        raise ValueError(f"pod {pod}: /status is not an llmop agent status")
    probe = payload.get("lastDeepProbe")
    probe = probe if isinstance(probe, Mapping) else {}
    ok = probe.get("ok")
    error = probe.get("error")
    return AgentReading(
        pod=pod,
        phase=str(payload["phase"]) if payload.get("phase") is not None else None,
        ready=payload.get("ready") is True,
        running=_count(payload.get("running")),
        waiting=_count(payload.get("queueDepth")),
        kv_capacity_tokens=_count(payload.get("kvCacheCapacityTokens")),
        model_cache_bytes=_count(payload.get("modelCacheBytes")),
        deep_probe_ok=ok if isinstance(ok, bool) else None,
        deep_probe_error=str(error) if error else None,
        adapters=parse_pod_adapters(payload.get("adapters")),
        compile_cache=_compile_cache(payload.get("compileCache")),
        start_phases=_start_phases(payload.get(STARTUP_KEY)),
    )


MAX_PHASE_SECONDS = 30 * 24 * 3600.0
"""A phase longer than this is not a figure an agent measured: it is dropped."""


def _start_phases(report: Any) -> Mapping[str, float] | None:
    phases = report.get(STARTUP_PHASES_KEY) if isinstance(report, Mapping) else None
    if not isinstance(phases, Mapping):
        return None
    return {
        name: round(float(seconds), 1)
        for name in STARTUP_PHASES
        if isinstance(seconds := phases.get(name), int | float)
        and not isinstance(seconds, bool)
        and 0 <= seconds <= MAX_PHASE_SECONDS
    }


COMPILE_CACHE_OUTCOMES = ("hit", "miss", "off", "rejected", "error")
"""The agent's `/status.compileCache.seed`: what a start found in the compile cache."""


def _compile_cache(report: Any) -> str | None:
    seed = report.get("seed") if isinstance(report, Mapping) else None
    return seed if seed in COMPILE_CACHE_OUTCOMES else None


def actual_kv_tokens(readings: Iterable[AgentReading]) -> int | None:
    """The KV cache one replica really has: the smallest any ready engine reports (the plan is
    per replica, and the weakest one is what a request may land on). None when none reports."""
    reported = [
        r.kv_capacity_tokens for r in readings if r.ready and r.kv_capacity_tokens is not None
    ]
    return min(reported) if reported else None


def capacity_shortfall(planned: int | None, actual: int | None) -> str | None:
    """A sentence when `actual` falls short of `planned` by more than `CAPACITY_MARGIN`."""
    if not planned or actual is None or actual >= planned * (1 - CAPACITY_MARGIN):
        return None
    short = 1 - actual / planned
    return (
        f"the engines report {actual} KV cache tokens per replica, {short:.0%} below the "
        f"planned {planned} ({planned - actual} tokens short): fewer concurrent sequences fit "
        "than planned; raise engine.gpuMemoryUtilization, lower engine.maxModelLen, or use "
        "bigger GPUs"
    )


def probe_issue(readings: Iterable[AgentReading], ready_pods: Iterable[str]) -> PodIssue | None:
    """The first pod (by name) whose agent's last deep probe failed. The agent takes such a
    pod out of the Service itself; the message says whether Kubernetes has noticed yet."""
    ready = set(ready_pods)
    failing = sorted((r for r in readings if r.deep_probe_ok is False), key=lambda r: r.pod)
    if not failing:
        return None
    first = failing[0]
    detail = f": {first.deep_probe_error}" if first.deep_probe_error else ""
    others = f" ({len(failing) - 1} more pods too)" if len(failing) > 1 else ""
    where = (
        "is Ready but its deep probe (a real completion) fails"
        if first.pod in ready
        else "is out of the Service: its deep probe (a real completion) fails"
    )
    return PodIssue(
        REASON_DEEP_PROBE_FAILING,
        f"pod {first.pod} {where}{detail}{others}; the engine accepts connections but does not "
        "generate (hung or overloaded): check `kubectl logs` and its GPU",
        first.pod,
    )


def deletion_cost(reading: AgentReading) -> int | None:
    """The pod's deletion cost: its load, so the idlest pod goes first. None when unknown."""
    return reading.load


def cost_changed(current: str | None, wanted: int) -> bool:
    """Whether the annotation (`current`, as stored) should be rewritten to `wanted`."""
    try:
        old = int(current) if current is not None else None
    except ValueError:
        return True
    if old is None:
        return True
    difference = abs(wanted - old)
    return difference >= 1 and difference >= COST_STEP * max(old, wanted)
