"""spec.router.inferencePool against the real API server and the real InferencePool CRD of the
Gateway API Inference Extension v1.6.0 (from its Go module): the real `llmop run` under
deploy/rbac.yaml. Without the CRD the CR is Degraded (InferencePoolUnavailable) and serves as
ever; once the CRD is installed the pool appears by itself, accepted by the real schema and
selecting the engine pods; removing the field deletes it. The CRD is removed again at the end,
and removed first if an earlier run left it, so the test does not depend on test order."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmop.kube import RejectedError
from support.cluster import Cluster, wait_until
from support.manifests import simulator_spec as spec
from support.operator import Kit, OperatorProcess, conditions

pytestmark = pytest.mark.cluster

GIE_MODULE = "sigs.k8s.io/gateway-api-inference-extension@v1.6.0"
CRD_PATH = "config/crd/bases/inference.networking.k8s.io_inferencepools.yaml"
CRD_NAME = "inferencepools.inference.networking.k8s.io"
POOL_API = "inference.networking.k8s.io/v1"
POOL = {"endpointPickerRef": {"name": "vllm-epp", "port": 9002}}


def gie_crd() -> Path:
    """The InferencePool CRD YAML of the pinned release, from the Go module cache (the module
    proxy fills it on a fresh machine)."""
    env = dict(os.environ, GOTOOLCHAIN="local", GOFLAGS="-mod=mod")
    result = subprocess.run(
        ["go", "mod", "download", "-json", GIE_MODULE],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path.home(),
        check=False,
        timeout=300,
    )
    assert result.returncode == 0, f"go mod download {GIE_MODULE}: {result.stderr}"
    path = Path(json.loads(result.stdout)["Dir"]) / CRD_PATH
    assert path.is_file(), path
    return path


def served(cluster: Cluster) -> bool:
    return cluster.kubectl("get", "--raw", f"/apis/{POOL_API}", check=False).returncode == 0


def remove_crd(cluster: Cluster) -> None:
    cluster.kubectl("delete", "crd", CRD_NAME, "--ignore-not-found", "--wait=true")
    wait_until(lambda: not served(cluster), timeout=30, what=f"{POOL_API} no longer served")


@pytest.fixture
def crd_absent(kit: Kit) -> Iterator[Path]:
    """No InferencePool CRD now, and none after the test; yields the CRD file to install."""
    path = gie_crd()
    remove_crd(kit.cluster)
    try:
        yield path
    finally:
        remove_crd(kit.cluster)


def degraded(kit: Kit, namespace: str, name: str) -> tuple[str, str, str]:
    found = conditions(kit.get_llmd(namespace, name)).get("Degraded") or {}
    return str(found.get("status")), str(found.get("reason")), str(found.get("message"))


def pool(kit: Kit, namespace: str, name: str) -> dict[str, Any] | None:
    return kit.get(POOL_API, "InferencePool", namespace, name)


def test_pool_waits_for_the_crd_then_follows_the_spec(
    operator: OperatorProcess, kit: Kit, namespace: str, crd_absent: Path
) -> None:
    # The CEL rule on the reference answers with the field and the fix.
    bad = spec(router={"inferencePool": {"endpointPickerRef": {"name": "EPP.svc", "port": 9002}}})
    with pytest.raises(RejectedError, match=r"endpointPickerRef\.name must be the name"):
        kit.apply_llmd(namespace, "bad", bad)

    # No CRD: Degraded with what to install, and the model still serves through its Service.
    kit.apply_llmd(namespace, "pooled", spec(replicas=1, router={"inferencePool": POOL}))
    kit.wait_condition(namespace, "pooled", "Ready", "True")
    wait_until(
        lambda: degraded(kit, namespace, "pooled")[:2] == ("True", "InferencePoolUnavailable"),
        timeout=30,
        what="Degraded InferencePoolUnavailable",
    )
    assert "Gateway API Inference Extension CRDs v1.x" in degraded(kit, namespace, "pooled")[2]
    assert kit.get("v1", "Service", namespace, "pooled") is not None

    # The CRDs arrive: the operator notices by itself and creates the pool.
    kit.cluster.kubectl("apply", "--server-side", "-f", str(crd_absent))
    wait_until(lambda: served(kit.cluster), timeout=30, what=f"{POOL_API} served")
    live = wait_until(lambda: pool(kit, namespace, "pooled"), timeout=30, what="InferencePool")
    wait_until(
        lambda: degraded(kit, namespace, "pooled")[0] == "False",
        timeout=30,
        what="Degraded cleared",
    )
    service = kit.get("v1", "Service", namespace, "pooled")
    parent = kit.get_llmd(namespace, "pooled")
    assert service is not None
    assert parent is not None
    assert parent["status"]["inferencePool"] == "pooled"
    assert live["spec"]["selector"] == {"matchLabels": service["spec"]["selector"]}
    assert live["spec"]["targetPorts"] == [{"number": 8000}]
    assert live["spec"]["endpointPickerRef"] == {
        "group": "",
        "kind": "Service",
        "name": "vllm-epp",
        "port": {"number": 9002},
        "failureMode": "FailClose",
    }
    assert live["spec"]["appProtocol"] == "http"  # the real CRD's default: its schema applied
    (owner,) = live["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == (
        "LLMDeployment",
        parent["metadata"]["uid"],
        True,
    )
    assert "llmop" in {m["manager"] for m in live["metadata"]["managedFields"]}
    # The pool selects exactly the engine pods.
    selector = ",".join(f"{k}={v}" for k, v in sorted(service["spec"]["selector"].items()))
    pods = json.loads(
        kit.cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout
    )["items"]
    assert [p["metadata"]["labels"]["serving.llmop.dev/deployment"] for p in pods] == ["pooled"]

    # A CR created while the CRD is there gets its pool in its first pass.
    kit.apply_llmd(
        namespace,
        "later",
        spec(replicas=1, router={"inferencePool": POOL}, service={"port": 8080}),
    )
    later = wait_until(lambda: pool(kit, namespace, "later"), timeout=30, what="second pool")
    assert later["spec"]["targetPorts"] == [{"number": 8080}]
    assert later["spec"]["selector"]["matchLabels"]["serving.llmop.dev/deployment"] == "later"

    # Removing the field deletes the pool, and the status forgets it.
    kit.apply_llmd(namespace, "pooled", spec(replicas=1))
    wait_until(lambda: pool(kit, namespace, "pooled") is None, timeout=30, what="pool deleted")
    wait_until(
        lambda: (
            "inferencePool" not in ((kit.get_llmd(namespace, "pooled") or {}).get("status") or {})
        ),
        timeout=30,
        what="status.inferencePool gone",
    )
    assert operator.process is not None
    assert operator.process.poll() is None
    log = operator.log_path.read_text()
    assert "Traceback" not in log
    assert "inferencepools" not in log  # kopf never watched them, nor warned about them
