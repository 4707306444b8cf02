"""A NetworkPolicy enforcer on the real node, for the tests that prove the NetworkPolicies llmop
ships where they are enforced: kube-proxy enforces none, so the e2e tests run kube-router with
only its NetworkPolicy controller on (`--run-firewall`; no routing, no service proxy), built from
Go modules by e2e/cluster/build-kube-router.sh. It programs iptables (filter table) and ipsets:
traffic to a pod that a policy selects and that no policy admits is rejected; traffic from the
pod's own node is always admitted (the kubelet's probes).

`enforcing` starts it for a block and then removes everything it put on the host: kube-router's
own `--cleanup-config` does not (in v2.1.0 it reports success and leaves every chain, then
panics in the service proxy's cleanup), so its chains, its jumps and its ipsets are removed here,
and the block fails if any is left. kube-proxy's chains are never touched (theirs are named
KUBE-SERVICES, KUBE-SVC-…, none of kube-router's prefixes).

`connects` asks from inside a pod (`kubectl exec`, python3 in the image) whether TCP connections
to addresses open: "open", "refused" or "timeout" each."""

from __future__ import annotations

import itertools
import json
import re
import shlex
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from support.cluster import REPO_ROOT, Cluster

BUILD = REPO_ROOT / "e2e" / "cluster" / "build-kube-router.sh"
CHAINS = re.compile(r"^(KUBE-ROUTER-|KUBE-POD-FW-|KUBE-NWPLCY-)")
"""kube-router's NetworkPolicy chains in the filter table."""
JUMPS_FROM = ("INPUT", "FORWARD", "OUTPUT")
READY_LINE = "sync iptables took"
"""Logged at the end of each full sync of the policies into iptables."""

PROBE = """
import json, socket, sys
found = {}
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    sock = socket.socket()
    sock.settimeout(2)
    try:
        sock.connect((host, int(port)))
        found[target] = "open"
    except socket.timeout:
        found[target] = "timeout"
    except OSError:
        found[target] = "refused"
    finally:
        sock.close()
print(json.dumps(found))
"""


def binary() -> Path:
    """kube-router, built (or reused from ~/.cache/llmop) by its build script."""
    out = subprocess.run([str(BUILD)], check=True, capture_output=True, text=True).stdout
    return Path(out.strip().splitlines()[-1]) / "kube-router"


@contextmanager
def enforcing(cluster: Cluster, node: str, log: Path, timeout: float = 60) -> Iterator[None]:
    """kube-router enforcing the cluster's NetworkPolicies on `node` while the block runs (its
    first full sync done when the block starts); everything it added removed afterwards."""
    sets_before = set(_ipsets())
    with log.open("ab") as out:
        process = subprocess.Popen(
            [
                str(binary()),
                *("--run-firewall=true", "--run-router=false", "--run-service-proxy=false"),
                *("--kubeconfig", str(cluster.kubeconfig), "--hostname-override", node),
                *("--health-port", "0", "--metrics-port", "0", "-v", "1"),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + timeout
        while READY_LINE not in log.read_text(errors="replace"):
            if process.poll() is not None:
                raise AssertionError(f"kube-router exited {process.returncode}; log: {log}")
            if time.monotonic() > deadline:
                raise AssertionError(f"kube-router did not sync in {timeout:.0f} s; log: {log}")
            time.sleep(0.2)
        yield
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        left = clean(sets_before)
    # Only when the block passed: a failure inside it is the one to report.
    assert not left, f"kube-router left on the host: {left}"


def clean(sets_before: set[str]) -> list[str]:
    """Remove kube-router's jumps, chains and ipsets (those not there before it started); what
    could not be removed."""
    for chain in JUMPS_FROM:
        for rule in _rules(chain):
            if "kube-router netpol" in rule or _jumps_to_ours(rule):
                spec = shlex.split(rule)[2:]  # "-A CHAIN ..." → the rule's match and target
                _iptables("-D", chain, *spec)
    ours = [c for c in _chains() if CHAINS.match(c)]
    for chain in ours:
        _iptables("-F", chain)
    for chain in ours:
        _iptables("-X", chain)
    for name in sorted(set(_ipsets()) - sets_before):
        subprocess.run(["ipset", "destroy", name], check=False, capture_output=True)
    left = [c for c in _chains() if CHAINS.match(c)]
    left += [f"ipset {s}" for s in set(_ipsets()) - sets_before]
    return left


def connects(
    cluster: Cluster, namespace: str, pod: str, targets: Sequence[str], container: str = ""
) -> dict[str, str]:
    """From inside `pod`: each "ip:port" of `targets` → "open", "refused" or "timeout"."""
    where = ["-c", container] if container else []
    out = cluster.kubectl(
        "exec", "-n", namespace, pod, *where, "--", "python3", "-c", PROBE, *targets
    ).stdout
    found: dict[str, str] = json.loads(out.strip().splitlines()[-1])
    return found


def _jumps_to_ours(rule: str) -> bool:
    words = shlex.split(rule)
    return any(w == "-j" and CHAINS.match(t) for w, t in itertools.pairwise(words))


def _iptables(*args: str) -> None:
    subprocess.run(["iptables", "-w", "5", "-t", "filter", *args], check=False)


def _rules(chain: str) -> list[str]:
    out = subprocess.run(
        ["iptables", "-w", "5", "-t", "filter", "-S", chain],
        check=False,
        capture_output=True,
        text=True,
    ).stdout
    return [line for line in out.splitlines() if line.startswith("-A ")]


def _chains() -> list[str]:
    out = subprocess.run(
        ["iptables", "-w", "5", "-t", "filter", "-S"], check=False, capture_output=True, text=True
    ).stdout
    return [line.split()[1] for line in out.splitlines() if line.startswith("-N ")]


def _ipsets() -> list[str]:
    out = subprocess.run(["ipset", "list", "-n"], check=False, capture_output=True, text=True)
    return out.stdout.split()
