"""The reconcile's one pass driven the way the handlers drive it, for unit tests that feed it
watch events and parents by hand: `noted` turns the event into a key and a hint, `quiet` says
whether the event loop would answer it, `reconcile` runs the pass; `Recorded` stands where the
operator's queue would, keeping what was put on it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from llmop import reconcile
from llmop.metrics import RESULT_SKIPPED
from llmop.reconcile.entry import noted
from llmop.reconcile.quiet import quiet


def _found(
    ctx: reconcile.Context, event_type: str | None, obj: Mapping[str, Any], kind: str | None
) -> tuple[tuple[str, str], reconcile.Hint] | None:
    return noted(ctx, kind or str(obj.get("kind")), event_type, obj)


def event_pass(
    ctx: reconcile.Context, event_type: str | None, obj: Mapping[str, Any], kind: str | None = None
) -> str:
    """The pass a watch event of `obj` asks for (`kind`: the object's kind when it does not say
    it, as a pod summary does), run at once; "skipped" when it asks none."""
    found = _found(ctx, event_type, obj, kind)
    return RESULT_SKIPPED if found is None else reconcile.reconcile(ctx, *found)


def event_quiet(
    ctx: reconcile.Context, event_type: str | None, obj: Mapping[str, Any], kind: str | None = None
) -> bool:
    """The event loop answers this event without a pass (nothing would be written)."""
    found = _found(ctx, event_type, obj, kind)
    return found is None or quiet(ctx, *found)


def parent_pass(ctx: reconcile.Context, body: Mapping[str, Any]) -> str:
    """The parent's own pass (create, update, resume), with `body` as kopf delivered it."""
    metadata = body["metadata"]
    return reconcile.reconcile(
        ctx, (metadata["namespace"], metadata["name"]), reconcile.Hint.parent(body)
    )


def status_pass(ctx: reconcile.Context, namespace: str, name: str) -> str:
    """The status-only pass the agents' readings ask for."""
    return reconcile.reconcile(ctx, (namespace, name), reconcile.Hint.FLEET)


def deferred_pass(ctx: reconcile.Context, namespace: str, name: str) -> str:
    """The deferred status's fallback pass."""
    return reconcile.reconcile(ctx, (namespace, name), reconcile.Hint.DEFERRED)


@dataclass
class Recorded:
    """A `Context.queue` that keeps what the passes put on it, (key, hint, after), and runs
    nothing: the test runs the pass it wants, when it wants."""

    put_on: list[tuple[tuple[str, str], reconcile.Hint, float | None]] = field(default_factory=list)

    def put(
        self, key: tuple[str, str], hint: reconcile.Hint, *, after: float | None = None
    ) -> None:
        self.put_on.append((key, hint, after))
