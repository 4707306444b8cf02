"""The operator's background loops, as one table, started and stopped in one place.

Each row of `TABLE` is a `Runnable`: a name, a factory that, given one leadership term's
`Term` (its `Context`, what kopf's run hands the late-CRD check), returns either a coroutine
(run as a task on the term's event loop, kopf's) or the body of a thread (given a stop event),
and an `enabled` predicate on the operator's config. Every loop runs on `llmop.periodic`.

`main` calls `start` once per term, on the term's event loop just before kopf, and stops what
it started when the term ends, whether by SIGTERM or because the Lease was lost: the tasks are
cancelled and awaited, the threads told to stop and joined (`Started`). The next term starts
fresh loops on its own `Context`.

Adding a background loop: its own module with a `run`, and one row here.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from llmop import (
    crd_check,
    download_poll,
    facts_check,
    fleet,
    group_check,
    hub_check,
    idle_check,
    late_crds,
    name_check,
    pool_check,
    router_check,
)
from llmop.config import OperatorConfig
from llmop.pod_client import AgentClient
from llmop.reconcile import Context

log = logging.getLogger("llmop.runnables")

ThreadBody = Callable[[threading.Event], None]
"""What a thread row runs: returns soon after its stop event is set."""


@dataclass(frozen=True)
class Term:
    """What a factory gets: one leadership term's."""

    context: Context
    kopf: late_crds.KopfRun


@dataclass(frozen=True)
class Runnable:
    """One background loop."""

    name: str
    """Its task's name (`llmop-<name>`) or its thread's."""
    factory: Callable[[Term], Coroutine[Any, Any, None] | ThreadBody]
    """A coroutine: a task on the term's event loop; a function: a thread's body."""
    enabled: Callable[[OperatorConfig], bool] = lambda _config: True


def _with_router(config: OperatorConfig) -> bool:
    return config.router is not None


async def _read_fleet(context: Context) -> None:
    """`llmop.fleet` with a client of its own, closed when the loop is stopped."""
    client = AgentClient(concurrency=context.config.agent_read_concurrency)
    try:
        await fleet.run(context, client, interval=context.config.agent_read_interval_seconds)
    finally:
        await client.close()


def _late_crds(term: Term) -> Coroutine[Any, Any, None]:
    run = term.kopf
    served = late_crds.serves(term.context.kube)
    return late_crds.run(run.insights, run.settings, run.registry, served)


def _thread(body: Callable[[Context, threading.Event], None]) -> Callable[[Term], ThreadBody]:
    return lambda term: lambda stop: body(term.context, stop)


TABLE: tuple[Runnable, ...] = (
    Runnable(
        "fleet-reader",
        lambda term: _read_fleet(term.context),
        lambda config: config.agent_read_interval_seconds > 0,
    ),
    Runnable("router-check", lambda term: router_check.run(term.context), _with_router),
    Runnable("name-check", lambda term: name_check.run(term.context), _with_router),
    # Scale to zero only with a router to wake the models.
    Runnable("idle-check", lambda term: idle_check.run(term.context), _with_router),
    Runnable("group-check", lambda term: group_check.run(term.context)),
    Runnable("hub-check", lambda term: hub_check.run(term.context)),
    Runnable("pool-check", lambda term: pool_check.run(term.context)),
    Runnable("late-crds", _late_crds),
    Runnable("download-poller", _thread(download_poll.run)),
    Runnable("facts-reader", _thread(facts_check.run)),
    Runnable("crd-check", _thread(crd_check.run)),
)
"""Every background loop of a leadership term."""


class Started:
    """What `start` started for one term; `stop` ends it all."""

    def __init__(
        self,
        tasks: dict[str, asyncio.Task[None]],
        threads: dict[str, threading.Thread],
        stop: threading.Event,
    ) -> None:
        self.tasks = tasks
        self.threads = threads
        self._stop = stop

    @property
    def names(self) -> list[str]:
        """The rows started, in the table's order per kind (tasks, then threads)."""
        return [*self.tasks, *self.threads]

    def signal(self) -> None:
        """Tell the threads to stop (from any thread; they return within a round)."""
        self._stop.set()

    async def stop(self) -> None:
        """Tell the threads to stop, and cancel the tasks and wait for them (on the term's
        event loop)."""
        self.signal()
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)

    def join(self, deadline: float) -> list[str]:
        """Wait for the threads until `deadline` (`time.monotonic()`); those still running."""
        self.signal()
        for thread in self.threads.values():
            thread.join(max(0.0, deadline - time.monotonic()))
        return [name for name, thread in self.threads.items() if thread.is_alive()]


def start(term: Term, table: Sequence[Runnable] | None = None) -> Started:
    """Start every row of `table` (default `TABLE`) that the operator's config enables; call it
    on the term's event loop."""
    stop = threading.Event()
    tasks: dict[str, asyncio.Task[None]] = {}
    threads: dict[str, threading.Thread] = {}
    for row in TABLE if table is None else table:
        if not row.enabled(term.context.config):
            continue
        made = row.factory(term)
        if callable(made):
            thread = threading.Thread(target=made, args=(stop,), name=row.name, daemon=True)
            thread.start()
            threads[row.name] = thread
        else:
            tasks[row.name] = asyncio.create_task(made, name=f"llmop-{row.name}")
    log.debug("started %s", [*tasks, *threads])
    return Started(tasks, threads, stop)
