"""Orchestration: ask the Hub again about adapters it could not answer for.

The parent path's adapter pre-flight (`llmop.reconcile.adapter_gate`) stops at the first
unreachable Hub answer and leaves those adapters unjudged: the pods get them as declared, with
no pinned commit and no refusal. A parent pass would ask again, but nothing else may cause one
(no spec change, no child event). So one asyncio task (a row of `llmop.runnables`) puts the
parent pass on the queue again for each LLMDeployment whose Hub answer has been missing for
`adapter_gate.UNREACHABLE_RETRY` (30 s), checking every `CHECK_SECONDS`. With no such parent it
sends nothing.
"""

from __future__ import annotations

import logging

from llmop.periodic import run_every
from llmop.reconcile import Context
from llmop.reconcile import check as reconcile_check

log = logging.getLogger("llmop.hub_check")

CHECK_SECONDS = 10.0
"""Between two looks for parents whose adapters wait for the Hub."""


def check(ctx: Context) -> int:
    """Put the parent pass of each parent due for a Hub retry on the queue; how many."""
    return reconcile_check(ctx, "hub")


async def run(ctx: Context, *, interval: float = CHECK_SECONDS) -> None:
    """Check every `interval` seconds until cancelled."""
    await run_every(
        interval,
        lambda: check(ctx),
        log=log,
        failure="re-checking adapters at the Hub failed",
    )
