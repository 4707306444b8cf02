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
