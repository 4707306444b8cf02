"""Pure: the one desired-state function — a parsed LLMDeployment → its capacity plan and, when
the plan allows pods, its rendered children.

The reconcile, the child-event path and `llmop render` all call `desired_state`, so plan →
render happens in one place: a plan that does not fit renders nothing (no pods are created).
"""

from __future__ import annotations

import pickle

from llmop import names
from llmop.api.v1alpha1 import LLMDeployment
from llmop.render import Children, render_children
from llmop.settings import RenderSettings
from llmop.sizing import FactsVerdict, SizingResult, plan_from


class DesiredState:
    """What one generation of an LLMDeployment should look like (immutable).

    The rendered children may be held pickled (`packed`, as `reconcile.context.PackedParse`
    keeps them between events) and are unpickled on first use: a status path reads only the
    spec, the capacity plan and the template hash, and a Deployment's status events, most of a
    burst's child events, then never unpickle them (~3 KiB of dicts each)."""

    __slots__ = ("_children", "_template_hash", "llmd", "sizing")

    llmd: LLMDeployment
    sizing: SizingResult

    def __init__(self, llmd: LLMDeployment, sizing: SizingResult, children: Children | None):
        self.llmd = llmd
        self.sizing = sizing
        self._children: Children | bytes | None = children
        self._template_hash = _template_hash(children)

    @classmethod
    def packed(
        cls,
        llmd: LLMDeployment,
        sizing: SizingResult,
        children: bytes,
        template_hash: str | None,
    ) -> DesiredState:
        """A desired state whose children are `children` pickled, with their template hash."""
        state = cls(llmd, sizing, None)
        state._children = children
        state._template_hash = template_hash
        return state

    @property
    def children(self) -> Children | None:
        """None when the capacity plan says the model does not fit, or waits for the model's
        files: nothing may be created or changed."""
        held = self._children
        if isinstance(held, bytes):
            children: Children | None = pickle.loads(held)
            self._children = children
            return children
        return held

    @property
    def template_hash(self) -> str | None:
        """The rendered pod template's hash (None when nothing is rendered)."""
        return self._template_hash

    def with_children(self, children: Children | None) -> DesiredState:
        """The same desired state with other children."""
        return DesiredState(self.llmd, self.sizing, children)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DesiredState):
            return NotImplemented
        return (self.llmd, self.sizing, self.children) == (other.llmd, other.sizing, other.children)

    __hash__ = None  # type: ignore[assignment]  # mutable parts: as the frozen dataclass had it

    def __repr__(self) -> str:
        return (
            f"DesiredState(llmd={self.llmd!r}, sizing={self.sizing!r}, children={self.children!r})"
        )


def _template_hash(children: Children | None) -> str | None:
    if children is None:
        return None
    annotations = children.workload["metadata"].get("annotations") or {}
    value = annotations.get(names.ANNOTATION_TEMPLATE_HASH)
    return value if isinstance(value, str) else None


def desired_state(
    llmd: LLMDeployment,
    settings: RenderSettings,
    *,
    resolved_revision: str | None = None,
    facts: FactsVerdict | None = None,
) -> DesiredState:
    """Plan, then render unless the plan says it cannot fit or waits for the model's files (a
    simulated engine is given the planned KV cache as its own, so what it reports matches the
    plan). `resolved_revision` (the commit the model pre-flight resolved) replaces
    spec.model.revision in what is rendered, so engine pods serve exactly the commit the cache
    holds. `facts`: what the model's own files say, for a model outside the catalog
    (`llmop.model_facts`)."""
    if resolved_revision is not None:
        model = llmd.spec.model.model_copy(update={"revision": resolved_revision})
        llmd = llmd.model_copy(update={"spec": llmd.spec.model_copy(update={"model": model})})
    sizing = plan_from(llmd.spec, facts)
    children = None
    if sizing.fits is not False and not sizing.waiting:
        children = render_children(
            llmd,
            settings,
            load_timeout_seconds=sizing.load_timeout_seconds,
            kv_cache_tokens=None if sizing.plan is None else sizing.plan.kv_cache_tokens,
        )
    return DesiredState(llmd=llmd, sizing=sizing, children=children)
