"""LeaderWorkerSet group recreates: counting them from the engine pods' watch events (a leader
pod with the group's name but a new uid), pruning them to the window, judging them
(`GroupRestarting`, `GroupRestartLoop`) and ranking that among the pods' own issues; the
operator's memory of them (`reconcile.groups.note_pod`, fed by the pod handler before its quiet
check); and `status.groupSummary`, the `-o wide` Groups column."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any, cast

import kopf
import pytest

from llmop import conditions, handlers, kinds, names, reconcile
from llmop.api.v1alpha1 import LLMDeployment, LLMDeploymentStatus
from llmop.config import OperatorConfig
from llmop.group_restarts import (
    EARLIER_LEADERS,
    LOOP_THRESHOLD,
    UNKNOWN_EXIT,
    WINDOW,
    GroupHistory,
    Recreate,
    group_issue,
    latest_exit,
    observe,
    prune,
)
from llmop.metrics import Metrics
from llmop.pods import (
    REASON_CRASH_LOOP,
    REASON_GROUP_RESTART_LOOP,
    REASON_GROUP_RESTARTING,
    REASON_RESTARTING,
    REASON_UNSCHEDULABLE,
    PodIssue,
    pod_summary,
    worst_of,
)
from llmop.reconcile import quiet as quiet_module
from llmop.reconcile.groups import note_pod, restarts_of
from llmop.status import Observed, derive_status

NOW = datetime(2026, 11, 27, 12, 0, 0, tzinfo=UTC)
REVISION = "rev-a"


def stamp(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def lws_pod(
    group: int,
    worker: int = 0,
    *,
    uid: str = "u1",
    revision: str = REVISION,
    ready: bool = True,
    last: dict[str, Any] | None = None,
    terminated: dict[str, Any] | None = None,
    dying: bool = False,
    parent: str = "big",
) -> dict[str, Any]:
    """A LeaderWorkerSet pod as the pod watch cache keeps it (`pod_summary` of a kubelet-shaped
    pod): leader `<parent>-<group>`, workers `<parent>-<group>-<worker>`."""
    name = f"{parent}-{group}" + (f"-{worker}" if worker else "")
    container: dict[str, Any] = {"name": "engine", "ready": ready, "restartCount": 0}
    container["state"] = {"terminated": terminated} if terminated else {"running": {}}
    if last is not None:
        container |= {"lastState": {"terminated": last}, "restartCount": 1}
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": "ns",
        "uid": f"{name}-{uid}",
        "labels": {
            names.LABEL_DEPLOYMENT: parent,
            names.LABEL_LWS_GROUP_INDEX: str(group),
            names.LABEL_LWS_WORKER_INDEX: str(worker),
            names.LABEL_LWS_TEMPLATE_HASH: revision,
        },
        "managedFields": [{"manager": "kubelet"}],  # dropped by the summary
    }
    if dying:
        metadata["deletionTimestamp"] = stamp(NOW)
    return pod_summary(
        {
            "metadata": metadata,
            "spec": {"containers": [{"name": "engine"}]},
            "status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                "containerStatuses": [container],
            },
        }
    )


def error(code: int = 1, reason: str = "Error", at: datetime = NOW) -> dict[str, Any]:
    return {"reason": reason, "exitCode": code, "finishedAt": stamp(at)}


def seen(*pods: dict[str, Any], at: datetime = NOW) -> GroupHistory | None:
    """The history of one group after `pods` were seen in turn."""
    history: GroupHistory | None = None
    for pod in pods:
        history = observe(history, pod, at)
    return history


def recreated(times: int, *, last_exit: str = UNKNOWN_EXIT, ago: timedelta = timedelta()) -> Any:
    """A group history with `times` recreates, the latest `ago` before NOW, one minute apart."""
    recreates = tuple(
        Recreate(NOW - ago - timedelta(minutes=times - 1 - i), last_exit) for i in range(times)
    )
    return GroupHistory("leader-uid", REVISION, recreates)


# ----------------------------------------------------------------------------------------------
# Counting recreates from pod events


def test_the_pod_summary_keeps_the_uid_that_gives_a_recreate_away() -> None:
    pod = lws_pod(0)
    assert pod["metadata"]["uid"] == "big-0-u1"
    assert "managedFields" not in pod["metadata"]


@pytest.mark.parametrize(
    ("events", "recreates", "last_exit"),
    [
        # The first leader seen is the baseline: this process may have started after it.
        ([lws_pod(0)], 0, None),
        ([lws_pod(0), lws_pod(0, 1), lws_pod(0)], 0, None),
        # A new leader uid, same revision: one recreate, its cause unknown when no exit was seen.
        ([lws_pod(0), lws_pod(0, uid="u2")], 1, UNKNOWN_EXIT),
        ([lws_pod(0), lws_pod(0, uid="u2"), lws_pod(0, uid="u3")], 2, UNKNOWN_EXIT),
        # The worker's crash before the recreate is its cause.
        (
            [lws_pod(0), lws_pod(0, 1, last=error(1)), lws_pod(0, uid="u2")],
            1,
            "Error (exit code 1) in container engine of pod big-0-1",
        ),
        # A container stopped on a pod being deleted is the recreate's effect (SIGTERM): not it.
        (
            [
                lws_pod(0),
                lws_pod(0, 1, last=error(137, "OOMKilled", NOW - timedelta(seconds=5))),
                lws_pod(0, 1, dying=True, terminated=error(143)),
                lws_pod(0, uid="u2"),
            ],
            1,
            "OOMKilled (exit code 137) in container engine of pod big-0-1",
        ),
        # The newest exit wins, whichever pod it was on.
        (
            [
                lws_pod(0),
                lws_pod(0, 1, last=error(2, at=NOW - timedelta(seconds=1))),
                lws_pod(0, last=error(3, at=NOW - timedelta(seconds=9))),
                lws_pod(0, uid="u2"),
            ],
            1,
            "Error (exit code 2) in container engine of pod big-0-1",
        ),
        # A new template revision is a rollout replacing the group: not a recreate.
        ([lws_pod(0), lws_pod(0, uid="u2", revision="rev-b")], 0, None),
        # A dying leader is no new leader.
        ([lws_pod(0), lws_pod(0, uid="u2", dying=True)], 0, None),
        # kopf runs each pod's events in a worker of its own: the old leader's last live event
        # handled after its successor's first is stale, not a third leader (seen in CI: a
        # group deleted 3 times was reported recreated 4 times).
        ([lws_pod(0), lws_pod(0, uid="u2"), lws_pod(0), lws_pod(0, uid="u2")], 1, UNKNOWN_EXIT),
        (
            [lws_pod(0), lws_pod(0, uid="u2"), lws_pod(0), lws_pod(0, uid="u3")],
            2,
            UNKNOWN_EXIT,
        ),
    ],
    ids=[
        "baseline",
        "same-leader",
        "one-recreate",
        "two-recreates",
        "worker-crash-is-the-cause",
        "sigterm-of-the-recreate-ignored",
        "newest-exit",
        "rollout-not-counted",
        "dying-leader",
        "stale-old-leader",
        "stale-old-leader-then-next",
    ],
)
def test_recreates_are_counted_from_new_leader_uids(
    events: list[dict[str, Any]], recreates: int, last_exit: str | None
) -> None:
    history = seen(*events)
    assert history is not None
    assert len(history.recreates) == recreates
    assert (history.recreates[-1].last_exit if recreates else None) == last_exit
    assert all(r.at == NOW for r in history.recreates)


def test_a_long_loop_remembers_only_the_last_replaced_leaders() -> None:
    events = [lws_pod(0, uid=f"u{i}") for i in range(20)]
    history = seen(*events)
    assert history is not None
    assert len(history.recreates) == 19
    assert history.earlier_leaders == tuple(f"big-0-u{i}" for i in range(19 - EARLIER_LEADERS, 19))
    assert observe(history, lws_pod(0, uid="u18"), NOW) == history


def test_a_worker_seen_before_any_leader_starts_no_history() -> None:
    assert seen(lws_pod(0, 1, last=error())) is None


def test_after_a_recreate_the_old_groups_exit_is_not_carried_into_the_next() -> None:
    history = seen(
        lws_pod(0), lws_pod(0, 1, last=error(1)), lws_pod(0, uid="u2"), lws_pod(0, uid="u3")
    )
    assert history is not None
    assert [r.last_exit for r in history.recreates] == [
        "Error (exit code 1) in container engine of pod big-0-1",
        UNKNOWN_EXIT,
    ]


def test_latest_exit_reads_last_state_and_state() -> None:
    running = lws_pod(0)
    assert latest_exit(running) is None
    stopped = latest_exit(lws_pod(0, terminated=error(9)))
    assert stopped is not None
    assert stopped.text == "Error (exit code 9) in container engine of pod big-0"


@pytest.mark.parametrize(
    ("age", "kept"),
    [(timedelta(), 1), (WINDOW, 1), (WINDOW + timedelta(seconds=1), 0)],
    ids=["now", "at-the-window", "older"],
)
def test_recreates_are_pruned_to_the_window(age: timedelta, kept: int) -> None:
    history = GroupHistory("u", REVISION, (Recreate(NOW - age, UNKNOWN_EXIT),))
    assert len(prune(history, NOW).recreates) == kept


# ----------------------------------------------------------------------------------------------
# Judging them


def group(index: int, *, ready: tuple[bool, ...] = (True, True)) -> list[dict[str, Any]]:
    """The pods of one group of `len(ready)` pods (leader first)."""
    return [lws_pod(index, worker, ready=r) for worker, r in enumerate(ready)]


@pytest.mark.parametrize(
    ("histories", "pods", "reason", "words"),
    [
        ({}, group(0, ready=(False, False)), None, []),
        ({0: GroupHistory("u", REVISION)}, group(0, ready=(False, False)), None, []),
        # Recreated and not ready again (a pod not Ready, or one still missing).
        (
            {0: recreated(1)},
            group(0, ready=(True, False)),
            REASON_GROUP_RESTARTING,
            ["group 0 was recreated once within 10 minutes", "not ready yet (1/2 pods ready)"],
        ),
        (
            {0: recreated(2, last_exit="Error (exit code 1) in container engine of pod big-0-1")},
            group(0)[:1],
            REASON_GROUP_RESTARTING,
            ["group 0 was recreated 2 times", "(1/2 pods ready)", "pod big-0-1"],
        ),
        # Ready again: nothing to say below the loop threshold.
        ({0: recreated(2)}, group(0), None, []),
        # The loop, ready or not: the next failure recreates it again.
        (
            {0: recreated(LOOP_THRESHOLD, last_exit="OOMKilled (exit code 137) in container x")},
            group(0),
            REASON_GROUP_RESTART_LOOP,
            [
                "group 0 was recreated 3 times within 10 minutes",
                "restart loop",
                "last exit before the latest recreate: OOMKilled (exit code 137)",
            ],
        ),
        (
            {0: recreated(4)},
            group(0, ready=(False, False)),
            REASON_GROUP_RESTART_LOOP,
            ["recreated 4 times", f"latest recreate: {UNKNOWN_EXIT}"],
        ),
        # Recreates older than the window do not count: no loop, and ready, so nothing.
        ({0: recreated(3, ago=WINDOW)}, group(0), None, []),
        # The group recreated most often is named; on a tie, the lowest index.
        (
            {0: recreated(3), 1: recreated(5)},
            group(0) + group(1),
            REASON_GROUP_RESTART_LOOP,
            ["group 1 was recreated 5 times"],
        ),
        (
            {2: recreated(3), 1: recreated(3)},
            group(1) + group(2),
            REASON_GROUP_RESTART_LOOP,
            ["group 1 was recreated 3 times"],
        ),
        # A loop anywhere outranks another group merely restarting.
        (
            {0: recreated(1), 1: recreated(3)},
            group(0, ready=(False, False)) + group(1),
            REASON_GROUP_RESTART_LOOP,
            ["group 1 "],
        ),
    ],
    ids=[
        "no-history",
        "baseline-only",
        "restarting-pod-not-ready",
        "restarting-pod-missing",
        "recreated-and-ready",
        "loop-while-ready",
        "loop-while-not-ready",
        "old-recreates-pruned",
        "most-recreates-named",
        "tie-lowest-index",
        "loop-beats-restarting",
    ],
)
def test_group_issue(
    histories: dict[int, GroupHistory],
    pods: list[dict[str, Any]],
    reason: str | None,
    words: list[str],
) -> None:
    issue = group_issue(histories, pods, size=2, now=NOW)
    assert (issue.reason if issue else None) == reason
    for word in words:
        assert issue is not None
        assert word in issue.message


def test_pods_being_deleted_are_not_the_new_group() -> None:
    old = [lws_pod(0, ready=True, dying=True), lws_pod(0, 1, ready=True, dying=True)]
    issue = group_issue({0: recreated(1)}, old, size=2, now=NOW)
    assert issue is not None
    assert "(0/2 pods ready)" in issue.message


@pytest.mark.parametrize(
    ("other", "winner"),
    [
        (REASON_UNSCHEDULABLE, REASON_GROUP_RESTART_LOOP),
        (REASON_CRASH_LOOP, REASON_GROUP_RESTART_LOOP),
        (REASON_RESTARTING, REASON_GROUP_RESTART_LOOP),
    ],
)
def test_a_loop_beats_every_pod_issue(other: str, winner: str) -> None:
    loop = PodIssue(REASON_GROUP_RESTART_LOOP, "loop", "group 3")
    found = worst_of([PodIssue(other, "pod", "a-pod"), loop])
    assert found is not None
    assert found.reason == winner


@pytest.mark.parametrize(
    ("other", "winner"),
    [
        (REASON_UNSCHEDULABLE, REASON_UNSCHEDULABLE),
        (REASON_CRASH_LOOP, REASON_CRASH_LOOP),
        (REASON_RESTARTING, REASON_GROUP_RESTARTING),
    ],
)
def test_a_group_restarting_ranks_below_what_stops_its_pods(other: str, winner: str) -> None:
    """A pod that cannot be placed or keeps crashing explains why a recreated group is not
    ready; one container's restart explains less than its group's recreate."""
    restarting = PodIssue(REASON_GROUP_RESTARTING, "restarting", "group 0")
    found = worst_of([PodIssue(other, "pod", "a-pod"), restarting])
    assert found is not None
    assert found.reason == winner


# ----------------------------------------------------------------------------------------------
# In the status: Degraded and Ready name them; groupSummary for -o wide


def llmd(pipeline: int = 2) -> LLMDeployment:
    return LLMDeployment.model_validate(
        {
            "metadata": {"name": "big", "namespace": "ns", "uid": "u", "generation": 1},
            "spec": {
                "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
                "engine": {"backend": "simulator", "pipelineParallelSize": pipeline},
                "replicas": 2,
            },
        }
    )


def lws(ready: int) -> dict[str, Any]:
    return {
        "kind": "LeaderWorkerSet",
        "metadata": {"generation": 1},
        "spec": {"replicas": 2},
        "status": {
            "observedGeneration": 1,
            "replicas": 2,
            "readyReplicas": ready,
            "updatedReplicas": 2,
        },
    }


def derive(
    histories: dict[int, GroupHistory], pods: list[dict[str, Any]], *, ready: int, pipeline: int = 2
) -> LLMDeploymentStatus:
    spec = llmd(pipeline).spec
    workload = kinds.LEADER_WORKER_SET if pipeline > 1 else kinds.DEPLOYMENT
    observed = Observed(
        "big",
        "ns",
        generation=1,
        children={workload: lws(ready)},
        pods=pods,
        group_restarts=histories,
    )
    return derive_status(observed, spec, None, template_hash=None, now=NOW)


def condition(status: LLMDeploymentStatus, type_: str) -> tuple[str, str, str]:
    found = conditions.find(status.conditions, type_)
    assert found is not None
    return found.status, found.reason, found.message


def test_a_recreated_group_degrades_and_names_why_ready_is_false() -> None:
    status = derive({0: recreated(1)}, group(0, ready=(False, True)) + group(1), ready=1)
    degraded, reason, message = condition(status, conditions.DEGRADED)
    assert (degraded, reason) == ("True", REASON_GROUP_RESTARTING)
    assert message.startswith("group 0 was recreated once")
    ready, ready_reason, ready_message = condition(status, conditions.READY)
    assert (ready, ready_reason) == ("False", REASON_GROUP_RESTARTING)
    assert ready_message.startswith("1/2 replicas ready. GroupRestarting: group 0")
    assert status.group_summary == "1/2 (2 pods each)"


def test_the_loop_stays_degraded_while_ready() -> None:
    status = derive({1: recreated(3)}, group(0) + group(1), ready=2)
    assert condition(status, conditions.READY)[:2] == ("True", "AllReplicasReady")
    degraded, reason, message = condition(status, conditions.DEGRADED)
    assert (degraded, reason) == ("True", REASON_GROUP_RESTART_LOOP)
    assert "group 1 was recreated 3 times within 10 minutes" in message
    assert status.group_summary == "2/2 (2 pods each)"


def test_a_loop_outranks_an_unschedulable_pod_in_degraded() -> None:
    pending = lws_pod(0, 1, ready=False)
    pending["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1"}
    ]
    status = derive({0: recreated(3)}, [lws_pod(0), pending, *group(1)], ready=1)
    assert condition(status, conditions.DEGRADED)[1] == REASON_GROUP_RESTART_LOOP


def test_one_pod_replicas_have_no_group_summary() -> None:
    status = derive({}, [], ready=2, pipeline=1)
    assert status.group_summary is None
    assert condition(status, conditions.DEGRADED)[:2] == ("False", "AsExpected")


# ----------------------------------------------------------------------------------------------
# The operator's memory: fed by every pod event, per parent uid, forgotten with the parent


def parent_body(uid: str = "uid-1", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "serving.llmop.dev/v1alpha1",
        "kind": "LLMDeployment",
        "metadata": {"name": "big", "namespace": "ns", "uid": uid, "generation": 1},
        "spec": {
            "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
            "engine": {"backend": "simulator", "pipelineParallelSize": 2},
            "replicas": 2,
            **spec,
        },
    }


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def ctx(clock: Clock) -> reconcile.Context:
    context = reconcile.Context(
        kube=cast(Any, None),  # the memory makes no request
        config=OperatorConfig(),
        metrics=Metrics(),
        instance="test",
        clock=clock,
    )
    context.parents = {("ns", "big"): [parent_body()]}
    return context


def history(ctx: reconcile.Context, index: int = 0, uid: str = "uid-1") -> GroupHistory:
    return restarts_of(ctx, "ns", "big", uid)[index]


def test_the_memory_counts_recreates_at_the_clock_and_prunes_them(
    ctx: reconcile.Context, clock: Clock
) -> None:
    note_pod(ctx, None, lws_pod(0))  # the initial listing: the baseline
    note_pod(ctx, "MODIFIED", lws_pod(0, 1, last=error(1)))
    note_pod(ctx, "DELETED", lws_pod(0, dying=True))
    assert history(ctx).recreates == ()
    clock.now = NOW + timedelta(seconds=30)
    note_pod(ctx, "ADDED", lws_pod(0, uid="u2"))
    (first,) = history(ctx).recreates
    assert first.at == clock.now
    assert first.last_exit == "Error (exit code 1) in container engine of pod big-0-1"
    # Group 1 and other parents are apart.
    note_pod(ctx, None, lws_pod(1))
    assert history(ctx, 1).recreates == ()
    note_pod(ctx, "ADDED", lws_pod(0, parent="other", uid="u9"))  # no such parent cached
    assert restarts_of(ctx, "ns", "other", "uid-1") == {}
    # Past the window, the next event prunes it.
    clock.now = NOW + WINDOW + timedelta(minutes=1)
    note_pod(ctx, "MODIFIED", lws_pod(0, uid="u2"))
    assert history(ctx).recreates == ()


def test_the_memory_belongs_to_one_parent_uid_and_goes_with_the_parent(
    ctx: reconcile.Context,
) -> None:
    note_pod(ctx, None, lws_pod(0))
    note_pod(ctx, "ADDED", lws_pod(0, uid="u2"))
    assert len(history(ctx).recreates) == 1
    assert restarts_of(ctx, "ns", "big", "uid-other") == {}
    # A parent recreated under the same name starts afresh.
    ctx.parents = {("ns", "big"): [parent_body("uid-2")]}
    note_pod(ctx, None, lws_pod(0, uid="u3"))
    assert history(ctx, uid="uid-2").recreates == ()
    ctx.forget("ns", "big")
    assert restarts_of(ctx, "ns", "big", "uid-2") == {}


def test_a_group_scaled_away_is_forgotten_so_scaling_up_again_is_no_recreate(
    ctx: reconcile.Context,
) -> None:
    note_pod(ctx, None, lws_pod(0))
    note_pod(ctx, None, lws_pod(1))
    ctx.parents = {("ns", "big"): [parent_body(replicas=1)]}
    note_pod(ctx, "DELETED", lws_pod(1, dying=True))
    assert 1 not in restarts_of(ctx, "ns", "big", "uid-1")
    ctx.parents = {("ns", "big"): [parent_body(replicas=2)]}
    note_pod(ctx, "ADDED", lws_pod(1, uid="u2"))
    assert history(ctx, 1).recreates == ()
    # A deleted leader of a group still wanted is a recreate under way: kept.
    note_pod(ctx, "DELETED", lws_pod(0, dying=True))
    note_pod(ctx, "ADDED", lws_pod(0, uid="u2"))
    assert len(history(ctx).recreates) == 1


def test_an_autoscaled_parent_reads_the_wanted_groups_from_the_listed_lws(
    ctx: reconcile.Context,
) -> None:
    ctx.parents = {("ns", "big"): [parent_body(autoscaling={"minReplicas": 1, "maxReplicas": 4})]}
    owner = {
        "apiVersion": "serving.llmop.dev/v1alpha1",
        "kind": "LLMDeployment",
        "name": "big",
        "uid": "uid-1",
        "controller": True,
    }
    ctx.groups = {
        ("ns", "big"): [
            {
                "kind": "LeaderWorkerSet",
                "metadata": {"ownerReferences": [owner]},
                "spec": {"replicas": 3},
            }
        ]
    }
    for index in (0, 1, 2):
        note_pod(ctx, None, lws_pod(index))
    note_pod(ctx, "DELETED", lws_pod(2, dying=True))  # still wanted (3 groups): kept
    assert 2 in restarts_of(ctx, "ns", "big", "uid-1")
    ctx.groups = {
        ("ns", "big"): [
            {
                "kind": "LeaderWorkerSet",
                "metadata": {"ownerReferences": [owner]},
                "spec": {"replicas": 2},
            }
        ]
    }
    note_pod(ctx, "DELETED", lws_pod(2, dying=True))  # the HPA scaled it away
    assert 2 not in restarts_of(ctx, "ns", "big", "uid-1")


def test_the_pod_handler_feeds_the_memory_even_for_quiet_events(
    ctx: reconcile.Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recreate is in the new leader's event only: the handler records every event before
    it decides the event is quiet, or coalesces it with later ones."""
    monkeypatch.setattr(quiet_module, "quiet", lambda *_: True)
    ctx.children = {"cached": {}}  # type: ignore[dict-item]  # handed over already
    memo = SimpleNamespace(context=ctx)

    async def deliver(type_: str | None, pod: dict[str, Any]) -> None:
        await handlers.pod_event(
            type=cast(str, type_),
            body=kopf.Body(cast(Any, pod)),
            namespace="ns",
            memo=memo,
            logger=logging.getLogger("t"),
        )

    asyncio.run(deliver(None, lws_pod(0)))
    asyncio.run(deliver("ADDED", lws_pod(0, uid="u2")))
    assert len(history(ctx).recreates) == 1


def test_a_loop_found_while_already_degraded_posts_its_own_warning() -> None:
    from datetime import UTC, datetime

    from llmop import events
    from llmop.api.v1alpha1 import Condition

    def degraded(reason: str) -> list[Condition]:
        stamp = datetime(2026, 11, 27, tzinfo=UTC).isoformat()
        return [
            Condition(type="Degraded", status="True", reason=reason, last_transition_time=stamp)
        ]

    got = events.transition_events(degraded("GroupRestarting"), degraded("GroupRestartLoop"))
    assert [(e.type, e.reason) for e in got] == [("Warning", "GroupRestartLoop")]
    assert (
        events.transition_events(degraded("GroupRestartLoop"), degraded("GroupRestartLoop")) == []
    )
