"""The downloader's arithmetic: backoff, rate over a window, ETA, the JSON it publishes."""

from __future__ import annotations

import pytest

from llmop_engine import download_progress as dp


@pytest.mark.parametrize(
    ("attempt", "expected"),
    [(0, 0.0), (1, 2.0), (2, 4.0), (3, 8.0), (6, 60.0), (20, 60.0)],
)
def test_backoff_doubles_up_to_the_cap(attempt: int, expected: float) -> None:
    assert dp.backoff_seconds(attempt, base=2.0, cap=60.0) == expected


def test_rate_and_eta_from_samples() -> None:
    samples = (dp.Sample(0.0, 0), dp.Sample(10.0, 100 * 2**20))
    p = dp.progress("downloading", samples, 1000 * 2**20, attempt=1)
    assert p.rate_bytes_per_second == pytest.approx(10 * 2**20)
    assert p.eta_seconds == pytest.approx(90.0)
    assert p.as_json() == {
        "phase": "downloading",
        "bytesDone": 100 * 2**20,
        "bytesTotal": 1000 * 2**20,
        "rateBytesPerSecond": 10 * 2**20,
        "etaSeconds": 90,
        "attempt": 1,
        "message": "",
    }


@pytest.mark.parametrize(
    ("done", "total", "rate", "expected"),
    [
        (5, 10, 0.0, None),  # not moving: no promise
        (5, 10, None, None),
        (5, None, 1.0, None),  # total unknown
        (10, 10, None, 0.0),  # done
        (12, 10, 1.0, 0.0),
        (0, 10, 2.0, 5.0),
    ],
)
def test_eta_edges(
    done: int, total: int | None, rate: float | None, expected: float | None
) -> None:
    assert dp.eta(done, total, rate) == expected


def test_one_sample_has_no_rate_and_done_never_exceeds_total() -> None:
    p = dp.progress("downloading", (dp.Sample(3.0, 150),), 100, attempt=2)
    assert p.rate_bytes_per_second is None
    assert p.bytes_done == 100


def test_window_keeps_an_anchor_at_least_the_span_old() -> None:
    samples: tuple[dp.Sample, ...] = ()
    for t in range(31):
        samples = dp.window(samples, dp.Sample(float(t), t * 10), span=10.0)
    assert samples[-1].at == 30.0
    assert samples[0].at == 20.0  # the oldest kept spans exactly the window
    assert dp.rate(samples) == pytest.approx(10.0)


def test_a_stalled_download_has_zero_rate_and_no_eta() -> None:
    samples = (dp.Sample(0.0, 500), dp.Sample(12.0, 500))
    p = dp.progress("downloading", samples, 1000, attempt=1)
    assert p.rate_bytes_per_second == 0.0
    assert p.eta_seconds is None
