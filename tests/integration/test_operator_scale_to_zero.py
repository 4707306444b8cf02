"""Scale to zero, the operator's side, against the real API server and real HTTP: `llmop run`
(under deploy/rbac.yaml) told where the router runs (`LLMOP_ROUTER`), a router Deployment on kwok
whose pod IP is rewritten to a loopback address where a stand-in answers `/llmop/activity` in
the router's shape (on the pod's port named `admin`, as the chart names the router's admin
port), and stand-in engine agents with empty queues. Checked: an autoscaled CR with
`minReplicas: 0` stays up while the router reports a request in flight; once the router and the
engines are quiet for `idleSeconds` its Deployment goes to 0 through the scale subresource, Ready
says `ScaledToZero` with an Event and `status.scaleToZero.lastScaledToZeroTime`, and the HPA
keeps `minReplicas: 1`; the scale set back to 1 (as the router does) is a wake: `lastWakeTime`,
a `Waking` Event, and `lastWakeSeconds` once the replica is Ready."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from integration.test_operator_agents import engine_pods, point_at
from llmop_router.contract import ADMIN_PORT_NAME
from support.cluster import wait_until
from support.manifests import simulator_spec as spec
from support.operator import OperatorProcess
from support.router import router_deployment
from support.standin_agents import standin_agents

if TYPE_CHECKING:
    from support.operator import Kit

pytestmark = pytest.mark.cluster

IDLE_SECONDS = 10


class StandinRouter:
    """`GET /llmop/activity` on `host:port` answering `self.models`."""

    def __init__(self, host: str) -> None:
        self.models: list[dict[str, Any]] = []
        self.reads = 0
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                standin.reads += 1
                if self.path != "/llmop/activity":
                    self.send_error(404)
                    return
                body = json.dumps({"models": standin.models}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.host, self.port = host, int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@contextmanager
def standin_router() -> Iterator[StandinRouter]:
    router = StandinRouter(f"127.{random.randrange(2, 250)}.{random.randrange(1, 250)}.9")
    try:
        yield router
    finally:
        router.server.shutdown()
        router.server.server_close()


def ready(obj: dict[str, Any] | None) -> dict[str, Any]:
    found = ((obj or {}).get("status") or {}).get("conditions") or []
    return next((c for c in found if c["type"] == "Ready"), {})


def sleepy_when(
    kit: Kit,
    namespace: str,
    check: Callable[[dict[str, Any]], bool],
    *,
    timeout: float,
    what: str,
) -> dict[str, Any]:
    """The CR `sleepy` once `check` holds for it."""

    def probe() -> dict[str, Any] | None:
        obj = kit.get_llmd(namespace, "sleepy")
        return obj if obj is not None and check(obj) else None

    return wait_until(probe, timeout=timeout, what=what)


def replicas(kit: Kit, namespace: str, name: str) -> int:
    deployment = kit.kube.read("apps/v1", "Deployment", namespace, name) or {}
    return int((deployment.get("spec") or {}).get("replicas", 1))


def test_an_idle_model_goes_to_zero_and_a_wake_is_recorded(
    operator_kubeconfig: Path, tmp_path: Path, namespace: str, kit: Kit
) -> None:
    with standin_router() as router:
        deployment = router_deployment(namespace, 1)
        # The operator reads the activity on each router pod's port named `admin`, as the
        # chart names it: here the stand-in's.
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        container["ports"] = [{"name": ADMIN_PORT_NAME, "containerPort": router.port}]
        kit.kube.apply(deployment, field_manager="llmop-test")
        router_pod = wait_until(
            lambda: next(
                iter(
                    kit.kube.list(
                        "v1", "Pod", namespace, label_selector="app.kubernetes.io/name=llmop-router"
                    )
                ),
                None,
            ),
            timeout=30,
            what="the router pod",
        )
        process = OperatorProcess(
            operator_kubeconfig,
            tmp_path / "operator.log",
            extra_env={
                "LLMOP_ROUTER": f"{namespace}/llmop-router:8080",
                "LLMOP_AGENT_READ_INTERVAL_SECONDS": "2",
            },
        )
        process.start()
        try:
            _scenario(kit, namespace, router, router_pod)
        finally:
            process.stop()


def _scenario(kit: Kit, namespace: str, router: StandinRouter, router_pod: dict[str, Any]) -> None:
    meta = router_pod["metadata"]
    kit.kube.patch_status(
        "v1",
        "Pod",
        namespace,
        meta["name"],
        {"podIP": router.host, "podIPs": [{"ip": router.host}]},
    )
    router.models = [{"namespace": namespace, "name": "sleepy", "inFlight": 1, "held": 0}]
    autoscaling = {
        "minReplicas": 0,
        "maxReplicas": 2,
        "scaleToZero": {"idleSeconds": IDLE_SECONDS},
    }
    kit.apply_llmd(namespace, "sleepy", spec(autoscaling=autoscaling))
    hosts = [f"127.{random.randrange(2, 250)}.{random.randrange(1, 250)}.{i + 1}" for i in range(2)]
    with standin_agents(hosts) as agents:
        pods = wait_until(
            lambda: engine_pods(kit, namespace, "sleepy") or None, timeout=30, what="engine pod"
        )
        point_at(kit, pods[0], agents[0])
        up = sleepy_when(
            kit,
            namespace,
            lambda obj: bool(ready(obj).get("reason") == "AllReplicasReady"),
            timeout=60,
            what="sleepy Ready",
        )
        hpa = kit.kube.read("autoscaling/v2", "HorizontalPodAutoscaler", namespace, "sleepy")
        assert hpa is not None
        assert hpa["spec"]["minReplicas"] == 1

        # A request in flight at the router: the model stays up past its idle period.
        served_since = time.monotonic()
        wait_until(lambda: router.reads >= 2, timeout=40, what="the operator reading the router")
        time.sleep(max(0.0, IDLE_SECONDS + 2 - (time.monotonic() - served_since)))
        wait_until(lambda: router.reads >= 4, timeout=40, what="two more idle checks")
        assert replicas(kit, namespace, "sleepy") == 1
        assert ready(kit.get_llmd(namespace, "sleepy"))["reason"] == "AllReplicasReady"

        # Quiet everywhere: the next check takes it to zero.
        router.models = [
            {
                "namespace": namespace,
                "name": "sleepy",
                "inFlight": 0,
                "held": 0,
                "lastRequestUnix": time.time(),
            }
        ]
        zero = sleepy_when(
            kit,
            namespace,
            lambda obj: bool(ready(obj).get("reason") == "ScaledToZero"),
            timeout=IDLE_SECONDS + 40,
            what="sleepy ScaledToZero",
        )
        assert replicas(kit, namespace, "sleepy") == 0
        assert ready(zero)["status"] == "True"
        assert zero["status"]["scaleToZero"]["lastScaledToZeroTime"]
        assert up["status"].get("scaleToZero") is None

        # The router's wake: the scale back to 1.
        kit.kube.scale("apps/v1", "Deployment", namespace, "sleepy", 1)
        waking = sleepy_when(
            kit,
            namespace,
            lambda obj: bool((obj["status"].get("scaleToZero") or {}).get("lastWakeTime")),
            timeout=30,
            what="the wake recorded",
        )
        assert waking["status"]["scaleToZero"]["lastScaledToZeroTime"]
        woke = sleepy_when(
            kit,
            namespace,
            lambda obj: bool(
                (obj["status"].get("scaleToZero") or {}).get("lastWakeSeconds") is not None
            ),
            timeout=60,
            what="the woken replica Ready",
        )
        assert ready(woke)["reason"] == "AllReplicasReady"
        assert 0 <= woke["status"]["scaleToZero"]["lastWakeSeconds"] < 60

        def reasons() -> list[str]:
            return [
                e["reason"]
                for e in kit.kube.list("v1", "Event", namespace)
                if e["involvedObject"]["name"] == "sleepy"
            ]

        # Events are posted after the status write that earns them: a pass that saw the wake
        # and the ready replica at once wrote lastWakeSeconds a moment before its Waking Event.
        wait_until(lambda: "Waking" in reasons(), timeout=10, what="the Waking Event")
        time.sleep(2)  # a second Waking (a repeated transition) would be posted by now
        assert reasons().count("ScaledToZero") == 1
        assert reasons().count("Waking") == 1
