"""Multi-node replicas (spec.engine.pipelineParallelSize > 1): one LeaderWorkerSet that wraps the
Deployment's own pod template as leader and worker, and leader-only selectors."""

from __future__ import annotations

from typing import Any

import pytest

from llmop import kinds, names
from llmop.api.v1alpha1 import LLMDeployment
from llmop.render import Children, RenderSettings, render_children
from llmop_engine import contract

SETTINGS = RenderSettings(vllm_image="engine:1", simulator_image="sim:1")
LEADER = {"leaderworkerset.sigs.k8s.io/worker-index": "0"}
ROLE_ENV = contract.row("role").env


def render(pods: int, **spec: Any) -> Children:
    engine = {"pipelineParallelSize": pods, **spec.pop("engine", {})}
    body = {
        "metadata": {"name": "big", "namespace": "team"},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-405B-Instruct"},
            "resources": {"gpus": 8},
            "engine": engine,
            **spec,
        },
    }
    return render_children(LLMDeployment.model_validate(body), SETTINGS, load_timeout_seconds=900)


def lws(children: Children) -> dict[str, Any]:
    assert children.leader_worker_set is not None
    return children.leader_worker_set


def engine_container(template: dict[str, Any]) -> dict[str, Any]:
    (container,) = template["spec"]["containers"]
    assert container["name"] == names.ENGINE_CONTAINER
    return container


def engine_args(template: dict[str, Any]) -> list[str]:
    args: list[str] = engine_container(template)["args"]
    return args[args.index("--") + 1 :]


def test_one_pod_per_replica_is_a_deployment_and_no_lws() -> None:
    children = render(1, replicas=2)
    assert children.deployment is not None
    assert children.leader_worker_set is None
    assert "LeaderWorkerSet" not in [c["kind"] for c in children.wanted()]
    assert children.service["spec"]["selector"] == names.selector_labels("big")


def test_pipeline_parallel_renders_one_lws_and_no_deployment() -> None:
    children = render(2, replicas=3)
    assert children.deployment is None
    assert kinds.DEPLOYMENT not in children.unwanted()  # neither workload is deleted by the plan
    assert [c["kind"] for c in children.wanted()] == [
        "Service",
        "LeaderWorkerSet",
        "PodDisruptionBudget",
    ]
    body = lws(children)
    assert body["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    assert body["metadata"]["name"] == "big"
    spec = body["spec"]
    assert spec["replicas"] == 3
    group = spec["leaderWorkerTemplate"]
    assert group["size"] == 2
    assert group["restartPolicy"] == "RecreateGroupAfterStart"
    assert spec["startupPolicy"] == "LeaderCreated"
    assert spec["rolloutStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdateConfiguration": {"partition": 0, "maxUnavailable": 1, "maxSurge": 0},
    }
    # Not Shared: its headless Service would take the name of the API Service (the CR's name).
    assert spec["networkConfig"] == {"subdomainPolicy": "UniquePerReplica"}


def test_leader_and_worker_are_the_deployment_template_plus_their_role() -> None:
    single = render(1)
    assert single.deployment is not None
    base = single.deployment["spec"]["template"]
    group = lws(render(2))["spec"]["leaderWorkerTemplate"]
    leader, worker = group["leaderTemplate"], group["workerTemplate"]
    base_args = engine_args(base)
    user_tail = base_args.index(contract.EngineFlag.SHUTDOWN_TIMEOUT) + 2
    assert engine_args(leader) == [
        *base_args[:user_tail],
        *("--pipeline-parallel-size", "2", "--nnodes", "2", "--node-rank", "0"),
        *("--master-addr", "$(LWS_LEADER_ADDRESS)", "--distributed-executor-backend", "mp"),
        *base_args[user_tail:],
    ]
    assert engine_args(worker) == [
        *base_args[:user_tail],
        *("--pipeline-parallel-size", "2", "--nnodes", "2", "--node-rank", "$(LWS_WORKER_INDEX)"),
        *("--master-addr", "$(LWS_LEADER_ADDRESS)", "--headless"),
        *("--distributed-executor-backend", "mp"),
        *base_args[user_tail:],
    ]
    for template, role in ((leader, "leader"), (worker, "worker")):
        container = engine_container(template)
        assert container["env"][0] == {"name": ROLE_ENV, "value": role}
        assert container["env"][1:] == engine_container(base)["env"]
        # Same probes, drain, volumes and pod settings as the Deployment's: one template.
        for key in ("readinessProbe", "livenessProbe", "startupProbe", "lifecycle", "resources"):
            assert container[key] == engine_container(base)[key]
        pod = {k: v for k, v in template["spec"].items() if k != "containers"}
        assert pod == {k: v for k, v in base["spec"].items() if k != "containers"}
    # Workers run vLLM headless: no API port, only the agent's probe port.
    assert [p["name"] for p in engine_container(leader)["ports"]] == [
        names.API_PORT_NAME,
        names.PROBE_PORT_NAME,
    ]
    assert [p["name"] for p in engine_container(worker)["ports"]] == [names.PROBE_PORT_NAME]
    grace = "terminationGracePeriodSeconds"
    assert worker["spec"][grace] >= leader["spec"][grace]


def test_service_pdb_and_hpa_address_leaders_and_the_lws() -> None:
    children = render(2, autoscaling={"maxReplicas": 4})
    assert "replicas" not in lws(children)["spec"]  # the HPA owns the group count
    assert children.service["spec"]["selector"] == {**names.selector_labels("big"), **LEADER}
    assert children.pdb is not None
    assert children.pdb["spec"] == {
        "maxUnavailable": 1,
        "selector": {"matchLabels": {**names.selector_labels("big"), **LEADER}},
    }
    assert children.hpa is not None
    assert children.hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "name": "big",
    }


@pytest.mark.parametrize("change", [{"engine": {"maxModelLen": 4096}}, {"replicas": 5}])
def test_template_hash_covers_both_templates_only(change: dict[str, Any]) -> None:
    before = lws(render(2))
    after = lws(render(2, **change))
    digest = before["metadata"]["annotations"][names.ANNOTATION_TEMPLATE_HASH]
    group = before["spec"]["leaderWorkerTemplate"]
    for role in ("leaderTemplate", "workerTemplate"):
        assert group[role]["metadata"]["annotations"][names.ANNOTATION_TEMPLATE_HASH] == digest
    changed = after["metadata"]["annotations"][names.ANNOTATION_TEMPLATE_HASH] != digest
    assert changed == ("engine" in change)
