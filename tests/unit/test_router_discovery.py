"""The router's discovery: LLMDeployments and EndpointSlices (as the watches deliver them) to the
routing table, one event at a time."""

from __future__ import annotations

from typing import Any

import pytest

from llmop_router.discovery import (
    Catalog,
    claim_of,
    owners,
    ready_endpoints,
    starting_pods,
    wake_of,
)
from llmop_router.hold import ScaleToZero
from llmop_router.routes import Fallback, RouteTable, Wake


def llmd(
    name: str, namespace: str = "team", created: str = "2026-11-26T10:00:00Z", **spec: Any
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": created},
        "spec": {"model": {"name": "org/model"}, **spec},
    }


def endpoint_slice(
    service: str,
    *addresses: tuple[str, dict[str, bool]],
    namespace: str = "team",
    name: str | None = None,
    port: int = 8000,
    address_type: str = "IPv4",
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name or f"{service}-abcde",
            "namespace": namespace,
            "labels": {"kubernetes.io/service-name": service},
        },
        "addressType": address_type,
        "ports": [{"name": "http", "port": port}, {"name": "probe", "port": 8081}],
        "endpoints": [{"addresses": [a], "conditions": c} for a, c in addresses],
    }


READY = {"ready": True, "serving": True, "terminating": False}


def test_claims() -> None:
    assert claim_of(llmd("llama")).model == "llama"  # type: ignore[union-attr]
    assert not claim_of(llmd("llama")).engine_key  # type: ignore[union-attr]
    keyed = llmd("llama", service={"apiKeySecretRef": {"name": "k", "key": "key"}})
    assert claim_of(keyed).engine_key  # type: ignore[union-attr]
    catalog = Catalog(table := RouteTable())
    catalog.on_llmdeployment("SYNC", {"items": [keyed]})
    assert table.backends["llama"].engine_key
    served = llmd("llama", model={"name": "org/m", "servedName": "llama-8b"})
    assert claim_of(served).model == "llama-8b"  # type: ignore[union-attr]
    assert claim_of(llmd("llama", router={"enabled": False})) is None
    assert claim_of({"metadata": {}}) is None


def test_the_oldest_claim_keeps_a_model_name() -> None:
    a = claim_of(
        llmd(
            "a",
            namespace="x",
            created="2026-11-26T10:00:05Z",
            model={"name": "m", "servedName": "shared"},
        )
    )
    b = claim_of(
        llmd(
            "b",
            namespace="y",
            created="2026-11-26T10:00:01Z",
            model={"name": "m", "servedName": "shared"},
        )
    )
    assert a is not None
    assert b is not None
    assert owners([a, b])["shared"] == b
    assert owners([b, a])["shared"] == b


def test_only_ready_non_terminating_endpoints_on_the_api_port() -> None:
    found = ready_endpoints(
        [
            endpoint_slice(
                "llama",
                ("10.244.7.2", READY),
                ("10.244.7.3", {"ready": False}),
                # Terminating but still passing readiness: leaves at once (production-stack#601).
                ("10.244.7.4", {"ready": True, "terminating": True}),
                ("10.244.7.5", {}),  # ready unset means ready
            ),
            endpoint_slice("llama", ("fd00::7", READY), address_type="IPv6", name="v6"),
            endpoint_slice("llama", ("engine.example", READY), address_type="FQDN", name="fqdn"),
        ]
    )
    assert found == ["10.244.7.2:8000", "10.244.7.5:8000", "[fd00::7]:8000"]


def test_catalog_follows_the_events() -> None:
    table = RouteTable()
    catalog = Catalog(table)
    catalog.on_llmdeployment(
        "SYNC", {"items": [llmd("llama"), llmd("off", router={"enabled": False})]}
    )
    assert not catalog.ready
    catalog.on_endpoint_slice("SYNC", {"items": [endpoint_slice("llama", ("10.244.7.2", READY))]})
    assert catalog.ready
    assert table.models() == ["llama"]
    assert table.backends["llama"].ring.endpoints == ("10.244.7.2:8000",)

    # A second slice of the same Service adds its endpoints; a pod going unready leaves.
    catalog.on_endpoint_slice(
        "ADDED", endpoint_slice("llama", ("10.244.7.3", READY), name="llama-2")
    )
    assert table.backends["llama"].ring.endpoints == ("10.244.7.2:8000", "10.244.7.3:8000")
    catalog.on_endpoint_slice("MODIFIED", endpoint_slice("llama", ("10.244.7.2", {"ready": False})))
    assert table.backends["llama"].ring.endpoints == ("10.244.7.3:8000",)

    # Renaming the served model moves the route; turning routing off removes it.
    catalog.on_llmdeployment(
        "MODIFIED", llmd("llama", model={"name": "org/m", "servedName": "llama-8b"})
    )
    assert table.models() == ["llama-8b"]
    assert table.backends["llama-8b"].ring.endpoints == ("10.244.7.3:8000",)
    catalog.on_llmdeployment("MODIFIED", llmd("llama", router={"enabled": False}))
    assert table.models() == []

    # A CR created later gets its endpoints from slices seen before it.
    catalog.on_endpoint_slice("ADDED", endpoint_slice("late", ("10.244.7.9", READY)))
    catalog.on_llmdeployment("ADDED", llmd("late"))
    assert table.backends["late"].ring.endpoints == ("10.244.7.9:8000",)
    catalog.on_llmdeployment("DELETED", llmd("late"))
    assert table.models() == []


def test_when_the_owner_of_a_shared_name_goes_the_other_claim_takes_it() -> None:
    table = RouteTable()
    catalog = Catalog(table)
    older = llmd(
        "a",
        namespace="x",
        created="2026-11-26T10:00:01Z",
        model={"name": "m", "servedName": "shared"},
    )
    newer = llmd(
        "b",
        namespace="y",
        created="2026-11-26T10:00:09Z",
        model={"name": "m", "servedName": "shared"},
    )
    catalog.on_llmdeployment("SYNC", {"items": [newer, older]})
    catalog.on_endpoint_slice(
        "SYNC",
        {
            "items": [
                endpoint_slice("a", ("10.244.7.2", READY), namespace="x"),
                endpoint_slice("b", ("10.244.7.3", READY), namespace="y"),
            ]
        },
    )
    assert (table.backends["shared"].namespace, table.backends["shared"].name) == ("x", "a")
    catalog.on_llmdeployment("DELETED", older)
    assert (table.backends["shared"].namespace, table.backends["shared"].name) == ("y", "b")
    assert table.backends["shared"].ring.endpoints == ("10.244.7.3:8000",)


def test_where_the_operator_decides_names_a_cr_it_has_not_seen_is_not_routed() -> None:
    """A name reserved to a deleted owner and claimed by a new CR alone: the new CR has no
    status yet, so without `await_decisions` the rule for operators that predate names routes
    it (the oldest claimant); with it, nothing is routed until the operator's status says
    who owns the name. A status without `routing` (an operator that predates names) still
    falls back."""
    newcomer = llmd("thief", namespace="y", model={"name": "m", "servedName": "shared"})
    serving = endpoint_slice("thief", ("10.244.7.3", READY), namespace="y")
    for awaiting, routed in ((False, True), (True, False)):
        table = RouteTable()
        catalog = Catalog(table, await_decisions=awaiting)
        catalog.on_endpoint_slice("SYNC", {"items": [serving]})
        catalog.on_llmdeployment("SYNC", {"items": [newcomer]})
        assert ("shared" in table.backends) is routed, awaiting
    table = RouteTable()
    catalog = Catalog(table, await_decisions=True)
    catalog.on_endpoint_slice("SYNC", {"items": [serving]})
    catalog.on_llmdeployment("ADDED", newcomer)
    assert table.models() == []
    # The operator's first status: undecided, so it owns nothing yet.
    catalog.on_llmdeployment("MODIFIED", {**newcomer, "status": {"routing": {"servedNames": []}}})
    assert table.models() == []
    # Decided for it: routed.
    catalog.on_llmdeployment(
        "MODIFIED", {**newcomer, "status": {"routing": {"servedNames": ["shared"]}}}
    )
    assert table.backends["shared"].ring.endpoints == ("10.244.7.3:8000",)
    # An operator that predates names writes a status without `routing`: the oldest claimant.
    catalog.on_llmdeployment("MODIFIED", {**newcomer, "status": {"observedGeneration": 1}})
    assert table.backends["shared"].ring.endpoints == ("10.244.7.3:8000",)


def test_a_namespaced_list_replaces_only_its_own_namespace() -> None:
    table = RouteTable()
    catalog = Catalog(table, namespaces=("a", "b"))
    catalog.on_llmdeployment("SYNC", {"items": [llmd("one", namespace="a")], "namespace": "a"})
    catalog.on_llmdeployment("SYNC", {"items": [llmd("two", namespace="b")], "namespace": "b"})
    catalog.on_endpoint_slice("SYNC", {"items": [], "namespace": "a"})
    assert not catalog.ready  # b's EndpointSlices not listed yet
    catalog.on_endpoint_slice("SYNC", {"items": [], "namespace": "b"})
    assert catalog.ready
    assert table.models() == ["one", "two"]
    # A relist of a (after its watch expired) keeps b's models.
    catalog.on_llmdeployment("SYNC", {"items": [], "namespace": "a"})
    assert table.models() == ["two"]


def test_watch_lines_of_any_length() -> None:
    """A watch event is one JSON line; a large fleet's EndpointSlice exceeds aiohttp's 64 KiB
    line limit, and chunks split lines anywhere."""
    import asyncio
    import json

    from llmop_router.kube import lines_of

    big = json.dumps({"type": "MODIFIED", "object": {"pad": "x" * 200_000}}).encode()
    stream = big + b"\n\n" + b'{"type": "BOOKMARK"}\n' + b'{"type": "DELETED"}'

    async def chunks():  # type: ignore[no-untyped-def]
        for start in range(0, len(stream), 7_001):
            yield stream[start : start + 7_001]

    async def collect() -> list[bytes]:
        return [line async for line in lines_of(chunks())]

    lines = asyncio.run(collect())
    assert [json.loads(line)["type"] for line in lines] == ["MODIFIED", "BOOKMARK", "DELETED"]
    assert lines[0] == big


def at_zero(reason: str = "ScaledToZero", status: str = "True") -> dict[str, Any]:
    return {"conditions": [{"type": "Ready", "status": status, "reason": reason}]}


@pytest.mark.parametrize(
    ("spec", "status", "expected"),
    [
        ({}, {}, Wake()),
        ({"autoscaling": {"minReplicas": 0}}, at_zero(), Wake(scaled_to_zero=True)),
        # A fixed `spec.replicas: 0` also reads ScaledToZero: only the autoscaled floor wakes.
        ({"replicas": 0}, at_zero(), Wake()),
        ({"autoscaling": {"minReplicas": 1}}, at_zero(), Wake()),
        # Ready for another reason: no wake.
        ({"autoscaling": {"minReplicas": 0}}, at_zero("Available"), Wake()),
        ({"autoscaling": {"minReplicas": 0}}, at_zero(status="False"), Wake()),
        (
            {
                "engine": {"pipelineParallelSize": 2, "maxNumSeqs": 8},
                "autoscaling": {"minReplicas": 0, "scaleToZero": {"holdTimeoutSeconds": 30}},
            },
            {**at_zero(), "plan": {"maxNumSeqs": 8}},
            Wake(
                scaled_to_zero=True,
                settings=ScaleToZero(hold_timeout_seconds=30),
                workload="leaderworkersets",
                concurrency=8,
            ),
        ),
        ({"engine": {"pipelineParallelSize": 1}}, {}, Wake(workload="deployments")),
    ],
)
def test_what_the_router_reads_to_hold_and_wake(
    spec: dict[str, Any], status: dict[str, Any], expected: Wake
) -> None:
    obj = {**llmd("llama", **spec), "status": status}
    assert wake_of(obj) == expected
    claim = claim_of(obj)
    assert claim is not None
    assert claim.wake == expected
    catalog = Catalog(RouteTable())
    catalog.on_llmdeployment("ADDED", obj)
    assert catalog.table.backends["llama"].wake == expected
    # An EndpointSlice event keeps what the CR said.
    catalog.on_endpoint_slice("ADDED", endpoint_slice("llama", ("10.0.0.1", {"ready": True})))
    assert catalog.table.backends["llama"].wake == expected


def test_adapter_names_route_like_models_to_the_same_pods() -> None:
    table = RouteTable()
    catalog = Catalog(table)
    adapters = [{"name": "sql", "source": "hf://a/sql"}, {"name": "chat", "source": "hf://a/c"}]
    catalog.on_llmdeployment("SYNC", {"items": [llmd("llama", adapters=adapters)]})
    catalog.on_endpoint_slice("SYNC", {"items": [endpoint_slice("llama", ("10.244.7.2", READY))]})
    assert table.models() == ["chat", "llama", "sql"]
    for model in ("llama", "sql", "chat"):
        backend = table.backends[model]
        assert (backend.namespace, backend.name) == ("team", "llama")
        assert backend.ring.endpoints == ("10.244.7.2:8000",)
    # A new pod reaches every name of the CR; removing an adapter removes only its route.
    catalog.on_endpoint_slice("ADDED", endpoint_slice("llama", ("10.244.7.3", READY), name="b"))
    assert table.backends["sql"].ring.endpoints == ("10.244.7.2:8000", "10.244.7.3:8000")
    catalog.on_llmdeployment("MODIFIED", llmd("llama", adapters=adapters[1:]))
    assert table.models() == ["chat", "llama"]


def test_an_adapter_name_another_cr_serves_stays_with_the_oldest() -> None:
    old = claim_of(
        llmd("old", created="2026-11-26T10:00:00Z", model={"name": "m", "servedName": "sql"})
    )
    new = claim_of(
        llmd(
            "new", created="2026-11-26T11:00:00Z", adapters=[{"name": "sql", "source": "hf://a/b"}]
        )
    )
    assert old is not None
    assert new is not None
    assert new.models == ("new", "sql")
    chosen = owners([new, old])
    assert chosen["sql"] == old
    assert chosen["new"] == new


def test_the_catalog_knows_how_stale_each_list_is() -> None:
    """Age counts from the start until a list first succeeds, then from each contact; a list
    that arrived once and then went quiet past the bound is stale, with the watch's last error;
    a contact clears it. A list not yet arrived is `waiting`'s, not stale."""
    catalog = Catalog(RouteTable(), namespaces=("a",))
    catalog.started(100.0)
    assert catalog.ages(103.0) == {"llmdeployments": 3.0, "endpointslices": 3.0}
    assert catalog.stale(200.0, 30) == []  # nothing listed yet: waiting says so
    catalog.on_llmdeployment("SYNC", {"items": [], "namespace": "a"})
    catalog.on_endpoint_slice("SYNC", {"items": [], "namespace": "a"})
    catalog.contact("llmdeployments/a", 110.0)
    catalog.contact("endpointslices/a", 125.0)
    assert catalog.ages(130.0) == {"llmdeployments": 20.0, "endpointslices": 5.0}
    assert catalog.stale(140.0, 30) == []
    catalog.failed("llmdeployments/a", "FileNotFoundError: [Errno 2] token")
    (reason,) = catalog.stale(145.0, 30)
    assert reason.startswith("stale: no list or watch event of llmdeployments in namespace a")
    assert "for 35 s (more than the 30 s of --stale-after-seconds)" in reason
    assert reason.endswith("last error: FileNotFoundError: [Errno 2] token")
    catalog.contact("llmdeployments/a", 146.0)
    assert catalog.stale(147.0, 30) == []
    assert catalog.errors == {}


def test_the_watch_backs_off_exponentially_bounded_with_jitter() -> None:
    from llmop_router.kube import RETRY_FIRST_SECONDS, RETRY_MAX_SECONDS, retry_delay

    highest = [retry_delay(n, lambda: 0.999999) for n in range(1, 10)]
    lowest = [retry_delay(n, lambda: 0.0) for n in range(1, 10)]
    assert highest[0] == pytest.approx(RETRY_FIRST_SECONDS, rel=1e-3)
    assert highest[1] == pytest.approx(2 * RETRY_FIRST_SECONDS, rel=1e-3)
    assert highest == sorted(highest)
    assert max(highest) == pytest.approx(RETRY_MAX_SECONDS, rel=1e-3)
    assert lowest == pytest.approx([h / 2 for h in highest], rel=1e-3)
    assert retry_delay(10_000) <= RETRY_MAX_SECONDS


def test_a_crs_migration_limit_follows_it_into_the_table() -> None:
    assert claim_of(llmd("llama")).migration_limit is None  # type: ignore[union-attr]
    for bad in (-1, "2", True, None):
        claim = claim_of(llmd("llama", router={"migrationLimit": bad}))
        assert claim is not None
        assert claim.migration_limit is None, bad
    table = RouteTable()
    catalog = Catalog(table)
    catalog.on_llmdeployment("SYNC", {"items": [llmd("llama", router={"migrationLimit": 0})]})
    catalog.on_endpoint_slice("SYNC", {"items": [endpoint_slice("llama", ("10.244.7.2", READY))]})
    assert table.backends["llama"].migration_limit == 0
    # A slice event keeps it; a spec change moves it.
    catalog.on_endpoint_slice("ADDED", endpoint_slice("llama", ("10.244.7.3", READY), name="b"))
    assert table.backends["llama"].migration_limit == 0
    catalog.on_llmdeployment("MODIFIED", llmd("llama", router={"migrationLimit": 3}))
    assert table.backends["llama"].migration_limit == 3
    catalog.on_llmdeployment("MODIFIED", llmd("llama"))
    assert table.backends["llama"].migration_limit is None


def test_a_crs_fallbacks_follow_it_into_the_table_and_never_point_at_itself() -> None:
    fallback = [
        {"model": "qwen", "when": ["Unavailable", "Saturated"], "afterSeconds": 5},
        {"model": "llama"},  # itself: left out
        {"model": "mistral", "when": ["Saturated"]},
        {"externalModel": "managed", "when": ["Unavailable", "Saturated"], "afterSeconds": 1},
    ]
    claim = claim_of(llmd("llama", router={"fallback": fallback}))
    assert claim is not None
    assert claim.fallback == (
        Fallback("qwen", unavailable=True, saturated_after=5.0),
        Fallback("mistral", unavailable=False, saturated_after=2.0),
        Fallback("managed", unavailable=True, saturated_after=1.0, external=True),
    )
    table = RouteTable()
    catalog = Catalog(table)
    catalog.on_llmdeployment("SYNC", {"items": [llmd("llama", router={"fallback": fallback})]})
    catalog.on_endpoint_slice("SYNC", {"items": [endpoint_slice("llama", ("10.244.7.2", READY))]})
    assert [f.model for f in table.backends["llama"].fallback] == ["qwen", "mistral", "managed"]
    catalog.on_endpoint_slice("ADDED", endpoint_slice("llama", ("10.244.7.3", READY), name="b"))
    assert len(table.backends["llama"].fallback) == 3, "a slice event keeps them"
    catalog.on_llmdeployment("MODIFIED", llmd("llama"))
    assert table.backends["llama"].fallback == ()
    malformed = [
        {"when": ["Unavailable"]},  # names nothing
        {"model": "qwen", "externalModel": "managed"},  # names both
        "nonsense",
        {"model": "qwen", "when": "Unavailable"},
    ]
    claim = claim_of(llmd("llama", router={"fallback": malformed}))
    assert claim is not None
    assert claim.fallback == ()


def with_pods(endpoint_slice_body: dict[str, Any], *pods: str) -> dict[str, Any]:
    for endpoint, pod in zip(endpoint_slice_body["endpoints"], pods, strict=True):
        endpoint["targetRef"] = {"kind": "Pod", "name": pod, "namespace": "team"}
    return endpoint_slice_body


def test_endpoints_carry_the_model_revision_the_status_gives_their_pod() -> None:
    table = RouteTable()
    catalog = Catalog(table)
    revised = llmd("llama")
    revised["status"] = {
        "routing": {
            "servedNames": ["llama"],
            "modelRevisions": [
                {"revision": "aaa", "pods": ["llama-old-1", "llama-old-2"]},
                {"revision": "bbb", "pods": ["llama-new-1"]},
                {"revision": 7, "pods": ["bad"]},  # malformed: left out
                "junk",
            ],
        }
    }
    catalog.on_llmdeployment("SYNC", {"items": [revised]})
    slice_body = with_pods(
        endpoint_slice(
            "llama",
            ("10.0.0.1", READY),
            ("10.0.0.2", READY),
            ("10.0.0.3", READY),
            ("10.0.0.4", READY),
        ),
        "llama-old-1",
        "llama-new-1",
        "llama-old-2",
        "llama-unlisted",
    )
    catalog.on_endpoint_slice("SYNC", {"items": [slice_body]})
    backend = table.backends["llama"]
    assert backend.ring.endpoints == tuple(f"10.0.0.{i}:8000" for i in range(1, 5))
    # The pod the status does not list yet has no revision: no target for a continuation.
    assert backend.revisions == {
        "10.0.0.1:8000": "aaa",
        "10.0.0.2:8000": "bbb",
        "10.0.0.3:8000": "aaa",
    }

    # A slice event keeps the revisions; a status without them (an older operator) unpins.
    catalog.on_endpoint_slice(
        "MODIFIED", with_pods(endpoint_slice("llama", ("10.0.0.2", READY)), "llama-new-1")
    )
    assert table.backends["llama"].revisions == {"10.0.0.2:8000": "bbb"}
    catalog.on_llmdeployment("MODIFIED", llmd("llama"))
    assert table.backends["llama"].revisions is None
    # Routing decided but no pod listed: pinned, and nothing is a target.
    empty = llmd("llama")
    empty["status"] = {"routing": {"servedNames": ["llama"], "modelRevisions": []}}
    catalog.on_llmdeployment("MODIFIED", empty)
    assert table.backends["llama"].revisions == {}


def test_an_adapters_endpoints_carry_its_revision_too_while_it_is_settled() -> None:
    """`status.routing.adapterRevisions`: a stream of an adapter is pinned to the pod's model
    revision and the adapter's; while the adapter is not settled no endpoint is a target for a
    continuation of it. The base name keeps the model's pins only; a status without the key
    (an older operator) pins adapters as the base."""
    table = RouteTable()
    catalog = Catalog(table)
    adapters = [{"name": "sql", "source": "hf://acme/sql"}, {"name": "chat", "source": "pvc://x"}]
    revised = llmd("llama", adapters=adapters)
    routing: dict[str, Any] = {
        "servedNames": ["llama", "sql", "chat"],
        "modelRevisions": [{"revision": "m1", "pods": ["llama-1", "llama-2"]}],
        "adapterRevisions": [
            {"name": "sql", "revision": "a1", "settled": True},
            {"name": "chat", "settled": True},  # files without a revision
            {"revision": "x"},  # malformed: left out
        ],
    }
    revised["status"] = {"routing": routing}
    catalog.on_llmdeployment("SYNC", {"items": [revised]})
    slice_body = endpoint_slice("llama", ("10.0.0.1", READY), ("10.0.0.2", READY))
    catalog.on_endpoint_slice("SYNC", {"items": [with_pods(slice_body, "llama-1", "llama-2")]})
    both = ("10.0.0.1:8000", "10.0.0.2:8000")
    assert table.backends["llama"].revisions == dict.fromkeys(both, "m1")
    assert table.backends["sql"].revisions == dict.fromkeys(both, "m1 adapter revision:a1")
    assert table.backends["chat"].revisions == dict.fromkeys(both, "m1 adapter no revision")

    routing["adapterRevisions"][0] = {"name": "sql", "revision": "a2", "settled": False}
    catalog.on_llmdeployment("MODIFIED", revised)
    assert table.backends["sql"].revisions == {}
    assert table.backends["llama"].revisions == dict.fromkeys(both, "m1")
    del routing["adapterRevisions"]
    catalog.on_llmdeployment("MODIFIED", revised)
    assert table.backends["sql"].revisions == dict.fromkeys(both, "m1")


def test_starting_endpoints_with_their_agents_and_the_routers_own_confirmation() -> None:
    """A pod not ready yet is listed with its agent's port (never a terminating one); once the
    router confirms it ready itself it is routed, until its slice says ready or drops it; a
    later not-ready is obeyed (the confirmation was forgotten)."""
    starting = {"ready": False, "serving": False, "terminating": False}
    found = starting_pods(
        [
            endpoint_slice(
                "llama",
                ("10.244.7.2", READY),
                ("10.244.7.3", starting),
                ("10.244.7.4", {"ready": False, "terminating": True}),
            ),
            endpoint_slice("llama", ("fd00::7", starting), address_type="IPv6", name="v6"),
            endpoint_slice("llama", ("engine.example", starting), address_type="FQDN", name="f"),
        ]
    )
    assert found == {
        "10.244.7.3:8000": ("", "10.244.7.3:8081"),
        "[fd00::7]:8000": ("", "[fd00::7]:8081"),
    }
    no_agent_port = endpoint_slice("llama", ("10.244.7.3", starting))
    no_agent_port["ports"] = no_agent_port["ports"][:1]
    assert starting_pods([no_agent_port]) == {}

    table = RouteTable()
    catalog = Catalog(table)
    catalog.on_llmdeployment("SYNC", {"items": [llmd("llama")]})
    catalog.on_endpoint_slice(
        "SYNC", {"items": [endpoint_slice("llama", ("10.244.7.3", starting))]}
    )
    service = ("team", "llama")
    assert table.backends["llama"].ring.endpoints == ()
    assert catalog.starting_agents(service) == {"10.244.7.3:8000": "10.244.7.3:8081"}

    catalog.confirm_ready(service, "10.244.7.9:8000")  # not one of its starting endpoints
    assert table.backends["llama"].ring.endpoints == ()
    catalog.confirm_ready(service, "10.244.7.3:8000")
    assert table.backends["llama"].ring.endpoints == ("10.244.7.3:8000",)
    assert catalog.starting_agents(service) == {}
    # Another slice event keeps it routed while its own slice still says starting.
    catalog.on_endpoint_slice("ADDED", endpoint_slice("llama", ("10.244.7.5", starting), name="b"))
    assert table.backends["llama"].ring.endpoints == ("10.244.7.3:8000",)

    # Its slice says ready: ready, and the confirmation is forgotten...
    catalog.on_endpoint_slice("MODIFIED", endpoint_slice("llama", ("10.244.7.3", READY)))
    assert table.backends["llama"].ring.endpoints == ("10.244.7.3:8000",)
    assert catalog.confirmed == {}
    # ...so a later not-ready (the kubelet's probe failed) takes it out of the table.
    catalog.on_endpoint_slice("MODIFIED", endpoint_slice("llama", ("10.244.7.3", starting)))
    assert table.backends["llama"].ring.endpoints == ()

    # A confirmed endpoint that starts terminating, or whose slice goes, is gone at once.
    catalog.confirm_ready(service, "10.244.7.5:8000")
    assert table.backends["llama"].ring.endpoints == ("10.244.7.5:8000",)
    catalog.on_endpoint_slice(
        "MODIFIED",
        endpoint_slice("llama", ("10.244.7.5", {"ready": False, "terminating": True}), name="b"),
    )
    assert table.backends["llama"].ring.endpoints == ()
    catalog.confirm_ready(service, "10.244.7.3:8000")
    catalog.on_endpoint_slice("DELETED", endpoint_slice("llama"))
    assert table.backends["llama"].ring.endpoints == ()
    assert catalog.confirmed == {}
