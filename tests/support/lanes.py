"""`make test`'s pytest step: the suite as two pytest sessions side by side, one verdict.

The suite waits far more than it computes (pods starting and draining on the real node, probe
periods, a five-minute saturation window, controllers' resync periods), so one session after
another leaves the two cores idle for most of the run. The machine's one real node can serve
only one session at a time, so the split follows it:

- ``real-node``: ``tests/e2e`` (the real node's own cluster, kubelet, kube-proxy, Prometheus)
  and ``tests/images`` (image builds and unpacks on the host, kept beside the node's host
  snapshot test rather than across it);
- ``rest``: everything else (unit, router, chart, model, gitops, engine with the real-vLLM
  engines, and the integration tests on their own kwok cluster).

Each lane is a whole pytest session with its own fixtures and clusters (names carry the pid;
``support.cluster`` already lets sessions share the machine). Each holds the egress guard and
ends with the ``suite_end`` check, so the two checked windows together cover the whole run.

Output: every line of a lane is printed as it comes, prefixed with the lane's name; each lane's
full log is also kept under ``.pytest_cache/lanes/``; the end repeats each lane's summary, the
end of each failure's report, and prints one closing line counting both. Exit status: 0 only
when both lanes passed.

``LLMOP_TEST_LANES=serial`` runs the lanes one after the other (same sessions, same order),
for a machine where running them together would only slow both.

``--beside CMD`` runs a shell command beside the lanes, under ``nice -n 19``: the prerequisites
only some late tests need (the metrics binaries, ~9 min of Go on 2 cores cold), built on the
cores the waiting tests leave idle instead of before every test (the tests that need them run
last and wait for that build: support.metrics). Its output is prefixed ``[beside]``; when it
fails, so does the run.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import IO

REPO_ROOT = Path(__file__).resolve().parents[2]
LOG_DIR = REPO_ROOT / ".pytest_cache" / "lanes"
EGRESS_CHECK = (
    "tests/integration/test_egress_guard.py::test_nothing_left_the_machine_during_the_run"
)
REAL_NODE_PATHS = ("tests/e2e", "tests/images")
SUMMARY_MARK = "= short test summary info ="
DURATIONS_MARK = "slowest"


@dataclass(frozen=True)
class Lane:
    name: str
    args: tuple[str, ...]


FAILURE_LINES = 100
"""Lines of each failure's report repeated at the end of the run."""


def lanes(durations: int) -> tuple[Lane, ...]:
    common = ("-q", f"--durations={durations}")
    real_node = Lane("real-node", (*common, *REAL_NODE_PATHS, EGRESS_CHECK))
    rest = Lane("rest", (*common, "tests", *(f"--ignore={p}" for p in REAL_NODE_PATHS)))
    return real_node, rest


@dataclass
class Outcome:
    lane: Lane
    returncode: int
    seconds: float
    log: Path
    junit: Path

    def counts(self) -> tuple[int, int, int]:
        """(passed, failed, skipped) from the lane's JUnit report; errors count as failed."""
        try:
            root = ET.parse(self.junit).getroot()
        except (OSError, ET.ParseError):
            return 0, 0, 0
        suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
        total = failed = skipped = 0
        for suite in suites:
            total += int(suite.get("tests", 0))
            failed += int(suite.get("failures", 0)) + int(suite.get("errors", 0))
            skipped += int(suite.get("skipped", 0))
        return total - failed - skipped, failed, skipped

    def failures(self, lines: int = FAILURE_LINES) -> list[str]:
        """Each failed or errored test's name and the last `lines` of its report (the
        assertion, a timeout's message and what it printed about the state it found)."""
        try:
            root = ET.parse(self.junit).getroot()
        except (OSError, ET.ParseError):
            return []
        found = []
        for case in root.iter("testcase"):
            for problem in (*case.findall("failure"), *case.findall("error")):
                text = (problem.text or problem.get("message") or "").rstrip().splitlines()
                name = f"{case.get('classname')}::{case.get('name')}"
                found.append("\n".join([f"--- {name}", *text[-lines:]]))
        return found


def _pump(stream: IO[bytes], prefix: str, log: IO[bytes], lock: threading.Lock) -> None:
    """Copy a lane's output line by line to its log and, prefixed, to our stdout."""
    for line in iter(stream.readline, b""):
        log.write(line)
        log.flush()  # readable while the lane runs, and complete if we are killed
        with lock:
            sys.stdout.buffer.write(prefix.encode() + line)
            sys.stdout.buffer.flush()


class Running:
    """A command whose output is logged and printed, prefixed with `name`, as it comes."""

    def __init__(
        self, name: str, cmd: list[str], lock: threading.Lock, log_dir: Path, cwd: Path
    ) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"{name}.log"
        self.started = time.monotonic()
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
        assert self.proc.stdout is not None
        self.ended: float | None = None
        self._pump = threading.Thread(
            target=self._copy_output, args=(self.proc.stdout, f"[{name}] ", lock), daemon=True
        )
        self._pump.start()

    def _copy_output(self, stream: IO[bytes], prefix: str, lock: threading.Lock) -> None:
        _pump(stream, prefix, self._log, lock)
        # Its output closes when it exits: a command waited for late still reports its own time.
        self.ended = time.monotonic()

    def wait(self) -> tuple[int, float]:
        returncode = self.proc.wait()
        self._pump.join()
        self._log.close()
        return returncode, (self.ended or time.monotonic()) - self.started


class RunningLane(Running):
    def __init__(self, lane: Lane, lock: threading.Lock, log_dir: Path, cwd: Path) -> None:
        self.lane = lane
        self.junit = log_dir / f"{lane.name}.xml"
        self.junit.unlink(missing_ok=True)
        pytest = Path(sys.executable).with_name("pytest")
        cmd = [
            str(pytest),
            *lane.args,
            f"--junitxml={self.junit}",
            # Two sessions must not write one cache file at once.
            "-o",
            f"cache_dir={log_dir / lane.name}-cache",
        ]
        super().__init__(lane.name, cmd, lock, log_dir, cwd)

    def outcome(self) -> Outcome:
        returncode, seconds = self.wait()
        return Outcome(self.lane, returncode, seconds, self.log_path, self.junit)


def _tail(log: Path) -> str:
    """The lane's slowest tests and short summary (what pytest prints last)."""
    lines = log.read_text(errors="replace").splitlines()
    for mark in (DURATIONS_MARK, SUMMARY_MARK):
        starts = [i for i, line in enumerate(lines) if mark in line and line.startswith("=")]
        if starts:
            return "\n".join(lines[starts[0] :])
    return "\n".join(lines[-20:])


def _start_beside(command: str, lock: threading.Lock, log_dir: Path, cwd: Path) -> Running:
    # nice 19: it takes only what the lanes leave idle, so their timing is (nearly) unchanged.
    return Running("beside", ["nice", "-n", "19", "bash", "-c", command], lock, log_dir, cwd)


def _wait_beside(side: Running, command: str) -> int:
    code, seconds = side.wait()
    print(f"\n===== beside: `{command}`: exit {code}, {seconds:.0f} s (log: {side.log_path}) =====")
    return code


def run(
    selected: tuple[Lane, ...],
    *,
    serial: bool,
    beside: str | None = None,
    log_dir: Path = LOG_DIR,
    cwd: Path = REPO_ROOT,
) -> int:
    lock = threading.Lock()
    running: list[Running] = []
    outcomes: list[Outcome] = []

    def forward(signum: int, _frame: object) -> None:
        for r in running:
            if r.proc.poll() is None:
                r.proc.send_signal(signum)

    # A terminal's Ctrl-C reaches the lanes already (one process group): wait for them to end.
    signal.signal(signal.SIGINT, lambda _signum, _frame: None)
    signal.signal(signal.SIGTERM, forward)
    started = time.monotonic()
    sides = [_start_beside(beside, lock, log_dir, cwd)] if beside else []
    if serial:
        for lane in selected:
            lane_run = RunningLane(lane, lock, log_dir, cwd)
            running = [lane_run, *sides]
            outcomes.append(lane_run.outcome())
    else:
        lane_runs = [RunningLane(lane, lock, log_dir, cwd) for lane in selected]
        running = [*lane_runs, *sides]
        outcomes = [r.outcome() for r in lane_runs]
    side_codes = [_wait_beside(side, beside) for side in sides if beside]
    for outcome in outcomes:
        print(
            f"\n===== lane {outcome.lane.name}: exit {outcome.returncode}, "
            f"{outcome.seconds:.0f} s (log: {outcome.log}) ====="
        )
        print(_tail(outcome.log))
    # Last but the count: what a CI page that keeps only the end of the output still shows.
    reports = [report for outcome in outcomes for report in outcome.failures()]
    if reports:
        print(f"\n===== failures ({len(reports)}), the end of each report =====")
        print("\n".join(reports))
    passed = failed = skipped = 0
    for outcome in outcomes:
        p, f, s = outcome.counts()
        passed, failed, skipped = passed + p, failed + f, skipped + s
    worst = max((*(o.returncode for o in outcomes), *side_codes), default=1)
    if worst != 0 and failed == 0:
        failed = 1  # a lane that broke without a report (collection error, crash) still fails
    mode = "serial" if serial else "side by side"
    print(f"\nlanes ({mode}): {time.monotonic() - started:.0f} s in all")
    print(f"suite: {passed} passed, {failed} failed, {skipped} skipped")
    return 0 if worst == 0 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--beside", metavar="CMD", help="shell command run beside the lanes")
    args = parser.parse_args(argv)
    serial = os.environ.get("LLMOP_TEST_LANES", "").strip().lower() == "serial"
    return run(lanes(durations=25), serial=serial, beside=args.beside)


if __name__ == "__main__":
    sys.exit(main())
