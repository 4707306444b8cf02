"""Operator throughput benchmark: apply N LLMDeployments at once against a running cluster and
measure how long `llmop run` takes until every one has its children and a written status, and
how much memory the operator uses. Not a test: prints a table.

    KUBECONFIG=... python bench/operator_bench.py --counts 100,500,1000

The CRs use the simulator backend with `replicas: 0`, so the numbers measure the operator
(watch, plan, render, server-side apply, status) rather than the fake kubelets starting pods.
`obs.gen` is, per CR, the seconds from its apply returning to the first status with
`observedGeneration` seen by a watch (median and max): what a GitOps tool waits for.
`--replicas 1` gives every CR a pod (kwok makes it ready at once, on fake nodes the bench adds
for them and removes at the end) and also reports when all CRs were Ready and how often a CR's
Ready condition went True → False → True at one generation (watched, not polled, so short dips
count), and per CR the seconds from its pod's Ready to its own (`lag`, median and max) and from
its Deployment's Available to its Ready (`op lag`: the operator's share), from the conditions'
lastTransitionTime. The operator's CPU time is read from /proc before it stops; `--profile DIR`
samples it with py-spy (a dev dependency) into DIR.

`--floor` (FLOOR=1) runs no operator: the bench itself applies each CR's Deployment and Service
(rendered by llmop, owned by the CR) right after the CR, from the same threads, and `status s`
is when every Deployment's controller had observed it (what the operator's first status waits
for). What the cluster alone takes to make the same objects on this machine: the floor under
the operator's figures. CPU and RSS are then empty. `--floor kopf` (FLOOR=kopf) also runs
`bench/null_operator.py` (llmop's kopf watch layout, handlers that do nothing) and reports its
CPU and RSS: kopf's own cost for the same watch events, the floor under `llmop run`'s CPU and
memory; `--floor kopf-no-indexes` leaves the child kinds' indexes out of it.

`--router` (ROUTER=1) also runs `llmop-router` against the cluster from before the first CR:
seconds until its `/v1/models` lists all N, its CPU until then, and then, with nothing sent and
nothing changing, the router's and the operator's CPU over an idle minute and the router's RSS
(what N routed CRs cost while idle).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Self

import yaml

from llmop.api.v1alpha1 import LLMDeployment
from llmop.config import OperatorConfig
from llmop.desired import desired_state
from llmop.kube import Kube, KubeError
from llmop.names import FIELD_MANAGER, LABEL_DEPLOYMENT
from llmop.plan import owner_reference, with_owner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.readiness import ReadyWatch, watch_objects

API_VERSION = "serving.llmop.dev/v1alpha1"
REPO_ROOT = Path(__file__).resolve().parents[1]
CRD_FILE = REPO_ROOT / "crds" / "serving.llmop.dev_llmdeployments.yaml"
APPLY_THREADS = 16
BENCH_NODE_PODS = 500
BENCH_NODE_PREFIX = "llmop-bench-"
SERVICE_CIDR = {
    "apiVersion": "networking.k8s.io/v1",
    "kind": "ServiceCIDR",
    "metadata": {"name": "llmop-bench"},
    "spec": {"cidrs": ["10.96.0.0/16"]},
}
"""Room for thousands of ClusterIPs (Kubernetes >= 1.33 adds Service ranges at runtime)."""
RENDER_SETTINGS = OperatorConfig().render_settings()
"""What `--floor` renders the children with (the operator's defaults)."""


@dataclass
class Row:
    count: int
    apply_seconds: float
    children_seconds: float
    status_seconds: float
    rss_mib: float
    peak_rss_mib: float
    status_writes: float
    cpu_seconds: float = float("nan")
    passes: float = float("nan")
    """Reconcile passes the operator ran (`llmop_reconciles_total`, every trigger)."""
    pass_seconds: float = float("nan")
    """Their summed duration (`llmop_reconcile_duration_seconds_sum`): the work the passes did."""
    observed_lag_median: float = float("nan")
    """Per CR, seconds from its apply to its first status with observedGeneration (median)."""
    observed_lag_max: float = float("nan")
    ready_seconds: float = float("nan")
    flaps: int = 0
    ready_dips: int = 0
    ready_lag_median: float = float("nan")
    ready_lag_max: float = float("nan")
    ready_lag_count: int = 0
    operator_lag_max: float = float("nan")
    router: RouterCost | None = None


@dataclass
class RouterCost:
    listed_seconds: float
    """From the first CR's apply until the router's /v1/models lists all of them."""
    busy_cpu_seconds: float
    """The router's CPU from its start until then."""
    idle_cpu_percent: float
    """The router's CPU over `IDLE_SECONDS` with nothing sent, in % of one core."""
    operator_idle_cpu_percent: float
    rss_mib: float


IDLE_SECONDS = 60.0


def api_client() -> Any:
    from kubernetes import config

    return config.new_client_from_config()  # type: ignore[no-untyped-call]


def _bench_namespaces(kube: Kube) -> list[str]:
    return [
        ns["metadata"]["name"]
        for ns in kube.list("v1", "Namespace")
        if ns["metadata"]["name"].startswith("bench-")
    ]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(
        float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if line.split("{")[0].split(" ")[0] == name
    )


def _start_router(log: Any) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    kubeconfig = os.environ.get("KUBECONFIG", str(Path.home() / ".kube" / "config"))
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "llmop_router", "serve"),
            *("--host", "127.0.0.1", "--port", str(port), "--kubeconfig", kubeconfig),
            *("--admin-port", str(free_port())),
            *("--shutdown-delay", "0"),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    return process, f"http://127.0.0.1:{port}"


def _models_listed(url: str) -> int:
    try:
        with urllib.request.urlopen(url + "/v1/models", timeout=5) as response:
            return len(json.load(response)["data"])
    except OSError:
        return 0


def _router_cost(
    router: subprocess.Popen[bytes], url: str, operator: int, count: int, started: float
) -> RouterCost:
    """Wait for the router to list all `count` models, then measure an idle minute."""
    deadline = time.monotonic() + 300
    while _models_listed(url) < count and time.monotonic() < deadline:
        time.sleep(0.5)
    listed = time.monotonic() - started if _models_listed(url) >= count else float("nan")
    busy = cpu_seconds(router.pid)
    router_cpu, operator_cpu, window = busy, cpu_seconds(operator), time.monotonic()
    time.sleep(IDLE_SECONDS)
    window = time.monotonic() - window
    return RouterCost(
        listed_seconds=listed,
        busy_cpu_seconds=busy,
        idle_cpu_percent=100 * (cpu_seconds(router.pid) - router_cpu) / window,
        operator_idle_cpu_percent=100 * (cpu_seconds(operator) - operator_cpu) / window,
        rss_mib=_rss_mib(router.pid),
    )


FLOORS = ("cluster", "kopf", "kopf-no-indexes")
"""What `--floor` runs instead of `llmop run`: nothing, or `null_operator.py` (without the
child indexes)."""


def start_operator(log: Any, floor: str = "") -> tuple[subprocess.Popen[bytes], int]:
    """`llmop run`, or with `floor` "kopf…" the null operator; returns it and its metrics port
    (0 for the null operator)."""
    liveness, metrics = free_port(), free_port()
    if floor:
        command = [sys.executable, str(Path(__file__).with_name("null_operator.py")), str(liveness)]
        if floor == "kopf-no-indexes":
            command.append("--no-child-indexes")
        metrics = 0
    else:
        command = [str(Path(sys.executable).with_name("llmop")), "run"]
    env = dict(
        os.environ,
        LLMOP_LIVENESS_PORT=str(liveness),
        LLMOP_METRICS_PORT=str(metrics),
        LLMOP_BIND_ADDRESS="127.0.0.1",
    )
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError("operator exited during startup")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{liveness}/healthz", timeout=2):
                return process, metrics
        except OSError:
            time.sleep(0.5)
    raise RuntimeError("operator did not become healthy")


GPU_LABELS = {
    "nvidia.com/gpu.present": "true",
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    "nvidia.com/gpu.memory": "81559",
}
"""What the cluster's fake H100 nodes carry (e2e/cluster/gpu-nodes.yaml): GPU pods land here."""


def _bench_node(name: str, *, gpus: bool = False) -> dict[str, Any]:
    room = {
        "cpu": "4000",
        "memory": "64Ti",
        "pods": str(BENCH_NODE_PODS),
        "ephemeral-storage": "10Ti",
    }
    if gpus:
        room["nvidia.com/gpu"] = str(BENCH_NODE_PODS)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            # The cluster's kwok plays the kubelet of nodes with this annotation (cluster.sh).
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "type": "kwok",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                **(GPU_LABELS if gpus else {}),
            },
        },
        "status": {"capacity": room, "allocatable": room},
    }


def add_pod_room(kube: Kube, pods: int, timeout: float = 120, *, gpus: bool = False) -> None:
    """Fake nodes with room for `pods` more pods (`gpus`: one-GPU pods on H100 nodes), Ready
    before the clock starts: the cluster's four GPU nodes hold 440 pods and 32 GPUs, short of
    one pod for each of 1,000 CRs."""
    names = [f"{BENCH_NODE_PREFIX}{index}" for index in range(math.ceil(pods / BENCH_NODE_PODS))]
    for name in names:
        node = _bench_node(name, gpus=gpus)
        kube.apply(node, field_manager="llmop-bench")
        # An apply keeps no status on an existing node; the status subresource does.
        kube.patch_status("v1", "Node", None, name, node["status"])
    deadline = time.monotonic() + timeout
    while not all(_node_ready(kube, name) for name in names):
        if time.monotonic() > deadline:
            raise RuntimeError(f"bench nodes {names} not Ready after {timeout:.0f}s: is kwok up?")
        time.sleep(1)


def remove_pod_room(kube: Kube) -> None:
    """Delete the bench's nodes: call after the bench namespaces are gone, since a node deleted
    under its pods would leave them to the pod GC."""
    for node in kube.list("v1", "Node"):
        if node["metadata"]["name"].startswith(BENCH_NODE_PREFIX):
            kube.delete("v1", "Node", None, node["metadata"]["name"])


def wait_namespaces_gone(kube: Kube, timeout: float = 600) -> None:
    """The next run's operator would otherwise resume (and be timed on) these CRs."""
    deadline = time.monotonic() + timeout
    while _bench_namespaces(kube) and time.monotonic() < deadline:
        time.sleep(2)


def _node_ready(kube: Kube, name: str) -> bool:
    node = kube.read("v1", "Node", None, name) or {}
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _true_since(obj: dict[str, Any], condition_type: str) -> datetime | None:
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition.get("type") == condition_type and condition.get("status") == "True":
            return datetime.fromisoformat(condition["lastTransitionTime"].replace("Z", "+00:00"))
    return None


@dataclass
class Lags:
    """Per CR, seconds from its last pod turning Ready to the CR's own Ready (`pod`), and from
    its Deployment turning Available to the CR's Ready (`deployment`: the operator's own share;
    the rest is kube-controller-manager's ReplicaSet and Deployment status updates)."""

    pod: list[float]
    deployment: list[float]


def ready_lags(kube: Kube, namespace: str) -> Lags:
    """From the objects' condition lastTransitionTimes (one-second resolution; kwok, the
    controllers and the operator share this machine's clock), read once after the run: no load
    inside the timed window."""
    pods_ready: dict[str, datetime] = {}
    for pod in kube.list("v1", "Pod", namespace):
        parent = (pod["metadata"].get("labels") or {}).get(LABEL_DEPLOYMENT)
        since = _true_since(pod, "Ready")
        if parent and since is not None:
            pods_ready[parent] = max(since, pods_ready.get(parent, since))
    available = {
        d["metadata"]["name"]: _true_since(d, "Available")
        for d in kube.list("apps/v1", "Deployment", namespace)
    }
    lags = Lags([], [])
    for llmd in kube.list(API_VERSION, "LLMDeployment", namespace):
        name = llmd["metadata"]["name"]
        since = _true_since(llmd, "Ready")
        if since is None:
            continue
        if (pod_since := pods_ready.get(name)) is not None:
            lags.pod.append((since - pod_since).total_seconds())
        if (deployment_since := available.get(name)) is not None:
            lags.deployment.append((since - deployment_since).total_seconds())
    lags.pod.sort()
    lags.deployment.sort()
    return lags


def _spec(replicas: int) -> dict[str, Any]:
    if replicas:
        # Pods need no GPU (the fake nodes' GPUs would run out long before 1,000 pods).
        resources: dict[str, Any] = {"gpus": 0}
    else:
        resources = {"gpus": 1, "gpuProduct": "NVIDIA-H100-80GB-HBM3"}
    return {
        "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
        "engine": {"backend": "simulator"},
        "resources": resources,
        "replicas": replicas,
    }


class WatchThreads:
    """Watch threads started and stopped together (subclasses fill `_threads`)."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> Self:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)


class Progress(WatchThreads):
    """CRs with Deployment and Service, and CRs with a written status, kept from three watches.

    Not polled: three full LISTs of N objects every 0.5 s (the first version of this bench)
    loaded the API server the operator was being measured against, on the same 2 cores."""

    def __init__(self, namespace: str, api_client: Any) -> None:
        from kubernetes import client

        core, apps = client.CoreV1Api(api_client), client.AppsV1Api(api_client)
        custom = client.CustomObjectsApi(api_client)
        group, version = API_VERSION.split("/")
        self._names: dict[str, set[str]] = {
            "deployments": set(),
            "observed": set(),
            "services": set(),
            "status": set(),
        }
        self._lock = threading.Lock()
        super().__init__()
        self.first_status: dict[str, float] = {}
        """Per CR, when a status with observedGeneration was first seen (time.monotonic())."""
        self._threads = [
            threading.Thread(target=self._run, args=(key, func, args), daemon=True)
            for key, func, args in (
                ("deployments", apps.list_namespaced_deployment, (namespace,)),
                ("services", core.list_namespaced_service, (namespace,)),
                (
                    "status",
                    custom.list_namespaced_custom_object,
                    (group, version, namespace, "llmdeployments"),
                ),
            )
        ]

    def counts(self) -> tuple[int, int]:
        with self._lock:
            names = self._names
            return len(names["deployments"] & names["services"]), len(names["status"])

    def observed(self) -> int:
        """Deployments whose controller has observed their current generation."""
        with self._lock:
            return len(self._names["observed"])

    def _run(self, key: str, func: Any, args: tuple[str, ...]) -> None:
        def on_event(event_type: str, obj: dict[str, Any]) -> None:
            name = obj["metadata"]["name"]
            observed = (obj.get("status") or {}).get("observedGeneration")
            written = observed is not None
            present = event_type != "DELETED" and (key != "status" or written)
            with self._lock:
                (self._names[key].add if present else self._names[key].discard)(name)
                if key == "status" and present:
                    self.first_status.setdefault(name, time.monotonic())
                if key == "deployments":
                    seen = present and observed == obj["metadata"].get("generation")
                    (self._names["observed"].add if seen else self._names["observed"].discard)(name)

        watch_objects(func, args, self._stop, on_event)


def run_one(  # noqa: C901, PLR0912, PLR0915
    kube: Kube,
    count: int,
    timeout: float,
    log: Any,
    *,
    replicas: int = 0,
    profile: Path | None = None,
    with_router: bool = False,
    floor: str = "",
) -> Row:
    namespace = f"bench-{count}-{secrets.token_hex(3)}"
    if replicas:
        add_pod_room(kube, count * replicas)
    kube.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        field_manager="llmop-bench",
    )
    process, metrics_port = (None, 0) if floor == "cluster" else start_operator(log, floor)
    router = _start_router(log) if with_router else None
    router_cost = None
    peak = _rss_mib(process.pid) if process is not None else float("nan")
    cpu_at_start = cpu_seconds(process.pid) if process is not None else 0.0
    watcher = ReadyWatch(namespace, api_client())
    progress = Progress(namespace, api_client()).start()
    if replicas:
        watcher.start()
    sampler = None
    if profile is not None and process is not None:
        profile.mkdir(parents=True, exist_ok=True)
        sampler = subprocess.Popen(
            [
                shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy")),
                "record",
                "--pid",
                str(process.pid),
                "--rate",
                "50",
                "--nonblocking",
                "--gil",
                "--format",
                "raw",
                "--output",
                str(profile / f"operator-{count}.txt"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        started = time.monotonic()
        applied_at: dict[str, float] = {}

        def create(index: int) -> None:
            name = f"m{index:04d}"
            parent = kube.apply(
                {
                    "apiVersion": API_VERSION,
                    "kind": "LLMDeployment",
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": _spec(replicas),
                },
                field_manager="llmop-bench",
                want_result=bool(floor),
            )
            applied_at[name] = time.monotonic()
            if floor:
                apply_children(kube, parent)

        with ThreadPoolExecutor(APPLY_THREADS) as pool:
            list(pool.map(create, range(count)))
        applied = time.monotonic() - started
        children_at = status_at = ready_at = None
        while time.monotonic() - started < timeout:
            with_children, with_status = progress.counts()
            now = time.monotonic() - started
            if floor:
                with_status = progress.observed()
            if process is not None:
                peak = max(peak, _rss_mib(process.pid))
            if children_at is None and with_children == count:
                children_at = now
            if status_at is None and with_status == count:
                status_at = now
            if ready_at is None and (not replicas or watcher.ready_count() == count):
                ready_at = now
            if children_at is not None and status_at is not None and ready_at is not None:
                break
            time.sleep(0.2)  # counting from the watches is free; polling only reads memory
        if replicas:
            time.sleep(10)  # Ready must hold while nothing changes: count late dips too
        nan = float("nan")
        rss = _rss_mib(process.pid) if process is not None else nan
        writes = _metric(metrics_port, "llmop_status_writes_total") if metrics_port else nan
        passes = _metric(metrics_port, "llmop_reconciles_total") if metrics_port else nan
        pass_seconds = (
            _metric(metrics_port, "llmop_reconcile_duration_seconds_sum") if metrics_port else nan
        )
        cpu = cpu_seconds(process.pid) - cpu_at_start if process is not None else nan
        lags = ready_lags(kube, namespace) if replicas else Lags([], [])
        observed_lags = sorted(
            progress.first_status[name] - at
            for name, at in applied_at.items()
            if name in progress.first_status
        )
        if router is not None and process is not None:
            router_cost = _router_cost(*router, process.pid, count, started)
    finally:
        if router is not None:
            router[0].terminate()
            router[0].wait(timeout=30)
        watcher.stop()
        progress.stop()
        if sampler is not None:
            sampler.send_signal(signal.SIGINT)
            sampler.wait(timeout=60)
        if process is not None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        kube.delete("v1", "Namespace", None, namespace)
    nan = float("nan")
    return Row(
        count,
        applied,
        children_at if children_at is not None else nan,
        status_at if status_at is not None else nan,
        rss,
        max(peak, rss),
        writes,
        cpu_seconds=cpu,
        passes=passes,
        pass_seconds=pass_seconds,
        observed_lag_median=_median(observed_lags),
        observed_lag_max=observed_lags[-1] if observed_lags else nan,
        ready_seconds=ready_at if ready_at is not None and replicas else nan,
        flaps=watcher.flaps,
        ready_dips=watcher.dips,
        ready_lag_median=lags.pod[len(lags.pod) // 2] if lags.pod else nan,
        ready_lag_max=lags.pod[-1] if lags.pod else nan,
        ready_lag_count=len(lags.pod),
        operator_lag_max=lags.deployment[-1] if lags.deployment else nan,
        router=router_cost,
    )


def apply_children(kube: Kube, parent: dict[str, Any]) -> None:
    """The floor's stand-in for the operator: the CR's Deployment and Service as llmop renders
    them, owned by the CR, server-side applied as the operator applies them."""
    desired = desired_state(LLMDeployment.model_validate(parent), RENDER_SETTINGS)
    assert desired.children is not None
    assert desired.children.deployment is not None
    reference = owner_reference(parent)
    for manifest in (desired.children.deployment, desired.children.service):
        kube.apply(with_owner(manifest, reference), field_manager=FIELD_MANAGER, want_result=False)


def _median(values: list[float]) -> float:
    return values[len(values) // 2] if values else float("nan")


def _table_line(row: Row, *, replicas: int) -> str:
    done = max(row.children_seconds, row.status_seconds)
    rate = 0.0 if math.isnan(done) else row.count / done
    line = (
        f"{row.count:>6} {row.apply_seconds:>8.1f} {row.children_seconds:>11.1f} "
        f"{row.status_seconds:>9.1f} {rate:>7.1f} {row.rss_mib:>8.0f} "
        f"{row.peak_rss_mib:>9.0f} {row.status_writes:>14.0f} {row.cpu_seconds:>7.1f}"
        f" {row.observed_lag_median:>13.1f} {row.observed_lag_max:>13.1f}"
        f" {row.passes:>7.0f} {row.pass_seconds:>8.1f}"
    )
    if replicas:
        line += (
            f" {row.ready_seconds:>8.1f} {row.flaps:>6} {row.ready_dips:>5}"
            f" {row.ready_lag_median:>10.0f} {row.ready_lag_max:>10.0f}"
            f" {row.ready_lag_count:>5} {row.operator_lag_max:>13.0f}"
        )
    if row.router is not None:
        cost = row.router
        line += (
            f" {cost.listed_seconds:>16.1f} {cost.busy_cpu_seconds:>13.1f}"
            f" {cost.idle_cpu_percent:>14.2f} {cost.operator_idle_cpu_percent:>10.2f}"
            f" {cost.rss_mib:>11.0f}"
        )
    return line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", default=os.environ.get("N", "100,500,1000"))
    parser.add_argument("--timeout", type=float, default=600, help="seconds per N")
    parser.add_argument(
        "--replicas",
        type=int,
        default=int(os.environ.get("REPLICAS", "0")),
        help="pods per CR (0: the operator alone; 1: also time to all Ready and Ready flaps)",
    )
    parser.add_argument("--profile", type=Path, default=None, help="py-spy samples into DIR")
    floor = os.environ.get("FLOOR", "")
    parser.add_argument(
        "--floor",
        nargs="?",
        choices=FLOORS,
        const="cluster",
        default={"": "", "0": "", "1": "cluster"}.get(floor, floor),
        help="no llmop: the bench applies the children itself (what the cluster alone takes); "
        "kopf: and a kopf operator with llmop's watch layout whose handlers do nothing",
    )
    parser.add_argument(
        "--router",
        action="store_true",
        default=os.environ.get("ROUTER", "") not in ("", "0"),
        help="also run llmop-router: time to list every CR, its CPU, idle CPU and RSS",
    )
    args = parser.parse_args()
    if args.floor not in ("", *FLOORS):
        parser.error(f"FLOOR={floor}: use 1 (or cluster), kopf or kopf-no-indexes")
    counts = [int(n) for n in str(args.counts).split(",") if n.strip()]
    try:
        kube = Kube.connect(pool_size=APPLY_THREADS)
    except KubeError as error:
        print(f"operator_bench: {error}", file=sys.stderr)
        return 2
    # Each CR gets a ClusterIP Service; the local cluster's default ServiceCIDR is a /24.
    kube.apply(SERVICE_CIDR, field_manager="llmop-bench")
    crd = yaml.safe_load(CRD_FILE.read_text())
    crd_version = ("apiextensions.k8s.io/v1", "CustomResourceDefinition")
    if kube.read(*crd_version, None, crd["metadata"]["name"]) is None:
        kube.apply(crd, field_manager="llmop-bench")  # an installed CRD is left as it is
    header = (
        f"{'N':>6} {'apply s':>8} {'children s':>11} {'status s':>9} {'CR/s':>7} "
        f"{'RSS MiB':>8} {'peak MiB':>9} {'status writes':>14} {'CPU s':>7}"
        f" {'obs.gen p50 s':>13} {'obs.gen max s':>13} {'passes':>7} {'pass s':>8}"
    )
    if args.replicas:
        header += (
            f" {'Ready s':>8} {'flaps':>6} {'dips':>5} {'lag p50 s':>10} {'lag max s':>10}"
            f" {'lags':>5} {'op lag max s':>13}"
        )
    if args.router:
        header += (
            f" {'router listed s':>16} {'router CPU s':>13} {'router idle %':>14}"
            f" {'op idle %':>10} {'router MiB':>11}"
        )
    with tempfile.NamedTemporaryFile(
        "ab", prefix="llmop-bench-", suffix=".log", delete=False
    ) as log:
        print(f"operator log: {log.name}", file=sys.stderr)
        print(header)
        print("-" * len(header), flush=True)
        for count in counts:
            row = run_one(
                kube,
                count,
                args.timeout,
                log,
                replicas=args.replicas,
                profile=args.profile,
                with_router=args.router,
                floor=args.floor,
            )
            print(_table_line(row, replicas=args.replicas), flush=True)
            wait_namespaces_gone(kube)
    remove_pod_room(kube)
    return 0


if __name__ == "__main__":
    sys.exit(main())
