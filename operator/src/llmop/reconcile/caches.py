"""Reading the watch caches: a parent's live children (owned as `llmop.observed.controller_owner`
says), the cached parent, its parsed spec (once per generation) and the status as last
written."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from llmop import kinds
from llmop.api.v1alpha1 import LLMDeployment
from llmop.cache_gate import waiting_message
from llmop.desired import DesiredState, desired_state
from llmop.kinds import ChildKind
from llmop.observed import controller_owner
from llmop.reconcile.context import Context, PackedParse, Parsed


def one_owned(values: Iterable[Mapping[str, Any]] | None, uid: str | None) -> dict[str, Any] | None:
    """The cached object owned by `uid` (a recreated parent's old children do not count)."""
    for value in list(values or ()):
        owner = controller_owner(value)
        if uid is None or (owner is not None and owner.uid == uid):
            return dict(value)
    return None


def live_children(ctx: Context, namespace: str, name: str, uid: str) -> dict[ChildKind, Any]:
    """The watched children of one parent as the watch caches last saw them, and its
    LeaderWorkerSet as last listed."""
    live = {
        kind: one_owned(index.get((namespace, name)), uid) for kind, index in ctx.children.items()
    }
    live[kinds.LEADER_WORKER_SET] = one_owned(ctx.groups.get((namespace, name)), uid)
    return live


def cached_parent(ctx: Context, namespace: str, name: str) -> dict[str, Any] | None:
    return one_owned(ctx.parents.get((namespace, name)), None)


def key_of(body: Mapping[str, Any]) -> tuple[str, str]:
    metadata = body["metadata"]
    return metadata["namespace"], metadata["name"]


def _summary(error: ValidationError) -> str:
    parts = []
    for item in error.errors()[:5]:
        location = ".".join(str(part) for part in item["loc"])
        parts.append(f"{location}: {item['msg']}")
    return "; ".join(parts)


def generation_of(body: Mapping[str, Any]) -> tuple[str, int | None]:
    """(uid, generation) of a parent: what each per-generation memory of this process (parsed
    spec, model gate, found problem) is kept for."""
    metadata = body["metadata"]
    return str(metadata.get("uid") or ""), metadata.get("generation")


def parse(ctx: Context, body: Mapping[str, Any]) -> Parsed:
    """The parent's desired state, computed once per generation."""
    key = key_of(body)
    uid, generation = generation_of(body)
    cached = ctx.recall(key).parsed
    if cached is not None and (cached.uid, cached.generation) == (uid, generation):
        if cached.planned is None:
            return cached.unpack(None)
        with contextlib.suppress(ValidationError):  # else parsed afresh, the error recorded
            return cached.unpack(LLMDeployment.model_validate(body))
    try:
        desired: DesiredState | None = desired_state(
            LLMDeployment.model_validate(body), ctx.render_settings
        )
        error = None
    except ValidationError as invalid:
        desired, error = None, _summary(invalid)
    parsed = Parsed(uid, generation, desired, error)
    packed = PackedParse.pack(parsed)
    ctx.update(key, lambda memory: replace(memory, parsed=packed))
    return parsed


def previous_status(ctx: Context, body: Mapping[str, Any]) -> Any:
    """The status as last written: this process's own write when the body predates it (the
    operator is the only status writer, and a watch event may lag behind its own patch)."""
    written = ctx.recall(key_of(body)).written
    if written is not None and written[0] == body["metadata"].get("uid"):
        return written[1]
    return body.get("status")


def waiting_for_model(ctx: Context, body: Mapping[str, Any]) -> str | None:
    """Ready's and Reconciling's message while this generation's engine children wait for the
    model cache to fill (None when they do not)."""
    gate = ctx.recall(key_of(body)).model_gate
    if gate is None or (gate.uid, gate.generation) != generation_of(body):
        return None
    return waiting_message(gate.status.download)
