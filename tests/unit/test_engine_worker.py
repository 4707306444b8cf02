"""The worker agent's pure rules (`llmop_engine.worker`) and its settings row (`--role`)."""

from __future__ import annotations

import pytest

from llmop_engine import contract, worker
from llmop_engine.agent_settings import parse_run_args
from llmop_engine.health import Phase
from llmop_engine.worker import Rendezvous, WorkerState
from llmop_engine.worker_agent import drain_budget

STALL = 60.0
LOAD = 1800.0


def judge(state: WorkerState, now: float) -> tuple[bool, bool, Phase]:
    v = worker.verdict(state, now, stall_seconds=STALL, load_timeout_seconds=LOAD)
    return v.live, v.ready, v.phase


def poll(state: WorkerState, now: float, *, reached: bool, alive: bool = True) -> WorkerState:
    return worker.observe(state, now, alive=alive, reached=reached, exit_code=None)


def test_rendezvous_from_engine_args_and_vllm_defaults() -> None:
    args = ["/m", "--nnodes", "2", "--master-addr", "leader-0.grp", "--master-port", "29600"]
    assert worker.rendezvous(args) == Rendezvous("leader-0.grp", 29600)
    assert worker.rendezvous(["--master-addr=10.0.0.7"]) == Rendezvous("10.0.0.7", 29501)
    assert worker.rendezvous([]) == Rendezvous("127.0.0.1", contract.MASTER_PORT)


def test_waiting_for_the_leader_is_live_not_ready_until_the_load_budget() -> None:
    s = poll(WorkerState(started_at=0.0), 5.0, reached=False)
    assert judge(s, 5.0) == (True, False, Phase.LOADING)
    assert judge(s, LOAD - 1) == (True, False, Phase.LOADING)
    assert judge(s, LOAD + 1) == (False, False, Phase.FAILED)


def test_ready_while_the_process_runs_and_the_leader_answers() -> None:
    s = poll(WorkerState(started_at=0.0), 5.0, reached=True)
    assert judge(s, 5.0) == (True, True, Phase.READY)


def test_leader_unreachable_unready_at_once_and_not_live_past_the_stall_budget() -> None:
    s = poll(WorkerState(started_at=0.0), 5.0, reached=True)
    s = poll(s, 10.0, reached=False)
    s = poll(s, 11.0, reached=False)  # the streak starts at its first failed poll
    assert judge(s, 11.0) == (True, False, Phase.READY)
    assert judge(s, 10.0 + STALL - 0.5)[0] is True
    assert judge(s, 10.0 + STALL + 0.5) == (False, False, Phase.FAILED)
    # It answers again: the streak is forgotten.
    s = poll(s, 12.0, reached=True)
    assert judge(s, 10.0 + STALL + 0.5) == (True, True, Phase.READY)


def test_a_dead_process_fails_liveness_whatever_the_leader() -> None:
    s = poll(WorkerState(started_at=0.0), 5.0, reached=True)
    s = worker.observe(s, 6.0, alive=False, reached=True, exit_code=137)
    v = worker.verdict(s, 6.0, stall_seconds=STALL, load_timeout_seconds=LOAD)
    assert (v.live, v.ready, v.phase) == (False, False, Phase.FAILED)
    assert "137" in v.reason


def test_drain_keeps_the_rank_until_the_leader_is_gone_or_the_budget_ends() -> None:
    s = worker.start_drain(poll(WorkerState(started_at=0.0), 5.0, reached=True))
    assert judge(s, 6.0) == (True, False, Phase.DRAINING)
    assert not worker.may_stop(s, 20.0, drain_started=6.0, budget=50.0)
    assert worker.may_stop(s, 56.0, drain_started=6.0, budget=50.0)
    # One failed poll is no proof (this process held up, a connect timed out on resuming).
    once = poll(s, 21.0, reached=False)
    assert not worker.may_stop(once, 21.0, drain_started=6.0, budget=50.0)
    assert not worker.may_stop(poll(once, 22.0, reached=True), 22.0, 6.0, 50.0)
    gone = poll(once, 22.0, reached=False)
    assert worker.may_stop(gone, 22.0, drain_started=6.0, budget=50.0)


def test_role_row_flag_and_variable() -> None:
    row = contract.row("role")
    assert (row.flag, row.env, row.default, row.choices) == (
        "--role",
        "LLMOP_ROLE",
        "leader",
        ("leader", "worker"),
    )
    assert parse_run_args([], {}).role == "leader"
    assert parse_run_args([], {"LLMOP_ROLE": "worker"}).role == "worker"
    assert parse_run_args(["--role", "leader"], {"LLMOP_ROLE": "worker"}).role == "leader"
    with pytest.raises(SystemExit):
        parse_run_args([], {"LLMOP_ROLE": "follower"})


def test_worker_drain_budget_covers_the_leaders_whole_drain() -> None:
    s = parse_run_args(["--drain-seconds", "30"], {"LLMOP_ENDPOINT_PROPAGATION_SECONDS": "5"})
    leader_drain = (
        s.endpoint_propagation_seconds
        + s.drain_seconds
        + s.engine_keep_alive_seconds
        + contract.ENGINE_EXIT_GRACE_SECONDS
    )
    assert drain_budget(s) >= leader_drain


def test_a_rank_ended_after_its_leader_went_waits_unready_for_its_deletion() -> None:
    """Orphaned (the leader's pod went first, as on every rollout): no failure, no restart, and
    so no stale rank joining the next group's leader, even past the stall budget (a slow
    garbage collector is no reason to restart into the next group)."""
    s = poll(WorkerState(started_at=0.0), 5.0, reached=True)
    s = worker.orphan(poll(s, 10.0, reached=False, alive=False), 10.5, exit_code=1)
    assert judge(s, 11.0) == (True, False, Phase.DRAINING)
    # Later polls (the process still gone, the leader answering or not) change nothing.
    s = poll(poll(s, 12.0, reached=True, alive=False), 13.0, reached=False, alive=False)
    v = worker.verdict(s, 10.5 + STALL - 1, stall_seconds=STALL, load_timeout_seconds=LOAD)
    assert (v.live, v.ready) == (True, False)
    assert "waiting for LeaderWorkerSet to delete this pod" in v.reason
    assert judge(s, 10.5 + STALL + 1) == (True, False, Phase.DRAINING)
    late = worker.verdict(s, 10.5 + STALL + 1, stall_seconds=STALL, load_timeout_seconds=LOAD)
    assert "a restarted rank would join the next group's leader" in late.reason
