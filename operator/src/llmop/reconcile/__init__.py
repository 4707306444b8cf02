"""Orchestration of one LLMDeployment: desired state → child plan → execute → status.

The package, by responsibility (each module's docstring says its job):

- `context` — the per-parent locks, the caches and this process's memory (`Context`);
- `caches` — reading the watch caches (owners, live children, parsed specs, last status);
- `problems` — the memory of found problems that every status path carries;
- `writes` — the executor, status derivation and writing, the error policy;
- `first_status` — a parent pass's status write held until the Deployment controller has
  observed what it applied (one status write and one Event where there were two);
- `model_gate` — the model cache's pre-flight, claim and download Job;
- `adapter_gate` — the LoRA adapters' Hub pre-flight (refused ones never reach the pods; the
  base model is never gated by it);
- `pools` — the InferencePool's API check, its deletion once unwanted, and its verdict;
- `groups` — the LeaderWorkerSet's API check, its missing-API stall, and listing it back;
- `entry` — the entry points below; `quiet` — the event-loop checks; `in_sync` — the
  children found in sync with a generation's intent (not compared again until they change).

Called by the kopf handlers (a few lines each) but free of kopf itself: it talks to the API
through `llmop.kube`, decides with pure functions (`desired`, `plan`, `status`) and reads the
live children from watch-fed caches (kopf indexes, handed in as plain mappings), never from a
GET per event. Two named entry points share one per-parent lock:

- `reconcile_parent()` — create/update/resume of the LLMDeployment: apply every wanted child,
  delete unwanted ones, write the status;
- `refresh_from_child()` — a watch event of one child: repair that child if it drifted or
  vanished, and re-derive the parent's status;
- `refresh_from_pod()` / `refresh_status()` — an engine pod changed, or the agents were read
  (`llmop.fleet`): re-derive the parent's status only (`note_group_pod` first feeds every pod
  event to the memory of group recreates);
- `write_deferred_status()` — the fallback of a parent pass's deferred status
  (`first_status`), run by the handlers' scheduler a few seconds later (`note_deployment`
  first feeds every Deployment event to its memory of the Deployment controller at work).

Why the status never flaps: both entry points derive it from the same watch cache of the child
Deployment, whose entries only move forward in time, and compare with the status this process
wrote last. Before, the parent path used the Deployment returned by its apply while the
child-event path used the (older) Deployment of a queued watch event, so a CR went
Ready=True → False → True whenever the two interleaved.
"""

from __future__ import annotations

from llmop.reconcile.adapter_gate import due_for_hub as adapters_due_for_hub
from llmop.reconcile.caches import Owner, controller_owner, live_children
from llmop.reconcile.context import (
    TRIGGER_CHILD,
    TRIGGER_FLEET,
    TRIGGER_PARENT,
    TRIGGER_POD,
    ChildIndex,
    Context,
    KeyedLocks,
)
from llmop.reconcile.entry import (
    poll_downloads,
    reconcile_cached,
    reconcile_parent,
    refresh_from_child,
    refresh_from_job,
    refresh_from_pod,
    refresh_status,
    write_deferred_status,
)
from llmop.reconcile.first_status import note_deployment
from llmop.reconcile.groups import note_pod as note_group_pod
from llmop.reconcile.model_gate import TRIGGER_DOWNLOAD
from llmop.reconcile.pools import recheck as recheck_pools
from llmop.reconcile.quiet import quiet_child_event, quiet_pod_event
from llmop.reconcile.writes import StepRejectedError, execute

__all__ = [
    "TRIGGER_CHILD",
    "TRIGGER_DOWNLOAD",
    "TRIGGER_FLEET",
    "TRIGGER_PARENT",
    "TRIGGER_POD",
    "ChildIndex",
    "Context",
    "KeyedLocks",
    "Owner",
    "StepRejectedError",
    "adapters_due_for_hub",
    "controller_owner",
    "execute",
    "live_children",
    "note_deployment",
    "note_group_pod",
    "poll_downloads",
    "quiet_child_event",
    "quiet_pod_event",
    "recheck_pools",
    "reconcile_cached",
    "reconcile_parent",
    "refresh_from_child",
    "refresh_from_job",
    "refresh_from_pod",
    "refresh_status",
    "write_deferred_status",
]
