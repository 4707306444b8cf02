"""Orchestration: read the LeaderWorkerSets back, and bring in the multi-node parents that
waited for the LeaderWorkerSet API.

The operator does not watch LeaderWorkerSets (`llmop.reconcile.groups` says why), so one asyncio
task (a row of `llmop.runnables`) does, every `CHECK_SECONDS`, only while some parent is
multi-node, still has a LeaderWorkerSet, or waits for the API (each pass it asks for goes on
the queue):

- while the API is not known to be served, it asks discovery; once it is, the parents stalled
  with `LeaderWorkerSetMissing` are reconciled (no operator restart needed);
- it lists our LeaderWorkerSets (one label-filtered request) into `Context.groups`; a parent
  whose groups changed gets its status derived again (Ready follows the groups), or, when its
  spec no longer wants a LeaderWorkerSet, a parent pass that deletes it.
"""

from __future__ import annotations

import logging

from llmop.kube import KubeError
from llmop.periodic import run_every
from llmop.reconcile import Context
from llmop.reconcile import check as reconcile_check

log = logging.getLogger("llmop.group_check")

CHECK_SECONDS = 2.0
"""Between two listings: how long a group's readiness may wait to reach the parent's status."""


def check(ctx: Context) -> int:
    """One round (`reconcile.groups.due` says what it does); how many passes it queued."""
    return reconcile_check(ctx, "groups")


async def run(ctx: Context, *, interval: float = CHECK_SECONDS) -> None:
    """Check every `interval` seconds until cancelled."""
    await run_every(
        interval,
        lambda: check(ctx),
        log=log,
        failure="reading the LeaderWorkerSets back failed",
        expected=(KubeError,),
    )
