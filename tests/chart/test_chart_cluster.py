"""helm/llmop against the real API server of the local cluster.

- Every rendered case (defaults and the non-default matrix) passes a server-side dry run, so the
  API server's own validation (schemas, the CRD's structural schema, RBAC) accepts it.
- A real `helm install` (Helm v4 SDK) into a fresh namespace yields the operator Deployment,
  its RBAC and the CRD owned by the release.
- The real operator (`llmop run`), authenticated as the chart's ServiceAccount, drives
  LLMDeployments to Ready / progressing / Stalled; the Argo CD health check classifies the live
  objects. With LLMOP_CAPTURE_FIXTURES=1 those objects are written to tests/fixtures/.
- With `crds.enabled: false` on a cluster whose CRD was installed apart, `helm install --wait`
  succeeds and the router, as the release's router ServiceAccount, is Ready.
"""

from __future__ import annotations

import copy
import json
import os
import secrets
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml
from chart_helpers import CHART_DIR, MATRIX, REPO_ROOT, operator_deployment, render, render_yaml

from gitops.argocd_lua import FIXTURES, health
from llmop.kube import Kube
from support.cluster import Cluster, wait_until
from support.helm_release import CRD_NAME, adopt_crd
from support.manifests import llmd_manifest, open_crd
from support.operator import OperatorProcess, install_crd
from support.router import router_process

pytestmark = pytest.mark.cluster

CASES = {"default": {}, **MATRIX}
API_VERSION = "serving.llmop.dev/v1alpha1"
MONITORING_KINDS = ("ServiceMonitor", "PodMonitor", "PrometheusRule")
CAPTURE = os.environ.get("LLMOP_CAPTURE_FIXTURES", "") == "1"


def _stub_crd(kind: str) -> dict[str, Any]:
    return open_crd("monitoring.coreos.com", kind, labels={"llmop.dev/test-stub": "true"})


@pytest.fixture(scope="module")
def monitoring_crds(kube_cluster: Cluster) -> Iterator[None]:
    """Stand-ins for the prometheus-operator CRDs (not available offline): they let the API
    server accept ServiceMonitor/PodMonitor/PrometheusRule objects, but check no field of them.
    Removed afterwards unless they existed before."""
    created = []
    for kind in MONITORING_KINDS:
        name = f"{kind.lower()}s.monitoring.coreos.com"
        if kube_cluster.kubectl("get", "crd", name, check=False).returncode == 0:
            continue
        kube_cluster.kubectl("apply", "-f", "-", input=json.dumps(_stub_crd(kind)))
        created.append(name)
    for name in created:
        kube_cluster.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")
    yield
    if created:
        kube_cluster.kubectl("delete", "crd", *created, "--wait=false", check=False)


def _in_namespace(values: dict[str, Any], namespace: str) -> dict[str, Any]:
    """The case's values with watched namespaces that exist on this cluster."""
    out = copy.deepcopy(values)
    operator = out.get("operator", {})
    if operator.get("watchNamespaces"):
        operator["watchNamespaces"] = [namespace]
    return out


@pytest.mark.parametrize("case", CASES)
def test_rendered_case_is_accepted_by_the_api_server(
    case: str, kube_cluster: Cluster, namespace: str, monitoring_crds: None
) -> None:
    values = _in_namespace(CASES[case], namespace)
    release = f"dry-{secrets.token_hex(3)}-llmop"
    docs = render(values, release=release, namespace=namespace)
    result = kube_cluster.kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager=llmop-chart-test",
        "--dry-run=server",
        "-f",
        "-",
        input=render_yaml(values, release=release, namespace=namespace),
    )
    accepted = [line for line in result.stdout.splitlines() if line.endswith("(server dry run)")]
    assert len(accepted) == len(docs), result.stdout


def test_dry_run_does_reject_a_broken_object(kube_cluster: Cluster, namespace: str) -> None:
    """Guard for the dry-run test itself: a broken object really is refused."""
    docs = render(release="dry-broken-llmop", namespace=namespace)
    deployment = operator_deployment(docs)
    deployment["spec"]["replicas"] = "one"
    result = kube_cluster.kubectl(
        "apply",
        "--server-side",
        "--dry-run=server",
        "-f",
        "-",
        input=yaml.safe_dump(deployment),
        check=False,
    )
    assert result.returncode != 0
    assert "replicas" in result.stderr


# --- a real install --------------------------------------------------------------------------


class Release:
    """A Helm release of the chart installed into its own namespace."""

    def __init__(self, cluster: Cluster, name: str, namespace: str, info: dict[str, Any]) -> None:
        self.cluster = cluster
        self.name = name
        self.namespace = namespace
        self.info = info


def remove_release(cluster: Cluster, config: helm.Config, name: str, namespace: str) -> None:
    """Uninstall release `name` (a failed install leaves a failed release behind: that too) and
    delete its namespace without waiting."""
    try:
        config.uninstall(name)
    except helm.HelmError as error:
        print(f"helm uninstall {name}: {error}", file=sys.stderr)
    cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


@pytest.fixture(scope="module")
def release(kube_cluster: Cluster) -> Iterator[Release]:
    name = f"llmop-{secrets.token_hex(3)}"
    namespace = f"chart-{secrets.token_hex(3)}"
    kube_cluster.kubectl("create", "namespace", namespace)
    adopt_crd(kube_cluster, name, namespace)
    with helm.Config(kubeconfig_path=kube_cluster.kubeconfig, namespace=namespace) as config:
        try:
            info = config.install(
                CHART_DIR,
                name,
                {"operator": {"logFormat": "text"}},
                namespace=namespace,
                wait="watcher",
                timeout=180,
            )
            yield Release(kube_cluster, name, namespace, info)
        finally:
            # crds.keep=true: the CRD (and every LLMDeployment of other tests) survives this.
            remove_release(kube_cluster, config, name, namespace)


def test_install_yields_the_operator_deployment_rbac_and_crd(release: Release) -> None:
    assert release.info["status"] == "deployed"
    cluster = release.cluster
    deployment = json.loads(
        cluster.kubectl(
            "get", "deployment", release.name, "-n", release.namespace, "-o", "json"
        ).stdout
    )
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    # kwok plays the kubelet: the pods are scheduled and reported running, no container runs.
    assert deployment["status"].get("availableReplicas") == 2
    crd = json.loads(cluster.kubectl("get", "crd", CRD_NAME, "-o", "json").stdout)
    annotations = crd["metadata"]["annotations"]
    assert annotations["meta.helm.sh/release-name"] == release.name
    assert annotations["helm.sh/resource-policy"] == "keep"
    established = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert established["Established"] == "True"
    for kind, name in (
        ("clusterrole", release.name),
        ("clusterrole", f"{release.name}-framework"),
        ("clusterrolebinding", release.name),
        ("serviceaccount", release.name),
        ("service", f"{release.name}-metrics"),
        ("role", f"{release.name}-leader-election"),
        ("rolebinding", f"{release.name}-leader-election"),
        ("poddisruptionbudget", release.name),
        # The router, beside the operator: its own account, read-only role, Service and PDB.
        ("deployment", f"{release.name}-router"),
        ("service", f"{release.name}-router"),
        ("serviceaccount", f"{release.name}-router"),
        ("clusterrole", f"{release.name}-router"),
        ("clusterrolebinding", f"{release.name}-router"),
        ("poddisruptionbudget", f"{release.name}-router"),
    ):
        namespaced = kind.startswith(("serv", "role", "pod", "deploy"))
        args = ["get", kind, name] + (["-n", release.namespace] if namespaced else [])
        assert cluster.kubectl(*args, check=False).returncode == 0, (kind, name)


def _service_account_kubeconfig(release: Release, path: Path) -> Path:
    cluster = release.cluster
    token = cluster.kubectl(
        "create", "token", release.name, "-n", release.namespace, "--duration=1h"
    ).stdout.strip()
    config = json.loads(
        cluster.kubectl("config", "view", "--raw", "--minify", "--flatten", "-o", "json").stdout
    )
    config["users"][0]["user"] = {"token": token}
    path.write_text(json.dumps(config))
    return path


def _example(namespace: str) -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load((REPO_ROOT / "examples/simulator-small.yaml").read_text())
    body["metadata"]["namespace"] = namespace
    return body


def _conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


def _settled(kube: Kube, namespace: str, name: str, type_: str, status: str) -> Any:
    def probe() -> dict[str, Any] | None:
        obj = kube.read(API_VERSION, "LLMDeployment", namespace, name)
        if obj is None or (obj.get("status") or {}).get("observedGeneration") != obj[
            "metadata"
        ].get("generation"):
            return None
        found = _conditions(obj).get(type_)
        return obj if found is not None and found["status"] == status else None

    return wait_until(probe, timeout=90, interval=0.5, what=f"{name} {type_}={status}")


def _sanitized(obj: dict[str, Any]) -> dict[str, Any]:
    """A captured object without per-run noise (managed fields, uid, random namespace)."""
    out = copy.deepcopy(obj)
    metadata = out["metadata"]
    for key in ("managedFields", "uid", "resourceVersion"):
        metadata.pop(key, None)
    metadata["namespace"] = "default"
    endpoint = (out.get("status") or {}).get("endpoint")
    if endpoint:
        out["status"]["endpoint"] = endpoint.replace(
            f".{obj['metadata']['namespace']}.", ".default."
        )
    return out


def test_operator_under_chart_rbac_drives_statuses_argo_cd_classifies(
    release: Release, tmp_path: Path
) -> None:
    cluster = release.cluster
    app_namespace = f"apps-{secrets.token_hex(3)}"
    cluster.kubectl("create", "namespace", app_namespace)
    kube = Kube.connect(kubeconfig=cluster.kubeconfig)
    operator = OperatorProcess(
        _service_account_kubeconfig(release, tmp_path / "kubeconfig"),
        tmp_path / "operator.log",
        namespace=release.namespace,
    )
    operator.start()
    try:
        kube.apply(_example(app_namespace), field_manager="llmop-chart-test")
        # A GPU product no node has: the planner is happy, the pods stay Pending.
        kube.apply(
            llmd_manifest(
                app_namespace,
                "pending",
                {
                    "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
                    "engine": {"backend": "simulator"},
                    "resources": {"gpus": 1, "gpuProduct": "NVIDIA-A100-SXM4-80GB"},
                    "replicas": 1,
                },
            ),
            field_manager="llmop-chart-test",
        )
        # 70B weights cannot fit one L4: the planner refuses it before any pod exists.
        kube.apply(
            llmd_manifest(
                app_namespace,
                "too-big",
                {
                    "model": {"name": "meta-llama/Llama-3.1-70B-Instruct"},
                    "engine": {"backend": "vllm"},
                    "resources": {"gpus": 1, "gpuProduct": "NVIDIA-L4"},
                    "replicas": 1,
                },
            ),
            field_manager="llmop-chart-test",
        )
        observed = {
            "ready": _settled(kube, app_namespace, "qwen-small", "Ready", "True"),
            "progressing": _settled(kube, app_namespace, "pending", "Reconciling", "True"),
            "stalled": _settled(kube, app_namespace, "too-big", "Stalled", "True"),
        }
        expected = {"ready": "Healthy", "progressing": "Progressing", "stalled": "Degraded"}
        assert {k: health(v)[0] for k, v in observed.items()} == expected, operator.log_tail()
        if CAPTURE:
            for key, obj in observed.items():
                path = FIXTURES / f"llmdeployment-{key}.json"
                path.write_text(json.dumps(_sanitized(obj), indent=2, sort_keys=True) + "\n")
    finally:
        operator.stop()
        cluster.kubectl("delete", "namespace", app_namespace, "--wait=false", check=False)


def test_install_without_the_crd_succeeds_and_its_router_is_ready_on_a_crd_from_elsewhere(
    kube_cluster: Cluster, tmp_path: Path
) -> None:
    """`crds.enabled: false` on a cluster whose CRD was installed apart (`kubectl apply`, as a
    separate GitOps application would): `helm install --wait` succeeds, the CRD stays as it was,
    and the router, run as the release's own router ServiceAccount (kwok only pretends that its
    pods are Ready), is Ready. Without the CRD it stays unready and says why
    (tests/integration/test_operator_without_crd.py)."""
    install_crd(kube_cluster)
    owner = json.loads(kube_cluster.kubectl("get", "crd", CRD_NAME, "-o", "json").stdout)[
        "metadata"
    ].get("annotations", {})
    name = f"llmop-nocrd-{secrets.token_hex(3)}"
    namespace = f"chart-{secrets.token_hex(3)}"
    kube_cluster.kubectl("create", "namespace", namespace)
    values = {"crds": {"enabled": False}, "operator": {"watchNamespaces": [namespace]}}
    with helm.Config(kubeconfig_path=kube_cluster.kubeconfig, namespace=namespace) as config:
        try:
            info = config.install(
                CHART_DIR, name, values, namespace=namespace, wait="watcher", timeout=180
            )
            assert info["status"] == "deployed"
            crd = json.loads(kube_cluster.kubectl("get", "crd", CRD_NAME, "-o", "json").stdout)
            assert crd["metadata"].get("annotations", {}) == owner, "not taken by the release"
            token = kube_cluster.kubectl(
                "create", "token", f"{name}-router", "-n", namespace, "--duration=1h"
            ).stdout.strip()
            config_json = json.loads(
                kube_cluster.kubectl(
                    "config", "view", "--raw", "--minify", "--flatten", "-o", "json"
                ).stdout
            )
            config_json["users"][0]["user"] = {"token": token}
            kubeconfig = tmp_path / "router-kubeconfig"
            kubeconfig.write_text(json.dumps(config_json))
            with router_process(
                kubeconfig, tmp_path / "router.log", ("--namespaces", namespace)
            ) as router:

                def ready() -> bool:
                    try:
                        with urllib.request.urlopen(f"{router.url}/readyz", timeout=5) as answer:
                            return bool(answer.status == 200)
                    except OSError:
                        return False

                wait_until(ready, timeout=30, interval=0.2, what="the router Ready")
        finally:
            remove_release(kube_cluster, config, name, namespace)
