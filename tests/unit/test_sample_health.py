"""`make dev`'s verdict on a sample (e2e/sample_health.py): Ready alone is not healthy."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "e2e" / "sample_health.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sample_health", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["sample_health"] = module
    spec.loader.exec_module(module)
    return module


sample_health = _load()


def _cr(*conditions: tuple[str, str, str], actual: int | None = 1000, gen: int = 2) -> Any:
    return {
        "metadata": {"generation": 2},
        "status": {
            "observedGeneration": gen,
            "conditions": [
                {"type": t, "status": s, "reason": r, "message": f"{t} says {r}"}
                for t, s, r in conditions
            ],
            "plan": {"kvCacheTokens": 1000, "actual": {"kvCacheTokens": actual}},
        },
    }


HEALTHY = (
    ("Ready", "True", "Available"),
    ("Reconciling", "False", "Reconciled"),
    ("Stalled", "False", "AsExpected"),
    ("Degraded", "False", "AsExpected"),
    ("CapacityPlanned", "True", "Fits"),
)


def _replace(kind: str, status: str, reason: str) -> tuple[tuple[str, str, str], ...]:
    return tuple((kind, status, reason) if t == kind else (t, s, r) for t, s, r in HEALTHY)


def test_a_healthy_sample_has_no_problem() -> None:
    assert sample_health.problems(_cr(*HEALTHY), engines_report=True) == []


@pytest.mark.parametrize(
    ("cr", "engines_report", "expected"),
    [
        (_cr(*_replace("Degraded", "True", "RouterUnavailable")), False, "Degraded=True"),
        (
            _cr(*_replace("CapacityPlanned", "True", "CapacityShortfall")),
            False,
            "CapacityShortfall",
        ),
        (_cr(*_replace("Ready", "False", "Progressing")), False, "Ready is False Progressing"),
        (_cr(*_replace("Stalled", "True", "InvalidSpec")), False, "Stalled=True"),
        (_cr(*HEALTHY[1:]), False, "Ready is missing"),
        (_cr(*HEALTHY, gen=1), False, "generation 1, not 2"),
        (_cr(*HEALTHY, actual=None), True, "not been read back"),
    ],
)
def test_each_problem_is_named(cr: Any, engines_report: bool, expected: str) -> None:
    found = sample_health.problems(cr, engines_report=engines_report)
    assert len(found) == 1, found
    assert expected in found[0], found


def test_capacity_not_read_back_is_fine_where_no_engine_runs() -> None:
    assert sample_health.problems(_cr(*HEALTHY, actual=None), engines_report=False) == []
