"""support.metrics in a real pytest session: the `metrics` modules run after the others (and
before the suite_end tests), and their binaries are waited for before the first of them, outside
pytest-timeout's timer, once. The build script is a stand-in that takes longer than the timeout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support import metrics

TESTS_DIR = Path(metrics.__file__).resolve().parents[1]


def _write(root: Path, name: str, body: str) -> None:
    (root / name).write_text(body)


def test_metrics_modules_run_last_and_wait_for_the_build_outside_the_timeout(
    tmp_path: Path,
) -> None:
    _write(tmp_path, "pytest.ini", "[pytest]\ntimeout = 2\n")
    # Longer than the 2 s timeout: charged to a test, it would fail it.
    _write(
        tmp_path,
        "build.sh",
        '#!/bin/sh\nsleep 3\necho built >>builds.log\nmkdir -p bin\necho "$PWD/bin"\n',
    )
    (tmp_path / "build.sh").chmod(0o755)
    _write(
        tmp_path,
        "conftest.py",
        "import pathlib\n"
        "import support.metrics\n"
        "support.metrics.BUILD_METRICS_SH = pathlib.Path('build.sh').resolve()\n"
        "pytest_plugins = ['support.metrics', 'support.egress']\n",
    )
    # Named so that collection order would put it first.
    _write(
        tmp_path,
        "test_a_needs_metrics.py",
        "import pathlib, pytest\n"
        "from support.metrics import metrics_bin_dir\n"
        "pytestmark = pytest.mark.metrics\n"
        "def test_one():\n"
        "    assert pathlib.Path('plain.mark').exists(), 'the plain module ran before'\n"
        "    assert metrics_bin_dir().name == 'bin'\n"
        "def test_two():\n"
        "    assert pathlib.Path('builds.log').read_text() == 'built\\n', 'built once'\n"
        "    pathlib.Path('metrics.mark').touch()\n",
    )
    _write(
        tmp_path,
        "test_b_plain.py",
        "import pathlib\n"
        "def test_plain():\n"
        "    assert not pathlib.Path('builds.log').exists(), 'no build before a metrics test'\n"
        "    pathlib.Path('plain.mark').touch()\n",
    )
    _write(
        tmp_path,
        "test_c_end.py",
        "import pathlib, pytest\n"
        "@pytest.mark.suite_end\n"
        "def test_end():\n"
        "    assert pathlib.Path('metrics.mark').exists(), 'suite_end after the metrics tests'\n",
    )
    env = dict(os.environ, PYTHONPATH=str(TESTS_DIR))
    env.pop("CI", None)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    order = [line.split("::")[0] for line in out.splitlines() if " PASSED" in line]
    assert order == [
        "test_b_plain.py",
        "test_a_needs_metrics.py",
        "test_a_needs_metrics.py",
        "test_c_end.py",
    ], out
