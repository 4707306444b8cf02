"""kopf glue: serve a kind whose CustomResourceDefinition appeared after kopf last looked.

kopf learns which resources the cluster serves from API discovery: once at startup, then again
for a CRD's group on every watch event of that CRD (`kopf._core.reactor.observation`). A new
CRD's last event is the one that marks it Established, but API discovery can list the new group
later than that (the API server updates its discovery documents asynchronously, and lags when
loaded). kopf's scan on that last event then finds nothing, no later event comes, and kopf never
serves the kind until the process restarts: 2 of 6 runs of
tests/integration/test_operator_without_crd.py (the CRD beside a burst of other objects), as a
GitOps sync that applies the chart and the CRD together would. The same happens, always, where
kopf may not watch CRDs at all (RBAC).

So, while a kind the handlers watch is missing from what kopf serves, one task asks discovery
every `CHECK_SECONDS` whether the cluster serves it (one small GET of its group version: a 404
while the CRD is absent; nothing at all while every kind is served) and, once it does, has kopf
rescan that group exactly as a CRD event would have. kopf then starts the watch as usual.

kopf has no public API for a rescan: this uses the `Insights` handed to `kopf.operator`, its
scanner and `revise_resources` (kopf is pinned to 1.45; tests/unit/test_late_crds.py runs this
against the installed kopf).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from kopf import OperatorRegistry, OperatorSettings
from kopf._cogs.clients import scanning
from kopf._cogs.structs.references import Insights
from kopf._core.reactor import observation

from llmop import kinds
from llmop.kube import Kube
from llmop.periodic import run_rounds

log = logging.getLogger("llmop.late_crds")

CHECK_SECONDS = 1.0
"""Between two discovery reads while a watched kind is missing: with kopf's watch start, the
longest a kind waits after discovery serves it."""

WANTED: tuple[kinds.Kind, ...] = tuple(
    kind
    for kind in (kinds.LLMDEPLOYMENT, *kinds.WATCHED, *kinds.OBSERVED, kinds.JOB)
    if kind.group  # the core group is always served
)
"""The kinds kopf watches for the handlers (the LLMDeployment's CRD is the one that can be
late; the built-in ones are here for the clusters that drop them from discovery for a while)."""

Served = Callable[[kinds.Kind], bool]
"""Whether the cluster serves a kind now (blocking: run in a thread)."""


def new_insights() -> Insights:
    """What kopf knows of the cluster, shared with this module: one per `kopf.operator` run."""
    return Insights()


def missing(insights: Insights, wanted: Iterable[kinds.Kind]) -> list[kinds.Kind]:
    """The wanted kinds kopf does not watch now."""
    watched = {(r.group, r.plural) for r in insights.watched_resources}
    return [kind for kind in wanted if (kind.group, kind.plural) not in watched]


async def rescan(
    kind: kinds.Kind,
    insights: Insights,
    settings: OperatorSettings,
    registry: OperatorRegistry,
) -> str:
    """Have kopf read the kind's group from discovery again, as on an event of its CRD.
    Returns "unlisted" when kopf's scan does not find the kind (nothing changes: `/apis` may
    still lag), "watched" when kopf watched it meanwhile by itself, else "revised"."""
    resources = await scanning.scan_resources(groups={kind.group}, settings=settings, logger=log)
    if not any(r.group == kind.group and r.plural == kind.plural for r in resources):
        return "unlisted"
    async with insights.revised:
        if not missing(insights, [kind]):
            return "watched"
        observation.revise_resources(
            resources=resources, insights=insights, registry=registry, group=kind.group
        )
        await insights.backbone.fill(resources=resources)
        insights.revised.notify_all()
    return "revised"


async def check(
    insights: Insights,
    settings: OperatorSettings,
    registry: OperatorRegistry,
    served: Served,
    wanted: Collection[kinds.Kind],
) -> list[kinds.Kind]:
    """One round: rescan each missing kind the cluster serves now. Returns the kinds kopf
    rescanned and still does not watch (kopf refused them itself, and its log says why)."""
    refused = []
    for kind in missing(insights, wanted):
        if not await asyncio.to_thread(served, kind):
            continue
        outcome = await rescan(kind, insights, settings, registry)
        if outcome == "unlisted":
            log.debug("%s serves %s, /apis does not list it yet", kind.api_version, kind.plural)
        elif outcome == "revised" and missing(insights, [kind]):
            refused.append(kind)
        elif outcome == "revised":
            log.info(
                "the cluster serves %s %s: watching them now (API discovery listed them only "
                "after the last event of their CRD)",
                kind.api_version,
                kind.plural,
            )
    return refused


async def run(
    insights: Insights,
    settings: OperatorSettings,
    registry: OperatorRegistry,
    served: Served,
    *,
    wanted: Collection[kinds.Kind] = WANTED,
    interval: float = CHECK_SECONDS,
) -> None:
    """Check every `interval` seconds, from kopf's first discovery on, until cancelled."""
    await insights.ready_resources.wait()
    still_wanted = list(wanted)

    async def round() -> None:
        for kind in await check(insights, settings, registry, served, still_wanted):
            log.warning(
                "kopf does not watch %s %s although the cluster serves them: not rescanned again",
                kind.api_version,
                kind.plural,
            )
            still_wanted.remove(kind)

    # A failure is said once per streak: the next round tries again.
    await run_rounds(
        round,
        every=interval,
        log=log,
        failure="checking API discovery for a late CRD failed",
        expected=(Exception,),
        repeat_failures=False,
    )


@dataclass(frozen=True)
class KopfRun:
    """What the check needs of one `kopf.operator` run: the `Insights` handed to it (one per
    run: `new_insights`), its settings and its registry."""

    insights: Insights
    settings: OperatorSettings
    registry: OperatorRegistry


def serves(kube: Kube) -> Served:
    """`served` by the operator's client (a group version's discovery document)."""
    return lambda kind: kube.serves(kind.api_version, kind.plural)
