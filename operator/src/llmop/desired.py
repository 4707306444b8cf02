"""Pure: the one desired-state function — a parsed LLMDeployment → its capacity plan and, when
the plan allows pods, its rendered children.

The reconcile, the child-event path and `llmop render` all call `desired_state`, so plan →
render happens in one place: a plan that does not fit renders nothing (no pods are created).
"""

from __future__ import annotations

from dataclasses import dataclass

from llmop import names
from llmop.api.v1alpha1 import LLMDeployment
from llmop.render import Children, render_children
from llmop.settings import RenderSettings
from llmop.sizing import SizingResult, plan_for


@dataclass(frozen=True)
class DesiredState:
    """What one generation of an LLMDeployment should look like."""

    llmd: LLMDeployment
    sizing: SizingResult
    children: Children | None
    """None when the capacity plan says the model does not fit: nothing may be created."""

    @property
    def template_hash(self) -> str | None:
        """The rendered pod template's hash (None when nothing is rendered)."""
        if self.children is None:
            return None
        annotations = self.children.workload["metadata"].get("annotations") or {}
        value = annotations.get(names.ANNOTATION_TEMPLATE_HASH)
        return value if isinstance(value, str) else None


def desired_state(
    llmd: LLMDeployment, settings: RenderSettings, *, resolved_revision: str | None = None
) -> DesiredState:
    """Plan, then render unless the plan says it cannot fit. `resolved_revision` (the commit
    the model pre-flight resolved) replaces spec.model.revision in what is rendered, so engine
    pods serve exactly the commit the cache holds."""
    if resolved_revision is not None:
        model = llmd.spec.model.model_copy(update={"revision": resolved_revision})
        llmd = llmd.model_copy(update={"spec": llmd.spec.model_copy(update={"model": model})})
    sizing = plan_for(llmd.spec)
    children = None
    if sizing.fits is not False:
        children = render_children(llmd, settings, load_timeout_seconds=sizing.load_timeout_seconds)
    return DesiredState(llmd=llmd, sizing=sizing, children=children)
