"""The build-only Go helper modules of e2e/cluster agree on their dependencies' versions.

Go's build cache reuses a compiled package only when it and everything below it are the same
versions, so helpers built against one Kubernetes line must require the same version of every
module they share (e2e/cluster/README.md, "One set of dependency versions"). A go.mod lists a
module's whole build list (module graph pruning, go >= 1.17), so agreeing go.mod files compile
the same packages: a helper bumped alone would silently compile client-go & co. a second time.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import pytest

CLUSTER = Path(__file__).resolve().parents[2] / "e2e" / "cluster"
# Helpers that share a Kubernetes line (prometheus-adapter, on k8s.io/* v0.30, and kube-router,
# on v0.29, share nothing).
FAMILIES = {
    "k8s.io/* v0.36": ("k8s", "kwok", "lws", "etcd"),
    "k8s.io/* v0.37": ("coredns", "prometheus"),
}
_REPLACE = re.compile(r"^replace (\S+) => (\S+) (v\S+)$", re.MULTILINE)


def requirements(helper: str) -> dict[str, str]:
    """Module -> the version the helper builds with (a `replace` to a version wins)."""
    text = (CLUSTER / helper / "go.mod").read_text()
    replaced = {m[1]: m[3] for m in _REPLACE.finditer(text)}
    versions: dict[str, str] = {}
    in_block = False
    for raw in text.splitlines():
        line = raw.split("//")[0].strip()
        if line == "require (":
            in_block = True
            continue
        if in_block and line == ")":
            in_block = False
            continue
        if in_block or line.startswith("require "):
            parts = line.removeprefix("require ").split()
            if len(parts) == 2 and parts[1].startswith("v"):
                versions[parts[0]] = replaced.get(parts[0], parts[1])
    return versions


@pytest.mark.parametrize("family", FAMILIES)
def test_helpers_of_one_kubernetes_line_require_the_same_versions(family: str) -> None:
    seen: dict[str, dict[str, str]] = defaultdict(dict)
    for helper in FAMILIES[family]:
        for module, version in requirements(helper).items():
            seen[module][helper] = version
    disagreeing = {m: by for m, by in seen.items() if len(set(by.values())) > 1}
    assert not disagreeing, (
        f"{family}: raise these to one version in every helper that requires them "
        f"(go get <module>@<highest> in each, then go mod tidy): {disagreeing}"
    )
    shared = [m for m, by in seen.items() if len(by) > 1]
    assert "google.golang.org/grpc" in shared, "the check reads the go.mod files it should"


def test_the_control_plane_staging_modules_are_the_release_they_replace() -> None:
    k8s = requirements("k8s")
    assert k8s["k8s.io/kubernetes"] == "v1.36.3"
    assert k8s["k8s.io/client-go"] == "v0.36.3"
    assert requirements("lws")["k8s.io/client-go"] == "v0.36.3"
