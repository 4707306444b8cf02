"""Orchestration: look at the installed router now and then, and re-derive the routed
LLMDeployments' status when its readiness changes (`Degraded` reason `RouterUnavailable`).

One asyncio task (started by the handlers when the chart names a router, `LLMOP_ROUTER`) reads
the router's Deployment every `CHECK_SECONDS` (a GET: the operator watches no Deployment outside
its engines, and may read them all). Its pods come and go without any LLMDeployment event, so
this is what brings their status up to date: a status pass of every parent on the queue, each
of which reads `Context.router`.
"""

from __future__ import annotations

import asyncio
import logging

from llmop import kinds
from llmop.kube import KubeError
from llmop.periodic import run_rounds
from llmop.reconcile import Context, Hint, enqueue
from llmop.router_view import RouterView, deployment_ready

log = logging.getLogger("llmop.router_check")

CHECK_SECONDS = 5.0
"""Between two reads of the router's Deployment."""


def check(ctx: Context) -> bool:
    """Read the router's readiness into `ctx.router`; True when it changed."""
    view = ctx.router
    if view is None:
        return False
    ready: bool | None
    try:
        deployment = ctx.kube.read(
            kinds.DEPLOYMENT.api_version, kinds.DEPLOYMENT.kind, view.ref.namespace, view.ref.name
        )
        ready = deployment_ready(deployment)
    except KubeError as error:
        if view.ready is not None:
            log.warning("could not read the router Deployment %s: %s", view.ref, error)
        ready = None
    if ready == view.ready:
        return False
    ctx.router = RouterView(view.ref, ready)
    if ready is False:
        log.warning("the router %s has no ready pod: routed models are Degraded", view.ref)
    elif ready:
        log.info("the router %s is ready", view.ref)
    return True


def refresh_all(ctx: Context, keys: list[tuple[str, str]]) -> int:
    """A status pass of every parent on the queue (the status is written only where it
    changed: the routed ones); how many."""
    for key in keys:
        enqueue(ctx, key, Hint.FLEET)
    return len(keys)


async def run(ctx: Context, *, interval: float = CHECK_SECONDS) -> None:
    """Check the router every `interval` seconds until cancelled."""

    async def round() -> None:
        if await asyncio.to_thread(check, ctx):
            # The watch cache is read here, on the event loop that updates it.
            keys = [key for key, cached in list(ctx.parents.items()) if list(cached or ())]
            await asyncio.to_thread(refresh_all, ctx, keys)

    await run_rounds(round, every=interval, log=log, failure="checking the router failed")
