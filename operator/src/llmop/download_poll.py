"""Orchestration: read running model downloads' progress into their status.

A download Job emits no event while bytes flow, so one thread (a row of `llmop.runnables`)
runs `reconcile.check(ctx, "downloads")` every `POLL_SECONDS`: a parent pass on the queue for
each parent whose download runs (progress, rate, ETA). A plain thread, not a kopf timer: kopf
timers on a resource add a finalizer to it.
"""

from __future__ import annotations

import logging
import threading

from llmop.periodic import run_in_thread
from llmop.reconcile import Context, check

log = logging.getLogger("llmop.main")

POLL_SECONDS = 5.0
"""How often a running model download's progress is read into the status."""


def run(ctx: Context, stop: threading.Event, *, interval: float = POLL_SECONDS) -> None:
    """Poll every `interval` seconds, the first time after one interval, until `stop` is set.
    A failed poll is logged with its traceback (a poller that died would freeze every progress
    bar)."""
    run_in_thread(
        interval,
        lambda: check(ctx, "downloads"),
        stop,
        log=log,
        failure="download progress poll failed",
        first_wait=interval,
    )
