"""The chart's cluster-admin guardrails (values `guardrails.*`, templates/guardrails.yaml) as the
real kube-apiserver enforces them: LLMDeployments with a foreign image, a denied engine flag, one
of the operator's own variables or a LoadBalancer Service are refused with a message naming the
field and the fix; an allowed one is created; the router's ServiceAccount may wake a workload
(scale 0 -> 1) and nothing else."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from support.cluster import Cluster, create_namespace, wait_until
from support.manifests import llmd_manifest, simulator_spec

pytestmark = pytest.mark.cluster

CHART = Path(__file__).resolve().parents[2] / "helm" / "llmop"
RELEASE = "grd"
VALUES = {"guardrails": {"allowedImagePrefixes": ["registry.example.com/llm/"]}}


def chart_objects(namespace: str) -> list[dict[str, Any]]:
    """The policies and bindings, and the router's RBAC (the scale case impersonates it)."""
    files = helm.Chart.load(str(CHART)).render(VALUES, name=RELEASE, namespace=namespace)
    wanted = {
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
    }
    objects = []
    for path in ("templates/guardrails.yaml", "templates/router.yaml"):
        for doc in yaml.safe_load_all(files[f"llmop/{path}"]):
            if doc and doc["kind"] in wanted:
                objects.append(doc)
    return objects


@pytest.fixture(scope="module")
def guarded(llmop_crd: Cluster) -> Iterator[tuple[Cluster, str]]:
    cluster = llmop_crd
    namespace = create_namespace(cluster, "guard")
    objects = chart_objects(namespace)
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects))

    def enforced() -> bool:
        # A policy is picked up asynchronously (the API server's policy informer).
        probe = attempt(cluster, namespace, "probe", engine={"args": ["--trust-remote-code"]})
        return probe.returncode != 0

    wait_until(enforced, timeout=30, what="the guardrails policy to be enforced")
    try:
        yield cluster, namespace
    finally:
        cluster.kubectl("delete", "-f", "-", "--wait=false", input=yaml.safe_dump_all(objects))
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def attempt(cluster: Cluster, namespace: str, name: str, **spec: Any) -> Any:
    manifest = llmd_manifest(namespace, name, simulator_spec(**spec))
    return cluster.kubectl(
        "create", "--dry-run=server", "-f", "-", check=False, input=json.dumps(manifest)
    )


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        (
            {"engine": {"backend": "simulator", "image": "docker.io/evil/engine:1"}},
            ["spec.engine.image", "docker.io/evil/engine:1", "registry.example.com/llm/"],
        ),
        (
            {"engine": {"backend": "simulator", "args": ["--trust-remote-code"]}},
            ["spec.engine.args", "--trust-remote-code", "remove it"],
        ),
        (
            {"engine": {"backend": "simulator", "args": ["--trust-remote-code=true"]}},
            ["spec.engine.args", "--trust-remote-code=true"],
        ),
        (
            {
                "engine": {
                    "backend": "simulator",
                    "env": [{"name": "LLMOP_STALL_SECONDS", "value": "1"}],
                }
            },
            ["spec.engine.env", "LLMOP_STALL_SECONDS", "operator sets its own"],
        ),
        (
            {"engine": {"backend": "simulator", "env": [{"name": "HF_TOKEN", "value": "x"}]}},
            ["spec.engine.env", "HF_TOKEN", "spec.model.tokenSecretRef"],
        ),
        (
            {"service": {"type": "LoadBalancer"}},
            ["spec.service.type", "LoadBalancer", "ClusterIP"],
        ),
    ],
    ids=["image", "trust-remote-code", "trust-remote-code=value", "llmop-env", "hf-token", "lb"],
)
def test_the_api_server_refuses_what_the_guardrails_deny(
    guarded: tuple[Cluster, str], spec: dict[str, Any], says: list[str]
) -> None:
    cluster, namespace = guarded
    refused = attempt(cluster, namespace, "denied", **spec)
    assert refused.returncode != 0, refused.stdout
    assert "ValidatingAdmissionPolicy" in refused.stderr, refused.stderr
    for part in says:
        assert part in refused.stderr, refused.stderr


def test_an_allowed_deployment_is_created_and_unchanged_specs_stay_writable(
    guarded: tuple[Cluster, str],
) -> None:
    cluster, namespace = guarded
    allowed = {
        "engine": {
            "backend": "simulator",
            "image": "registry.example.com/llm/engine-sim:1",
            "args": ["--max-num-seqs=8"],
            "env": [{"name": "VLLM_CPU_KVCACHE_SPACE", "value": "4"}],
        }
    }
    manifest = llmd_manifest(namespace, "allowed", simulator_spec(**allowed))
    cluster.kubectl("create", "-f", "-", input=json.dumps(manifest))
    # A write that leaves the spec alone (the operator's annotations, labels) is not re-checked.
    cluster.kubectl("label", "llmdeployment", "allowed", "-n", namespace, "team=a")


def test_the_router_may_only_wake_a_workload(guarded: tuple[Cluster, str]) -> None:
    cluster, namespace = guarded
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "engine", "namespace": namespace},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": "engine"}},
            "template": {
                "metadata": {"labels": {"app": "engine"}},
                "spec": {"containers": [{"name": "e", "image": "registry.example.com/x"}]},
            },
        },
    }
    cluster.kubectl("create", "-f", "-", input=json.dumps(deployment))
    router = f"system:serviceaccount:{namespace}:{RELEASE}-llmop-router"

    def scale(replicas: int, *, user: str | None = router, dry_run: bool = False) -> Any:
        as_user = [f"--as={user}"] if user else []
        dry = ["--dry-run=server"] if dry_run else []
        return cluster.kubectl(
            *as_user,
            *dry,
            "patch",
            "deployment",
            "engine",
            "-n",
            namespace,
            "--subresource=scale",
            "--type=merge",
            "-p",
            json.dumps({"spec": {"replicas": replicas}}),
            check=False,
        )

    # The router's RBAC and the scale policy are each picked up asynchronously by the API
    # server (its authorizer's and its policy informer's caches): the module's fixture waited
    # for the LLMDeployment policy only. A dry run goes through both, changing nothing.
    wait_until(
        lambda: "may only wake a workload" in scale(3, dry_run=True).stderr,
        timeout=30,
        what="the router's RBAC and the scale policy to be in force",
    )
    too_many = scale(3)
    assert too_many.returncode != 0
    assert "may only wake a workload" in too_many.stderr, too_many.stderr
    assert "from 0 to 3" in too_many.stderr
    woke = scale(1)
    assert woke.returncode == 0, woke.stderr
    down = scale(0)
    assert down.returncode != 0
    assert "from 1 to 0" in down.stderr, down.stderr
    # Anyone else (the operator, the HPA, a person) is not the policy's concern.
    assert scale(0, user=None).returncode == 0
