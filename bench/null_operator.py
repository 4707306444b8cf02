"""A kopf operator with llmop's watch layout and handlers that do nothing: what kopf itself
costs for a burst's watch events, the floor under `llmop run`'s CPU and memory that no change to
llmop's own code can go below while its caches are kopf indexes and its child handlers kopf
`on.event` handlers. Not a test, and never shipped: `operator_bench.py --floor kopf` runs it.

It registers what `llmop.handlers` registers (same kinds, same label filters, same ids, same
settings from `llmop.main.build_settings`: in-memory progress and diff-base storage, quiet
posting): an index and a create/update/resume handler and an event handler on LLMDeployments,
an index and an event handler on engine pods and on every watched child kind, an event handler
on Jobs. Each index stores one small value per object; every handler returns at once. Its own
registry, so that llmop's handlers (registered when `llmop.main` is imported) stay out.

    python bench/null_operator.py LIVENESS_PORT [--no-child-indexes]

`--no-child-indexes` leaves out the child kinds' and pods' indexes: what one kopf handler run
per child event, instead of two, would save.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any, cast

from llmop import cli

cli.keep_out_unused_libraries()  # as `llmop run` does, before kopf is imported

import kopf  # noqa: E402

from llmop import handlers, kinds  # noqa: E402
from llmop.api.v1alpha1 import GROUP, PLURAL, VERSION  # noqa: E402
from llmop.config import OperatorConfig  # noqa: E402
from llmop.main import _configure_logging, build_settings  # noqa: E402


async def _index(namespace: str | None, name: str, **_: Any) -> Any:
    return {(namespace or "", name): True}


async def _nothing(**_: Any) -> None:
    return None


def _sync_nothing(**_: Any) -> None:
    return None


def registry(*, child_indexes: bool) -> kopf.OperatorRegistry:
    """llmop's handler layout, every handler a no-op."""
    found = kopf.OperatorRegistry()
    kopf.on.login(id="credentials", registry=found)(handlers.login)
    kopf.index(GROUP, VERSION, PLURAL, id=handlers.PARENT_INDEX, registry=found)(_index)
    for cause in (kopf.on.resume, kopf.on.create, kopf.on.update):
        cause(GROUP, VERSION, PLURAL, id="reconcile", registry=found)(_sync_nothing)
    kopf.on.event(GROUP, VERSION, PLURAL, id=handlers.COUNT_HANDLER_ID, registry=found)(_nothing)
    labels = handlers.MANAGED_LABELS
    watched = [
        (kind, handlers.child_handler_id(kind), handlers._index_id(kind)) for kind in kinds.WATCHED
    ]
    for kind, handler_id, index_id in [
        (kinds.POD, handlers.POD_HANDLER_ID, handlers.POD_INDEX),
        *watched,
    ]:
        if child_indexes:
            kopf.index(kind.api_version, kind.plural, labels=labels, id=index_id, registry=found)(
                _index
            )
        kopf.on.event(kind.api_version, kind.plural, labels=labels, id=handler_id, registry=found)(
            _nothing
        )
    kopf.on.event(
        kinds.JOB.api_version,
        kinds.JOB.plural,
        labels=labels,
        id=handlers.JOB_HANDLER_ID,
        registry=found,
    )(_sync_nothing)
    return found


def main(argv: list[str]) -> int:
    port = int(argv[0])
    config = OperatorConfig()
    _configure_logging(config)  # and so its filter of the handlers' "succeeded." lines
    asyncio.run(
        kopf.operator(
            registry=registry(child_indexes="--no-child-indexes" not in argv),
            settings=build_settings(config),
            clusterwide=True,
            standalone=True,
            liveness_endpoint=f"http://127.0.0.1:{port}/healthz",
            identity=cast("Any", "llmop-null-operator"),
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
