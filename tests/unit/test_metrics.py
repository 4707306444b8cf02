"""Operator metrics: results, errors, durations and the managed-objects gauge."""

from __future__ import annotations

import pytest

from llmop.metrics import RESULT_STALLED, Metrics


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_reconciles_are_counted_and_timed_by_result() -> None:
    metrics = Metrics()
    with metrics.reconciling("parent"):
        pass
    with metrics.reconciling("parent") as outcome:
        outcome.result = RESULT_STALLED
    assert sample(metrics, "llmop_reconciles_total", trigger="parent", result="ok") == 1
    assert sample(metrics, "llmop_reconciles_total", trigger="parent", result="stalled") == 1
    assert (
        sample(metrics, "llmop_reconcile_duration_seconds_count", trigger="parent", result="ok")
        == 1
    )


def test_exceptions_count_as_errors_and_propagate() -> None:
    metrics = Metrics()
    with pytest.raises(KeyError), metrics.reconciling("child"):
        raise KeyError("x")
    assert sample(metrics, "llmop_reconciles_total", trigger="child", result="error") == 1
    assert sample(metrics, "llmop_reconcile_errors_total", trigger="child", error="KeyError") == 1


def test_managed_objects_follow_watch_events() -> None:
    metrics = Metrics()
    metrics.observe_object("Deployment", "ns/a", present=True)
    metrics.observe_object("Deployment", "ns/a", present=True)
    metrics.observe_object("Deployment", "ns/b", present=True)
    metrics.observe_object("Deployment", "ns/a", present=False)
    assert sample(metrics, "llmop_managed_objects", kind="Deployment") == 1


def test_a_leader_that_stands_down_manages_nothing_until_it_counts_again() -> None:
    """`llmop.main`: a term that lost the Lease forgets what it managed; the next term's watch
    events count afresh (an object deleted meanwhile is not counted on)."""
    metrics = Metrics()
    metrics.observe_object("LLMDeployment", "ns/a", present=True)
    metrics.observe_object("LLMDeployment", "ns/b", present=True)
    metrics.forget_objects()
    assert sample(metrics, "llmop_managed_objects", kind="LLMDeployment") == 0
    metrics.observe_object("LLMDeployment", "ns/b", present=True)
    assert sample(metrics, "llmop_managed_objects", kind="LLMDeployment") == 1


def test_registries_are_independent() -> None:
    first, second = Metrics(), Metrics()
    first.status_writes.inc()
    assert sample(second, "llmop_status_writes_total") == 0
