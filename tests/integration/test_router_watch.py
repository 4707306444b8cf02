"""The router's watch against the real API server: `llmop-router serve --kubeconfig` lists and
watches LLMDeployments and EndpointSlices and keeps its table in step — a routed CR appears with
its ready endpoints, an endpoint that turns unready or terminating leaves, a CR with routing off
or deleted goes, and a model with no ready endpoint answers 503 with Retry-After. (The proxying
itself is tested on real sockets in tests/router/; traffic through real pods is the e2e's.)"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.cluster import Cluster, wait_until
from support.router import RouterUrls, get_json, router_process

pytestmark = pytest.mark.cluster


@pytest.fixture
def router(llmop_crd: Cluster, namespace: str, tmp_path: Path) -> Iterator[RouterUrls]:
    """The router watching this test's namespace only (other tests' CRs live in the same
    cluster), the way the chart runs it with `operator.watchNamespaces`."""
    with router_process(
        llmop_crd.kubeconfig, tmp_path / "router.log", ("--namespaces", namespace)
    ) as urls:
        yield urls


def apply(cluster: Cluster, obj: dict[str, Any]) -> None:
    cluster.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(obj))


def llmd(namespace: str, name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "serving.llmop.dev/v1alpha1",
        "kind": "LLMDeployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
            "engine": {"backend": "simulator"},
            **spec,
        },
    }


def endpoint_slice(
    namespace: str, service: str, endpoints: list[tuple[str, dict[str, bool]]]
) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{service}-test",
            "namespace": namespace,
            "labels": {
                "kubernetes.io/service-name": service,
                "endpointslice.kubernetes.io/managed-by": "llmop-tests",
            },
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
        "endpoints": [{"addresses": [a], "conditions": c} for a, c in endpoints],
    }


def routes(router: RouterUrls) -> dict[str, Any] | None:
    """The router's table (on its admin port) once it is complete."""
    status, body = get_json(f"{router.admin}/routes")
    return body["models"] if status == 200 and body and body["ready"] else None


def test_the_table_follows_crs_and_endpoint_slices(
    llmop_crd: Cluster, namespace: str, router: RouterUrls
) -> None:
    cluster = llmop_crd
    ready = {"ready": True, "serving": True, "terminating": False}
    apply(cluster, llmd(namespace, "alpha"))
    apply(
        cluster,
        llmd(
            namespace,
            "beta",
            model={"name": "Qwen/Qwen2.5-0.5B-Instruct", "servedName": "beta-chat"},
        ),
    )
    apply(
        cluster,
        endpoint_slice(namespace, "alpha", [("10.244.7.21", ready), ("10.244.7.22", ready)]),
    )

    def alpha_endpoints() -> list[str] | None:
        table = routes(router)
        return sorted(table["alpha"]["endpoints"]) if table and "alpha" in table else None

    assert wait_until(alpha_endpoints, timeout=30, what="alpha routed") == [
        "10.244.7.21:8000",
        "10.244.7.22:8000",
    ]
    status, models = get_json(f"{router.url}/v1/models")
    assert status == 200
    listed = {m["id"]: m["owned_by"] for m in models["data"]}
    assert listed == {"alpha": f"{namespace}/alpha", "beta-chat": f"{namespace}/beta"}
    status, _ = get_json(f"{router.url}/readyz")
    assert status == 200

    # One endpoint turns unready, the other starts terminating while still ready: both leave.
    apply(
        cluster,
        endpoint_slice(
            namespace,
            "alpha",
            [
                ("10.244.7.21", {"ready": False}),
                ("10.244.7.22", {"ready": True, "terminating": True}),
            ],
        ),
    )
    wait_until(lambda: alpha_endpoints() == [], timeout=30, what="alpha's endpoints gone")
    request = urllib.request.Request(
        f"{router.url}/v1/chat/completions",
        data=json.dumps(
            {"model": "alpha", "messages": [{"role": "user", "content": "hi"}]}
        ).encode(),
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=5)
    assert refused.value.code == 503
    assert refused.value.headers["Retry-After"]
    assert f"{namespace}/alpha" in json.load(refused.value)["error"]["message"]

    # Routing off for beta, alpha deleted: both leave the table.
    apply(cluster, llmd(namespace, "beta", router={"enabled": False}))
    cluster.kubectl("delete", "llmdeployment", "alpha", "-n", namespace)
    wait_until(lambda: routes(router) == {}, timeout=30, what="an empty table")
