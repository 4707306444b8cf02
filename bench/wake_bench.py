"""Scale-to-zero wake benchmark on the real node (`make bench-wake`): where the seconds of a wake
go, from a request held by the router to its first token.

The chart is installed as a user installs it (operator and router pods, images imported into the
real node); one autoscaled LLMDeployment with `minReplicas: 0` and `scaleToZero.idleSeconds: 10`
idles to zero, then one streaming request is sent through the router's Service and the moments of
`tests/support/wake.py` are taken (scale patched, pod created, pod scheduled, engine started,
engine Ready, first token, answered), each as seconds after the request was sent.

`--engine simulator` (the default) serves the simulator image; `--load-seconds` is its model load
time (what an engine spends loading weights; a real model takes from seconds to minutes, which
adds to "engine Ready" only). `--engine vllm-cpu` serves vLLM's CPU build (the ~6 GB engine-cpu
image, built or reused from the cache and imported, `make image-engine-cpu`) with the tiny
random model the real-engine tests make, from a hostPath volume of the node: what a real engine's
start adds. `--wakes` runs the cycle (idle to zero, wake) that many times and prints each wake
and the median. Needs the real node (root, Linux): it starts its own cluster. Prints a table;
not a test.

    python bench/wake_bench.py [--wakes 3] [--load-seconds 5] [--engine vllm-cpu]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests"))

from engine import real_vllm  # noqa: E402
from support import tiny_model  # noqa: E402
from support.cluster import create_namespace  # noqa: E402
from support.helm_release import NODE_IMAGE_VALUES, chart_on_real_node  # noqa: E402
from support.realnode import (  # noqa: E402
    RealCluster,
    create_model_volume,
    delete_model_volume,
    import_into_node,
    operator_on_real_node,
    service_url,
    vllm_cpu_spec,
)
from support.wake import COLUMNS, describe, from_zero, one_wake  # noqa: E402

SAMPLE = REPO_ROOT / "examples" / "simulator-small.yaml"
NAME = "sleepy"
CLAIM = "tiny-model"


def simulator_cr(namespace: str, load_seconds: float) -> dict[str, Any]:
    sample: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    sample["metadata"] = {"name": NAME, "namespace": namespace}
    sample["spec"]["engine"]["args"] = ["--sim-load-seconds", f"{load_seconds:g}"]
    sample["spec"] = from_zero(sample["spec"])
    return sample


def vllm_cpu_cr(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "serving.llmop.dev/v1alpha1",
        "kind": "LLMDeployment",
        "metadata": {"name": NAME, "namespace": namespace},
        "spec": from_zero(vllm_cpu_spec(CLAIM)),
    }


@contextmanager
def served(rc: RealCluster, engine: str, load_seconds: float) -> Iterator[str]:
    """The CR applied in a fresh namespace (with the tiny model's volume for vLLM), deleted
    after; yields the namespace."""
    apps = create_namespace(rc.cluster, "wake")
    volume = None
    try:
        if engine == "simulator":
            cr = simulator_cr(apps, load_seconds)
        else:
            imported = import_into_node("engine-cpu")
            print(f"engine-cpu image: {imported:.0f} s", file=sys.stderr)
            model = tiny_model.ensure(str(real_vllm.venv() / "bin" / "python"))
            volume = create_model_volume(rc.cluster, apps, CLAIM, model)
            cr = vllm_cpu_cr(apps)
        rc.kubectl("apply", "-f", "-", input=yaml.safe_dump(cr))
        yield apps
    finally:
        rc.kubectl("delete", "namespace", apps, "--timeout=180s", check=False)
        if volume is not None:
            delete_model_volume(rc.cluster, volume)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wakes", type=int, default=3)
    parser.add_argument("--load-seconds", type=float, default=5.0)
    parser.add_argument("--engine", choices=("simulator", "vllm-cpu"), default="simulator")
    args = parser.parse_args()
    rows = []
    with (
        tempfile.TemporaryDirectory(prefix="llmop-wake-") as tmp,
        operator_on_real_node("bench", Path(tmp)) as rc,
        chart_on_real_node(rc, NODE_IMAGE_VALUES) as release,
        served(rc, args.engine, args.load_seconds) as apps,
    ):
        router = service_url(rc.cluster, release.namespace, f"{release.name}-router")
        for index in range(args.wakes):
            # The first wait includes the first replica's start (minReplicas 0 starts at 1).
            rows.append(one_wake(rc, apps, NAME, router, zero_timeout=600))
            print(f"wake {index + 1}: {describe(rows[-1])}", file=sys.stderr, flush=True)
    engine = (
        f"simulator engine (model load {args.load_seconds:g} s)"
        if args.engine == "simulator"
        else "vLLM's CPU build (engine-cpu image, tiny random model from a hostPath volume)"
    )
    print(
        f"\nwake from zero: {engine}, the chart's operator and router pods on the real node; "
        "seconds after the request was sent\n"
    )
    print("| wake | " + " | ".join(COLUMNS) + " |")
    print("|---" * (len(COLUMNS) + 1) + "|")
    for index, row in enumerate(rows):
        print(
            f"| {index + 1} | "
            + " | ".join(f"{row[c]:.1f}" if c in row else "-" for c in COLUMNS)
            + " |"
        )
    medians = [statistics.median(r[c] for r in rows if c in r) for c in COLUMNS]
    print("| median | " + " | ".join(f"{m:.1f}" for m in medians) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
