"""Orchestration: once the Gateway API Inference Extension CRDs arrive, create the
InferencePools that waited for them.

A parent pass that wants a pool on a cluster without the InferencePool API leaves the CR
`Degraded` (reason `InferencePoolUnavailable`) and nothing else happens to it until its spec
changes. So while such parents exist, one asyncio task (a row of `llmop.runnables`) asks
discovery every `CHECK_SECONDS` whether the API is served now, and once it is puts those
parents' passes on the queue.
With no parent waiting it sends nothing.
"""

from __future__ import annotations

import logging

from llmop.periodic import run_every
from llmop.reconcile import Context
from llmop.reconcile import check as reconcile_check

log = logging.getLogger("llmop.pool_check")

CHECK_SECONDS = 5.0
"""Between two discovery reads while a parent waits for the InferencePool API."""


def check(ctx: Context) -> int:
    """Put the passes of the parents whose pool waited on the queue, if the API is served now;
    how many."""
    return reconcile_check(ctx, "pools")


async def run(ctx: Context, *, interval: float = CHECK_SECONDS) -> None:
    """Check every `interval` seconds until cancelled."""
    await run_every(
        interval,
        lambda: check(ctx),
        log=log,
        failure="checking for the InferencePool API failed",
    )
