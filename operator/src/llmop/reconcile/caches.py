"""Reading the watch caches: a parent's live children (owned as `llmop.observed.controller_owner`
says), the cached parent, its parsed spec (once per generation, and again when the files of a
model outside the catalog are read: `llmop.model_facts`) and the status as last written."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from llmop import kinds, model_facts
from llmop.api.v1alpha1 import LLMDeployment, PlanStatus
from llmop.cache_gate import waiting_message
from llmop.desired import desired_state
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
    """The parent's desired state, computed once per generation — and again when the files
    of a model outside the catalog that its plan waited for have been read (no I/O: the
    answer known now comes from `Context.facts`, which has them read if nobody did yet)."""
    key = key_of(body)
    uid, generation = generation_of(body)
    cached = ctx.recall(key).parsed
    if cached is not None and (cached.uid, cached.generation) == (uid, generation):
        if cached.planned is None:
            return cached.unpack(None)
        with contextlib.suppress(ValidationError):  # else parsed afresh, the error recorded
            llmd = LLMDeployment.model_validate(body)
            asked = cached.asked
            if asked is None or ctx.facts.want(asked, key, (uid, generation)) is cached.answer:
                return cached.unpack(llmd)
            return _keep(ctx, key, _planned(ctx, body, llmd))
    try:
        parsed = _planned(ctx, body, LLMDeployment.model_validate(body))
    except ValidationError as invalid:
        parsed = Parsed(uid, generation, None, _summary(invalid))
    return _keep(ctx, key, parsed)


def _keep(ctx: Context, key: tuple[str, str], parsed: Parsed) -> Parsed:
    packed = PackedParse.pack(parsed)
    ctx.update(key, lambda memory: replace(memory, parsed=packed))
    return parsed


def _planned(ctx: Context, body: Mapping[str, Any], llmd: LLMDeployment) -> Parsed:
    """Plan and render `llmd`, with the facts of its model's files when its plan needs them
    (`model_facts.request_for`): the answer known now, and this parent registered as waiting
    for one (`FactsMemory.want`)."""
    uid, generation = generation_of(body)
    asked = model_facts.request_for(llmd)
    answer = None
    verdict = None
    if asked is not None:
        answer = ctx.facts.want(asked, key_of(body), (uid, generation))
        held = None if isinstance(answer, model_facts.Read) else _planned_from_files(ctx, body)
        verdict = model_facts.verdict(
            asked, answer, tolerant=llmd.spec.engine.backend == "simulator", held=held
        )
    desired = desired_state(llmd, ctx.render_settings, facts=verdict)
    return Parsed(uid, generation, desired, None, asked, answer, verdict)


def _planned_from_files(ctx: Context, body: Mapping[str, Any]) -> PlanStatus | None:
    """status.plan as last written for this very generation from the model's files at the
    Hub: the plan this process (or the one before a restart) made, kept while they are read
    again."""
    stored = previous_status(ctx, body)
    if not isinstance(stored, Mapping):
        return None
    plan = stored.get("plan")
    if (
        stored.get("observedGeneration") != body["metadata"].get("generation")
        or not isinstance(plan, Mapping)
        or plan.get("factsSource") != "hub"
    ):
        return None
    with contextlib.suppress(ValidationError):
        return PlanStatus.model_validate(plan)
    return None


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
