"""The egress guard (e2e/cluster/egress-guard.sh) for a test session: held for the whole session
when cluster tests run, its counters read at the start, checked by the suite's last test and
printed at the end.

The guard is shared by every cluster on this machine (routes and iptables are host-wide), so a
session judges only what its own run added: the counters at the end less those at the start.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field

import pytest

from support.cluster import REPO_ROOT, existing_cluster

GUARD_SH = REPO_ROOT / "e2e" / "cluster" / "egress-guard.sh"
SUITE_END = "suite_end"


@dataclass(frozen=True)
class GuardCounts:
    """What the guard dropped: packets per range and hits per destination address."""

    installed: bool
    ranges: dict[str, int] = field(default_factory=dict)
    destinations: dict[str, int] = field(default_factory=dict)

    def since(self, before: GuardCounts) -> GuardCounts:
        """The packets dropped after ``before`` was read (addresses: every one hit since)."""
        return GuardCounts(
            self.installed,
            {r: n - before.ranges.get(r, 0) for r, n in self.ranges.items()},
            {
                d: n - before.destinations.get(d, 0)
                for d, n in self.destinations.items()
                if n > before.destinations.get(d, 0)
            },
        )

    @property
    def total(self) -> int:
        return sum(self.ranges.values())

    def describe(self) -> str:
        by_range = ", ".join(f"{r}: {n}" for r, n in sorted(self.ranges.items()))
        hit = ", ".join(f"{d} ({n}x)" for d, n in sorted(self.destinations.items()))
        return f"{self.total} packet(s) [{by_range}]" + (f"; destinations: {hit}" if hit else "")


def read_counts() -> GuardCounts:
    out = subprocess.run(
        [str(GUARD_SH), "counts"], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    ranges: dict[str, int] = {}
    destinations: dict[str, int] = {}
    for line in out.splitlines():
        kind, key, value = line.split()
        (ranges if kind == "range" else destinations)[key] = int(value)
    return GuardCounts(bool(ranges), ranges, destinations)


def guard_ranges() -> list[tuple[str, str]]:
    """(what, CIDR) for every range the local cluster hands out (e2e/cluster/ranges.sh)."""
    out = subprocess.run(
        [str(GUARD_SH), "ranges"], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    return [(what, cidr) for what, cidr in (line.split() for line in out.splitlines())]


def can_guard() -> bool:
    """Whether this host can hold the guard (root on Linux, as egress-guard.sh needs)."""
    return os.uname().sysname == "Linux" and os.geteuid() == 0


_HOLDER = f"pytest-{os.getpid()}"
_state: dict[str, GuardCounts] = {}


def _guarding(session: pytest.Session) -> bool:
    return (
        not session.config.option.collectonly
        and existing_cluster() is None
        and can_guard()
        and any(item.get_closest_marker("cluster") for item in session.items)
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked suite_end run last, after every test that could send a packet."""
    items.sort(key=lambda item: item.get_closest_marker(SUITE_END) is not None)


def pytest_collection_finish(session: pytest.Session) -> None:
    if not _guarding(session):
        return
    subprocess.run([str(GUARD_SH), "up", _HOLDER, str(os.getpid())], check=True, timeout=300)
    _state["baseline"] = read_counts()


def pytest_sessionfinish(session: pytest.Session) -> None:
    if "baseline" in _state:
        subprocess.run([str(GUARD_SH), "down", _HOLDER], check=False, timeout=60)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if "final" in _state:
        terminalreporter.write_line(
            "egress guard: this run sent "
            + _state["final"].describe()
            + " to the local cluster's ranges toward the default route"
        )


@pytest.fixture(scope="session")
def egress_baseline() -> GuardCounts:
    """The guard's counters when the session started (skips where no guard is held)."""
    if "baseline" not in _state:
        pytest.skip("no egress guard in this session (not root, or an existing cluster)")
    return _state["baseline"]


def record_final(counts: GuardCounts) -> None:
    _state["final"] = counts
