"""What the drain counts as cut at its deadline (`drain.Load.in_engine`)."""

from __future__ import annotations

import pytest

from llmop_engine.drain import Load
from llmop_engine.vllm_metrics import EngineMetrics


def metrics(waiting: float, running: float) -> EngineMetrics:
    return EngineMetrics(waiting=waiting, running=running, generation_tokens=0, prompt_tokens=0)


@pytest.mark.parametrize(
    ("load", "cut"),
    [
        # Real vLLM: 16 in flight, 8 in the scheduler; the other 8 had every token generated and
        # were still being written to a slow reader, which the API server finished afterwards.
        (Load(in_flight=16, metrics=metrics(0, 8)), 8),
        # A request being tokenised is in flight but not yet in the scheduler: never more than
        # the in-flight count either way.
        (Load(in_flight=3, metrics=metrics(2, 4)), 3),
        (Load(in_flight=None, metrics=metrics(2, 4)), 6),  # /load did not answer
        (Load(in_flight=5, metrics=None), 5),  # the gauges did not answer
        (Load(), None),  # nothing answered: unknown
    ],
)
def test_cut_is_what_the_scheduler_holds(load: Load, cut: int | None) -> None:
    assert load.in_engine == cut


def test_idle_detection_still_counts_every_request_in_flight() -> None:
    """The quiet-period check must not call a drain idle while responses are still written."""
    assert Load(in_flight=16, metrics=metrics(0, 8)).requests == 16
