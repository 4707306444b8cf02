"""The background checks' loop: every round runs, a failed one is logged and not fatal."""

from __future__ import annotations

import asyncio
import logging

import pytest

from llmop.periodic import run_every


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
