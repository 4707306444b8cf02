"""What the e2e tests do on the real node: LLMDeployments sized for it, the Service's ClusterIP,
streaming load through it in the background, and pod-level observations (restarts, readiness
flips) read from the API server."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support.cluster import REPO_ROOT, Cluster, start_cluster, stop_cluster, wait_until
from support.harness.loadgen import LoadResult, ServiceEndpoint, run_clients
from support.operator import Kit, OperatorProcess, install_crd, operator_kubeconfig_for

NODE_SH = REPO_ROOT / "e2e" / "cluster" / "node.sh"
IMAGES_PY = REPO_ROOT / "e2e" / "images" / "images.py"
REAL_NODE = "llmop-real-node"
# The node's containerd (e2e/cluster/node.sh: $RUN_DIR/containerd/containerd.sock).
NODE_CONTAINERD = "/run/llmop-node/containerd/containerd.sock"

# Small enough that 3 replicas plus a surge pod fit the node's 2 CPUs with room for the operator
# and the clients; limits equal requests, so each engine is throttled to this.
ENGINE_CPU = "200m"
ENGINE_MEMORY = "256Mi"


# The real vLLM CPU engine on the node (tests/e2e/test_vllm_cpu_pod.py, bench/rollout_bench.py
# --vllm): the tiny model (tests/support/tiny_model.py) in MODEL_SUBDIR of a hostPath volume.
MODEL_SUBDIR = "tiny"
# The planner's default KV budget for this memory is 1 GiB (VLLM_CPU_KVCACHE_SPACE=1), next to the
# ~3.2 GiB vLLM's CPU runtime holds: 3.6-4.2 GiB measured per engine.
VLLM_CPU_MEMORY = "6Gi"
MODEL_VOLUME_ROOT = Path("/var/lib/llmop-e2e")


def vllm_cpu_spec(claim: str, *, replicas: int = 1, max_num_seqs: int = 16) -> dict[str, Any]:
    """An LLMDeployment of vLLM's CPU build (backend vllm, no GPU) serving the tiny model from
    `pvc://<claim>/tiny`; nothing in it names the node or the image."""
    return {
        "model": {"name": f"pvc://{claim}/{MODEL_SUBDIR}"},
        "engine": {
            "backend": "vllm",
            # The random model is saved in float32; vLLM's CPU build would cast it otherwise.
            "dtype": "float32",
            "maxModelLen": 2048,
            "maxNumSeqs": max_num_seqs,
        },
        "resources": {"gpus": 0, "memory": VLLM_CPU_MEMORY},
        "rollout": {"drainSeconds": 20, "endpointPropagationSeconds": 3},
        "replicas": replicas,
    }


def create_model_volume(cluster: Cluster, namespace: str, claim: str, model: Path) -> str:
    """A copy of `model` in a hostPath PersistentVolume of the real node, bound to a new claim
    `claim` in `namespace` (static: one node needs no provisioner). Returns the volume's name
    for delete_model_volume."""
    pv_name = _node_volume(cluster, namespace, claim, "1Gi", model=model)
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim, "namespace": namespace},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "",
            "volumeName": pv_name,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    cluster.kubectl("create", "-f", "-", input=json.dumps(pvc))
    return pv_name


def create_cache_volume(cluster: Cluster, namespace: str, claim: str, size: str) -> str:
    """An empty hostPath PersistentVolume of the real node, pre-bound to the claim `claim` the
    operator makes for `spec.model.cache`. Returns the volume's name for delete_model_volume."""
    return _node_volume(cluster, namespace, claim, size, model=None)


def _node_volume(
    cluster: Cluster, namespace: str, claim: str, size: str, *, model: Path | None
) -> str:
    pv_name = f"{claim}-{namespace}"
    path = MODEL_VOLUME_ROOT / pv_name
    shutil.rmtree(path, ignore_errors=True)
    if model is None:
        path.mkdir(parents=True)
        os.chmod(path, 0o777)  # the download pod runs as uid 10001; hostPath ignores fsGroup
    else:
        shutil.copytree(model, path / MODEL_SUBDIR)
        for root, _dirs, files in os.walk(path):  # the engine runs as uid 10001
            os.chmod(root, 0o755)
            for f in files:
                os.chmod(Path(root) / f, 0o644)
    node_affinity = {
        "required": {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {"key": "kubernetes.io/hostname", "operator": "In", "values": [REAL_NODE]}
                    ]
                }
            ]
        }
    }
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": pv_name},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "hostPath": {"path": str(path), "type": "Directory"},
            "claimRef": {"namespace": namespace, "name": claim},
            "nodeAffinity": node_affinity,
        },
    }
    cluster.kubectl("create", "-f", "-", input=json.dumps(pv))
    return pv_name


def delete_model_volume(cluster: Cluster, pv_name: str) -> None:
    cluster.kubectl("delete", "pv", pv_name, "--wait=false", check=False)
    shutil.rmtree(MODEL_VOLUME_ROOT / pv_name, ignore_errors=True)


def real_node_unavailable() -> str | None:
    """Why this host cannot run the real node, or None when it can."""
    result = subprocess.run(
        [str(NODE_SH), "check"], capture_output=True, text=True, check=False, timeout=60
    )
    if result.returncode == 0:
        return None
    return (result.stdout + result.stderr).strip() or f"node.sh check exited {result.returncode}"


def import_into_node(*images: str, timeout: float = 30 * 60) -> float:
    """Build (or reuse from the cache) and import images into the running node's containerd,
    for tests that need more than the node imports at start (the 6 GB engine-cpu image only
    where a test runs it). In the open: a cold build's progress shows in the CI log. Returns
    the seconds it took (a warm cache and an imported image: about a second)."""
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, str(IMAGES_PY), "import", "--address", NODE_CONTAINERD, *images],
        stdout=subprocess.DEVNULL,
        check=False,
        timeout=timeout,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{IMAGES_PY} import {' '.join(images)} failed ({result.returncode})")
    return time.monotonic() - started


@dataclass
class RealCluster:
    """The e2e cluster: kubectl access, the operator process and the reading kit."""

    cluster: Cluster
    operator: OperatorProcess
    kit: Kit

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> Any:
        return self.cluster.kubectl(*args, check=check, input=input)

    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        out = self.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout
        items: list[dict[str, Any]] = json.loads(out)["items"]
        return items


@contextlib.contextmanager
def operator_on_real_node(
    tag: str,
    workdir: Path,
    extra_env: Mapping[str, str] | None = None,
    *,
    metrics: str = "auto",
) -> Iterator[RealCluster]:
    """A private cluster with this machine's real node joined, the CRD installed and the
    operator running (its log in `workdir`); all of it gone on exit. Waits for the node while
    another test or bench session holds it. `tag` marks the cluster's name (e2e, bench);
    `metrics` is cluster.sh's LLMOP_METRICS ("off": started later by start_metrics_pipeline)."""
    # llmop-test-<pid>-…: cluster.sh reaps it if this process dies without cleaning up.
    name = f"llmop-test-{os.getpid()}-{tag}{secrets.token_hex(2)}"

    def stop() -> None:
        try:
            stop_cluster(name)
        except Exception as exc:  # clean-up must not mask the result
            print(f"warning: stopping cluster {name}: {exc}", file=sys.stderr)

    atexit.register(stop)
    operator: OperatorProcess | None = None
    try:
        cluster = start_cluster(name, owner_pid=os.getpid(), real_node="on", metrics=metrics)
        install_crd(cluster)
        operator = OperatorProcess(
            operator_kubeconfig_for(cluster, workdir),
            workdir / "operator.log",
            extra_env=dict(extra_env or {}),
        )
        operator.start()
        yield RealCluster(cluster=cluster, operator=operator, kit=Kit(cluster))
    finally:
        if operator is not None:
            operator.stop()
        stop()
        atexit.unregister(stop)


def node_log_dir() -> Path:
    cache = os.environ.get("LLMOP_CACHE") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llmop"
    )
    return Path(cache) / "node" / "logs"


def real_node_spec(replicas: int = 1, **overrides: Any) -> dict[str, Any]:
    """A simulator LLMDeployment as a user writes it: nothing in it names the real node.

    It lands there because the node advertises nvidia.com/gpu and the kwok nodes are tainted
    while the real node is joined. Short drain/propagation windows keep rollouts quick.
    """
    spec: dict[str, Any] = {
        "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
        "engine": {
            "backend": "simulator",
            "maxModelLen": 2048,
            "maxNumSeqs": 16,
            # ≈ a small model on one GPU: 64 tokens in ~1.3 s, so streams are in flight when
            # pods go away.
            "args": ["--sim-decode-ms", "20"],
        },
        "resources": {"gpus": 1, "cpu": ENGINE_CPU, "memory": ENGINE_MEMORY},
        "rollout": {"drainSeconds": 20, "endpointPropagationSeconds": 3},
        "replicas": replicas,
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key] = {**spec[key], **value}
        else:
            spec[key] = value
    return spec


@dataclass(frozen=True)
class PodSpecStyle:
    """How a rival renders the engine pod (same engine, no llmop agent): readiness on the
    engine's /health, optional fixed preStop sleep, fixed grace and shutdown timeout."""

    name: str
    readiness: dict[str, Any]
    pre_stop_sleep: int = 0
    grace_seconds: int = 30
    shutdown_timeout: int = 0


# KubeAI (internal/modelcontroller/engine_vllm.go): readiness /health 10 s, no preStop, TGPS 30 s,
# vLLM's default shutdown (in-flight requests aborted). Also what a hand-written manifest does.
KUBEAI_STYLE = PodSpecStyle(
    "kubeai-style",
    {"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 10, "timeoutSeconds": 2},
)
# KServe LLMInferenceService (config/llmisvcconfig/config-llm-template.yaml): readiness /health
# 1 s / 1 s / 2 failures, preStop sleep 15, TGPS 60, vLLM --shutdown-timeout 45.
KSERVE_STYLE = PodSpecStyle(
    "kserve-llmisvc-style",
    {
        "httpGet": {"path": "/health", "port": 8000},
        "periodSeconds": 1,
        "timeoutSeconds": 1,
        "failureThreshold": 2,
    },
    pre_stop_sleep=15,
    grace_seconds=60,
    shutdown_timeout=45,
)


def _plain_container(image: str, args: list[str], style: PodSpecStyle, gpus: int) -> dict[str, Any]:
    """The engine container as a rival renders it: the simulator itself is the pod's process."""
    if style.shutdown_timeout:
        args = [*args, "--shutdown-timeout", str(style.shutdown_timeout)]
    limits: dict[str, Any] = {"cpu": ENGINE_CPU, "memory": ENGINE_MEMORY}
    if gpus:
        limits["nvidia.com/gpu"] = gpus
    container: dict[str, Any] = {
        "name": "engine",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "args": args,
        "ports": [{"name": "http", "containerPort": 8000}],
        "resources": {"limits": limits, "requests": {"cpu": ENGINE_CPU, "memory": ENGINE_MEMORY}},
    }
    if style.pre_stop_sleep:
        container["lifecycle"] = {
            "preStop": {"exec": {"command": ["sleep", str(style.pre_stop_sleep)]}}
        }
    return container


def _plain_pod_spec(style: PodSpecStyle, container: dict[str, Any]) -> dict[str, Any]:
    return {
        "terminationGracePeriodSeconds": style.grace_seconds,
        "containers": [container],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "nodeSelector": {"llmop.dev/real-node": "true"},
    }


def plain_engine_deployment(
    namespace: str,
    name: str,
    image: str,
    style: PodSpecStyle,
    engine_args: list[str],
    *,
    gpus: int = 0,
) -> dict[str, Any]:
    """A Deployment running the simulator engine directly, rendered the way `style` does; with
    `gpus`, each pod requests that many `nvidia.com/gpu` as llmop's engine pods do."""
    labels = {"app": name}
    args = ["simulate", "--model", name, "--port", "8000", *engine_args]
    container = _plain_container(image, args, style, gpus)
    container["readinessProbe"] = style.readiness
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": labels},
            "strategy": {"rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {"metadata": {"labels": labels}, "spec": _plain_pod_spec(style, container)},
        },
    }


# KServe LLMInferenceService's multi-node preset (config-llm-worker-data-parallel.yaml; the
# PP preset of kserve#5315 is the same shape): leader readiness /health 1 s x 2 and liveness
# /health 10 s x 10, workers without probes, preStop sleep 15 on both, TGPS 60, --shutdown-timeout
# 15; LWS RecreateGroupOnPodRestart, LeaderCreated, one group at a time.
KSERVE_GROUP_STYLE = PodSpecStyle(
    "kserve-llmisvc-style",
    KSERVE_STYLE.readiness,
    pre_stop_sleep=15,
    grace_seconds=60,
    shutdown_timeout=15,
)
KSERVE_LEADER_LIVENESS = {
    "httpGet": {"path": "/health", "port": 8000},
    "periodSeconds": 10,
    "failureThreshold": 10,
}
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"


def plain_group_lws(
    namespace: str,
    name: str,
    image: str,
    style: PodSpecStyle,
    engine_args: list[str],
    *,
    replicas: int = 2,
    gpus: int = 1,
) -> dict[str, Any]:
    """A LeaderWorkerSet of the simulator in vLLM's `--nnodes 2` roles with no llmop agent,
    rendered the way `style` does: probes on the leader only, the rank itself as each pod's
    process. A per-group headless Service, as llmop renders (the rival names its LWS apart from
    its Service instead; the DNS records are the same)."""

    def template(leader: bool) -> dict[str, Any]:
        rank = "0" if leader else "$(LWS_WORKER_INDEX)"
        args = ["simulate", "--model", name, "--port", "8000", *engine_args]
        args += ["--pipeline-parallel-size", "2", "--nnodes", "2", "--node-rank", rank]
        args += ["--master-addr", "$(LWS_LEADER_ADDRESS)", "--distributed-executor-backend", "mp"]
        container = _plain_container(image, args if leader else [*args, "--headless"], style, gpus)
        if leader:
            container["readinessProbe"] = style.readiness
            container["livenessProbe"] = KSERVE_LEADER_LIVENESS
        return {"metadata": {"labels": {"app": name}}, "spec": _plain_pod_spec(style, container)}

    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "startupPolicy": "LeaderCreated",
            "rolloutStrategy": {
                "type": "RollingUpdate",
                "rollingUpdateConfiguration": {"partition": 0, "maxUnavailable": 1, "maxSurge": 0},
            },
            "networkConfig": {"subdomainPolicy": "UniquePerReplica"},
            "leaderWorkerTemplate": {
                "size": 2,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": template(leader=True),
                "workerTemplate": template(leader=False),
            },
        },
    }


def plain_service(namespace: str, name: str, *, leaders_only: bool = False) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "selector": {"app": name} | ({LWS_WORKER_INDEX_LABEL: "0"} if leaders_only else {}),
            "ports": [{"name": "http", "port": 8000}],
        },
    }


def wait_rolled_out(cluster: Cluster, namespace: str, deployment: str, replicas: int) -> float:
    """Wait until the Deployment observed its spec and every pod is updated, available and the
    only one; returns the seconds waited."""
    start = time.monotonic()

    def done() -> bool:
        dep = json.loads(
            cluster.kubectl("get", "deployment", "-n", namespace, deployment, "-o", "json").stdout
        )
        st = dep.get("status", {})
        return bool(
            st.get("observedGeneration") == dep["metadata"]["generation"]
            and st.get("updatedReplicas") == replicas
            and st.get("availableReplicas") == replicas
            and st.get("replicas") == replicas
        )

    wait_until(done, timeout=300, interval=1, what=f"{namespace}/{deployment} rolled out")
    return time.monotonic() - start


def service_url(cluster: Cluster, namespace: str, name: str) -> str:
    """http://<ClusterIP>:<port> of a Service (reached through kube-proxy's rules)."""
    svc = json.loads(cluster.kubectl("get", "service", "-n", namespace, name, "-o", "json").stdout)
    port = next(p["port"] for p in svc["spec"]["ports"] if p.get("name") == "http")
    return f"http://{svc['spec']['clusterIP']}:{port}"


def post_json(
    url: str, body: dict[str, Any], timeout: float = 30, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        status: int = response.status
        raw = response.read().decode()
    return status, json.loads(raw) if raw.startswith(("{", "[")) else raw


@dataclass
class BackgroundLoad:
    """Streaming clients against one URL in a thread of their own until `duration` ends."""

    url: str
    model: str
    concurrency: int = 8
    duration: float = 60.0
    max_tokens: int = 64
    # One connection per request (see run_clients): what kube-proxy can route per request.
    keepalive: bool = False
    headers: dict[str, str] = field(default_factory=dict)
    """Sent with every request (a gateway's `Authorization`)."""
    result: LoadResult | None = None
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _error: BaseException | None = field(default=None, repr=False)

    def start(self) -> BackgroundLoad:
        def run() -> None:
            try:
                self.result = asyncio.run(
                    run_clients(
                        ServiceEndpoint(self.url),
                        self.concurrency,
                        self.duration,
                        self.model,
                        self.max_tokens,
                        should_stop=self._stop.is_set,
                        keepalive=self.keepalive,
                        headers=self.headers,
                    )
                )
            except BaseException as exc:  # surfaced by join()
                self._error = exc

        self._thread = threading.Thread(target=run, name="load", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> LoadResult:
        """End the load: no new requests; waits for those in flight."""
        self._stop.set()
        return self.join()

    def join(self) -> LoadResult:
        assert self._thread is not None
        self._thread.join(timeout=self.duration + 180)
        if self._error is not None:
            raise self._error
        assert self.result is not None, "the load thread did not finish"
        return self.result


def summary(result: LoadResult) -> str:
    return (
        f"{result.total} requests, {result.failed} failed, {result.truncated} truncated, "
        f"p99 TTFT {result.ttft_quantile(0.99):.2f}s; {dict(result.reasons)}"
    )


class PodWatch:
    """Samples the pods of a selector: restarts and Ready flips, without holding a watch."""

    def __init__(self, cluster: Cluster, namespace: str, selector: str) -> None:
        self.cluster, self.namespace, self.selector = cluster, namespace, selector
        self.ready_flips = 0
        self._last_ready: dict[str, bool] = {}
        self.restarts: dict[str, int] = {}

    def sample(self) -> list[dict[str, Any]]:
        out = self.cluster.kubectl(
            "get", "pods", "-n", self.namespace, "-l", self.selector, "-o", "json"
        ).stdout
        pods: list[dict[str, Any]] = json.loads(out)["items"]
        for pod in pods:
            name = pod["metadata"]["name"]
            ready = pod_ready(pod)
            if name in self._last_ready and self._last_ready[name] != ready:
                self.ready_flips += 1
            self._last_ready[name] = ready
            self.restarts[name] = sum(
                s.get("restartCount", 0) for s in pod["status"].get("containerStatuses") or []
            )
        return pods


def ready_status(cr: dict[str, Any] | None) -> str | None:
    """The status of an LLMDeployment's Ready condition ("True", "False", ...), None without one."""
    for condition in ((cr or {}).get("status") or {}).get("conditions") or []:
        if condition["type"] == "Ready":
            return str(condition["status"])
    return None


def group_pods(rc: RealCluster, namespace: str, name: str) -> dict[str, dict[str, Any]]:
    """A multi-node CR's pods not being deleted, by name (`<name>-<g>` leaders, `-<g>-<i>`
    workers)."""
    return {
        p["metadata"]["name"]: p
        for p in rc.pods(namespace, f"{LWS_NAME_LABEL}={name}")
        if not p["metadata"].get("deletionTimestamp")
    }


def group_recreated(rc: RealCluster, namespace: str, name: str, old_leader_uid: str) -> bool:
    """Group 0 of a two-pod group came back whole: a new leader, its worker, the CR Ready."""
    found = group_pods(rc, namespace, name)
    leader = found.get(f"{name}-0")
    return bool(
        leader is not None
        and leader["metadata"]["uid"] != old_leader_uid
        and f"{name}-0-1" in found
        and ready_status(rc.kit.get_llmd(namespace, name)) == "True"
    )


def pod_ready(pod: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in pod.get("status", {}).get("conditions") or []
    )


def wait_pods(
    cluster: Cluster,
    namespace: str,
    selector: str,
    check: Callable[[list[dict[str, Any]]], bool],
    *,
    timeout: float,
    what: str,
) -> list[dict[str, Any]]:
    def probe() -> list[dict[str, Any]] | None:
        out = cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout
        pods: list[dict[str, Any]] = json.loads(out)["items"]
        return pods if check(pods) else None

    return wait_until(probe, timeout=timeout, interval=0.5, what=what)


def monotonic_since(start: float) -> float:
    return time.monotonic() - start


def group_story(rc: RealCluster, namespace: str, name: str, *, log_lines: int = 8) -> str:
    """What a multi-node CR's rollout left behind, for a failed wait's message: the
    LeaderWorkerSet's status, the CR's conditions, and each group pod (deleting ones included)
    with its phase, readiness, restarts, containers' states and the last lines of their logs."""
    lines: list[str] = []
    lws = rc.kit.get("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", namespace, name) or {}
    lines.append(f"LeaderWorkerSet status: {json.dumps(lws.get('status') or {}, sort_keys=True)}")
    cr = rc.kit.get_llmd(namespace, name) or {}
    for condition in (cr.get("status") or {}).get("conditions") or []:
        lines.append(
            f"CR {condition['type']}={condition['status']} {condition.get('reason')}: "
            f"{condition.get('message')}"
        )
    for pod in rc.pods(namespace, f"{LWS_NAME_LABEL}={name}"):
        meta, status = pod["metadata"], pod.get("status") or {}
        lines.append(
            f"pod {meta['name']} uid={meta['uid'][:8]} phase={status.get('phase')} "
            f"ready={pod_ready(pod)} deleting={bool(meta.get('deletionTimestamp'))} "
            f"created={meta.get('creationTimestamp')}"
        )
        for container in status.get("containerStatuses") or []:
            lines.append(
                f"  {container['name']}: restarts={container.get('restartCount', 0)} "
                f"state={json.dumps(container.get('state'), sort_keys=True)} "
                f"last={json.dumps(container.get('lastState'), sort_keys=True)}"
            )
            for previous in (False, True) if container.get("restartCount") else (False,):
                args = ["logs", "-n", namespace, meta["name"], "-c", container["name"]]
                args += ["--tail", str(log_lines)] + (["--previous"] if previous else [])
                out = rc.kubectl(*args, check=False)
                tail = (out.stdout or out.stderr or "").strip()
                label = "previous log" if previous else "log"
                lines.append(f"  {label}:\n    " + tail.replace("\n", "\n    "))
    return "\n".join(lines)
