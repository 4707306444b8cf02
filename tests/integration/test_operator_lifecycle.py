"""The operator against the real API server: create → children → Ready, rollouts, stalls,
scale subresource, drift repair and garbage collection. One `llmop run` for the module (under
the RBAC of deploy/rbac.yaml), each test in its own namespace."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pytest

from support.cluster import wait_until
from support.manifests import H100
from support.manifests import simulator_spec as spec

if TYPE_CHECKING:
    from support.operator import Kit, OperatorProcess

pytestmark = pytest.mark.cluster

API_VERSION = "serving.llmop.dev/v1alpha1"


def conds(obj: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in ((obj or {}).get("status") or {}).get("conditions") or []}


def assert_no_finalizers_and_no_annotations(obj: dict[str, Any]) -> None:
    metadata = obj["metadata"]
    assert not metadata.get("finalizers")
    # The tests set no annotations, and kopf writes none on an object whose handler succeeded
    # at once: its diff base lives in the operator (llmop.persistence), and its progress
    # records, under our own prefix, only while a handler retries.
    assert (metadata.get("annotations") or {}) == {}


def test_create_reaches_ready_with_owned_children(
    operator: OperatorProcess, kit: Kit, namespace: str
) -> None:
    body = {
        "apiVersion": API_VERSION,
        "kind": "LLMDeployment",
        "metadata": {
            "name": "chat",
            "namespace": namespace,
            # A GitOps tool's tracking label on the parent must not leak onto children.
            "labels": {"app.kubernetes.io/instance": "gitops-app", "team": "ml"},
        },
        "spec": spec(replicas=2),
    }
    kit.kube.apply(body, field_manager="llmop-tests")
    ready = kit.wait_condition(namespace, "chat", "Ready", "True", timeout=60)
    uid = ready["metadata"]["uid"]

    for api_version, kind in [
        ("apps/v1", "Deployment"),
        ("v1", "Service"),
        ("policy/v1", "PodDisruptionBudget"),
    ]:
        child = kit.get(api_version, kind, namespace, "chat")
        assert child is not None, kind
        (ref,) = child["metadata"]["ownerReferences"]
        assert (ref["uid"], ref["controller"], ref["kind"]) == (uid, True, "LLMDeployment")
        labels = child["metadata"]["labels"]
        assert labels["app.kubernetes.io/managed-by"] == "llmop"
        assert labels["app.kubernetes.io/instance"] == "chat"
        assert "team" not in labels
    assert kit.get("autoscaling/v2", "HorizontalPodAutoscaler", namespace, "chat") is None

    status = ready["status"]
    got = conds(ready)
    assert got["Reconciling"]["status"] == "False"
    assert got["Stalled"]["status"] == "False"
    assert got["CapacityPlanned"]["status"] == "True"
    assert all(c["observedGeneration"] == ready["metadata"]["generation"] for c in got.values())
    assert (status["replicas"], status["readyReplicas"], status["updatedReplicas"]) == (2, 2, 2)
    assert status["endpoint"] == f"http://chat.{namespace}.svc:8000/v1"
    assert "app.kubernetes.io/instance=chat" in status["selector"]
    assert status["plan"]["fits"] is True
    assert_no_finalizers_and_no_annotations(ready)

    waited = kit.cluster.kubectl(
        "wait", "--for=condition=Ready", "llmd/chat", "-n", namespace, "--timeout=30s"
    )
    assert "condition met" in waited.stdout
    table = kit.cluster.kubectl("get", "llmd", "chat", "-n", namespace).stdout.splitlines()
    assert table[0].split()[:5] == ["NAME", "MODEL", "READY", "REPLICAS", "ENDPOINT"]
    assert table[1].split()[:5] == [
        "chat",
        "Qwen/Qwen2.5-0.5B-Instruct",
        "True",
        "2/2",
        f"http://chat.{namespace}.svc:8000/v1",
    ]
    wide = kit.cluster.kubectl("get", "llmd", "chat", "-n", namespace, "-o", "wide").stdout
    assert "AllReplicasReady" in wide


def test_spec_change_reconciles_until_rolled_out(
    operator: OperatorProcess, kit: Kit, namespace: str
) -> None:
    kit.apply_llmd(namespace, "roll", spec(replicas=1))
    first = kit.wait_condition(namespace, "roll", "Ready", "True", timeout=60)
    first_hash = kit.deployment(namespace, "roll")["metadata"]["annotations"]  # type: ignore[index]

    # The new template needs a GPU product no node has: the rollout cannot finish, the old
    # replica keeps serving (maxUnavailable 0), and the CR says so.
    kit.apply_llmd(
        namespace,
        "roll",
        spec(replicas=1, resources={"gpus": 1, "gpuProduct": "NVIDIA-A100-SXM4-80GB"}),
    )
    stuck = kit.wait_condition(namespace, "roll", "Reconciling", "True", timeout=30)
    assert stuck["metadata"]["generation"] == first["metadata"]["generation"] + 1
    assert conds(stuck)["Ready"]["status"] == "False"
    assert conds(stuck)["Reconciling"]["reason"] == "RollingOut"
    assert conds(stuck)["Stalled"]["status"] == "False"

    kit.apply_llmd(
        namespace, "roll", spec(replicas=1, engine={"backend": "simulator", "maxNumSeqs": 64})
    )
    done = kit.wait_condition(namespace, "roll", "Ready", "True", timeout=60)
    assert done["status"]["observedGeneration"] == first["metadata"]["generation"] + 2
    assert conds(done)["Reconciling"]["status"] == "False"
    assert conds(done)["Ready"]["lastTransitionTime"] >= conds(first)["Ready"]["lastTransitionTime"]
    deployment = kit.deployment(namespace, "roll")
    assert deployment is not None
    assert deployment["metadata"]["annotations"] != first_hash
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "64" in args
    events = kit.cluster.kubectl(
        "get",
        "events",
        "-n",
        namespace,
        "--field-selector",
        "involvedObject.name=roll",
        "-o",
        "jsonpath={.items[*].reason}",
    ).stdout.split()
    assert "Ready" in events
    assert "RollingOut" in events


def test_plan_that_does_not_fit_stalls_without_pods_or_retries(
    operator: OperatorProcess, kit: Kit, namespace: str
) -> None:
    kit.apply_llmd(
        namespace,
        "huge",
        spec(
            model={"name": "meta-llama/Llama-3.1-70B-Instruct"},
            engine={"backend": "vllm"},
            replicas=1,
        ),
    )
    stalled = kit.wait_condition(namespace, "huge", "Stalled", "True", timeout=30)
    got = conds(stalled)
    assert got["Stalled"]["reason"] == "WeightsExceedMemory"
    assert "does not fit" in got["Stalled"]["message"]
    assert got["CapacityPlanned"]["status"] == "False"
    assert got["Ready"]["status"] == "False"
    assert got["Reconciling"]["status"] == "False"
    assert stalled["status"]["plan"]["fits"] is False
    assert kit.deployment(namespace, "huge") is None
    pods = kit.kube.list("v1", "Pod", namespace)
    assert pods == []
    # No retry storm: nothing rewrites the object while the spec stays the same.
    version = stalled["metadata"]["resourceVersion"]
    time.sleep(4)
    again = kit.get_llmd(namespace, "huge")
    assert again is not None
    assert again["metadata"]["resourceVersion"] == version
    assert_no_finalizers_and_no_annotations(again)


def test_child_the_api_server_rejects_stalls(
    operator: OperatorProcess, kit: Kit, namespace: str
) -> None:
    # `cpu` is int-or-string in the CRD, so only the Deployment's own validation catches this.
    kit.apply_llmd(
        namespace, "badcpu", spec(resources={"gpus": 1, "gpuProduct": H100, "cpu": "lots"})
    )
    stalled = kit.wait_condition(namespace, "badcpu", "Stalled", "True", timeout=30)
    assert conds(stalled)["Stalled"]["reason"] == "ChildRejected"
    assert "Deployment" in conds(stalled)["Stalled"]["message"]
    assert kit.deployment(namespace, "badcpu") is None


def test_scale_subresource_sets_replicas(
    operator: OperatorProcess, kit: Kit, namespace: str
) -> None:
    kit.apply_llmd(namespace, "scaled", spec(replicas=1))
    kit.wait_condition(namespace, "scaled", "Ready", "True", timeout=60)
    kit.cluster.kubectl("scale", "llmd/scaled", "-n", namespace, "--replicas=3")
    wait_until(
        lambda: (
            (kit.get_llmd(namespace, "scaled") or {}).get("status", {}).get("readyReplicas") == 3
        ),
        timeout=60,
        what="3 ready replicas",
    )
    ready = kit.wait_condition(namespace, "scaled", "Ready", "True", timeout=30)
    assert ready["status"]["replicaSummary"] == "3/3"
    assert kit.deployment(namespace, "scaled")["spec"]["replicas"] == 3  # type: ignore[index]
    # The PDB appears once more than one replica can exist.
    assert kit.get("policy/v1", "PodDisruptionBudget", namespace, "scaled") is not None


def test_drift_is_repaired_within_ten_seconds(
    operator: OperatorProcess, kit: Kit, namespace: str
) -> None:
    kit.apply_llmd(namespace, "drift", spec(replicas=1))
    kit.wait_condition(namespace, "drift", "Ready", "True", timeout=60)
    original = kit.deployment(namespace, "drift")
    assert original is not None

    kit.kube.delete("apps/v1", "Deployment", namespace, "drift")
    started = time.monotonic()
    recreated = wait_until(
        lambda: (
            (d := kit.deployment(namespace, "drift"))
            and d["metadata"]["uid"] != original["metadata"]["uid"]
            and d
        ),
        timeout=10,
        interval=0.2,
        what="Deployment recreated",
    )
    assert time.monotonic() - started < 10
    assert recreated["metadata"]["ownerReferences"][0]["kind"] == "LLMDeployment"

    # Someone edits a field we own (a different manager, forced): it comes back.
    kit.cluster.kubectl(
        "patch",
        "deployment",
        "drift",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec":{"replicas":4,"revisionHistoryLimit":9}}',
    )
    wait_until(
        lambda: (
            (d := kit.deployment(namespace, "drift"))
            and d["spec"]["replicas"] == 1
            and d["spec"]["revisionHistoryLimit"] == 3
        ),
        timeout=10,
        interval=0.2,
        what="Deployment restored",
    )
    kit.cluster.kubectl(
        "patch",
        "service",
        "drift",
        "-n",
        namespace,
        "--type=json",
        "-p",
        '[{"op":"replace","path":"/spec/ports/0/targetPort","value":9999},'
        '{"op":"replace","path":"/spec/selector/app.kubernetes.io~1instance","value":"other"}]',
    )
    wait_until(
        lambda: (
            (s := kit.get("v1", "Service", namespace, "drift"))
            and s["spec"]["ports"][0]["targetPort"] == "http"
            and s["spec"]["selector"]["app.kubernetes.io/instance"] == "drift"
        ),
        timeout=10,
        interval=0.2,
        what="Service restored",
    )
    kit.kube.delete("v1", "Service", namespace, "drift")
    wait_until(
        lambda: kit.get("v1", "Service", namespace, "drift"),
        timeout=10,
        interval=0.2,
        what="Service recreated",
    )
    kit.wait_condition(namespace, "drift", "Ready", "True", timeout=30)


def test_delete_garbage_collects_children(
    operator: OperatorProcess, kit: Kit, namespace: str
) -> None:
    kit.apply_llmd(namespace, "gone", spec(replicas=2))
    ready = kit.wait_condition(namespace, "gone", "Ready", "True", timeout=60)
    assert_no_finalizers_and_no_annotations(ready)
    kit.kube.delete(API_VERSION, "LLMDeployment", namespace, "gone")
    wait_until(
        lambda: all(
            kit.get(api_version, kind, namespace, "gone") is None
            for api_version, kind in [
                ("apps/v1", "Deployment"),
                ("v1", "Service"),
                ("policy/v1", "PodDisruptionBudget"),
            ]
        ),
        timeout=60,
        what="children garbage-collected",
    )
    # And the operator did not resurrect any of them afterwards.
    time.sleep(2)
    assert kit.deployment(namespace, "gone") is None
    assert kit.get_llmd(namespace, "gone") is None


def test_operator_log_has_no_tracebacks(operator: OperatorProcess) -> None:
    text = operator.log_path.read_text(errors="replace")
    assert "Traceback" not in text


def test_pre_pull_daemon_set_follows_the_field_and_reports_the_nodes(
    operator: OperatorProcess, kit: Kit, namespace: str
) -> None:
    kit.apply_llmd(namespace, "pulled", spec(replicas=1, scheduling={"prePullImage": True}))

    def daemon_set() -> dict[str, Any] | None:
        return kit.get("apps/v1", "DaemonSet", namespace, "pulled-prepull")

    created = wait_until(daemon_set, timeout=30, interval=0.2, what="the pre-pull DaemonSet")
    owner = created["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("LLMDeployment", "pulled", True)
    engine = kit.deployment(namespace, "pulled")
    assert engine is not None
    image = engine["spec"]["template"]["spec"]["containers"][0]["image"]
    assert created["spec"]["template"]["spec"]["containers"][0]["image"] == image

    def pre_pull() -> dict[str, Any]:
        found: dict[str, Any] = (kit.get_llmd(namespace, "pulled") or {}).get("status", {})
        return found.get("prePull") or {}

    # The cluster's DaemonSet controller places one pod per node; the status counts them.
    done = wait_until(
        lambda: (p := pre_pull()).get("nodes", 0) > 0 and p.get("pulled") == p["nodes"] and p,
        timeout=60,
        interval=0.5,
        what="status.prePull with every node pulled",
    )
    assert done["message"] == f"image on {done['nodes']} of {done['nodes']} nodes"
    # Drift is undone like any child's.
    kit.cluster.kubectl(
        "patch",
        "daemonset",
        "pulled-prepull",
        "-n",
        namespace,
        "--type=json",
        "-p",
        '[{"op":"replace","path":"/spec/template/spec/containers/0/args","value":["x"]}]',
    )
    wait_until(
        lambda: (
            (d := daemon_set())
            and d["spec"]["template"]["spec"]["containers"][0]["args"] == ["hold"]
        ),
        timeout=20,
        interval=0.2,
        what="the DaemonSet restored",
    )
    kit.apply_llmd(namespace, "pulled", spec(replicas=1))
    wait_until(lambda: daemon_set() is None, timeout=30, interval=0.2, what="DaemonSet deleted")
    wait_until(lambda: not pre_pull(), timeout=30, interval=0.2, what="status.prePull cleared")
