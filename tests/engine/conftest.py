"""Engine-test fixtures: replicas as real processes, cleaned up whatever happens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.fleet import Fleet


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(tmp_path)
    try:
        yield f
    finally:
        f.stop()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Real-vLLM tests: their measurements, and a banner when they could not run (never silent)."""
    from engine import real_vllm

    if real_vllm.SKIPPED:
        terminalreporter.section("REAL vLLM TESTS DID NOT RUN", sep="!", red=True, bold=True)
        for reason in sorted(set(real_vllm.SKIPPED)):
            terminalreporter.write_line(f"SKIPPED: {reason}", red=True, bold=True)
    if real_vllm.MEASURED:
        terminalreporter.section("real vLLM (CPU) measurements")
        for key, value in real_vllm.MEASURED.items():
            terminalreporter.write_line(f"{key}: {value}")
