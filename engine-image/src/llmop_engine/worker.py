"""Judgement of a worker agent (`--role worker`): a headless vLLM rank of a multi-node group.

Pure: values in, values out (`worker_agent` gathers the observations). A worker has no API, no
`/health` and no queue, so all it can tell is whether its process runs and whether the leader's
rendezvous port (`--master-addr`:`--master-port`, the torch TCPStore every rank talks to) answers.

- `/livez` fails when the process died, or when the leader's port has been unreachable for longer
  than the stall budget (`stall_seconds`; before the port first answered, the load budget). A
  worker whose leader is gone cannot serve again: LeaderWorkerSet recreates the group.
- `/readyz` is 200 while the process runs and the leader's port answered at the latest poll.
  LWS counts a group ready only when its worker StatefulSet has all replicas available, so a
  worker that never became Ready would hold its group unready forever; the Service selects
  leaders only, so a Ready worker never draws traffic. It goes off on the drain.
- Drain: the worker keeps its rank up while the leader still answers (the leader finishes its
  in-flight requests, which need every rank), and stops it once the leader is gone (two failed
  polls in a row) or the budget ran out.
- Orphaned: a rank that ends on its own after its leader went (the leader's port no longer
  answers) is not a worker failure. On a rollout or a recreate LeaderWorkerSet deletes the
  leader pod, and the worker StatefulSet, owned by that pod, is deleted only once the leader is
  gone, so a worker always sees its leader go first. Failing then would restart the container,
  and a restarted rank dials the same leader address — where the next group's leader is already
  waiting: it joins it, and takes that new group down when its stale pod is deleted a moment
  later (measured on the real node). So the agent keeps running without a rank, not ready and
  live, until the pod's deletion stops it. It stays live past the stall budget too: the
  deletion comes in seconds, but on a loaded control plane the garbage collector can take
  longer, and a restart then is exactly the stale rank above. Every way a worker is orphaned
  ends in LeaderWorkerSet deleting its group (RecreateGroupAfterStart), so the wait ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from llmop_engine.contract import MASTER_ADDR, MASTER_PORT, EngineFlag, flag_value
from llmop_engine.health import Phase, Verdict


@dataclass(frozen=True)
class Rendezvous:
    host: str
    port: int


def rendezvous(engine_args: Sequence[str]) -> Rendezvous:
    """The leader's rendezvous endpoint from the engine flags (vLLM's defaults when absent)."""
    host = flag_value(engine_args, EngineFlag.MASTER_ADDR) or MASTER_ADDR
    port = flag_value(engine_args, EngineFlag.MASTER_PORT)
    return Rendezvous(host, int(port) if port else MASTER_PORT)


@dataclass(frozen=True)
class WorkerState:
    started_at: float
    process_alive: bool = True
    exit_code: int | None = None
    reached_at: float | None = None
    """When the leader's port last answered."""
    first_reached_at: float | None = None
    unreachable_since: float | None = None
    """The first failed poll after the last answer (None while it answers)."""
    unreachable_polls: int = 0
    """Failed polls in a row."""
    draining: bool = False
    orphaned_at: float | None = None
    """When the rank ended on its own after its leader went (module docstring)."""


def observe(
    state: WorkerState, now: float, *, alive: bool, reached: bool, exit_code: int | None
) -> WorkerState:
    """Fold one poll: is the process alive, did the leader's port accept a connection."""
    if reached:
        return replace(
            state,
            process_alive=alive,
            exit_code=exit_code,
            reached_at=now,
            first_reached_at=state.first_reached_at or now,
            unreachable_since=None,
            unreachable_polls=0,
        )
    return replace(
        state,
        process_alive=alive,
        exit_code=exit_code,
        unreachable_since=state.unreachable_since if state.unreachable_since is not None else now,
        unreachable_polls=state.unreachable_polls + 1,
    )


def start_drain(state: WorkerState) -> WorkerState:
    return replace(state, draining=True)


def orphan(state: WorkerState, now: float, exit_code: int | None) -> WorkerState:
    """The rank ended on its own while its leader's port did not answer."""
    return replace(state, process_alive=False, exit_code=exit_code, orphaned_at=now)


def verdict(
    state: WorkerState, now: float, *, stall_seconds: float, load_timeout_seconds: float
) -> Verdict:
    """The worker's `/livez` and `/readyz` at `now` (module docstring)."""
    if state.orphaned_at is not None:
        waited = now - state.orphaned_at
        late = (
            f"; later than the stall budget ({stall_seconds:.0f}s), but a restarted rank would "
            "join the next group's leader"
            if waited > stall_seconds
            else ""
        )
        return Verdict(
            phase=Phase.DRAINING,
            live=True,
            ready=False,
            reason=f"headless rank ended after its leader went ({waited:.0f}s ago): waiting for "
            f"LeaderWorkerSet to delete this pod with its group{late}",
        )
    if not state.process_alive:
        return Verdict(
            phase=Phase.FAILED,
            live=False,
            ready=False,
            reason=f"headless engine process exited (code {state.exit_code})",
        )
    if state.first_reached_at is None:
        waited = now - state.started_at
        if waited > load_timeout_seconds:
            return Verdict(
                phase=Phase.FAILED,
                live=False,
                ready=False,
                reason=f"leader's rendezvous port never answered in {waited:.0f}s "
                f"(load budget {load_timeout_seconds:.0f}s)",
            )
        return Verdict(
            phase=Phase.LOADING,
            live=True,
            ready=False,
            reason=f"waiting for the leader's rendezvous port ({waited:.0f}s)",
        )
    if state.unreachable_since is not None:
        gone = now - state.unreachable_since
        if gone > stall_seconds:
            return Verdict(
                phase=Phase.FAILED,
                live=False,
                ready=False,
                reason=f"leader's rendezvous port unreachable for {gone:.0f}s "
                f"(stall budget {stall_seconds:.0f}s)",
            )
        return Verdict(
            phase=Phase.READY,
            live=True,
            ready=False,
            reason=f"leader's rendezvous port unreachable for {gone:.0f}s",
        )
    if state.draining:
        return Verdict(
            phase=Phase.DRAINING,
            live=True,
            ready=False,
            reason="draining: the rank stays up while the leader answers",
        )
    return Verdict(
        phase=Phase.READY,
        live=True,
        ready=True,
        reason="headless rank running, leader's rendezvous port answers (a worker serves no "
        "traffic: the Service selects leaders)",
    )


LEADER_GONE_POLLS = 2
"""Failed polls in a row that end a drain. One is no proof: when this process is held up (seconds,
on a loaded node) the connect in flight times out the moment it runs again, and stopping the rank
then would cut the requests the leader is still finishing."""


def may_stop(state: WorkerState, now: float, drain_started: float, budget: float) -> bool:
    """During the drain: stop the rank once the leader's port stopped answering (the leader has
    finished or is gone), or the budget ran out."""
    return state.unreachable_polls >= LEADER_GONE_POLLS or now - drain_started >= budget
