"""spec.engine.pipelineParallelSize > 1 against the real API server and the real LeaderWorkerSet
controller v0.9.0 (every local cluster runs it): the real `llmop run` under deploy/rbac.yaml
applies one LeaderWorkerSet, the controller forms one group of pods per replica, the Service
selects the leaders only, and scaling the CR removes whole groups. A one-pod CR beside it is a
Deployment as before."""

from __future__ import annotations

import json
from typing import Any

import pytest

from support.cluster import wait_until
from support.manifests import simulator_spec as spec
from support.operator import Kit, OperatorProcess

pytestmark = pytest.mark.cluster

LWS_API = "leaderworkerset.x-k8s.io/v1"
LABEL = "leaderworkerset.sigs.k8s.io"


def pods(kit: Kit, namespace: str, selector: dict[str, str]) -> dict[str, dict[str, Any]]:
    text = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
    items = json.loads(
        kit.cluster.kubectl("get", "pods", "-n", namespace, "-l", text, "-o", "json").stdout
    )["items"]
    return {p["metadata"]["name"]: p for p in items if not p["metadata"].get("deletionTimestamp")}


def ready(pod: dict[str, Any]) -> bool:
    found = pod.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in found)


def test_pipeline_parallel_cr_runs_as_groups_of_pods(
    operator: OperatorProcess, kit: Kit, namespace: str
) -> None:
    kit.apply_llmd(namespace, "single", spec(replicas=1))
    kit.apply_llmd(
        namespace,
        "multi",
        spec(replicas=2, engine={"backend": "simulator", "pipelineParallelSize": 2}),
    )

    lws = wait_until(
        lambda: kit.get(LWS_API, "LeaderWorkerSet", namespace, "multi"),
        timeout=30,
        what="LeaderWorkerSet",
    )
    assert lws["spec"]["replicas"] == 2
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    (owner,) = lws["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("LLMDeployment", "multi")
    assert kit.deployment(namespace, "multi") is None

    # Two groups of two: leaders multi-0 and multi-1, workers multi-0-1 and multi-1-1.
    expected = {"multi-0", "multi-1", "multi-0-1", "multi-1-1"}
    group = wait_until(
        lambda: (
            (found := pods(kit, namespace, {f"{LABEL}/name": "multi"})).keys() == expected
            and all(map(ready, found.values()))
            and found
        ),
        timeout=40,
        what="2 groups of 2 pods Ready",
    )
    for name, pod in group.items():
        (engine,) = pod["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in engine["env"]}
        leader = name.count("-") == 1
        assert env["LLMOP_ROLE"] == ("leader" if leader else "worker")
        assert ("--headless" in engine["args"]) == (not leader)

    # The Service selects the two leaders only.
    service = kit.get("v1", "Service", namespace, "multi")
    assert service is not None
    assert service["spec"]["selector"][f"{LABEL}/worker-index"] == "0"
    assert pods(kit, namespace, service["spec"]["selector"]).keys() == {"multi-0", "multi-1"}

    # One replica fewer is one group fewer.
    kit.apply_llmd(
        namespace,
        "multi",
        spec(replicas=1, engine={"backend": "simulator", "pipelineParallelSize": 2}),
    )
    wait_until(
        lambda: pods(kit, namespace, {f"{LABEL}/name": "multi"}).keys() == {"multi-0", "multi-0-1"},
        timeout=30,
        what="group 1 removed",
    )

    # The one-pod CR beside it is a Deployment, as before, and Ready.
    kit.wait_condition(namespace, "single", "Ready", "True")
    deployment = kit.deployment(namespace, "single")
    assert deployment is not None
    assert kit.get(LWS_API, "LeaderWorkerSet", namespace, "single") is None
    assert operator.process is not None
    assert operator.process.poll() is None
    assert "Traceback" not in operator.log_path.read_text()
