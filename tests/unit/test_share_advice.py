"""The `maxSharePercent` suggested for a priority class (`llmop_router.share_advice`): Erlang C
as the reference computes it, the slots held back for a load, and the share suggested from the
classes' measured load in flight."""

from __future__ import annotations

import pytest

from llmop_router.share_advice import (
    HALF_LIFE_SECONDS,
    ClassLoad,
    erlang_c,
    held_back,
    suggested_percent,
)

KEY = ("team", "llama")


def test_erlang_c_is_the_references_chance_of_a_wait() -> None:
    # gateway.md §8.4: 1.37 slots of interactive load, 2 of 16 slots held back: 56 % of its
    # arrivals wait; 4 held back: 6 %.
    assert erlang_c(2, 1.37) == pytest.approx(0.557, abs=0.001)
    assert erlang_c(4, 1.37) == pytest.approx(0.056, abs=0.001)
    assert erlang_c(1, 0.3) == pytest.approx(0.3)  # one server: busy as often as loaded
    assert erlang_c(3, 0.0) == 0.0
    assert erlang_c(2, 2.0) == 1.0, "a load that fills the servers always waits"
    assert 0 < erlang_c(400, 350.0) < 1, "large counts stay finite"


def test_the_slots_held_back_are_the_fewest_that_keep_the_wait_under_five_percent() -> None:
    assert held_back(0.0) == 0
    assert held_back(1.37) == 5  # 4 leave 5.6 %
    assert erlang_c(held_back(0.34), 0.34) <= 0.05 < erlang_c(held_back(0.34) - 1, 0.34)
    assert held_back(20.0) > 20


def test_the_share_suggested_keeps_the_rest_of_each_router_pods_slots() -> None:
    # The fairness bench: ~0.17 slots of interactive load through each of 2 router pods of 8
    # slots: 2 of 16 held back, 1 a pod: 88 % (8 x 88 % = 7.04: 7 slots; 87 % would leave 6),
    # the bench's capped configuration, which meets p99 <= 250 ms.
    assert suggested_percent(8, 0.17, replicas=2) == 88
    assert suggested_percent(16, 0.34) == 88
    assert suggested_percent(16, 1.37) == 69  # 5 held back: 11 of 16 = 68.75 %
    assert 16 * 69 // 100 == 11
    assert suggested_percent(16, 0.0) is None
    assert suggested_percent(0, 1.0) is None
    assert suggested_percent(4, 30.0) == 25, "never below one slot"


def test_the_load_is_the_decayed_mean_in_flight_and_each_class_gets_what_is_above_it() -> None:
    load = ClassLoad(values={"interactive": 100, "batch": 0, "best-effort": -100})
    now = 0.0
    load.sample({}, now)
    for _ in range(3000):  # 50 minutes at one sample a second: ten half-lives
        now += 1.0
        load.sample({KEY: {"interactive": 1, "batch": 7, "best-effort": 2}}, now)
    assert load.mean(KEY, "interactive") == pytest.approx(1.0, rel=0.01)
    assert load.mean(KEY, "batch") == pytest.approx(7.0, rel=0.01)
    # Two router pods of 8 slots each: interactive load 2 of 16 slots above batch.
    found = load.suggestions(KEY, 8, 2)
    assert "interactive" not in found, "nothing above the top class"
    assert found["batch"] == suggested_percent(8, 1.0, replicas=2)
    assert found["best-effort"] == suggested_percent(8, 8.0, replicas=2)
    # Idle for a half-life: the load halves, and the suggestion eases.
    load.sample({}, now + HALF_LIFE_SECONDS)
    assert load.mean(KEY, "interactive") == pytest.approx(0.5, rel=0.01)
    assert load.suggestions(KEY, 8, 2)["batch"] >= found["batch"]


def test_a_model_measured_for_a_minute_has_that_minutes_mean() -> None:
    load = ClassLoad(values={"interactive": 100, "batch": 0})
    load.sample({}, 0.0)
    for second in range(1, 61):
        load.sample({KEY: {"interactive": 2 if second % 2 else 0, "batch": 6}}, float(second))
    assert load.mean(KEY, "interactive") == pytest.approx(1.0, rel=0.05)
    assert load.mean(KEY, "batch") == pytest.approx(6.0, rel=0.01)
