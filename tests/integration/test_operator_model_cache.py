"""spec.model.cache against the real API server, with the hub stand-in as the model hub: the
pre-flight stalls a gated model without a token, an unknown model and a cache too small before
anything is created; an accessible model gets its cache claim and one download Job and no engine
pods until that Job completes; then the engine mounts the cache offline at the resolved commit.

kwok nodes do not run containers, so the download Job's outcome is written here through the
Job's status subresource, as the Job controller would write it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from support.cluster import Cluster, wait_until
from support.hub_standin import HubRepo, HubStandin, synthetic_model
from support.manifests import simulator_spec
from support.operator import OperatorProcess, conditions

if TYPE_CHECKING:
    from support.operator import Kit

pytestmark = pytest.mark.cluster

OPEN = "Qwen/Qwen2.5-0.5B-Instruct"
GATED = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubStandin]:
    model = synthetic_model(tmp_path_factory.mktemp("model"), weights_bytes=3 << 20)
    repos = [
        HubRepo(OPEN, model),
        HubRepo(GATED, model, gated=True, allowed_tokens=frozenset({"hf_granted"})),
    ]
    with HubStandin(repos, tokens=frozenset({"hf_other"})) as standin:
        yield standin


@pytest.fixture(scope="module")
def operator(
    operator_kubeconfig: Path, hub: HubStandin, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    process = OperatorProcess(
        operator_kubeconfig,
        tmp_path_factory.mktemp("operator-log") / "operator.log",
        extra_env={"LLMOP_HUB_ENDPOINT": hub.url},
    )
    process.start()
    try:
        yield process
    finally:
        process.stop()


def spec(model: str, cache: dict[str, Any], **model_fields: Any) -> dict[str, Any]:
    return simulator_spec(model={"name": model, "cache": cache, **model_fields})


def stalled_reason(kit: Kit, namespace: str, name: str) -> dict[str, Any]:
    obj = kit.wait_condition(namespace, name, "Stalled", "True", timeout=60)
    return next(c for c in obj["status"]["conditions"] if c["type"] == "Stalled")


def jobs(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", "jobs", "-n", namespace, "-o", "json").stdout
    return list(json.loads(out)["items"])


def floating_revision_events(cluster: Cluster, namespace: str) -> str:
    """The namespace's FloatingRevision Events, as `kubectl get -o json` prints them."""
    return cluster.kubectl(
        "get",
        "events",
        "-n",
        namespace,
        "--field-selector",
        "reason=FloatingRevision",
        "-o",
        "json",
    ).stdout


def assert_nothing_created(kit: Kit, cluster: Cluster, namespace: str, name: str) -> None:
    assert kit.deployment(namespace, name) is None
    assert jobs(cluster, namespace) == []


@pytest.mark.parametrize(
    ("model", "extra", "reason", "fix"),
    [
        (GATED, {}, "ModelAccessDenied", "spec.model.tokenSecretRef is not set"),
        (GATED, {"tokenSecretRef": {"name": "hf"}}, "ModelAccessDenied", "request access"),
        ("acme/missing", {}, "ModelNotFound", "check spec.model.name"),
        (OPEN, {"revision": "no-such-branch"}, "ModelNotFound", "set spec.model.revision"),
    ],
    ids=["gated-no-token", "gated-token-without-access", "unknown-model", "unknown-revision"],
)
def test_preflight_refusals_stall_before_anything_is_created(
    *,
    operator: OperatorProcess,
    kit: Kit,
    llmop_crd: Cluster,
    namespace: str,
    model: str,
    extra: dict[str, Any],
    reason: str,
    fix: str,
) -> None:
    llmop_crd.kubectl(
        "create", "secret", "generic", "hf", "-n", namespace, "--from-literal=token=hf_other"
    )
    kit.apply_llmd(namespace, "m", spec(model, {"size": "1Gi"}, **extra))
    stalled = stalled_reason(kit, namespace, "m")
    assert stalled["reason"] == reason
    assert fix in stalled["message"]
    time.sleep(1)  # nothing turns up a moment later either
    assert_nothing_created(kit, llmop_crd, namespace, "m")
    assert llmop_crd.kubectl("get", "pvc", "-n", namespace, "-o", "name").stdout == ""


def test_cache_too_small_names_the_size_that_fits(
    operator: OperatorProcess, kit: Kit, llmop_crd: Cluster, namespace: str, hub: HubStandin
) -> None:
    kit.apply_llmd(namespace, "m", spec(OPEN, {"size": "1Mi"}))
    stalled = stalled_reason(kit, namespace, "m")
    assert stalled["reason"] == "CacheTooSmall"
    assert "set spec.model.cache.size to at least 1Gi" in stalled["message"]
    assert_nothing_created(kit, llmop_crd, namespace, "m")
    model = kit.get_llmd(namespace, "m")["status"]["model"]  # type: ignore[index]
    assert model["resolvedRevision"] == hub.repos[OPEN].sha
    assert model["sizeBytes"] == hub.repos[OPEN].total_bytes


def fail_job(cluster: Cluster, namespace: str, name: str) -> None:
    """Write what the Job controller writes when the downloader exits 2 (FailJob policy)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    status: dict[str, Any] = {
        "failed": 1,
        "active": 0,
        "ready": 0,
        "conditions": [
            {
                "type": "FailureTarget",
                "status": "True",
                "reason": "PodFailurePolicy",
                "message": "Container download exited with 2",
                "lastTransitionTime": now,
            },
            {
                "type": "Failed",
                "status": "True",
                "reason": "PodFailurePolicy",
                "message": "Container download exited with 2",
                "lastTransitionTime": now,
            },
        ],
    }
    cluster.kubectl(
        "patch",
        "job",
        name,
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
    )


@pytest.fixture
def make_volume(llmop_crd: Cluster, namespace: str) -> Iterator[Callable[[], None]]:
    """Makes a static PersistentVolume for the cache claim to bind (the kwok cluster has no
    provisioner; the pods are fake, so the path is never used)."""
    name = f"cache-{namespace}"
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "2Gi"},
            "accessModes": ["ReadWriteMany"],
            "hostPath": {"path": f"/tmp/{name}"},
            "claimRef": {"namespace": namespace, "name": "m-model-cache"},
        },
    }
    try:
        yield lambda: llmop_crd.kubectl("create", "-f", "-", input=json.dumps(pv)) and None
    finally:
        llmop_crd.kubectl("delete", "pv", name, "--wait=false", check=False)


def test_download_job_before_engine_then_engine_reads_the_cache_offline(  # noqa: PLR0915
    *,
    operator: OperatorProcess,
    kit: Kit,
    llmop_crd: Cluster,
    namespace: str,
    hub: HubStandin,
    make_volume: Callable[[], None],
) -> None:
    sha = hub.repos[OPEN].sha
    kit.apply_llmd(namespace, "m", spec(OPEN, {"size": "2Gi", "accessModes": ["ReadWriteMany"]}))
    job_name = f"m-dl-{sha[:8]}"
    job = wait_until(
        lambda: kit.get("batch/v1", "Job", namespace, job_name), timeout=60, what="download Job"
    )
    pvc = kit.get("v1", "PersistentVolumeClaim", namespace, "m-model-cache")
    assert pvc is not None
    assert pvc["spec"]["resources"]["requests"]["storage"] == "2Gi"
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    for child in (job, pvc):
        assert child["metadata"]["ownerReferences"][0]["kind"] == "LLMDeployment"
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][:5] == ["download", "--model", OPEN, "--revision", sha]
    assert {"name": "HF_ENDPOINT", "value": hub.url} in container["env"]
    job_volume = job["spec"]["template"]["spec"]["volumes"][0]
    assert job_volume["persistentVolumeClaim"]["claimName"] == "m-model-cache"

    # Unset revision floats: resolved, recorded, and warned about.
    obj = wait_until(
        lambda: (
            (o := kit.get_llmd(namespace, "m"))
            and ((o.get("status") or {}).get("model") or {}).get("download")
            and o
        ),
        timeout=30,
        what="status.model.download",
    )
    model = obj["status"]["model"]
    assert model["resolvedRevision"] == sha
    assert model["floatingRevision"] is True
    assert model["cacheClaim"] == "m-model-cache"
    assert model["download"]["phase"] in ("Pending", "Downloading")
    assert model["download"]["bytesTotal"] == hub.repos[OPEN].total_bytes
    events = floating_revision_events(llmop_crd, namespace)
    assert f"pin spec.model.revision to {sha}" in events
    wide = llmop_crd.kubectl("get", "llmd", "m", "-n", namespace, "-o", "wide").stdout
    assert "DOWNLOAD" in wide
    time.sleep(1)
    assert kit.deployment(namespace, "m") is None  # no engine pod waits on the download
    # Ready and Reconciling say what Argo CD and Flux should show: the model downloads.
    found = conditions(kit.get_llmd(namespace, "m"))
    for kind in ("Ready", "Reconciling"):
        assert found[kind]["reason"] == "DownloadingModel", found[kind]
        assert found[kind]["message"].startswith("Downloading the model into its cache: ")
    # The claim and the Job went through the executor: counted like every child write.
    for kind in ("Job", "PersistentVolumeClaim"):
        assert operator.metric("llmop_child_writes_total", kind=kind, action="apply") >= 1

    # A volume for the claim: the download pod schedules, and kwok's default pod stages run a
    # Job's pod to completion, so the Job controller itself marks the Job Complete.
    make_volume()
    deployment = wait_until(
        lambda: kit.deployment(namespace, "m"), timeout=60, what="engine Deployment"
    )
    pod = deployment["spec"]["template"]["spec"]
    cache_volume = next(v for v in pod["volumes"] if v["name"] == "model-cache")
    assert cache_volume == {
        "name": "model-cache",
        "persistentVolumeClaim": {"claimName": "m-model-cache"},
    }
    engine = pod["containers"][0]
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in engine["env"]
    args = engine["args"]
    assert args[args.index("--revision") + 1] == sha
    kit.wait_condition(namespace, "m", "Ready", "True", timeout=60)
    done = kit.get_llmd(namespace, "m")["status"]["model"]["download"]  # type: ignore[index]
    assert done["phase"] == "Complete"
    assert done["bytesDone"] == done["bytesTotal"]

    # A new generation that leaves spec.model alone (a scale) keeps the verdict and the commit:
    # no second hub call, no second FloatingRevision warning, no second download.
    hub_calls = [r for r in hub.requests if r.path.startswith(f"/api/models/{OPEN}")]
    kit.apply_llmd(
        namespace,
        "m",
        {**spec(OPEN, {"size": "2Gi", "accessModes": ["ReadWriteMany"]}), "replicas": 2},
    )
    wait_until(
        lambda: (d := kit.deployment(namespace, "m")) and d["spec"]["replicas"] == 2,
        timeout=60,
        what="the scaled Deployment",
    )
    kit.wait_condition(namespace, "m", "Ready", "True", timeout=60)
    assert [r for r in hub.requests if r.path.startswith(f"/api/models/{OPEN}")] == hub_calls
    warnings = floating_revision_events(llmop_crd, namespace)
    assert sum(e.get("count") or 1 for e in json.loads(warnings)["items"]) == 1
    assert [j["metadata"]["name"] for j in jobs(llmop_crd, namespace)] == [job_name]
    scaled = kit.deployment(namespace, "m")
    assert scaled is not None
    args = scaled["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--revision") + 1] == sha


def test_failed_download_stalls_with_the_job_named(
    operator: OperatorProcess, kit: Kit, llmop_crd: Cluster, namespace: str, hub: HubStandin
) -> None:
    sha = hub.repos[OPEN].sha
    kit.apply_llmd(namespace, "m", spec(OPEN, {"size": "2Gi"}, revision=sha))
    job_name = f"m-dl-{sha[:8]}"
    wait_until(
        lambda: kit.get("batch/v1", "Job", namespace, job_name), timeout=60, what="download Job"
    )
    fail_job(llmop_crd, namespace, job_name)
    stalled = stalled_reason(kit, namespace, "m")
    assert stalled["reason"] == "ModelDownloadFailed"
    assert f"kubectl logs job/{job_name}" in stalled["message"]
    assert kit.deployment(namespace, "m") is None
    model = kit.get_llmd(namespace, "m")["status"]["model"]  # type: ignore[index]
    assert model["floatingRevision"] is False
