"""The real node's tenancy lock: a second session waits for the node rather than failing on it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import cluster


def _holder(lock: Path, seconds: float) -> subprocess.Popen[str]:
    """Another session: takes the lock the way start_cluster does and keeps it for a while."""
    script = (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('held', flush=True)\n"
        f"time.sleep({seconds})\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "held"
    return proc


@pytest.fixture
def lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "tenancy"
    monkeypatch.setattr(cluster, "_REAL_NODE_TENANCY", path)
    monkeypatch.setattr(cluster, "_REAL_NODE_OWNER", tmp_path / "owner")
    (tmp_path / "owner").write_text("llmop-test-1-other\n")
    return path


def test_waits_for_the_other_session_then_takes_the_node(lock: Path) -> None:
    holder = _holder(lock, 2.0)
    started = time.monotonic()
    try:
        cluster._take_real_node("mine")
        waited = time.monotonic() - started
    finally:
        cluster._give_back_real_node("mine")
        holder.wait()
    assert waited >= 1.0, f"took the node after {waited:.1f}s while the other session held it"


def test_gives_up_naming_the_holder(lock: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster, "_REAL_NODE_WAIT_S", 0.5)
    holder = _holder(lock, 30.0)
    try:
        with pytest.raises(TimeoutError, match=r"llmop-test-1-other.*LLMOP_REAL_NODE_WAIT_S"):
            cluster._take_real_node("mine")
    finally:
        holder.kill()
        holder.wait()
    assert "mine" not in cluster._tenancies


def test_given_back_node_is_free_for_the_next(lock: Path) -> None:
    cluster._take_real_node("first")
    cluster._give_back_real_node("first")
    holder = _holder(lock, 0.0)  # would block forever if "first" still held it
    holder.wait()
