"""A restarted operator against already-reconciled LLMDeployments writes nothing: no child is
re-applied with a change and no status is rewritten (counted through resourceVersions) — also
after its first round of agent reads (`llmop.fleet`), which touches no pod either."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pytest

from support.cluster import wait_until

if TYPE_CHECKING:
    from support.operator import Kit, OperatorProcess

pytestmark = pytest.mark.cluster

COUNT = 50
API_VERSION = "serving.llmop.dev/v1alpha1"
KINDS = [
    (API_VERSION, "LLMDeployment"),
    ("apps/v1", "Deployment"),
    ("v1", "Service"),
    ("v1", "Pod"),
]


def spec() -> dict[str, Any]:
    # No GPUs (simulator): 50 pods fit on the fake nodes without exhausting GPU capacity.
    return {
        "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
        "engine": {"backend": "simulator"},
        "resources": {"gpus": 0},
        "replicas": 1,
    }


def versions(kit: Kit, namespace: str) -> dict[tuple[str, str], str]:
    found = {}
    for api_version, kind in KINDS:
        for item in kit.kube.list(api_version, kind, namespace):
            found[kind, item["metadata"]["name"]] = item["metadata"]["resourceVersion"]
    return found


def all_ready(kit: Kit, namespace: str) -> bool:
    items = kit.kube.list(API_VERSION, "LLMDeployment", namespace)
    ready = [
        item
        for item in items
        if any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in (item.get("status") or {}).get("conditions") or []
        )
    ]
    return len(ready) == COUNT


def quiet(operator: OperatorProcess, seconds: float) -> bool:
    """True once the operator's reconcile counter stopped moving for `seconds`."""
    before = operator.metric("llmop_reconciles_total")
    time.sleep(seconds)
    return operator.metric("llmop_reconciles_total") == before


def test_restart_against_reconciled_objects_makes_no_writes(
    operator: OperatorProcess, kit: Kit, namespace: str
) -> None:
    for index in range(COUNT):
        kit.apply_llmd(namespace, f"m{index:02d}", spec())
    wait_until(lambda: all_ready(kit, namespace), timeout=120, interval=1, what="all Ready")
    wait_until(lambda: quiet(operator, 2), timeout=60, interval=0, what="operator idle")
    before = versions(kit, namespace)
    assert len(before) == 4 * COUNT

    operator.stop()
    operator.start()
    wait_until(
        lambda: operator.metric("llmop_reconciles_total", trigger="parent") >= COUNT,
        timeout=60,
        interval=0.5,
        what="resume reconciles",
    )
    wait_until(lambda: quiet(operator, 2), timeout=60, interval=0, what="operator idle")
    # The agent reader's first round (one interval after startup) re-derives every parent.
    wait_until(
        lambda: operator.metric("llmop_reconciles_total", trigger="fleet") >= COUNT,
        timeout=60,
        interval=0.5,
        what="the first round of agent reads",
    )
    wait_until(lambda: quiet(operator, 2), timeout=60, interval=0, what="operator idle")

    after = versions(kit, namespace)
    changed = sorted(key for key in before if before[key] != after.get(key))
    assert changed == []
    assert operator.metric("llmop_status_writes_total") == 0
    assert operator.metric("llmop_managed_objects", kind="LLMDeployment") >= COUNT
