"""Multi-node groups on the real node: llmop's LeaderWorkerSet against KServe's group pod spec.

Same engine (the simulator image in vLLM's `--nnodes 2` roles: rank 0 serves, rank 1 runs
headless and joins it), same node, same LWS controller, two groups of two pods with one GPU
each; only the pod spec differs:
  llmop                 an LLMDeployment with pipelineParallelSize 2 (agent on every pod: the
                        leader's deep probe and drain, the worker's process and rendezvous watch)
  kserve-llmisvc-style  KServe's multi-node preset: leader readiness /health 1 s, liveness
                        /health 10 s x 10, no worker probes, preStop sleep 15, TGPS 60,
                        --shutdown-timeout 15, RecreateGroupOnPodRestart

For each, in order:
  ready    apply, then seconds until both groups' pods are Ready and a completion answers;
  rollout  a rolling update of both groups (one at a time, no surge) under N streaming
           clients through the Service: requests, lost, seconds;
  hung     SIGSTOP of group 0's worker rank (from the host: a stage that stops answering,
           its process alive): seconds until group 0 leaves the Service (its leader not Ready,
           or gone) and until a recreated group 0 serves again, within --hang-window seconds.
Prints a table (make bench-groups). Needs the real node (root, Linux): its own cluster.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests"))

from llmop.settings import DEFAULT_SIMULATOR_IMAGE  # noqa: E402
from support.cluster import Cluster, create_namespace, wait_until  # noqa: E402
from support.operator import Kit  # noqa: E402
from support.realnode import (  # noqa: E402
    KSERVE_GROUP_STYLE,
    NODE_CONTAINERD,
    BackgroundLoad,
    operator_on_real_node,
    plain_group_lws,
    plain_service,
    pod_ready,
    post_json,
    real_node_spec,
    service_url,
)

ENGINE_ARGS = ["--max-num-seqs", "16", "--max-model-len", "2048"]
LWS_API = "leaderworkerset.x-k8s.io/v1"
NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"


@dataclass
class Row:
    variant: str
    ready_seconds: float
    requests: int
    lost: int
    rollout_seconds: float
    out_of_service_seconds: float | None
    serving_again_seconds: float | None


class Variant:
    """How one pod spec is applied and changed."""

    name: str

    def apply(self, decode_ms: str) -> None:
        raise NotImplementedError


class Llmop(Variant):
    name = "llmop"

    def __init__(self, kit: Kit, ns: str) -> None:
        self.kit, self.ns = kit, ns

    def apply(self, decode_ms: str) -> None:
        spec = real_node_spec(
            replicas=2,
            engine={"pipelineParallelSize": 2, "args": ["--sim-decode-ms", decode_ms]},
        )
        self.kit.apply_llmd(self.ns, self.name, spec)


class Plain(Variant):
    name = KSERVE_GROUP_STYLE.name

    def __init__(self, cluster: Cluster, ns: str) -> None:
        self.cluster, self.ns = cluster, ns

    def apply(self, decode_ms: str) -> None:
        lws = plain_group_lws(
            self.ns,
            self.name,
            DEFAULT_SIMULATOR_IMAGE,
            KSERVE_GROUP_STYLE,
            [*ENGINE_ARGS, "--sim-decode-ms", decode_ms],
        )
        self.cluster.kubectl("apply", "-f", "-", input=json.dumps(lws))
        service = plain_service(self.ns, self.name, leaders_only=True)
        self.cluster.kubectl("apply", "-f", "-", input=json.dumps(service))


def group_pods(cluster: Cluster, ns: str, name: str) -> dict[str, dict[str, Any]]:
    out = cluster.kubectl("get", "pods", "-n", ns, "-l", f"{NAME_LABEL}={name}", "-o", "json")
    items: list[dict[str, Any]] = json.loads(out.stdout)["items"]
    return {p["metadata"]["name"]: p for p in items if not p["metadata"].get("deletionTimestamp")}


def answers(cluster: Cluster, ns: str, name: str) -> bool:
    with contextlib.suppress(OSError, ValueError):
        code, _ = post_json(
            f"{service_url(cluster, ns, name)}/v1/completions",
            {"model": name, "prompt": "Hi", "max_tokens": 4},
            timeout=5,
        )
        return code == 200
    return False


def all_ready(
    cluster: Cluster, ns: str, name: str, uids_gone: frozenset[str] = frozenset()
) -> bool:
    pods = group_pods(cluster, ns, name)
    return (
        len(pods) == 4
        and all(map(pod_ready, pods.values()))
        and not uids_gone & {p["metadata"]["uid"] for p in pods.values()}
    )


def host_pid(pod: dict[str, Any]) -> int:
    """The host pid of the pod's container's first process (the node runs on this machine)."""
    (status,) = pod["status"]["containerStatuses"]
    container_id = status["containerID"].split("://", 1)[1]
    out = subprocess.run(
        ["ctr", "--address", NODE_CONTAINERD, "-n", "k8s.io", "tasks", "ls"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    for line in out.splitlines()[1:]:
        task, pid, *_ = line.split()
        if task == container_id:
            return int(pid)
    raise RuntimeError(f"no task for container {container_id}")


def rank_pid(pod: dict[str, Any], under_agent: bool) -> int:
    """The headless rank's host pid: the container's process, or the agent's engine child."""
    pid = host_pid(pod)
    if not under_agent:
        return pid
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    (child,) = children
    return int(child)


def measure(
    cluster: Cluster,
    ns: str,
    variant: Variant,
    *,
    clients: int,
    settle: float,
    hang_window: float,
) -> Row:
    name = variant.name
    started = time.monotonic()
    variant.apply("20")
    wait_until(lambda: all_ready(cluster, ns, name), timeout=300, interval=0.5, what="groups")
    wait_until(lambda: answers(cluster, ns, name), timeout=60, interval=0.5, what="an answer")
    ready_seconds = time.monotonic() - started

    before = frozenset(p["metadata"]["uid"] for p in group_pods(cluster, ns, name).values())
    load = BackgroundLoad(service_url(cluster, ns, name), name, clients, duration=900).start()
    time.sleep(settle)
    rolled_at = time.monotonic()
    variant.apply("21")
    wait_until(lambda: all_ready(cluster, ns, name, before), timeout=600, interval=1, what="rolled")
    rollout_seconds = time.monotonic() - rolled_at
    time.sleep(settle)
    result = load.stop()

    out, again = hang_worker(cluster, ns, name, isinstance(variant, Llmop), hang_window)
    cluster.kubectl("delete", "namespace", ns, "--timeout=300s", check=False)
    return Row(name, ready_seconds, result.total, result.lost, rollout_seconds, out, again)


def hang_worker(
    cluster: Cluster, ns: str, name: str, under_agent: bool, window: float
) -> tuple[float | None, float | None]:
    pods = group_pods(cluster, ns, name)
    leader_uid = pods[f"{name}-0"]["metadata"]["uid"]
    pid = rank_pid(pods[f"{name}-0-1"], under_agent)
    stopped = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    out: float | None = None
    again: float | None = None
    try:
        while time.monotonic() - stopped < window and again is None:
            now = group_pods(cluster, ns, name)
            leader = now.get(f"{name}-0")
            replaced = leader is not None and leader["metadata"]["uid"] != leader_uid
            if out is None and (leader is None or replaced or not pod_ready(leader)):
                out = time.monotonic() - stopped
            recreated = replaced and all_ready(cluster, ns, name)
            if recreated and answers(cluster, ns, name):
                again = time.monotonic() - stopped
            time.sleep(0.5)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    return out, again


def fmt(value: float | None, window: float) -> str:
    return f"never (> {window:.0f})" if value is None else f"{value:.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--settle", type=float, default=5.0)
    parser.add_argument("--hang-window", type=float, default=300.0)
    parser.add_argument(
        "--only", default="", help="comma-separated: llmop, kserve-llmisvc-style (default both)"
    )
    args = parser.parse_args()
    chosen = [n for n in args.only.split(",") if n] or ["llmop", KSERVE_GROUP_STYLE.name]
    rows: list[Row] = []
    workdir = Path(tempfile.mkdtemp(prefix="llmop-bench-groups-"))
    with operator_on_real_node("bench", workdir) as rc:
        makers: dict[str, Callable[[str], Variant]] = {
            "llmop": lambda ns: Llmop(rc.kit, ns),
            KSERVE_GROUP_STYLE.name: lambda ns: Plain(rc.cluster, ns),
        }
        for name in chosen:
            ns = create_namespace(rc.cluster, "bench")
            rows.append(
                measure(
                    rc.cluster,
                    ns,
                    makers[name](ns),
                    clients=args.clients,
                    settle=args.settle,
                    hang_window=args.hang_window,
                )
            )
    w = args.hang_window
    print(
        f"\nTwo groups of 2 pods (PP=2, simulator, 1 GPU each), real node, LWS v0.9.0; rollout "
        f"under {args.clients} streaming clients through the Service; worker rank SIGSTOPped:\n"
    )
    print(
        "| pod spec | groups Ready s | rollout requests | lost | rollout s "
        "| hung worker: out of service s | serving again s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r.variant} | {r.ready_seconds:.1f} | {r.requests} | {r.lost} | "
            f"{r.rollout_seconds:.1f} | {fmt(r.out_of_service_seconds, w)} | "
            f"{fmt(r.serving_again_seconds, w)} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
