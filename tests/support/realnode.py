"""What the e2e tests do on the real node: LLMDeployments sized for it, the Service's ClusterIP,
streaming load through it in the background, and pod-level observations (restarts, readiness
flips) read from the API server."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from llmop_engine.harness.loadgen import LoadResult, ServiceEndpoint, run_clients
from support.cluster import Cluster, wait_until

# Small enough that 3 replicas plus a surge pod fit the node's 2 CPUs with room for the operator
# and the clients; limits equal requests, so each engine is throttled to this.
ENGINE_CPU = "200m"
ENGINE_MEMORY = "256Mi"


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


def service_url(cluster: Cluster, namespace: str, name: str) -> str:
    """http://<ClusterIP>:<port> of a Service (reached through kube-proxy's rules)."""
    svc = json.loads(cluster.kubectl("get", "service", "-n", namespace, name, "-o", "json").stdout)
    port = next(p["port"] for p in svc["spec"]["ports"] if p.get("name") == "http")
    return f"http://{svc['spec']['clusterIP']}:{port}"


def post_json(url: str, body: dict[str, Any], timeout: float = 30) -> tuple[int, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
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
