"""Orchestration of one LLMDeployment: observe → desire → plan → execute → status, in one pass.

One function, `reconcile(ctx, key, hint)`, runs the pass of the parent `key` (namespace, name)
under its lock, whatever asked for it; `hint` (`context.Hint`) names the trigger (the metric's
label) and what the pass may skip (`context.Pass`), and nothing else:

- `Pass.FULL` — the parent's create/update/resume (kopf's handler, with the body it delivered),
  a download Job's event, the download poll, a name conflict's retry and the periodic checks:
  observe the caches and
  this process's memory, desire (the parsed spec; the group, adapter and model gates, each
  returning a decision), plan every child, execute, write the status;
- `Pass.CHILD` — children's watch events: only those child kinds are planned (repaired if they
  drifted or vanished), then the status; a child found in sync is not compared again;
- `Pass.STATUS` — an engine pod's event, the agents' readings (`llmop.fleet`), the router and
  idle checks, a group listing: desire is read back from memory, plan and execute are skipped,
  the status is derived again and written only if it changed;
- `Pass.DEFERRED` — the fallback of a parent pass's status held for the Deployment
  controller's first status (`first_status`), put on the queue on a timer.

Every trigger is "put the key on the queue with a hint" (`Context.queue`, `llmop.coalescer`; the
parent's own handler, the child, pod and Job events, the agents' readings, the router, name and
idle checks, the periodic checks, the download poll, the timers): the queue keeps one waiting
hint per parent, merging a later trigger's into it (`Hint.merge`: the wider pass, with the
narrower ones it does not cover), and one worker per parent runs `reconcile` with it, so a
parent is never reconciled twice at once and a burst of triggers is one pass with one status
write.

Around it: `triggered(ctx, kind, type, object)` turns a watch event into its parent's key and hint
(`entry.noted`, after feeding this process's memory: a group's pods, the Deployment controller at
work), or None when `quiet.quiet` answers in kopf's event loop, from the caches and without I/O,
that the pass would write nothing (most child and pod events); `enqueue(ctx, key, hint)` puts a
trigger's pass on the queue (or, with no queue installed, as in tests and tools, runs it at once);
`check(ctx, which)` enqueues the pass of each parent a periodic check finds due. The parent's own
handler awaits the run that includes its hint, so kopf retries a transient failure with backoff.

The package, by responsibility (each module's docstring says its job):

- `context` — the per-parent locks, the caches, this process's memory (`Context`,
  `ParentMemory`), the hints and the queue's interface; `entry` — the one pass and its fast
  paths, `noted`, `enqueue`, `check`;
- `caches` — reading the watch caches (live children, parsed specs, last status);
- `problems` — the memory of found problems that every status path carries;
- `writes` — the executor, observing and deriving the status (`observe` → `status.Observed`),
  writing it, the error policy;
- `first_status` — a parent pass's status write held until the Deployment controller has
  observed what it applied (one status write and one Event where there were two);
- `model_gate` — the model cache's pre-flight, claim and download Job, as a decision;
- `adapter_gate` — the LoRA adapters' Hub pre-flight (refused ones never reach the pods; the
  base model is never gated by it);
- `pools` — the InferencePool's API check, its deletion once unwanted, and its verdict;
- `groups` — the LeaderWorkerSet's API check, its missing-API stall, listing it back;
- `quiet` — the event-loop check; `in_sync` — the children found in sync with a generation's
  intent (not compared again until they change); `rollouts` — the rollout room.

Free of kopf: it talks to the API through `llmop.kube`, decides with pure functions
(`desired`, `plan`, `status`) and reads the live children from watch-fed caches (kopf
indexes, handed in as plain mappings), never from a GET per event.

Why the status never flaps: every pass derives it from the same watch cache of the child
Deployment, whose entries only move forward in time, and compares with the status this process
wrote last. Before, the parent path used the Deployment returned by its apply while the
child-event path used the (older) Deployment of a queued watch event, so a CR went
Ready=True → False → True whenever the two interleaved.
"""

from __future__ import annotations

from llmop.reconcile.context import Context, Hint
from llmop.reconcile.entry import check, enqueue, reconcile
from llmop.reconcile.quiet import triggered

__all__ = ["Context", "Hint", "check", "enqueue", "reconcile", "triggered"]
