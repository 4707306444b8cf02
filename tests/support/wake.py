"""One wake from zero, watched step by step: shared by `make bench-wake` and the opt-in vLLM CPU
pod test, so both measure the same moments the same way.

A CR at `Ready/ScaledToZero` with no engine pod gets one streaming chat request through the
router's Service; a watcher polls the API every `POLL` seconds and notes when each step is first
seen, in seconds after the request was sent:

  scale patched    the router set the Deployment's replicas from 0 to 1
  pod created      the ReplicaSet's pod exists
  pod scheduled    the scheduler bound it to the node
  engine started   the pod's containers run (image present, sandbox and volumes set up)
  engine Ready     the agent's deep probe passed and the kubelet marked the pod Ready
  first token      the first `data:` event reached the client (the router released the request:
                   once its own question to the starting pod's agent was answered ready, so
                   this can come before `engine Ready`)

plus `answered` (the stream's end). A step can be seen up to one poll late."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any

from llmop import names
from llmop_engine.contract import STARTUP_PHASES
from support.cluster import wait_until
from support.realnode import RealCluster

POLL = 0.1
PHASES = (
    "scale patched",
    "pod created",
    "pod scheduled",
    "engine started",
    "engine Ready",
    "first token",
)
COLUMNS = (*PHASES, "answered")


IDLE_SECONDS = 10
"""The shortest idle time the API admits: zero comes soon after the last request."""


def from_zero(spec: dict[str, Any], *, hold_seconds: int = 300) -> dict[str, Any]:
    """`spec` autoscaled 0 to 1 with scale to zero after IDLE_SECONDS (its fixed replicas gone)."""
    scaled = {key: value for key, value in spec.items() if key != "replicas"}
    scaled["autoscaling"] = {
        "minReplicas": 0,
        "maxReplicas": 1,
        "scaleToZero": {"idleSeconds": IDLE_SECONDS, "holdTimeoutSeconds": hold_seconds},
    }
    return scaled


def engine_pods(rc: RealCluster, namespace: str, name: str) -> list[dict[str, Any]]:
    """The CR's engine pods, terminating ones included."""
    # The engine pods' own labels: the image pre-pull's pods share the instance label.
    pods = rc.kit.kube.list("v1", "Pod", namespace, label_selector=names.selector_string(name))
    # A finished pod (the model cache's download Job's) is not serving and never goes away.
    return [p for p in pods if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]


def live_pods(rc: RealCluster, namespace: str, name: str) -> list[dict[str, Any]]:
    return [
        p for p in engine_pods(rc, namespace, name) if not p["metadata"].get("deletionTimestamp")
    ]


def at_zero(rc: RealCluster, namespace: str, name: str) -> bool:
    """The operator took the CR to zero: Ready/ScaledToZero and no engine pod left."""
    obj = rc.kit.kube.read("serving.llmop.dev/v1alpha1", "LLMDeployment", namespace, name) or {}
    conditions = (obj.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if c.get("type") == "Ready"), {})
    return ready.get("reason") == "ScaledToZero" and not live_pods(rc, namespace, name)


def _watch(
    rc: RealCluster, namespace: str, name: str, seen: dict[str, float], stop: threading.Event
) -> Callable[[], None]:
    """A loop that records when each cluster-side moment is first seen (seconds after the loop
    is made) until the pod is Ready or `stop` is set."""
    t0 = time.monotonic()

    def mark(phase: str) -> None:
        seen.setdefault(phase, time.monotonic() - t0)

    def loop() -> None:
        while not stop.is_set():
            deployment = rc.kit.kube.read("apps/v1", "Deployment", namespace, name) or {}
            if ((deployment.get("spec") or {}).get("replicas") or 0) >= 1:
                mark("scale patched")
            for pod in live_pods(rc, namespace, name):
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

    return loop


READY_AFTER_SECONDS = 15.0
"""How long after the answer the watch still waits to see the pod Ready (a kubelet probe
period and a status update, with room)."""


def first_token(router: str, model: str, timeout: float = 300) -> tuple[float, float]:
    """Send one streaming chat request; (seconds to the first data event, seconds to the end)."""
    body = (
        b'{"model": "' + model.encode() + b'", "stream": true, "max_tokens": 8, '
        b'"messages": [{"role": "user", "content": "hello"}]}'
    )
    request = urllib.request.Request(
        f"{router}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    started = time.monotonic()
    first = None
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        for line in answer:
            if first is None and line.startswith(b"data:"):
                first = time.monotonic() - started
    if first is None:
        raise RuntimeError("the stream ended without a data event")
    return first, time.monotonic() - started


def one_wake(
    rc: RealCluster,
    namespace: str,
    name: str,
    router: str,
    *,
    zero_timeout: float = 300,
    before: Callable[[], None] | None = None,
) -> dict[str, float]:
    """Wait for the CR to be at zero, run `before` (the bench's setup of the node), wake it with
    one request; the moments (see the module)."""
    # At zero and the last pod gone, terminating included: a model idles minutes before it is
    # woken, and a pod still terminating would hold its CPU request against the new one's.
    wait_until(
        lambda: at_zero(rc, namespace, name) and not engine_pods(rc, namespace, name),
        timeout=zero_timeout,
        interval=1,
        what="at zero, no engine pod left",
    )
    if before is not None:
        before()
    seen: dict[str, float] = {}
    stop = threading.Event()
    watcher = threading.Thread(target=_watch(rc, namespace, name, seen, stop), daemon=True)
    watcher.start()
    try:
        first, total = first_token(router, name)
        # The router may send the first token before the kubelet marks the pod Ready (it asks
        # the starting pod's agent itself): the watch goes on to see that moment too.
        watcher.join(timeout=READY_AFTER_SECONDS)
    finally:
        stop.set()
        watcher.join(timeout=10)
    return {**seen, "first token": first, "answered": total}


ENGINE_PHASES = STARTUP_PHASES
"""`status.startup.replicas[].engine`'s phases, in order."""


def engine_phases(
    rc: RealCluster, namespace: str, name: str, timeout: float = 30
) -> dict[str, float]:
    """The newest ready replica's engine phases from the CR's status (the operator writes them
    once it read the pod's agent after Ready), seconds per phase; {} when none came in time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cr = rc.kit.get_llmd(namespace, name)
        replicas = ((cr or {}).get("status") or {}).get("startup", {}).get("replicas") or []
        ready = [r for r in replicas if r.get("phase") == "Ready" and r.get("engine")]
        if ready:
            engine = max(ready, key=lambda r: str(r.get("created")))["engine"]
            if "untracedSeconds" in engine:
                return {
                    phase: float(engine[f"{phase}Seconds"])
                    for phase in ENGINE_PHASES
                    if engine.get(f"{phase}Seconds") is not None
                }
        time.sleep(1)
    return {}


def describe(row: dict[str, float]) -> str:
    return ", ".join(f"{column} {row[column]:.1f}" for column in COLUMNS if column in row)
