"""The reconcile's context: the per-parent locks, the watch caches handed in by the handlers,
what this process remembers of each parent between events (parsed specs, its own status
writes, applied generations, model gates, downloads, agent readings, found problems), one
`ParentMemory` record per parent, the hints a trigger hands the one pass (`Hint`: which
trigger, and what the pass may skip; hints waiting together merge into one), and the queue
every trigger puts its pass on (`Queue`)."""

from __future__ import annotations

import logging
import pickle
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import Enum, StrEnum
from typing import Any, ClassVar, Protocol

from llmop import events, preflight
from llmop.adapter_preflight import AdapterAnswer, AskedFor
from llmop.agents import AgentReading
from llmop.api.v1alpha1 import LLMDeployment, ModelSpec, ModelStatus
from llmop.config import OperatorConfig
from llmop.desired import DesiredState
from llmop.group_restarts import GroupHistory
from llmop.kinds import ChildKind
from llmop.kube import Kube, KubeError
from llmop.metrics import Metrics
from llmop.model_facts import Answer, FactsRequest
from llmop.name_owners import Verdict
from llmop.observed import Owner
from llmop.pool_view import PoolVerdict
from llmop.reconcile.facts import FactsMemory
from llmop.router_view import RouterView
from llmop.settings import RenderSettings
from llmop.sizing import FactsVerdict
from llmop.status import Problem

Key = tuple[str, str]
"""A parent's (namespace, name): what the locks, the memory and the queue are keyed by."""


class Trigger(StrEnum):
    """What asked for a pass (the `trigger` label of the reconciles metric)."""

    PARENT = "parent"
    CHILD = "child"
    POD = "pod"
    FLEET = "fleet"
    DOWNLOAD = "download"


class Pass(Enum):
    """How much of observe → desire → plan → execute → status a trigger needs: the fast paths
    are what it may skip."""

    FULL = "full"
    """Nothing skipped: every child planned and applied, the model and adapter gates run."""
    CHILD = "child"
    """Only the event's child kind planned (repaired if it drifted or vanished), then status."""
    STATUS = "status"
    """Desire is read back from memory, plan and execute skipped: the status re-derived."""
    DEFERRED = "deferred"
    """The fallback of a parent pass's deferred status (`first_status`): the status written
    unless something wrote it meanwhile or the Deployment controller is still at work."""


@dataclass(frozen=True)
class ChildEvent:
    """A watch event of a child we own, as the event-loop check and the pass both read it."""

    kind: ChildKind
    owner: Owner
    type: str
    hpa: Mapping[str, Any] | None  # the HPA as this event delivered it (its conditions matter)


_RANK = {Pass.DEFERRED: 0, Pass.STATUS: 1, Pass.CHILD: 2, Pass.FULL: 3}
"""Which pass covers which: a full pass plans every child and writes the status, a child pass
writes the status too; the deferred fallback covers nothing else."""


@dataclass(frozen=True)
class Hint:
    """Which trigger asked for a pass of a parent, and what that pass may skip. The pass
    decides from the caches when it runs; the hint only picks its fast path (and carries what
    a watch event brought that the caches do not: a deletion, an HPA's conditions, the parent
    as kopf delivered it, a Job's owner uid). Hints of one parent that wait on the queue
    together become one (`merge`), so a burst of triggers is one pass."""

    trigger: Trigger
    scope: Pass
    body: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    """The parent as its own watch event delivered it (else the cached one is read)."""
    children: tuple[ChildEvent, ...] = ()
    """The child events the pass is for, the newest per child kind: `Pass.CHILD` repairs
    those kinds; any pass reads the parent fresh when one was a deletion."""
    uid: str | None = None
    """The parent's uid the trigger was for (a Job's owner): another parent of that name is
    left alone."""
    also: frozenset[Pass] = frozenset()
    """The narrower passes merged into this one. Two are not covered by the wider pass: the
    status (`Pass.STATUS`) beside a child pass whose children ask nothing of it, and the
    deferred status's fallback (`Pass.DEFERRED`), run after the pass if it left the deferral
    as it found it."""

    PARENT: ClassVar[Hint]
    """A full pass from the cached parent (the periodic checks)."""
    POD: ClassVar[Hint]
    FLEET: ClassVar[Hint]
    DOWNLOAD: ClassVar[Hint]
    DEFERRED: ClassVar[Hint]

    @classmethod
    def parent(cls, body: Mapping[str, Any]) -> Hint:
        """Create, update or resume of the parent `body`, as kopf delivered it."""
        return cls(Trigger.PARENT, Pass.FULL, body=body)

    @classmethod
    def child(cls, event: ChildEvent) -> Hint:
        """A watch event of one of the parent's children."""
        return cls(Trigger.CHILD, Pass.CHILD, children=(event,))

    @property
    def full(self) -> bool:
        """Nothing skipped (`Pass.FULL`): the queue runs it in kopf's pool."""
        return self.scope is Pass.FULL

    @property
    def fresh(self) -> bool:
        """A child was deleted: the pass reads the parent from the API server, not the cache
        (recreating a child is the one write a stale cache could get wrong)."""
        return any(event.type == "DELETED" for event in self.children)

    def merge(self, later: Hint) -> Hint:
        """One hint that asks for everything this one and the `later` one ask for: the wider
        pass (its trigger names the run), the other's narrower pass kept in `also` where the
        wider one does not cover it, every child kind's newest event (a deletion stays one),
        the newest parent body, and a uid only where both name the same one."""
        wide = later if _RANK[later.scope] > _RANK[self.scope] else self
        passes = {self.scope, later.scope} | self.also | later.also
        return Hint(
            trigger=wide.trigger,
            scope=wide.scope,
            body=later.body if later.body is not None else self.body,
            children=_newest_per_kind(self.children, later.children),
            uid=self.uid if self.uid == later.uid else None,
            also=frozenset(p for p in passes if _RANK[p] < _RANK[wide.scope]),
        )

    def narrowed(self) -> Hint | None:
        """The passes merged into this one without its own (the widest of them the scope), or
        None when nothing was merged: what still runs when this pass fails."""
        if not self.also:
            return None
        scope = max(self.also, key=_RANK.__getitem__)
        also = self.also - {scope}
        return replace(self, scope=scope, uid=None, also=also)


def _newest_per_kind(
    older: tuple[ChildEvent, ...], newer: tuple[ChildEvent, ...]
) -> tuple[ChildEvent, ...]:
    """Per child kind the newest event; a kind deleted in between still reads as deleted (its
    pass must read the parent fresh before it recreates the child)."""
    found = {event.kind: event for event in older}
    for event in newer:
        before = found.get(event.kind)
        deleted = before is not None and before.type == "DELETED" and event.type != "DELETED"
        found[event.kind] = replace(event, type="DELETED") if deleted else event
    return tuple(found.values())


Hint.PARENT = Hint(Trigger.PARENT, Pass.FULL)
Hint.POD = Hint(Trigger.POD, Pass.STATUS)
Hint.FLEET = Hint(Trigger.FLEET, Pass.STATUS)
Hint.DOWNLOAD = Hint(Trigger.DOWNLOAD, Pass.FULL)
Hint.DEFERRED = Hint(Trigger.PARENT, Pass.DEFERRED)


class Queue(Protocol):
    """Where a trigger puts the pass of a parent: the operator's coalescing queue
    (`llmop.coalescer`), installed by the handlers; callable from any thread."""

    def put(self, key: Key, hint: Hint, *, after: float | None = None) -> None:
        """Put the pass of `key` on the queue, merged with what waits there for `key`.
        `after`: a timer's seconds, after which it runs with no further wait; None: it waits
        the queue's own short while for later triggers of `key`."""


ChildIndex = Mapping[tuple[str, str], Iterable[Mapping[str, Any]]]
"""A watch cache of one child kind: (namespace, parent name) → the live children (normally
one). kopf's indexes have this shape; tests pass plain dicts."""


class KeyedLocks:
    """One lock per parent, created on demand and dropped when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[tuple[str, str], tuple[threading.Lock, int]] = {}

    @contextmanager
    def hold(self, key: tuple[str, str]) -> Iterator[None]:
        """Hold the lock of `key`."""
        with self._guard:
            lock, users = self._locks.get(key, (threading.Lock(), 0))
            self._locks[key] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._guard:
                lock, users = self._locks[key]
                if users == 1:
                    del self._locks[key]
                else:
                    self._locks[key] = (lock, users - 1)

    def busy(self, key: tuple[str, str]) -> bool:
        """Someone holds or waits for the lock of `key` right now (never blocks on it)."""
        with self._guard:
            return key in self._locks

    def __len__(self) -> int:
        with self._guard:
            return len(self._locks)


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass
class Parsed:
    """One generation of a parent, parsed and planned once (not once per child event)."""

    uid: str
    generation: int | None
    desired: DesiredState | None
    error: str | None
    asked: FactsRequest | None = None
    """The model files its plan needs read (`llmop.model_facts`; None: it needs none)."""
    answer: Answer | None = None
    """What this process knew of those files when it planned (None: nothing yet): the plan is
    made again once the memory holds another answer (`Context.facts`)."""
    facts: FactsVerdict | None = None
    """What the plan was given of them (the model gate plans again with it)."""


@dataclass(frozen=True)
class PackedParse:
    """A `Parsed` as kept between events: the capacity plan and the rendered children pickled
    (2.9 KiB for a small CR against 20 KiB as objects with the spec model: ~15 MiB less peak
    RSS at 1,000 CRs). The spec model is not kept: validating the cached parent again takes
    ~12 µs, unpickling it ~37 µs. The plan and the children are pickled apart, and the template
    hash kept as it is: unpacking the plan costs ~3 µs, and the children (~12 µs) are unpickled
    only by a path that reads them (`DesiredState.packed`), not by the status paths.
    (Compressing the pickles saved 3 MiB more but cost ~2.5 CPU-s a burst: each zlib call
    allocates and frees its window.)"""

    uid: str
    generation: int | None
    planned: bytes | None
    """The pickled sizing of the desired state; None for an unreadable spec."""
    error: str | None
    rendered: bytes = b""
    """The pickled children of the desired state."""
    template_hash: str | None = None
    asked: FactsRequest | None = None
    """As `Parsed.asked`, `answer` and `facts` (kept as they are: the facts are shared with
    `Context.facts`, not copied)."""
    answer: Answer | None = None
    facts: FactsVerdict | None = None

    @classmethod
    def pack(cls, parsed: Parsed) -> PackedParse:
        desired = parsed.desired
        if desired is None:
            return cls(parsed.uid, parsed.generation, None, parsed.error)
        return cls(
            parsed.uid,
            parsed.generation,
            pickle.dumps(desired.sizing, protocol=5),
            parsed.error,
            pickle.dumps(desired.children, protocol=5),
            desired.template_hash,
            parsed.asked,
            parsed.answer,
            parsed.facts,
        )

    def unpack(self, llmd: LLMDeployment | None) -> Parsed:
        """The `Parsed` again, with `llmd`: this generation's spec, validated from the parent."""
        desired = None
        if self.planned is not None and llmd is not None:
            sizing = pickle.loads(self.planned)
            desired = DesiredState.packed(llmd, sizing, self.rendered, self.template_hash)
        return Parsed(
            self.uid, self.generation, desired, self.error, self.asked, self.answer, self.facts
        )


@dataclass(frozen=True)
class InSync:
    """One parent's children found in sync with one packed desired state (`reconcile.in_sync`):
    child kind → the fingerprint of the live child that was compared."""

    packed: PackedParse
    found: Mapping[ChildKind, tuple[Any, ...]]


@dataclass
class ModelGate:
    """One generation's model pre-flight verdict, the engine children rendered at the resolved
    commit, and the latest model status (the download's progress)."""

    uid: str
    generation: int | None
    model: ModelSpec
    """The spec.model the verdict was reached for: a new generation that leaves it as it was
    (`kubectl scale`, an engine flag) keeps a passing verdict and the resolved commit, so it neither
    calls the hub again nor moves a floating revision to a newer commit behind the user's back."""
    verdict: preflight.Verdict
    status: ModelStatus
    applied: bool = False
    """The claim and the Job were applied for this generation (re-applied if the Job goes)."""
    desired: DesiredState | None = None
    """Set once the cache holds the commit: what the engine children are planned from."""


@dataclass
class AdapterGates:
    """The Hub's answers for one parent's hf:// adapters (`reconcile.adapter_gate`): kept per
    adapter with what each was asked for, so the verdicts are reached again from them at every
    use and the Hub is asked only when an adapter's source, revision or token changes."""

    uid: str
    generation: int | None
    """The generation whose parent pass last asked: a refusal is asked again on a new one."""
    answers: dict[str, tuple[AskedFor, AdapterAnswer]] = field(default_factory=dict)
    """Adapter name → (what was asked, the Hub's answer); never an unreachable Hub's."""
    base: tuple[AskedFor, str | None] | None = None
    """The base model's `model_type` (None: unknown) and what was asked for it."""
    unreachable_at: datetime | None = None
    """When the Hub last could not be reached for this parent (None: it answered)."""


@dataclass(frozen=True)
class Found:
    """A problem this process found for one generation of a parent, and the kind of the child
    the API server rejected (None for problems of the parent itself)."""

    uid: str
    generation: int | None
    problem: Problem
    child: str | None = None


Deferral = tuple[str, int | None, datetime]
"""(uid, generation, since when) of a parent pass's status left to the Deployment controller's
first status (`reconcile.first_status`)."""


@dataclass(frozen=True, slots=True)
class ParentMemory:
    """Everything this process remembers of one parent between events, in one record: replaced
    whole by `Context.update`, dropped whole by `Context.forget`. (The model and adapter gates
    it holds are updated in place by their owners, under the parent's lock.)"""

    parsed: PackedParse | None = None
    """The last generation parsed and planned (`caches.parse`)."""
    in_sync: InSync | None = None
    """The children the child events last found in sync (`reconcile.in_sync`)."""
    written: tuple[str, dict[str, Any]] | None = None
    """(uid, the status) as this process last wrote it (`caches.previous_status`)."""
    applied: tuple[str, int | None] | None = None
    """(uid, generation) the children were last fully applied for, by this process."""
    model_gate: ModelGate | None = None
    """The model pre-flight with spec.model.cache, once per generation (`reconcile.model_gate`)."""
    adapter_gates: AdapterGates | None = None
    """The adapter pre-flight with hf:// adapters: asked on the parent path only, read by every
    path (`reconcile.adapter_gate`)."""
    downloading: bool = False
    """The download Job runs: the download poll (`entry.check`) refreshes its progress."""
    fleet: tuple[AgentReading, ...] | None = None
    """The agents' latest readings (written by `llmop.fleet`); None: not read by this process
    yet, and the status keeps what the agents said before."""
    problem: Found | None = None
    """The last problem found: every status path carries it until a new generation or a parent
    pass that applied every child (`reconcile.problems`)."""
    conflict_retry_at: float | None = None
    """When the pass retrying a child name conflict is due (time.monotonic), if one was put on
    the queue (`writes.run_plan`)."""
    pool: PoolVerdict | None = None
    """The InferencePool verdict of the last parent pass (`reconcile.pools`); only for parents
    that want a pool or had one."""
    group_restarts: tuple[str, Mapping[int, GroupHistory]] | None = None
    """Per multi-node parent: (its uid, group index → what this process saw of the group: its
    leader, its recreates within the window, the last exit), fed by every engine pod event
    (`reconcile.groups.note_pod`) in kopf's event loop."""
    confirmed: tuple[str, frozenset[ChildKind]] | None = None
    """(uid, the kinds not watched whose child this process applied for this parent): those are
    its own, applied as usual; any other is created only, never taken over (`plan_children`)."""
    deferred: Deferral | None = None
    """(uid, generation, since when) when the parent pass left its status write to the
    Deployment controller's first status (`reconcile.first_status`)."""


NOTHING = ParentMemory()
"""The record of a parent this process remembers nothing of."""


@dataclass
class Context:
    """Everything a reconcile needs, built once at startup (kopf's memo carries it)."""

    kube: Kube
    config: OperatorConfig
    metrics: Metrics
    instance: str
    render_settings: RenderSettings = field(init=False)
    locks: KeyedLocks = field(default_factory=KeyedLocks)
    clock: Callable[[], datetime] = _now
    children: dict[ChildKind, ChildIndex] = field(default_factory=dict)
    """Watch caches of the watched child kinds (kopf indexes, set by the handlers)."""
    parents: Mapping[tuple[str, str], Iterable[Mapping[str, Any]]] = field(default_factory=dict)
    """Watch cache of the LLMDeployments: (namespace, name) → the parent."""
    pods: Mapping[tuple[str, str], Iterable[Mapping[str, Any]]] = field(default_factory=dict)
    """Watch cache of the engine pods: (namespace, parent name) → their summaries (llmop.pods)."""
    _memory: dict[tuple[str, str], ParentMemory] = field(default_factory=dict, repr=False)
    """What this process remembers of each parent (`recall`, `update`, `forget`)."""
    _memory_guard: threading.Lock = field(default_factory=threading.Lock, repr=False)
    groups: Mapping[tuple[str, str], Iterable[Mapping[str, Any]]] = field(default_factory=dict)
    """The LeaderWorkerSets we own as `llmop.group_check` last listed them: (namespace, parent
    name) → their summaries (`llmop.observed`); replaced whole at each listing."""
    served: dict[ChildKind, bool] = field(default_factory=dict)
    """Whether the cluster serves an optional child kind's API (the InferencePool CRD), as
    discovery last said; absent: ask before the next apply."""
    deployments_observed_at: datetime | None = None
    """When a watch event last showed the Deployment controller had observed one of our
    Deployments (`first_status.note_deployment`): it runs, if perhaps behind."""
    queue: Queue | None = None
    """The operator's queue of passes (`Queue`; installed by the handlers before anything
    triggers a pass): every trigger puts its parent's pass there. None (tests, tools): a
    trigger runs the pass at once (`entry.enqueue`), and parent passes write their status at
    once instead of deferring it."""

    names: Mapping[Key, Verdict] | None = None
    """Per routed parent: the model names it owns and the ones it lost, as `llmop.name_check`
    last decided (replaced whole); None: not decided yet in this process."""
    router: RouterView | None = field(init=False)
    """The installed router and whether it had a ready pod at the last check (`check_router`)."""
    facts: FactsMemory = field(default_factory=FactsMemory)
    """The files of models outside the catalog: the facts read and the reads asked for
    (`reconcile.facts`; read by `llmop.facts_check`)."""

    def __post_init__(self) -> None:
        self.render_settings = self.config.render_settings()
        self.router = None if self.config.router is None else RouterView(self.config.router)

    def recall(self, key: tuple[str, str]) -> ParentMemory:
        """What this process remembers of the parent `key` (an empty record when nothing)."""
        return self._memory.get(key, NOTHING)

    def update(self, key: tuple[str, str], change: Callable[[ParentMemory], ParentMemory]) -> None:
        """Replace the parent's record by `change(record)` (e.g. `lambda m: replace(m, x=…)`),
        atomically: the records are written from worker threads and kopf's event loop alike.
        `change` runs under a lock, so it must be quick and must not call `update` itself."""
        with self._memory_guard:
            memory = change(self._memory.get(key, NOTHING))
            if memory == NOTHING:  # nothing left to remember (and a forgotten parent stays so)
                self._memory.pop(key, None)
            else:
                self._memory[key] = memory

    def memories(self) -> list[tuple[tuple[str, str], ParentMemory]]:
        """Every parent's record, as a snapshot (for the checks that look across parents)."""
        return list(self._memory.items())

    def forget(self, namespace: str, name: str) -> None:
        """Drop what this process remembers of a deleted parent."""
        with self._memory_guard:
            self._memory.pop((namespace, name), None)


_log = logging.getLogger("llmop.reconcile.context")


def post_event(ctx: Context, body: Mapping[str, Any], spec: events.EventSpec) -> None:
    """Post one Event on the LLMDeployment `body`; a failure is only logged (an Event is news,
    never state)."""
    try:
        ctx.kube.create_event(
            events.render_event(body, spec, now=ctx.clock(), instance=ctx.instance)
        )
    except KubeError as error:
        _log.warning("could not post event %s: %s", spec.reason, error)
