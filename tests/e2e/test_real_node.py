"""The real node itself: it joined beside the kwok nodes as a kubelet of its own (not kwok's),
advertises GPUs so an unchanged LLMDeployment lands on it, and `down` restores the host exactly."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.cluster import wait_until
from support.realnode import NODE_SH, REAL_NODE, RealCluster, node_log_dir

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]


def _node(rc: RealCluster, name: str) -> dict:  # type: ignore[type-arg]
    node: dict = json.loads(rc.kubectl("get", "node", name, "-o", "json").stdout)  # type: ignore[type-arg]
    return node


def test_real_node_joined_beside_kwok(real_cluster: RealCluster) -> None:
    node = _node(real_cluster, REAL_NODE)
    labels = node["metadata"]["labels"]
    assert labels["llmop.dev/real-node"] == "true"
    assert labels["nvidia.com/gpu.present"] == "true"
    # A real kubelet registered it (kwok's fake nodes carry the kwok annotation instead).
    assert "kwok.x-k8s.io/node" not in node["metadata"].get("annotations", {})
    assert node["status"]["nodeInfo"]["kubeletVersion"] == "v1.36.3"
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "4"
    ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}
    assert ready["Ready"] == "True"
    # Fake nodes are tainted while the real node is joined, so unchanged workloads run for real.
    nodes = json.loads(real_cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    fakes = [n for n in nodes if n["metadata"].get("annotations", {}).get("kwok.x-k8s.io/node")]
    assert fakes, "the kwok GPU nodes are still there"
    for fake in fakes:
        taints = {(t["key"], t["effect"]) for t in fake["spec"].get("taints") or []}
        assert ("kwok.x-k8s.io/node", "NoSchedule") in taints, fake["metadata"]["name"]


def test_kubelet_requires_authentication(real_cluster: RealCluster) -> None:
    """No anonymous kubelet: an unauthenticated request to its API is refused."""
    out = subprocess.run(
        ["curl", "-sk", "-o", "/dev/null", "-w", "%{http_code}", "https://10.255.7.1:10250/pods"],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert out.stdout == "401", out


def test_down_restores_the_host_exactly(real_cluster: RealCluster) -> None:
    """Snapshot before `up` (taken by node.sh) == snapshot after `down`; then the node rejoins."""
    before_file = node_log_dir().parent / "host-before.snapshot"
    before = before_file.read_text()
    name = real_cluster.cluster.name
    assert name is not None
    work = real_cluster.cluster.kubeconfig.parent
    subprocess.run([str(NODE_SH), "down"], check=True, timeout=300)
    after = subprocess.run(
        [str(NODE_SH), "snapshot"], check=True, capture_output=True, text=True, timeout=120
    ).stdout
    diff = _diff(before, after)
    # Rejoin before asserting, so the rest of the session keeps its node either way.
    subprocess.run([str(NODE_SH), "up", name, str(work)], check=True, timeout=600)
    wait_until(
        lambda: (
            real_cluster.kubectl(
                "wait", "--for=condition=Ready", f"node/{REAL_NODE}", "--timeout=5s", check=False
            ).returncode
            == 0
        ),
        timeout=120,
        what="real node Ready again",
    )
    assert not diff, "host state not restored:\n" + "\n".join(diff)
    assert Path(before_file).exists()


def _diff(before: str, after: str) -> list[str]:
    b, a = set(before.splitlines()), set(after.splitlines())
    return [f"- {line}" for line in sorted(b - a)] + [f"+ {line}" for line in sorted(a - b)]


def _iptables_section(snapshot: str) -> str:
    lines = snapshot.splitlines()
    start, end = lines.index("## iptables"), lines.index("## nftables")
    return "\n".join(lines[start + 1 : end])


@pytest.fixture
def fresh_netns() -> Iterator[str]:
    """A new network namespace: no iptables table loaded yet, as on a fresh machine."""
    if os.geteuid() != 0 or shutil.which("iptables") is None:
        pytest.skip("needs root and iptables")
    name = f"llmop-fresh-{secrets.token_hex(3)}"
    existed = NETNS_DIR.exists()
    mounted = _is_mount_point(NETNS_DIR)
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)
        # `ip netns add` bind-mounts /run/netns onto itself (and creates it) the first time;
        # `del` leaves both. Undone here, so the host is as the test found it: a later node
        # `down` must be able to remove a /run/netns that its `up` created.
        if not mounted and _is_mount_point(NETNS_DIR):
            subprocess.run(["umount", str(NETNS_DIR)], check=False)
        if not existed:
            shutil.rmtree(NETNS_DIR, ignore_errors=True)


NETNS_DIR = Path("/run/netns")


def _is_mount_point(path: Path) -> bool:
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    return any(line.split()[4] == str(path) for line in mounts)


def test_snapshot_equates_empty_tables_with_absent_ones(fresh_netns: str) -> None:
    """On a fresh machine `up` (kube-proxy) creates the first filter/nat/mangle tables and `down`
    leaves them empty with ACCEPT policies: the same host as before, so the same snapshot. A rule
    or a chain left behind still shows."""

    def in_ns(*args: str) -> str:
        return subprocess.run(
            ["ip", "netns", "exec", fresh_netns, *args],
            check=True,
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout

    fresh = _iptables_section(in_ns(str(NODE_SH), "snapshot"))
    for family in ("iptables", "ip6tables"):
        for table, chain in (("filter", "FORWARD"), ("nat", "POSTROUTING"), ("mangle", "OUTPUT")):
            in_ns(family, "-w", "-t", table, "-A", chain, "-j", "ACCEPT")
            in_ns(family, "-w", "-t", table, "-D", chain, "-j", "ACCEPT")
    saved = in_ns("iptables-save")
    assert "*nat" in saved, "premise: the tables exist now, empty"
    assert _iptables_section(in_ns(str(NODE_SH), "snapshot")) == fresh

    in_ns("iptables", "-w", "-t", "nat", "-N", "LEFT-BEHIND")
    assert _iptables_section(in_ns(str(NODE_SH), "snapshot")) != fresh
    in_ns("iptables", "-w", "-t", "nat", "-X", "LEFT-BEHIND")
    in_ns("iptables", "-w", "-t", "mangle", "-P", "FORWARD", "DROP")
    assert _iptables_section(in_ns(str(NODE_SH), "snapshot")) != fresh
