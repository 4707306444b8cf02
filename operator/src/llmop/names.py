"""Every name, label, annotation and port the operator puts on children and on its own records,
in one place."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llmop.api.v1alpha1 import GROUP
from llmop_engine import contract
from llmop_router import contract as router_contract

FIELD_MANAGER = "llmop"
"""Server-side apply field manager for everything the operator owns (its records aside)."""
HANDOVER_FIELD_MANAGER = "llmop-handover"
"""Field manager that hands `spec.replicas` over to the HPA when autoscaling turns on."""
RECORDS_FIELD_MANAGER = "llmop-operator"
"""Of the leader's own records, not a CR's children (FIELD_MANAGER): named after its Lease."""

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_DEPLOYMENT = f"{GROUP}/deployment"
LABEL_LWS_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
"""Set by the LeaderWorkerSet pod webhook: "0" on a group's leader, 1..size-1 on its workers."""
LABEL_LWS_GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
"""Set by the LeaderWorkerSet pod webhook on every pod of a group: the group's index."""
LABEL_LWS_TEMPLATE_HASH = "leaderworkerset.sigs.k8s.io/template-revision-hash"
"""Set by the LeaderWorkerSet controller on a group's pods: the template revision they run (a
rollout's new group has a new one; a group recreated after a failure keeps it)."""

APP_NAME = "llmop-engine"
MANAGED_BY = "llmop"
COMPONENT = "engine"
PRE_PULL_SUFFIX = "-prepull"
"""The pre-pull DaemonSet is `<name>-prepull` (spec.scheduling.prePullImage)."""
PRE_PULL_APP_NAME = "llmop-prepull"
PRE_PULL_COMPONENT = "prepull"
PRE_PULL_CONTAINER = "prepull"


def pre_pull_labels(name: str) -> dict[str, str]:
    """Labels of the pre-pull pods: their own, never the engine pods' (a Service, a
    PodMonitor, a NetworkPolicy or the operator's pod watch must not take them for engines)."""
    return {
        LABEL_NAME: PRE_PULL_APP_NAME,
        LABEL_INSTANCE: name,
        LABEL_COMPONENT: PRE_PULL_COMPONENT,
    }


ANNOTATION_TEMPLATE_HASH = f"{GROUP}/template-hash"
"""Hash of the rendered pod template; drift detection compares it."""
ANNOTATION_ADAPTERS_REVISION = f"{GROUP}/adapters-revision"
"""On an engine pod (never its template): the revision of the adapters ConfigMap the operator
last told the pod about (`<revision>.<resourceVersion>` after the operator undid an edit of the
ConfigMap). Changing it makes the kubelet sync the pod, which refreshes the mounted ConfigMap at
once instead of on its periodic sync (a minute or more)."""
ANNOTATION_ROLLOUT_ROOM = f"{GROUP}/rollout-room"
"""On an engine Deployment whose maxSurge the operator decides: `<template hash>/<engine pods
that fit beside the running ones>` as counted when that template's rollout started (`-`: not
counted, a new Deployment)."""
KOPF_PREFIX = GROUP
"""Prefix for kopf's own bookkeeping (progress, diff-base, finalizer) — never kopf.zalando.org."""

ENGINE_CONTAINER = "engine"
PROBE_PORT = contract.PROBE_PORT
"""The agent's probe port: the engine contract's, never a second literal."""
PROBE_PORT_NAME = router_contract.AGENT_PORT_NAME
API_PORT_NAME = router_contract.API_PORT_NAME
METRICS_PATH = contract.METRICS_PATH
QUEUE_DEPTH_METRIC = contract.QUEUE_DEPTH_METRIC
"""Per-pod gauge of waiting requests the HPA scales on (exposed by prometheus-adapter)."""

DEV_SHM_VOLUME = "dshm"
MODEL_CACHE_VOLUME = "model-cache"
MODEL_CACHE_PATH = "/models/cache"
PVC_MOUNT_ROOT = "/models/pvc"
AGENT_SOCKET_DIR = "/run/llmop"


def selector_labels(name: str) -> dict[str, str]:
    """Labels that select one LLMDeployment's engine pods (stable across rollouts)."""
    return {LABEL_NAME: APP_NAME, LABEL_INSTANCE: name, LABEL_DEPLOYMENT: name}


def child_labels(name: str) -> dict[str, str]:
    """Labels on every child: ours only, never copied from the parent (GitOps tracks by those)."""
    return {**selector_labels(name), LABEL_MANAGED_BY: MANAGED_BY, LABEL_COMPONENT: COMPONENT}


def record_config_map(name: str, namespace: str, data: Mapping[str, str]) -> dict[str, Any]:
    """The ConfigMap `name` holding `data`, one of the leader's records in the operator's own
    namespace (`llmop.name_owners`, `llmop.model_files_record`), for a server-side apply as
    RECORDS_FIELD_MANAGER. Labelled managed-by only: a record is no LLMDeployment's child, so it
    carries none of `child_labels`' selector labels."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {LABEL_MANAGED_BY: MANAGED_BY},
        },
        "data": dict(data),
    }


def selector_string(name: str) -> str:
    """`status.selector` for the scale subresource."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector_labels(name).items()))


def service_endpoint(name: str, namespace: str, port: int) -> str:
    """In-cluster base URL of the OpenAI-compatible API."""
    return f"http://{name}.{namespace}.svc:{port}/v1"
