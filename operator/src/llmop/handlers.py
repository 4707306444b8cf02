"""kopf handler registrations: thin, synchronous, and only orchestration.

- One level-based `reconcile` on create/update/resume of LLMDeployments. No delete handler, no
  timers or daemons on LLMDeployment: kopf then adds no finalizer, and children go by owner
  reference garbage collection.
- Low-level `on.event` handlers on the children (filtered by our label, also server side via
  `settings.watching.label_selectors` in `main`) repair drift and re-derive the parent's status.
  Low-level handlers store nothing on the children.

Handlers return None so kopf writes no handler results into the status.
"""

from __future__ import annotations

from typing import Any

import kopf

from llmop import names
from llmop.api.v1alpha1 import GROUP, PLURAL, VERSION
from llmop.kube import KubeError
from llmop.reconcile import Context, on_child_event, reconcile

CHILD_RESOURCES = (
    ("apps/v1", "deployments"),
    ("v1", "services"),
    ("autoscaling/v2", "horizontalpodautoscalers"),
    ("policy/v1", "poddisruptionbudgets"),
)
"""(apiVersion, plural) of every child kind the operator watches."""
MAX_RETRY_DELAY_SECONDS = 300.0
MANAGED_LABELS = {names.LABEL_MANAGED_BY: names.MANAGED_BY}
COUNT_HANDLER_ID = "count-llmdeployments"
WATCH_HANDLER_IDS = (COUNT_HANDLER_ID, *(f"child-{plural}" for _, plural in CHILD_RESOURCES))
"""Low-level handlers: they run on every watch event."""


def _context(memo: Any) -> Context:
    context: Context = memo.context
    return context


@kopf.on.resume(GROUP, VERSION, PLURAL, id="reconcile")
@kopf.on.create(GROUP, VERSION, PLURAL, id="reconcile")
@kopf.on.update(GROUP, VERSION, PLURAL, id="reconcile")
def reconcile_llmdeployment(
    namespace: str | None, name: str, retry: int, memo: Any, **_: Any
) -> None:
    """Converge one LLMDeployment; transient API errors retry with exponential backoff."""
    ctx = _context(memo)
    try:
        reconcile(ctx, namespace or "", name)
    except KubeError as error:
        delay = min(ctx.config.retry_delay_seconds * 2**retry, MAX_RETRY_DELAY_SECONDS)
        raise kopf.TemporaryError(str(error), delay=delay) from error


@kopf.on.event(GROUP, VERSION, PLURAL, id=COUNT_HANDLER_ID)
def count_llmdeployment(type: str, namespace: str | None, name: str, memo: Any, **_: Any) -> None:
    """Keep the managed-objects gauge current (cheap; stores nothing on the object)."""
    _context(memo).metrics.observe_object(
        "LLMDeployment", f"{namespace}/{name}", present=type != "DELETED"
    )


def child_event(type: str, body: kopf.Body, memo: Any, logger: Any, **_: Any) -> None:
    """A child changed or vanished: repair it, or refresh the parent's status. A transient API
    error is only logged: the next event, or the parent's own reconcile, tries again."""
    try:
        on_child_event(_context(memo), type, dict(body))
    except KubeError as error:
        logger.warning(f"Could not process a {body.get('kind')} event: {error}")


for _api_version, _plural in CHILD_RESOURCES:
    kopf.on.event(_api_version, _plural, labels=MANAGED_LABELS, id=f"child-{_plural}")(child_event)


@kopf.on.probe(id="reconciles")
def reconciles_probe(memo: Any, **_: Any) -> int:
    """Liveness payload: parents currently being reconciled (cheap, never fails)."""
    return len(_context(memo).locks)
