"""Model names have owners (issue 49 item 5), against the real API server: the real `llmop run`
(under deploy/rbac.yaml, told where the router runs and which namespaces may serve through it,
as the chart tells it) decides who owns a served name, and a real `llmop-router serve` routes by
that decision. Two namespaces claim one name: the first owns it, the second is Degraded
`ModelNameConflict`; the first deleted and recreated (a GitOps replace) keeps the name, and the
router never hands it to the second meanwhile, nor to a newcomer claiming it alone while it
stays reserved. A namespace outside `servingNamespaces` is not routed and is told why
(`NamespaceNotServed`)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from support.cluster import Cluster, apply_crd, create_namespace, wait_until
from support.manifests import simulator_spec as spec
from support.operator import OPERATOR_NAMESPACE, Kit, OperatorProcess, conditions
from support.router import ROUTER_NAME, RouterUrls, get_json, router_deployment, router_process

pytestmark = pytest.mark.cluster

ROUTER = ROUTER_NAME
RECORD = "llmop-served-names"


@pytest.fixture
def namespaces(llmop_crd: Cluster, namespace: str) -> Iterator[tuple[str, str, str]]:
    """(first, second, outside): two namespaces that may serve, one that may not."""
    second, outside = create_namespace(llmop_crd, "test"), create_namespace(llmop_crd, "test")
    try:
        yield namespace, second, outside
    finally:
        for name in (second, outside):
            llmop_crd.kubectl("delete", "namespace", name, "--wait=false", check=False)


def degraded(kit: Kit, namespace: str, name: str) -> tuple[str, str, str]:
    found = conditions(kit.get_llmd(namespace, name)).get("Degraded") or {}
    return (str(found.get("status")), str(found.get("reason")), str(found.get("message")))


def owned(kit: Kit, namespace: str, name: str) -> list[str] | None:
    body = kit.get_llmd(namespace, name) or {}
    routing = (body.get("status") or {}).get("routing")
    return None if routing is None else list(routing.get("servedNames") or [])


def table(router: RouterUrls) -> dict[str, Any] | None:
    status, body = get_json(f"{router.admin}/routes")
    return body["models"] if status == 200 and body and body["ready"] else None


def routed_to(router: RouterUrls, model: str) -> str | None:
    """The namespace the router sends `model` to now (None: not routed)."""
    entry = (table(router) or {}).get(model)
    return None if entry is None else str(entry["namespace"])


@contextmanager
def sampled(router: RouterUrls, model: str) -> Iterator[set[str | None]]:
    """Every namespace the router sent `model` to (None: not routed) while the block runs,
    read every 0.05 s."""
    seen: set[str | None] = set()
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            seen.add(routed_to(router, model))
            stop.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield seen
    finally:
        stop.set()
        sampler.join()
    seen.add(routed_to(router, model))


def test_a_name_keeps_its_owner_across_a_recreate(
    llmop_crd: Cluster,
    operator_kubeconfig: Path,
    kit: Kit,
    namespaces: tuple[str, str, str],
    tmp_path: Path,
) -> None:
    first, second, outside = namespaces
    watched = ",".join(namespaces)
    model = f"shared-{first}"
    kit.kube.apply(router_deployment(first), field_manager="llmop-test")
    operator = OperatorProcess(
        operator_kubeconfig,
        tmp_path / "operator.log",
        extra_env={
            "LLMOP_ROUTER": f"{first}/{ROUTER}:8080",
            "LLMOP_SERVING_NAMESPACES": f"{first},{second}",
            "LLMOP_NAME_GRACE_SECONDS": "600",
        },
    )
    operator.start()
    args = (
        *("--namespaces", watched, "--serving-namespaces", f"{first},{second}"),
        "--await-name-decisions",  # as the chart runs it
    )
    try:
        with router_process(llmop_crd.kubeconfig, tmp_path / "router.log", args) as router:
            named = spec(replicas=0, model={"name": spec()["model"]["name"], "servedName": model})
            kit.apply_llmd(first, "chat", named)
            wait_until(lambda: owned(kit, first, "chat") == [model], timeout=30, what="owned")
            kit.apply_llmd(second, "chat", named)
            conflict = wait_until(
                lambda: (d := degraded(kit, second, "chat"))[1] == "ModelNameConflict" and d,
                timeout=30,
                what="the second CR Degraded ModelNameConflict",
            )
            assert f"LLMDeployment {first}/chat" in conflict[2]
            assert "spec.model.servedName" in conflict[2]
            assert owned(kit, second, "chat") == []
            assert wait_until(lambda: routed_to(router, model), timeout=30) == first

            # Watch the router's table from here on: the name must never go to `second`.
            with sampled(router, model) as seen:
                llmop_crd.kubectl("delete", "llmdeployment", "chat", "-n", first, "--wait=true")
                # Longer than two decisions: the owner is gone, the name stays reserved to it.
                wait_until(
                    lambda: "which is gone" in degraded(kit, second, "chat")[2],
                    timeout=30,
                    what="the conflict names the reservation",
                )
                assert routed_to(router, model) is None
                kit.apply_llmd(first, "chat", named)
                wait_until(
                    lambda: owned(kit, first, "chat") == [model], timeout=30, what="taken back"
                )
                wait_until(lambda: routed_to(router, model) == first, timeout=30, what="routed")
            assert second not in seen, seen
            assert degraded(kit, second, "chat")[1] == "ModelNameConflict"
            record = json.loads(
                llmop_crd.kubectl(
                    "get", "configmap", RECORD, "-n", OPERATOR_NAMESPACE, "-o", "json"
                ).stdout
            )
            owners = json.loads(record["data"]["owners.json"])
            assert owners[model] == {"namespace": first, "name": "chat"}

            # The owner deleted with no other claimant left, then a newcomer claims the name:
            # it is never routed, not even before the operator's first status of it (when no
            # claimant's status decides the name).
            llmop_crd.kubectl("delete", "llmdeployment", "chat", "-n", second, "--wait=true")
            llmop_crd.kubectl("delete", "llmdeployment", "chat", "-n", first, "--wait=true")
            wait_until(lambda: routed_to(router, model) is None, timeout=30, what="unrouted")
            with sampled(router, model) as seen:
                kit.apply_llmd(second, "late", named)
                wait_until(
                    lambda: "which is gone" in degraded(kit, second, "late")[2],
                    timeout=30,
                    what="the newcomer told the name is reserved",
                )
                time.sleep(1.0)
            assert second not in seen, seen
            assert owned(kit, second, "late") == []

            # A namespace outside servingNamespaces: not routed, and told why.
            kit.apply_llmd(outside, "other", spec(replicas=0))
            reason = wait_until(
                lambda: (d := degraded(kit, outside, "other"))[1] == "NamespaceNotServed" and d,
                timeout=30,
                what="Degraded NamespaceNotServed",
            )
            assert "router.servingNamespaces" in reason[2]
            assert "other" not in (table(router) or {})
            assert owned(kit, outside, "other") == []
    finally:
        operator.stop()


EXTERNAL_CRD = (
    Path(__file__).resolve().parents[2] / "crds" / "serving.llmop.dev_llmexternalmodels.yaml"
)


def test_a_fallback_to_an_external_model_that_does_not_exist_is_reported_until_it_does(
    llmop_crd: Cluster, operator_kubeconfig: Path, kit: Kit, namespace: str, tmp_path: Path
) -> None:
    """The operator lists the LLMExternalModels beside the router (its own namespace, under
    deploy/rbac.yaml's Role): a CR falling back to one that is not there is Degraded
    `FallbackNotRouted` naming it and the fix; creating it clears that."""
    apply_crd(llmop_crd, EXTERNAL_CRD, "llmexternalmodels.serving.llmop.dev")
    external = f"managed-{namespace}"
    kit.kube.apply(router_deployment(OPERATOR_NAMESPACE), field_manager="llmop-test")
    operator = OperatorProcess(
        operator_kubeconfig,
        tmp_path / "operator.log",
        extra_env={"LLMOP_ROUTER": f"{OPERATOR_NAMESPACE}/{ROUTER}:8080"},
    )
    operator.start()
    try:
        falls_back = spec(replicas=0, router={"fallback": [{"externalModel": external}]})
        kit.apply_llmd(namespace, "chat", falls_back)
        reported = wait_until(
            lambda: (d := degraded(kit, namespace, "chat"))[1] == "FallbackNotRouted" and d,
            timeout=60,
            what="Degraded FallbackNotRouted",
        )
        assert (
            f"no LLMExternalModel {external!r} in namespace {OPERATOR_NAMESPACE!r}" in reported[2]
        )
        assert f"kubectl get llmexternalmodels -n {OPERATOR_NAMESPACE}" in reported[2]
        kit.kube.apply(
            {
                "apiVersion": "serving.llmop.dev/v1alpha1",
                "kind": "LLMExternalModel",
                "metadata": {"name": external, "namespace": OPERATOR_NAMESPACE},
                "spec": {"baseURL": "http://127.0.0.1:9/v1", "model": "upstream"},
            },
            field_manager="llmop-test",
        )
        wait_until(
            lambda: degraded(kit, namespace, "chat")[1] != "FallbackNotRouted",
            timeout=60,
            what="FallbackNotRouted cleared once the external model exists",
        )
    finally:
        operator.stop()
        llmop_crd.kubectl(
            "delete", "llmexternalmodel", external, "-n", OPERATOR_NAMESPACE, check=False
        )
        llmop_crd.kubectl(
            "delete", "deployment", ROUTER, "-n", OPERATOR_NAMESPACE, "--wait=false", check=False
        )
