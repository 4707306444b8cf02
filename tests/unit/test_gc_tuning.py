"""`llmop run` tunes CPython's cycle collector before kopf starts (`main.tune_garbage_collector`):
what exists then is frozen out of every later collection, and the youngest generation is
larger. The process's own collector state is put back after each test."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from llmop.main import GC_YOUNG_THRESHOLD, tune_garbage_collector


@pytest.fixture(autouse=True)
def restored_collector() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_startup_objects_are_frozen_and_the_young_generation_is_larger() -> None:
    _, middle, oldest = gc.get_threshold()
    startup_object: list[object] = []
    tune_garbage_collector()
    assert gc.get_freeze_count() > 0
    # Frozen: no generation holds it, so no collection walks it again.
    assert all(obj is not startup_object for obj in gc.get_objects())
    assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, middle, oldest)


def test_cycles_made_after_startup_are_still_collected() -> None:
    tune_garbage_collector()
    cycle: list[object] = []
    cycle.append(cycle)
    assert any(obj is cycle for obj in gc.get_objects())
    del cycle
    assert gc.collect() >= 1
