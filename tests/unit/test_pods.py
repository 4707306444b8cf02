"""Pod problems, read from pod objects shaped like the real ones the kubelet and scheduler write."""

from __future__ import annotations

from typing import Any

import pytest

from llmop.pods import pod_issue, worst_issue


def _pod(
    name: str = "p-1",
    *,
    conditions: list[dict[str, Any]] | None = None,
    containers: list[dict[str, Any]] | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-23T08:00:00Z"
    return {
        "metadata": meta,
        "status": {"conditions": conditions or [], "containerStatuses": containers or []},
    }


UNSCHEDULABLE = {
    "type": "PodScheduled",
    "status": "False",
    "reason": "Unschedulable",
    "message": "0/5 nodes are available: 1 Insufficient nvidia.com/gpu, 4 node(s) had untolerated "
    "taint {kwok.x-k8s.io/node: fake}.",
}


def _waiting(
    reason: str, message: str = "", restarts: int = 0, last: dict[str, Any] | None = None
) -> dict[str, Any]:
    c: dict[str, Any] = {
        "name": "engine",
        "image": "localhost/nope:0",
        "ready": False,
        "restartCount": restarts,
        "state": {"waiting": {"reason": reason, "message": message}},
    }
    if last:
        c["lastState"] = {"terminated": last}
    return c


@pytest.mark.parametrize(
    ("pod", "reason", "words"),
    [
        (_pod(conditions=[UNSCHEDULABLE]), "Unschedulable", ["Insufficient nvidia.com/gpu", "p-1"]),
        (
            _pod(containers=[_waiting("ErrImagePull", "pull access denied")]),
            "ImagePullBackOff",
            ["localhost/nope:0", "ErrImagePull", "pull access denied"],
        ),
        (_pod(containers=[_waiting("ImagePullBackOff")]), "ImagePullBackOff", ["localhost/nope:0"]),
        (
            _pod(containers=[_waiting("ErrImageNeverPull")]),
            "ImagePullBackOff",
            ["ErrImageNeverPull"],
        ),
        (
            _pod(containers=[_waiting("CreateContainerConfigError", 'secret "hf" not found')]),
            "CreateContainerError",
            ['secret "hf" not found'],
        ),
        (
            _pod(
                containers=[
                    _waiting(
                        "CrashLoopBackOff",
                        restarts=4,
                        last={"reason": "OOMKilled", "exitCode": 137},
                    )
                ]
            ),
            "CrashLoopBackOff",
            ["4 restarts", "OOMKilled", "137"],
        ),
        (
            _pod(
                containers=[
                    {
                        "name": "engine",
                        "ready": False,
                        "restartCount": 1,
                        "state": {"running": {}},
                        "lastState": {"terminated": {"reason": "Error", "exitCode": 1}},
                    }
                ]
            ),
            "ContainerRestarting",
            ["restarted 1 times", "Error (code 1)"],
        ),
    ],
)
def test_pod_issue_names_the_cause(pod: dict[str, Any], reason: str, words: list[str]) -> None:
    issue = pod_issue(pod)
    assert issue is not None
    assert issue.reason == reason
    for word in words:
        assert word in issue.message, (word, issue.message)


@pytest.mark.parametrize(
    "pod",
    [
        _pod(),  # just created
        _pod(
            conditions=[{"type": "PodScheduled", "status": "True"}],
            containers=[
                {"name": "engine", "ready": True, "restartCount": 0, "state": {"running": {}}}
            ],
        ),
        # Restarted once but serving again: history, not a problem now.
        _pod(
            containers=[
                {"name": "engine", "ready": True, "restartCount": 1, "state": {"running": {}}}
            ]
        ),
        _pod(containers=[_waiting("ContainerCreating")]),
        _pod(conditions=[UNSCHEDULABLE], deleting=True),  # leaving on purpose
    ],
)
def test_healthy_or_starting_pods_have_no_issue(pod: dict[str, Any]) -> None:
    assert pod_issue(pod) is None


def test_worst_issue_prefers_the_most_explaining() -> None:
    crash = _pod("a", containers=[_waiting("CrashLoopBackOff", restarts=2)])
    pull = _pod("b", containers=[_waiting("ImagePullBackOff")])
    unsched = _pod("c", conditions=[UNSCHEDULABLE])
    issue = worst_issue([crash, pull, unsched])
    assert issue is not None
    assert (issue.reason, issue.pod) == ("Unschedulable", "c")
    assert worst_issue([crash, pull]).reason == "ImagePullBackOff"  # type: ignore[union-attr]
    assert worst_issue([]) is None


def test_status_names_the_pod_problem_while_not_ready() -> None:
    from llmop import conditions
    from llmop.pods import PodIssue
    from llmop.status import Rollout, observe_conditions

    waiting = Rollout(
        exists=True,
        desired=1,
        current_generation_observed=True,
        template_current=True,
        replicas=1,
        updated=1,
    )
    issue = PodIssue("ImagePullBackOff", "pod p-1 cannot pull image localhost/nope:0", "p-1")
    ready, reconciling, stalled, _ = observe_conditions(waiting, None, None, issue)
    assert (ready.status, ready.reason) == ("False", "ImagePullBackOff")
    assert "localhost/nope:0" in ready.message
    assert reconciling.status == "True"
    assert "localhost/nope:0" in reconciling.message
    assert stalled.status == "False"
    # Once every replica is ready, an old pod's history does not hold Ready back.
    done = Rollout(
        exists=True,
        desired=1,
        current_generation_observed=True,
        template_current=True,
        replicas=1,
        updated=1,
        ready=1,
        available=1,
    )
    ready, *_ = observe_conditions(done, None, None, issue)
    assert (ready.status, ready.reason) == ("True", conditions.REASON_ALL_REPLICAS_READY)
