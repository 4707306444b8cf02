"""The router ↔ operator contract, end to end without a cluster: a CR's children rendered and
its status derived by the operator's own functions go through the router's own discovery, and
the router's own activity answer goes through the operator's own parser. A renamed key, label,
port or condition on either side, or a default that differs between the CRD and the router,
fails here."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from llmop import idle, idle_check, kinds
from llmop.agents import AgentReading, PodAdapter
from llmop.api.v1alpha1 import LLMDeployment, LLMDeploymentStatus, ScaleToZeroSpec
from llmop.pods import pod_summary
from llmop.render import RenderSettings, render_children
from llmop.router_view import RouterRef, RouterView
from llmop.sizing import plan_for
from llmop.status import Observed, derive_status, dump
from llmop_router import contract
from llmop_router.app import Router
from llmop_router.discovery import Catalog, claim_of, gpus_of
from llmop_router.gpu_price import GpuTime, plan_facts
from llmop_router.hold import ScaleToZero
from llmop_router.quota import Usage
from llmop_router.routes import RouteTable
from support.manifests import workload_status

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = RenderSettings(vllm_image="engine:1", simulator_image="sim:1")
ROUTER = RouterView(RouterRef("llmop-system", "llmop-router", 8080), ready=True)
T0 = datetime(2026, 1, 2, 3, 0, 0, tzinfo=UTC)
H100 = {"gpus": 1, "gpuProduct": "NVIDIA-H100-80GB-HBM3"}
MODEL = {"name": "meta-llama/Llama-3.1-8B-Instruct", "servedName": "llama-8b"}


def _resource(spec: dict[str, Any]) -> LLMDeployment:
    return LLMDeployment.model_validate(
        {"metadata": {"name": "llama", "namespace": "team"}, "spec": spec}
    )


def _at_zero(resource: LLMDeployment) -> LLMDeploymentStatus:
    """The status the operator writes once it took the CR to zero (serving, then at 0)."""
    kind = kinds.LEADER_WORKER_SET if resource.spec.pipeline_parallel_size > 1 else kinds.DEPLOYMENT
    status = LLMDeploymentStatus()
    serving, at_zero = workload_status(1, 1), workload_status(0, 0)
    for at, workload in ((T0, serving), (T0 + timedelta(seconds=10), at_zero)):
        observed = Observed(
            "llama",
            "team",
            generation=1,
            previous=status,
            children={kind: workload},
            router=ROUTER,
        )
        status = derive_status(
            observed, resource.spec, plan_for(resource.spec), template_hash=None, now=at
        )
    return status


def _as_served(resource: LLMDeployment, status: LLMDeploymentStatus) -> dict[str, Any]:
    """The CR as the API server serves it to the router's watch (camelCase, defaults filled)."""
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND,
        "metadata": {
            "name": "llama",
            "namespace": "team",
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": resource.spec.model_dump(by_alias=True, exclude_none=True, mode="json"),
        "status": dump(status),
    }


AUTOSCALED = {"minReplicas": 0, "maxReplicas": 3}

CASES: dict[str, tuple[dict[str, Any], int | None]] = {
    # vLLM's default batch on an H100 (1,024), which the router used to cap at 256.
    "gpu-default": ({"model": MODEL, "resources": H100, "autoscaling": AUTOSCALED}, 1024),
    "spec-maxNumSeqs": (
        {
            "model": MODEL,
            "resources": H100,
            "engine": {"maxNumSeqs": 8},
            "autoscaling": {
                **AUTOSCALED,
                "scaleToZero": {"holdTimeoutSeconds": 30, "maxPendingRequests": 7},
            },
        },
        8,
    ),
    # The last flag wins, as vLLM's argparse takes it.
    "args-maxNumSeqs": (
        {
            "model": MODEL,
            "resources": H100,
            "engine": {"maxNumSeqs": 8, "args": ["--max-num-seqs", "64"]},
            "autoscaling": AUTOSCALED,
        },
        64,
    ),
    "multi-node": (
        {
            "model": MODEL,
            "resources": H100,
            "engine": {"pipelineParallelSize": 2},
            "autoscaling": {**AUTOSCALED, "scaleToZero": {"idleSeconds": 60}},
        },
        1024,
    ),
    # No plan (the simulator on no GPU): the router's fallback.
    "simulator": (
        {"model": MODEL, "engine": {"backend": "simulator"}, "autoscaling": AUTOSCALED},
        None,
    ),
}


@pytest.mark.parametrize(("spec", "planned"), CASES.values(), ids=CASES.keys())
def test_the_router_reads_a_cr_at_zero_as_the_operator_wrote_it(
    spec: dict[str, Any], planned: int | None
) -> None:
    resource = _resource(spec)
    status = _at_zero(resource)
    assert status.plan is None or status.plan.max_num_seqs == planned
    if planned is not None:
        assert status.plan is not None
    served = _as_served(resource, status)

    claim = claim_of(served)
    assert claim is not None
    assert claim.model == "llama-8b"
    wake = claim.wake
    # The operator's ScaledToZero, read by the router as "wake this one".
    assert wake.scaled_to_zero
    # The operator's settings, defaults included, are the router's.
    zero = resource.spec.autoscaling.zero  # type: ignore[union-attr]
    assert wake.settings == ScaleToZero(
        idle_seconds=zero.idle_seconds,
        hold_timeout_seconds=zero.hold_timeout_seconds,
        max_pending_requests=zero.max_pending_requests,
    )
    assert idle_check._idle_seconds(served) == zero.idle_seconds
    # The workload the operator renders (and scales to 0) is the one the router scales to 1.
    children = render_children(resource, SETTINGS, load_timeout_seconds=900)
    rendered = kinds.LEADER_WORKER_SET if children.leader_worker_set else kinds.DEPLOYMENT
    assert wake.workload == rendered.plural
    assert kinds.workload_of_resource(wake.workload) == rendered
    assert contract.scale_path(wake.workload, "team", "llama") == (
        f"/apis/{rendered.api_version}/namespaces/team/{rendered.plural}/llama/scale"
    )
    # The batch the engine runs with is the router's release per pod.
    assert wake.concurrency == (planned or contract.DEFAULT_MAX_NUM_SEQS)


def test_the_api_defaults_are_the_routers() -> None:
    api, router = ScaleToZeroSpec(), ScaleToZero.of({})
    assert (api.idle_seconds, api.hold_timeout_seconds, api.max_pending_requests) == (
        router.idle_seconds,
        router.hold_timeout_seconds,
        router.max_pending_requests,
    )


def test_the_router_finds_the_rendered_service_s_endpoints() -> None:
    """The EndpointSlice Kubernetes makes for the rendered Service (its ports named as the
    Service's, numbered as the pod's container ports) gives the router the engine's API port."""
    resource = _resource({"model": MODEL, "resources": H100})
    children = render_children(resource, SETTINGS, load_timeout_seconds=900)
    service = children.service
    container_ports = {
        port["name"]: port["containerPort"]
        for container in children.workload["spec"]["template"]["spec"]["containers"]
        for port in container.get("ports") or []
    }
    endpoint_slice = {
        "metadata": {
            "name": "llama-abcde",
            "namespace": "team",
            "labels": {"kubernetes.io/service-name": service["metadata"]["name"]},
        },
        "addressType": "IPv4",
        "ports": [
            {"name": port["name"], "port": container_ports[port["targetPort"]]}
            for port in service["spec"]["ports"]
        ],
        "endpoints": [{"addresses": ["10.0.0.7"], "conditions": {"ready": True}}],
    }
    table = RouteTable()
    catalog = Catalog(table)
    catalog.on_llmdeployment("SYNC", {"items": [_as_served(resource, _at_zero(resource))]})
    catalog.on_endpoint_slice("SYNC", {"items": [endpoint_slice]})
    assert catalog.ready
    api_port = container_ports[next(p for p in service["spec"]["ports"])["targetPort"]]
    assert table.backends["llama-8b"].ring.endpoints == (f"10.0.0.7:{api_port}",)

    # A starting pod (not ready yet): the router asks its agent the rendered readiness route.
    endpoint_slice["endpoints"] = [{"addresses": ["10.0.0.8"], "conditions": {"ready": False}}]
    catalog.on_endpoint_slice("MODIFIED", endpoint_slice)
    engine = next(c for c in children.workload["spec"]["template"]["spec"]["containers"])
    readiness = engine["readinessProbe"]["httpGet"]
    assert readiness["path"] == contract.AGENT_READY_PATH
    agent_port = container_ports[readiness["port"]]
    assert catalog.starting_agents(("team", "llama")) == {
        f"10.0.0.8:{api_port}": f"10.0.0.8:{agent_port}"
    }


def test_the_operator_reads_the_activity_the_router_writes() -> None:
    async def body() -> None:
        table = RouteTable()
        table.set("llama-8b", "team", "llama", ["10.0.0.7:8000"])
        router = Router(table)
        table.start("10.0.0.7:8000", ("team", "llama"))
        router.last_request[("team", "llama")] = 1_700_000_000.5
        router.holding.admit(("other", "sleepy"), 0.0, ScaleToZero())
        router.last_request[("other", "sleepy")] = 1_700_000_001.0
        answer = await router.list_activity(None)  # type: ignore[arg-type]
        assert isinstance(answer.body, bytes)
        read = idle.parse_activity(json.loads(answer.body))
        assert read == {
            ("team", "llama"): idle.Activity(in_flight=1, last_request_unix=1_700_000_000.5),
            ("other", "sleepy"): idle.Activity(held=1, last_request_unix=1_700_000_001.0),
        }

    asyncio.run(body())


def test_the_operator_lists_the_router_pods_by_the_label_the_chart_gives_them() -> None:
    assert idle_check.ROUTER_POD_LABEL == contract.ROUTER_POD_SELECTOR
    helpers = (ROOT / "helm" / "llmop" / "templates" / "_helpers.tpl").read_text()
    for key, value in contract.ROUTER_POD_LABELS.items():
        assert f"{key}: {value}\n" in helpers


def test_the_operator_finds_the_admin_port_by_the_name_the_router_contract_gives_it() -> None:
    """The chart names the port (tests/chart checks its rendered pod); a pod without one is read
    on the router's default admin port."""
    named = {"name": contract.ADMIN_PORT_NAME, "containerPort": 9100}
    pod = {"spec": {"containers": [{"ports": [{"name": "http", "containerPort": 8080}, named]}]}}
    assert idle.admin_port(pod) == 9100
    assert idle.admin_port({"spec": {"containers": [{"name": "router"}]}}) == (
        contract.DEFAULT_ADMIN_PORT
    )


def _derived(
    resource: LLMDeployment, pods: Sequence[dict[str, Any]], **observed: Any
) -> LLMDeploymentStatus:
    """The status the operator derives for `resource` serving these pods (all ready)."""
    seen = Observed(
        "llama",
        "team",
        generation=1,
        previous=LLMDeploymentStatus(),
        children={kinds.DEPLOYMENT: workload_status(len(pods), len(pods))},
        pods=[pod_summary(p) for p in pods],
        router=ROUTER,
        **observed,
    )
    return derive_status(seen, resource.spec, None, template_hash=None, now=T0)


def _slice_of(pods: Sequence[str]) -> dict[str, Any]:
    """The EndpointSlice of the CR's Service, one ready endpoint per pod (10.0.0.1, …)."""
    return {
        "metadata": {
            "name": "llama-abcde",
            "namespace": "team",
            "labels": {"kubernetes.io/service-name": "llama"},
        },
        "addressType": "IPv4",
        "ports": [{"name": contract.API_PORT_NAME, "port": 8000}],
        "endpoints": [
            {
                "addresses": [f"10.0.0.{i}"],
                "conditions": {"ready": True},
                "targetRef": {"kind": "Pod", "name": name, "namespace": "team"},
            }
            for i, name in enumerate(pods, start=1)
        ],
    }


def test_the_router_pins_continuations_to_the_revisions_the_operator_writes() -> None:
    """Pods rendered from two specs (a rollout to another model revision) → the operator's pod
    summaries and status → the router's endpoints, each with its pod's revision."""
    old_spec = {"model": {**MODEL, "revision": "r1"}, "engine": {"backend": "simulator"}}
    new_spec = {"model": {**MODEL, "revision": "r2"}, "engine": {"backend": "simulator"}}

    def pod(spec: dict[str, Any], name: str) -> dict[str, Any]:
        deployment = render_children(_resource(spec), SETTINGS, load_timeout_seconds=900).deployment
        assert deployment is not None
        template = deployment["spec"]["template"]
        return {"metadata": {**template["metadata"], "name": name}, "spec": template["spec"]}

    pods = [pod(old_spec, "llama-a-1"), pod(old_spec, "llama-a-2"), pod(new_spec, "llama-b-1")]
    resource = _resource(new_spec)
    status = _derived(resource, pods, routing=["llama-8b"])
    endpoint_slice = _slice_of([p["metadata"]["name"] for p in pods])
    table = RouteTable()
    catalog = Catalog(table)
    catalog.on_llmdeployment("SYNC", {"items": [_as_served(resource, status)]})
    catalog.on_endpoint_slice("SYNC", {"items": [endpoint_slice]})
    revisions = table.backends["llama-8b"].revisions
    assert revisions is not None
    assert revisions["10.0.0.1:8000"] == revisions["10.0.0.2:8000"] != revisions["10.0.0.3:8000"]
    assert set(revisions) == {"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}


def test_the_router_pins_an_adapters_streams_to_the_adapter_revision_the_operator_writes() -> None:
    """Agents' reports → the operator's `status.routing.adapterRevisions` → the router's pins
    for the adapter's name: its revision while every ready replica serves it, no target while
    a replica is still loading a new one; the base name keeps the model's pins."""
    sha = "d" * 40
    spec = {
        "model": MODEL,
        "engine": {"backend": "simulator"},
        "adapters": [{"name": "sql", "source": "hf://acme/sql", "revision": sha}],
    }
    resource = _resource(spec)
    deployment = render_children(resource, SETTINGS, load_timeout_seconds=900).deployment
    assert deployment is not None
    template = deployment["spec"]["template"]
    names = ("llama-a-1", "llama-a-2")
    pods = [
        {
            "metadata": {**template["metadata"], "name": name},
            "spec": template["spec"],
            "status": {"containerStatuses": [{"name": "engine", "ready": True}]},
        }
        for name in names
    ]
    endpoint_slice = _slice_of(names)

    def pins(*phases: str) -> tuple[dict[str, str] | None, dict[str, str] | None]:
        fleet = [
            AgentReading(name, ready=True, adapters=(PodAdapter("sql", phase, revision=sha),))
            for name, phase in zip(names, phases, strict=True)
        ]
        status = _derived(resource, pods, fleet=fleet, routing=["llama-8b", "sql"])
        table = RouteTable()
        catalog = Catalog(table)
        catalog.on_llmdeployment("SYNC", {"items": [_as_served(resource, status)]})
        catalog.on_endpoint_slice("SYNC", {"items": [endpoint_slice]})
        return table.backends["llama-8b"].revisions, table.backends["sql"].revisions

    base, adapter = pins("Loaded", "Loaded")
    assert base is not None
    assert adapter is not None
    assert set(adapter) == set(base) == {"10.0.0.1:8000", "10.0.0.2:8000"}
    assert all(sha in adapter[e] and base[e] in adapter[e] for e in base)
    base, adapter = pins("Loaded", "Loading")
    assert adapter == {}
    assert base is not None
    assert len(base) == 2


def test_the_router_prices_gpu_time_from_the_plan_the_operator_wrote() -> None:
    """With `--gpu-hour-price` and no `spec.router.pricing`, the router charges the GPU time a
    request takes at the plan's bandwidth: the keys it reads are the ones the operator writes."""
    resource = _resource({"model": MODEL, "resources": {**H100, "gpus": 2}})
    status = _at_zero(resource)
    served = _as_served(resource, status)
    plan = status.plan
    assert plan is not None
    assert plan.memory_bandwidth_gbs == 3350
    assert plan.active_weights_gib_per_gpu == pytest.approx(plan.weights_gib_per_gpu, abs=0.01)
    facts = plan_facts(served["status"])
    assert facts is not None
    assert (facts.batch, facts.kv_tokens, facts.batch_tokens) == (
        plan.max_num_seqs,
        plan.kv_cache_tokens,
        plan.max_num_batched_tokens,
    )
    assert plan.kv_bytes_per_token is not None
    assert facts.kv_seconds_per_token == pytest.approx(plan.kv_bytes_per_token / 3350e9)
    assert gpus_of(served["spec"]) == 2
    price = GpuTime.of(Decimal("2.50"), gpus_of(served["spec"]), facts)
    assert price is not None
    # Two GPUs at 2.50 an hour: 5 / 3600 of the currency a second.
    seconds = price.seconds(Usage(1000, 200))
    assert price.cost_picos(Usage(1000, 200)) == pytest.approx(seconds * 5 / 3600 * 1e12)
