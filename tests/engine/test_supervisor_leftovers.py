"""An engine that exits leaving processes in its group does not leave them running.

vLLM's API server can exit while one of its EngineCore's workers is blocked in a collective with
another node's rank. Outside a container (or with `shareProcessNamespace`) nothing ended that
orphan: it kept the rendezvous port open, so the group's other ranks went on seeing their leader
and waited out their whole drain budget. The agent now kills what is left of the engine's process
group as soon as the engine's own process exits.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from llmop_engine.supervisor import Supervisor

pytestmark = pytest.mark.engine


def run_engine(argv: list[str]) -> tuple[int | None, bool]:
    async def go() -> tuple[int | None, bool]:
        supervisor = Supervisor(argv)
        supervisor.start()
        code = await supervisor.wait(timeout=30)
        return code, supervisor.end_leftovers()

    return asyncio.run(go())


def gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_processes_left_in_the_group_are_killed(tmp_path: Path) -> None:
    pid_file = tmp_path / "orphan.pid"
    # The orphan ignores SIGTERM, as a rank stuck in a collective does in effect.
    code, left = run_engine(
        ["sh", "-c", f"(trap '' TERM; exec sleep 300) & echo $! > {pid_file}; exit 0"]
    )
    orphan = int(pid_file.read_text())
    assert code == 0
    assert left, "the orphan in the engine's group was not seen"
    assert gone(orphan, 5.0), f"pid {orphan} still runs"


def test_a_clean_exit_kills_nothing() -> None:
    code, left = run_engine(["sh", "-c", "exit 3"])
    assert (code, left) == (3, False)


def test_processes_outside_the_group_are_not_members(tmp_path: Path) -> None:
    pid_file = tmp_path / "outside.pid"
    # setsid: a process that left the engine's group on purpose is not the engine's to kill.
    code, left = run_engine(
        ["sh", "-c", f"setsid sh -c 'echo $$ > {pid_file}; exec sleep 30' & sleep 0.5; exit 0"]
    )
    outside = int(pid_file.read_text())
    try:
        assert (code, left) == (0, False)
        assert not gone(outside, 0.2)
    finally:
        os.kill(outside, signal.SIGKILL)
