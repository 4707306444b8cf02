"""llmop-router in front of real engine pods on the real node: the same code as the router image,
run here as a host process with the cluster's kubeconfig. Pods on this cluster reach the API
server too (tests/e2e/test_helm_install.py runs the chart's router pods and kills them under load);
a host process is simply quicker to start and to read the log of. It watches the real
EndpointSlices the cluster's controllers write, keeps each conversation on one pod (whose prefix
cache then serves its later turns), and loses nothing while the pods roll or scale down: streams
that outlive a leaving pod's drain budget are continued on a pod that stays (request migration)."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmop import names
from support.cluster import wait_until
from support.realnode import (
    BackgroundLoad,
    RealCluster,
    post_json,
    real_node_spec,
    summary,
    wait_rolled_out,
)
from support.router import RouterUrls, router_process

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]

REPLICAS = 3
SHORT_DRAIN = {"drainSeconds": 4, "endpointPropagationSeconds": 3}
"""Shorter than the long streams of the rollout: those are handed over, not waited for."""


@pytest.fixture
def router(real_cluster: RealCluster, tmp_path: Path) -> Iterator[RouterUrls]:
    log = tmp_path / "router.log"
    try:
        with router_process(real_cluster.cluster.kubeconfig, log) as urls:
            yield urls
    finally:
        print(log.read_text()[-3000:])


def _continued_migrations(router: RouterUrls) -> float:
    """Streams the router continued on another pod after their engine failed or drained."""
    with urllib.request.urlopen(f"{router.admin}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("llmop_router_migrations_total{") and 'outcome="continued"' in line
    )


def _routes(router: RouterUrls) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(f"{router.admin}/routes", timeout=5) as answer:
            body: dict[str, Any] = json.load(answer)
    except OSError:
        return {}
    return body["models"] if body.get("ready") else {}


SAMPLE = re.compile(r"^(vllm:[a-z_]+)\{[^}]*\} ([0-9.e+-]+)$", re.MULTILINE)


def _pod_counters(endpoints: list[str]) -> dict[str, dict[str, float]]:
    """vLLM counters of each engine pod, read from the host through the node's bridge."""
    out = {}
    for endpoint in endpoints:
        with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=5) as answer:
            text = answer.read().decode()
        out[endpoint] = {m.group(1): float(m.group(2)) for m in SAMPLE.finditer(text)}
    return out


def _table_lists_only(router: RouterUrls, name: str, pods: list[dict[str, Any]]) -> bool | None:
    """True once the router's endpoints of `name` are exactly the non-terminating `pods`."""
    live = sorted(
        f"{p['status']['podIP']}:8000"
        for p in pods
        if p["metadata"].get("deletionTimestamp") is None
    )
    return sorted(_routes(router).get(name, {}).get("endpoints", {})) == live or None


def _roll_under_load(real_cluster: RealCluster, ns: str, name: str, router: RouterUrls) -> None:
    """A rolling update under streaming load through the router: nothing lost. Beside the
    short streams, long ones (1,200 tokens, ~24 s) outlive the leaving pods' drain budget (4 s):
    the engine aborts them when it ends, and the router continues each on a pod that stays
    (request migration), so they too end whole."""
    kit = real_cluster.kit
    migrated_before = _continued_migrations(router)
    load = BackgroundLoad(router.url, model=name, concurrency=8, duration=600).start()
    # Eight long streams at a time: each leaving pod is serving some when its drain ends.
    long = BackgroundLoad(router.url, model=name, concurrency=8, duration=600, max_tokens=1200)
    long.start()
    time.sleep(5)
    kit.apply_llmd(
        ns,
        name,
        real_node_spec(
            replicas=REPLICAS, rollout=SHORT_DRAIN, engine={"args": ["--sim-decode-ms", "21"]}
        ),
    )
    kit.wait_condition(ns, name, "Ready", "True", timeout=300)
    wait_rolled_out(real_cluster.cluster, ns, name, REPLICAS)
    time.sleep(5)
    result, long_result = load.stop(), long.stop()
    migrated = _continued_migrations(router) - migrated_before
    print(f"router rollout: {summary(result)}")
    print(
        f"router rollout, streams longer than the drain: {summary(long_result)}, {migrated:.0f} "
        "continued on another pod"
    )
    assert result.total >= 50, summary(result)
    assert result.lost == 0, summary(result)
    assert long_result.total >= 8, summary(long_result)
    assert long_result.lost == 0, summary(long_result)
    assert migrated >= 1, "no stream outlived its pod's drain: the long streams proved nothing"


def test_conversations_stay_on_one_pod_and_a_rollout_and_a_scale_down_lose_nothing(
    real_cluster: RealCluster, e2e_namespace: str, router: RouterUrls
) -> None:
    ns, name = e2e_namespace, "routed"
    kit = real_cluster.kit
    kit.apply_llmd(ns, name, real_node_spec(replicas=REPLICAS, rollout=SHORT_DRAIN))
    kit.wait_condition(ns, name, "Ready", "True", timeout=240)
    pods = real_cluster.pods(ns, names.selector_string(name))
    assert len(pods) == REPLICAS
    # The router learns of each pod on its own schedule: Ready on the CR may come before the
    # last pod is in its table (CI: 2 of 3 listed at the first look).
    wait_until(
        lambda: _table_lists_only(router, name, pods),
        timeout=60,
        what="the router's table lists every pod",
    )
    endpoints = sorted(_routes(router).get(name, {}).get("endpoints", {}))

    # Six conversations of four turns, one after another: each lands on one pod, which serves
    # its later turns from its prefix cache.
    system = "You are the llmop test assistant. Answer briefly and precisely. " * 20
    homes = []
    for conversation in range(6):
        before = _pod_counters(endpoints)
        messages = [{"role": "system", "content": system}]
        for turn in range(4):
            messages.append(
                {
                    "role": "user",
                    "content": f"conversation {conversation}, turn {turn}: " + "why? " * 60,
                }
            )
            code, body = post_json(
                f"{router.url}/v1/chat/completions",
                {"model": name, "messages": messages, "max_tokens": 8},
            )
            assert code == 200, body
            messages.append(
                {"role": "assistant", "content": body["choices"][0]["message"]["content"]}
            )
        after = _pod_counters(endpoints)
        served = {
            e: after[e].get("vllm:request_success_total", 0)
            - before[e].get("vllm:request_success_total", 0)
            for e in endpoints
        }
        # The agents' deep probes also count as requests; they are one-token pings, few and idle.
        (home,) = [e for e, n in served.items() if n >= 4]
        hits = (
            after[home]["vllm:prefix_cache_hits_total"]
            - before[home]["vllm:prefix_cache_hits_total"]
        )
        assert hits > 0, (home, after[home])
        homes.append(home)
    print(f"\nconversation homes: {homes}")
    assert len(set(homes)) > 1, "six conversations all on one pod: the key does not spread"

    _roll_under_load(real_cluster, ns, name, router)
    new_pods = real_cluster.pods(ns, names.selector_string(name))
    wait_until(
        lambda: _table_lists_only(router, name, new_pods),
        timeout=60,
        what="the router's table follows the new pods",
    )

    # A scale-down under streaming load through the router: the leaving pods drop out of the
    # table as they start terminating and finish what they serve; nothing lost.
    load = BackgroundLoad(router.url, model=name, concurrency=8, duration=600).start()
    time.sleep(3)
    started = time.monotonic()
    kit.apply_llmd(ns, name, real_node_spec(replicas=1, engine={"args": ["--sim-decode-ms", "21"]}))

    def one_left() -> list[dict[str, Any]] | None:
        pods = real_cluster.pods(ns, names.selector_string(name))
        return pods if len(pods) == 1 else None

    remaining = wait_until(
        one_left,
        timeout=120,
        what="one engine pod left",
    )
    scaled = time.monotonic() - started
    time.sleep(2)
    result = load.stop()
    print(f"router scale-down 3 → 1 (pods gone in {scaled:.1f}s): {summary(result)}")
    assert result.total >= 20, summary(result)
    assert result.lost == 0, summary(result)
    wait_until(
        lambda: _table_lists_only(router, name, remaining),
        timeout=30,
        what="the router's table lists only the remaining pod",
    )
