"""The router's prices follow the LLMDeployment watch: set, changed, removed on delete, and a
relist of a scope replaces that scope's prices (a CR deleted during a watch gap is never seen
as DELETED, only as missing from the next list)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from prometheus_client import CollectorRegistry

from llmop_router.cli import prices_of
from llmop_router.gateway import Gateway, GpuHourPrice
from llmop_router.gpu_price import GpuTime
from llmop_router.metrics import GatewayMetrics
from llmop_router.quota import Price
from llmop_router.store import Local
from support.manifests import PLAN_8B_ON_H100


def cr(namespace: str, name: str, per_million: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if per_million is not None:
        spec["router"] = {
            "pricing": {"inputPerMillion": per_million, "outputPerMillion": per_million}
        }
    return {"metadata": {"namespace": namespace, "name": name}, "spec": spec}


def listed(namespace: str | None, *items: dict[str, Any]) -> dict[str, Any]:
    return {"namespace": namespace, "items": list(items)}


def test_prices_follow_events_and_a_relist_replaces_its_scope() -> None:
    gateway = Gateway(Local(), GatewayMetrics(CollectorRegistry()))
    prices_of(gateway, "SYNC", listed("a", cr("a", "x", "1"), cr("a", "y", "2")))
    prices_of(gateway, "SYNC", listed("b", cr("b", "z", "3")))
    assert set(gateway.prices) == {("a", "x"), ("a", "y"), ("b", "z")}

    prices_of(gateway, "MODIFIED", cr("a", "x", None))
    prices_of(gateway, "DELETED", cr("b", "z", "3"))
    assert set(gateway.prices) == {("a", "y")}

    prices_of(gateway, "ADDED", cr("b", "w", "4"))
    prices_of(gateway, "SYNC", listed("a", cr("a", "v", "5")))  # y went during a gap
    assert set(gateway.prices) == {("a", "v"), ("b", "w")}, "namespace b kept"

    prices_of(gateway, "SYNC", listed(None, cr("c", "u", "6")))  # every namespace
    assert set(gateway.prices) == {("c", "u")}


def test_a_relist_of_llmdeployments_keeps_the_external_models_prices() -> None:
    """Both watches write the gateway's prices: an LLMDeployment relist (at the router's start,
    after a watch gap) replaced every price of its scope, the external models' too, so an
    external fallback was metered free until its object next changed."""
    gateway = Gateway(Local(), GatewayMetrics(CollectorRegistry()))
    external = ("llmop-system", "LLMExternalModel/managed")
    gateway.set_price(external, {"inputPerMillion": "0.15", "outputPerMillion": "0.60"})
    prices_of(gateway, "SYNC", listed(None, cr("a", "x", "1")))
    prices_of(gateway, "SYNC", listed("llmop-system", cr("llmop-system", "y", "2")))
    assert set(gateway.prices) == {external, ("a", "x"), ("llmop-system", "y")}


def test_with_a_gpu_hour_price_a_cr_without_prices_is_priced_from_its_plan() -> None:
    """The watch carries the CR's status: a plan with its GPU's bandwidth prices the CR in GPU
    time (of `spec.resources.gpus`), a plan without one (or none yet) leaves it free, a later
    status gives it a price, and `spec.router.pricing` always wins."""
    plan = PLAN_8B_ON_H100
    gateway = Gateway(Local(), GatewayMetrics(CollectorRegistry()))
    gateway.gpu_hour = GpuHourPrice(Decimal("2.49"), "USD")
    planned = {**cr("a", "x", None), "status": {"plan": plan}}
    planned["spec"]["resources"] = {"gpus": 4}
    prices_of(gateway, "SYNC", listed("a", planned, cr("a", "y", None), cr("a", "z", "1")))
    price, currency = gateway.prices[("a", "x")]
    assert isinstance(price, GpuTime)
    assert currency == "USD"
    assert price.picos_per_second == Decimal("2.49") * 4 * 10**12 / 3600
    assert ("a", "y") not in gateway.prices, "no plan yet: free"
    assert isinstance(gateway.prices[("a", "z")][0], Price)

    prices_of(gateway, "MODIFIED", {**cr("a", "y", None), "status": {"plan": plan}})
    assert isinstance(gateway.prices[("a", "y")][0], GpuTime)
    no_bandwidth = {**plan, "memoryBandwidthGBs": None}
    prices_of(gateway, "MODIFIED", {**cr("a", "y", None), "status": {"plan": no_bandwidth}})
    assert ("a", "y") not in gateway.prices

    gateway.gpu_hour = None
    prices_of(gateway, "MODIFIED", planned)
    assert ("a", "x") not in gateway.prices, "no GPU-hour price: free, as before"
