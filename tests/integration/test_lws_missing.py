"""A multi-node LLMDeployment on a cluster that does not serve the LeaderWorkerSet API: Stalled
with reason LeaderWorkerSetMissing and the install hint, nothing applied; then recovered by the
group check once the API is served, without an operator restart.

In process against the real API server (no operator process: it would see the API served and
race the test). Every local cluster runs the LeaderWorkerSet controller, so "not served" is the
answer discovery would give, remembered in `Context.served` as the operator remembers it."""

from __future__ import annotations

from typing import Any

import pytest

from llmop import group_check, kinds
from llmop.config import OperatorConfig
from llmop.metrics import Metrics
from llmop.observed import parent_summary
from llmop.reconcile import Context, Hint, reconcile
from support.manifests import simulator_spec as spec
from support.operator import Kit

pytestmark = pytest.mark.cluster

LWS_API = "leaderworkerset.x-k8s.io/v1"


def conditions_of(cr: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (cr.get("status") or {}).get("conditions") or []}


def test_multi_node_cr_without_the_lws_api_stalls_then_recovers(kit: Kit, namespace: str) -> None:
    """In process, against the real API server: discovery's "not served" (remembered in
    `Context.served`, as on a cluster without the CRD) stalls a PP=2 CR with the install hint and
    creates nothing; once discovery is asked again and says served, the group check reconciles
    it without a restart."""
    ctx = Context(kube=kit.kube, config=OperatorConfig(), metrics=Metrics(), instance="test")
    body = parent_summary(
        kit.apply_llmd(
            namespace, "nolws", spec(engine={"backend": "simulator", "pipelineParallelSize": 2})
        )
    )
    ctx.parents = {(namespace, "nolws"): [body]}
    ctx.served[kinds.LEADER_WORKER_SET] = False

    assert reconcile(ctx, (namespace, "nolws"), Hint.parent(body)) == "stalled"
    stalled = conditions_of(kit.get_llmd(namespace, "nolws") or {})["Stalled"]
    assert (stalled["status"], stalled["reason"]) == ("True", "LeaderWorkerSetMissing")
    assert "kubectl apply --server-side" in stalled["message"]
    assert kit.get(LWS_API, "LeaderWorkerSet", namespace, "nolws") is None
    assert kit.get("v1", "Service", namespace, "nolws") is None

    ctx.served.pop(kinds.LEADER_WORKER_SET)  # the CRD "arrives": discovery is asked again
    assert group_check.check(ctx) >= 1
    assert kit.get(LWS_API, "LeaderWorkerSet", namespace, "nolws") is not None
    assert conditions_of(kit.get_llmd(namespace, "nolws") or {})["Stalled"]["status"] == "False"
