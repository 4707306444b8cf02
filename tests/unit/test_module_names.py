"""No two modules of one name across the product packages (`llmop`, `llmop_engine`,
`llmop_router`): a file name says which module it is, in a traceback, a log line's logger, a
grep or a review, without its folder."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (
    ROOT / "operator" / "src" / "llmop",
    ROOT / "engine-image" / "src" / "llmop_engine",
    ROOT / "router" / "src" / "llmop_router",
)
# Names that mean the same role in every package that has one, so the package is the only
# difference (each is the single owner of its job in its package, see test_architecture).
SAME_ROLE = {
    "__init__.py": "a package marker",
    "__main__.py": "a package's `python -m` entry",
    "cli.py": "each distribution's console script (pyproject's [project.scripts])",
    "contract.py": "each component's stdlib-only contract: all the operator imports of it"
    " (engine, router)",
    "kube.py": "each process's one Kubernetes API client (operator, router)",
    "metrics.py": "each process's own Prometheus metrics (operator, router, simulator)",
}


def modules_by_file_name() -> dict[str, list[str]]:
    found: dict[str, list[str]] = defaultdict(list)
    for package in PACKAGES:
        for path in sorted(package.rglob("*.py")):
            found[path.name].append(path.relative_to(package.parent).as_posix())
    return found


def test_no_two_product_modules_share_a_file_name() -> None:
    shared = {
        name: paths
        for name, paths in modules_by_file_name().items()
        if len(paths) > 1 and name not in SAME_ROLE
    }
    assert shared == {}, f"modules of one name (rename one to say what it is): {shared}"
