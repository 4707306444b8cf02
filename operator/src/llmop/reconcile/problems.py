"""The problem memory: a found problem is never erased by a path that cannot see it.

Only the parent path applies every child and checks the spec and the model; the child, pod,
fleet and download paths derive the status from caches. Without this memory they derived it
with no problem and wrote "no longer stalled" a moment after the parent path found one."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from llmop.plan import ChildPlan
from llmop.reconcile.caches import generation_of, key_of
from llmop.reconcile.context import Context, Found
from llmop.status import Problem


def remember(
    ctx: Context, body: Mapping[str, Any], problem: Problem, *, child: str | None = None
) -> None:
    found = Found(*generation_of(body), problem, child)
    ctx.update(key_of(body), lambda memory: replace(memory, problem=found))


def problem_of(ctx: Context, body: Mapping[str, Any]) -> Problem | None:
    """The problem this process found for the parent's current generation, if any."""
    found = ctx.recall(key_of(body)).problem
    if found is None or (found.uid, found.generation) != generation_of(body):
        return None
    return found.problem


def clear_problem(ctx: Context, body: Mapping[str, Any], plan: ChildPlan, *, repair: bool) -> None:
    """A parent pass applied its plan: clear the problem when that pass covered it (a full
    apply, or a repair that applied the rejected child; a problem of the parent itself, such
    as an internal error, is cleared by any parent pass that got this far)."""
    found = ctx.recall(key_of(body)).problem
    if found is None:
        return
    kinds_done = {s.kind_name for s in plan.steps()}
    if not repair or found.child is None or found.child in kinds_done:
        ctx.update(key_of(body), lambda memory: replace(memory, problem=None))
