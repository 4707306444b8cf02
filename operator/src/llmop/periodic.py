"""The loop under the operator's background checks (the Hub, InferencePool and LeaderWorkerSet
read-backs): a blocking check run in a worker thread every few seconds until cancelled. A failed
round is logged and the next one runs on time, so a check never dies of one bad answer."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable


async def run_every(
    interval: float,
    check: Callable[[], object],
    *,
    log: logging.Logger,
    failure: str,
    expected: tuple[type[Exception], ...] = (),
) -> None:
    """Run `check` now and then every `interval` seconds until cancelled. A failure is logged
    as `failure`: an `expected` one (an API error, say) as a warning with its message, anything
    else with its traceback."""
    while True:
        try:
            await asyncio.to_thread(check)
        except asyncio.CancelledError:
            raise
        except expected as error:
            log.warning("%s: %s", failure, error)
        except Exception:
            log.exception("%s", failure)
        await asyncio.sleep(interval)
