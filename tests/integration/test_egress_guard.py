"""Nothing the local cluster does leaves this machine (e2e/cluster/egress-guard.sh, ranges.sh).

With the kwok-only cluster up, every range it hands out (Service CIDRs, kwok's fake pods, the real
node's pods) routes locally, never by the default gateway; the operator, reading a kwok engine
pod's agent every second, fails at once with EHOSTUNREACH and the guard counts nothing. The last
test of the session checks that the whole run left the guard's counters where they started."""

from __future__ import annotations

import errno
import ipaddress
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from support.cluster import Cluster, wait_until
from support.egress import GuardCounts, guard_ranges, read_counts, record_final
from support.manifests import simulator_spec as spec
from support.operator import OperatorProcess

if TYPE_CHECKING:
    from support.operator import Kit

pytestmark = pytest.mark.cluster

AGENT_PORT = 8081


def default_route() -> tuple[str, str]:
    """(gateway, interface) of this machine's default route; empty strings where it has none."""
    out = subprocess.run(
        ["ip", "-4", "route", "show", "default"], capture_output=True, text=True, check=True
    ).stdout
    gateway = re.search(r"\bvia (\S+)", out)
    device = re.search(r"\bdev (\S+)", out)
    return (gateway.group(1) if gateway else "", device.group(1) if device else "")


def route_of(address: str) -> str:
    """What `ip route get` says (a route, or the error of an unreachable one)."""
    result = subprocess.run(
        ["ip", "route", "get", address], capture_output=True, text=True, check=False
    )
    return (result.stdout + result.stderr).strip()


def test_every_cluster_range_routes_locally(
    kube_cluster: Cluster, egress_baseline: GuardCounts
) -> None:
    gateway, device = default_route()
    assert device, "this machine has no default route: nothing to guard against"
    for what, cidr in guard_ranges():
        network = ipaddress.ip_network(cidr)
        hosts = (network[1], network[5], network[-2]) if network.num_addresses > 8 else network
        for address in hosts:
            route = route_of(str(address))
            assert f"via {gateway}" not in route, f"{what} {address}: {route}"
            assert f"dev {device}" not in route, f"{what} {address}: {route}"


@pytest.fixture
def chatty_operator(operator_kubeconfig: Path, tmp_path: Path) -> Iterator[OperatorProcess]:
    """`llmop run` reading agents every second, logging each read that fails (debug)."""
    process = OperatorProcess(
        operator_kubeconfig,
        tmp_path / "operator.log",
        extra_env={"LLMOP_AGENT_READ_INTERVAL_SECONDS": "1", "LLMOP_VERBOSE": "true"},
    )
    process.start()
    try:
        yield process
    finally:
        process.stop()


def test_operator_reads_of_kwok_pods_fail_locally(
    chatty_operator: OperatorProcess, kit: Kit, namespace: str, egress_baseline: GuardCounts
) -> None:
    before = read_counts()
    kwok_pods = ipaddress.ip_network(dict(guard_ranges())["kwok-pods"])
    kit.apply_llmd(namespace, "egress", spec(replicas=1))
    kit.wait_condition(namespace, "egress", "Ready", "True", timeout=60)
    selector = "serving.llmop.dev/deployment=egress"
    (pod,) = kit.kube.list("v1", "Pod", namespace, label_selector=selector)
    name, ip = pod["metadata"]["name"], pod["status"]["podIP"]
    assert ipaddress.ip_address(ip) in kwok_pods, f"kwok gave {name} {ip}, outside {kwok_pods}"

    # A connection to the fake pod fails here, at once, rather than leaving by the default route.
    started = time.monotonic()
    with pytest.raises(OSError, match="No route to host") as failed:
        socket.create_connection((ip, AGENT_PORT), timeout=5).close()
    assert failed.value.errno == errno.EHOSTUNREACH, failed.value
    assert time.monotonic() - started < 1.0

    # The operator's reader tries it every second and meets the same local error.
    line = re.compile(rf"could not read agent of {re.escape(namespace)}/{re.escape(name)}: .*")

    def failed_reads() -> list[str] | None:
        found = line.findall(chatty_operator.log_path.read_text(errors="replace"))
        return found if len(found) >= 3 else None

    reads = wait_until(failed_reads, timeout=30, interval=0.5, what="3 failed agent reads")
    assert all("No route to host" in r or "Errno 113" in r for r in reads), reads[:3]
    after = read_counts().since(before)
    assert after.total == 0, "packets left this machine: " + after.describe()


@pytest.mark.suite_end
def test_nothing_left_the_machine_during_the_run(egress_baseline: GuardCounts) -> None:
    """The last test of the session: the guard counted no packet for the whole run."""
    now = read_counts()
    if not now.installed:
        assert not default_route()[1], "the egress guard is gone while a default route exists"
        return
    sent = now.since(egress_baseline)
    record_final(sent)
    assert sent.total == 0, "packets left this machine: " + sent.describe()
