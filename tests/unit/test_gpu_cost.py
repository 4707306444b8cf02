"""What the GPUs behind each routed model cost per hour (`--gpu-hour-price`), reported as
`llmop_gateway_gpu_cost_per_hour` from the route table at each scrape: GPUs per pod times the
pods of a replica times the ready endpoints, counted once per CR (on its served name, not again
on its adapters'); a model at zero costs nothing."""

from __future__ import annotations

import argparse
from decimal import Decimal
from typing import Any

import pytest

from llmop_router.app import Router
from llmop_router.cli import MAX_GPU_HOUR_PRICE, _gateway, _gpu_hour_price
from llmop_router.discovery import Catalog, claim_of, gpus_of
from llmop_router.routes import RouteTable


def llmd(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "team",
            "creationTimestamp": "2026-12-01T00:00:00Z",
        },
        "spec": {"model": {"name": "org/model"}, **spec},
    }


def endpoint_slice(service: str, *addresses: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"{service}-x",
            "namespace": "team",
            "labels": {"kubernetes.io/service-name": service},
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8000}],
        "endpoints": [{"addresses": [a], "conditions": {"ready": True}} for a in addresses],
    }


def test_gpus_behind_one_endpoint() -> None:
    assert gpus_of({}) == 1  # the CRD's default
    assert gpus_of({"resources": {"gpus": 8}}) == 8
    assert gpus_of({"resources": {"gpus": 8}, "engine": {"pipelineParallelSize": 2}}) == 16
    assert gpus_of({"resources": {"gpus": 0}}) == 0  # the simulator, vLLM's CPU build
    assert gpus_of({"resources": {"gpus": "8"}}) == 0
    assert gpus_of({"resources": {"gpus": True}}) == 0
    claim = claim_of(llmd("big", resources={"gpus": 4}))
    assert claim is not None
    assert claim.gpus == 4


def sample(router: Router, model: str, currency: str = "USD") -> float | None:
    return router.metrics.registry.get_sample_value(
        "llmop_gateway_gpu_cost_per_hour", {"model": model, "currency": currency}
    )


def gateway_args(price: Decimal | None, currency: str = "USD") -> argparse.Namespace:
    return argparse.Namespace(
        store="",
        replicas=1,
        gpu_hour_price=price,
        gpu_hour_currency=currency,
        engine_readings_seconds=0.5,
    )


def test_the_cost_follows_the_ready_endpoints_and_counts_a_cr_once() -> None:
    table = RouteTable()
    router = Router(table)
    _gateway(gateway_args(Decimal("2.50"), "EUR"), router)
    catalog = Catalog(table)
    adapters = [{"name": "sql", "source": "hf://org/sql-lora"}]
    catalog.on_llmdeployment(
        "SYNC",
        {
            "items": [
                llmd("big", resources={"gpus": 4}, adapters=adapters),
                llmd("group", resources={"gpus": 2}, engine={"pipelineParallelSize": 2}),
                llmd("cpu", resources={"gpus": 0}),
            ]
        },
    )
    catalog.on_endpoint_slice(
        "SYNC",
        {
            "items": [
                endpoint_slice("big", "10.0.0.1", "10.0.0.2"),
                endpoint_slice("group", "10.0.1.1"),
                endpoint_slice("cpu", "10.0.2.1"),
            ]
        },
    )
    assert sample(router, "big", "EUR") == 2 * 4 * 2.5
    assert sample(router, "sql", "EUR") is None  # the adapter runs on big's GPUs
    assert sample(router, "group", "EUR") == 1 * 4 * 2.5
    assert sample(router, "cpu", "EUR") is None
    # A replica going unready stops costing; a CR at zero costs nothing.
    catalog.on_endpoint_slice("MODIFIED", endpoint_slice("big", "10.0.0.1"))
    assert sample(router, "big", "EUR") == 4 * 2.5
    catalog.on_endpoint_slice("MODIFIED", endpoint_slice("big"))
    assert sample(router, "big", "EUR") is None


def test_without_a_price_nothing_is_reported() -> None:
    table = RouteTable()
    table.set("llama", "team", "llama", ["10.0.0.1:8000"], gpus=1)
    router = Router(table)
    _gateway(gateway_args(None), router)
    assert sample(router, "llama") is None


@pytest.mark.parametrize("text", ["2,49", "-1", "NaN", "Infinity", "abc", "1e9"])
def test_a_price_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="not a price"):
        _gpu_hour_price(text)


def test_a_price_is_exact() -> None:
    assert _gpu_hour_price("2.49") == Decimal("2.49")
    assert _gpu_hour_price(str(MAX_GPU_HOUR_PRICE)) == MAX_GPU_HOUR_PRICE
