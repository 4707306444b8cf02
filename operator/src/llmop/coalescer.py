"""The coalescing queue of the event handlers' writes: at most one pending worker run per key.

A child or pod event whose handler (`llmop.handlers`) decides that something must be written
hands its parent's pass (`reconcile.reconcile`, keyed by the parent and the hint's lane) here
instead of awaiting a thread, as does the deferred statuses' fallback: a later event for the
same key replaces the arguments of the run still waiting, and the handler returns at once. The
run takes a thread of the refresh pool that `main` puts in kopf's memo (`in_worker`).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable, Hashable
from typing import Any

from llmop.kube import KubeError

log = logging.getLogger("llmop.handlers")

COALESCE_SECONDS = 1.0
"""How long a child or pod event waits for later ones of the same object before its refresh
runs (the operator's coalescer, made by `main`): a new Deployment's status is written three
times within about a second, and one status write of the parent then says it all."""


async def in_worker(memo: Any, function: Callable[..., Any], *args: Any) -> Any:
    """Run a blocking step of an event handler in the refresh pool that `main` put in the memo.

    Not in kopf's pool, where the reconciles run: under a burst that pool is a FIFO of hundreds
    of reconciles, each a few API calls, and a CR whose pods were ready waited behind all of
    them for its Ready (45 s at 1,000 CRs with pods). A refresh is a status write or a repair,
    so a few threads of its own keep it prompt. Falls back to kopf's pool (`memo.executor`)."""
    executor = getattr(memo, "refresh_executor", None) or getattr(memo, "executor", None)
    return await asyncio.get_running_loop().run_in_executor(executor, function, *args)


class Coalescer:
    """At most one pending worker run per key: a later event for the key replaces the arguments
    of the run still waiting for a thread, and the handler returns at once.

    Why: a watch event whose handler awaits a worker holds up every later event of its object in
    kopf's per-object queue, each fully decoded, and under a burst the thread pool is a long FIFO
    of reconciles blocked on the API server. The refreshes decide from the caches when they run,
    so only the newest event of a key matters; coalescing keeps one entry per key in memory
    instead of a queue of bodies, and one pool item instead of many. Runs on kopf's event loop
    only (no locking)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self._waiting: dict[Hashable, tuple[Callable[..., Any], tuple[Any, ...]]] = {}
        self._drains: dict[Hashable, asyncio.Task[None]] = {}

    def submit(
        self,
        memo: Any,
        key: Hashable,
        function: Callable[..., Any],
        *args: Any,
        delay: float | None = None,
    ) -> None:
        """Run `function(*args)` in the pool soon, unless a later submit for `key` replaces it
        before a thread takes it. `delay` overrides the queue's wait for later events (a run
        already timed by its caller, like the deferred statuses' fallback, waits no more)."""
        self._waiting[key] = (function, args)
        if key not in self._drains:
            # An empty context: a task inherits its creator's, and inside a handler that holds
            # kopf's cause, the whole decoded watch event, until the task ends. Under a burst
            # that kept ~1,900 raw events alive behind the thread pool's queue.
            self._drains[key] = asyncio.create_task(
                self._drain(memo, key, self.delay if delay is None else delay),
                context=contextvars.Context(),
            )

    async def _drain(self, memo: Any, key: Hashable, delay: float) -> None:
        try:
            if delay:
                await asyncio.sleep(delay)
            while key in self._waiting:
                function, args = self._waiting.pop(key)
                try:
                    await in_worker(memo, function, *args)
                except KubeError as error:
                    # The next event, or the parent's own reconcile, tries again.
                    log.warning("could not process an event of %s: %s", key, error)
                except Exception:
                    log.exception("processing an event of %s failed", key)
        finally:
            del self._drains[key]

    async def idle(self) -> None:
        """Wait until nothing is pending (the tests wait on it)."""
        while self._drains:
            await asyncio.gather(*self._drains.values(), return_exceptions=True)
