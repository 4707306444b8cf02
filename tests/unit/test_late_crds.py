"""`llmop.late_crds` against the installed kopf: a watched kind that kopf's own discovery missed
(its CRD's last event came before API discovery listed it) is rescanned into kopf's `Insights`
once the cluster serves it, exactly as a CRD event would have; nothing is asked while every kind
is served. Discovery is a fake here; tests/integration/test_operator_without_crd.py runs the
real operator on a real API server under load."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Collection
from types import SimpleNamespace
from typing import Any

import kopf
import pytest
from kopf._cogs.structs.references import Insights

from llmop import kinds, late_crds, main
from llmop.config import OperatorConfig
from llmop.kube import Kube
from llmop.metrics import Metrics

LLMD = kinds.LLMDEPLOYMENT


def _resource(kind: kinds.Kind) -> kopf.Resource:
    group, _, version = kind.api_version.rpartition("/")
    return kopf.Resource(
        group,
        version,
        kind.plural,
        kind=kind.kind,
        namespaced=True,
        preferred=True,
        verbs=frozenset({"list", "watch", "patch", "get"}),
    )


def _registry() -> kopf.OperatorRegistry:
    """A registry watching LLMDeployments, as the handlers' does."""
    registry = kopf.OperatorRegistry()

    @kopf.on.event(LLMD.group, LLMD.plural, registry=registry)
    def on_event(**_: Any) -> None:
        return None

    return registry


class Discovery:
    """A fake API discovery: what `served` says, and what kopf's scanner finds."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.served: set[str] = set()
        self.listed: set[str] = set()
        """Kinds `/apis` lists (it may lag `served`: the aggregator's registration)."""
        self.asked: list[str] = []
        self.scanned: list[Collection[str] | None] = []

        async def scan_resources(**kwargs: Any) -> set[kopf.Resource]:
            self.scanned.append(kwargs.get("groups"))
            return {_resource(k) for k in (LLMD,) if k.plural in self.listed}

        monkeypatch.setattr(late_crds.scanning, "scan_resources", scan_resources)

    def serves(self, kind: kinds.Kind) -> bool:
        self.asked.append(kind.plural)
        return kind.plural in self.served


def _check(insights: Insights, discovery: Discovery, registry: kopf.OperatorRegistry) -> Any:
    return late_crds.check(insights, kopf.OperatorSettings(), registry, discovery.serves, [LLMD])


def test_a_kind_kopf_missed_is_served_once_discovery_lists_it(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    discovery = Discovery(monkeypatch)
    registry = _registry()

    async def scenario() -> None:
        insights = Insights()
        assert late_crds.missing(insights, [LLMD]) == [LLMD]

        # No CRD: one discovery read per round, no kopf scan (kopf would warn each time).
        assert await _check(insights, discovery, registry) == []
        assert (discovery.asked, discovery.scanned) == (["llmdeployments"], [])

        # The group version serves it, `/apis` does not list it yet: scanned, nothing changes.
        discovery.served.add(LLMD.plural)
        assert await _check(insights, discovery, registry) == []
        assert discovery.scanned == [{LLMD.group}]
        assert late_crds.missing(insights, [LLMD]) == [LLMD]

        # Listed: kopf's insights now hold it, and its watchers are told.
        discovery.listed.add(LLMD.plural)
        told = asyncio.Event()

        async def watch_revisions() -> None:
            async with insights.revised:
                await insights.revised.wait()
                told.set()

        waiter = asyncio.create_task(watch_revisions())
        await asyncio.sleep(0)
        with caplog.at_level(logging.INFO, logger="llmop.late_crds"):
            assert await _check(insights, discovery, registry) == []
        await asyncio.wait_for(told.wait(), timeout=1)
        await waiter
        assert late_crds.missing(insights, [LLMD]) == []
        served = {(r.group, r.plural) for r in insights.watched_resources}
        assert (LLMD.group, LLMD.plural) in served
        assert "watching them now" in caplog.text

        # Served: no more requests of any kind.
        asked, scanned = len(discovery.asked), len(discovery.scanned)
        assert await _check(insights, discovery, registry) == []
        assert (len(discovery.asked), len(discovery.scanned)) == (asked, scanned)

    asyncio.run(scenario())


def test_a_kind_kopf_found_by_itself_meanwhile_is_left_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kopf's own CRD event can win the race: the rescan then revises nothing."""
    discovery = Discovery(monkeypatch)
    discovery.served.add(LLMD.plural)
    discovery.listed.add(LLMD.plural)
    registry = _registry()

    async def scenario() -> None:
        insights = Insights()
        real_scan = late_crds.scanning.scan_resources

        async def scan_while_kopf_finds_it(**kwargs: Any) -> Any:
            insights.watched_resources.add(_resource(LLMD))
            return await real_scan(**kwargs)

        monkeypatch.setattr(late_crds.scanning, "scan_resources", scan_while_kopf_finds_it)
        revise = []
        monkeypatch.setattr(
            late_crds.observation, "revise_resources", lambda **kw: revise.append(kw)
        )
        assert await _check(insights, discovery, registry) == []
        assert revise == []

    asyncio.run(scenario())


def test_run_waits_for_kopfs_first_discovery_and_survives_failures(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    registry = _registry()
    calls: list[str] = []

    def failing(kind: kinds.Kind) -> bool:
        calls.append(kind.plural)
        raise OSError("connection refused")

    async def scenario() -> None:
        insights = Insights()
        task = asyncio.create_task(
            late_crds.run(
                insights, kopf.OperatorSettings(), registry, failing, wanted=[LLMD], interval=0.01
            )
        )
        await asyncio.sleep(0.05)
        assert calls == [], "nothing before kopf's own first scan"
        insights.ready_resources.set()
        with caplog.at_level(logging.WARNING, logger="llmop.late_crds"):
            await asyncio.sleep(0.1)
        assert len(calls) > 3, "it keeps trying"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    failures = [r for r in caplog.records if "late CRD failed" in r.getMessage()]
    assert len(failures) == 1, "said once per streak of failures"


def test_the_wanted_kinds_are_the_watched_ones_outside_the_core_group() -> None:
    assert LLMD in late_crds.WANTED
    assert all(kind.group for kind in late_crds.WANTED)
    watched = {(h.selector.group, h.selector.any_name) for h in _watching_handlers()}
    assert {(k.group, k.plural) for k in late_crds.WANTED} == {g for g in watched if g[0]}


def _watching_handlers() -> list[Any]:
    registry = kopf.get_default_registry()
    return [
        *registry._watching.get_all_handlers(),
        *registry._indexing.get_all_handlers(),
        *registry._changing.get_all_handlers(),
    ]


def test_main_hands_kopf_the_insights_the_check_uses(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each leadership term makes new `Insights`, hands them to kopf and gives the same ones,
    with its settings and kopf's registry, to the late-CRD row of `llmop.runnables`."""
    monkeypatch.setattr(Kube, "connect", staticmethod(lambda **_: SimpleNamespace()))
    config = OperatorConfig()
    terms = [
        main._Term(config, Metrics(), main._memo(config, Metrics()), None, threading.Event())
        for _ in range(2)
    ]
    for term in terms:
        assert isinstance(term.insights, Insights)
        assert term.runnables.kopf == late_crds.KopfRun(
            term.insights, term.settings, kopf.get_default_registry()
        )
    assert terms[0].insights is not terms[1].insights, "one per kopf.operator run"
