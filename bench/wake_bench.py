"""Scale-to-zero wake benchmark on the real node (`make bench-wake`): where the seconds of a wake
go, from a request held by the router to its first token.

The chart is installed as a user installs it (operator and router pods, images imported into the
real node); one autoscaled simulator LLMDeployment with `minReplicas: 0` and
`scaleToZero.idleSeconds: 10` idles to zero, then one streaming request is sent through the
router's Service and these moments are taken, each as seconds after the request was sent:

  scale patched    the router set the Deployment's replicas from 0 to 1
  pod created      the ReplicaSet's pod exists
  pod scheduled    the scheduler bound it to the node
  engine started   the pod's containers run (image present, sandbox and volumes set up)
  engine Ready     the agent's deep probe passed and the kubelet marked the pod Ready
  first token      the first `data:` event reached the client (the router released the request)

The cluster is polled every 0.1 s through the API, so each moment is seen up to ~0.1 s late.
`--wakes` runs the cycle (idle to zero, wake) that many times and prints each wake and the
median. `--load-seconds` is the simulator's model load time (what an engine spends loading
weights; a real model takes from seconds to minutes, which adds to "engine Ready" only).
Needs the real node (root, Linux): it starts its own cluster. Prints a table; not a test.

    python bench/wake_bench.py [--wakes 3] [--load-seconds 5]
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests"))

from support.cluster import create_namespace, wait_until  # noqa: E402
from support.helm_release import adopt_crd  # noqa: E402
from support.realnode import (  # noqa: E402
    RealCluster,
    import_into_node,
    operator_on_real_node,
    service_url,
)

CHART_DIR = REPO_ROOT / "helm" / "llmop"
SAMPLE = REPO_ROOT / "examples" / "simulator-small.yaml"
IMAGE_VALUES: dict[str, Any] = {
    "image": {"pullPolicy": "Never"},
    "router": {"image": {"pullPolicy": "Never"}},
}
"""The chart's defaults except the images: they were imported into the node, never pulled."""
NAME = "sleepy"
POLL = 0.1
PHASES = (
    "scale patched",
    "pod created",
    "pod scheduled",
    "engine started",
    "engine Ready",
    "first token",
)


def _sample(namespace: str, load_seconds: float) -> dict[str, Any]:
    sample: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    sample["metadata"] = {"name": NAME, "namespace": namespace}
    del sample["spec"]["replicas"]
    sample["spec"]["engine"]["args"] = ["--sim-load-seconds", f"{load_seconds:g}"]
    sample["spec"]["autoscaling"] = {
        "minReplicas": 0,
        "maxReplicas": 1,
        "scaleToZero": {"idleSeconds": 10, "holdTimeoutSeconds": 300},
    }
    return sample


def _live_pods(rc: RealCluster, namespace: str) -> list[dict[str, Any]]:
    pods = rc.kit.kube.list(
        "v1", "Pod", namespace, label_selector=f"app.kubernetes.io/instance={NAME}"
    )
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def _at_zero(rc: RealCluster, namespace: str) -> bool:
    """The operator took the CR to zero: Ready/ScaledToZero and no engine pod left."""
    obj = rc.kit.kube.read("serving.llmop.dev/v1alpha1", "LLMDeployment", namespace, NAME) or {}
    conditions = (obj.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if c.get("type") == "Ready"), {})
    return ready.get("reason") == "ScaledToZero" and not _live_pods(rc, namespace)


def _moments(
    rc: RealCluster, namespace: str, t0: float, seen: dict[str, float], stop: threading.Event
) -> None:
    """Record when each cluster-side moment is first seen (seconds after t0)."""

    def mark(phase: str) -> None:
        seen.setdefault(phase, time.monotonic() - t0)

    while not stop.is_set():
        deployment = rc.kit.kube.read("apps/v1", "Deployment", namespace, NAME) or {}
        if ((deployment.get("spec") or {}).get("replicas") or 0) >= 1:
            mark("scale patched")
        for pod in _live_pods(rc, namespace):
            mark("pod created")
            if (pod.get("spec") or {}).get("nodeName"):
                mark("pod scheduled")
            statuses = (pod.get("status") or {}).get("containerStatuses") or []
            if statuses and all("running" in (s.get("state") or {}) for s in statuses):
                mark("engine started")
            conditions = (pod.get("status") or {}).get("conditions") or []
            if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
                mark("engine Ready")
        if "engine Ready" in seen:
            return
        time.sleep(POLL)


def _first_token(router: str) -> tuple[float, float]:
    """Send one streaming request; (seconds to the first data event, seconds to the end)."""
    body = (
        b'{"model": "' + NAME.encode() + b'", "stream": true, "max_tokens": 8, '
        b'"messages": [{"role": "user", "content": "hello"}]}'
    )
    request = urllib.request.Request(
        f"{router}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    started = time.monotonic()
    first = None
    with urllib.request.urlopen(request, timeout=300) as answer:
        for line in answer:
            if first is None and line.startswith(b"data:"):
                first = time.monotonic() - started
    if first is None:
        raise RuntimeError("the stream ended without a data event")
    return first, time.monotonic() - started


def one_wake(rc: RealCluster, namespace: str, router: str) -> dict[str, float]:
    wait_until(lambda: _at_zero(rc, namespace), timeout=300, interval=1, what="scaled to zero")
    seen: dict[str, float] = {}
    stop = threading.Event()
    t0 = time.monotonic()
    watcher = threading.Thread(target=_moments, args=(rc, namespace, t0, seen, stop), daemon=True)
    watcher.start()
    try:
        first, total = _first_token(router)
    finally:
        stop.set()
        watcher.join(timeout=10)
    return {**seen, "first token": first, "answered": total}


def _wakes(
    rc: RealCluster, namespace: str, release: str, wakes: int, load_seconds: float
) -> list[dict[str, float]]:
    apps = create_namespace(rc.cluster, "wake")
    rc.kubectl("apply", "-f", "-", input=yaml.safe_dump(_sample(apps, load_seconds)))
    router = service_url(rc.cluster, namespace, f"{release}-router")
    rows = []
    for index in range(wakes):
        row = one_wake(rc, apps, router)
        rows.append(row)
        moments = ", ".join(f"{k} {v:.1f}" for k, v in row.items())
        print(f"wake {index + 1}: {moments}", file=sys.stderr, flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wakes", type=int, default=3)
    parser.add_argument("--load-seconds", type=float, default=5.0)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="llmop-wake-") as tmp,
        operator_on_real_node("bench", Path(tmp)) as rc,
    ):
        imported = import_into_node("operator", "router")  # into the node's containerd
        print(f"operator and router images: {imported:.0f} s", file=sys.stderr)
        rc.operator.stop()  # the chart's operator pods take over
        namespace = create_namespace(rc.cluster, "llmop-system")
        release = f"llmop-{secrets.token_hex(2)}"
        with helm.Config(kubeconfig_path=rc.cluster.kubeconfig, namespace=namespace) as config:
            adopt_crd(rc.cluster, release, namespace)
            config.install(
                CHART_DIR, release, IMAGE_VALUES, namespace=namespace, wait="watcher", timeout=240
            )
            try:
                rows = _wakes(rc, namespace, release, args.wakes, args.load_seconds)
            finally:
                config.uninstall(release, ignore_not_found=True, wait="watcher", timeout=120)
    columns = [*PHASES, "answered"]
    print(
        f"\nwake from zero: simulator engine (model load {args.load_seconds:g} s), the chart's "
        "operator and router pods on the real node; seconds after the request was sent\n"
    )
    print("| wake | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for index, row in enumerate(rows):
        print(
            f"| {index + 1} | "
            + " | ".join(f"{row[c]:.1f}" if c in row else "-" for c in columns)
            + " |"
        )
    medians = [statistics.median(r[c] for r in rows if c in r) for c in columns]
    print("| median | " + " | ".join(f"{m:.1f}" for m in medians) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
