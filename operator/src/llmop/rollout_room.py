"""Pure: the rolling-update strategy of an engine Deployment whose `spec.rollout.maxSurge` the user
left unset, decided from the room on the nodes its pods can run on.

A fixed surge is wrong both ways on GPU nodes. On a full pool a surge pod can never be scheduled,
and with maxUnavailable 0 no old pod is ever removed: the rollout waits until its progress
deadline. On a pool with room, one pod at a time leaves spare GPUs idle while each step waits for
a pod start. So when a rollout starts (a new pod template) the operator counts how many more
engine pods fit — per matching node, allocatable minus the requests of the pods bound to it, the
way the scheduler counts — and surges that many (at most a second full copy); with no room at all
it replaces pods one at a time (maxUnavailable at least 1) instead of waiting forever — unless
no matching node could hold a new pod even with the old ones gone (a GPU product no node has):
then the old pods keep serving and the new one waits, as with a fixed surge.

The count is stored on the Deployment (annotation `serving.llmop.dev/rollout-room`, keyed by the
template hash it was measured for), so every later pass of the same template — the child path's
repairs included, which do no I/O — renders the same strategy, and a user's change of
maxUnavailable still applies at once.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from llmop import names
from llmop.desired import DesiredState
from llmop.quantity import quantity_value
from llmop.render.deployment import DEFAULT_MAX_SURGE

UNMEASURED = "-"
"""The annotation's count when nothing was measured (a new Deployment: nothing rolls yet)."""

_EPSILON = 1e-9


@dataclass(frozen=True)
class Strategy:
    """A Deployment's rollingUpdate values and why."""

    max_surge: int
    max_unavailable: int
    room: int | None
    """Engine pods that fit beside the running ones when measured; None: not measured."""


# ----------------------------------------------------------------------------------------------
# Requests and room


def pod_requests(pod_spec: Mapping[str, Any]) -> dict[str, float]:
    """What the scheduler reserves for one pod: per resource, the larger of the containers' sum
    and the largest init container, plus the pod overhead; a container's limit stands in for a
    request it does not set (the API server defaults it so); every pod takes one `pods` slot."""

    def of(container: Mapping[str, Any]) -> dict[str, float]:
        resources = container.get("resources") or {}
        merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        values = {key: quantity_value(value) for key, value in merged.items()}
        return {key: value for key, value in values.items() if value}

    total: dict[str, float] = {}
    for container in pod_spec.get("containers") or []:
        for key, value in of(container).items():
            total[key] = total.get(key, 0.0) + value
    for container in pod_spec.get("initContainers") or []:
        for key, value in of(container).items():
            total[key] = max(total.get(key, 0.0), value)
    for key, value in (pod_spec.get("overhead") or {}).items():
        parsed = quantity_value(value)
        if parsed:
            total[key] = total.get(key, 0.0) + parsed
    total["pods"] = 1.0
    return total


def _expression_matches(expression: Mapping[str, Any], value: str | None) -> bool:
    operator = expression.get("operator")
    values = [str(v) for v in expression.get("values") or []]
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and values:
        try:
            have, bound = int(value), int(values[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


def _term_matches(term: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    labels = (node.get("metadata") or {}).get("labels") or {}
    fields = {"metadata.name": (node.get("metadata") or {}).get("name")}
    expressions = term.get("matchExpressions") or []
    field_expressions = term.get("matchFields") or []
    if not expressions and not field_expressions:
        return False  # the scheduler: an empty term matches no node
    return all(_expression_matches(e, labels.get(e.get("key"))) for e in expressions) and all(
        _expression_matches(e, fields.get(e.get("key"))) for e in field_expressions
    )


def _tolerated(taint: Mapping[str, Any], tolerations: Iterable[Mapping[str, Any]]) -> bool:
    for toleration in tolerations:
        effect = toleration.get("effect")
        if effect and effect != taint.get("effect"):
            continue
        key = toleration.get("key")
        if toleration.get("operator") == "Exists":
            if not key or key == taint.get("key"):
                return True
        elif key == taint.get("key") and (toleration.get("value") or "") == (
            taint.get("value") or ""
        ):
            return True
    return False


def node_matches(pod_spec: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Whether the scheduler could place the pod on `node`, leaving resources aside: not
    cordoned, every NoSchedule/NoExecute taint tolerated, the nodeSelector and the required node
    affinity (any of its terms) met."""
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    tolerations = pod_spec.get("tolerations") or []
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(
            taint, tolerations
        ):
            return False
    labels = (node.get("metadata") or {}).get("labels") or {}
    for key, value in (pod_spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return False
    required = (
        ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        or {}
    ).get("nodeSelectorTerms")
    return not required or any(_term_matches(term, node) for term in required)


def room(
    pod_spec: Mapping[str, Any],
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
) -> int:
    """How many more pods of `pod_spec` fit on the matching `nodes` beside `pods` (every pod in
    the cluster that is not finished; terminating ones still hold what they requested)."""
    wanted = pod_requests(pod_spec)
    used: dict[str, dict[str, float]] = {}
    for pod in pods:
        node_name = (pod.get("spec") or {}).get("nodeName")
        if not node_name or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        on_node = used.setdefault(node_name, {})
        for key, value in pod_requests(pod.get("spec") or {}).items():
            on_node[key] = on_node.get(key, 0.0) + value
    fits = 0
    for node in nodes:
        if not node_matches(pod_spec, node):
            continue
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        on_node = used.get((node.get("metadata") or {}).get("name") or "", {})
        slots: int | None = None
        for key, need in wanted.items():
            have = quantity_value(allocatable.get(key, 0)) or 0.0
            free = have - on_node.get(key, 0.0)
            count = max(0, math.floor((free + _EPSILON) / need))
            slots = count if slots is None else min(slots, count)
        fits += slots or 0
    return fits


def room_for_rollout(
    pod_spec: Mapping[str, Any],
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    own: Callable[[Mapping[str, Any]], bool],
) -> int | None:
    """The room a rollout decides from: the pods of `pod_spec` that fit now. None when none fits
    now and none would even once the Deployment's `own` old pods are gone (no matching node can
    hold one: replacing the old pods one at a time would only stop them serving, so the rollout
    keeps the default surge, its new pod Pending, until the progress deadline reports it)."""
    pods = list(pods)
    now = room(pod_spec, nodes, pods)
    if now > 0:
        return now
    freed = room(pod_spec, nodes, [pod for pod in pods if not own(pod)])
    return 0 if freed > 0 else None


# ----------------------------------------------------------------------------------------------
# The strategy


def decide(replicas: int, max_unavailable: int, measured: int | None) -> Strategy:
    """The strategy for `replicas` pods when `measured` more fit (None: not measured)."""
    if measured is None:
        return Strategy(DEFAULT_MAX_SURGE, max_unavailable, None)
    if measured <= 0:
        return Strategy(0, max(max_unavailable, 1), 0)
    return Strategy(min(measured, max(replicas, 1)), max_unavailable, measured)


def _annotation(deployment: Mapping[str, Any] | None) -> tuple[str, int | None] | None:
    """(template hash, measured room) from a live Deployment's annotation, if it has one."""
    if deployment is None:
        return None
    value = ((deployment.get("metadata") or {}).get("annotations") or {}).get(
        names.ANNOTATION_ROLLOUT_ROOM
    )
    if not isinstance(value, str) or "/" not in value:
        return None
    digest, _, count = value.rpartition("/")
    if count == UNMEASURED:
        return digest, None
    return (digest, int(count)) if count.isdigit() else None


def decided_deployment(desired: DesiredState) -> dict[str, Any] | None:
    """The Deployment whose surge the operator decides (rendered, maxSurge unset), else None."""
    children = desired.children
    if children is None or desired.llmd.spec.rollout.max_surge is not None:
        return None
    return children.deployment


def needs_measuring(desired: DesiredState, live_deployment: Mapping[str, Any] | None) -> bool:
    """Whether applying `desired` starts a rollout whose room is not known yet: the operator
    decides the surge, a Deployment with another pod template exists, and the room was not
    counted for this template."""
    if decided_deployment(desired) is None or live_deployment is None:
        return False
    annotations = (live_deployment.get("metadata") or {}).get("annotations") or {}
    if annotations.get(names.ANNOTATION_TEMPLATE_HASH) == desired.template_hash:
        return False  # no rollout starts
    known = _annotation(live_deployment)
    return known is None or known[0] != desired.template_hash


def pod_spec_of(deployment: Mapping[str, Any]) -> Mapping[str, Any]:
    """The engine pod spec the room is counted for."""
    spec: Mapping[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def strategy_for(
    desired: DesiredState,
    live_deployment: Mapping[str, Any] | None,
    measured: int | None = None,
) -> Strategy | None:
    """The strategy from `measured` (a fresh count), else from the live Deployment's annotation
    for the same template, else unmeasured; None when the user set maxSurge."""
    if decided_deployment(desired) is None:
        return None
    if measured is None:
        known = _annotation(live_deployment)
        if known is not None and known[0] == desired.template_hash:
            measured = known[1]
    spec = desired.llmd.spec
    replicas = spec.desired_fixed_replicas if spec.autoscaling is None else None
    if replicas is None:
        replicas = int(((live_deployment or {}).get("spec") or {}).get("replicas") or 1)
    return decide(replicas, spec.rollout.max_unavailable, measured)


def with_strategy(
    desired: DesiredState,
    live_deployment: Mapping[str, Any] | None,
    measured: int | None = None,
) -> DesiredState:
    """`desired` with the Deployment's rollingUpdate and the room annotation from
    `strategy_for`; unchanged when the user set maxSurge."""
    rendered = decided_deployment(desired)
    strategy = strategy_for(desired, live_deployment, measured)
    if rendered is None or strategy is None or desired.children is None:
        return desired
    count = UNMEASURED if strategy.room is None else str(strategy.room)
    metadata = dict(rendered["metadata"])
    metadata["annotations"] = {
        **(metadata.get("annotations") or {}),
        names.ANNOTATION_ROLLOUT_ROOM: f"{desired.template_hash or ''}/{count}",
    }
    rolling = {"maxSurge": strategy.max_surge, "maxUnavailable": strategy.max_unavailable}
    deployment = {
        **rendered,
        "metadata": metadata,
        "spec": {
            **rendered["spec"],
            "strategy": {"type": "RollingUpdate", "rollingUpdate": rolling},
        },
    }
    return desired.with_children(dataclasses.replace(desired.children, deployment=deployment))
