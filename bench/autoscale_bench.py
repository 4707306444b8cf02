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
import random
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests"))

from llmop.names import QUEUE_DEPTH_METRIC  # noqa: E402
from support.cluster import Cluster, create_namespace  # noqa: E402
from support.harness.loadgen import LoadResult  # noqa: E402
from support.metrics import hpa_read_the_metric, metric_value  # noqa: E402
from support.realnode import (  # noqa: E402
    BackgroundLoad,
    operator_on_real_node,
    real_node_spec,
    service_url,
)

TICK = 1.0
SAMPLE_SECONDS = 0.5
"""The timeline's period. Its reads go through one Python client (no kubectl process per read:
under the step's load six kubectl calls a tick spread samples ~12 s apart), so each stage's
time is within about half a second."""


def _hpa(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    res = cluster.kubectl("get", "hpa", "-n", ns, name, "-o", "json", check=False)
    return json.loads(res.stdout) if res.returncode == 0 else {}


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


@dataclass
class Sample:
    """One look at the chain, `at` seconds after the load step."""

    at: float
    custom_metric: float | None  # the pods' average through custom.metrics.k8s.io
    desired: int  # the HPA's status.desiredReplicas
    scaled_to: int  # the Deployment's spec.replicas
    ready: int  # the Deployment's status.readyReplicas


class Timeline:
    """Samples the custom metrics API, the HPA and the Deployment every SAMPLE_SECONDS in a
    thread of its own until stopped."""

    def __init__(self, cluster: Cluster, ns: str, name: str, t0: float) -> None:
        self.api = cluster.api_client()
        self.ns, self.name, self.t0 = ns, name, t0
        self.samples: list[Sample] = []
        self.failures: dict[tuple[str, str], list[float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def get(self, path: str) -> dict[str, Any] | None:
        """The object at `path`, or None (the failure counted by path, for the timeline)."""
        url = self.api.configuration.host + path
        try:
            answer = self.api.call_api(
                "GET", url, header_params={"Accept": "application/json"}, _request_timeout=5
            )
            body = answer.read()
            if 200 <= answer.status < 300:
                return dict(json.loads(body))
            failure = f"HTTP {answer.status}: {body[:160]!r}"
        except Exception as error:  # a slow or refused read: this sample has no value
            failure = repr(error)[:160]
        self.failures.setdefault((path, failure), []).append(time.monotonic() - self.t0)
        return None

    def _sample(self) -> Sample:
        ns, name = self.ns, self.name
        metric = self.get(
            f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{ns}/pods/*/{QUEUE_DEPTH_METRIC}"
        )
        values = [metric_value(i["value"]) for i in (metric or {}).get("items") or []]
        hpa = self.get(f"/apis/autoscaling/v2/namespaces/{ns}/horizontalpodautoscalers/{name}")
        deployment = self.get(f"/apis/apps/v1/namespaces/{ns}/deployments/{name}") or {}
        return Sample(
            at=time.monotonic() - self.t0,
            custom_metric=sum(values) / len(values) if values else None,
            desired=int(((hpa or {}).get("status") or {}).get("desiredReplicas") or 0),
            scaled_to=int((deployment.get("spec") or {}).get("replicas") or 0),
            ready=int((deployment.get("status") or {}).get("readyReplicas") or 0),
        )

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self._sample())
            self._stop.wait(SAMPLE_SECONDS)

    def start(self) -> Timeline:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def first(self, pred: Any) -> float | None:
        return next((s.at for s in self.samples if pred(s)), None)


def _pod_starts(timeline: Timeline, t0_wall: float) -> list[dict[str, float | None]]:
    """For each engine pod created after the load step: seconds from the step to its
    creation, scheduling, container start and Ready (the API's timestamps: whole seconds)."""
    pods = timeline.get(
        f"/api/v1/namespaces/{timeline.ns}/pods?labelSelector="
        + urllib.parse.quote(f"serving.llmop.dev/deployment={timeline.name}")
    )

    def since(stamp: str | None) -> float | None:
        if not stamp:
            return None
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() - t0_wall

    starts = []
    for pod in (pods or {}).get("items") or []:
        created = since(pod["metadata"].get("creationTimestamp"))
        if created is None or created < 0:
            continue
        status = pod.get("status") or {}
        changed = {c["type"]: c.get("lastTransitionTime") for c in status.get("conditions") or []}
        running = [
            ((c.get("state") or {}).get("running") or {}).get("startedAt")
            for c in status.get("containerStatuses") or []
        ]
        starts.append(
            {
                "created": created,
                "scheduled": since(changed.get("PodScheduled")),
                "container started": since(running[0] if running else None),
                "Ready": since(changed.get("Ready")),
            }
        )
    return sorted(starts, key=lambda p: p["created"] or 0)


def _stored_queue(prom: str, ns: str, start: float, end: float) -> list[tuple[float, float]]:
    """(wall time, value) of every queue-depth sample Prometheus stored for `ns`'s pods in
    [start, end], summed over pods at each timestamp (a 1 s range query)."""
    query = urllib.parse.urlencode(
        {
            "query": f'sum(llmop_engine_queue_depth{{namespace="{ns}"}})',
            "start": f"{start:.3f}",
            "end": f"{end:.3f}",
            "step": "1",
        }
    )
    with urllib.request.urlopen(f"{prom}/api/v1/query_range?{query}", timeout=10) as answer:
        result = json.loads(answer.read())["data"]["result"]
    return [(float(t), float(v)) for t, v in (result[0]["values"] if result else [])]


def _first_stored(samples: list[tuple[float, float]], above: float, wall0: float) -> float | None:
    """Seconds from `wall0` to the first stored sample above `above`. A range query repeats a
    sample at every step until the next one, so the first step showing it is the scrape's
    time rounded up to the step (within 1 s)."""
    return next((t - wall0 for t, v in samples if t >= wall0 and v > above), None)


def _fmt(v: float | None) -> str:
    return "timeout" if v is None else f"{v:.1f}"


def _print_pod_starts(pod_starts: list[dict[str, float | None]]) -> None:
    if pod_starts:
        print("\nThe new pods, seconds from the load step (the API's timestamps, whole seconds):\n")
        print("| " + " | ".join(pod_starts[0]) + " |")
        print("|" + "---:|" * len(pod_starts[0]))
        for start in pod_starts:
            print("| " + " | ".join(_fmt(v) for v in start.values()) + " |")


def _print_timeline(timeline: Timeline, stored: list[tuple[float, float]], t0_wall: float) -> None:
    print("\nWhat changed, and when (s after the step; Prometheus: stored samples, summed):")
    last: tuple[Any, ...] | None = None
    for sample in timeline.samples:
        now = (sample.custom_metric, sample.desired, sample.scaled_to, sample.ready)
        if now != last:
            print(
                f"  {sample.at:6.1f}  custom.metrics {sample.custom_metric}  desired "
                f"{sample.desired}  scaled to {sample.scaled_to}  ready {sample.ready}"
            )
            last = now
    for (path, failure), times in timeline.failures.items():
        print(f"  {len(times)} failed reads of {path}, {times[0]:.1f}-{times[-1]:.1f} s: {failure}")
    previous = None
    for t, v in stored:
        if v != previous:
            print(f"  {t - t0_wall:6.1f}  Prometheus {v:g}")
            previous = v


def _report(
    args: argparse.Namespace,
    *,
    target: float,
    timeline: Timeline,
    stored: list[tuple[float, float]],
    t0_wall: float,
    down: dict[str, float | None],
    loads: tuple[LoadResult, LoadResult],
    pod_starts: list[dict[str, float | None]],
    usage: tuple[dict[str, tuple[float, float]], dict[str, tuple[float, float]], float],
) -> None:
    step, small = loads
    usage0, usage1, wall = usage
    clients = args.step * args.max_num_seqs
    scrape = (
        "15s, with the rest" if args.queue_depth_interval == "off" else args.queue_depth_interval
    )
    # The HPA acts when the pods' average exceeds the target by its 10 % tolerance.
    acts_above = target * 1.1
    up = {
        "queue > 0 stored in Prometheus": _first_stored(stored, 0, t0_wall),
        f"queue > {acts_above:g} stored in Prometheus": _first_stored(stored, acts_above, t0_wall),
        f"queue > {acts_above:g} via custom.metrics": timeline.first(
            lambda s: (s.custom_metric or 0) > acts_above
        ),
        "HPA desired > 1": timeline.first(lambda s: s.desired > 1),
        "Deployment scaled > 1": timeline.first(lambda s: s.scaled_to > 1),
        "2nd replica Ready": timeline.first(lambda s: s.ready >= 2),
        "HPA desired = 3 (max)": timeline.first(lambda s: s.desired >= 3),
        "3rd replica Ready": timeline.first(lambda s: s.ready >= 3),
    }
    print(
        f"\nLoad step 0 -> {clients} streaming clients (= {args.step}x one replica's batch of "
        f"{args.max_num_seqs}; max_tokens {args.max_tokens}) on an autoscaled LLMDeployment "
        f"(min 1, max 3, targetQueueDepth {target:g}), simulator engine, real node, real "
        f"Prometheus (queue depth scraped every {scrape}) + prometheus-adapter + HPA "
        "controller (sync period "
        f"{args.hpa_sync}; the step came {args.phase:.1f} s after its first read was seen, "
        "which trails that sync by about a second). Scale-down window shortened to "
        f"{args.down_window} s, 1 pod / 15 s. "
        f"Stages sampled every {SAMPLE_SECONDS} s.\n"
    )
    print("| stage | seconds |")
    print("|---|---:|")
    for k, v in up.items():
        print(f"| load step -> {k} | {_fmt(v)} |")
    for k in ("desired lowered", "1 replica left"):
        print(f"| load removed -> {k} | {_fmt(down[k])} |")
    print(
        f"\nStep load: {step.total} requests, {step.failed} failed, {step.truncated} truncated, "
        f"p99 TTFT {step.ttft_quantile(0.99):.2f} s."
    )
    print(
        f"Scale-down trickle: {small.total} requests, {small.failed} failed, "
        f"{small.truncated} truncated (requests lost during scale-down: "
        f"{small.failed + small.truncated})."
    )
    _print_pod_starts(pod_starts)
    if args.timeline:
        _print_timeline(timeline, stored, t0_wall)
    print("\n| process | RSS MiB | CPU % of one core over the run |")
    print("|---|---:|---:|")
    for p in ("prometheus", "prometheus-adapter"):
        rss, cpu = usage1[p]
        print(f"| {p} | {rss:.0f} | {100 * (cpu - usage0[p][1]) / wall:.1f} |")


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-num-seqs", type=int, default=4, help="one replica's batch")
    parser.add_argument("--step", type=int, default=4, help="load step, x one replica's batch")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--down-window", type=int, default=30)
    parser.add_argument(
        "--hpa-sync",
        default="15s",
        help="kube-controller-manager's HPA sync period (cluster tuning; Kubernetes' default 15s)",
    )
    parser.add_argument(
        "--queue-depth-interval",
        default="5s",
        help="the chart's monitoring.podMonitor.queueDepthInterval; 'off': scraped with the rest",
    )
    parser.add_argument(
        "--phase",
        type=float,
        help="seconds between the HPA's first read and the load step [random, 0 to the sync]",
    )
    parser.add_argument("--timeline", action="store_true", help="also print every change seen")
    args = parser.parse_args()
    if args.phase is None:
        args.phase = random.uniform(0, float(args.hpa_sync.removesuffix("s")))
    return args


def main() -> int:
    args = _args()

    os.environ["LLMOP_METRICS"] = "on"
    os.environ["LLMOP_HPA_SYNC_PERIOD"] = args.hpa_sync
    fast_scrape = "" if args.queue_depth_interval == "off" else args.queue_depth_interval
    os.environ["LLMOP_METRICS_QUEUE_DEPTH_INTERVAL"] = fast_scrape
    target = 4.0
    out: dict[str, float | None] = {}
    workdir = Path(tempfile.mkdtemp(prefix="llmop-bench-autoscale-"))
    with operator_on_real_node("bench", workdir) as rc:
        cluster, kit = rc.cluster, rc.kit
        metrics_dir = Path(cluster.kubeconfig).parent / "metrics"
        prom = "http://" + (metrics_dir / "prometheus.addr").read_text().strip()
        ns, llmd = create_namespace(cluster, "bench"), "scaled"
        spec = real_node_spec()
        del spec["replicas"]
        spec["engine"] = {**spec["engine"], "maxNumSeqs": args.max_num_seqs}
        spec["autoscaling"] = {
            "minReplicas": 1,
            "maxReplicas": 3,
            "targetQueueDepth": target,
            "scaleDown": {"stabilizationWindowSeconds": args.down_window, "periodSeconds": 15},
        }
        kit.apply_llmd(ns, llmd, spec)
        kit.wait_condition(ns, llmd, "Ready", "True", timeout=300)
        t_ready = time.monotonic()
        # Idle until the HPA has read a value (the pipeline is warm, as in production, where
        # prometheus-adapter has long registered the metric: a fresh adapter serves a metric
        # name only after its next series relist, every 30 s here, 1 min in its chart).
        warm = _watch({"read": lambda: hpa_read_the_metric(_hpa(cluster, ns, llmd))}, 180, t_ready)
        if warm["read"] is None:
            raise SystemExit("the HPA never read the queue depth: is the metrics pipeline up?")
        # The warm read came just after an HPA sync: stepping now would always meet the
        # longest wait for the next one. A step lands at any phase of the sync in production.
        time.sleep(args.phase)
        usage0 = {
            p: _proc_usage(metrics_dir / f"{p}.pid") for p in ("prometheus", "prometheus-adapter")
        }
        wall0 = time.monotonic()

        url = service_url(cluster, ns, llmd)
        clients = args.step * args.max_num_seqs
        t0, t0_wall = time.monotonic(), time.time()
        timeline = Timeline(cluster, ns, llmd, t0).start()
        load = BackgroundLoad(url, llmd, clients, duration=900, max_tokens=args.max_tokens).start()
        _watch({"3 ready": lambda: bool(timeline.first(lambda s: s.ready >= 3))}, 240, t0)
        time.sleep(10)
        step = load.stop()
        pod_starts = _pod_starts(timeline, t0_wall)

        # The trickle: a quarter of one replica's batch, in flight while pods are removed.
        t1 = time.monotonic()
        trickle = BackgroundLoad(
            url, llmd, max(1, args.max_num_seqs // 4), duration=900, max_tokens=args.max_tokens
        ).start()
        out |= _watch(
            {
                "desired lowered": lambda: 0 < timeline.samples[-1].desired < 3,
                "1 replica left": lambda: (
                    timeline.samples[-1].desired == 1 and timeline.samples[-1].ready == 1
                ),
            },
            600,
            t1,
        )
        time.sleep(20)  # the last removed pod's drain window
        small = trickle.stop()
        timeline.stop()
        usage1 = {
            p: _proc_usage(metrics_dir / f"{p}.pid") for p in ("prometheus", "prometheus-adapter")
        }
        wall = time.monotonic() - wall0
        stored = _stored_queue(prom, ns, t0_wall - 30, t0_wall + 120)

    _report(
        args,
        target=target,
        timeline=timeline,
        stored=stored,
        t0_wall=t0_wall,
        down=out,
        loads=(step, small),
        pod_starts=pod_starts,
        usage=(usage0, usage1, wall),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
