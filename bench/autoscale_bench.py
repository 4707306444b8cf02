"""Autoscaling benchmark on the real node: a load step on an autoscaled LLMDeployment (min 1,
max 3), the HPA scaling it up on llmop_engine_queue_depth and back down after the load ends.

The whole chain is real: engine pods (simulator image) on the real node, the agent exporting the
queue depth, Prometheus (from the chart's PodMonitor) scraping it, prometheus-adapter (the
chart's rules) serving it as custom.metrics.k8s.io, kube-controller-manager's HPA controller
(15 s sync) acting on the HPA the operator renders. Measured from the load step:
  desired > 1      the HPA first asks for more than one replica
  2nd Ready        a second pod is Ready (its Service endpoint serves)
  desired = max    the HPA asks for maxReplicas
Then the load drops to a trickle (below one replica's capacity, kept running so requests are in
flight while pods go): seconds until the HPA lowers desired, until one replica is left, and the
trickle's failed/truncated requests (scale-down loss). Also Prometheus + adapter RSS/CPU.

The scale-down window is shortened for the run (--down-window, default 30 s instead of the
renderer's 300 s; pods removed 1 per 15 s instead of 1 per 120 s) so a run takes minutes; the
table says so. Needs the real node (root, Linux): it starts its own cluster (LLMOP_REAL_NODE=on,
LLMOP_METRICS=on). Prints a table (make bench-autoscale).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests"))

from support.cluster import Cluster, create_namespace, start_cluster, stop_cluster  # noqa: E402
from support.operator import (  # noqa: E402
    Kit,
    OperatorProcess,
    install_crd,
    operator_kubeconfig_for,
)
from support.realnode import BackgroundLoad, real_node_spec, service_url  # noqa: E402

TICK = 1.0


def _hpa(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    res = cluster.kubectl("get", "hpa", "-n", ns, name, "-o", "json", check=False)
    return json.loads(res.stdout) if res.returncode == 0 else {}


def _ready_pods(cluster: Cluster, ns: str, name: str) -> int:
    res = cluster.kubectl("get", "deployment", "-n", ns, name, "-o", "json", check=False)
    if res.returncode != 0:
        return 0
    return int(json.loads(res.stdout).get("status", {}).get("readyReplicas") or 0)


def _proc_usage(pid_file: Path) -> tuple[float, float]:
    """(RSS MiB, CPU seconds so far) of a pipeline process."""
    pid = pid_file.read_text().strip()
    status = Path(f"/proc/{pid}/status").read_text()
    rss = next(int(ln.split()[1]) for ln in status.splitlines() if ln.startswith("VmRSS:"))
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return rss / 1024, (int(fields[11]) + int(fields[12])) / ticks


def _watch(preds: dict[str, Any], timeout: float, t0: float) -> dict[str, float | None]:
    """Seconds since t0 at which each predicate first held (polled together every TICK, so one
    stage's wait never delays another's timestamp); None for those that never did."""
    seen: dict[str, float | None] = dict.fromkeys(preds)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(v is None for v in seen.values()):
        for key, pred in preds.items():
            if seen[key] is None and pred():
                seen[key] = time.monotonic() - t0
        time.sleep(TICK)
    return seen


def _fmt(v: float | None) -> str:
    return "timeout" if v is None else f"{v:.0f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-num-seqs", type=int, default=4, help="one replica's batch")
    parser.add_argument("--step", type=int, default=4, help="load step, x one replica's batch")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--down-window", type=int, default=30)
    args = parser.parse_args()

    os.environ["LLMOP_METRICS"] = "on"
    name = f"llmop-test-{os.getpid()}-bench{secrets.token_hex(2)}"
    cluster = start_cluster(name, owner_pid=os.getpid(), real_node="on")
    metrics_dir = Path(cluster.kubeconfig).parent / "metrics"
    operator: OperatorProcess | None = None
    out: dict[str, Any] = {}
    try:
        install_crd(cluster)
        workdir = Path(tempfile.mkdtemp(prefix="llmop-bench-autoscale-"))
        operator = OperatorProcess(operator_kubeconfig_for(cluster, workdir), workdir / "op.log")
        operator.start()
        kit = Kit(cluster)
        ns, llmd = create_namespace(cluster, "bench"), "scaled"
        spec = real_node_spec()
        del spec["replicas"]
        spec["engine"] = {**spec["engine"], "maxNumSeqs": args.max_num_seqs}
        spec["autoscaling"] = {
            "minReplicas": 1,
            "maxReplicas": 3,
            "scaleDown": {"stabilizationWindowSeconds": args.down_window, "periodSeconds": 15},
        }
        kit.apply_llmd(ns, llmd, spec)
        kit.wait_condition(ns, llmd, "Ready", "True", timeout=300)
        # Idle until the HPA has read the metric once (the pipeline is warm, as in production).
        _watch(
            {"metric": lambda: _hpa(cluster, ns, llmd).get("status", {}).get("currentMetrics")},
            120,
            time.monotonic(),
        )
        usage0 = {
            p: _proc_usage(metrics_dir / f"{p}.pid") for p in ("prometheus", "prometheus-adapter")
        }
        wall0 = time.monotonic()

        url = service_url(cluster, ns, llmd)
        clients = args.step * args.max_num_seqs
        t0 = time.monotonic()
        load = BackgroundLoad(url, llmd, clients, duration=900, max_tokens=args.max_tokens).start()

        def desired() -> int:
            return int(_hpa(cluster, ns, llmd).get("status", {}).get("desiredReplicas") or 0)

        out |= _watch(
            {
                "desired>1": lambda: desired() > 1,
                "2nd ready": lambda: _ready_pods(cluster, ns, llmd) >= 2,
                "desired=max": lambda: desired() >= 3,
                "3 ready": lambda: _ready_pods(cluster, ns, llmd) >= 3,
            },
            240,
            t0,
        )
        time.sleep(10)
        step = load.stop()

        # The trickle: a quarter of one replica's batch, in flight while pods are removed.
        t1 = time.monotonic()
        trickle = BackgroundLoad(
            url, llmd, max(1, args.max_num_seqs // 4), duration=900, max_tokens=args.max_tokens
        ).start()
        out |= _watch(
            {
                "desired lowered": lambda: 0 < desired() < 3,
                "1 replica left": lambda: desired() == 1 and _ready_pods(cluster, ns, llmd) == 1,
            },
            600,
            t1,
        )
        time.sleep(20)  # the last removed pod's drain window
        small = trickle.stop()
        usage1 = {
            p: _proc_usage(metrics_dir / f"{p}.pid") for p in ("prometheus", "prometheus-adapter")
        }
        wall = time.monotonic() - wall0
    finally:
        if operator is not None:
            operator.stop()
        stop_cluster(name)

    print(
        f"\nLoad step 0 -> {clients} streaming clients (= {args.step}x one replica's batch of "
        f"{args.max_num_seqs}; max_tokens {args.max_tokens}) on an autoscaled LLMDeployment "
        f"(min 1, max 3, targetQueueDepth 4), simulator engine, real node, real Prometheus + "
        "prometheus-adapter + HPA controller. Scale-down window shortened to "
        f"{args.down_window} s, 1 pod / 15 s.\n"
    )
    print("| stage | seconds |")
    print("|---|---:|")
    for k in ("desired>1", "2nd ready", "desired=max", "3 ready"):
        print(f"| load step -> {k} | {_fmt(out[k])} |")
    for k in ("desired lowered", "1 replica left"):
        print(f"| load removed -> {k} | {_fmt(out[k])} |")
    print(
        f"\nStep load: {step.total} requests, {step.failed} failed, {step.truncated} truncated, "
        f"p99 TTFT {step.ttft_quantile(0.99):.2f} s."
    )
    print(
        f"Scale-down trickle: {small.total} requests, {small.failed} failed, "
        f"{small.truncated} truncated (requests lost during scale-down: "
        f"{small.failed + small.truncated})."
    )
    print("\n| process | RSS MiB | CPU % of one core over the run |")
    print("|---|---:|---:|")
    for p in ("prometheus", "prometheus-adapter"):
        rss, cpu = usage1[p]
        print(f"| {p} | {rss:.0f} | {100 * (cpu - usage0[p][1]) / wall:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
