"""Condition bookkeeping: lastTransitionTime moves only when a status flips."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from llmop import conditions
from llmop.api.v1alpha1 import Condition, ConditionStatus
from llmop.conditions import Observation

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
T1 = T0 + timedelta(minutes=5)


def test_new_conditions_get_the_current_time_and_generation() -> None:
    merged = conditions.merge(
        [], [Observation("Ready", "False", "Creating", "m")], generation=3, now=T0
    )
    assert merged == [
        Condition(
            type="Ready",
            status="False",
            observed_generation=3,
            last_transition_time="2026-01-02T03:04:05Z",
            reason="Creating",
            message="m",
        )
    ]


@pytest.mark.parametrize(
    ("new_status", "new_reason", "expected_time"),
    [
        ("False", "RollingOut", "2026-01-02T03:04:05Z"),
        ("True", "AllReplicasReady", "2026-01-02T03:09:05Z"),
    ],
    ids=["reason-change-keeps-time", "status-flip-moves-time"],
)
def test_transition_time_moves_only_on_status_change(
    new_status: ConditionStatus, new_reason: str, expected_time: str
) -> None:
    before = conditions.merge([], [Observation("Ready", "False", "Creating")], generation=1, now=T0)
    after = conditions.merge(
        before, [Observation("Ready", new_status, new_reason)], generation=2, now=T1
    )
    assert after[0].last_transition_time == expected_time
    assert after[0].reason == new_reason
    assert after[0].observed_generation == 2


def test_merge_keeps_observation_order_and_drops_unobserved_types() -> None:
    before = conditions.merge([], [Observation("Degraded", "True", "Old")], generation=1, now=T0)
    after = conditions.merge(
        before,
        [Observation(t, "Unknown", "R") for t in conditions.TYPES],
        generation=1,
        now=T1,
    )
    assert [c.type for c in after] == list(conditions.TYPES)


def test_find_and_status_of() -> None:
    merged = conditions.merge([], [Observation("Stalled", "True", "X")], generation=None, now=T0)
    assert conditions.status_of(merged, "Stalled") == "True"
    assert conditions.status_of(merged, "Ready") is None
    assert conditions.find(merged, "Ready") is None


@pytest.mark.parametrize("hours", [-8, 2, 5.5, 14])
def test_format_time_converts_to_utc(hours: float) -> None:
    # Fixed non-UTC offsets, not the host's zone: on a UTC host a "local" time is already UTC
    # and a formatter that skipped the conversion would still pass.
    zone = timezone(timedelta(hours=hours))
    local = datetime(2026, 1, 2, 5, 4, 5, tzinfo=UTC).astimezone(zone)
    assert local.hour != 5
    assert conditions.format_time(local) == "2026-01-02T05:04:05Z"
