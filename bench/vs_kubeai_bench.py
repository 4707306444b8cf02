"""llmop beside KubeAI on one kwok cluster: N models at once, one pod each, and how long until
every pod exists, every pod is Ready and every CR says Ready, with each operator's CPU and peak
memory and the API server's CPU over the same window. Not a test: prints a Markdown table.

    KUBECONFIG=... python bench/vs_kubeai_bench.py --counts 100,1000 --kubeai DIR

DIR is what `e2e/cluster/build-kubeai.sh` prints: KubeAI v0.22.1's manager as shipped, the same
source with 16 Model workers (`kubeai-c16`, labelled as patched) and its Model CRD. Rows: `llmop`
(the operator from this checkout), `kubeai` (as shipped: one Model at a time and a 3 s sleep
after each pod it creates, so ~50 min at N = 1,000; run only up to `--stock-max`, default 100)
and `kubeai-c16`. Runs go one operator at a time, each in a fresh namespace that is deleted and
awaited before the next, in the order llmop, kubeai-c16, kubeai for each N.

What is alike: every CR asks for one pod with one GPU on the fake H100 nodes (bench nodes with
room for all of them are added first and removed at the end); kwok marks pods Ready at once;
the clock starts once the operator is up (llmop: its /healthz; KubeAI: its leader Lease
taken), at the first create; creates go from 16 threads. What differs (object graphs): llmop
makes a Deployment and a Service per CR and kube-controller-manager makes the ReplicaSet and
the Pod; KubeAI makes the Pod itself. Both are watched, not polled. Operator CPU is
utime+stime from just before the creates to the last CR Ready; peak RSS is VmHWM (the whole
process life); API server CPU is the kube-apiserver process's utime+stime over that window.
KubeAI's OpenAI server listens on :8000 (hard-coded), which must be free.
"""

from __future__ import annotations

import argparse
import itertools
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from llmop.kube import Kube, KubeError
from operator_bench import (
    APPLY_THREADS,
    CRD_FILE,
    SERVICE_CIDR,
    WatchThreads,
    add_pod_room,
    api_client,
    cpu_seconds,
    free_port,
    remove_pod_room,
    start_operator,
    wait_namespaces_gone,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.readiness import is_ready, watch_objects

LLMOP_API = "serving.llmop.dev/v1alpha1"
KUBEAI_API = "kubeai.org/v1"
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
KUBEAI_LEASE = "cc6bca10.substratus.ai"
"""The leader-election ID KubeAI's manager hard-codes (internal/manager/run.go)."""
KUBEAI_BINARIES = {"kubeai": "kubeai-manager", "kubeai-c16": "kubeai-manager-c16"}
"""build-kubeai.sh's binaries: as shipped, and with 16 Model workers (patched)."""
KUBEAI_STATE_CONFIGMAP = "kubeai-autoscaler-state"
"""Its autoscaler's state: startup fails unless this ConfigMap exists in its namespace."""


@dataclass
class Row:
    operator: str
    count: int
    pods_created: float
    pods_ready: float
    crs_ready: float
    operator_cpu: float
    operator_peak_mib: float
    apiserver_cpu: float


class Progress(WatchThreads):
    """Pods created, pods Ready and CRs Ready in one namespace, each counted from a watch, and
    the monotonic time each count first reached N."""

    def __init__(
        self,
        namespace: str,
        client_factory: Callable[[], Any],
        cr: tuple[str, str, str],
        cr_ready: Callable[[dict[str, Any]], bool],
    ) -> None:
        from kubernetes import client

        self._created: set[str] = set()
        self._pods_ready: set[str] = set()
        self._crs_ready: set[str] = set()
        self._cr_ready = cr_ready
        self._lock = threading.Lock()
        super().__init__()
        core = client.CoreV1Api(client_factory())
        custom = client.CustomObjectsApi(client_factory())
        group, version, plural = cr
        self._threads = [
            threading.Thread(
                target=watch_objects,
                args=(core.list_namespaced_pod, (namespace,), self._stop, self._on_pod),
                daemon=True,
            ),
            threading.Thread(
                target=watch_objects,
                args=(
                    custom.list_namespaced_custom_object,
                    (group, version, namespace, plural),
                    self._stop,
                    self._on_cr,
                ),
                daemon=True,
            ),
        ]

    def counts(self) -> tuple[int, int, int]:
        with self._lock:
            return len(self._created), len(self._pods_ready), len(self._crs_ready)

    def _on_pod(self, event_type: str, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        ready = event_type != "DELETED" and any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (pod.get("status") or {}).get("conditions") or []
        )
        with self._lock:
            self._created.add(name)  # a pod once created counts even if replaced later
            (self._pods_ready.add if ready else self._pods_ready.discard)(name)

    def _on_cr(self, event_type: str, obj: dict[str, Any]) -> None:
        ready = event_type != "DELETED" and self._cr_ready(obj)
        with self._lock:
            (self._crs_ready.add if ready else self._crs_ready.discard)(obj["metadata"]["name"])


def _model_ready(model: dict[str, Any]) -> bool:
    """A KubeAI Model has no Ready condition: its status counts ready replicas."""
    replicas = (model.get("status") or {}).get("replicas") or {}
    return int(replicas.get("ready") or 0) >= 1


def _llmop_cr(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": LLMOP_API,
        "kind": "LLMDeployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
            "engine": {"backend": "simulator"},
            "resources": {"gpus": 1, "gpuProduct": GPU_PRODUCT},
            "replicas": 1,
        },
    }


def _kubeai_model(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": KUBEAI_API,
        "kind": "Model",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "features": ["TextGeneration"],
            "url": "hf://Qwen/Qwen2.5-0.5B-Instruct",
            "engine": "VLLM",
            "resourceProfile": "nvidia-gpu-h100:1",
            "minReplicas": 1,
            "replicas": 1,
            # CRD defaults, spelled out as KubeAI's own docs do (kubeai-bench.md).
            "targetRequests": 100,
            "scaleDownDelaySeconds": 30,
        },
    }


def _kubeai_config(health_port: int, metrics_port: int) -> dict[str, Any]:
    """The chart's system config, trimmed to what the manager validates: one GPU profile whose
    pods land on the same fake H100 nodes as llmop's (kwok never pulls the images)."""
    return {
        "secretNames": {
            "alibaba": "kubeai-alibaba",
            "aws": "kubeai-aws",
            "gcp": "kubeai-gcp",
            "huggingface": "kubeai-huggingface",
        },
        "resourceProfiles": {
            "nvidia-gpu-h100": {
                "imageName": "nvidia-gpu",
                "limits": {"nvidia.com/gpu": "1"},
                "requests": {"nvidia.com/gpu": "1"},
                "nodeSelector": {"nvidia.com/gpu.product": GPU_PRODUCT},
            }
        },
        "cacheProfiles": {},
        "modelServers": {
            "VLLM": {"images": {"default": "vllm/vllm-openai:v0.10.2"}},
            "OLlama": {"images": {"default": "ollama/ollama:0.11.11"}},
            "FasterWhisper": {"images": {"default": "fedirz/faster-whisper-server:latest-cpu"}},
            "Infinity": {"images": {"default": "michaelf34/infinity:0.0.77"}},
        },
        "modelLoading": {"image": "ghcr.io/kubeai-project/kubeai-model-loader:v0.14.0"},
        "modelRollouts": {"surge": 1},
        "modelServerPods": {"serviceAccountName": "default"},
        "modelAutoscaling": {
            "interval": "10s",
            "timeWindow": "10m",
            "stateConfigMapName": KUBEAI_STATE_CONFIGMAP,
        },
        "messaging": {"streams": []},
        "metricsAddr": f"127.0.0.1:{metrics_port}",
        "healthAddress": f"127.0.0.1:{health_port}",
    }


def _start_kubeai(
    kube: Kube, binary: Path, namespace: str, workdir: Path, log: Any
) -> subprocess.Popen[bytes]:
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": KUBEAI_STATE_CONFIGMAP, "namespace": namespace},
        },
        field_manager="llmop-bench",
    )
    health, metrics = free_port(), free_port()
    config = workdir / f"kubeai-{namespace}.yaml"
    config.write_text(yaml.safe_dump(_kubeai_config(health, metrics)))
    env = dict(os.environ, POD_NAMESPACE=namespace, CONFIG_PATH=str(config))
    process = subprocess.Popen([str(binary)], env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{binary.name} exited during startup (see the log)")
        lease = kube.read("coordination.k8s.io/v1", "Lease", namespace, KUBEAI_LEASE) or {}
        if (lease.get("spec") or {}).get("holderIdentity"):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{health}/readyz", timeout=2):
                    return process
            except OSError:
                pass
        time.sleep(0.5)
    process.kill()
    raise RuntimeError(f"{binary.name} did not take its leader Lease within 120 s")


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def apiserver_pid(server: str) -> int:
    """The kube-apiserver process serving `server` (the kubeconfig's URL): the local cluster
    runs it as a host process (kwokctl's binary runtime)."""
    port = str(urlparse(server).port)
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not argv or not argv[0].endswith(b"kube-apiserver"):
            continue
        args = [a.decode() for a in argv]
        ports = {a.split("=", 1)[1] for a in args if a.startswith("--secure-port=")}
        ports |= {b for a, b in itertools.pairwise(args) if a == "--secure-port"}
        if port in ports:
            found.append(int(proc.name))
    if len(found) != 1:
        raise RuntimeError(f"expected one kube-apiserver on port {port}, found {found}")
    return found[0]


def run_one(
    kube: Kube,
    operator: str,
    count: int,
    *,
    kubeai_dir: Path,
    apiserver: int,
    timeout: float,
    workdir: Path,
    log: Any,
) -> Row:
    namespace = f"bench-{operator}-{count}-{secrets.token_hex(3)}"
    kube.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        field_manager="llmop-bench",
    )
    if operator == "llmop":
        process, _ = start_operator(log)
        make_cr, cr_ready = _llmop_cr, is_ready
        cr = ("serving.llmop.dev", "v1alpha1", "llmdeployments")
    else:
        binary = kubeai_dir / KUBEAI_BINARIES[operator]
        process = _start_kubeai(kube, binary, namespace, workdir, log)
        make_cr, cr_ready = _kubeai_model, _model_ready
        cr = ("kubeai.org", "v1", "models")
    progress = Progress(namespace, api_client, cr, cr_ready).start()
    reached: list[float | None] = [None, None, None]
    """When pods created, pods Ready and CRs Ready first reached N (seconds from the start)."""
    try:
        operator_cpu, apiserver_cpu = cpu_seconds(process.pid), cpu_seconds(apiserver)
        started = time.monotonic()

        def create(index: int) -> None:
            kube.apply(make_cr(f"m{index:04d}", namespace), field_manager="llmop-bench")

        with ThreadPoolExecutor(APPLY_THREADS) as pool:
            list(pool.map(create, range(count)))
        while reached[2] is None and time.monotonic() - started < timeout:
            now = time.monotonic() - started
            for index, seen in enumerate(progress.counts()):
                if reached[index] is None and seen >= count:
                    reached[index] = now
            time.sleep(0.2)  # counting from the watches only reads memory
        operator_cpu = cpu_seconds(process.pid) - operator_cpu
        apiserver_cpu = cpu_seconds(apiserver) - apiserver_cpu
        peak = _peak_rss_mib(process.pid)
    finally:
        progress.stop()
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
        kube.delete("v1", "Namespace", None, namespace)
    created, pods_ready, crs_ready = (float("nan") if at is None else at for at in reached)
    return Row(operator, count, created, pods_ready, crs_ready, operator_cpu, peak, apiserver_cpu)


HEADER = (
    "| operator | N | all pods created s | all pods Ready s | all CRs Ready s | operator CPU s "
    "| operator peak RSS MiB | API server CPU s |"
)


def table_line(row: Row) -> str:
    label = "kubeai-c16 (patched: 16 workers)" if row.operator == "kubeai-c16" else row.operator
    return (
        f"| {label} | {row.count} | {row.pods_created:.1f} | {row.pods_ready:.1f} "
        f"| {row.crs_ready:.1f} | {row.operator_cpu:.1f} | {row.operator_peak_mib:.0f} "
        f"| {row.apiserver_cpu:.1f} |"
    )


def plan_runs(counts: list[int], operators: list[str], stock_max: int) -> list[tuple[str, int]]:
    """Per N, llmop first, then the patched and the stock KubeAI (stock only up to stock_max)."""
    order = [o for o in ("llmop", "kubeai-c16", "kubeai") if o in operators]
    return [
        (operator, count)
        for count in counts
        for operator in order
        if operator != "kubeai" or count <= stock_max
    ]


def _install_crds(kube: Kube, kubeai_dir: Path) -> None:
    crd_kind = ("apiextensions.k8s.io/v1", "CustomResourceDefinition")
    for path in (CRD_FILE, kubeai_dir / "config" / "kubeai.org_models.yaml"):
        crd = yaml.safe_load(path.read_text())
        if kube.read(*crd_kind, None, crd["metadata"]["name"]) is None:
            kube.apply(crd, field_manager="llmop-bench")
    deadline = time.monotonic() + 60
    for name in ("llmdeployments.serving.llmop.dev", "models.kubeai.org"):
        while not _established(kube.read(*crd_kind, None, name)):
            if time.monotonic() > deadline:
                raise RuntimeError(f"CRD {name} not Established after 60 s")
            time.sleep(0.5)


def _established(crd: dict[str, Any] | None) -> bool:
    conditions = ((crd or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", default=os.environ.get("N", "100,1000"))
    parser.add_argument("--kubeai", type=Path, required=True, help="build-kubeai.sh's directory")
    parser.add_argument("--only", default="llmop,kubeai-c16,kubeai", help="operators to run")
    parser.add_argument(
        "--stock-max", type=int, default=100, help="largest N for stock KubeAI (~3 s per model)"
    )
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    args = parser.parse_args()
    counts = [int(n) for n in str(args.counts).split(",") if n.strip()]
    operators = [o.strip() for o in str(args.only).split(",") if o.strip()]
    try:
        kube = Kube.connect(pool_size=APPLY_THREADS)
    except KubeError as error:
        print(f"vs_kubeai_bench: {error}", file=sys.stderr)
        return 2
    from kubernetes import config

    server = config.new_client_from_config().configuration.host  # type: ignore[no-untyped-call]
    apiserver = apiserver_pid(server)
    kube.apply(SERVICE_CIDR, field_manager="llmop-bench")
    _install_crds(kube, args.kubeai)
    add_pod_room(kube, max(counts), gpus=True)
    with (
        tempfile.TemporaryDirectory(prefix="llmop-vs-kubeai-") as workdir,
        tempfile.NamedTemporaryFile(
            "ab", prefix="llmop-vs-kubeai-", suffix=".log", delete=False
        ) as log,
    ):
        print(f"operator logs: {log.name}", file=sys.stderr)
        print(HEADER)
        print("|---|---:|---:|---:|---:|---:|---:|---:|", flush=True)
        for operator, count in plan_runs(counts, operators, args.stock_max):
            row = run_one(
                kube,
                operator,
                count,
                kubeai_dir=args.kubeai,
                apiserver=apiserver,
                timeout=args.timeout,
                workdir=Path(workdir),
                log=log,
            )
            print(table_line(row), flush=True)
            wait_namespaces_gone(kube)
    remove_pod_room(kube)
    return 0


if __name__ == "__main__":
    sys.exit(main())
