"""The pure parts of reading LeaderWorkerSets back: a group is one replica in the status, worker
pods are never replicas (but their problems are named on their group), the plan deletes the
workload kind the spec stopped wanting only after applying the new one, and the group check's
bookkeeping (which parents' groups changed between two listings)."""

from __future__ import annotations

from typing import Any

import pytest

from llmop import kinds, names
from llmop.api.v1alpha1 import LLMDeployment
from llmop.desired import desired_state
from llmop.plan import Delete, plan_children
from llmop.pods import pod_issue, replica_pods, worst_issue
from llmop.reconcile.groups import changed, index, missing, multi_node
from llmop.settings import RenderSettings
from llmop.status import _progress as progress
from llmop.status import observe_rollout

PARENT = {
    "apiVersion": "serving.llmop.dev/v1alpha1",
    "kind": "LLMDeployment",
    "metadata": {"name": "big", "namespace": "team", "uid": "uid-1", "generation": 3},
}
ONE_POD = {"model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"}, "engine": {"backend": "simulator"}}
GROUPS = {**ONE_POD, "engine": {"backend": "simulator", "pipelineParallelSize": 2}, "replicas": 2}
OWNER = {
    "apiVersion": "serving.llmop.dev/v1alpha1",
    "kind": "LLMDeployment",
    "name": "big",
    "uid": "uid-1",
    "controller": True,
}


def desired(spec: dict[str, Any]) -> Any:
    return desired_state(LLMDeployment.model_validate({**PARENT, "spec": spec}), RenderSettings())


def lws(*, ready: int, replicas: int = 2, updated: int = 2, version: str = "7") -> dict[str, Any]:
    """A LeaderWorkerSet as v0.9.0 reports it (the fields test_lws_controller.py checks live)."""
    return {
        "apiVersion": kinds.LEADER_WORKER_SET.api_version,
        "kind": "LeaderWorkerSet",
        "metadata": {
            "name": "big",
            "namespace": "team",
            "generation": 2,
            "resourceVersion": version,
            "annotations": {names.ANNOTATION_TEMPLATE_HASH: "h"},
            "ownerReferences": [OWNER],
        },
        "spec": {"replicas": 2},
        "status": {
            "observedGeneration": 2,
            "replicas": replicas,
            "readyReplicas": ready,
            "updatedReplicas": updated,
            "hpaPodSelector": "leaderworkerset.sigs.k8s.io/name=big,"
            "leaderworkerset.sigs.k8s.io/worker-index=0",
        },
    }


@pytest.mark.parametrize(
    ("live", "summary", "done"),
    [
        (lws(ready=2), (2, 2, 2), True),
        (lws(ready=1), (2, 1, 2), False),  # a group whose worker is not ready is not ready
        (lws(ready=2, replicas=3, updated=2), (3, 2, 2), False),  # a group of the old template
    ],
    ids=["all-groups-ready", "one-group-not-ready", "rolling"],
)
def test_the_rollout_counts_groups(
    live: dict[str, Any], summary: tuple[int, int, int], done: bool
) -> None:
    spec = LLMDeployment.model_validate({**PARENT, "spec": GROUPS}).spec
    rollout = observe_rollout(live, spec, template_hash="h")
    assert (rollout.replicas, rollout.ready, rollout.updated) == summary
    # Ready's reason comes from the same reading as a Deployment's.
    assert (progress(rollout) is None) == done


def pod(name: str, *, worker: int | None, crash: bool = False) -> dict[str, Any]:
    labels = {names.LABEL_DEPLOYMENT: "big"}
    if worker is not None:
        labels |= {names.LABEL_LWS_WORKER_INDEX: str(worker), names.LABEL_LWS_GROUP_INDEX: "1"}
    container: dict[str, Any] = {"name": "engine", "ready": not crash, "restartCount": 0}
    if crash:
        container |= {
            "restartCount": 4,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"reason": "Error", "exitCode": 1}},
        }
    return {
        "metadata": {"name": name, "labels": labels},
        "status": {"containerStatuses": [container]},
    }


def test_worker_pods_are_not_replicas_but_their_crash_is_their_groups() -> None:
    pods = [
        pod("big-1", worker=0),
        pod("big-1-1", worker=1, crash=True),
        pod("one-pod", worker=None),
    ]
    assert [p["metadata"]["name"] for p in replica_pods(pods)] == ["big-1", "one-pod"]
    issue = worst_issue(pods)
    assert issue is not None
    assert issue.reason == "CrashLoopBackOff"
    assert issue.message.startswith("group 1: worker pod big-1-1 is crash-looping (4 restarts")
    plain = pod_issue(pod("one-pod", worker=None, crash=True))
    assert plain is not None
    assert plain.message.startswith("pod one-pod is crash-looping")


def steps(plan: Any) -> list[tuple[str, str]]:
    return [("delete" if isinstance(s, Delete) else "apply", s.kind_name) for s in plan.steps()]


def test_switching_pipeline_parallel_size_deletes_the_old_kind_last() -> None:
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "big"}}
    up = plan_children(desired(GROUPS), {kinds.DEPLOYMENT: deployment}, parent=PARENT)
    assert steps(up)[-1] == ("delete", "Deployment")
    assert ("apply", "LeaderWorkerSet") in steps(up)[:-1]
    assert up.reasons[-1] == "Deployment: delete (replaced by the LeaderWorkerSet)"

    down = plan_children(desired(ONE_POD), {kinds.LEADER_WORKER_SET: lws(ready=2)}, parent=PARENT)
    assert steps(down)[-1] == ("delete", "LeaderWorkerSet")
    assert ("apply", "Deployment") in steps(down)[:-1]

    # Neither a child event's plan nor a kind whose API is not served deletes a workload.
    only = plan_children(
        desired(ONE_POD),
        {kinds.LEADER_WORKER_SET: lws(ready=2)},
        parent=PARENT,
        only=kinds.DEPLOYMENT,
    )
    assert ("delete", "LeaderWorkerSet") not in steps(only)
    unserved = plan_children(
        desired(ONE_POD),
        {kinds.LEADER_WORKER_SET: lws(ready=2)},
        parent=PARENT,
        unserved=(kinds.LEADER_WORKER_SET,),
    )
    assert ("delete", "LeaderWorkerSet") not in steps(unserved)
    # Nothing to retire when only the wanted kind exists.
    steady = plan_children(desired(GROUPS), {kinds.LEADER_WORKER_SET: lws(ready=2)}, parent=PARENT)
    assert not steady.retires


def test_rbac_verbs_of_the_workload_kinds() -> None:
    assert kinds.LEADER_WORKER_SET.verbs() == {"list", "create", "patch", "delete"}
    assert kinds.DEPLOYMENT.verbs() == {"get", "list", "watch", "create", "patch", "delete"}


def test_group_listing_bookkeeping() -> None:
    stranger = {**lws(ready=0), "metadata": {**lws(ready=0)["metadata"], "ownerReferences": []}}
    first = index([lws(ready=1, version="7"), stranger])
    assert list(first) == [("team", "big")]
    (summary,) = first["team", "big"]
    assert summary["status"]["readyReplicas"] == 1  # the status is kept for the derivation
    assert changed({}, first) == [("team", "big")]
    assert changed(first, index([lws(ready=1, version="7")])) == []
    assert changed(first, index([lws(ready=2, version="8")])) == [("team", "big")]
    assert changed(first, {}) == [("team", "big")]
    assert multi_node({"spec": GROUPS})
    assert not multi_node({"spec": ONE_POD})
    problem = missing()
    assert problem.reason == "LeaderWorkerSetMissing"
    assert "lws/releases/download/v0.9.0/manifests.yaml" in problem.message
