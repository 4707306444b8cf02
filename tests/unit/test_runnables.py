"""The table of background loops (`llmop.runnables`): which rows a config enables, and that
`start` starts exactly those (tasks on the loop, threads) and `Started.stop` ends every one.
A leadership term's use of it (stopped when the Lease is lost, fresh ones in the next term) is in
tests/unit/test_leader.py."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from typing import Any, cast

from llmop import late_crds, runnables
from llmop.config import OperatorConfig, load
from llmop.metrics import Metrics
from llmop.periodic import run_in_thread, run_rounds
from llmop.reconcile import Context
from llmop.runnables import Runnable, Term

log = logging.getLogger("llmop.test")


def _term(config: OperatorConfig) -> Term:
    context = Context(kube=cast(Any, None), config=config, metrics=Metrics(), instance="t")
    return Term(context, cast(late_crds.KopfRun, None))


def _enabled(config: OperatorConfig) -> list[str]:
    return [row.name for row in runnables.TABLE if row.enabled(config)]


def test_each_loop_has_one_row_and_the_config_decides_which_run() -> None:
    names = [row.name for row in runnables.TABLE]
    assert len(names) == len(set(names))
    always = [
        *("group-check", "hub-check", "pool-check", "late-crds"),
        *("download-poller", "facts-reader", "crd-check"),
    ]
    assert _enabled(OperatorConfig()) == ["fleet-reader", *always]
    with_router = load(["--router", "llmop-system/llmop-router:8080"], {})
    assert _enabled(with_router) == [
        *("fleet-reader", "router-check", "name-check", "idle-check"),
        *always,
    ]
    no_agents = dataclasses.replace(OperatorConfig(), agent_read_interval_seconds=0)
    assert _enabled(no_agents) == always


def test_only_enabled_rows_start_and_stop_ends_every_started_one() -> None:
    """An async row runs as a task, a thread row as a thread, a disabled row is never even
    made; `stop` cancels the tasks (their cleanup runs) and ends the threads, and nothing of
    them runs afterwards."""
    rounds = {"task": 0, "thread": 0}
    made: list[str] = []
    cleaned: list[str] = []

    async def ticking() -> None:
        async def round() -> None:
            rounds["task"] += 1

        try:
            await run_rounds(round, every=0.01, log=log, failure="ticking failed")
        finally:
            cleaned.append("task")

    def spinning(stop: threading.Event) -> None:
        def check() -> None:
            rounds["thread"] += 1

        run_in_thread(0.01, check, stop, log=log, failure="spinning failed")

    def never(term: Term) -> Any:
        made.append("disabled")
        raise AssertionError("a disabled row's factory ran")

    table = (
        Runnable("ticking", lambda term: ticking()),
        Runnable("off", never, lambda config: config.router is not None),
        Runnable("spinning", lambda term: spinning),
    )

    async def scenario() -> runnables.Started:
        started = runnables.start(_term(OperatorConfig()), table)
        assert started.names == ["ticking", "spinning"]
        assert started.tasks["ticking"].get_name() == "llmop-ticking"
        assert started.threads["spinning"].name == "spinning"
        deadline = time.monotonic() + 5
        while min(rounds.values()) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert min(rounds.values()) >= 3
        await started.stop()
        assert all(task.cancelled() for task in started.tasks.values())
        assert started.join(time.monotonic() + 1) == []
        return started

    started = asyncio.run(scenario())
    assert made == []
    assert cleaned == ["task"]
    assert not any(thread.is_alive() for thread in started.threads.values())
    after = dict(rounds)
    time.sleep(0.05)
    assert rounds == after, "no round after the stop"


def test_a_thread_that_does_not_stop_is_named() -> None:
    """`join` is bounded: a thread row still running at the deadline is reported (`main` ends
    a lost term's process then)."""
    release = threading.Event()

    async def scenario() -> list[str]:
        table = (Runnable("stuck", lambda term: lambda stop: release.wait(5)),)
        started = runnables.start(_term(OperatorConfig()), table)
        await started.stop()
        return started.join(time.monotonic() + 0.1)

    try:
        assert asyncio.run(scenario()) == ["stuck"]
    finally:
        release.set()
