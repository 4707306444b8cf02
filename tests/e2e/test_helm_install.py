"""`helm install` for real: the operator image runs as pods on the real node.

The operator image (built from operator/Dockerfile and imported into the node's containerd) is
installed with the chart's default values except the images' pull policy (nothing can be pulled
here), into a namespace that enforces Pod Security `restricted`. Its pods find their in-cluster
config and reach the API server through the `kubernetes` Service, elect a leader, and reconcile the
simulator sample into pods that answer through their Service and through the chart's router. The
NetworkPolicies the chart and the operator render are enforced on the node for one test
(kube-router's NetworkPolicy controller) and each path is tried from pods. Under streaming load
through the router's Service, one router pod is deleted (nothing lost) and one is killed (its
streams in flight lost, new requests served by the other pod). Then the leader pod is deleted while
the sample changes, the release is upgraded (the operator rolls, the engines do not) and uninstalled
(the CRD, the CR and its serving pods stay).

While this module runs, the session's host operator is stopped: two operators would both reconcile
every namespace (their Leases live in different namespaces)."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from llmop_router.contract import API_KEY_PREFIX, api_key_hash
from support.cluster import create_namespace, wait_until
from support.helm_release import CHART_DIR, CRD_NAME, NODE_IMAGE_VALUES, adopt_crd
from support.netpol_enforcer import connects, enforcing
from support.operator import REPO_ROOT
from support.realnode import (
    NODE_CONTAINERD,
    BackgroundLoad,
    RealCluster,
    import_into_node,
    pod_ready,
    post_json,
    service_url,
    summary,
)

# metrics: the chart's ServiceMonitor is checked against the cluster's Prometheus.
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.cluster,
    pytest.mark.metrics,
    pytest.mark.usefixtures("metrics_pipeline"),
]

SAMPLE = REPO_ROOT / "examples" / "simulator-small.yaml"
OPERATOR_PODS = "app.kubernetes.io/component=operator"
LEASE = "llmop-operator"
NODE = "llmop-real-node"
FAILOVER_BOUND_S = 45
ROUTER_PODS = "app.kubernetes.io/component=router"
ROUTER_PORT = 8080  # the chart's router.port: the router pods' API
ROUTER_ADMIN_PORT = 8081  # the chart's router.adminPort: /metrics, /routes, /llmop/activity
KILLED_ROUTER_BOUND_S = 10
"""Requests sent this long after a router pod's process is killed all succeed (the other pod)."""
METRICS_CONFIG = REPO_ROOT / "e2e" / "metrics" / "metrics_config.py"
TENANT = "e2e-helm"


@dataclass
class Install:
    """The release, the sample it serves and what the module measured on the way."""

    rc: RealCluster
    config: helm.Config
    release: str
    namespace: str
    apps: str
    sample: str
    timings: dict[str, float] = field(default_factory=dict)
    auth: dict[str, str] = field(default_factory=dict)
    """`Authorization` with the key of the tenant the module creates: the chart's router wants
    one (its gateway is on by default)."""

    def kubectl(self, *args: str, check: bool = True) -> Any:
        return self.rc.kubectl(*args, check=check)

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def operator_pods(self) -> list[dict[str, Any]]:
        pods: list[dict[str, Any]] = self.get("pods", "-n", self.namespace, "-l", OPERATOR_PODS)[
            "items"
        ]
        return [p for p in pods if not p["metadata"].get("deletionTimestamp")]

    def leader(self) -> str:
        """The pod named by the Lease holder ("<pod>_<random>"), or "" when none holds it."""
        lease = self.get("lease", LEASE, "-n", self.namespace)
        holder: str = lease["spec"].get("holderIdentity") or ""
        return holder.rpartition("_")[0]

    def router_pods(self) -> list[dict[str, Any]]:
        pods: list[dict[str, Any]] = self.get("pods", "-n", self.namespace, "-l", ROUTER_PODS)[
            "items"
        ]
        return [p for p in pods if not p["metadata"].get("deletionTimestamp")]

    def engine_pods(self) -> list[dict[str, Any]]:
        selector = f"app.kubernetes.io/instance={self.sample}"
        pods: list[dict[str, Any]] = self.get("pods", "-n", self.apps, "-l", selector)["items"]
        # Not one still draining after the scale-down.
        return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def _restricted_namespace(rc: RealCluster) -> str:
    name = create_namespace(rc.cluster, "llmop-system")
    rc.kubectl(
        "label",
        "namespace",
        name,
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/enforce-version=latest",
    )
    return name


@pytest.fixture(scope="module")
def install(real_cluster: RealCluster) -> Iterator[Install]:
    rc = real_cluster
    timings = {"image build + import": import_into_node("operator", "router", "redis")}
    namespace = _restricted_namespace(rc)
    apps = create_namespace(rc.cluster, "helm-apps")
    release = f"llmop-{secrets.token_hex(2)}"
    rc.operator.stop()
    try:
        with helm.Config(kubeconfig_path=rc.cluster.kubeconfig, namespace=namespace) as config:
            adopt_crd(rc.cluster, release, namespace)
            started = time.monotonic()
            try:
                config.install(
                    CHART_DIR,
                    release,
                    NODE_IMAGE_VALUES,
                    namespace=namespace,
                    wait="watcher",
                    timeout=240,
                )
                timings["helm install --wait"] = time.monotonic() - started
                key = _tenant(rc, TENANT)
                yield Install(
                    rc,
                    config,
                    release,
                    namespace,
                    apps,
                    "qwen-small",
                    timings=timings,
                    auth={"Authorization": f"Bearer {key}"},
                )
            finally:
                try:
                    config.uninstall(release, ignore_not_found=True, wait="watcher", timeout=120)
                except helm.HelmError as error:
                    print(f"helm uninstall {release}: {error}")
    finally:
        rc.operator.start()
        rc.kubectl("delete", "llmtenant", TENANT, "--ignore-not-found", check=False)
        rc.kubectl("delete", "namespace", apps, namespace, "--timeout=180s", check=False)
        print("helm install e2e timings:", {k: round(v, 1) for k, v in timings.items()})


def _tenant(rc: RealCluster, name: str) -> str:
    """An LLMTenant `name` for every model, with one new key: the key."""
    key = API_KEY_PREFIX + secrets.token_urlsafe(32)
    tenant = {
        "apiVersion": "serving.llmop.dev/v1alpha1",
        "kind": "LLMTenant",
        "metadata": {"name": name},
        "spec": {"models": ["*"], "apiKeys": [{"name": "e2e", "sha256": api_key_hash(key)}]},
    }
    rc.kubectl("apply", "-f", "-", input=json.dumps(tenant))
    return key


def _completion(url: str, model: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    status, body = post_json(
        f"{url}/v1/chat/completions",
        {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4},
        headers=headers,
    )
    assert status == 200, body
    assert body["choices"][0]["message"]["content"], body
    result: dict[str, Any] = body
    return result


def _scrape(ip: str, port: int) -> str:
    with urllib.request.urlopen(f"http://{ip}:{port}/metrics", timeout=5) as answer:
        text: str = answer.read().decode()
    return text


def _gauge(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(f"{name} ") or line.startswith(f"{name}{{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exposed")


def _metrics_port(pod: dict[str, Any]) -> int:
    ports = pod["spec"]["containers"][0]["ports"]
    port: int = next(p["containerPort"] for p in ports if p["name"] == "metrics")
    return port


def _ready_operators(install: Install) -> list[dict[str, Any]] | None:
    pods = install.operator_pods()
    return pods if len(pods) == 2 and all(map(pod_ready, pods)) else None


def test_operator_pods_run_ready_on_the_real_node_under_restricted(install: Install) -> None:
    pods = wait_until(lambda: _ready_operators(install), timeout=60, what="2 Ready operator pods")
    assert {p["spec"]["nodeName"] for p in pods} == {NODE}
    for pod in pods:
        security = pod["spec"]["containers"][0]["securityContext"]
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"]["drop"] == ["ALL"]
    namespace = install.get("namespace", install.namespace)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    names = {p["metadata"]["name"] for p in pods}
    leader = wait_until(install.leader, timeout=30, what="a Lease holder")
    assert leader in names
    # /metrics of each pod, from the host through the node's bridge: one leader, one standby.
    leaders = {
        p["metadata"]["name"]: _gauge(
            _scrape(p["status"]["podIP"], _metrics_port(p)), "llmop_leader"
        )
        for p in pods
    }
    assert leaders == {n: (1.0 if n == leader else 0.0) for n in names}, leaders
    # And through the chart's metrics Service (kube-proxy picks either pod). kube-proxy programs
    # a new Service's rules on its own schedule after the endpoints are ready: until then the
    # ClusterIP refuses (seen once in a full run), so give it a little time.
    service = install.get("service", f"{install.release}-metrics", "-n", install.namespace)
    port = service["spec"]["ports"][0]["port"]

    def scraped() -> str | None:
        try:
            return _scrape(service["spec"]["clusterIP"], port)
        except OSError:
            return None

    assert "llmop_leader" in wait_until(scraped, timeout=30, what="/metrics through the Service")


def _sample_ready(install: Install) -> dict[str, Any] | None:
    obj = install.get("llmdeployment", install.sample, "-n", install.apps)
    status = obj.get("status") or {}
    if status.get("observedGeneration") != obj["metadata"]["generation"]:
        return None
    ready = {c["type"]: c["status"] for c in status.get("conditions") or []}.get("Ready")
    return obj if ready == "True" else None


def test_sample_applied_by_kubectl_answers_through_its_service_and_the_router(
    install: Install,
) -> None:
    sample = yaml.safe_load(SAMPLE.read_text())
    sample["metadata"]["namespace"] = install.apps
    started = time.monotonic()
    install.rc.kubectl("apply", "-f", "-", input=yaml.safe_dump(sample))
    ready = wait_until(lambda: _sample_ready(install), timeout=120, what="the sample Ready")
    install.timings["sample applied → Ready"] = time.monotonic() - started
    # Routed by default: its endpoint is the chart's router, which has ready pods.
    router_name = f"{install.release}-router"
    assert ready["status"]["endpoint"] == f"http://{router_name}.{install.namespace}.svc:8080/v1"
    degraded = {c["type"]: c for c in ready["status"]["conditions"]}["Degraded"]
    assert degraded["status"] == "False", degraded
    pods = install.engine_pods()
    assert len(pods) == sample["spec"]["replicas"]
    assert {p["spec"]["nodeName"] for p in pods} == {NODE}
    _completion(service_url(install.rc.cluster, install.apps, install.sample), install.sample)
    router = service_url(install.rc.cluster, install.namespace, router_name)
    # The router pods watch through the `kubernetes` Service too; they list the sample once
    # its endpoints are ready.
    wait_until(
        lambda: install.sample in _models(router, install.auth),
        timeout=60,
        what="the router lists the sample",
    )
    _completion(router, install.sample, install.auth)


def _status_with(url: str, model: str, headers: dict[str, str]) -> int:
    try:
        status, _body = post_json(
            f"{url}/v1/chat/completions",
            {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            headers=headers,
        )
    except urllib.error.HTTPError as error:
        return error.code
    return status


def test_the_routers_gateway_wants_a_key_and_forgets_a_deleted_tenants(install: Install) -> None:
    """The chart's default: the router's gateway on, its store the chart's Redis. No key is a
    401; a tenant's key is served; once the tenant is deleted its key is a 401 again."""
    wait_until(lambda: _sample_ready(install), timeout=120, what="the sample Ready")
    router = service_url(install.rc.cluster, install.namespace, f"{install.release}-router")
    wait_until(
        lambda: install.sample in _models(router, install.auth), timeout=60, what="routed sample"
    )
    assert _status_with(router, install.sample, {}) == 401
    key = _tenant(install.rc, "e2e-revoked")
    bearer = {"Authorization": f"Bearer {key}"}
    wait_until(
        lambda: _status_with(router, install.sample, bearer) == 200,
        timeout=30,
        what="the new tenant's key served",
    )
    deleted = time.monotonic()
    install.kubectl("delete", "llmtenant", "e2e-revoked")
    wait_until(
        lambda: _status_with(router, install.sample, bearer) == 401,
        timeout=10,
        interval=0.1,
        what="the deleted tenant's key refused",
    )
    refused_after = time.monotonic() - deleted
    install.timings["tenant deleted → its key refused"] = refused_after
    print(f"gateway: a deleted tenant's key was refused {refused_after:.2f} s after the delete")
    # Both router pods count in the chart's store, which answers (no breaker open).
    for pod in install.router_pods():
        text = _scrape(pod["status"]["podIP"], ROUTER_ADMIN_PORT)
        assert _gauge(text, "llmop_gateway_store_degraded") == 0.0


PATHS = ("engine API", "engine agent", "router", "router admin")
ADMITTED = {
    # Another namespace: the router's public port only (`networkPolicy.routerFrom` empty).
    "stranger": {"engine API": False, "engine agent": False, "router": True, "router admin": False},
    # The CR's own namespace: its engines' API too, never their agents or the admin port.
    "neighbour": {"engine API": True, "engine agent": False, "router admin": False},
    # The router: the engines' API and the agents (it asks a waking pod's agent itself).
    "router": {"engine API": True, "engine agent": True},
    # The operator: the agents (their /status) and the router's admin port (/routes).
    "operator": {"engine agent": True, "router admin": True},
}


def _named_port(pod: dict[str, Any], name: str) -> int:
    port: int = next(
        p["containerPort"]
        for c in pod["spec"]["containers"]
        for p in c.get("ports") or []
        if p.get("name") == name
    )
    return port


def _client_pod(install: Install, namespace: str, image: str) -> str:
    """A pod that only sleeps (python3 in the engine image), to connect from; its name once it
    runs."""
    name = f"netpol-client-{secrets.token_hex(2)}"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "netpol-client"}},
        "spec": {
            "nodeName": NODE,
            "terminationGracePeriodSeconds": 0,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 65534,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "client",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python3", "-c", "import time; time.sleep(3600)"],
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }
    install.rc.kubectl("apply", "-f", "-", input=json.dumps(pod))
    wait_until(
        lambda: install.get("pod", name, "-n", namespace)["status"].get("phase") == "Running",
        timeout=60,
        what=f"client pod {namespace}/{name} running",
    )
    return name


def test_the_network_policies_are_enforced_on_the_real_node(
    install: Install, tmp_path: Path
) -> None:
    """The chart's NetworkPolicies (the router's) and the one the operator renders per CR (the
    engines'), enforced on the real node by kube-router's NetworkPolicy controller
    (`support.netpol_enforcer`; kube-proxy enforces none). From pods in another namespace, in
    the CR's own, the router and the operator, each path opens or is refused as
    docs/operations.md says; a request through the router's Service is served meanwhile and
    every pod stays Ready (the kubelet's probes come from the node, always admitted). Before
    and after enforcement every path opens: a refusal is the policies', not the probe's."""
    wait_until(lambda: _sample_ready(install), timeout=120, what="the sample Ready")
    (engine, *_) = install.engine_pods()
    (router_pod, *_) = install.router_pods()
    (operator_pod, *_) = install.operator_pods()
    address, router_address = engine["status"]["podIP"], router_pod["status"]["podIP"]
    targets = {
        "engine API": f"{address}:{_named_port(engine, 'http')}",
        "engine agent": f"{address}:{_named_port(engine, 'probe')}",
        "router": f"{router_address}:{ROUTER_PORT}",
        "router admin": f"{router_address}:{ROUTER_ADMIN_PORT}",
    }
    outside = create_namespace(install.rc.cluster, "netpol")
    image = engine["spec"]["containers"][0]["image"]
    neighbour = ""
    try:
        stranger = _client_pod(install, outside, image)
        neighbour = _client_pod(install, install.apps, image)
        sources = {
            "stranger": (outside, stranger, ""),
            "neighbour": (install.apps, neighbour, ""),
            "router": (install.namespace, router_pod["metadata"]["name"], "router"),
            "operator": (install.namespace, operator_pod["metadata"]["name"], "operator"),
        }

        def reach(source: str) -> dict[str, bool]:
            namespace, pod, container = sources[source]
            paths = list(ADMITTED[source])
            found = connects(
                install.rc.cluster, namespace, pod, [targets[p] for p in paths], container
            )
            return {p: found[targets[p]] == "open" for p in paths}

        assert reach("stranger") == dict.fromkeys(PATHS, True)
        router_url = service_url(install.rc.cluster, install.namespace, f"{install.release}-router")
        started = time.monotonic()
        with enforcing(install.rc.cluster, NODE, tmp_path / "kube-router.log"):
            install.timings["NetworkPolicy enforced"] = time.monotonic() - started
            found = {source: reach(source) for source in ADMITTED}
            _completion(router_url, install.sample, install.auth)
            time.sleep(3)  # a few of the kubelet's probe periods
            pods = install.engine_pods() + install.router_pods() + install.operator_pods()
            unready = [p["metadata"]["name"] for p in pods if not pod_ready(p)]
        assert found == ADMITTED
        assert not unready, unready
        assert reach("stranger") == dict.fromkeys(PATHS, True)
        print(f"network policy: {found}")
    finally:
        if neighbour:
            install.kubectl("delete", "pod", neighbour, "-n", install.apps, "--wait=false")
        install.kubectl("delete", "namespace", outside, "--wait=false", check=False)


def _ready_routers(install: Install) -> list[dict[str, Any]] | None:
    pods = install.router_pods()
    return pods if len(pods) == 2 and all(map(pod_ready, pods)) else None


def _router_load(router: str, model: str, headers: dict[str, str]) -> BackgroundLoad:
    # Short answers (16 tokens, ~0.3 s): many new connections a second, so a moment in which
    # the Service still sends them to a router pod that stopped listening shows.
    return BackgroundLoad(
        router, model=model, concurrency=8, duration=600, max_tokens=16, headers=headers
    ).start()


def test_a_router_pod_deleted_or_killed_under_load(install: Install) -> None:
    """Streaming load through the router's Service while one router pod goes: deleted (SIGTERM)
    it loses nothing; killed (SIGKILL) it loses what it had in flight, and new requests succeed
    through the other pod once kube-proxy dropped the dead one."""
    wait_until(lambda: _sample_ready(install), timeout=120, what="the sample Ready")
    router = service_url(install.rc.cluster, install.namespace, f"{install.release}-router")
    pods = wait_until(lambda: _ready_routers(install), timeout=60, what="2 Ready router pods")
    wait_until(
        lambda: install.sample in _models(router, install.auth), timeout=60, what="routed sample"
    )

    # Deleted the normal way: unready but answering for router.shutdownDelaySeconds while
    # kube-proxy drops it, then its streams in flight finish.
    load = _router_load(router, install.sample, install.auth)
    time.sleep(3)
    victim = pods[0]["metadata"]["name"]
    started = time.monotonic()
    install.kubectl("delete", "pod", victim, "-n", install.namespace, "--wait=false")
    wait_until(
        lambda: (
            install.kubectl("get", "pod", victim, "-n", install.namespace, check=False).returncode
            != 0
        ),
        timeout=120,
        what=f"router pod {victim} gone",
    )
    install.timings["router pod deleted → gone"] = time.monotonic() - started
    pods = wait_until(lambda: _ready_routers(install), timeout=60, what="2 Ready router pods")
    time.sleep(2)
    result = load.stop()
    print(f"router pod deleted under load: {summary(result)}")
    assert result.total >= 20, summary(result)
    assert result.lost == 0, summary(result)

    # Killed: the streams it relayed break; new connections meet its closed port until the
    # kubelet reports the container dead and kube-proxy drops the endpoint.
    load = _router_load(router, install.sample, install.auth)
    time.sleep(3)
    container = pods[0]["status"]["containerStatuses"][0]["containerID"].partition("://")[2]
    killed = time.monotonic()
    ctr = ("ctr", "--address", NODE_CONTAINERD, "-n", "k8s.io")
    subprocess.run(
        [*ctr, "tasks", "kill", "--signal", "SIGKILL", container], check=True, timeout=30
    )
    time.sleep(KILLED_ROUTER_BOUND_S + 5)
    result = load.stop()
    timeline = result.timeline
    lost_in_flight = sum(1 for sent, _, outcome in timeline if sent < killed and outcome != "ok")
    failed_after = [sent - killed for sent, _, ok in timeline if sent >= killed and ok != "ok"]
    settled = [o for sent, _, o in timeline if sent >= killed + KILLED_ROUTER_BOUND_S]
    last_failed = max(failed_after, default=0.0)
    print(
        f"router pod killed under load: {lost_in_flight} lost in flight, {len(failed_after)} "
        f"requests sent after the kill failed, the last {last_failed:.2f} s after it; "
        f"{summary(result)}"
    )
    install.timings["router pod killed → new requests all succeed"] = last_failed
    assert len(settled) >= 10, summary(result)
    assert settled == ["ok"] * len(settled), summary(result)
    # The kubelet restarts the killed container; it is Ready once its watches listed again.
    wait_until(lambda: _ready_routers(install), timeout=90, what="2 Ready router pods again")


def _zero_state(install: Install, name: str) -> dict[str, Any] | None:
    """The CR once the operator took it to zero: Ready/ScaledToZero and no engine pod left."""
    obj = install.get("llmdeployment", name, "-n", install.apps)
    ready = {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}.get("Ready")
    if not ready or ready["reason"] != "ScaledToZero":
        return None
    selector = f"app.kubernetes.io/instance={name}"
    pods = install.get("pods", "-n", install.apps, "-l", selector)["items"]
    return obj if not pods else None


def test_an_idle_model_goes_to_zero_and_a_held_request_wakes_it(install: Install) -> None:
    """Scale to zero with the chart's operator and router pods: after idleSeconds with nothing
    in flight the operator sets the Deployment to 0; a request through the router is held, the
    router scales the Deployment to 1, and the request is answered once the replica is Ready."""
    name = "zero"
    sample = yaml.safe_load(SAMPLE.read_text())
    sample["metadata"] |= {"name": name, "namespace": install.apps}
    del sample["spec"]["replicas"]
    sample["spec"]["autoscaling"] = {
        "minReplicas": 0,
        "maxReplicas": 2,
        "scaleToZero": {"idleSeconds": 10, "holdTimeoutSeconds": 180},
    }
    install.rc.kubectl("apply", "-f", "-", input=yaml.safe_dump(sample))
    router = service_url(install.rc.cluster, install.namespace, f"{install.release}-router")
    try:

        def answered() -> bool:
            try:
                _completion(router, name, install.auth)
            except (OSError, AssertionError):
                return False  # not listed yet, or no ready replica yet (503)
            return True

        wait_until(answered, timeout=180, interval=1, what="an answer through the router")
        last_request = time.monotonic()
        zero = wait_until(
            lambda: _zero_state(install, name), timeout=180, interval=1, what="scaled to zero"
        )
        install.timings["last request → zero engine pods"] = time.monotonic() - last_request
        deployment = install.get("deployment", name, "-n", install.apps)
        assert deployment["spec"]["replicas"] == 0
        assert zero["status"]["scaleToZero"]["lastScaledToZeroTime"]

        sent = time.monotonic()
        status, body = post_json(
            f"{router}/v1/chat/completions",
            {"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            timeout=180,
            headers=install.auth,
        )
        woke = time.monotonic() - sent
        install.timings["held request at zero → answered"] = woke
        print(f"scale to zero: a request at zero was answered after {woke:.1f} s")
        assert status == 200, body
        assert body["choices"][0]["message"]["content"], body

        def woken() -> dict[str, Any] | None:
            obj = install.get("llmdeployment", name, "-n", install.apps)
            history = (obj.get("status") or {}).get("scaleToZero") or {}
            return obj if history.get("lastWakeSeconds") is not None else None

        history = wait_until(woken, timeout=60, what="the wake recorded")["status"]["scaleToZero"]
        assert 0 < history["lastWakeSeconds"] <= woke + 5, history
        reasons = {
            e["reason"]
            for e in install.get("events", "-n", install.apps)["items"]
            if e["involvedObject"]["name"] == name
        }
        assert {"ScaledToZero", "Waking"} <= reasons, reasons

        _a_router_pod_stopping_while_holding(install, name, router)
    finally:
        install.kubectl("delete", "llmdeployment", name, "-n", install.apps, "--wait=false")


def _a_router_pod_stopping_while_holding(install: Install, name: str, router: str) -> None:
    """At zero again: a request held by one router pod, then that pod deleted. It answers the
    held request 503 with Retry-After at once (its SIGTERM handler), and the client's retry
    through the Service is held by the other pod and answered after the wake."""
    wait_until(lambda: _zero_state(install, name), timeout=180, interval=1, what="at zero again")
    pod = wait_until(lambda: _ready_routers(install), timeout=60, what="2 Ready router pods")[0]
    direct = f"http://{pod['status']['podIP']}:{ROUTER_PORT}"
    admin = f"http://{pod['status']['podIP']}:{ROUTER_ADMIN_PORT}"
    chat = {"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    outcome: dict[str, Any] = {}

    def held_request() -> None:
        try:
            outcome["status"], outcome["body"] = post_json(
                f"{direct}/v1/chat/completions", chat, timeout=60, headers=install.auth
            )
        except urllib.error.HTTPError as error:
            outcome["status"], outcome["retry_after"] = error.code, error.headers["Retry-After"]
            outcome["body"] = error.read().decode()
        outcome["at"] = time.monotonic()

    sender = threading.Thread(target=held_request, daemon=True)
    sender.start()
    wait_until(lambda: _held(admin, name) > 0, timeout=10, interval=0.1, what="the request held")
    stopped = time.monotonic()
    install.kubectl(
        "delete", "pod", pod["metadata"]["name"], "-n", install.namespace, "--wait=false"
    )
    sender.join(timeout=30)
    assert outcome.get("status") == 503, outcome
    assert outcome["retry_after"] == "1", outcome
    assert "stopping" in outcome["body"], outcome
    install.timings["router pod stopped while holding → its held request 503"] = (
        outcome["at"] - stopped
    )

    # The client retries as told; the Service may still pick the stopping pod for a moment.
    retried = time.monotonic()
    for _ in range(30):
        try:
            status, body = post_json(
                f"{router}/v1/chat/completions", chat, timeout=180, headers=install.auth
            )
            break
        except urllib.error.HTTPError as error:
            if error.code != 503:
                raise
            time.sleep(float(error.headers["Retry-After"] or 1))
    else:
        pytest.fail("the retry got 503 thirty times")
    assert status == 200, body
    install.timings["retry after the 503 → answered"] = time.monotonic() - retried
    wait_until(lambda: _ready_routers(install), timeout=90, what="2 Ready router pods again")


def _held(admin: str, name: str) -> float:
    """The router pod's `llmop_router_held_requests` for CR `name` (0 when it holds none), from
    its admin port."""
    try:
        with urllib.request.urlopen(f"{admin}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    except OSError:
        return 0.0
    return sum(
        float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if line.startswith("llmop_router_held_requests{") and f'llmdeployment="{name}"' in line
    )


def _models(router: str, headers: dict[str, str]) -> list[str]:
    request = urllib.request.Request(f"{router}/v1/models", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return [m["id"] for m in json.load(answer)["data"]]
    except OSError:
        return []


def _prometheus(rc: RealCluster) -> tuple[str, Path]:
    """The cluster's Prometheus (e2e/metrics/pipeline.sh): its URL and its config directory."""
    metrics = Path(rc.cluster.kubeconfig).parent / "metrics"
    addr = metrics / "prometheus.addr"
    if not addr.exists():
        pytest.fail(f"the metrics pipeline is not running ({addr} missing)")
    return "http://" + addr.read_text().strip(), metrics / "config"


def _monitor_release(rc: RealCluster, release: str | None, namespace: str | None) -> None:
    """Rewrite Prometheus's config for the chart installed as `release` in `namespace` (what
    prometheus-operator would generate from that release's monitors; None: the pipeline's
    default release) and reload it."""
    url, config = _prometheus(rc)
    target = ["--release", release, "--namespace", namespace] if release and namespace else []
    command = [sys.executable, str(METRICS_CONFIG), "write", "--out", str(config)]
    subprocess.run(
        [*command, "--kubeconfig", str(rc.cluster.kubeconfig), *target],
        check=True,
        timeout=120,
    )
    request = urllib.request.Request(f"{url}/-/reload", method="POST")
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.status == 200


def _query(url: str, promql: str) -> list[dict[str, Any]]:
    query = urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=10) as answer:
        result: list[dict[str, Any]] = json.load(answer)["data"]["result"]
    return result


def test_prometheus_scrapes_the_operator_pods_through_the_chart_servicemonitor(
    install: Install,
) -> None:
    url, _ = _prometheus(install.rc)
    _monitor_release(install.rc, install.release, install.namespace)
    try:
        job = f'job="{install.release}-metrics",namespace="{install.namespace}"'

        def scraped() -> list[dict[str, Any]] | None:
            series = _query(url, f"up{{{job}}}")
            return (
                series if len(series) == 2 and all(s["value"][1] == "1" for s in series) else None
            )

        series = wait_until(scraped, timeout=120, interval=2, what="both operator pods scraped")
        pods = {p["metadata"]["name"] for p in install.operator_pods()}
        assert {s["metric"]["pod"] for s in series} == pods
        leaders = _query(url, f"sum(llmop_leader{{{job}}})")
        assert leaders, "llmop_leader is scraped"
        assert leaders[0]["value"][1] == "1", "one leader among the scraped pods"
    finally:
        _monitor_release(install.rc, None, None)


def test_deleting_the_leader_pod_hands_over_and_a_change_meanwhile_converges(
    install: Install,
) -> None:
    wait_until(lambda: _sample_ready(install), timeout=120, what="the sample Ready")
    leader = wait_until(install.leader, timeout=30, what="a Lease holder")
    started = time.monotonic()
    install.kubectl("delete", "pod", leader, "-n", install.namespace, "--wait=false")
    install.kubectl(
        "patch",
        "llmdeployment",
        install.sample,
        "-n",
        install.apps,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"replicas": 1}}),
    )

    def successor() -> str | None:
        held = install.leader()
        return held if held and held != leader else None

    wait_until(
        successor,
        timeout=FAILOVER_BOUND_S,
        interval=0.2,
        what="another operator pod holding the Lease",
    )
    install.timings["leader pod deleted → successor holds the Lease"] = time.monotonic() - started

    def converged() -> bool:
        obj = _sample_ready(install)
        deployment = install.get("deployment", install.sample, "-n", install.apps)
        return bool(
            obj is not None
            and obj["status"].get("readyReplicas") == 1
            and deployment["spec"]["replicas"] == 1
        )

    wait_until(converged, timeout=120, what="the sample at 1 replica, Ready")
    install.timings["change during the handover → converged"] = time.monotonic() - started
    wait_until(lambda: _ready_operators(install), timeout=90, what="2 Ready operator pods again")


def test_helm_upgrade_rolls_the_operator_and_leaves_the_engines(install: Install) -> None:
    wait_until(lambda: _sample_ready(install), timeout=120, what="the sample Ready")
    engines = {p["metadata"]["uid"] for p in install.engine_pods()}
    operators = {p["metadata"]["name"] for p in install.operator_pods()}
    deployment = install.get("deployment", install.sample, "-n", install.apps)
    install.config.upgrade(
        CHART_DIR,
        install.release,
        {**NODE_IMAGE_VALUES, "operator": {"logFormat": "text"}},
        namespace=install.namespace,
        wait="watcher",
        timeout=240,
    )

    def rolled() -> list[dict[str, Any]] | None:
        pods = _ready_operators(install)
        fresh = pods and not operators & {p["metadata"]["name"] for p in pods}
        return pods if fresh else None

    pods = wait_until(rolled, timeout=120, what="2 new Ready operator pods")
    env = {e["name"]: e.get("value") for e in pods[0]["spec"]["containers"][0]["env"]}
    assert env["LLMOP_LOG_FORMAT"] == "text"
    wait_until(install.leader, timeout=30, what="a Lease holder after the upgrade")
    # The new leader re-reconciles the sample and finds nothing to change.
    time.sleep(5)
    assert {p["metadata"]["uid"] for p in install.engine_pods()} == engines
    after = install.get("deployment", install.sample, "-n", install.apps)
    assert after["metadata"]["generation"] == deployment["metadata"]["generation"]
    _completion(service_url(install.rc.cluster, install.apps, install.sample), install.sample)


def test_helm_uninstall_keeps_the_crd_the_cr_and_its_serving_pods(install: Install) -> None:
    engines = {p["metadata"]["uid"] for p in install.engine_pods()}
    install.config.uninstall(install.release, wait="watcher", timeout=120)
    gone = install.kubectl(
        "get", "deployment", install.release, "-n", install.namespace, check=False
    )
    assert gone.returncode != 0
    assert install.kubectl("get", "crd", CRD_NAME, check=False).returncode == 0
    assert (
        install.kubectl(
            "get", "llmdeployment", install.sample, "-n", install.apps, check=False
        ).returncode
        == 0
    )
    assert {p["metadata"]["uid"] for p in install.engine_pods()} == engines
    _completion(service_url(install.rc.cluster, install.apps, install.sample), install.sample)


UNPULLABLE = "127.0.0.1:1/llmop/operator"
"""A registry on this machine that refuses connections: the pull fails at once, and nothing
leaves the machine (a name on a real registry would be fetched from the internet)."""


def test_an_image_that_cannot_be_pulled_fails_helm_install_wait(install: Install) -> None:
    namespace = _restricted_namespace(install.rc)
    release = f"broken-{secrets.token_hex(2)}"
    values = {
        **NODE_IMAGE_VALUES,
        "image": {"repository": UNPULLABLE, "pullPolicy": "IfNotPresent"},
        "crds": {"enabled": False},
        "router": {"enabled": False},
    }
    started = time.monotonic()
    try:
        with helm.Config(
            kubeconfig_path=install.rc.cluster.kubeconfig, namespace=namespace
        ) as config:
            with pytest.raises(helm.HelmError):
                config.install(
                    CHART_DIR, release, values, namespace=namespace, wait="watcher", timeout=40
                )
            assert time.monotonic() - started < 90, "helm install --wait fails within its timeout"
            described = install.kubectl(
                "describe", "pods", "-n", namespace, "-l", OPERATOR_PODS
            ).stdout
            assert "ErrImagePull" in described or "ImagePullBackOff" in described, described
            assert UNPULLABLE in described
            config.uninstall(release, ignore_not_found=True, wait="watcher", timeout=60)
    finally:
        install.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
