"""The rollout room on the parent path: when applying a new pod template starts a rollout of a
Deployment whose surge the operator decides, count the engine pods that fit on the matching
nodes (one list of Nodes, one of unfinished Pods) and decide the strategy from the count; every
other pass, the child path's included, reuses the count stored on the Deployment
(`llmop.rollout_room`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from llmop import events, names, rollout_room
from llmop.desired import DesiredState
from llmop.kube import KubeError
from llmop.reconcile.context import Context, post_event

log = logging.getLogger("llmop.reconcile.rollouts")

REASON_ROLLOUT_STRATEGY = "RolloutStrategy"
UNFINISHED_PODS = "status.phase!=Succeeded,status.phase!=Failed"


def _count(ctx: Context, deployment: Mapping[str, Any]) -> tuple[int | None, bool]:
    """(the room, whether it was counted): None counted means no matching node could hold a
    new pod even with the old ones gone."""
    try:
        nodes = ctx.kube.list("v1", "Node")
        pods = ctx.kube.list("v1", "Pod", field_selector=UNFINISHED_PODS)
    except KubeError as error:
        # Without the count the rollout surges the default, as a fixed maxSurge would.
        log.warning("could not count the room on the nodes for a rollout: %s", error)
        return None, False
    metadata = deployment["metadata"]

    def own(pod: Mapping[str, Any]) -> bool:
        pod_metadata = pod.get("metadata") or {}
        labels = pod_metadata.get("labels") or {}
        return bool(
            pod_metadata.get("namespace") == metadata.get("namespace")
            and labels.get(names.LABEL_DEPLOYMENT) == metadata.get("name")
        )

    spec = rollout_room.pod_spec_of(deployment)
    return rollout_room.room_for_rollout(spec, nodes, pods, own), True


def decided(
    ctx: Context,
    body: Mapping[str, Any],
    desired: DesiredState,
    live_deployment: Mapping[str, Any] | None,
) -> DesiredState:
    """`desired` with the Deployment's rolling-update strategy decided (a no-op when the user
    set maxSurge); counts the room when this apply starts a rollout, and says so in an Event."""
    rendered = rollout_room.decided_deployment(desired)
    if rendered is None or not rollout_room.needs_measuring(desired, live_deployment):
        return rollout_room.with_strategy(desired, live_deployment)
    counted, measured = _count(ctx, rendered)
    strategy = rollout_room.strategy_for(desired, live_deployment, counted)
    if measured and strategy is not None:
        if counted is None:
            found = (
                "no matching node can hold a new engine pod, even once the old ones are gone: "
                "the old pods keep serving while the new one waits"
            )
        else:
            found = f"{counted} more engine pod(s) fit on the matching nodes"
        message = (
            f"{found}: this rollout starts up to {strategy.max_surge} new pod(s) at once with "
            f"maxUnavailable {strategy.max_unavailable} (spec.rollout.maxSurge is unset; set it "
            "to fix the surge)"
        )
        post_event(ctx, body, events.EventSpec("Normal", REASON_ROLLOUT_STRATEGY, message))
    return rollout_room.with_strategy(desired, live_deployment, counted)
