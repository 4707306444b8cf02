"""Installing helm/llmop with the Helm v4 SDK on a cluster the tests share (and, with
`chart_on_real_node`, on the real-node cluster as a user installs it).

Other tests applied the CRD with `kubectl` first (`support.operator.install_crd`); Helm adopts an
existing object only when it carries the release's ownership metadata, which `adopt_crd` adds.
The chart keeps the CRD on uninstall (`crds.keep`), so every other test's CRs survive a release.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import helm_python as helm

from support.cluster import Cluster, create_namespace
from support.operator import CRD_NAME, REPO_ROOT
from support.realnode import RealCluster, import_into_node

__all__ = [
    "CHART_DIR",
    "CRD_NAME",
    "NODE_IMAGE_VALUES",
    "Release",
    "adopt_crd",
    "chart_on_real_node",
]

CHART_DIR = REPO_ROOT / "helm" / "llmop"
NODE_IMAGE_VALUES: dict[str, Any] = {
    "image": {"pullPolicy": "Never"},
    "router": {
        "image": {"pullPolicy": "Never"},
        "gateway": {"store": {"image": {"pullPolicy": "Never"}}},
    },
}
"""The chart's defaults except the images' pull policy: on the real node they were imported into
its containerd, never pulled."""


CRD_NAMES = (
    CRD_NAME,
    "llmtenants.serving.llmop.dev",
    "llmpriorityclasses.serving.llmop.dev",
    "llmexternalmodels.serving.llmop.dev",
)
"""The chart's CRDs (kept on uninstall: the next release must adopt them)."""


def adopt_crd(cluster: Cluster, release: str, namespace: str) -> None:
    """Let `release` (in `namespace`) take over the chart's CRDs that exist already."""
    for crd in CRD_NAMES:
        if cluster.kubectl("get", "crd", crd, check=False).returncode != 0:
            continue
        cluster.kubectl("label", "--overwrite", "crd", crd, "app.kubernetes.io/managed-by=Helm")
        cluster.kubectl(
            "annotate",
            "--overwrite",
            "crd",
            crd,
            f"meta.helm.sh/release-name={release}",
            f"meta.helm.sh/release-namespace={namespace}",
        )


@dataclass(frozen=True)
class Release:
    """An installed release: its SDK config (for upgrades), name and namespace."""

    config: helm.Config
    name: str
    namespace: str


@contextmanager
def chart_on_real_node(rc: RealCluster, values: dict[str, Any]) -> Iterator[Release]:
    """helm/llmop installed on the real-node cluster `rc` as a user installs it (its operator and
    router images imported into the node, `values` on top of the defaults), into a fresh
    namespace; uninstalled on exit. The host operator is stopped meanwhile (two operators would
    both reconcile every namespace) and started again after, if it ran before."""
    import_into_node("operator", "router", "redis")
    was_running = rc.operator.process is not None
    rc.operator.stop()
    namespace = create_namespace(rc.cluster, "llmop-system")
    name = f"llmop-{secrets.token_hex(2)}"
    try:
        with helm.Config(kubeconfig_path=rc.cluster.kubeconfig, namespace=namespace) as config:
            adopt_crd(rc.cluster, name, namespace)
            config.install(
                CHART_DIR, name, values, namespace=namespace, wait="watcher", timeout=240
            )
            try:
                yield Release(config, name, namespace)
            finally:
                config.uninstall(name, ignore_not_found=True, wait="watcher", timeout=120)
    finally:
        rc.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        if was_running:
            rc.operator.start()
