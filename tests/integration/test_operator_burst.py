"""Ready never flaps: through a burst of 200 LLMDeployments, every CR is watched, and once it is
Ready at a generation it must stay Ready while its pods stay ready — zero True → False → True
transitions, zero dips. (kstatus clients such as Argo CD, Flux and `kubectl wait` read every dip
as a regression.)"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pytest

from support.cluster import wait_until
from support.readiness import ReadyWatch

if TYPE_CHECKING:
    from conftest import Kit, OperatorProcess

pytestmark = pytest.mark.cluster

COUNT = 200
HOLD_SECONDS = 15


def spec() -> dict[str, Any]:
    # No GPUs: 200 pods fit the fake nodes; kwok marks each pod ready as soon as it is bound.
    return {
        "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
        "engine": {"backend": "simulator"},
        "resources": {"gpus": 0},
        "replicas": 1,
    }


def test_ready_never_flaps_through_a_burst(
    operator: OperatorProcess, kit: Kit, namespace: str
) -> None:
    watch = ReadyWatch(namespace, kit.cluster.api_client()).start()
    try:
        time.sleep(1)  # the watch is established before the first CR exists
        for index in range(COUNT):
            kit.apply_llmd(namespace, f"b{index:03d}", spec())
        wait_until(lambda: watch.ready_count() == COUNT, timeout=300, interval=1, what="all Ready")
        time.sleep(HOLD_SECONDS)  # pods stay ready: so must every CR
    finally:
        watch.stop()
    assert (watch.flaps, watch.dips, sorted(watch.flapped)) == (0, 0, [])
    assert watch.ready_count() == COUNT
