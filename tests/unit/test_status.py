"""Status derivation: kstatus semantics of Ready/Reconciling/Stalled/CapacityPlanned."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from llmop import kinds
from llmop import status as status_mod
from llmop.api.v1alpha1 import LLMDeployment, LLMDeploymentStatus
from llmop.sizing import plan_for
from llmop.status import Observed, Problem, derive_invalid_status, derive_status, status_patch

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
HASH = "abc123"


def ld(**spec: Any) -> LLMDeployment:
    body = {
        "metadata": {"name": "x", "namespace": "ns", "uid": "u", "generation": 4},
        "spec": {
            "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
            "engine": {"backend": "simulator"},
            "resources": {"gpus": 1, "gpuProduct": "NVIDIA-H100-80GB-HBM3"},
            **spec,
        },
    }
    return LLMDeployment.model_validate(body)


def deployment(
    *,
    replicas: int | None = 2,
    generation: int = 7,
    observed: int = 7,
    status: dict[str, Any] | None = None,
    template_hash: str = HASH,
) -> dict[str, Any]:
    spec: dict[str, Any] = {} if replicas is None else {"replicas": replicas}
    return {
        "metadata": {
            "generation": generation,
            "annotations": {"serving.llmop.dev/template-hash": template_hash},
        },
        "spec": spec,
        "status": {"observedGeneration": observed, **(status or {})},
    }


ROLLED_OUT = {"replicas": 2, "readyReplicas": 2, "updatedReplicas": 2, "availableReplicas": 2}


def derive(
    resource: LLMDeployment,
    dep: dict[str, Any] | None,
    *,
    problem: Problem | None = None,
    previous: LLMDeploymentStatus | None = None,
) -> LLMDeploymentStatus:
    observed = Observed(
        resource.metadata.name,
        "ns",
        generation=resource.metadata.generation,
        previous=previous or LLMDeploymentStatus(),
        children={kinds.DEPLOYMENT: dep},
        problem=problem,
    )
    return derive_status(
        observed, resource.spec, plan_for(resource.spec), template_hash=HASH, now=NOW
    )


def conds(status: LLMDeploymentStatus) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in status.conditions}


CASES = [
    pytest.param(
        {"replicas": 2},
        None,
        {"Ready": ("False", "Creating"), "Reconciling": ("True", "Creating")},
        id="no-deployment-yet",
    ),
    pytest.param(
        {"replicas": 2},
        deployment(status=ROLLED_OUT),
        {"Ready": ("True", "AllReplicasReady"), "Reconciling": ("False", "AsExpected")},
        id="rolled-out",
    ),
    pytest.param(
        {"replicas": 2},
        deployment(generation=8, observed=7, status=ROLLED_OUT),
        {"Ready": ("False", "RollingOut"), "Reconciling": ("True", "RollingOut")},
        id="deployment-controller-has-not-seen-new-generation",
    ),
    pytest.param(
        {"replicas": 2},
        deployment(status=ROLLED_OUT, template_hash="old"),
        {"Ready": ("False", "RollingOut"), "Reconciling": ("True", "RollingOut")},
        id="live-template-is-stale",
    ),
    pytest.param(
        {"replicas": 2},
        deployment(
            status={"replicas": 3, "readyReplicas": 2, "updatedReplicas": 1, "availableReplicas": 2}
        ),
        {"Ready": ("False", "RollingOut"), "Reconciling": ("True", "RollingOut")},
        id="old-replicas-remaining",
    ),
    pytest.param(
        {"replicas": 2},
        deployment(
            status={"replicas": 2, "readyReplicas": 1, "updatedReplicas": 2, "availableReplicas": 1}
        ),
        {"Ready": ("False", "WaitingForReplicas"), "Reconciling": ("True", "WaitingForReplicas")},
        id="waiting-for-ready",
    ),
    pytest.param(
        {"replicas": 2},
        deployment(
            status={"replicas": 2, "readyReplicas": 2, "updatedReplicas": 2, "availableReplicas": 1}
        ),
        {"Ready": ("False", "WaitingForReplicas"), "Reconciling": ("True", "WaitingForReplicas")},
        id="ready-but-not-yet-available",
    ),
    pytest.param(
        {"replicas": 3},
        deployment(replicas=3, status=ROLLED_OUT),
        {"Ready": ("False", "Scaling"), "Reconciling": ("True", "Scaling")},
        id="scaling-up",
    ),
    pytest.param(
        {"replicas": 0},
        deployment(replicas=0, status={}),
        {"Ready": ("True", "ScaledToZero"), "Reconciling": ("False", "AsExpected")},
        id="scaled-to-zero",
    ),
    pytest.param(
        {"autoscaling": {"maxReplicas": 5}},
        deployment(
            replicas=3,
            status={
                "replicas": 3,
                "readyReplicas": 3,
                "updatedReplicas": 3,
                "availableReplicas": 3,
            },
        ),
        {"Ready": ("True", "AllReplicasReady")},
        id="autoscaled-count-comes-from-the-deployment",
    ),
    pytest.param(
        {"replicas": 2},
        deployment(
            status={
                **ROLLED_OUT,
                "readyReplicas": 1,
                "conditions": [
                    {
                        "type": "Progressing",
                        "status": "False",
                        "reason": "ProgressDeadlineExceeded",
                        "message": "ReplicaSet x has timed out progressing.",
                    }
                ],
            }
        ),
        {
            "Ready": ("False", "ProgressDeadlineExceeded"),
            "Reconciling": ("False", "Stalled"),
            "Stalled": ("True", "ProgressDeadlineExceeded"),
        },
        id="progress-deadline-exceeded-is-stalled",
    ),
]


@pytest.mark.parametrize(("spec", "dep", "expected"), CASES)
def test_condition_matrix(
    spec: dict[str, Any], dep: dict[str, Any] | None, expected: dict[str, tuple[str, str]]
) -> None:
    got = conds(derive(ld(**spec), dep))
    assert {k: got[k] for k in expected} == expected
    assert list(got) == ["Ready", "Reconciling", "Stalled", "CapacityPlanned", "Degraded"]
    if "Stalled" not in expected:
        assert got["Stalled"] == ("False", "AsExpected")


def test_ready_status_fields() -> None:
    status = derive(ld(replicas=2), deployment(status=ROLLED_OUT))
    assert status.observed_generation == 4
    assert (status.replicas, status.ready_replicas, status.updated_replicas) == (2, 2, 2)
    assert status.replica_summary == "2/2"
    assert status.endpoint == "http://x.ns.svc:8000/v1"
    assert status.selector is not None
    assert "app.kubernetes.io/instance=x" in status.selector
    assert status.plan is not None
    assert status.plan.fits is True
    assert conds(status)["CapacityPlanned"] == ("True", "Fits")


def test_plan_that_does_not_fit_is_stalled_with_the_planner_reason() -> None:
    resource = ld(model={"name": "meta-llama/Llama-3.1-70B-Instruct"}, engine={"backend": "vllm"})
    status = derive(resource, None)
    got = conds(status)
    assert got["Stalled"][0] == "True"
    assert got["Stalled"][1] == got["CapacityPlanned"][1] == "WeightsExceedMemory"
    assert got["CapacityPlanned"][0] == "False"
    assert got["Ready"] == ("False", "WeightsExceedMemory")
    assert got["Reconciling"][0] == "False"
    assert status.plan is not None
    assert status.plan.fits is False


def test_unknown_model_is_not_stalled() -> None:
    status = derive(ld(model={"name": "acme/secret-model"}), None)
    got = conds(status)
    assert got["CapacityPlanned"] == ("Unknown", "ModelUnknown")
    assert got["Stalled"][0] == "False"
    assert status.plan is None


def test_callers_problem_wins() -> None:
    got = conds(derive(ld(), None, problem=Problem("ChildRejected", "bad")))
    assert got["Stalled"] == ("True", "ChildRejected")


def test_invalid_status_keeps_counts_and_stalls() -> None:
    previous = LLMDeploymentStatus(replicas=2, ready_replicas=1, replica_summary="1/2")
    status = derive_invalid_status(
        name="x",
        generation=9,
        previous=previous,
        problem=Problem("InvalidSpec", "spec.x: bad"),
        now=NOW,
    )
    got = conds(status)
    assert got["Stalled"] == ("True", "InvalidSpec")
    assert got["CapacityPlanned"] == ("Unknown", "NotPlanned")
    assert status.observed_generation == 9
    assert status.replica_summary == "1/2"


def test_unchanged_status_is_not_written_and_transition_time_is_kept() -> None:
    first = derive(ld(replicas=2), deployment(status=ROLLED_OUT))
    stored = status_mod.dump(first)
    # The API server stores 80.0 as 80; that must not count as a change.
    assert stored["plan"]["gpuMemoryGiB"] == pytest.approx(79.18, abs=1)
    stored["plan"]["gpuMemoryGiB"] = float(stored["plan"]["gpuMemoryGiB"])
    observed = Observed(
        "x",
        "ns",
        generation=4,
        previous=status_mod.parse_previous(stored),
        children={kinds.DEPLOYMENT: deployment(status=ROLLED_OUT)},
    )
    later = derive_status(
        observed,
        ld(replicas=2).spec,
        plan_for(ld(replicas=2).spec),
        template_hash=HASH,
        now=datetime(2030, 1, 1, tzinfo=UTC),
    )
    assert status_patch(stored, later) is None


def test_status_patch_nulls_removed_keys_and_replaces_conditions() -> None:
    new = derive(ld(), None)
    patch = status_patch({"bogus": 1, "conditions": []}, new)
    assert patch is not None
    assert patch["bogus"] is None
    assert len(patch["conditions"]) == 5


def test_parse_previous_tolerates_garbage() -> None:
    assert status_mod.parse_previous(None) == LLMDeploymentStatus()
    assert status_mod.parse_previous({"conditions": "nope"}) == LLMDeploymentStatus()


def hpa(*conditions: tuple[str, str, str]) -> dict[str, Any]:
    """An HPA as the watch cache keeps it (`observed.child_summary`): conditions only."""
    from llmop.observed import child_summary

    return child_summary(
        {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "x", "namespace": "ns"},
            "spec": {"maxReplicas": 5},
            "status": {
                "currentMetrics": [{"type": "Pods"}],  # churns at every sync: dropped
                "conditions": [
                    {
                        "type": kind,
                        "status": state,
                        "reason": reason,
                        "message": f"{reason} said the HPA",
                        "lastTransitionTime": "2026-01-02T03:04:05Z",
                    }
                    for kind, state, reason in conditions
                ],
            },
        }
    )


NO_METRICS = ("ScalingActive", "False", "FailedGetPodsMetric")


def test_hpa_summary_keeps_conditions_without_timestamps_or_readings() -> None:
    summary = hpa(("AbleToScale", "True", "ReadyForNewScale"), NO_METRICS)
    assert summary["status"] == {
        "conditions": [
            {
                "type": "AbleToScale",
                "status": "True",
                "reason": "ReadyForNewScale",
                "message": "ReadyForNewScale said the HPA",
            },
            {
                "type": "ScalingActive",
                "status": "False",
                "reason": "FailedGetPodsMetric",
                "message": "FailedGetPodsMetric said the HPA",
            },
        ]
    }


def _autoscaled_status(
    resource: LLMDeployment, dep_status: dict[str, int], conditions: list[tuple[str, str, str]]
) -> LLMDeploymentStatus:
    """The status of autoscaled `resource` with its Deployment at `dep_status` and an HPA
    reporting `conditions`."""
    observed = Observed(
        "x",
        "ns",
        generation=4,
        children={kinds.DEPLOYMENT: deployment(status=dep_status), kinds.HPA: hpa(*conditions)},
    )
    return derive_status(
        observed, resource.spec, plan_for(resource.spec), template_hash=HASH, now=NOW
    )


def test_no_metrics_while_every_replica_loads_is_not_degraded() -> None:
    """Loading engines export no queue depth, so an HPA whose replicas are all loading gets no
    metric item (FailedGetPodsMetric) by design; once one serves, the same condition degrades."""
    resource = ld(autoscaling={"maxReplicas": 5})
    loading = {"replicas": 2, "updatedReplicas": 2, "readyReplicas": 0}

    def degraded(dep_status: dict[str, int]) -> tuple[str, str | None]:
        status = _autoscaled_status(
            resource, dep_status, [("AbleToScale", "True", "ReadyForNewScale"), NO_METRICS]
        )
        got = {c.type: c for c in status.conditions}["Degraded"]
        return got.status, got.reason

    assert degraded(loading)[0] == "False"
    assert degraded(ROLLED_OUT) == ("True", "AutoscalerInactive")


@pytest.mark.parametrize(
    ("conditions", "degraded"),
    [
        ([("AbleToScale", "True", "ReadyForNewScale"), NO_METRICS], True),
        ([("AbleToScale", "False", "FailedGetScale")], True),
        (
            [
                ("AbleToScale", "True", "ScaleDownStabilized"),
                ("ScalingActive", "True", "ValidMetricFound"),
            ],
            False,
        ),
        # Its target scaled to 0 on purpose: the HPA idles, nothing is wrong.
        ([("ScalingActive", "False", "ScalingDisabled")], False),
        ([("ScalingLimited", "True", "TooManyReplicas")], False),
    ],
)
def test_an_hpa_that_cannot_scale_degrades_with_its_own_words(
    conditions: list[tuple[str, str, str]], degraded: bool
) -> None:
    resource = ld(autoscaling={"maxReplicas": 5})
    status = _autoscaled_status(resource, ROLLED_OUT, conditions)
    got = {c.type: c for c in status.conditions}
    assert got["Ready"].status == "True"  # the replicas serve: Ready stays honest
    if degraded:
        reason = conditions[-1][2]
        assert (got["Degraded"].status, got["Degraded"].reason) == ("True", "AutoscalerInactive")
        assert f"({conditions[-1][0]}=False, {reason}): {reason} said the HPA" in (
            got["Degraded"].message or ""
        )
    else:
        assert got["Degraded"].status == "False"


def test_autoscaled_replicas_below_min_replicas_are_not_ready() -> None:
    """A new autoscaled Deployment is created at one replica and handed over to minReplicas in
    the same pass: seen in between, it is not Ready at 1/1; at the floor it is."""
    resource = ld(autoscaling={"minReplicas": 2, "maxReplicas": 3})
    one = {"replicas": 1, "readyReplicas": 1, "updatedReplicas": 1, "availableReplicas": 1}
    between = derive(resource, deployment(replicas=None, status=one))
    assert between.replica_summary == "1/2"
    assert conds(between)["Ready"][0] == "False"
    at_floor = derive(resource, deployment(replicas=2, status=ROLLED_OUT))
    assert at_floor.replica_summary == "2/2"
    assert conds(at_floor)["Ready"][0] == "True"


def test_pre_pull_status_counts_the_nodes_with_the_current_image() -> None:
    spec = LLMDeployment.model_validate(
        {
            "metadata": {"name": "chat", "namespace": "team"},
            "spec": {"model": {"name": "m"}, "scheduling": {"prePullImage": True}},
        }
    ).spec

    def ds(generation: int = 2, **status: int) -> dict[str, Any]:
        return {"metadata": {"generation": generation}, "status": status}

    pull = status_mod.pre_pull_status
    assert (
        pull(
            spec.model_copy(
                update={"scheduling": spec.scheduling.model_copy(update={"pre_pull_image": False})}
            ),
            ds(),
            "chat",
            "team",
        )
        is None
    )
    assert pull(spec, None, "chat", "team").message == "creating DaemonSet chat-prepull"
    done = pull(
        spec,
        ds(observedGeneration=2, desiredNumberScheduled=3, numberReady=3, updatedNumberScheduled=3),
        "chat",
        "team",
    )
    assert (done.nodes, done.pulled, done.message) == (3, 3, "image on 3 of 3 nodes")
    # A new image: the old pods are still ready, but only the updated ones count.
    rolling = pull(
        spec,
        ds(observedGeneration=2, desiredNumberScheduled=3, numberReady=3, updatedNumberScheduled=1),
        "chat",
        "team",
    )
    assert (rolling.pulled, rolling.nodes) == (1, 3)
    assert rolling.message.startswith("image on 1 of 3 nodes; pulling or failing: kubectl get")
    assert "-n team -l app.kubernetes.io/instance=chat,app.kubernetes.io/component=prepull" in (
        rolling.message
    )
    stale = pull(spec, ds(observedGeneration=1, desiredNumberScheduled=3), "chat", "team")
    assert (stale.pulled, stale.message) == (0, "DaemonSet chat-prepull is updating")
    nowhere = pull(spec, ds(observedGeneration=2), "chat", "team")
    assert nowhere.message.startswith("no node matches")
