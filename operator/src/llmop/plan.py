"""Pure: the child plan — from the desired state and the live children (with their
managedFields), everything the operator will do to one LLMDeployment's children, and why.

Deciding is separate from doing: `plan_children` returns deletes, applies and the HPA replica
handover as data; `llmop.reconcile.execute` carries them out in `ChildPlan.steps()` order and
decides nothing. The plan is table-tested on recorded live objects; the executor against the
real API server.

The handover: with autoscaling on, the Deployment intent has no `spec.replicas` (the HPA owns the
count). Server-side apply resets a field its manager stops applying to the default (1), so when
our manager owns `spec.replicas` (autoscaling just turned on) the current count is first applied
by a separate manager (`llmop-handover`) that keeps it until the HPA writes its own value. A new
autoscaled Deployment would start at 1; the handover manager starts it at `minReplicas` instead.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llmop import kinds, names
from llmop.desired import DesiredState
from llmop.kinds import ChildKind
from llmop.observed import full_spec

REPLICAS_PATH = ("spec", "replicas")

Live = Mapping[ChildKind, Mapping[str, Any] | None]
"""The live children by kind; an absent key or None means the child does not exist."""


@dataclass(frozen=True)
class Apply:
    """Server-side apply `manifest` as `field_manager` (forced: we own what we apply)."""

    manifest: dict[str, Any]
    field_manager: str
    reason: str
    new: bool = False
    """A watched kind whose cache has no such child, or a kind not watched that this process has
    not applied for this parent yet: only create it (`Kube.apply(new=True)`). An object of that
    name that is there all the same is someone else's until `takeover` says otherwise: a forced
    apply would take it over."""

    @property
    def kind(self) -> str:
        """The manifest's kind."""
        return str(self.manifest["kind"])

    @property
    def kind_name(self) -> str:
        """The child's kind, as `Delete.kind_name` spells it (one spelling for every step)."""
        return self.kind


@dataclass(frozen=True)
class Delete:
    """Delete the child of `kind` named like the parent."""

    kind: ChildKind
    namespace: str
    name: str
    reason: str

    @property
    def kind_name(self) -> str:
        """The child's kind, as `Apply.kind_name` spells it."""
        return self.kind.kind


Step = Apply | Delete


@dataclass(frozen=True)
class ChildPlan:
    """Everything to do to one parent's children, in the order it must happen."""

    deletes: tuple[Delete, ...] = ()
    """First: turning autoscaling off must stop the HPA before replicas are taken back."""
    handover_first: Apply | None = None
    """Before the Deployment intent drops `spec.replicas`: keep today's count."""
    applies: tuple[Apply, ...] = ()
    """The children's intents, in the registry's order."""
    handover_last: Apply | None = None
    """After a new autoscaled Deployment exists: start it at `minReplicas`, not 1."""
    retires: tuple[Delete, ...] = ()
    """Last: the workload kind the spec no longer wants (Deployment ↔ LeaderWorkerSet), once
    the new one is applied, so the old one serves until then and none is left behind."""

    def steps(self) -> list[Step]:
        """Every step in execution order."""
        steps: list[Step] = list(self.deletes)
        if self.handover_first is not None:
            steps.append(self.handover_first)
        steps += self.applies
        if self.handover_last is not None:
            steps.append(self.handover_last)
        steps += self.retires
        return steps

    @property
    def reasons(self) -> list[str]:
        """Why each step happens, in order (for logs and tests)."""
        return [step.reason for step in self.steps()]

    def __bool__(self) -> bool:
        return bool(self.steps())


# ----------------------------------------------------------------------------------------------
# Comparing desired and live objects


def owner_reference(parent: Mapping[str, Any]) -> dict[str, Any]:
    """The controller reference children carry, so GC removes them with the parent."""
    metadata = parent["metadata"]
    return {
        "apiVersion": parent.get("apiVersion", kinds.LLMDEPLOYMENT.api_version),
        "kind": parent.get("kind", kinds.LLMDEPLOYMENT.kind),
        "name": metadata["name"],
        "uid": metadata["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def with_owner(manifest: Mapping[str, Any], reference: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `manifest` owned by `reference` (renderers leave owner references out)."""
    metadata = {**manifest["metadata"], "ownerReferences": [dict(reference)]}
    return {**manifest, "metadata": metadata}


def owns_field(live: Mapping[str, Any], manager: str, path: Sequence[str]) -> bool:
    """Whether `manager` owns the field at `path` through an Apply entry in managedFields."""
    for entry in (live.get("metadata") or {}).get("managedFields") or []:
        if entry.get("manager") != manager or entry.get("operation") != "Apply":
            continue
        node: Any = entry.get("fieldsV1") or {}
        for part in path:
            node = node.get(f"f:{part}") if isinstance(node, Mapping) else None
        if node is not None:
            return True
    return False


def _same_scalar(want: Any, have: Any) -> bool:
    # Quantities come back as strings (`1` → "1"): compare such scalars by text.
    return bool(want == have) or (
        not isinstance(want, bool) and not isinstance(have, bool) and str(want) == str(have)
    )


def drifted(desired: Any, live: Any) -> bool:
    """Whether `live` lost or changed any field of `desired` (fields only live has are fine:
    the API server adds defaults and other managers own fields too)."""
    if isinstance(desired, Mapping):
        if not isinstance(live, Mapping):
            return True
        return any(key not in live or drifted(value, live[key]) for key, value in desired.items())
    if isinstance(desired, list):
        if not isinstance(live, list) or len(desired) != len(live):
            return True
        return any(drifted(want, have) for want, have in zip(desired, live, strict=True))
    return not _same_scalar(desired, live)


def replicas_only(manifest: Mapping[str, Any], replicas: int) -> dict[str, Any]:
    """The handover manager's whole intent: the Deployment's `spec.replicas`, nothing else."""
    metadata = manifest["metadata"]
    return {
        "apiVersion": manifest["apiVersion"],
        "kind": manifest["kind"],
        "metadata": {"name": metadata["name"], "namespace": metadata["namespace"]},
        "spec": {"replicas": replicas},
    }


# ----------------------------------------------------------------------------------------------
# The plan


def plan_children(
    desired: DesiredState,
    live: Live,
    *,
    parent: Mapping[str, Any],
    only: ChildKind | None = None,
    repair: bool = False,
    unserved: Collection[ChildKind] = (),
    confirmed: Collection[ChildKind] = (),
) -> ChildPlan:
    """Plan one parent's children.

    By default (the parent path: a new or resumed generation), every wanted child is applied —
    server-side apply is idempotent and also removes fields we no longer render — and every
    unwanted optional child that exists is deleted. With `repair` (a generation this process
    already applied), and always with `only` (a watch event of one child, and then just that
    kind), a wanted child is applied only when missing or drifted from its intent. A plan that
    does not fit (`desired.children is None`) does nothing. Kinds in `unserved` (their API is
    not served: an optional CRD not installed) are neither applied nor deleted. `confirmed`: the
    kinds not watched whose child this process has applied for this parent already; any other
    is created only (`Apply.new`), so that an object of its name that is someone else's is never
    taken over.
    """
    children = desired.children
    if children is None:
        return ChildPlan()
    reference = owner_reference(parent)
    considered = [k for k in (kinds.CHILDREN if only is None else (only,)) if k not in unserved]
    metadata = children.workload["metadata"]
    unwanted = set(children.unwanted())
    deletes = tuple(
        Delete(
            kind,
            metadata["namespace"],
            metadata["name"] + kind.name_suffix,
            f"{kind.kind}: delete (not wanted)",
        )
        for kind in considered
        if kind in unwanted and live.get(kind) is not None
    )
    applies: list[Apply] = []
    for kind in considered:
        manifest = children.get(kind)
        if manifest is None:
            continue
        owned = with_owner(manifest, reference)
        current = live.get(kind)
        if only is None and not repair:
            reason = f"{kind.kind}: apply (generation {desired.llmd.metadata.generation})"
        elif current is None:
            reason = f"{kind.kind}: apply (missing)"
        elif drifted(owned, full_spec(current)):
            reason = f"{kind.kind}: apply (drifted from its intent)"
        else:
            continue
        # Only a watched kind's cache can say the child is not there yet. The others are
        # applied at every pass, and their absence from `live` says nothing: created only until
        # this process applied one for this parent (then they are known to be its own). A
        # repair's missing child is one this process just applied and its cache has not shown
        # yet (kopf running a create twice under load): created new, each would cost a read.
        unknown = kind.watched or kind not in confirmed
        new = current is None and unknown and not repair
        applies.append(Apply(owned, names.FIELD_MANAGER, reason, new=new))
    handover_first, handover_last = _handover(desired, live, applies)
    retires = tuple(
        Delete(
            kind,
            metadata["namespace"],
            metadata["name"],
            f"{kind.kind}: delete (replaced by the {children.workload['kind']})",
        )
        for kind in kinds.WORKLOADS
        if only is None
        and kind not in unserved
        and children.get(kind) is None
        and live.get(kind) is not None
    )
    return ChildPlan(deletes, handover_first, tuple(applies), handover_last, retires)


def _handover(
    desired: DesiredState, live: Live, applies: Sequence[Apply]
) -> tuple[Apply | None, Apply | None]:
    """The replica handover around an apply of the Deployment intent, if one is needed."""
    autoscaling = desired.llmd.spec.autoscaling
    intent = next((a for a in applies if a.kind == kinds.DEPLOYMENT.kind), None)
    if autoscaling is None or intent is None:
        return None, None
    current = live.get(kinds.DEPLOYMENT)
    if current is None:
        # A model that may scale to zero still starts with one replica: it goes to 0 only
        # after its idle period.
        start = max(1, autoscaling.min_replicas)
        if start == 1:
            return None, None  # the Deployment's own default is already right
        bootstrap = replicas_only(intent.manifest, start)
        return None, Apply(
            bootstrap,
            names.HANDOVER_FIELD_MANAGER,
            f"Deployment: start at minReplicas={start} (new, autoscaled)",
        )
    if owns_field(current, names.FIELD_MANAGER, REPLICAS_PATH):
        count = (current.get("spec") or {}).get("replicas", 1)
        keep = replicas_only(intent.manifest, count)
        return Apply(
            keep,
            names.HANDOVER_FIELD_MANAGER,
            f"Deployment: keep replicas={count} while autoscaling takes over",
        ), None
    return None, None


# ----------------------------------------------------------------------------------------------
# An object in the way of a new child


@dataclass(frozen=True)
class Takeover:
    """What to do when a child's create (`Apply.new`) found an object of its name."""

    verdict: str
    """`OURS` (this parent controls it: the watch cache was behind, apply as usual), `WAIT` (a
    previous parent of the same name controls it: the garbage collector is deleting it, so try
    again shortly) or `REFUSE` (someone else's: left untouched, the parent is stalled)."""
    message: str = ""
    """For `REFUSE`: the Stalled condition's message, naming the object, its owner and the fix."""


OURS, WAIT, REFUSE = "ours", "wait", "refuse"


def _owner_text(metadata: Mapping[str, Any]) -> str:
    references = metadata.get("ownerReferences") or []
    if not references:
        return "no owner"
    described = []
    for reference in references:
        role = "controller" if reference.get("controller") else "owner"
        described.append(f"{role} {reference.get('kind')} {reference.get('name')}")
    return ", ".join(described)


def takeover(manifest: Mapping[str, Any], existing: Mapping[str, Any]) -> Takeover:
    """Decide about `existing`, the live object named like the child `manifest` (which carries
    its parent's controller reference, `with_owner`)."""
    ours = next(iter(manifest["metadata"].get("ownerReferences") or ()), None) or {}
    metadata = existing.get("metadata") or {}
    controller = next(
        (r for r in metadata.get("ownerReferences") or () if r.get("controller")), None
    )
    if controller is not None and controller.get("uid") == ours.get("uid"):
        return Takeover(OURS)
    if controller is not None and all(
        controller.get(field) == ours.get(field) for field in ("apiVersion", "kind", "name")
    ):
        # A parent of this name was deleted and created again: its predecessor's child goes
        # with the garbage collector (background deletion: seconds), not a name conflict.
        return Takeover(WAIT)
    kind = manifest["kind"]
    where = f"{manifest['metadata'].get('namespace')}/{manifest['metadata']['name']}"
    return Takeover(
        REFUSE,
        f"{kind} {where} already exists and is not this LLMDeployment's "
        f"({_owner_text(metadata)}), so it was left untouched: delete or rename that {kind}, "
        f"or give the LLMDeployment another name; the operator creates its {kind} "
        "once the name is free",
    )
