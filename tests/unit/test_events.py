"""Events only for meaningful condition transitions."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from llmop import conditions, events
from llmop.api.v1alpha1 import Condition, ConditionStatus
from llmop.conditions import Observation

NOW = datetime(2026, 1, 2, tzinfo=UTC)


def conds(
    ready: ConditionStatus, reconciling: ConditionStatus, stalled: ConditionStatus
) -> list[Condition]:
    return conditions.merge(
        [],
        [
            Observation("Ready", ready, "R", "ready message"),
            Observation("Reconciling", reconciling, "RollingOut", "rolling"),
            Observation("Stalled", stalled, "WeightsExceedMemory", "too big"),
        ],
        generation=1,
        now=NOW,
    )


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        ([], conds("False", "True", "False"), [("Normal", "RollingOut")]),
        (conds("False", "True", "False"), conds("True", "False", "False"), [("Normal", "Ready")]),
        (conds("True", "False", "False"), conds("True", "False", "False"), []),
        (
            conds("True", "False", "False"),
            conds("False", "False", "True"),
            [("Warning", "WeightsExceedMemory")],
        ),
        (
            conds("False", "False", "True"),
            conds("False", "True", "False"),
            [("Normal", "Recovered"), ("Normal", "RollingOut")],
        ),
    ],
    ids=["first-reconcile", "became-ready", "no-change", "stalled", "recovered"],
)
def test_transition_events(
    before: list[Condition], after: list[Condition], expected: list[tuple[str, str]]
) -> None:
    got = events.transition_events(before, after)
    assert [(e.type, e.reason) for e in got] == expected


def test_render_event_refers_to_the_parent() -> None:
    body = {
        "apiVersion": "serving.llmop.dev/v1alpha1",
        "kind": "LLMDeployment",
        "metadata": {"name": "x", "namespace": "ns", "uid": "u1", "resourceVersion": "5"},
    }
    event = events.render_event(
        body, events.EventSpec("Warning", "Stalled", "m" * 5000), now=NOW, instance="pod-1"
    )
    assert event["metadata"] == {"generateName": "x.", "namespace": "ns"}
    assert event["involvedObject"]["uid"] == "u1"
    assert event["involvedObject"]["kind"] == "LLMDeployment"
    assert event["type"] == "Warning"
    assert len(event["message"]) == 1024
    assert event["firstTimestamp"] == "2026-01-02T00:00:00Z"
    assert event["reportingInstance"] == "pod-1"


def test_ready_at_zero_replicas_is_announced_once() -> None:
    """A model created at zero replicas becomes Ready with reason ScaledToZero: one Event
    (ScaledToZero), not a Ready Event beside it with the same message."""
    zero = conditions.merge(
        [],
        [
            Observation("Ready", "True", "ScaledToZero", "Scaled to zero replicas."),
            Observation("Reconciling", "False", "AsExpected", "as expected"),
            Observation("Stalled", "False", "AsExpected", "as expected"),
        ],
        generation=1,
        now=NOW,
    )
    got = events.transition_events([], zero)
    assert [(e.type, e.reason, e.message) for e in got] == [
        ("Normal", "ScaledToZero", "Scaled to zero replicas.")
    ]
    serving = conds("True", "False", "False")
    went = events.transition_events(serving, zero)
    assert [(e.type, e.reason) for e in went] == [("Normal", "ScaledToZero")]
