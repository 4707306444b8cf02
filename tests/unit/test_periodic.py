"""The background loops' loop: every round runs, a failed one is logged and not fatal; a first
wait, a paced period, DONE, and the thread variant's stop event."""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time

import pytest

from llmop.periodic import DONE, run_every, run_in_thread, run_rounds


class ApiDownError(Exception):
    pass


def test_a_failed_round_is_logged_and_the_next_runs(caplog: pytest.LogCaptureFixture) -> None:
    rounds: list[int] = []

    def check() -> None:
        rounds.append(len(rounds))
        if len(rounds) == 1:
            raise ApiDownError("connection refused")
        if len(rounds) == 2:
            raise ValueError("a bug")

    async def three_rounds() -> None:
        task = asyncio.create_task(
            run_every(
                0.01,
                check,
                log=logging.getLogger("llmop.test"),
                failure="checking X failed",
                expected=(ApiDownError,),
            )
        )
        while len(rounds) < 3:
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with caplog.at_level(logging.WARNING, logger="llmop.test"):
        asyncio.run(three_rounds())
    assert len(rounds) >= 3
    # The expected failure: a warning with its message; the other: its traceback.
    (warning, error) = caplog.records[:2]
    assert (warning.levelname, warning.getMessage()) == (
        "WARNING",
        "checking X failed: connection refused",
    )
    assert warning.exc_info is None
    assert (error.levelname, error.getMessage()) == ("ERROR", "checking X failed")
    assert error.exc_info is not None
    assert error.exc_info[0] is ValueError


def test_a_first_wait_comes_before_the_first_round_and_done_ends_the_loop() -> None:
    """The fleet reader and the idle check wait one interval before their first round; a round
    that returns DONE ends its loop (nothing is left to wait for)."""
    times: list[float] = []

    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        started = loop.time()

        async def round() -> object:
            times.append(loop.time() - started)
            return DONE if len(times) == 3 else None

        await asyncio.wait_for(
            run_rounds(round, every=0.01, first_wait=0.2, log=logging.getLogger("t"), failure="x"),
            timeout=5,
        )
        return loop.time() - started

    took = asyncio.run(scenario())
    assert len(times) == 3
    assert times[0] >= 0.2
    assert took < 1


def test_a_paced_loop_counts_its_period_from_each_round_s_start() -> None:
    """`every` as a function (the fleet reader's `period`): the period from one round's start to
    the next, given the round's result (None when it failed), so a slow round is not followed
    by a whole period more."""
    starts: list[float] = []
    seen: list[object] = []

    async def scenario() -> None:
        loop = asyncio.get_running_loop()

        async def round() -> int:
            starts.append(loop.time())
            if len(starts) == 2:
                raise ValueError("a bad round")
            if len(starts) == 4:
                return DONE  # type: ignore[return-value]
            await asyncio.sleep(0.3)  # most of the period
            return len(starts)

        def period(result: int | None) -> float:
            seen.append(result)
            return 0.4

        await run_rounds(round, every=period, log=logging.getLogger("t"), failure="x")

    asyncio.run(scenario())
    assert seen == [1, None, 3]
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    # Not 0.3 + 0.4 after the slow rounds.
    assert all(0.38 < gap < 0.6 for gap in gaps), gaps


def test_a_thread_loop_runs_until_its_stop_event(caplog: pytest.LogCaptureFixture) -> None:
    """The threads' loop (the download poller, the CRD check): the first round after
    `first_wait`, a failure logged as in a task, and `stop` ends it within a wait."""
    rounds: list[float] = []
    stop = threading.Event()
    started = time.monotonic()

    def check() -> None:
        rounds.append(time.monotonic() - started)
        if len(rounds) == 1:
            raise ApiDownError("connection refused")

    thread = threading.Thread(
        target=run_in_thread,
        args=(0.01, check, stop),
        kwargs={
            "log": logging.getLogger("llmop.test"),
            "failure": "polling failed",
            "expected": (ApiDownError,),
            "first_wait": 0.1,
        },
    )
    with caplog.at_level(logging.WARNING, logger="llmop.test"):
        thread.start()
        deadline = time.monotonic() + 5
        while len(rounds) < 3 and time.monotonic() < deadline:
            time.sleep(0.005)
        stop.set()
        thread.join(1)
    assert not thread.is_alive()
    assert len(rounds) >= 3
    assert rounds[0] >= 0.1
    assert [r.getMessage() for r in caplog.records] == ["polling failed: connection refused"]
    count = len(rounds)
    time.sleep(0.05)
    assert len(rounds) == count, "no round after the stop"
