"""The e2e suite's cluster: the local control plane plus this machine's REAL node.

`real_cluster` (session) starts a private cluster with LLMOP_REAL_NODE=on, so the engine pods
run as real containers under a real kubelet (probes, preStop hooks, grace periods) and clients
reach them through a Service's ClusterIP via a real kube-proxy. The operator is the real
`llmop run` process under the RBAC of deploy/rbac.yaml, as in the integration tests.

The metrics pipeline (Prometheus + prometheus-adapter) is not started with the cluster: the
`metrics` modules ask for it through `metrics_pipeline`, and support.metrics runs them last, so
`make test` builds its binaries beside the session's other tests instead of before all of them.

Where this host cannot run a real node (not Linux, not root, no overlayfs), every e2e test is
skipped with the reason and the terminal summary says in capitals that the promises were NOT
tested: never a silent green.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from llmop.kube import KubeError
from support.cluster import create_namespace, start_metrics_pipeline
from support.hub_standin import HubRepo, HubStandin, synthetic_model
from support.operator import REPO_ROOT
from support.realnode import RealCluster, operator_on_real_node, real_node_unavailable

IMAGES_PY = REPO_ROOT / "e2e" / "images" / "images.py"
# The images the e2e pods run; built (or reused from the cache) before the node starts, which
# imports them into its containerd.
E2E_IMAGES = ("pause", "engine-sim")

_skipped_because: list[str] = []

HUB_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
NAMESPACE_PODS_GONE_SECONDS = 180
"""A test's pods get this long to terminate (drain included) after its namespace is deleted."""
"""The model the e2e specs name; the hub stand-in serves it (spec.model.cache downloads it)."""
HUB_RATE_BYTES_PER_S = 8 << 20
"""Throttle per file body, so a download lasts long enough to watch its progress."""


def host_address() -> str:
    """This machine's primary address: pods on the real node reach the host through it."""
    out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, check=True)
    return out.stdout.split()[0]


@pytest.fixture(scope="session")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubStandin]:
    """The model hub stand-in on all addresses: the operator's pre-flight and the download
    pods on the real node both talk to it (no internet in the test)."""
    model = synthetic_model(tmp_path_factory.mktemp("hub-model"), 160 << 20, shards=2)
    standin = HubStandin(
        [HubRepo(HUB_MODEL, model)],
        rate_bytes_per_s=HUB_RATE_BYTES_PER_S,
        host="0.0.0.0",
    )
    with standin:
        yield standin


def _build_images() -> None:
    # In the open (stderr inherited), so a cold build's progress shows in the CI log.
    result = subprocess.run(
        [sys.executable, str(IMAGES_PY), "build", *E2E_IMAGES],
        stdout=subprocess.DEVNULL,
        check=False,
        timeout=45 * 60,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{IMAGES_PY} build {' '.join(E2E_IMAGES)} failed ({result.returncode})")


@pytest.fixture(scope="session")
def real_cluster(
    tmp_path_factory: pytest.TempPathFactory, hub: HubStandin
) -> Iterator[RealCluster]:
    """A private cluster with the real node joined, the CRD installed and the operator running."""
    why = real_node_unavailable()
    if why is not None:
        _skipped_because.append(why)
        pytest.skip(f"REAL NODE UNAVAILABLE ({why}): the e2e promises were NOT tested")
    _build_images()
    port = hub.server.server_address[1]
    hub_env = {"LLMOP_HUB_ENDPOINT": f"http://{host_address()}:{port}"}
    workdir = tmp_path_factory.mktemp("e2e-operator")
    with operator_on_real_node("e2e", workdir, hub_env, metrics="off") as rc:
        yield rc


@pytest.fixture(scope="session")
def metrics_pipeline(real_cluster: RealCluster) -> None:
    """The real cluster's metrics pipeline, started on first use (the modules that read it
    find it beside the kubeconfig)."""
    start_metrics_pipeline(real_cluster.cluster)


@pytest.fixture
def e2e_namespace(real_cluster: RealCluster) -> Iterator[str]:
    """A fresh namespace; deleted afterwards, and its pods waited for so they free the node's
    CPU before the next test. Not the namespace object itself: the namespace controller
    finishes it on its own retry schedule, which cost ~34 s per test while the pods were long
    gone."""
    name = create_namespace(real_cluster.cluster, "e2e")
    try:
        yield name
    finally:
        real_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
        deadline = time.monotonic() + NAMESPACE_PODS_GONE_SECONDS
        while time.monotonic() < deadline:
            try:
                if not real_cluster.kit.kube.list("v1", "Pod", name):
                    break
            except KubeError:
                pass
            time.sleep(0.5)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _skipped_because:
        terminalreporter.write_sep(
            "!",
            f"E2E SKIPPED: NO REAL NODE ({_skipped_because[0]}) — PROMISES NOT TESTED",
            red=True,
        )


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        rc = item.funcargs.get("real_cluster")  # type: ignore[attr-defined]
        if isinstance(rc, RealCluster):
            report.sections.append(("operator log (tail)", rc.operator.log_tail()))
            pods = rc.kubectl("get", "pods", "-A", "-o", "wide", check=False)
            report.sections.append(("pods", pods.stdout + pods.stderr))
