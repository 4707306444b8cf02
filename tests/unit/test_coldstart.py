"""The cold-start breakdown, from pod objects shaped like the ones the scheduler and kubelet
write (creation, PodScheduled, the container's running.startedAt, Ready) and agent phases."""

from __future__ import annotations

from typing import Any

from llmop.agents import AgentReading, parse_status
from llmop.api.v1alpha1 import ReplicaStartup
from llmop.coldstart import (
    MAX_REPLICAS,
    new_phase_seconds,
    replica_startup,
    startup_status,
)
from llmop.pods import pod_summary


def pod(
    name: str,
    *,
    created: str = "2026-11-23T10:00:00Z",
    scheduled: str | None = "2026-11-23T10:00:02Z",
    started: str | None = "2026-11-23T10:01:30Z",
    ready: str | None = "2026-11-23T10:04:00Z",
) -> dict[str, Any]:
    conditions: list[dict[str, Any]] = [
        {"type": "Initialized", "status": "True", "lastTransitionTime": created},
        {
            "type": "PodScheduled",
            "status": "True" if scheduled else "False",
            "lastTransitionTime": scheduled or created,
            **({} if scheduled else {"reason": "Unschedulable"}),
        },
        {
            "type": "Ready",
            "status": "True" if ready else "False",
            "lastTransitionTime": ready or started or created,
        },
    ]
    state: dict[str, Any] = (
        {"running": {"startedAt": started}}
        if started
        else {"waiting": {"reason": "ContainerCreating"}}
    )
    # Through pod_summary: the breakdown must work on what the watch cache keeps.
    return pod_summary(
        {
            "metadata": {"name": name, "namespace": "ns", "creationTimestamp": created},
            "spec": {"containers": [{"name": "engine"}]},
            "status": {
                "phase": "Running" if started else "Pending",
                "conditions": conditions,
                "containerStatuses": [
                    {"name": "engine", "ready": bool(ready), "restartCount": 0, "state": state}
                ],
            },
        }
    )


def test_a_ready_replica_shows_each_step() -> None:
    found = replica_startup(pod("x-1"))
    assert found is not None
    assert (found.phase, found.scheduled_after_seconds) == ("Ready", 2)
    assert (found.started_after_seconds, found.ready_after_seconds) == (90, 240)


def test_phases_of_a_replica_not_ready_yet() -> None:
    phases = [
        replica_startup(pod("a", scheduled=None, started=None, ready=None)),
        replica_startup(pod("b", started=None, ready=None)),
        replica_startup(pod("c", ready=None)),
        replica_startup(pod("d", ready=None), AgentReading("d", phase="downloading")),
        replica_startup(pod("e", ready=None), AgentReading("e", phase="loading")),
        replica_startup(
            pod("f", ready=None),
            known=ReplicaStartup(pod="f", phase="Loading", created="2026-11-23T10:00:00Z"),
        ),
    ]
    assert [p.phase if p else None for p in phases] == [
        "Scheduling",
        "PullingImage",
        "Starting",
        "Downloading",
        "Loading",
        "Loading",
    ]
    b = phases[1]
    assert b is not None
    assert (b.scheduled_after_seconds, b.started_after_seconds, b.ready_after_seconds) == (
        2,
        None,
        None,
    )


def test_download_bytes_while_the_engine_downloads_itself() -> None:
    status = {"phase": "downloading", "ready": False, "modelCacheBytes": 3 * 2**30 + 2**29}
    reading = parse_status("d", status)
    found = replica_startup(pod("d", ready=None), reading)
    assert found is not None
    assert (found.phase, found.downloaded_bytes) == ("Downloading", 3 * 2**30 + 2**29)
    summary = startup_status([pod("d", ready=None)], [reading])
    assert summary is not None
    assert summary.summary == "d Downloading 3.50 GiB"
    # A restarted operator has read no agent yet: the last status's bytes stand until it does.
    kept = replica_startup(pod("d", ready=None), known=found)
    assert kept is not None
    assert kept.downloaded_bytes == found.downloaded_bytes
    # Once loading (or ready) the figure is gone: the download is over.
    loading = replica_startup(pod("d", ready=None), AgentReading("d", phase="loading"), found)
    assert loading is not None
    assert loading.downloaded_bytes is None
    assert replica_startup(pod("d"), reading) == replica_startup(pod("d"))


def test_summary_names_the_oldest_replica_still_starting() -> None:
    status = startup_status(
        [
            pod("new", created="2026-11-23T10:05:00Z", ready=None),
            pod("old", created="2026-11-23T10:03:00Z", started=None, ready=None),
            pod("done"),
        ]
    )
    assert status is not None
    assert status.summary == "old PullingImage (+1 starting)"
    assert [r.pod for r in status.replicas] == ["new", "old", "done"]


def test_summary_when_all_are_ready_is_the_slowest_start() -> None:
    status = startup_status([pod("x-1"), pod("x-2", ready="2026-11-23T10:09:00Z")])
    assert status is not None
    assert status.summary == "all ready; slowest 540s (x-2)"


def test_breakdown_is_bounded_and_skips_pods_going_away() -> None:
    pods = [pod(f"x-{i:02d}") for i in range(MAX_REPLICAS + 5)]
    status = startup_status(pods)
    assert status is not None
    assert len(status.replicas) == MAX_REPLICAS
    leaving = pod("gone")
    leaving["metadata"]["deletionTimestamp"] = "2026-11-23T10:10:00Z"
    assert startup_status([leaving]) is None


def test_the_compile_cache_outcome_comes_from_the_agent_and_is_kept() -> None:
    report = {"phase": "loading", "compileCache": {"seed": "hit", "seedSeconds": 1.2}}
    reading = parse_status("x-1", report)
    assert reading.compile_cache == "hit"
    loading = replica_startup(pod("x-1", ready=None), reading)
    assert loading is not None
    assert loading.compile_cache == "hit"
    # A restarted operator has no reading yet: what the last status said stays.
    ready = replica_startup(pod("x-1"), None, loading)
    assert ready is not None
    assert ready.compile_cache == "hit"
    status = startup_status([pod("x-1")], [reading])
    assert status is not None
    assert status.summary == "all ready; slowest 240s (x-1, compile cache hit)"
    starting = startup_status([pod("x-2", ready=None)], [parse_status("x-2", report)])
    assert starting is not None
    assert starting.summary == "x-2 Loading, compile cache hit"


def test_an_unknown_compile_cache_report_is_no_outcome() -> None:
    for report in ({"seed": "warm"}, "hit", None, {"seed": 1}):
        assert parse_status("x", {"phase": "ready", "compileCache": report}).compile_cache is None
    plain = replica_startup(pod("x"), parse_status("x", {"phase": "ready"}))
    assert plain is not None
    assert plain.compile_cache is None


def test_the_engines_phases_come_from_the_agent_are_kept_and_named_in_the_summary() -> None:
    report = {
        "phase": "ready",
        "compileCache": {"seed": "miss"},
        "startup": {
            "phases": {
                "prepare": 0.4,
                "engineStart": 26.6,
                "weights": 1.1,
                "compile": 14.8,
                "warmup": 0.3,
                "apiStart": 1.4,
                "firstProbe": 1.1,
                "untraced": 0.0,
            },
            "totalSeconds": 45.7,
        },
    }
    reading = parse_status("x-1", report)
    found = replica_startup(pod("x-1"), reading)
    assert found is not None
    assert found.engine is not None
    assert (found.engine.engine_start_seconds, found.engine.compile_seconds) == (26.6, 14.8)
    assert found.engine.untraced_seconds == 0.0
    # A restarted operator has read no agent yet: the phases the last status had stay.
    kept = replica_startup(pod("x-1"), None, found)
    assert kept is not None
    assert kept.engine == found.engine
    status = startup_status([pod("x-1")], [reading])
    assert status is not None
    assert status.summary == (
        "all ready; slowest 240s (x-1, compile cache miss; engineStart 26.6s, compile 14.8s)"
    )
    assert (
        found.model_dump(by_alias=True, exclude_none=True)["engine"]["engineStartSeconds"] == 26.6
    )


def test_start_phases_an_agent_cannot_have_measured_are_dropped() -> None:
    for phases in (
        {"weights": -1},
        {"weights": "3"},
        {"weights": True},
        {"nope": 3},
        {"weights": float("nan")},
        {"weights": 1e12},
    ):
        reading = parse_status("x", {"phase": "ready", "startup": {"phases": phases}})
        assert reading.start_phases == {}, phases
        found = replica_startup(pod("x"), reading)
        assert found is not None
        assert found.engine is None
    for report in (None, "x", {"phases": [1]}):
        assert parse_status("x", {"phase": "ready", "startup": report}).start_phases is None


def test_each_start_is_counted_once_per_phase() -> None:
    report = {"phase": "ready", "startup": {"phases": {"weights": 5.0, "untraced": 0.2}}}
    loading = startup_status([pod("x-1", ready=None)])
    # The kubelet's Ready comes first; the agent is read a little later.
    ready = startup_status([pod("x-1")])
    read = startup_status([pod("x-1")], [parse_status("x-1", report)])
    assert new_phase_seconds(loading, ready) == [
        {"scheduling": 2, "containerStart": 88, "total": 240}  # pulled 10:00:02 → 10:01:30
    ]
    assert new_phase_seconds(ready, read) == [{"weights": 5.0, "untraced": 0.2}]
    # Both at once (a status written after the agent was read), and never again.
    assert new_phase_seconds(loading, read) == [
        {"scheduling": 2, "containerStart": 88, "total": 240, "weights": 5.0, "untraced": 0.2}
    ]
    assert new_phase_seconds(read, read) == []  # the next write, or a restarted operator's first
    assert len(new_phase_seconds(None, read)) == 1
    assert new_phase_seconds(read, None) == []
    # An agent still starting has no `untraced` yet: its phases wait for the whole start.
    partial = {"phase": "loading", "startup": {"phases": {"weights": 5.0}}}
    starting = startup_status([pod("x-2", ready=None)], [parse_status("x-2", partial)])
    assert new_phase_seconds(None, starting) == []
