"""The suite's own layout: test modules in folders without `__init__.py` are imported by their
basename, so two of them with one name stop the whole suite at collection (pytest's "import
file mismatch"), which a run of one folder alone never shows."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_test_modules_outside_packages_have_unique_basenames() -> None:
    outside = [
        path for path in TESTS.rglob("test_*.py") if not (path.parent / "__init__.py").exists()
    ]
    counts = Counter(path.name for path in outside)
    clashes = sorted(str(path.relative_to(TESTS)) for path in outside if counts[path.name] > 1)
    assert clashes == [], f"rename one of each: {clashes}"
