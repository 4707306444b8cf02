"""Which children this process found in sync with their intent, so that a child event that
changed nothing the drift check reads skips the check.

Most child events at a burst are a Deployment's status moving (the controller's two or three updates
per new Deployment); its spec, labels, annotations and owner are what they were when the
last event was checked. Comparing the rendered Deployment with the live one again (~100 µs:
decoding the cached spec text, then walking both) found the same answer each time.

What is remembered, per parent: the packed desired state the check compared against
(`PackedParse`, by identity: a new generation or a fresh parse replaces it, and with it
every answer), and per child kind a fingerprint of the live child: its uid, its spec (for a
kind whose `metadata.generation` the API server raises on every spec change, the generation
stands for it), labels, annotations and owner references: everything of the live child
that `plan.drifted` compares or `rollout_room.with_strategy` reads. An answer is kept only
when the desired state came from the spec alone: not for a model cache's gate, and not for
the adapters' ConfigMap, whose intent also follows the adapter pre-flight. Each entry pairs
a fingerprint with the answer for that same live object, so entries written by any thread in
any order are true statements; the worst a race does is cost one check.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from llmop import kinds
from llmop.kinds import ChildKind
from llmop.reconcile.caches import generation_of, key_of
from llmop.reconcile.context import Context, InSync, PackedParse

GENERATION_TRACKED = frozenset({kinds.DEPLOYMENT, kinds.LEADER_WORKER_SET})
"""Kinds whose `metadata.generation` changes with every spec change (apps/v1 and custom
resources with a status subresource), so it fingerprints the spec."""

NOT_REMEMBERED = frozenset({kinds.CONFIG_MAP})
"""Kinds whose intent depends on more than the packed desired state."""


def fingerprint(kind: ChildKind, live: Mapping[str, Any]) -> tuple[Any, ...]:
    """What the drift check of `live` against an unchanged intent depends on."""
    metadata = live.get("metadata") or {}
    spec = metadata.get("generation") if kind in GENERATION_TRACKED else live.get("spec")
    return (
        metadata.get("uid"),
        spec,
        metadata.get("labels"),
        metadata.get("annotations"),
        metadata.get("ownerReferences"),
    )


def _current(ctx: Context, body: Mapping[str, Any]) -> PackedParse | None:
    """The packed desired state of `body`'s generation, if this process parsed it."""
    packed = ctx.recall(key_of(body)).parsed
    if packed is None or (packed.uid, packed.generation) != generation_of(body):
        return None
    return packed


def known(
    ctx: Context, body: Mapping[str, Any], kind: ChildKind, live: Mapping[str, Any] | None
) -> bool:
    """Whether `live` (the child of `kind` of parent `body`) was found in sync before, against
    the desired state of `body`'s generation, and is unchanged in all the check reads."""
    if live is None:
        return False
    entry = ctx.recall(key_of(body)).in_sync
    if entry is None or entry.packed is not _current(ctx, body):
        return False
    remembered = entry.found.get(kind)
    return remembered is not None and remembered == fingerprint(kind, live)


def note(
    ctx: Context, body: Mapping[str, Any], kind: ChildKind, live: Mapping[str, Any] | None
) -> None:
    """Remember that `live` was just found in sync with the desired state of `body`'s
    generation (the caller planned it from that state alone)."""
    packed = _current(ctx, body)
    if live is None or packed is None or packed.planned is None or kind in NOT_REMEMBERED:
        return
    key = key_of(body)
    entry = ctx.recall(key).in_sync
    found = dict(entry.found) if entry is not None and entry.packed is packed else {}
    found[kind] = fingerprint(kind, live)
    noted = InSync(packed, found)
    ctx.update(key, lambda memory: replace(memory, in_sync=noted))
