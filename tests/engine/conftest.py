"""Engine-test fixtures: replicas as real processes, cleaned up whatever happens."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import real_vllm
from engine.fleet import Fleet
from support import tiny_model


@pytest.fixture(scope="session")
def vllm_dir() -> Path:
    """The real vLLM CPU install (built or reused from ~/.cache/llmop); skips where it cannot be."""
    try:
        return real_vllm.venv()
    except real_vllm.UnavailableError as exc:
        real_vllm.SKIPPED.append(str(exc))
        pytest.skip(f"REAL vLLM TESTS SKIPPED: {exc}")


@pytest.fixture(scope="session")
def model_dir(vllm_dir: Path) -> Path:
    """The tiny random-weight model every real-vLLM test serves."""
    started = time.monotonic()
    path = tiny_model.ensure(str(vllm_dir / "bin" / "python"))
    real_vllm.MEASURED["tiny model (make or reuse)"] = f"{time.monotonic() - started:.1f}s"
    return path


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
