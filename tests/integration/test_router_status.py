"""A routed LLMDeployment's status names the installed router, and says when the router cannot
serve it: the real `llmop run` (under deploy/rbac.yaml) told where the router runs, as the chart
tells it (`LLMOP_ROUTER`), against the real API server. The router here is a Deployment on kwok's
nodes: the operator only reads its ready replicas."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from support.cluster import wait_until
from support.manifests import simulator_spec as spec
from support.operator import Kit, OperatorProcess, conditions
from support.router import ROUTER_NAME, router_deployment

pytestmark = pytest.mark.cluster

ROUTER = ROUTER_NAME


@pytest.fixture
def routed_operator(
    operator_kubeconfig: Path, tmp_path: Path, namespace: str
) -> Iterator[OperatorProcess]:
    process = OperatorProcess(
        operator_kubeconfig,
        tmp_path / "operator.log",
        extra_env={"LLMOP_ROUTER": f"{namespace}/{ROUTER}:8080"},
    )
    process.start()
    try:
        yield process
    finally:
        process.stop()


def degraded(kit: Kit, namespace: str, name: str) -> tuple[str, str]:
    found = conditions(kit.get_llmd(namespace, name)).get("Degraded") or {}
    return (str(found.get("status")), str(found.get("reason")))


def test_routed_status_names_the_router_and_follows_its_readiness(
    routed_operator: OperatorProcess, kit: Kit, namespace: str
) -> None:
    router_url = f"http://{ROUTER}.{namespace}.svc:8080/v1"
    kit.kube.apply(router_deployment(namespace, 0), field_manager="llmop-test")
    kit.apply_llmd(namespace, "routed", spec(replicas=1))
    kit.apply_llmd(namespace, "direct", spec(replicas=1, router={"enabled": False}))
    kit.wait_condition(namespace, "routed", "Ready", "True")
    kit.wait_condition(namespace, "direct", "Ready", "True")

    # No ready router pod: the routed model is Degraded (still Ready: its Service serves it).
    wait_until(
        lambda: degraded(kit, namespace, "routed") == ("True", "RouterUnavailable"),
        timeout=30,
        what="routed Degraded RouterUnavailable",
    )
    routed = kit.get_llmd(namespace, "routed")
    assert routed is not None
    assert routed["status"]["endpoint"] == router_url
    assert conditions(routed)["Ready"]["status"] == "True"
    direct = kit.get_llmd(namespace, "direct")
    assert direct is not None
    assert direct["status"]["endpoint"] == f"http://direct.{namespace}.svc:8000/v1"
    assert degraded(kit, namespace, "direct")[0] == "False"

    # A router pod becomes ready: the next check clears it, with no change to the CR.
    kit.kube.apply(router_deployment(namespace, 1), field_manager="llmop-test")
    wait_until(
        lambda: degraded(kit, namespace, "routed")[0] == "False",
        timeout=30,
        what="routed no longer Degraded",
    )
    assert "the router" in routed_operator.log_path.read_text()
