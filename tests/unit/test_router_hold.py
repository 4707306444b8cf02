"""The router's holding core (scale to zero), by tables: admission and the cap, one wake per
episode, deadlines, release in arrival order at the engines' concurrency, leaving, stopping;
and the settings read from a CR's spec with the API's defaults."""

from __future__ import annotations

from typing import Any

import pytest

from llmop_router.hold import (
    PHASE_RELEASING,
    PHASE_REQUESTED,
    PHASE_WAKING,
    Holding,
    ScaleToZero,
)

CR = ("team", "llama")
OTHER = ("team", "other")


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({}, ScaleToZero(300, 300, 1000)),
        ({"autoscaling": {"minReplicas": 0}}, ScaleToZero(300, 300, 1000)),
        (
            {
                "autoscaling": {
                    "scaleToZero": {
                        "idleSeconds": 60,
                        "holdTimeoutSeconds": 2,
                        "maxPendingRequests": 5,
                    }
                }
            },
            ScaleToZero(60, 2, 5),
        ),
        # Malformed values (never past the CRD, but the router reads plain JSON) take defaults.
        (
            {"autoscaling": {"scaleToZero": {"holdTimeoutSeconds": "x", "maxPendingRequests": 0}}},
            ScaleToZero(300, 300, 1000),
        ),
        ({"autoscaling": {"scaleToZero": {"idleSeconds": True}}}, ScaleToZero(300, 300, 1000)),
        ({"autoscaling": None}, ScaleToZero(300, 300, 1000)),
    ],
)
def test_settings_from_the_spec(spec: dict[str, Any], expected: ScaleToZero) -> None:
    assert ScaleToZero.of(spec) == expected


@pytest.mark.parametrize(
    ("cap", "arrivals", "held", "refused", "wakes"),
    [
        (1000, 1, 1, 0, 1),
        (1000, 20, 20, 0, 1),  # one wake however many arrive
        (5, 8, 5, 3, 1),  # past the cap: refused, and no second wake
        (1, 3, 1, 2, 1),
    ],
)
def test_admission_cap_and_one_wake_per_episode(
    cap: int, arrivals: int, held: int, refused: int, wakes: int
) -> None:
    holding = Holding()
    settings = ScaleToZero(max_pending_requests=cap)
    admissions = [holding.admit(CR, float(t), settings) for t in range(arrivals)]
    assert sum(a.held is not None for a in admissions) == held
    assert sum(a.held is None for a in admissions) == refused
    assert sum(a.wake for a in admissions) == wakes
    assert admissions[0].wake
    assert holding.held(CR) == held
    assert holding.held(OTHER) == 0
    assert not holding.holding(OTHER)


@pytest.mark.parametrize(
    ("now", "expired_arrivals", "left"),
    [
        (9.9, [], 3),
        (10.0, [0.0], 2),  # a deadline is arrival + holdTimeoutSeconds, inclusive
        (12.0, [0.0, 1.0, 2.0], 0),
    ],
)
def test_deadlines(now: float, expired_arrivals: list[float], left: int) -> None:
    holding = Holding()
    settings = ScaleToZero(hold_timeout_seconds=10)
    for t in (0.0, 1.0, 2.0):
        holding.admit(CR, t, settings)
    expired = holding.expire(CR, now)
    assert [h.arrived for h in expired] == expired_arrivals
    assert all(h.deadline == h.arrived + 10 for h in expired)
    assert holding.held(CR) == left
    assert holding.holding(CR) == (left > 0)


@pytest.mark.parametrize(
    ("endpoints", "in_flight", "concurrency", "released", "left"),
    [
        ((), {}, 4, 0, 10),  # no ready endpoint: nothing goes
        (("a:1",), {}, 4, 4, 6),  # one pod: one batch of its concurrency
        (("a:1", "b:1"), {}, 4, 8, 2),
        (("a:1",), {"a:1": 3}, 4, 1, 9),  # what is in flight counts
        (("a:1",), {"a:1": 9}, 4, 0, 10),  # a pod over its limit takes none
        (("a:1",), {}, 256, 10, 0),  # everything fits: the episode ends
    ],
)
def test_release_at_the_engines_concurrency(
    endpoints: tuple[str, ...],
    in_flight: dict[str, int],
    concurrency: int,
    released: int,
    left: int,
) -> None:
    holding = Holding()
    tickets = [holding.admit(CR, float(t), ScaleToZero()).held for t in range(10)]
    out = holding.release(CR, in_flight, endpoints, concurrency)
    assert out == tickets[:released]  # first come, first served
    assert holding.held(CR) == left
    assert holding.holding(CR) == (left > 0)


def test_a_wake_releases_higher_priorities_first_and_arrival_order_within_one() -> None:
    holding = Holding()
    batch = [holding.admit(CR, float(t), ScaleToZero(), priority=0).held for t in range(10)]
    chat = [holding.admit(CR, 10.0 + t, ScaleToZero(), priority=100).held for t in range(10)]
    first = holding.release(CR, {}, ("a:1",), 4)
    assert first == chat[:4]
    second = holding.release(CR, {"a:1": 0}, ("a:1", "b:1"), 4)
    assert second == [*chat[4:], *batch[:2]]
    assert holding.release(CR, {}, ("a:1",), 256) == batch[2:]
    assert not holding.holding(CR)
    assert holding.total == 0


def test_phases_of_an_episode() -> None:
    holding = Holding()
    holding.admit(CR, 0.0, ScaleToZero())
    assert holding.episodes[CR].phase == PHASE_WAKING
    assert not holding.episodes[CR].woken
    holding.note(CR, "waking: the scale request failed (boom); retrying")
    assert not holding.episodes[CR].woken
    holding.woke(CR, PHASE_REQUESTED)
    assert holding.episodes[CR].woken
    assert holding.episodes[CR].phase == PHASE_REQUESTED
    holding.admit(CR, 1.0, ScaleToZero())
    holding.release(CR, {"a:1": 1}, ("a:1",), 2)
    assert holding.episodes[CR].phase == PHASE_RELEASING


def test_an_emptied_queue_ends_the_episode_and_the_next_request_wakes_again() -> None:
    holding = Holding()
    first = holding.admit(CR, 0.0, ScaleToZero())
    assert first.held is not None
    assert first.wake
    holding.leave(CR, first.held.ticket)  # its client went away
    assert not holding.holding(CR)
    again = holding.admit(CR, 5.0, ScaleToZero())
    assert again.wake
    assert again.held is not None
    assert again.held.ticket != first.held.ticket


def test_stopping_takes_every_queue() -> None:
    holding = Holding()
    for t in range(3):
        holding.admit(CR, float(t), ScaleToZero())
    holding.admit(OTHER, 0.0, ScaleToZero())
    taken = holding.take_all()
    assert sorted(key for key, _ in taken) == [CR, CR, CR, OTHER]
    assert not holding.holding(CR)
    assert not holding.holding(OTHER)
    assert holding.expire(CR, 1e9) == []
    assert holding.release(CR, {}, ("a:1",), 4) == []
