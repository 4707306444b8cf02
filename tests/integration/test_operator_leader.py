"""Two `llmop run` processes under the operator's RBAC, against the real API server: one holds
the `llmop-operator` Lease and reconciles, the other waits as a healthy standby that writes
nothing; SIGKILL the leader while 100 LLMDeployments are being changed, and the standby takes
over within the lease, converges every one and leaves no orphan. Prints the failover time.

And one `llmop run` alone (`make dev`, `replicas: 1`) through an API-server outage longer than
its renew deadline: it loses the Lease, stands by in the same process, takes the Lease again
once the API server is back and converges every CR changed meanwhile, from fresh caches."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from support.cluster import wait_until
from support.manifests import simulator_spec as spec
from support.operator import OPERATOR_NAMESPACE, OperatorProcess
from support.outage import Mode, cuttable

if TYPE_CHECKING:
    from support.operator import Kit

pytestmark = pytest.mark.cluster

N = 100
FAILOVER_BOUND_S = 45.0
"""Generous for a loaded CI machine; the goal (client-go's 15 s lease) is what the note reports."""


def lease(kit: Kit) -> dict[str, Any]:
    found = kit.get("coordination.k8s.io/v1", "Lease", OPERATOR_NAMESPACE, "llmop-operator")
    assert found is not None
    return found


def healthy(process: OperatorProcess) -> bool:
    with urllib.request.urlopen(
        f"http://127.0.0.1:{process.liveness_port}/healthz", timeout=5
    ) as response:
        return bool(response.status == 200)


@pytest.fixture
def pair(operator_kubeconfig: Path, tmp_path: Path) -> Iterator[list[OperatorProcess]]:
    processes = [
        OperatorProcess(
            operator_kubeconfig,
            tmp_path / f"operator-{name}.log",
            extra_env={"POD_NAME": f"llmop-{name}"},
        )
        for name in ("a", "b")
    ]
    try:
        yield processes
    finally:
        for process in processes:
            process.stop()


def test_standby_takes_over_a_killed_leader_under_load(
    pair: list[OperatorProcess], kit: Kit, namespace: str
) -> None:
    first, second = pair
    first.start()
    wait_until(lambda: first.metric("llmop_leader") == 1, timeout=60, what="a leads")
    assert lease(kit)["spec"]["holderIdentity"].startswith("llmop-a_")
    second.start()
    time.sleep(3)  # a few of the standby's attempts
    assert second.metric("llmop_leader") == 0
    assert healthy(second), "a standby is healthy (Ready)"

    names = [f"m{i:03d}" for i in range(N)]
    for name in names:
        kit.apply_llmd(namespace, name, spec(replicas=1))
    wait_until(
        lambda: all(kit.deployment(namespace, n) is not None for n in names[-10:]),
        timeout=120,
        what="the first round's children",
    )

    # A second round of changes, still being applied when the leader dies.
    changing = threading.Thread(
        target=lambda: [kit.apply_llmd(namespace, n, spec(replicas=2)) for n in names],
        daemon=True,
    )
    changing.start()
    time.sleep(1.0)
    standby_writes = second.metric("llmop_child_writes_total")
    standby_status = second.metric("llmop_status_writes_total")
    assert first.process is not None
    first.process.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    first.process.wait()
    wait_until(
        lambda: second.metric("llmop_leader") == 1,
        timeout=FAILOVER_BOUND_S,
        interval=0.2,
        what="the standby leads",
    )
    failover = time.monotonic() - killed
    changing.join(timeout=120)
    assert lease(kit)["spec"]["holderIdentity"].startswith("llmop-b_")
    assert lease(kit)["spec"]["leaseTransitions"] >= 1

    started = time.monotonic()
    wait_until(
        lambda: converged(kit, namespace, names, 2),
        timeout=180,
        interval=1,
        what=f"all {N} converged after the failover",
    )
    converge = time.monotonic() - started
    deployments = kit.kube.list("apps/v1", "Deployment", namespace)
    parents = {o["metadata"]["uid"] for o in kit.kube.list(*LLMD, namespace)}
    owners = [ref["uid"] for d in deployments for ref in d["metadata"].get("ownerReferences") or []]
    assert len(deployments) == N, "one Deployment per LLMDeployment"
    assert len(owners) == N, "every Deployment has its owner"
    assert set(owners) <= parents, "no orphan"
    assert standby_writes == 0, "the standby applied children while not the leader"
    assert standby_status == 0, "the standby wrote status while not the leader"
    print(
        "\n"
        + json.dumps(
            {
                "failover_s": round(failover, 1),
                "converged_after_failover_s": round(converge, 1),
                "llmdeployments": N,
                "standby_child_writes_before": standby_writes,
            }
        )
    )
    assert failover < FAILOVER_BOUND_S


LLMD = ("serving.llmop.dev/v1alpha1", "LLMDeployment")

# Well under the 45 s a leader that held its Lease to the end would cost (30 s grace + 15 s
# lease); 6-8 s on an idle machine, over 15 s once in a fresh-clone run on a machine with CPU
# steal: the bound is what the test proves, not the machine's speed.
HANDOVER_BOUND_S = 30.0
"""A stopped leader releases the Lease on its way out: well inside one lease duration."""


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_leader_exits_and_hands_over_at_once(
    pair: list[OperatorProcess], kit: Kit, stop_signal: signal.Signals
) -> None:
    """What a pod deletion, a drain or `helm upgrade` does to the leader (SIGTERM), and Ctrl-C:
    it stops reconciling, releases the Lease and exits 0, and the standby leads well before the
    Lease would expire (a leader that kept renewing until the kubelet's SIGKILL held it 30 s +
    15 s)."""
    first, second = pair
    first.start()
    wait_until(lambda: first.metric("llmop_leader") == 1, timeout=60, what="a leads")
    second.start()
    assert first.process is not None
    process = first.process
    process.send_signal(stop_signal)
    stopped = time.monotonic()
    wait_until(
        lambda: second.metric("llmop_leader") == 1,
        timeout=HANDOVER_BOUND_S,
        interval=0.2,
        what="the standby leads",
    )
    handover = time.monotonic() - stopped
    assert process.wait(timeout=HANDOVER_BOUND_S) == 0
    exited = time.monotonic() - stopped
    assert lease(kit)["spec"]["holderIdentity"].startswith("llmop-b_")
    print(
        json.dumps(
            {
                "signal": stop_signal.name,
                "handover_s": round(handover, 1),
                "exit_s": round(exited, 1),
            }
        )
    )


OUTAGE_CRS = 10
OUTAGE_S = float(os.environ.get("LLMOP_TEST_OUTAGE_S", "15"))
"""How long each outage lasts (at least until the leader has stood down): past the renew
deadline (10 s); the operator must outlive 60 s (LLMOP_TEST_OUTAGE_S=60 shows it does, the
same way: a standby waits for as long as it takes)."""
CONVERGED_AFTER_OUTAGE_BOUND_S = 30.0
"""From the API server's return to every CR changed meanwhile converged (issue 48)."""


def converged(kit: Kit, namespace: str, names: list[str], replicas: int) -> bool:
    """Every CR's status is for its generation and its Deployment asks for `replicas`."""
    for name in names:
        obj = kit.get_llmd(namespace, name)
        deployment = kit.deployment(namespace, name)
        if obj is None or deployment is None:
            return False
        if (obj.get("status") or {}).get("observedGeneration") != obj["metadata"]["generation"]:
            return False
        if deployment["spec"].get("replicas") != replicas:
            return False
    return True


def test_a_lone_operator_outlives_api_server_outages_without_a_restart(
    operator_kubeconfig: Path, kit: Kit, namespace: str, tmp_path: Path
) -> None:
    """One `llmop run` (`make dev`, `replicas: 1`), its link to the API server cut twice while
    CRs change: first refused (an API server down or restarting), then a black hole (one that
    hangs: every request runs into its timeout). Each time the leader loses its Lease and
    stands by; once the API server is back the same process (same pid, never exited) leads
    again, from fresh caches, and converges the CRs changed during the outage and right after
    it within 30 s of the return."""
    with cuttable(operator_kubeconfig, tmp_path / "kubeconfig-cuttable") as (link, kubeconfig):
        process = OperatorProcess(
            kubeconfig, tmp_path / "operator.log", extra_env={"POD_NAME": "llmop-solo"}
        )
        process.start()
        try:
            assert process.process is not None
            pid = process.process.pid
            wait_until(lambda: process.metric("llmop_leader") == 1, timeout=60, what="it leads")
            names = [f"o{i:02d}" for i in range(OUTAGE_CRS)]
            for name in names:
                kit.apply_llmd(namespace, name, spec(replicas=1))
            wait_until(
                lambda: converged(kit, namespace, names, 1), timeout=60, what="the first round"
            )
            measured = []
            modes: tuple[Mode, ...] = ("refuse", "blackhole")
            for round_, mode in enumerate(modes, start=2):
                link.cut(mode)
                cut = time.monotonic()
                for name in names[::2]:  # changed as the outage begins
                    kit.apply_llmd(namespace, name, spec(replicas=round_))
                wait_until(
                    lambda: process.metric("llmop_leader") == 0,
                    timeout=45,
                    interval=0.2,
                    what=f"the leader stands down ({mode})",
                )
                stood_down = time.monotonic() - cut
                assert process.process.poll() is None, f"exited:\n{process.log_tail()}"
                for name in names[1::2]:  # changed while it stands by
                    kit.apply_llmd(namespace, name, spec(replicas=round_))
                time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - cut)))
                assert healthy(process), "a standby is healthy through the outage"
                link.restore()
                back = time.monotonic()
                late = f"late{round_}"  # created right after it
                kit.apply_llmd(namespace, late, spec(replicas=round_))
                wait_until(
                    lambda: converged(kit, namespace, [*names, late], round_),  # noqa: B023
                    timeout=CONVERGED_AFTER_OUTAGE_BOUND_S + 30,
                    interval=0.5,
                    what=f"every CR changed meanwhile converged ({mode})",
                )
                after_return = time.monotonic() - back
                assert process.process.poll() is None, f"exited:\n{process.log_tail()}"
                assert process.metric("llmop_leader") == 1
                measured.append(
                    {
                        "mode": mode,
                        "outage_s": round(back - cut, 1),
                        "stood_down_after_s": round(stood_down, 1),
                        "converged_after_return_s": round(after_return, 1),
                        "llmdeployments_changed": len(names) + 1,
                    }
                )
            assert process.process.pid == pid
            assert lease(kit)["spec"]["holderIdentity"].startswith("llmop-solo_")
            log = process.log_path.read_text()
            assert log.count("starting llmop operator") == 1, "the process started once"
            assert log.count("took the leader Lease") == 3, "three terms"
            assert log.count("lost the leader Lease: standing by") == 2
            assert "exiting (code 3)" not in log
            print("\n" + "\n".join(json.dumps(m) for m in measured))
            for m in measured:
                assert m["converged_after_return_s"] < CONVERGED_AFTER_OUTAGE_BOUND_S, m
        finally:
            process.stop()
