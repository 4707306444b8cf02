"""Pure: the LeaderWorkerSet of a multi-node replica (`spec.engine.pipelineParallelSize` > 1).

It wraps the one engine pod template of `render.deployment` twice, as leader and as worker; the
two differ only in their vLLM multi-node flags, the agent's role (`LLMOP_ROLE`) and the API port
(workers run vLLM headless). One LWS group is one replica; `replicas` counts groups.
"""

from __future__ import annotations

from typing import Any

from llmop import kinds, names
from llmop.api.v1alpha1 import LLMDeployment
from llmop.render.deployment import PodRole, pod_template
from llmop.render.hashing import template_hash
from llmop.render.metadata import child_metadata
from llmop.settings import RenderSettings
from llmop_engine import contract

LWS_LABEL_PREFIX = "leaderworkerset.sigs.k8s.io"
WORKER_INDEX_LABEL = names.LABEL_LWS_WORKER_INDEX
LEADER_SELECTOR = {WORKER_INDEX_LABEL: "0"}
"""Added to every selector that means "a replica" (Service, PDB): leaders only."""
LEADER_ADDRESS = "$(LWS_LEADER_ADDRESS)"
"""Expanded by the kubelet from the env the LWS pod webhook injects into every container."""
WORKER_INDEX = "$(LWS_WORKER_INDEX)"


def replica_selector(llmd: LLMDeployment) -> dict[str, str]:
    """Labels selecting the pods that each stand for one replica: every engine pod of a one-pod
    replica, the leader of a multi-node one."""
    selector = names.selector_labels(llmd.metadata.name)
    if llmd.spec.pipeline_parallel_size > 1:
        selector |= LEADER_SELECTOR
    return selector


def _role(llmd: LLMDeployment, *, leader: bool) -> PodRole:
    pods = str(llmd.spec.pipeline_parallel_size)
    flags = ["--pipeline-parallel-size", pods, "--nnodes", pods]
    flags += ["--node-rank", "0" if leader else WORKER_INDEX, "--master-addr", LEADER_ADDRESS]
    if not leader:
        flags.append("--headless")
    flags += ["--distributed-executor-backend", "mp"]
    # The agent's `role` setting (contract): the leader serves the API, a worker supervises a
    # headless rank.
    role_env = contract.row("role").env
    assert role_env is not None, "the engine contract's role setting has an env variable"
    env = ({"name": role_env, "value": "leader" if leader else "worker"},)
    return PodRole(engine_flags=flags, env=env, serves_api=leader)


def render_leader_worker_set(
    llmd: LLMDeployment,
    settings: RenderSettings,
    *,
    load_timeout_seconds: int,
    kv_cache_tokens: int | None = None,
) -> dict[str, Any]:
    """The LWS. Without `spec.replicas` when autoscaling is on: the HPA owns the group count."""
    spec = llmd.spec
    templates = {
        role: pod_template(
            llmd,
            settings,
            load_timeout_seconds=load_timeout_seconds,
            role=_role(llmd, leader=role == "leaderTemplate"),
            kv_cache_tokens=kv_cache_tokens,
        )
        for role in ("leaderTemplate", "workerTemplate")
    }
    digest = template_hash(templates)
    for template in templates.values():
        template["metadata"]["annotations"][names.ANNOTATION_TEMPLATE_HASH] = digest
    lws_spec: dict[str, Any] = {}
    if spec.autoscaling is None:
        lws_spec["replicas"] = spec.desired_fixed_replicas
    # Every field explicit: the controller dereferences what its defaulting webhook fills.
    lws_spec |= {
        "leaderWorkerTemplate": {
            "size": spec.pipeline_parallel_size,
            # A slow image pull or model download must not recreate the group over and over.
            "restartPolicy": "RecreateGroupAfterStart",
            **templates,
        },
        # LeaderReady deadlocks with vLLM: the leader's health waits for its workers.
        "startupPolicy": "LeaderCreated",
        # Whole groups: one fewer while rolling, never an extra multi-node group.
        "rolloutStrategy": {
            "type": "RollingUpdate",
            "rollingUpdateConfiguration": {"partition": 0, "maxUnavailable": 1, "maxSurge": 0},
        },
        # A headless Service per group, named after its leader pod (`<name>-<g>`): the shared
        # policy's one headless Service would be named after the LWS, `<name>`, the name the API
        # Service already has, and with that taken the leader's address never resolves.
        "networkConfig": {"subdomainPolicy": "UniquePerReplica"},
    }
    return {
        "apiVersion": kinds.LEADER_WORKER_SET.api_version,
        "kind": kinds.LEADER_WORKER_SET.kind,
        "metadata": {
            **child_metadata(llmd),
            "annotations": {names.ANNOTATION_TEMPLATE_HASH: digest},
        },
        "spec": lws_spec,
    }
