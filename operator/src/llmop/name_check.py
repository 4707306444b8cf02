"""Orchestration: decide who owns each model name served through the router, keep the record in
the `llmop-served-names` ConfigMap (in the operator's own namespace), and re-derive the status
of the CRs whose verdict changed (`status.routing.servedNames`, `Degraded` reasons
`ModelNameConflict`/`NamespaceNotServed`).

One asyncio task per leadership term (with a router installed) runs `llmop.name_owners.decide`
every `CHECK_SECONDS` over the LLMDeployments' watch cache. The record is read once per term
(so a newly elected leader keeps the reservations of the last one) and written only when it
changes; a failed write is retried the next round while the verdicts already hold, since the
decision is the same on any replica that sees the same CRs and record.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from llmop import name_owners, names
from llmop.kube import KubeError
from llmop.name_owners import Owner
from llmop.periodic import run_rounds
from llmop.reconcile import Context
from llmop.router_check import refresh_all
from llmop_router import contract as router_contract

log = logging.getLogger("llmop.name_check")

CHECK_SECONDS = 2.0
"""Between two decisions: how soon a new conflict, or a recreated owner, shows in status."""
EXTERNALS_SECONDS = 10.0
"""Between two lists of the router's LLMExternalModels, made only while some CR's fallback
names one: how soon a created (or deleted) external model shows in the CRs' status."""


@dataclass
class Keeper:
    """One term's view of the record: as last read or written (None: not read yet)."""

    stored: dict[str, Owner] | None = None
    written: dict[str, Owner] = field(default_factory=dict)
    externals: frozenset[str] | None = None
    """The LLMExternalModels in the router's namespace as last listed (None: not known)."""
    externals_listed: float | None = None
    """When they were last listed (monotonic seconds)."""
    externals_problem: str | None = None


def read_externals(
    ctx: Context, keeper: Keeper, namespace: str, claimants: Iterable[name_owners.Claimant]
) -> frozenset[str] | None:
    """The names of the LLMExternalModels in the router's `namespace`, listed at most every
    `EXTERNALS_SECONDS` and only while a CR's fallback names one; None when they cannot be
    listed (external fallbacks are then not judged)."""
    if not any(c.external_fallbacks for c in claimants):
        keeper.externals, keeper.externals_listed = None, None
        return None
    now = time.monotonic()
    if keeper.externals_listed is not None and now - keeper.externals_listed < EXTERNALS_SECONDS:
        return keeper.externals
    keeper.externals_listed = now
    try:
        # A CRD not installed lists as empty: then no external model exists.
        items = ctx.kube.list(
            router_contract.API_VERSION, router_contract.EXTERNAL_MODEL_KIND, namespace
        )
    except KubeError as error:
        if keeper.externals_problem != str(error):
            log.warning(
                "cannot list the LLMExternalModels in %s, so fallbacks to them are not checked: %s",
                namespace,
                error,
            )
        keeper.externals_problem, keeper.externals = str(error), None
        return None
    keeper.externals_problem = None
    keeper.externals = frozenset(
        str(item["metadata"]["name"]) for item in items if (item.get("metadata") or {}).get("name")
    )
    return keeper.externals


def read_record(ctx: Context, namespace: str) -> dict[str, Owner]:
    """The record as the ConfigMap holds it (empty when there is none yet)."""
    found = ctx.kube.read("v1", "ConfigMap", namespace, name_owners.CONFIG_MAP_NAME)
    return name_owners.decode(((found or {}).get("data") or {}).get(name_owners.DATA_KEY))


def check(
    ctx: Context, keeper: Keeper, parents: Iterable[Mapping[str, Any]]
) -> list[tuple[str, str]]:
    """One decision over `parents`; returns the keys of the parents whose verdict changed."""
    router = ctx.router
    if router is None:
        return []
    # The operator's own namespace, where its Lease is (and its RBAC to keep the record and to
    # list the LLMExternalModels); the chart installs the router, and so its external models,
    # there too.
    namespace = ctx.config.own_namespace or router.ref.namespace
    bodies = list(parents)
    if keeper.stored is None:
        keeper.written = read_record(ctx, namespace)
        keeper.stored = name_owners.seeded(keeper.written, bodies)
    present = [
        (str(b["metadata"]["namespace"]), str(b["metadata"]["name"]))
        for b in bodies
        if (b.get("metadata") or {}).get("name")
    ]
    claimants = [c for c in map(name_owners.claimant_of, bodies) if c is not None]
    decision = name_owners.decide(
        claimants,
        keeper.stored,
        present=present,
        now=ctx.clock(),
        grace=timedelta(seconds=ctx.config.name_grace_seconds),
        serving_namespaces=ctx.config.serving_namespaces,
        externals=read_externals(ctx, keeper, namespace, claimants),
    )
    keeper.stored = decision.record
    if decision.record != keeper.written:
        try:
            ctx.kube.apply(
                name_owners.config_map(namespace, decision.record),
                field_manager=names.RECORDS_FIELD_MANAGER,
                want_result=False,
            )
            keeper.written = dict(decision.record)
        except KubeError as error:
            log.warning(
                "could not write the model name owners (ConfigMap %s/%s), retrying: %s",
                namespace,
                name_owners.CONFIG_MAP_NAME,
                error,
            )
    before = ctx.names or {}
    changed = [
        k for k in set(before) | set(decision.verdicts) if before.get(k) != decision.verdicts.get(k)
    ]
    ctx.names = decision.verdicts
    for key in sorted(changed):
        verdict = decision.verdicts.get(key)
        if verdict is not None and verdict.lost:
            lost = ", ".join(f"{n!r} (owner {o})" for n, o in verdict.lost)
            log.warning("%s/%s is refused model names another CR owns: %s", *key, lost)
    return sorted(k for k in changed if k in set(present))


async def run(ctx: Context, *, interval: float = CHECK_SECONDS) -> None:
    """Decide every `interval` seconds until cancelled."""
    keeper = Keeper()

    async def round() -> None:
        # The watch cache is read here, on the event loop that updates it.
        parents = [body for cached in list(ctx.parents.values()) for body in list(cached or ())]
        changed = await asyncio.to_thread(check, ctx, keeper, parents)
        if changed:
            await asyncio.to_thread(refresh_all, ctx, changed)

    await run_rounds(
        round, every=interval, log=log, failure="deciding the model name owners failed"
    )
