"""Pure: the model downloader's arithmetic — retry backoff, and progress (bytes done/total, rate,
ETA) from samples of the cache's size. Values in, values out; the clock is a parameter.

The downloader (`download.py`) samples the bytes on disk rather than hooking the client library's
progress bars: the bytes on disk are what survives a kill, what the engine agent already watches
for liveness, and they cannot drift from the truth when the library changes its internals.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from llmop_engine import contract

DownloadPhase = Literal["resolving", "downloading", "retrying", "complete", "failed"]

RATE_WINDOW_SECONDS = 10.0
"""The rate is measured over about this long: long enough to smooth the client's 10 MiB write
bursts, short enough that a stall shows within a probe period."""


def backoff_seconds(attempt: int, base: float = 2.0, cap: float = 60.0) -> float:
    """Delay before retry `attempt` (1-based): exponential from `base`, capped at `cap`."""
    if attempt < 1:
        return 0.0
    return float(min(cap, base * 2 ** (attempt - 1)))


@dataclass(frozen=True)
class Sample:
    at: float
    """Monotonic seconds."""
    bytes_done: int


@dataclass(frozen=True)
class Progress:
    """What the downloader reports (the JSON the operator reads into status.model.download)."""

    phase: DownloadPhase
    bytes_done: int
    bytes_total: int | None
    rate_bytes_per_second: float | None
    eta_seconds: float | None
    attempt: int
    message: str = ""

    def as_json(self) -> dict[str, object]:
        key = contract.ProgressKey
        return {
            key.PHASE: self.phase,
            key.BYTES_DONE: self.bytes_done,
            key.BYTES_TOTAL: self.bytes_total,
            key.RATE_BYTES_PER_SECOND: (
                None if self.rate_bytes_per_second is None else round(self.rate_bytes_per_second)
            ),
            key.ETA_SECONDS: None if self.eta_seconds is None else round(self.eta_seconds),
            key.ATTEMPT: self.attempt,
            key.MESSAGE: self.message,
        }


def window(samples: tuple[Sample, ...], now: Sample, span: float) -> tuple[Sample, ...]:
    """`samples` + `now`, dropping those older than `span` seconds (keeping one anchor older
    than the window so a rate always spans at least `span` once there is enough history)."""
    kept = (*samples, now)
    while len(kept) > 2 and now.at - kept[1].at >= span:
        kept = kept[1:]
    return kept


def rate(samples: tuple[Sample, ...]) -> float | None:
    """Bytes per second between the oldest and newest sample; None without elapsed time."""
    if len(samples) < 2:
        return None
    first, last = samples[0], samples[-1]
    elapsed = last.at - first.at
    if elapsed <= 0:
        return None
    return max(0.0, (last.bytes_done - first.bytes_done) / elapsed)


def eta(bytes_done: int, bytes_total: int | None, per_second: float | None) -> float | None:
    """Seconds left at `per_second`; 0 when done; None when unknown or not moving."""
    if bytes_total is None:
        return None
    left = bytes_total - bytes_done
    if left <= 0:
        return 0.0
    if not per_second:
        return None
    return left / per_second


def progress(
    phase: DownloadPhase,
    samples: tuple[Sample, ...],
    bytes_total: int | None,
    attempt: int,
    message: str = "",
) -> Progress:
    done = samples[-1].bytes_done if samples else 0
    if bytes_total is not None:
        done = min(done, bytes_total)  # partial files of a killed run may overshoot briefly
    per_second = rate(samples)
    return Progress(
        phase=phase,
        bytes_done=done,
        bytes_total=bytes_total,
        rate_bytes_per_second=per_second,
        eta_seconds=eta(done, bytes_total, per_second),
        attempt=attempt,
        message=message,
    )
