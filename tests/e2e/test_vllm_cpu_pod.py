"""The real vLLM CPU engine as a real pod on the real node: an LLMDeployment with `engine.backend:
vllm` and `resources.gpus: 0` runs the engine-cpu image (engine-image/Dockerfile.cpu, built by
e2e/images and imported into the node's containerd), serving the tiny random-weight model the
real-engine tests make (tests/support/tiny_model.py) from a `pvc://` claim on a static hostPath
PersistentVolume. It goes Ready through the kubelet's probes (the agent's /readyz), answers a
completion through the Service's ClusterIP, and a spec change rolls it under streaming load with
no request lost. The same engine also serves the tiny model as a Hub repository of the hub
stand-in through `spec.model.cache`: the download Job fills the cache, and vLLM reads the resolved
commit from it with the Hub offline. And with the chart's operator and router pods, an autoscaled
CR with `minReplicas: 0` idles to zero engine pods and one request through the router wakes it.

Cost: the image is ~6 GB (vLLM, torch and its CUDA libraries, which `import torch` needs even on
CPU); a cold build takes minutes, a warm one is a cache hit. An engine takes ~3.6 GiB and about a
minute to start; two run at once during the rollout.

And as one multi-node replica (`pipelineParallelSize: 2`): a LeaderWorkerSet group of two engine
pods, vLLM's own `--nnodes 2` mode (rank 0 serving, rank 1 `--headless`, joined at
`$(LWS_LEADER_ADDRESS)` through the node's cluster DNS), Ready and answering through the Service;
its worker pod deleted takes the group out of service, and LeaderWorkerSet recreates it serving."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine import real_vllm
from llmop import names
from llmop_engine import contract
from support import tiny_model
from support.cluster import wait_until
from support.helm_release import NODE_IMAGE_VALUES, chart_on_real_node
from support.hub_standin import HubRepo, HubStandin
from support.realnode import (
    REAL_NODE,
    BackgroundLoad,
    PodWatch,
    RealCluster,
    create_cache_volume,
    create_model_volume,
    delete_model_volume,
    group_pods,
    group_recreated,
    import_into_node,
    post_json,
    ready_status,
    service_url,
    summary,
    vllm_cpu_spec,
    wait_rolled_out,
)
from support.wake import PHASES, describe, from_zero, one_wake

# Opt-in, not part of `make test`: the engine-cpu image costs ~25 min to build cold (a 14 min pip
# install of vLLM and torch, then the layer export) and ~2 min to import, which does not fit CI's
# budget beside the Kubernetes and metrics builds. `make e2e-vllm-pod` builds it and runs this.
OPT_IN = "LLMOP_E2E_VLLM_POD"

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.cluster,
    pytest.mark.vllm,
    pytest.mark.skipif(
        os.environ.get(OPT_IN) != "1",
        reason=f"opt-in ({OPT_IN}=1, `make e2e-vllm-pod`): needs the ~6 GB engine-cpu image",
    ),
]

CLAIM = "tiny-model"
# The tiny model as a Hub repository of the stand-in, for the model-cache path.
TINY_REPO = "llmop-test/tiny-random"
CLIENTS = 4
MAX_TOKENS = 32
WARMUP_SECONDS = 5
SETTLE_SECONDS = 5
# A real engine takes 50-70 s to start on a quiet 2-core machine; the surge pod of the rollout
# starts while the old one serves the load, so it gets more.
START_TIMEOUT = 240
ROLLOUT_TIMEOUT = 300


@pytest.fixture(scope="module")
def tiny_model_dir() -> Path:
    """The tiny model, made (or reused) with the vLLM CPU venv's Python; skips with the reason
    where vLLM's CPU build cannot run or is not installed (as the real-engine tests do)."""
    try:
        venv = real_vllm.venv()
    except real_vllm.UnavailableError as exc:
        pytest.skip(f"REAL vLLM UNAVAILABLE: {exc}")
    return tiny_model.ensure(str(venv / "bin" / "python"))


@pytest.fixture(scope="module")
def engine_cpu_image(real_cluster: RealCluster) -> float:
    """engine-cpu built (or reused) and imported into the node; returns the seconds it took."""
    seconds = import_into_node("engine-cpu")
    print(f"\nengine-cpu image build/import: {seconds:.1f} s")
    return seconds


@pytest.fixture
def model_claim(
    real_cluster: RealCluster, e2e_namespace: str, tiny_model_dir: Path
) -> Iterator[str]:
    """The tiny model on a hostPath PersistentVolume of the real node, bound to claim CLAIM."""
    pv_name = create_model_volume(real_cluster.cluster, e2e_namespace, CLAIM, tiny_model_dir)
    try:
        yield CLAIM
    finally:
        delete_model_volume(real_cluster.cluster, pv_name)


def complete(url: str, model: str, tokens: int, timeout: float = 60) -> dict[str, Any]:
    """One completion of exactly `tokens` tokens through `url` (the Service), answered 200."""
    status, body = post_json(
        url + "/v1/completions",
        {"model": model, "prompt": "def main():", "max_tokens": tokens, "ignore_eos": True},
        timeout=timeout,
    )
    assert status == 200, body
    assert body["usage"]["completion_tokens"] == tokens, body
    return dict(body)


def ready_seconds(pod: dict[str, Any]) -> float:
    """Container start → pod Ready, from the kubelet's own timestamps (whole seconds)."""
    (status,) = pod["status"]["containerStatuses"]
    started = status["state"]["running"]["startedAt"]
    ready = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
    return _seconds(ready["lastTransitionTime"]) - _seconds(started)


def _seconds(stamp: str) -> float:
    return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))


def test_vllm_cpu_engine_serves_and_rolls_without_loss(
    real_cluster: RealCluster,
    e2e_namespace: str,
    engine_cpu_image: float,
    model_claim: str,
) -> None:
    ns, name = e2e_namespace, "vllm-cpu"
    kit = real_cluster.kit
    selector = names.selector_string(name)

    applied = time.monotonic()
    kit.apply_llmd(ns, name, vllm_cpu_spec(model_claim))
    kit.wait_condition(ns, name, "Ready", "True", timeout=START_TIMEOUT)
    apply_to_ready = time.monotonic() - applied
    (pod,) = real_cluster.pods(ns, selector)
    assert pod["spec"]["nodeName"] == REAL_NODE
    (container,) = pod["spec"]["containers"]
    assert container["image"].split("/")[-1].startswith("engine-cpu:"), container["image"]
    # Ready came from the kubelet probing the agent, not from anything the test did.
    assert container["readinessProbe"]["httpGet"]["path"] == contract.READYZ_PATH
    assert container["readinessProbe"]["httpGet"]["port"] in (
        names.PROBE_PORT_NAME,
        contract.PROBE_PORT,
    )
    assert "nvidia.com/gpu" not in (container["resources"].get("limits") or {})
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    start_to_ready = ready_seconds(pod)

    url = service_url(real_cluster.cluster, ns, name)
    t0 = time.monotonic()
    body = complete(url, name, 16)
    completion_seconds = time.monotonic() - t0
    assert body["model"] == name
    assert body["choices"][0]["finish_reason"] == "length", body

    # The rollout: a spec change that rolls the pod (maxNumSeqs is a vLLM flag), under load.
    watch = PodWatch(real_cluster.cluster, ns, selector)
    watch.sample()
    load = BackgroundLoad(
        url, model=name, concurrency=CLIENTS, duration=600, max_tokens=MAX_TOKENS
    ).start()
    time.sleep(WARMUP_SECONDS)
    rolled = time.monotonic()
    kit.apply_llmd(ns, name, vllm_cpu_spec(model_claim, max_num_seqs=17))
    kit.wait_condition(ns, name, "Ready", "True", timeout=ROLLOUT_TIMEOUT)
    wait_rolled_out(real_cluster.cluster, ns, name, 1)
    rollout_seconds = time.monotonic() - rolled
    time.sleep(SETTLE_SECONDS)
    result = load.stop()
    # The old pod may still be draining (Terminating) after the Deployment counts as rolled out.
    (new_pod,) = [p for p in watch.sample() if p["metadata"]["name"] != pod["metadata"]["name"]]
    print(
        f"\nvLLM CPU pod: apply→Ready {apply_to_ready:.1f} s, container start→Ready "
        f"{start_to_ready:.0f} s (surge pod {ready_seconds(new_pod):.0f} s), completion "
        f"{completion_seconds * 1000:.0f} ms through the ClusterIP; rollout "
        f"{rollout_seconds:.1f} s under load: {summary(result)}"
    )
    assert result.total >= 20, summary(result)
    assert result.lost == 0, summary(result)
    assert not any(watch.restarts.values()), watch.restarts


def test_vllm_cpu_engine_serves_the_model_the_cache_downloaded(
    real_cluster: RealCluster,
    e2e_namespace: str,
    engine_cpu_image: float,
    tiny_model_dir: Path,
    hub: HubStandin,
) -> None:
    ns, name = e2e_namespace, "vllm-cached"
    hub.add(HubRepo(TINY_REPO, tiny_model_dir))
    repo = hub.repos[TINY_REPO]
    pv_name = create_cache_volume(real_cluster.cluster, ns, f"{name}-model-cache", "1Gi")
    try:
        spec = vllm_cpu_spec("")
        spec["model"] = {"name": TINY_REPO, "cache": {"size": "1Gi"}}
        applied = time.monotonic()
        real_cluster.kit.apply_llmd(ns, name, spec)
        obj = real_cluster.kit.wait_condition(ns, name, "Ready", "True", timeout=START_TIMEOUT)
        apply_to_ready = time.monotonic() - applied
        model = obj["status"]["model"]
        assert model["resolvedRevision"] == repo.sha, model
        assert model["download"]["phase"] == "Complete", model
        (pod,) = real_cluster.pods(ns, names.selector_string(name))
        (container,) = pod["spec"]["containers"]
        # vLLM got the commit the pre-flight resolved and had no way to the Hub: it served what
        # the download Job put in the cache.
        assert "--revision" in container["args"], container["args"]
        assert container["args"][container["args"].index("--revision") + 1] == repo.sha
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["HF_HUB_OFFLINE"] == "1", env
        weights = [r for r in hub.requests if r.method == "GET" and r.path.endswith(".safetensors")]
        assert len(weights) == 1, weights  # the one shard, fetched once, by the download Job

        complete(service_url(real_cluster.cluster, ns, name), name, 16)
        print(
            f"\nvLLM CPU pod from the model cache: {repo.total_bytes / 2**20:.1f} MiB from the "
            f"hub stand-in, apply→Ready {apply_to_ready:.1f} s, ready in "
            f"{ready_seconds(pod):.0f} s after its container started"
        )
    finally:
        delete_model_volume(real_cluster.cluster, pv_name)


def test_vllm_cpu_engine_wakes_from_zero(
    real_cluster: RealCluster,
    e2e_namespace: str,
    engine_cpu_image: float,
    model_claim: str,
) -> None:
    """Scale to zero with the real engine: the chart's operator and router pods, an autoscaled
    vLLM CPU CR with `minReplicas: 0`; it idles to zero engine pods, and one streaming request
    through the router's Service is held, wakes it (one replica) and is answered."""
    ns, name = e2e_namespace, "vllm-zero"
    kit = real_cluster.kit
    # The gateway is not what this proves: its router lets the wake's request in without a key.
    values = {
        **NODE_IMAGE_VALUES,
        "router": {**NODE_IMAGE_VALUES["router"], "gateway": {"enabled": False}},
    }
    with chart_on_real_node(real_cluster, values) as release:
        kit.apply_llmd(ns, name, from_zero(vllm_cpu_spec(model_claim)))
        router = service_url(real_cluster.cluster, release.namespace, f"{release.name}-router")
        # The first replica starts (minReplicas 0 starts at 1), serves nothing, idles to zero.
        moments = one_wake(real_cluster, ns, name, router, zero_timeout=START_TIMEOUT + 120)
        print(f"\nvLLM CPU pod woken from zero, s after the request: {describe(moments)}")
        assert set(PHASES) <= set(moments), moments
        assert moments["first token"] >= moments["engine Ready"] - 2, moments
        deployment = kit.kube.read("apps/v1", "Deployment", ns, name) or {}
        assert deployment["spec"]["replicas"] == 1, deployment["spec"]

        def wake_recorded() -> dict[str, Any] | None:
            history = ((kit.get_llmd(ns, name) or {}).get("status") or {}).get("scaleToZero")
            return history if (history or {}).get("lastWakeSeconds") is not None else None

        history = wait_until(wake_recorded, timeout=60, what="the wake in status.scaleToZero")
        assert history["lastScaledToZeroTime"], history
        assert 0 < history["lastWakeSeconds"] <= moments["answered"] + 5, history
        (pod,) = real_cluster.pods(ns, names.selector_string(name))
        (container,) = pod["spec"]["containers"]
        assert container["image"].split("/")[-1].startswith("engine-cpu:"), container["image"]


# Two real engines start twice (the group, then its recreate), each pair ~2-4 min on 2 cores,
# and a cold engine-cpu image's build and import (~10 min) may fall into this test's setup.
@pytest.mark.timeout(1800)
def test_vllm_cpu_group_serves_and_a_lost_worker_recreates_it(
    real_cluster: RealCluster,
    e2e_namespace: str,
    engine_cpu_image: float,
    model_claim: str,
) -> None:
    """Real vLLM across two pods: one group (leader + headless worker), the tiny model split in
    two pipeline stages; a completion through the Service; the worker pod deleted → the CR out
    of service, the group recreated by LeaderWorkerSet, serving again."""
    ns, name = e2e_namespace, "vllm-group"
    kit = real_cluster.kit
    spec = vllm_cpu_spec(model_claim)
    spec["engine"]["pipelineParallelSize"] = 2
    applied = time.monotonic()
    kit.apply_llmd(ns, name, spec)
    kit.wait_condition(ns, name, "Ready", "True", timeout=START_TIMEOUT + 120)
    apply_to_ready = time.monotonic() - applied
    pods = group_pods(real_cluster, ns, name)
    assert pods.keys() == {f"{name}-0", f"{name}-0-1"}, pods.keys()
    leader, worker = pods[f"{name}-0"], pods[f"{name}-0-1"]
    assert leader["metadata"]["labels"][names.LABEL_LWS_WORKER_INDEX] == "0"
    for pod in (leader, worker):
        assert pod["spec"]["nodeName"] == REAL_NODE
        (container,) = pod["spec"]["containers"]
        assert container["image"].split("/")[-1].startswith("engine-cpu:"), container["image"]
    assert "--headless" in worker["spec"]["containers"][0]["args"]

    url = service_url(real_cluster.cluster, ns, name)
    t0 = time.monotonic()
    complete(url, name, 8, timeout=120)
    completion_seconds = time.monotonic() - t0

    deleted = time.monotonic()
    real_cluster.kubectl("delete", "pod", "-n", ns, f"{name}-0-1", "--wait=false")

    wait_until(
        lambda: ready_status(kit.get_llmd(ns, name)) != "True",
        timeout=60,
        interval=0.5,
        what="the CR out of service after its worker went",
    )
    out_of_service = time.monotonic() - deleted
    first_leader = leader["metadata"]["uid"]

    wait_until(
        lambda: group_recreated(real_cluster, ns, name, first_leader),
        timeout=START_TIMEOUT + 180,
        interval=1,
        what="the group recreated",
    )
    serving_again = time.monotonic() - deleted
    complete(url, name, 8, timeout=120)
    print(
        f"\nvLLM CPU group of 2 pods (PP 2): apply→Ready {apply_to_ready:.1f} s, completion "
        f"{completion_seconds:.1f} s through the ClusterIP; worker pod deleted: out of service "
        f"after {out_of_service:.1f} s, recreated and Ready after {serving_again:.1f} s"
    )
