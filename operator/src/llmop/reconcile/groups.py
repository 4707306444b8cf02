"""The LeaderWorkerSet's part of the reconcile: whether the cluster serves its API, the stall of a
multi-node spec on a cluster without it, reading the groups back, and remembering each group's
recreates (`note_pod`, judged by `llmop.group_restarts`).

The operator does not watch LeaderWorkerSets: their CRD may be absent, and a kopf index of a
kind nobody serves would hold every handler back. While the API is served and some parent is
multi-node (or still has a LeaderWorkerSet), `llmop.group_check` lists them every few seconds
(label-filtered, one request) into `Context.groups`, which `live_children` reads like a watch
cache; a parent whose listed LeaderWorkerSet changed gets its status derived again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from llmop import conditions, group_restarts, kinds, names
from llmop.desired import DesiredState
from llmop.group_restarts import GroupHistory
from llmop.observed import child_summary, controller_owner
from llmop.pods import is_worker
from llmop.reconcile.caches import cached_parent, one_owned
from llmop.reconcile.context import Context, Hint, Key
from llmop.status import Problem

log = logging.getLogger("llmop.reconcile.groups")

KIND = kinds.LEADER_WORKER_SET
INSTALL_HINT = (
    "spec.engine.pipelineParallelSize > 1 runs each replica as a LeaderWorkerSet group, and "
    "this cluster does not serve leaderworkerset.x-k8s.io/v1. Install LeaderWorkerSet "
    "(v0.9.0 or newer): kubectl apply --server-side -f "
    "https://github.com/kubernetes-sigs/lws/releases/download/v0.9.0/manifests.yaml ; "
    "the operator notices it within seconds, without a restart."
)


def served(ctx: Context) -> bool:
    """Whether the cluster serves LeaderWorkerSets: discovery once, then remembered (forgotten
    again when a request finds the API gone, `forget_served`)."""
    known = ctx.served.get(KIND)
    if known is None:
        known = ctx.served[KIND] = ctx.kube.serves(KIND.api_version, KIND.plural)
    return known


def forget_served(ctx: Context) -> None:
    """A request got a 404: the API may have gone (its CRD deleted); ask discovery again."""
    ctx.served.pop(KIND, None)


def wanted(desired: DesiredState) -> bool:
    """The rendered children use a LeaderWorkerSet."""
    return desired.children is not None and desired.children.leader_worker_set is not None


def missing() -> Problem:
    """The stall of a multi-node spec on a cluster without the LeaderWorkerSet API."""
    return Problem(conditions.REASON_LWS_MISSING, INSTALL_HINT)


def waiting(ctx: Context) -> list[tuple[str, str]]:
    """Parents stalled for want of the LeaderWorkerSet API."""
    return sorted(
        key
        for key, memory in ctx.memories()
        if memory.problem is not None
        and memory.problem.problem.reason == conditions.REASON_LWS_MISSING
    )


def multi_node(parent: Mapping[str, Any]) -> bool:
    """A cached parent asks for multi-node replicas (read without parsing the whole spec)."""
    engine = (parent.get("spec") or {}).get("engine") or {}
    size = engine.get("pipelineParallelSize", 1)
    return isinstance(size, int) and size > 1


def index(items: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Listed LeaderWorkerSets by their parent, as the caches keep them."""
    found: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for item in items:
        owner = controller_owner(item)
        if owner is not None:
            found.setdefault((owner.namespace, owner.name), []).append(child_summary(item))
    return found


def changed(
    before: Mapping[tuple[str, str], Iterable[Mapping[str, Any]]],
    after: Mapping[tuple[str, str], Iterable[Mapping[str, Any]]],
) -> list[tuple[str, str]]:
    """Parents whose LeaderWorkerSets differ between two listings (by resourceVersion)."""

    def versions(entries: Iterable[Mapping[str, Any]] | None) -> list[str]:
        return sorted(str((e.get("metadata") or {}).get("resourceVersion")) for e in entries or ())

    return sorted(
        key
        for key in set(before) | set(after)
        if versions(before.get(key)) != versions(after.get(key))
    )


def relist(ctx: Context) -> list[tuple[str, str]]:
    """List our LeaderWorkerSets into `ctx.groups`; the parents whose groups changed. One
    request cluster-wide, or one per watched namespace (a namespaced install may list nothing
    else)."""
    items: list[dict[str, Any]] = []
    for namespace in ctx.config.namespaces or (None,):
        items += ctx.kube.list(
            KIND.api_version,
            KIND.kind,
            namespace,
            label_selector=f"{names.LABEL_MANAGED_BY}={names.MANAGED_BY}",
        )
    listed = index(items)
    before, ctx.groups = ctx.groups, listed
    return changed(before, listed)


def _listed_wanted(ctx: Context) -> bool:
    """Some parent is multi-node, or a LeaderWorkerSet was listed last time, or this is the
    first round (a LeaderWorkerSet left behind while no operator ran is then known before the
    parents' resume passes, which delete it)."""
    if ctx.groups or KIND not in ctx.served:
        return True
    return any(multi_node(p) for ps in list(ctx.parents.values()) for p in list(ps))


def due(ctx: Context) -> list[tuple[Key, Hint]]:
    """One round of the group check (`llmop.group_check`): discovery while the API is not
    known served, the listing into `ctx.groups`, and the parents it asks a pass of — a full one
    for a parent stalled for want of the API or with a LeaderWorkerSet it no longer wants
    (to delete it), the status for one whose listed groups changed."""
    stalled = waiting(ctx)
    if not stalled and not _listed_wanted(ctx):
        return []
    if ctx.served.get(KIND) is not True:
        if not ctx.kube.serves(KIND.api_version, KIND.plural):
            ctx.served[KIND] = False
            ctx.groups = {}
            return []
        log.info("the cluster serves %s LeaderWorkerSets", KIND.group)
        ctx.served[KIND] = True
    found: list[tuple[Key, Hint]] = []
    for key in sorted(set(stalled) | set(relist(ctx))):
        body = cached_parent(ctx, *key)
        if body is None:
            continue
        full = key in stalled or (not multi_node(body) and ctx.groups.get(key))
        found.append((key, Hint.PARENT if full else Hint.FLEET))
    return found


def _wanted_groups(ctx: Context, parent: Mapping[str, Any]) -> int | None:
    """How many groups the parent wants now, as far as the caches know: the listed
    LeaderWorkerSet's replicas (the HPA scales it), and the spec's when it does not autoscale
    (ahead of the LeaderWorkerSet, which the next listing shows). The smaller; None if unknown."""
    namespace, name = parent["metadata"]["namespace"], parent["metadata"]["name"]
    known = []
    lws = one_owned(ctx.groups.get((namespace, name)), parent["metadata"].get("uid"))
    replicas = ((lws or {}).get("spec") or {}).get("replicas")
    if isinstance(replicas, int):
        known.append(replicas)
    spec = parent.get("spec") or {}
    if spec.get("autoscaling") is None:
        fixed = spec.get("replicas", 1)
        known.append(fixed if isinstance(fixed, int) else 1)
    return min(known) if known else None


def note_pod(ctx: Context, event_type: str | None, pod: Mapping[str, Any]) -> None:
    """Feed one engine pod's watch event (its summary, `llmop.pods.pod_summary`) to its group's
    history. Called for every pod event, in kopf's event loop, before the event is judged quiet
    or coalesced with later ones: a recreate shows only in the event of the new leader. The
    initial listing is a baseline (`group_restarts.observe`). A deleted leader whose group the
    parent no longer wants was scaled away: its history goes, so that scaling up again later is
    not counted as a recreate."""
    index = group_restarts.group_index(pod)
    metadata = pod.get("metadata") or {}
    name = (metadata.get("labels") or {}).get(names.LABEL_DEPLOYMENT)
    if index is None or not name:
        return
    key = (str(metadata.get("namespace") or ""), str(name))
    parent = cached_parent(ctx, *key)
    if parent is None:
        return
    uid = str(parent["metadata"].get("uid") or "")
    now = ctx.clock()
    known_uid, before = ctx.recall(key).group_restarts or ("", {})
    histories: dict[int, GroupHistory] = dict(before) if known_uid == uid else {}
    earlier = histories.get(index)
    seen = group_restarts.observe(earlier, pod, now)
    if seen is not None:
        histories[index] = seen
        if earlier is not None and len(seen.recreates) > len(earlier.recreates):
            # The only trace of a recreate anywhere: LeaderWorkerSet records none.
            log.info(
                "%s/%s: group %d recreated (leader %s, was %s); last exit before it: %s",
                *key,
                index,
                seen.leader_uid,
                earlier.leader_uid,
                seen.recreates[-1].last_exit,
            )
    if event_type == "DELETED" and not is_worker(pod):
        wanted = _wanted_groups(ctx, parent)
        if wanted is not None and index >= wanted:
            histories.pop(index, None)
    # Replaced whole, pruned: the workers deriving status read it without a lock.
    kept = (uid, {i: group_restarts.prune(h, now) for i, h in histories.items()})
    ctx.update(key, lambda memory: replace(memory, group_restarts=kept))


def restarts_of(ctx: Context, namespace: str, name: str, uid: str) -> Mapping[int, GroupHistory]:
    """The group histories of the parent `uid` (empty for any other parent of that name)."""
    known_uid, histories = ctx.recall((namespace, name)).group_restarts or ("", {})
    return histories if known_uid == uid else {}
