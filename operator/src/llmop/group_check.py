"""Orchestration: read the LeaderWorkerSets back, and bring in the multi-node parents that
waited for the LeaderWorkerSet API.

The operator does not watch LeaderWorkerSets (`llmop.reconcile.groups` says why), so one asyncio
task (started by the handlers) does, every `CHECK_SECONDS`, only while some parent is multi-node,
still has a LeaderWorkerSet, or waits for the API:

- while the API is not known to be served, it asks discovery; once it is, the parents stalled
  with `LeaderWorkerSetMissing` are reconciled (no operator restart needed);
- it lists our LeaderWorkerSets (one label-filtered request) into `Context.groups`; a parent
  whose groups changed gets its status derived again (Ready follows the groups), or, when its
  spec no longer wants a LeaderWorkerSet, a parent pass that deletes it.
"""

from __future__ import annotations

import logging

from llmop.hub import HubUnavailableError
from llmop.kube import KubeError
from llmop.periodic import run_every
from llmop.reconcile import Context, reconcile_parent, refresh_status
from llmop.reconcile import groups as lws
from llmop.reconcile.caches import cached_parent

log = logging.getLogger("llmop.group_check")

CHECK_SECONDS = 2.0
"""Between two listings: how long a group's readiness may wait to reach the parent's status."""


def _wanted(ctx: Context) -> bool:
    """Some parent is multi-node, or a LeaderWorkerSet was listed last time, or this is the
    first round (a LeaderWorkerSet left behind while no operator ran is then known before the
    parents' resume passes, which delete it)."""
    if ctx.groups or lws.KIND not in ctx.served:
        return True
    return any(lws.multi_node(p) for ps in list(ctx.parents.values()) for p in list(ps))


def check(ctx: Context) -> int:
    """One round; how many parents it reconciled or refreshed."""
    waiting = lws.waiting(ctx)
    if not waiting and not _wanted(ctx):
        return 0
    if ctx.served.get(lws.KIND) is not True:
        if not ctx.kube.serves(lws.KIND.api_version, lws.KIND.plural):
            ctx.served[lws.KIND] = False
            ctx.groups = {}
            return 0
        log.info("the cluster serves %s LeaderWorkerSets", lws.KIND.group)
        ctx.served[lws.KIND] = True
    changed = lws.relist(ctx)
    ran = 0
    for namespace, name in sorted(set(waiting) | set(changed)):
        body = cached_parent(ctx, namespace, name)
        if body is None:
            continue
        try:
            if (namespace, name) in waiting or (
                not lws.multi_node(body) and ctx.groups.get((namespace, name))
            ):
                reconcile_parent(ctx, body)
            else:
                refresh_status(ctx, namespace, name)
            ran += 1
        except (KubeError, HubUnavailableError) as error:
            log.warning("could not act on the groups of %s/%s: %s", namespace, name, error)
    return ran


async def run(ctx: Context, *, interval: float = CHECK_SECONDS) -> None:
    """Check every `interval` seconds until cancelled."""
    await run_every(
        interval,
        lambda: check(ctx),
        log=log,
        failure="reading the LeaderWorkerSets back failed",
        expected=(KubeError,),
    )
