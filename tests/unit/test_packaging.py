"""`operator/` is a folder, never a package: the stdlib `operator` module must not be shadowed."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_operator_folder_has_no_init() -> None:
    assert not (REPO / "operator" / "__init__.py").exists()


def test_stdlib_operator_wins_from_the_repo_root() -> None:
    result = subprocess.run(
        [sys.executable, "-S", "-c", "import operator; print(operator.__file__)"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    assert Path(result.stdout.strip()).resolve().is_relative_to(stdlib)


def test_both_packages_import_from_anywhere(tmp_path: Path) -> None:
    code = "import llmop, llmop_engine, operator; print(operator.itemgetter)"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
