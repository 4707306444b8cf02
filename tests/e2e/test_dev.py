"""`make dev`'s own script on the real node: the sample comes up healthy and answers through
the router that its endpoint names.

`e2e/dev.sh up` runs as `make dev` runs it, on this session's cluster instead of a cluster of its
own (LLMOP_DEV_KUBECONFIG: the machine has one real node, which this session's cluster holds). It
builds and imports the router image, starts the chart's router objects as pods, starts the
operator as a local process with the chart's settings, applies examples/, waits until every
sample is Ready with nothing wrong reported, and sends a completion through the router and
through the sample's Service. The test then reads the sample itself: Ready, not Degraded, its
endpoint the router's, and the KV cache its engines report equal to the planned one (no
CapacityShortfall). `e2e/dev.sh stop` removes what `up` added.

While this module runs, the session's host operator is stopped: two operators would both
reconcile every namespace."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.cluster import wait_until
from support.operator import REPO_ROOT
from support.realnode import RealCluster

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]

DEV_SH = REPO_ROOT / "e2e" / "dev.sh"
SAMPLE = REPO_ROOT / "examples" / "simulator-small.yaml"
ROUTER = "llmop-router"
ROUTER_NAMESPACE = "llmop-system"
DEV_UP_TIMEOUT_S = 420
"""`up` on a running cluster: the router image is reused or built (a cold build takes minutes),
then the router, the operator and the sample start (about a minute)."""


def _dev_sh(rc: RealCluster, action: str) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ,
        LLMOP_DEV_KUBECONFIG=str(rc.cluster.kubeconfig),
        VENV=str(Path(sys.executable).parent.parent),
        LLMOP_DEV_TIMEOUT="150",
    )
    return subprocess.run(
        [str(DEV_SH), action],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=DEV_UP_TIMEOUT_S,
    )


@pytest.fixture(scope="module")
def dev_up(real_cluster: RealCluster) -> Iterator[subprocess.CompletedProcess[str]]:
    rc = real_cluster
    sample = yaml.safe_load(SAMPLE.read_text())
    rc.operator.stop()
    try:
        result = _dev_sh(rc, "up")
        print(result.stdout[-4000:])
        print(result.stderr[-6000:])
        yield result
    finally:
        stopped = _dev_sh(rc, "stop")
        print("dev.sh stop:", stopped.returncode, stopped.stderr[-2000:])
        namespace, name = sample["metadata"]["namespace"], sample["metadata"]["name"]
        wait_until(
            lambda: not rc.pods(namespace, f"serving.llmop.dev/deployment={name}"),
            timeout=180,
            what="the sample's pods gone",
        )
        # The namespace stays: the session's host operator has its ServiceAccount (and Lease)
        # there, and deleting it would leave that operator with a revoked token (HTTP 401).
        rc.operator.start()


def _sample(rc: RealCluster) -> dict[str, Any]:
    sample = yaml.safe_load(SAMPLE.read_text())
    meta = sample["metadata"]
    out = rc.kubectl("get", "llmdeployment", "-n", meta["namespace"], meta["name"], "-o", "json")
    obj: dict[str, Any] = json.loads(out.stdout)
    return obj


def test_make_dev_brings_the_sample_up_healthy_behind_the_router(
    real_cluster: RealCluster, dev_up: subprocess.CompletedProcess[str]
) -> None:
    assert dev_up.returncode == 0, dev_up.stderr[-3000:]
    # Both completions were answered: first through the router, then through the Service.
    assert "One completion through the router" in dev_up.stdout
    answers = [json.loads(line) for line in dev_up.stdout.splitlines() if line.startswith("{")]
    assert len(answers) == 2, dev_up.stdout
    assert all(a["object"] == "text_completion" and a["choices"] for a in answers)

    obj = _sample(real_cluster)
    status = obj["status"]
    conditions = {c["type"]: c for c in status["conditions"]}
    assert status["observedGeneration"] == obj["metadata"]["generation"]
    assert conditions["Ready"]["status"] == "True", conditions["Ready"]
    assert conditions["Degraded"]["status"] == "False", conditions["Degraded"]
    assert conditions["Stalled"]["status"] == "False", conditions["Stalled"]
    assert conditions["CapacityPlanned"]["status"] == "True", conditions["CapacityPlanned"]
    assert conditions["CapacityPlanned"]["reason"] != "CapacityShortfall", conditions
    assert status["endpoint"] == f"http://{ROUTER}.{ROUTER_NAMESPACE}.svc:8080/v1"
    # The simulated engines hold the KV cache the planner computed for the sample's GPU.
    plan = status["plan"]
    assert plan["actual"]["kvCacheTokens"] == plan["kvCacheTokens"], plan


def test_make_dev_runs_the_router_as_the_chart_does(
    real_cluster: RealCluster, dev_up: subprocess.CompletedProcess[str]
) -> None:
    assert dev_up.returncode == 0
    routers = real_cluster.pods(ROUTER_NAMESPACE, "app.kubernetes.io/name=llmop-router")
    assert routers, "no router pod"
    for pod in routers:
        ready = {c["type"]: c["status"] for c in pod["status"].get("conditions") or []}
        assert ready.get("Ready") == "True", pod["status"]
