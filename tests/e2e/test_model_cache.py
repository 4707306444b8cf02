"""spec.model.cache on the real node: the download runs as a real pod (the engine-sim image's
`llmop-engine download`) from the hub stand-in into a hostPath PersistentVolume on the node, its
progress shows in the status while bytes flow, engine pods start only after it, and a second
replica reads the same cache without a second download.

Storage: a static hostPath PersistentVolume with node affinity to the real node, made by the
test (the project's own local-volume setup rather than a provisioner built from Go modules: one
node needs no dynamic provisioning, and a static volume keeps the node's state to one directory
the test removes)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmop import names
from support.cluster import wait_until
from support.hub_standin import HubStandin
from support.realnode import (
    MODEL_VOLUME_ROOT,
    REAL_NODE,
    RealCluster,
    create_cache_volume,
    delete_model_volume,
    real_node_spec,
)

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]

CLAIM_SIZE = "1Gi"


@pytest.fixture
def cache_volume(real_cluster: RealCluster, e2e_namespace: str) -> Iterator[Path]:
    """A hostPath PersistentVolume on the real node, pre-bound to the claim the operator makes."""
    pv_name = create_cache_volume(
        real_cluster.cluster, e2e_namespace, "cached-model-cache", CLAIM_SIZE
    )
    try:
        yield MODEL_VOLUME_ROOT / pv_name
    finally:
        delete_model_volume(real_cluster.cluster, pv_name)


def weight_gets(hub: HubStandin) -> int:
    return len([r for r in hub.requests if r.method == "GET" and r.path.endswith(".safetensors")])


def test_download_job_fills_the_cache_once_for_every_replica(
    real_cluster: RealCluster, e2e_namespace: str, cache_volume: Path, hub: HubStandin
) -> None:
    ns, name = e2e_namespace, "cached"
    before = weight_gets(hub)
    spec = real_node_spec(replicas=1, model={"cache": {"size": CLAIM_SIZE}})
    applied = time.monotonic()
    real_cluster.kit.apply_llmd(ns, name, spec)

    # Progress while the download pod runs (the operator reads its /progress every 5 s).
    seen: list[dict[str, Any]] = []

    def progressing() -> dict[str, Any] | None:
        obj = real_cluster.kit.get_llmd(ns, name) or {}
        download = ((obj.get("status") or {}).get("model") or {}).get("download") or {}
        seen.append(download)
        done = download.get("bytesDone") or 0
        if download.get("phase") == "Downloading" and 0 < done < download.get("bytesTotal", 0):
            return download
        return None

    download = wait_until(progressing, timeout=120, interval=0.5, what="download progress")
    assert download["rateBytesPerSecond"] > 0
    assert "ETA" in download["summary"]
    assert real_cluster.kit.deployment(ns, name) is None  # no engine pod waits on the download

    obj = real_cluster.kit.wait_condition(ns, name, "Ready", "True", timeout=240)
    cold = time.monotonic() - applied
    model = obj["status"]["model"]
    sha = hub.repos["Qwen/Qwen2.5-0.5B-Instruct"].sha
    assert model["resolvedRevision"] == sha
    assert model["download"]["phase"] == "Complete"
    (job,) = json.loads(real_cluster.kubectl("get", "jobs", "-n", ns, "-o", "json").stdout)["items"]
    (job_pod,) = real_cluster.pods(ns, f"job-name={job['metadata']['name']}")
    assert job_pod["spec"]["nodeName"] == REAL_NODE  # a real pod did the download
    snapshot = cache_volume / "hub" / "models--Qwen--Qwen2.5-0.5B-Instruct" / "snapshots"
    assert (snapshot / sha / "config.json").exists()
    assert weight_gets(hub) - before == 2  # two shards, each fetched once

    # A second replica reads the same cache: no second download.
    real_cluster.kubectl("scale", "llmd", name, "-n", ns, "--replicas=2")
    wait_until(
        lambda: (
            (real_cluster.kit.get_llmd(ns, name) or {}).get("status", {}).get("readyReplicas") == 2
        ),
        timeout=180,
        what="two ready replicas",
    )
    pods = real_cluster.pods(ns, names.selector_string(name))
    assert len(pods) == 2
    for pod in pods:
        volume = next(v for v in pod["spec"]["volumes"] if v["name"] == names.MODEL_CACHE_VOLUME)
        assert volume["persistentVolumeClaim"]["claimName"] == f"{name}-model-cache"
    time.sleep(1)
    assert weight_gets(hub) - before == 2

    # A second LLMDeployment on the filled cache (existingClaim): its download Job finds every
    # file and ends at once; apply → Ready is the warm-cache time.
    applied = time.monotonic()
    warm_spec = real_node_spec(
        replicas=1, model={"cache": {"existingClaim": f"{name}-model-cache"}}
    )
    real_cluster.kit.apply_llmd(ns, "warm", warm_spec)
    real_cluster.kit.wait_condition(ns, "warm", "Ready", "True", timeout=240)
    warm = time.monotonic() - applied
    assert weight_gets(hub) - before == 2
    size_mib = hub.repos["Qwen/Qwen2.5-0.5B-Instruct"].total_bytes / 2**20
    rate_mib = (hub.rate_bytes_per_s or 0) / 2**20
    print(
        f"\nmodel cache e2e: {size_mib:.0f} MiB at {rate_mib:.0f} MiB/s per file: "
        f"apply→Ready cold {cold:.1f} s, warm {warm:.1f} s"
    )


def file_gets(hub: HubStandin, name: str) -> int:
    return len([r for r in hub.requests if r.method == "GET" and r.path.endswith("/" + name)])


def test_killed_download_pod_is_replaced_and_keeps_finished_files(
    real_cluster: RealCluster, e2e_namespace: str, cache_volume: Path, hub: HubStandin
) -> None:
    """The download pod dies mid-download (deleted, as a node drain or preemption does): the Job
    starts another pod, which keeps the files already complete (huggingface_hub 2.x restarts the
    ones in flight: see docs/operations.md), and the engine starts on the filled cache."""
    ns, name = e2e_namespace, "cached"
    config_before = file_gets(hub, "config.json")
    weights_before = weight_gets(hub)
    real_cluster.kit.apply_llmd(
        ns, name, real_node_spec(replicas=1, model={"cache": {"size": CLAIM_SIZE}})
    )

    def flowing() -> dict[str, Any] | None:
        obj = real_cluster.kit.get_llmd(ns, name) or {}
        download = ((obj.get("status") or {}).get("model") or {}).get("download") or {}
        return download if (download.get("bytesDone") or 0) >= 16 << 20 else None

    wait_until(flowing, timeout=120, interval=0.5, what="16 MiB downloaded")
    (first,) = real_cluster.pods(ns, "job-name")
    # One second of grace: a default 30 s would let this small download finish first.
    real_cluster.kubectl(
        "delete", "pod", "-n", ns, first["metadata"]["name"], "--grace-period=1", "--wait=false"
    )
    killed_at = time.monotonic()

    obj = real_cluster.kit.wait_condition(ns, name, "Ready", "True", timeout=300)
    print(
        f"\nkilled download: engine Ready {time.monotonic() - killed_at:.1f}s after the kill; "
        f"weight GETs {weight_gets(hub) - weights_before}, "
        f"config.json GETs {file_gets(hub, 'config.json') - config_before}"
    )
    assert obj["status"]["model"]["download"]["phase"] == "Complete"
    pods = real_cluster.pods(ns, "job-name")
    assert first["metadata"]["name"] not in [p["metadata"]["name"] for p in pods]
    assert [p["status"]["phase"] for p in pods] == ["Succeeded"]
    sha = hub.repos["Qwen/Qwen2.5-0.5B-Instruct"].sha
    snapshot = cache_volume / "hub" / "models--Qwen--Qwen2.5-0.5B-Instruct" / "snapshots"
    assert (snapshot / sha / "config.json").exists()
    assert file_gets(hub, "config.json") - config_before == 1  # complete: never fetched again
    # Each shard: once in the killed pod (cut), once more in its replacement.
    assert weight_gets(hub) - weights_before >= 3
    blobs = cache_volume / "hub" / "models--Qwen--Qwen2.5-0.5B-Instruct" / "blobs"
    assert not list(blobs.glob("*.incomplete"))
