"""The loop under every background loop of the operator (`llmop.runnables` lists them): a round
run every few seconds, as a task on kopf's event loop until cancelled (`run_rounds`,
`run_every`) or in a thread of its own until its stop event is set (`run_in_thread`).

A failed round is logged and the next one runs on time, so a loop never dies of one bad answer:
an `expected` failure (an API error, say) as a warning with its message, anything else with its
traceback. A round that returns `DONE` ends its loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

T = TypeVar("T")


class _Done:
    def __repr__(self) -> str:
        return "DONE"


DONE: Final = _Done()
"""What a round returns to end its loop (nothing left to wait for)."""


def _failed(
    log: logging.Logger, failure: str, expected: tuple[type[Exception], ...], error: Exception
) -> None:
    if isinstance(error, expected):
        log.warning("%s: %s", failure, error)
    else:
        log.error("%s", failure, exc_info=error)


async def run_rounds(
    round: Callable[[], Awaitable[T]],
    *,
    every: float | Callable[[T | None], float],
    log: logging.Logger,
    failure: str,
    expected: tuple[type[Exception], ...] = (),
    first_wait: float = 0.0,
    repeat_failures: bool = True,
) -> None:
    """Await `round()` after `first_wait` seconds and then again and again until cancelled.

    `every`: a number is the pause after each round ends; a function is the period from one
    round's start to the next, given the round's result (None when it failed), so a slow round
    shortens the pause after it. A failure is logged as `failure`; with `repeat_failures`
    False only the first of a streak of failed rounds is."""
    loop = asyncio.get_running_loop()
    failing = False
    if first_wait:
        await asyncio.sleep(first_wait)
    while True:
        started = loop.time()
        result: T | None = None
        try:
            result = await round()
            failing = False
        except asyncio.CancelledError:
            raise
        except Exception as error:
            if repeat_failures or not failing:
                _failed(log, failure, expected, error)
            failing = True
        if result is DONE:
            return
        if callable(every):
            await asyncio.sleep(max(0.0, every(result) - (loop.time() - started)))
        else:
            await asyncio.sleep(every)


async def run_every(
    interval: float,
    check: Callable[[], object],
    *,
    log: logging.Logger,
    failure: str,
    expected: tuple[type[Exception], ...] = (),
    first_wait: float = 0.0,
) -> None:
    """Run the blocking `check` in a worker thread after `first_wait` seconds and then every
    `interval` seconds until cancelled (`run_rounds`)."""
    await run_rounds(
        lambda: asyncio.to_thread(check),
        every=interval,
        log=log,
        failure=failure,
        expected=expected,
        first_wait=first_wait,
    )


def run_in_thread(
    interval: float,
    check: Callable[[], object],
    stop: threading.Event,
    *,
    log: logging.Logger,
    failure: str,
    expected: tuple[type[Exception], ...] = (),
    first_wait: float = 0.0,
) -> None:
    """The body of a thread: run `check` after `first_wait` seconds and then every `interval`
    seconds until `stop` is set (checked between rounds, and it cuts a wait short)."""
    if stop.wait(first_wait):
        return
    while True:
        try:
            if check() is DONE:
                return
        except Exception as error:
            _failed(log, failure, expected, error)
        if stop.wait(interval):
            return
