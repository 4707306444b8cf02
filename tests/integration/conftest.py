"""Fixtures for the operator's integration tests: the CRD installed, the RBAC of
`deploy/rbac.yaml`, and the real `llmop run` process running under that ServiceAccount (so a
verb missing from the RBAC manifest fails the tests), plus a small kit for reading the cluster.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from support.cluster import Cluster
from support.operator import (
    Kit,
    OperatorProcess,
    install_crd,
    operator_kubeconfig_for,
)


@pytest.fixture(scope="session")
def llmop_crd(kube_cluster: Cluster) -> Cluster:
    """The LLMDeployment CRD, installed from crds/ and Established."""
    install_crd(kube_cluster)
    return kube_cluster


@pytest.fixture(scope="session")
def operator_kubeconfig(llmop_crd: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A kubeconfig that authenticates as the operator's ServiceAccount from deploy/rbac.yaml."""
    return operator_kubeconfig_for(llmop_crd, tmp_path_factory.mktemp("operator"))


@pytest.fixture(scope="module")
def operator(
    operator_kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """One `llmop run` for the test module, watching all namespaces."""
    process = OperatorProcess(
        operator_kubeconfig, tmp_path_factory.mktemp("operator-log") / "operator.log"
    )
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="session")
def kit(llmop_crd: Cluster) -> Kit:
    return Kit(llmop_crd)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed and "operator" in getattr(item, "fixturenames", ()):
        process = item.funcargs.get("operator")  # type: ignore[attr-defined]
        if isinstance(process, OperatorProcess):
            report.sections.append(("operator log (tail)", process.log_tail()))
