"""The model name owner rule (`llmop.name_owners`) and the router's use of its verdict
(`llmop_router.discovery.owners`): deterministic, stable while the owner is recreated within
the grace period, released after it, never taken by a newcomer."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from llmop import conditions, name_check, name_owners
from llmop.api.v1alpha1 import Condition, LLMDeploymentStatus, RoutingStatus
from llmop.config import load
from llmop.kube import KubeError
from llmop.metrics import Metrics
from llmop.name_owners import Claimant, Owner, decide
from llmop.reconcile.context import Context
from llmop.reconcile.writes import _names
from llmop_router.discovery import Catalog, claim_of, owners
from llmop_router.routes import RouteTable

T0 = datetime(2026, 1, 1, tzinfo=UTC)
GRACE = timedelta(minutes=10)

FIRST = Claimant("team-a", "chat", "2026-01-01T00:00:00Z", ("llama",))
SECOND = Claimant("team-b", "chat", "2026-01-01T00:05:00Z", ("llama", "llama-sql"))


def run(
    claimants: list[Claimant], record: dict[str, Owner], now: datetime, **kw: Any
) -> name_owners.Decision:
    return decide(claimants, record, present=[c.key for c in claimants], now=now, grace=GRACE, **kw)


def test_a_free_name_goes_to_the_first_claimant_whatever_the_order() -> None:
    third = Claimant("team-0", "chat", "2026-01-01T00:05:00Z", ("llama",))  # ties: by namespace
    for _ in range(5):
        crs = [FIRST, SECOND, third]
        random.shuffle(crs)
        decision = run(crs, {}, T0)
        assert decision.record["llama"] == Owner("team-a", "chat")
        assert decision.verdicts[FIRST.key].owned == ("llama",)
        assert decision.verdicts[SECOND.key].owned == ("llama-sql",)
        assert decision.verdicts[SECOND.key].lost == (("llama", Owner("team-a", "chat")),)
    assert run([SECOND, third], {}, T0).record["llama"] == Owner("team-0", "chat")


def test_a_newcomer_cannot_take_an_owned_name_even_when_older() -> None:
    record = run([SECOND], {}, T0).record
    assert record["llama"].key == SECOND.key
    decision = run([FIRST, SECOND], record, T0 + timedelta(minutes=1))
    assert decision.record["llama"].key == SECOND.key
    assert decision.verdicts[FIRST.key].lost == (("llama", Owner("team-b", "chat")),)


def test_the_owner_recreated_within_grace_keeps_the_name() -> None:
    record = run([FIRST, SECOND], {}, T0).record
    gone = run([SECOND], record, T0 + timedelta(minutes=1))
    assert gone.record["llama"] == Owner("team-a", "chat", T0 + timedelta(minutes=1))
    assert gone.verdicts[SECOND.key].owned == ("llama-sql",)
    message = name_owners.conflict_message(
        gone.verdicts[SECOND.key].lost, now=T0 + timedelta(minutes=2), grace=GRACE
    )
    assert "reserved to LLMDeployment team-a/chat" in message
    assert "540 s" in message
    # Recreated (a newer creationTimestamp): the same namespace/name takes it back.
    again = Claimant("team-a", "chat", "2026-01-01T00:09:00Z", ("llama",))
    back = run([again, SECOND], gone.record, T0 + timedelta(minutes=9))
    assert back.record["llama"] == Owner("team-a", "chat")
    assert back.verdicts[again.key].owned == ("llama",)
    assert back.verdicts[SECOND.key].lost[0][0] == "llama"


def test_a_name_is_released_after_grace() -> None:
    record = run([FIRST, SECOND], {}, T0).record
    gone = run([SECOND], record, T0)
    still = run([SECOND], gone.record, T0 + GRACE - timedelta(seconds=1))
    assert still.record["llama"].key == FIRST.key
    released = run([SECOND], gone.record, T0 + GRACE)
    assert released.record["llama"] == Owner("team-b", "chat")
    assert released.verdicts[SECOND.key].owned == ("llama", "llama-sql")
    assert released.verdicts[SECOND.key].lost == ()
    # Nobody claims it: the reservation is dropped.
    assert "llama" not in run([], gone.record, T0 + GRACE).record


def test_an_owner_that_renames_lets_the_name_go_at_once() -> None:
    record = run([FIRST, SECOND], {}, T0).record
    renamed = Claimant("team-a", "chat", FIRST.created, ("llama-2",))
    decision = run([renamed, SECOND], record, T0 + timedelta(seconds=5))
    assert decision.record["llama"].key == SECOND.key


def test_namespaces_not_served_claim_nothing() -> None:
    decision = run([FIRST, SECOND], {}, T0, serving_namespaces=["team-b"])
    assert decision.verdicts[FIRST.key] == name_owners.Verdict(namespace_served=False)
    assert decision.verdicts[SECOND.key].owned == ("llama", "llama-sql")
    issue = name_owners.verdict_issue(
        decision.verdicts[FIRST.key], "team-a", allowed=["team-b"], now=T0, grace=GRACE
    )
    assert issue is not None
    assert issue.reason == conditions.REASON_NAMESPACE_NOT_SERVED
    assert "router.servingNamespaces" in issue.message


def test_a_fallback_naming_no_other_routed_model_is_reported_with_the_fix() -> None:
    backup = Claimant("team-c", "backup", "2026-01-01T00:01:00Z", ("qwen",))
    falls_back = Claimant(
        "team-a", "chat", FIRST.created, ("llama",), fallbacks=("qwen", "mistral", "llama")
    )
    decision = run([falls_back, backup], {}, T0)
    verdict = decision.verdicts[falls_back.key]
    assert verdict.unknown_fallbacks == ("mistral", "llama")
    issue = name_owners.verdict_issue(verdict, "team-a", allowed=[], now=T0, grace=GRACE)
    assert issue is not None
    assert issue.reason == conditions.REASON_FALLBACK_NOT_ROUTED
    assert "no LLMDeployment routed through the router serves 'mistral'" in issue.message
    assert "'llama' is this LLMDeployment's own model" in issue.message
    assert issue.message.startswith("spec.router.fallback: ")
    # A fallback whose owner is gone (reserved for its recreation) is not routed meanwhile.
    record = decision.record
    later = run([falls_back], record, T0 + timedelta(seconds=5))
    assert later.verdicts[falls_back.key].unknown_fallbacks == ("qwen", "mistral", "llama")
    # A fallback another routed CR serves is fine.
    fine = Claimant("team-a", "chat", FIRST.created, ("llama",), fallbacks=("qwen",))
    assert run([fine, backup], {}, T0).verdicts[fine.key].unknown_fallbacks == ()
    # Parsed from the CR: `model` entries, and `externalModel` entries apart.
    body = {
        "metadata": {"namespace": "team-a", "name": "chat"},
        "spec": {
            "model": {"name": "x/y", "servedName": "llama"},
            "router": {"fallback": [{"model": "qwen"}, {"externalModel": "managed"}]},
        },
    }
    claimant = name_owners.claimant_of(body)
    assert claimant is not None
    assert claimant.fallbacks == ("qwen",)
    assert claimant.external_fallbacks == ("managed",)


def test_a_fallback_naming_no_llmexternalmodel_is_reported_with_the_fix() -> None:
    backup = Claimant("team-c", "backup", "2026-01-01T00:01:00Z", ("qwen",))
    falls_back = Claimant(
        "team-a",
        "chat",
        FIRST.created,
        ("llama",),
        fallbacks=("qwen",),
        external_fallbacks=("managed", "missing"),
    )
    # Not known (they could not be listed): not judged.
    assert run([falls_back, backup], {}, T0).verdicts[falls_back.key].unknown_externals == ()
    decision = run([falls_back, backup], {}, T0, externals=["managed", "other"])
    verdict = decision.verdicts[falls_back.key]
    assert (verdict.unknown_fallbacks, verdict.unknown_externals) == ((), ("missing",))
    issue = name_owners.verdict_issue(
        verdict, "team-a", allowed=[], now=T0, grace=GRACE, external_namespace="llmop-system"
    )
    assert issue is not None
    assert issue.reason == conditions.REASON_FALLBACK_NOT_ROUTED
    assert issue.message.startswith("spec.router.fallback: no LLMExternalModel 'missing' in ")
    assert "kubectl get llmexternalmodels -n llmop-system" in issue.message
    assert "llmdeployments" not in issue.message  # only the fix that applies
    # Both kinds missing: both named, both fixes.
    both = Claimant(
        "team-a", "chat", FIRST.created, ("llama",), ("mistral",), external_fallbacks=("gone",)
    )
    verdict = run([both], {}, T0, externals=[]).verdicts[both.key]
    issue = name_owners.verdict_issue(verdict, "team-a", allowed=[], now=T0, grace=GRACE)
    assert issue is not None
    assert "'mistral'" in issue.message
    assert "no LLMExternalModel 'gone'" in issue.message
    assert "kubectl get llmdeployments -A" in issue.message
    # All there: fine.
    fine = run([falls_back, backup], {}, T0, externals=["managed", "missing"])
    assert fine.verdicts[falls_back.key] == name_owners.Verdict(("llama",))


def test_the_record_round_trips_and_is_bounded() -> None:
    record = {"org/model": Owner("a", "b", T0), "x": Owner("c", "d")}
    assert name_owners.decode(name_owners.encode(record)) == record
    assert name_owners.decode("not json") == {}
    many = [
        Claimant("ns", f"cr{i}", "2026-01-01T00:00:00Z", (f"m{i}",))
        for i in range(name_owners.MAX_NAMES + 5)
    ]
    assert len(run(many, {}, T0).record) == name_owners.MAX_NAMES
    # A deleted claimant's reservation is forgotten before a present owner's.
    absent = {"old": Owner("gone", "x", T0)}
    kept = run(many[: name_owners.MAX_NAMES], absent, T0 + timedelta(seconds=1)).record
    assert "old" not in kept
    assert len(kept) == name_owners.MAX_NAMES


def cr(namespace: str, created: str, owned: list[str] | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {"namespace": namespace, "name": "chat", "creationTimestamp": created},
        "spec": {"model": {"servedName": "llama"}},
    }
    if owned is not None:
        body["status"] = {"routing": {"servedNames": owned}}
    return body


def test_the_router_follows_the_status_and_falls_back_only_without_one() -> None:
    old, new = "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"

    def owner(*bodies: dict[str, Any]) -> str | None:
        claims = [c for c in map(claim_of, bodies) if c is not None]
        chosen = owners(claims).get("llama")
        return None if chosen is None else chosen.namespace

    assert owner(cr("a", old, None), cr("b", new, None)) == "a"  # no status yet: the oldest
    assert owner(cr("a", old, []), cr("b", new, ["llama"])) == "b"  # the status decides
    # The owner recreated a moment ago (no status yet), the loser's status says it lost:
    # routed to nobody until the operator writes the owner's status again.
    assert owner(cr("a", new, None), cr("b", old, [])) is None
    assert owner(cr("a", new, ["llama"]), cr("b", old, [])) == "a"


def test_the_router_routes_only_the_serving_namespaces() -> None:
    catalog = Catalog(RouteTable(), serving=("b",))
    items = [cr("a", "2026-01-01T00:00:00Z", None), cr("b", "2026-01-02T00:00:00Z", None)]
    catalog.on_llmdeployment("SYNC", {"items": items, "namespace": None})
    assert {m: b.namespace for m, b in catalog.table.backends.items()} == {"llama": "b"}


def test_a_lost_record_is_rebuilt_from_the_published_statuses() -> None:
    """The ConfigMap deleted (or an operator that kept none): the names the statuses already
    list stay with their CRs, even where rule 3 alone would pick another."""
    newer_owner = cr("b", "2026-01-02T00:00:00Z", ["llama"])
    older = cr("a", "2026-01-01T00:00:00Z", [])
    record = name_owners.seeded({}, [older, newer_owner])
    assert record == {"llama": Owner("b", "chat")}
    claimants = [c for c in map(name_owners.claimant_of, [older, newer_owner]) if c]
    decision = decide(claimants, record, present=[c.key for c in claimants], now=T0, grace=GRACE)
    assert decision.verdicts[("b", "chat")].owned == ("llama",)
    assert decision.verdicts[("a", "chat")].lost == (("llama", Owner("b", "chat")),)


def test_before_the_first_decision_a_status_keeps_what_it_said() -> None:
    """A restarted operator's first passes run before `llmop.name_check` decides: the status
    keeps `routing` and the conflict (dropping `routing` would let the router fall back to the
    oldest claimant meanwhile); once decided, the verdict rules."""
    config = load(["--router", "llmop-system/llmop-router:8080"], {})
    ctx = Context(kube=cast(Any, None), config=config, metrics=Metrics(), instance="t")
    lost = Condition(
        type="Degraded",
        status="True",
        last_transition_time="2026-01-01T00:00:00Z",
        reason=conditions.REASON_MODEL_NAME_CONFLICT,
        message="model name 'llama' is served by LLMDeployment a/chat.",
    )
    previous = LLMDeploymentStatus(
        routing=RoutingStatus(served_names=["llama-sql"]), conditions=[lost]
    )
    owned, issue = _names(ctx, "b", "chat", previous)
    assert owned == ["llama-sql"]
    assert issue is not None
    assert issue.message == lost.message
    ctx.names = {("b", "chat"): name_owners.Verdict(owned=("llama", "llama-sql"))}
    assert _names(ctx, "b", "chat", previous) == (["llama", "llama-sql"], None)
    ctx.names = {}  # it claims nothing (routing off), or is newer than the last decision
    assert _names(ctx, "b", "chat", previous) == ([], None)


def test_undecided_is_written_as_owning_nothing_never_as_no_routing() -> None:
    """No `status.routing` makes the router fall back to the oldest claimant (operators that
    predate names): a CR not decided yet (new, or before a restarted operator's first
    decision) must say it owns nothing, or a name reserved to a deleted owner goes to it."""
    config = load(["--router", "llmop-system/llmop-router:8080"], {})
    ctx = Context(kube=cast(Any, None), config=config, metrics=Metrics(), instance="t")
    assert _names(ctx, "b", "new", LLMDeploymentStatus()) == ([], None)
    ctx.names = {}
    assert _names(ctx, "b", "new", LLMDeploymentStatus()) == ([], None)
    # Without a router the operator decides no names: no `routing` at all.
    bare = Context(kube=cast(Any, None), config=load([], {}), metrics=Metrics(), instance="t")
    assert _names(bare, "b", "new", LLMDeploymentStatus()) == (None, None)


class ListingKube:
    """Answers the LLMExternalModel list: names, or an error; counts the lists."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.error: KubeError | None = None
        self.lists: list[tuple[str, str, str | None]] = []

    def list(self, api_version: str, kind: str, namespace: str | None = None) -> list[Any]:
        self.lists.append((api_version, kind, namespace))
        if self.error is not None:
            raise self.error
        return [{"metadata": {"name": n, "namespace": namespace}} for n in self.names]


def test_the_routers_external_models_are_listed_only_while_a_fallback_names_one(
    monkeypatch: Any,
) -> None:
    config = load(["--router", "llmop-system/llmop-router:8080"], {})
    kube = ListingKube()
    ctx = Context(kube=cast(Any, kube), config=config, metrics=Metrics(), instance="t")
    keeper = name_check.Keeper()
    plain = Claimant("team-a", "chat", FIRST.created, ("llama",))
    external = Claimant("team-a", "chat", FIRST.created, ("llama",), external_fallbacks=("m",))
    clock = [100.0]
    monkeypatch.setattr(name_check.time, "monotonic", lambda: clock[0])

    assert name_check.read_externals(ctx, keeper, "llmop-system", [plain]) is None
    assert kube.lists == []
    kube.names = ["m", "n"]
    found = name_check.read_externals(ctx, keeper, "llmop-system", [plain, external])
    assert found == frozenset({"m", "n"})
    assert kube.lists == [("serving.llmop.dev/v1alpha1", "LLMExternalModel", "llmop-system")]
    # Within the period the last list stands; after it, a new list.
    kube.names = []
    clock[0] += name_check.EXTERNALS_SECONDS / 2
    assert name_check.read_externals(ctx, keeper, "llmop-system", [external]) == {"m", "n"}
    clock[0] += name_check.EXTERNALS_SECONDS
    assert name_check.read_externals(ctx, keeper, "llmop-system", [external]) == frozenset()
    # Cannot list (RBAC): not judged rather than every external fallback reported missing.
    kube.error = KubeError("GET llmexternalmodels: 403 forbidden", 403)
    clock[0] += name_check.EXTERNALS_SECONDS
    assert name_check.read_externals(ctx, keeper, "llmop-system", [external]) is None
