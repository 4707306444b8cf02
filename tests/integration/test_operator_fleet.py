"""The operator reads its fleet, against the real API server: a kwok pod's status is rewritten
through the `pods/status` subresource (what the kubelet does) to an OOM-killed restart and an
image pull failure, and the LLMDeployment's `Degraded` condition and Events follow while
`Ready` stays honest. With LLMOP_CAPTURE_FIXTURES=1 the degraded object is written to
tests/fixtures/ for the Argo CD health tests."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pytest

from gitops.argocd_lua import FIXTURES
from support.cluster import wait_until
from support.manifests import simulator_spec as spec

if TYPE_CHECKING:
    from support.operator import Kit, OperatorProcess

pytestmark = pytest.mark.cluster

CAPTURE = os.environ.get("LLMOP_CAPTURE_FIXTURES", "") == "1"


def conds(obj: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in ((obj or {}).get("status") or {}).get("conditions") or []}


def engine_pods(kit: Kit, namespace: str, name: str) -> list[dict[str, Any]]:
    selector = f"serving.llmop.dev/deployment={name}"
    return sorted(
        kit.kube.list("v1", "Pod", namespace, label_selector=selector),
        key=lambda p: p["metadata"]["name"],
    )


def set_container(kit: Kit, pod: dict[str, Any], **changes: Any) -> None:
    """Rewrite the engine container's status the way the kubelet would (pods/status), on top
    of what it says now."""
    metadata = pod["metadata"]
    live = kit.get("v1", "Pod", metadata["namespace"], metadata["name"])
    assert live is not None
    (container,) = live["status"]["containerStatuses"]
    container = {**container, **changes}
    kit.kube.patch_status(
        "v1",
        "Pod",
        pod["metadata"]["namespace"],
        pod["metadata"]["name"],
        {"containerStatuses": [container]},
    )


def degraded(kit: Kit, namespace: str, name: str, status: str, reason: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        obj = kit.get_llmd(namespace, name)
        found = conds(obj).get("Degraded")
        if found is not None and (found["status"], found["reason"]) == (status, reason):
            return obj
        return None

    return wait_until(probe, timeout=30, interval=0.3, what=f"Degraded={status} {reason}")


def events_of(kit: Kit, namespace: str, name: str) -> list[tuple[str, str]]:
    return [
        (e["type"], e["reason"])
        for e in kit.kube.list("v1", "Event", namespace)
        if e["involvedObject"].get("name") == name
        and e["involvedObject"].get("kind") == "LLMDeployment"
    ]


def sanitized(obj: dict[str, Any]) -> dict[str, Any]:
    metadata = {
        k: v
        for k, v in obj["metadata"].items()
        if k not in ("managedFields", "uid", "resourceVersion")
    }
    return {**obj, "metadata": {**metadata, "namespace": "default"}}


def test_restart_and_image_pull_failure_degrade_while_ready_stays_honest(
    operator: OperatorProcess, kit: Kit, namespace: str
) -> None:
    kit.apply_llmd(namespace, "fleet", spec(replicas=2))
    ready = kit.wait_condition(namespace, "fleet", "Ready", "True", timeout=60)
    assert conds(ready)["Degraded"]["status"] == "False"
    first, second = engine_pods(kit, namespace, "fleet")

    # An OOM kill the kubelet restarted: the pod is Ready again, the fleet is Degraded.
    finished = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    set_container(
        kit,
        first,
        restartCount=3,
        lastState={
            "terminated": {
                "reason": "OOMKilled",
                "exitCode": 137,
                "startedAt": first["status"]["startTime"],
                "finishedAt": finished,
            }
        },
    )
    obj = degraded(kit, namespace, "fleet", "True", "ContainerRestarting")
    got = conds(obj)
    assert got["Ready"]["status"] == "True"
    assert got["Stalled"]["status"] == "False"
    message = got["Degraded"]["message"]
    assert first["metadata"]["name"] in message
    assert "restarted 3 times" in message
    assert "OOMKilled (code 137)" in message
    assert "spec.resources.memory" in message
    if CAPTURE:
        path = FIXTURES / "llmdeployment-degraded.json"
        path.write_text(json.dumps(sanitized(obj), indent=2, sort_keys=True) + "\n")

    # Another restart while already Degraded posts no second Event.
    set_container(kit, first, restartCount=4)
    wait_until(
        lambda: "4 times" in conds(kit.get_llmd(namespace, "fleet"))["Degraded"]["message"],
        timeout=30,
        what="the restart count in the message",
    )

    # An image pull failure on the other pod outranks the restart and names the image.
    image = second["status"]["containerStatuses"][0]["image"]
    set_container(
        kit,
        second,
        ready=False,
        started=False,
        state={"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}},
    )
    obj = degraded(kit, namespace, "fleet", "True", "ImagePullBackOff")
    assert image in conds(obj)["Degraded"]["message"]

    seen = events_of(kit, namespace, "fleet")
    assert seen.count(("Warning", "ContainerRestarting")) == 1
    assert ("Warning", "ImagePullBackOff") not in seen  # still Degraded: no new Event

    # Both recover (the restart long ago, the image pulled): Degraded clears with one Event.
    for pod in (first, second):
        set_container(
            kit,
            pod,
            ready=True,
            started=True,
            restartCount=4,
            state={"running": {"startedAt": pod["status"]["startTime"]}},
            lastState={
                "terminated": {
                    "reason": "OOMKilled",
                    "exitCode": 137,
                    "startedAt": "2020-01-01T00:00:00Z",
                    "finishedAt": "2020-01-01T00:00:01Z",
                }
            },
        )
    degraded(kit, namespace, "fleet", "False", "AsExpected")
    wait_until(
        lambda: ("Normal", "NoLongerDegraded") in events_of(kit, namespace, "fleet"),
        timeout=15,
        what="the NoLongerDegraded Event",
    )
