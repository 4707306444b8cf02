"""Installing helm/llmop with the Helm v4 SDK on a cluster the tests share.

Other tests applied the CRD with `kubectl` first (`support.operator.install_crd`); Helm adopts an
existing object only when it carries the release's ownership metadata, which `adopt_crd` adds.
The chart keeps the CRD on uninstall (`crds.keep`), so every other test's CRs survive a release.
"""

from __future__ import annotations

from support.cluster import Cluster
from support.operator import CRD_NAME

__all__ = ["CRD_NAME", "adopt_crd"]


def adopt_crd(cluster: Cluster, release: str, namespace: str) -> None:
    """Let `release` (in `namespace`) take over the CRD when it exists already."""
    if cluster.kubectl("get", "crd", CRD_NAME, check=False).returncode != 0:
        return
    cluster.kubectl("label", "--overwrite", "crd", CRD_NAME, "app.kubernetes.io/managed-by=Helm")
    cluster.kubectl(
        "annotate",
        "--overwrite",
        "crd",
        CRD_NAME,
        f"meta.helm.sh/release-name={release}",
        f"meta.helm.sh/release-namespace={namespace}",
    )
