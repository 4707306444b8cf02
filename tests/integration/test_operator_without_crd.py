"""The operator and the router started before their CRD, on a cluster of their own (the
session's has the CRD): the chart with `crds.enabled=false` and the CRD installed later, a GitOps
sync that applies chart and CRDs in any order, a CRD deleted and installed again.

- The operator keeps running; its log and a Warning Event name the missing CRD and how to
  install it, and the log says when it appears. A CR created then is reconciled, even under RBAC
  that hides every CRD event from kopf (only `llmop.late_crds` can serve the CRD then).
- The CRD created late on a loaded API server (a burst of other CRDs and ConfigMaps beside it),
  with the LeaderWorkerSet CRD after llmop too, and CRs created right after it: every CR is
  Ready, the multi-node one has its LeaderWorkerSet, and the router (unready meanwhile, saying
  why in its log and `/readyz`) routes every one, each within `BOUND_SECONDS` of the CRD's
  creation, without a restart. kopf alone can miss a late CRD (it reads API discovery on each
  CRD event, and discovery can list the group only after the last one): `llmop.late_crds`
  rescans while a watched kind is missing, and the log says when it did.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmop.kube import Kube, KubeError
from support.cluster import Cluster, start_cluster, stop_cluster, wait_until
from support.manifests import llmd_manifest, open_crd, simulator_spec
from support.operator import (
    API_VERSION,
    CRD_FILE,
    CRD_NAME,
    OPERATOR_NAMESPACE,
    RBAC_FILE,
    TEST_MANAGER,
    OperatorProcess,
    conditions,
    install_crd,
    operator_kubeconfig_for,
    token_kubeconfig,
)
from support.router import RouterUrls, get_json, router_process

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def bare_cluster() -> Iterator[Cluster]:
    name = f"llmop-test-{os.getpid()}-nocrd{secrets.token_hex(2)}"
    try:
        cluster = start_cluster(name, owner_pid=os.getpid())
        cluster.kubectl("create", "namespace", OPERATOR_NAMESPACE)
        yield cluster
    finally:
        stop_cluster(name)


NO_CRD_WATCH = "llmop-no-crd-watch"
"""A ServiceAccount with deploy/rbac.yaml's permissions except on CRDs."""


def _kubeconfig_without_crd_watch(cluster: Cluster, directory: Path) -> Path:
    """A kubeconfig with the operator's RBAC less its list/watch of CRDs: kopf then never hears
    of a CRD (changes "will not be noticed", it says), so only `llmop.late_crds` can bring a
    late one in: the rescan path, every time (with the watch it is needed only when discovery
    lags the CRD's last event)."""
    cluster.kubectl("create", "serviceaccount", NO_CRD_WATCH, "-n", OPERATOR_NAMESPACE)
    renamed = {"llmop": NO_CRD_WATCH, "llmop-leader-election": f"{NO_CRD_WATCH}-leader-election"}
    objects = []
    for doc in yaml.safe_load_all(RBAC_FILE.read_text()):
        if not doc or doc["kind"] == "ServiceAccount":
            continue
        doc["metadata"]["name"] = renamed[doc["metadata"]["name"]]
        if "rules" in doc:
            doc["rules"] = [
                rule
                for rule in doc["rules"]
                if "customresourcedefinitions" not in rule["resources"]
            ]
        if "roleRef" in doc:
            doc["roleRef"]["name"] = renamed[doc["roleRef"]["name"]]
            for subject in doc["subjects"]:
                subject["name"] = NO_CRD_WATCH
        objects.append(doc)
    listed = {"apiVersion": "v1", "kind": "List", "items": objects}
    cluster.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(listed))
    return token_kubeconfig(
        cluster, NO_CRD_WATCH, directory / "kubeconfig-no-crd-watch", duration="1h"
    )


def test_missing_crd_is_reported_and_served_once_it_appears(
    bare_cluster: Cluster, tmp_path: Path
) -> None:
    """Under RBAC that hides every CRD event from kopf (the rescan alone serves the CRD)."""
    assert bare_cluster.kubectl("get", "crd", CRD_NAME, check=False).returncode != 0
    # The operator's "pod", named as the chart's downward API names it: the Event is about it.
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "llmop-0", "namespace": OPERATOR_NAMESPACE},
        "spec": {"containers": [{"name": "operator", "image": "localhost/pause:3.10"}]},
    }
    bare_cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))
    uid = bare_cluster.kubectl(
        "get", "pod", "llmop-0", "-n", OPERATOR_NAMESPACE, "-o", "jsonpath={.metadata.uid}"
    ).stdout.strip()
    operator = OperatorProcess(
        _kubeconfig_without_crd_watch(bare_cluster, tmp_path),
        tmp_path / "operator.log",
        extra_env={"POD_NAME": "llmop-0", "POD_UID": uid},
    )
    operator.start()
    try:
        wait_until(
            lambda: f"{CRD_NAME} is not installed" in operator.log_path.read_text(),
            timeout=30,
            what="the log naming the missing CRD",
        )
        assert "crds.enabled=true" in operator.log_path.read_text()

        def warning() -> dict[str, Any] | None:
            out = bare_cluster.kubectl("get", "events", "-n", OPERATOR_NAMESPACE, "-o", "json")
            found = [e for e in json.loads(out.stdout)["items"] if e["reason"] == "CRDMissing"]
            return found[0] if found else None

        event = wait_until(warning, timeout=30, what="a CRDMissing Event")
        assert event["type"] == "Warning"
        involved = event["involvedObject"]
        assert (involved["kind"], involved["name"], involved["uid"]) == ("Pod", "llmop-0", uid)
        assert CRD_NAME in str(event["message"])
        assert operator.process is not None
        assert operator.process.poll() is None, "the operator keeps running"
        # kopf may not watch CRDs (it retries, then says changes "will not be noticed").
        assert 'cannot list resource "customresourcedefinitions"' in operator.log_path.read_text()

        install_crd(bare_cluster)
        installed = time.monotonic()
        bare_cluster.kubectl("create", "namespace", "first")
        kube = Kube.connect(kubeconfig=bare_cluster.kubeconfig)
        try:
            kube.apply(
                llmd_manifest("first", "after-crd", _late_spec(1)), field_manager=TEST_MANAGER
            )

            def reconciled() -> bool:
                cr = kube.read(API_VERSION, "LLMDeployment", "first", "after-crd") or {}
                status = cr.get("status") or {}
                return status.get("observedGeneration") == cr["metadata"]["generation"]

            wait_until(reconciled, timeout=30, interval=0.25, what="the CR reconciled")
        finally:
            kube.close()
        took = time.monotonic() - installed
        assert "llmdeployments: watching them now" in operator.log_path.read_text()
        wait_until(
            lambda: f"{CRD_NAME} is installed: reconciling" in operator.log_path.read_text(),
            timeout=30,
            what="the log saying the CRD appeared",
        )
        print(
            f"\n[late-crd] no CRD watch: a CR reconciled {took:.1f} s after the CRD's Established"
        )
        assert operator.process is not None
        assert operator.process.poll() is None, "no restart"
    finally:
        operator.stop()


LWS_CRD = "leaderworkersets.leaderworkerset.x-k8s.io"
LWS_API = "leaderworkerset.x-k8s.io/v1"
LATE_CRS = 20
"""CRs created right after the CRD: one multi-node (a LeaderWorkerSet), the rest single-node."""
LOAD_CRDS = 40
LOAD_CONFIGMAPS = 400
BOUND_SECONDS = 30.0
"""From the CRD's creation to every late CR Ready (the multi-node one: its LeaderWorkerSet
applied) and routed by the router, under the burst, on the 2-core test machine."""
LATE_NAMESPACE = "late"


def _load_crd(index: int) -> dict[str, Any]:
    """A CRD of a group of its own: one more discovery update, one more kopf rescan."""
    return open_crd(f"g{index}.load.llmop.test", f"Load{index}")


class Burst:
    """Other objects created beside the CRD, as a GitOps sync or a busy cluster does: CRDs of
    other groups and ConfigMaps, from two threads, each with a connection of its own."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.threads: list[threading.Thread] = []
        self.errors: list[Exception] = []

    def start(self) -> Burst:
        crds = [_load_crd(i) for i in range(LOAD_CRDS)]
        configmaps = [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": f"load-{i}", "namespace": self.namespace},
                "data": {"payload": "x" * 2048},
            }
            for i in range(LOAD_CONFIGMAPS)
        ]
        for objects in (crds, configmaps):
            thread = threading.Thread(target=self._apply, args=(objects,), daemon=True)
            thread.start()
            self.threads.append(thread)
        return self

    def _apply(self, objects: list[dict[str, Any]]) -> None:
        kube = Kube.connect(kubeconfig=self.cluster.kubeconfig, pool_size=2)
        try:
            for obj in objects:
                kube.apply(obj, field_manager=TEST_MANAGER, want_result=False)
        except Exception as error:  # reported by join()
            self.errors.append(error)
        finally:
            kube.close()

    def join(self) -> None:
        for thread in self.threads:
            thread.join(timeout=120)
        assert not self.errors, self.errors


def _take_away_crd(cluster: Cluster, name: str) -> dict[str, Any] | None:
    """Delete the CRD `name`; returns it as it can be created again (None if absent)."""
    found = cluster.kubectl("get", "crd", name, "-o", "json", check=False)
    if found.returncode != 0:
        return None
    crd: dict[str, Any] = json.loads(found.stdout)
    metadata = crd["metadata"]
    crd["metadata"] = {k: metadata[k] for k in ("name", "labels") if k in metadata}
    crd.pop("status", None)
    cluster.kubectl("delete", "crd", name, "--wait=true", "--timeout=120s")
    return crd


def _late_spec(index: int) -> dict[str, Any]:
    if index == 0:
        return simulator_spec(engine={"backend": "simulator", "pipelineParallelSize": 2})
    # No GPUs: every pod fits the fake nodes; kwok marks each ready as soon as it is bound.
    return {
        "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
        "engine": {"backend": "simulator"},
        "resources": {"gpus": 0},
        "replicas": 1,
    }


def _create_as_soon_as_served(kube: Kube, manifest: dict[str, Any], deadline: float) -> float:
    """Create `manifest`, retrying while its kind is not served yet; when it was accepted."""
    while True:
        try:
            kube.apply(manifest, field_manager=TEST_MANAGER, want_result=False)
            return time.monotonic()
        except KubeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


class Progress:
    """When each late CR was served and routed, and the router Ready, in seconds since the
    CRD's creation."""

    def __init__(self, kube: Kube, router: RouterUrls, names: list[str], started: float) -> None:
        self.kube, self.router, self.names, self.started = kube, router, names, started
        self.served: dict[str, float] = {}
        """Ready at its generation; the multi-node one (the first): its LeaderWorkerSet."""
        self.routed: dict[str, float] = {}
        self.router_ready: float | None = None

    def _served(self, cr: dict[str, Any]) -> bool:
        metadata = cr["metadata"]
        if (cr.get("status") or {}).get("observedGeneration") != metadata["generation"]:
            return False
        if metadata["name"] == self.names[0]:
            workload = self.kube.read(LWS_API, "LeaderWorkerSet", LATE_NAMESPACE, metadata["name"])
            return workload is not None
        return conditions(cr).get("Ready", {}).get("status") == "True"

    def complete(self) -> bool:
        now = time.monotonic() - self.started
        for cr in self.kube.list(API_VERSION, "LLMDeployment", LATE_NAMESPACE):
            if cr["metadata"]["name"] not in self.served and self._served(cr):
                self.served[cr["metadata"]["name"]] = now
        _, table = get_json(f"{self.router.admin}/routes")
        for model in (table or {}).get("models") or {}:
            self.routed.setdefault(model, now)
        if self.router_ready is None and get_json(f"{self.router.url}/readyz")[0] == 200:
            self.router_ready = now
        return set(self.names) <= set(self.served) and set(self.names) <= set(self.routed)

    def summary(self) -> str:
        def span(times: dict[str, float]) -> str:
            mine = [t for name, t in times.items() if name in self.names]
            found = f"{min(mine):.1f}-{max(mine):.1f} s" if mine else "none"
            return f"{found} ({len(mine)}/{len(self.names)})"

        return (
            f"served {span(self.served)}, routed {span(self.routed)}, "
            f"router Ready at {self.router_ready} s"
        )


def _router_unready_reason(router: RouterUrls) -> str | None:
    status, body = get_json(f"{router.url}/readyz")
    waiting = " ".join((body or {}).get("waiting") or [])
    return waiting if status == 503 and "is not installed" in waiting else None


def test_a_late_crd_under_load_serves_every_cr_created_right_after_it(
    bare_cluster: Cluster, tmp_path: Path
) -> None:
    cluster = bare_cluster
    cluster.kubectl("delete", "crd", CRD_NAME, "--ignore-not-found", "--wait=true")
    lws_crd = _take_away_crd(cluster, LWS_CRD)
    assert lws_crd is not None, "every local cluster runs the LeaderWorkerSet controller"
    cluster.kubectl("create", "namespace", LATE_NAMESPACE)
    operator = OperatorProcess(
        operator_kubeconfig_for(cluster, tmp_path), tmp_path / "operator.log"
    )
    operator.start()
    kube = Kube.connect(kubeconfig=cluster.kubeconfig)
    try:
        with router_process(cluster.kubeconfig, tmp_path / "router.log") as router:
            # Before the CRD: the router is unready and says why, in /readyz and in its log.
            reason = wait_until(
                lambda: _router_unready_reason(router), timeout=30, what="the unready reason"
            )
            assert CRD_NAME in reason
            assert "crds.enabled=true" in reason
            router_log = (tmp_path / "router.log").read_text()
            assert f"CustomResourceDefinition {CRD_NAME} is not installed" in router_log

            # The burst, the two CRDs in the middle of it, and the CRs right after them.
            burst = Burst(cluster, LATE_NAMESPACE).start()
            time.sleep(1)
            started = time.monotonic()
            cluster.kubectl("apply", "--server-side", "-f", str(CRD_FILE))
            cluster.kubectl("create", "-f", "-", input=json.dumps(lws_crd))
            names = [f"late-{i:02d}" for i in range(LATE_CRS)]
            accepted = {
                name: _create_as_soon_as_served(
                    kube,
                    llmd_manifest(LATE_NAMESPACE, name, _late_spec(i)),
                    started + BOUND_SECONDS,
                )
                - started
                for i, name in enumerate(names)
            }
            progress = Progress(kube, router, names, started)
            try:
                wait_until(
                    progress.complete, timeout=BOUND_SECONDS + 60, interval=0.25, what="every CR"
                )
            finally:
                burst.join()
                rescans = operator.log_path.read_text().count("watching them now")
                after = [progress.served[n] - accepted[n] for n in names if n in progress.served]
                print(
                    f"\n[late-crd] CRs accepted {min(accepted.values()):.1f}-"
                    f"{max(accepted.values()):.1f} s after the CRD's creation; "
                    f"{progress.summary()}; each served {max(after, default=-1):.1f} s at most "
                    f"after it was accepted; llmop.late_crds rescans: {rescans}"
                )
            assert max(progress.served.values()) <= BOUND_SECONDS, progress.served
            assert max(progress.routed[name] for name in names) <= BOUND_SECONDS, progress.routed
            assert get_json(f"{router.url}/readyz") == (200, {"ok": True})
            assert "is installed: reconciling" in operator.log_path.read_text()
    finally:
        kube.close()
        assert operator.process is not None
        assert operator.process.poll() is None, "the operator never exited"
        operator.stop()
