"""e2e/cluster/go-cache.sh: the keyed-cache recipe build.sh and build-metrics.sh share.

Exercised on a two-line Go program: a build publishes its directory only once complete, a second
run reuses it without building, and a binary that fails its version check publishes nothing.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parents[2] / "e2e" / "cluster" / "go-cache.sh"

pytestmark = pytest.mark.skipif(shutil.which("go") is None, reason="needs the Go toolchain")


def _run(tmp: Path, want_version: str) -> subprocess.CompletedProcess[str]:
    script = f"""
set -euo pipefail
export GOFLAGS=-buildvcs=false CGO_ENABLED=0 GOTOOLCHAIN=local
LABEL=test CACHE_ROOT={tmp}/cache BIN_DIR={tmp}/cache/bins
source {LIB}
go_cache_open "a second"
go_cache_build hello {tmp}/src "" "-s -w" .
go_cache_check_version hello {want_version}
go_cache_close hello
"""
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=False)


@pytest.fixture
def src(tmp_path: Path) -> Path:
    d = tmp_path / "src"
    d.mkdir()
    (d / "go.mod").write_text("module example.com/hello\n\ngo 1.22\n")
    (d / "main.go").write_text('package main\n\nfunc main() { println("hello v1.2.3") }\n')
    return d


def test_builds_once_then_reuses(tmp_path: Path, src: Path) -> None:
    first = _run(tmp_path, "v1.2.3")
    assert first.returncode == 0, first.stderr
    bins = tmp_path / "cache" / "bins"
    assert first.stdout.strip() == str(bins)
    assert (bins / ".complete").exists()
    assert (bins / "hello").exists()
    assert "hello" in (bins / "build-times.txt").read_text()
    assert not (tmp_path / "cache" / "bins.partial").exists()

    (src / "main.go").write_text("this is not Go")  # a second build would fail
    second = _run(tmp_path, "v1.2.3")
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == str(bins)
    assert "reusing" in second.stderr


def test_failed_check_publishes_nothing(tmp_path: Path, src: Path) -> None:
    result = _run(tmp_path, "v9.9.9")
    assert result.returncode != 0
    assert "expected v9.9.9" in result.stderr
    assert not (tmp_path / "cache" / "bins").exists()
