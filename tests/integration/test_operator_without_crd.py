"""The operator started before its CRD (the chart with `crds.enabled=false`, or a CRD deleted):
it keeps running, its log and a Warning Event name the missing CRD and how to install it, and the
log says when the CRD appears. On a cluster of its own (the session's has the CRD).

Not asserted: that kopf then serves the new resource. kopf re-reads API discovery on each CRD
event; on a loaded machine discovery can lag past the CRD's last event, and kopf then never
serves it (seen once in a full suite run) until the operator restarts."""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.cluster import Cluster, start_cluster, stop_cluster, wait_until
from support.operator import CRD_NAME, OPERATOR_NAMESPACE, OperatorProcess, install_crd

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


def test_missing_crd_is_reported_and_its_arrival_noticed(
    bare_cluster: Cluster, tmp_path: Path
) -> None:
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
        bare_cluster.kubeconfig,
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

        install_crd(bare_cluster)
        wait_until(
            lambda: f"{CRD_NAME} is installed: reconciling" in operator.log_path.read_text(),
            timeout=30,
            what="the log saying the CRD appeared",
        )
    finally:
        operator.stop()
