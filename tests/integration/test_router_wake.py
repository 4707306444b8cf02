"""The router waking a CR at zero against the real API server: `llmop-router serve --kubeconfig`
holds requests for a CR with `autoscaling.minReplicas: 0` whose Ready condition says
`ScaledToZero` and sets its Deployment's scale subresource from 0 to 1 exactly once however many
requests arrive; a later episode finds the scale at 1 and writes nothing; a hand-set
`spec.replicas: 0` (also Ready/ScaledToZero) is answered 503 and its Deployment never touched.
A multi-node CR (pipelineParallelSize 2) is woken through its LeaderWorkerSet's scale. (Release
and the answers once an engine is ready are tests/router's; the operator's side is
test_operator_scale_to_zero.py.)"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from integration.test_lws_controller import leader_worker_set
from integration.test_router_watch import apply, llmd, routes
from support.cluster import Cluster, wait_until
from support.router import RouterUrls, get_json, router_process

pytestmark = pytest.mark.cluster

HELD = 10
CLIENT_TIMEOUT = 3.0
"""The clients give up while held (the default hold timeout is 300 s): their requests leave."""


@pytest.fixture
def router(llmop_crd: Cluster, namespace: str, tmp_path: Path) -> Iterator[RouterUrls]:
    with router_process(
        llmop_crd.kubeconfig, tmp_path / "router.log", ("--namespaces", namespace)
    ) as urls:
        yield urls


def deployment(namespace: str, name: str) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "engine", "image": "registry.invalid/engine"}]},
            },
        },
    }


def set_ready(cluster: Cluster, namespace: str, name: str, reason: str) -> None:
    condition = {
        "type": "Ready",
        "status": "True",
        "reason": reason,
        "message": "set by the test",
        "lastTransitionTime": "2026-11-26T10:00:00Z",
    }
    cluster.kubectl(
        *("patch", "llmdeployment", name, "-n", namespace, "--subresource=status"),
        *("--type=merge", "-p", json.dumps({"status": {"conditions": [condition]}})),
    )


def scale_of(cluster: Cluster, namespace: str, name: str) -> tuple[int, int]:
    """The Deployment's (spec.replicas, metadata.generation): one write to spec is one
    generation."""
    found = json.loads(
        cluster.kubectl("get", "deployment", name, "-n", namespace, "-o", "json").stdout
    )
    return found["spec"].get("replicas", 0), found["metadata"]["generation"]


async def send_all(url: str, model: str, count: int) -> list[int | str]:
    """`count` requests at once (half streaming); each one's status, or "gave up"."""
    timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT)
    async with aiohttp.ClientSession(timeout=timeout) as client:

        async def one(i: int) -> int | str:
            payload = {
                "model": model,
                "stream": i % 2 == 0,
                "messages": [{"role": "user", "content": f"hello {i}"}],
            }
            try:
                async with client.post(f"{url}/v1/chat/completions", json=payload) as answer:
                    await answer.read()
                    return answer.status
            except TimeoutError:
                return "gave up"

        return list(await asyncio.gather(*(one(i) for i in range(count))))


def metric(router: RouterUrls, line_start: str) -> str | None:
    with urllib.request.urlopen(f"{router.admin}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return next((line for line in text.splitlines() if line.startswith(line_start)), None)


def test_a_scaled_to_zero_cr_is_woken_once_and_a_hand_set_zero_never(
    llmop_crd: Cluster, namespace: str, router: RouterUrls
) -> None:
    cluster = llmop_crd
    apply(cluster, llmd(namespace, "sleepy", autoscaling={"minReplicas": 0, "maxReplicas": 2}))
    apply(cluster, llmd(namespace, "manual", replicas=0))
    for name in ("sleepy", "manual"):
        apply(cluster, deployment(namespace, name))
    set_ready(cluster, namespace, "sleepy", "ScaledToZero")
    # A fixed `spec.replicas: 0` reads ScaledToZero too; only minReplicas 0 may be woken.
    set_ready(cluster, namespace, "manual", "ScaledToZero")

    def at_zero() -> dict[str, bool] | None:
        table = routes(router) or {}
        if table.keys() != {"sleepy", "manual"} or not table["sleepy"]["scaledToZero"]:
            return None
        return {name: entry["scaledToZero"] for name, entry in table.items()}

    assert wait_until(at_zero, timeout=30, what="both CRs routed, with their status") == {
        "sleepy": True,
        "manual": False,
    }
    assert scale_of(cluster, namespace, "sleepy") == (0, 1)

    answers = asyncio.run(send_all(router.url, "sleepy", HELD))
    assert answers == ["gave up"] * HELD  # held, not refused
    assert scale_of(cluster, namespace, "sleepy") == (1, 2)  # one write for ten requests
    wake_line = (
        f'llmop_router_wakes_total{{llmdeployment="sleepy",llmdeployment_namespace="{namespace}"}}'
    )
    assert metric(router, wake_line) == f"{wake_line} 1.0"

    # The held requests left with their clients: the episode ended. A new one finds the scale
    # at 1 (the pod is still starting) and writes nothing.
    wait_until(
        lambda: all(
            m["held"] == 0 for m in get_json(f"{router.admin}/llmop/activity")[1]["models"]
        ),
        timeout=10,
        what="no request held",
    )
    assert asyncio.run(send_all(router.url, "sleepy", 1)) == ["gave up"]
    assert scale_of(cluster, namespace, "sleepy") == (1, 2)
    assert metric(router, wake_line) == f"{wake_line} 1.0"
    held_line = (
        f'llmop_router_held_total{{llmdeployment="sleepy",llmdeployment_namespace="{namespace}"}}'
    )
    assert metric(router, held_line) == f"{held_line} {HELD + 1}.0"

    # A hand-set zero: 503 at once, and the Deployment stays as its owner set it.
    assert asyncio.run(send_all(router.url, "manual", 4)) == [503] * 4
    assert scale_of(cluster, namespace, "manual") == (0, 1)
    _, activity = get_json(f"{router.admin}/llmop/activity")
    seen = {m["name"]: m for m in activity["models"]}
    assert seen.keys() == {"sleepy", "manual"}
    assert all(m["namespace"] == namespace for m in seen.values())
    assert all(m["inFlight"] == 0 for m in seen.values())
    assert all(isinstance(m["lastRequestUnix"], float) for m in seen.values())


def test_a_multi_node_cr_is_woken_through_its_leaderworkerset(
    llmop_crd: Cluster, namespace: str, router: RouterUrls
) -> None:
    cluster = llmop_crd
    lws = leader_worker_set(0)
    lws["metadata"] = {"name": "deep", "namespace": namespace}
    apply(cluster, lws)
    engine = {"backend": "simulator", "pipelineParallelSize": 2}
    autoscaling = {"minReplicas": 0, "maxReplicas": 2}
    apply(cluster, llmd(namespace, "deep", engine=engine, autoscaling=autoscaling))
    set_ready(cluster, namespace, "deep", "ScaledToZero")
    wait_until(
        lambda: (routes(router) or {}).get("deep", {}).get("scaledToZero"),
        timeout=30,
        what="deep routed at zero",
    )

    def lws_replicas() -> int:
        found = cluster.kubectl("get", "leaderworkerset", "deep", "-n", namespace, "-o", "json")
        return int(json.loads(found.stdout)["spec"].get("replicas", 0))

    assert lws_replicas() == 0
    assert asyncio.run(send_all(router.url, "deep", 4)) == ["gave up"] * 4
    assert lws_replicas() == 1
    line = f'llmop_router_wakes_total{{llmdeployment="deep",llmdeployment_namespace="{namespace}"}}'
    assert metric(router, line) == f"{line} 1.0"
