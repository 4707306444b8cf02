"""status.adapters, the Adapters printer summary, the AdaptersReady condition and the adapter
Events, from the agents' reports (tables of pod reports → what the user reads)."""

from __future__ import annotations

from typing import Any

import pytest

from llmop import adapter_status, agents, events
from llmop.adapter_status import PodReport
from llmop.agents import PodAdapter
from llmop.api.v1alpha1 import AdapterStatus, LLMDeploymentSpec
from llmop.render.adapters import Refusal

SQL = {"name": "sql", "source": "hf://acme/sql", "revision": "a" * 40}
CHAT = {"name": "chat", "source": "hf://acme/chat"}
RANK_ERROR = (
    "Call to add_lora method failed: Worker failed with error 'LoRA rank 64 is greater than "
    "max_lora_rank 16.', please check the stack trace above for the root cause"
)


def spec(**fields: Any) -> LLMDeploymentSpec:
    return LLMDeploymentSpec.model_validate(
        {"model": {"name": "acme/base"}, "adapters": [SQL, CHAT], **fields}
    )


def report(pod: str, **phases: str) -> PodReport:
    return PodReport(pod, tuple(PodAdapter(name, phase) for name, phase in phases.items()))


def statuses(
    reports: list[PodReport], ready: set[str], refused: dict[str, Refusal] | None = None, **kw: Any
) -> dict[str, AdapterStatus]:
    out = adapter_status.adapter_statuses(spec(**kw), refused or {}, reports, ready)
    assert out is not None
    return {s.name: s for s in out}


def test_no_adapters_no_status_and_no_condition() -> None:
    plain = LLMDeploymentSpec.model_validate({"model": {"name": "acme/base"}})
    assert adapter_status.adapter_statuses(plain, {}, [], {"p"}) is None
    assert adapter_status.summary(None) is None
    assert adapter_status.adapters_ready(None) is None


def test_every_ready_replica_serving_is_ready() -> None:
    got = statuses(
        [report("a", sql="Loaded", chat="Loaded"), report("b", sql="Loaded", chat="Loaded")],
        {"a", "b"},
    )
    assert [(s.phase, s.ready_replicas, s.replicas) for s in got.values()] == [
        ("Ready", 2, 2),
        ("Ready", 2, 2),
    ]
    assert got["sql"].revision == "a" * 40
    assert adapter_status.summary(list(got.values())) == "2/2"
    condition = adapter_status.adapters_ready(list(got.values()))
    assert condition is not None
    assert condition.status == "True"


def test_a_replica_still_loading_keeps_it_loading_and_a_not_ready_pod_does_not_count() -> None:
    got = statuses(
        [
            report("a", sql="Loaded", chat="Loaded"),
            report("b", sql="Loading", chat="Loaded"),
            report("c", sql="Pending", chat="Pending"),  # starting: not ready yet
        ],
        {"a", "b"},
    )
    assert got["sql"].phase == "Loading"
    assert got["sql"].message is not None
    assert got["sql"].message.startswith("1/2")
    assert got["chat"].phase == "Ready"
    assert adapter_status.summary(list(got.values())) == "1/2"
    condition = adapter_status.adapters_ready(list(got.values()))
    assert condition is not None
    assert (condition.status, condition.reason) == ("False", "AdaptersLoading")
    assert "sql" in condition.message


def test_rank_above_the_cap_fails_that_adapter_with_the_field_to_raise() -> None:
    failing = PodReport(
        "a", (PodAdapter("sql", "Failed", RANK_ERROR), PodAdapter("chat", "Loaded"))
    )
    got = statuses([failing], {"a"}, engine={"lora": {"maxLoraRank": 16}})
    sql = got["sql"]
    assert sql.phase == "Failed"
    assert sql.message is not None
    assert sql.message.startswith("AdapterRankTooHigh: ")
    assert "spec.engine.lora.maxLoraRank (16)" in sql.message
    assert "raise spec.engine.lora.maxLoraRank to 64" in sql.message
    assert "(pod a)" in sql.message
    assert got["chat"].phase == "Ready"  # the others keep serving
    condition = adapter_status.adapters_ready(list(got.values()))
    assert condition is not None
    assert (condition.status, condition.reason) == ("False", "AdapterRankTooHigh")


def test_failed_on_one_replica_and_served_by_another_is_degraded() -> None:
    got = statuses(
        [
            report("a", sql="Loaded", chat="Loaded"),
            PodReport("b", (PodAdapter("sql", "Failed", "No adapter found for <path>"),)),
        ],
        {"a", "b"},
    )
    assert got["sql"].phase == "Degraded"
    assert got["sql"].message is not None
    assert got["sql"].message.startswith("AdapterNotFound")


def test_an_operator_refusal_is_failed_whatever_the_pods_say() -> None:
    refused = {"chat": Refusal("AdapterClaimNotMounted", "claim 'x' is not mounted")}
    got = statuses([report("a", sql="Loaded")], {"a"}, refused)
    assert got["chat"].phase == "Failed"
    assert got["chat"].message == "AdapterClaimNotMounted: claim 'x' is not mounted"


def test_no_reports_yet_is_pending() -> None:
    got = statuses([], set())
    assert {s.phase for s in got.values()} == {"Pending"}
    assert got["sql"].message == "waiting for a ready replica"


def test_rank_is_taken_from_any_pod_that_read_it() -> None:
    reports = [PodReport("a", (PodAdapter("sql", "Loaded", rank=8),))]
    assert statuses(reports, {"a"})["sql"].rank == 8


def test_agent_status_payload_parses_adapters_and_skips_junk() -> None:
    payload = {
        "phase": "Ready",
        "ready": True,
        "adapters": [
            {"name": "sql", "phase": "Loaded", "message": None, "revision": "abc", "rank": 8},
            {"phase": "Loaded"},  # no name
            "junk",
            {"name": "chat", "phase": "Failed", "message": "boom", "rank": True},
        ],
    }
    reading = agents.parse_status("p", payload)
    assert reading.adapters == (
        PodAdapter("sql", "Loaded", None, "abc", 8),
        PodAdapter("chat", "Failed", "boom", None, None),
    )
    assert agents.parse_status("p", {"phase": "Ready"}).adapters is None


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        (None, ["Pending"], [("Normal", "AdapterPending")]),
        (["Pending"], ["Pending"], []),
        (["Loading"], ["Ready"], [("Normal", "AdapterReady")]),
        (["Ready"], ["Failed"], [("Warning", "AdapterFailed")]),
        (["Ready"], ["Degraded"], [("Warning", "AdapterDegraded")]),
        (["Ready"], None, []),
    ],
)
def test_one_event_per_adapter_phase_change(
    before: list[str] | None, after: list[str] | None, expected: list[tuple[str, str]]
) -> None:
    def entries(phases: list[str] | None) -> list[AdapterStatus] | None:
        if phases is None:
            return None
        return [AdapterStatus(name="sql", phase=p) for p in phases]  # type: ignore[arg-type]

    got = events.adapter_events(entries(before), entries(after))
    assert [(e.type, e.reason) for e in got] == expected
    assert all("Adapter sql" in e.message for e in got)


def revisioned(pod: str, revision: str | None, **phases: str) -> PodReport:
    return PodReport(
        pod, tuple(PodAdapter(name, phase, revision=revision) for name, phase in phases.items())
    )


def test_an_adapter_is_settled_for_the_router_only_at_one_revision_on_every_ready_replica() -> None:
    """`status.routing.adapterRevisions`: what a stream of an adapter is pinned to. A new
    revision asked for (the status' revision changes in the pass that writes the pods'
    ConfigMap) is not settled while any ready replica still reports the old one loaded, nor
    while one is loading it; `chat` (no revision: files without one) settles on its files."""
    a, b = "a" * 40, "b" * 40
    ready = {"p", "q"}

    def routing(reports: list[PodReport], **kw: Any) -> dict[str, tuple[str | None, bool]]:
        listed = list(statuses(reports, ready, **kw).values())
        out = adapter_status.routing_revisions(listed, reports, ready)
        assert out is not None
        return {r.name: (r.revision, r.settled) for r in out}

    both = [
        PodReport(pod, (PodAdapter("sql", "Loaded", revision=a), PodAdapter("chat", "Loaded")))
        for pod in "pq"
    ]
    assert routing(both) == {"sql": (a, True), "chat": (None, True)}
    replaced = dict(SQL, revision=b)
    asked = routing(both, adapters=[replaced, CHAT])
    assert asked["sql"] == (b, False)  # every replica still serves `a`
    half = [revisioned("p", b, sql="Loaded"), revisioned("q", b, sql="Loading")]
    assert routing(half, adapters=[replaced, CHAT])["sql"] == (b, False)
    done = [revisioned(pod, b, sql="Loaded") for pod in "pq"]
    assert routing(done, adapters=[replaced, CHAT])["sql"] == (b, True)
    # A replica that is not ready does not count either way.
    stale = [*done, revisioned("r", a, sql="Loaded")]
    assert routing(stale, adapters=[replaced, CHAT])["sql"] == (b, True)
    assert adapter_status.routing_revisions(None, [], ready) is None
