"""The metrics pipeline's pieces for tests: its binaries (prometheus, promtool,
prometheus-adapter, built from Go modules by e2e/cluster/build-metrics.sh), its configuration
renderer (e2e/metrics/metrics_config.py, loaded from its path: it is a script, not a package), and
how its output reads at the other end (custom metrics values, the HPA's read).

A missing binary is a loud skip on a developer machine that cannot build it, and a failure in CI
(`CI` set): `make test` builds them beside the suite's first tests (mk/metrics.mk,
tests/support/lanes.py), and the `metrics` modules run last, after waiting for that build.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pathlib
import subprocess
from collections.abc import Generator
from types import ModuleType
from typing import Any

import pytest

from llmop.quantity import quantity_value
from support.modules import load_file

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD_METRICS_SH = REPO_ROOT / "e2e" / "cluster" / "build-metrics.sh"
METRICS_CONFIG_PY = REPO_ROOT / "e2e" / "metrics" / "metrics_config.py"


@functools.cache
def _build() -> tuple[pathlib.Path | None, str]:
    # Output streams to the terminal/CI log: a cold build takes minutes and should be seen.
    res = subprocess.run([str(BUILD_METRICS_SH)], stdout=subprocess.PIPE, text=True, check=False)
    if res.returncode != 0:
        return None, f"{BUILD_METRICS_SH} failed (exit {res.returncode}); see its output above"
    return pathlib.Path(res.stdout.strip().splitlines()[-1]), ""


def _needs_metrics(item: pytest.Item) -> bool:
    return item.get_closest_marker("metrics") is not None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules with a `metrics` test run after the others (whole modules, so their module
    fixtures are set up once): `make test` builds the binaries beside the session's first tests
    (tests/support/lanes.py), and only these wait for them. tryfirst: support.egress then still
    moves the suite_end tests behind everything."""
    modules = {item.path for item in items if _needs_metrics(item)}
    items.sort(key=lambda item: item.path in modules)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    """Before the first `metrics` test: the binaries, built (or waited for, when `make test`
    builds them beside the session) outside any test's timer. A cold build (~10-20 min on 2
    cores) is longer than pytest-timeout allows one test, and belongs in the open. tryfirst: this
    wrapper is outside pytest-timeout's, so the wait is not charged to the test."""
    if _needs_metrics(item) and not item.config.option.collectonly:
        capture = item.config.pluginmanager.getplugin("capturemanager")
        uncaptured = capture.global_and_fixture_disabled() if capture else contextlib.nullcontext()
        with uncaptured:
            _build()
    return (yield)


def metrics_bin_dir() -> pathlib.Path:
    """The cached bin dir (built if needed); skip loudly, or fail in CI, when it cannot be built."""
    bin_dir, why = _build()
    if bin_dir is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must build the metrics binaries: {why}")
        pytest.skip(f"SKIPPED LOUDLY: cannot build promtool/prometheus/prometheus-adapter: {why}")
    return bin_dir


def load_metrics_config() -> ModuleType:
    """e2e/metrics/metrics_config.py as a module (the one chart -> pipeline config translation)."""
    return load_file("llmop_metrics_config", METRICS_CONFIG_PY)


def metric_value(quantity: str) -> float:
    """A value of the custom metrics API (a Kubernetes quantity: `12`, `2500m`) as a number."""
    value = quantity_value(quantity)
    if value is None:
        raise ValueError(f"not a quantity: {quantity!r}")
    return value


def hpa_read_the_metric(hpa: dict[str, Any]) -> bool:
    """The HPA's last sync read its Pods metric: an entry with a current value. A sync that
    could not read it also writes an entry, of type "" with no `pods` (seen in CI right after
    Ready, and while prometheus-adapter has not relisted a new metric name yet)."""
    current = (hpa.get("status") or {}).get("currentMetrics") or []
    return any(
        m.get("type") == "Pods" and m.get("pods", {}).get("current", {}).get("averageValue")
        for m in current
    )
