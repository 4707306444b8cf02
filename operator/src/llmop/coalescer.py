"""The operator's one queue of reconcile passes: one waiting hint per parent, one worker per parent.

Every trigger of a parent's pass puts the parent's key and a hint here — the parent's own
handler (which awaits the run), the child, pod and Job events, the agents' readings, the
router, name and idle checks, the periodic checks, the download poll, and the timers of the
deferred statuses and name-conflict retries: `Coalescer.submit` on kopf's event loop, or the
`Context.queue` that `attach` makes, from any thread. A key waits a short while (`delay`:
`COALESCE_SECONDS` in the operator; the parent's own handler, a child's deletion and a timer
wait none) for later triggers, which merge into its waiting hint (`Hint.merge`) instead of
queuing beside it; then the key's one drain task queues one job for it in a pool, and the job
takes the waiting hint only when a thread starts it, so everything that came meanwhile runs in
that one pass (as client-go's workqueue dedups an item until a worker gets it). Whatever arrives
while the pass runs waits for it and runs after it, merged into one hint. So a parent is never
reconciled twice at once, a burst of triggers is one pass with one status write however long
the pools' backlog, and different parents run side by side, as many as the pools have threads.

Which pool: a full pass goes to kopf's (`memo.executor`), where the parents' passes always ran;
the others to the refresh pool that `main` puts in the memo (`memo.refresh_executor`). Under a
burst kopf's pool is a FIFO of hundreds of full passes, each a few API calls, and a CR whose
pods were ready waited behind all of them for its Ready (45 s at 1,000 CRs with pods); a
refresh is a status write or a repair, so a few threads of its own keep it prompt. A full pass
that comes while the key's job still waits for a refresh thread moves it to kopf's pool (the
parent's own handler never waits behind the refresh backlog).

Why not await the pool in the watch handlers: a watch event whose handler awaits a worker
holds up every later event of its object in kopf's per-object queue, each fully decoded, and
under a burst the pool is a long FIFO of passes blocked on the API server. A pass decides from
the caches when it runs, so one waiting entry per parent is all the memory a burst costs.
The bookkeeping runs on kopf's event loop; only the waiting entries, which the jobs take from
their threads, are under a lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from llmop.hub import HubUnavailableError
from llmop.kube import KubeError
from llmop.reconcile import Context, Hint, reconcile

log = logging.getLogger("llmop.handlers")

Key = tuple[str, str]
Run = Callable[[Context, Key, Hint], str]
"""What a worker runs for a key: `reconcile.reconcile` (tests hand in a recorder)."""

COALESCE_SECONDS = 1.0
"""How long a trigger waits for later ones of the same parent before its pass runs (the
operator's coalescer, made by `main`): a new Deployment's status is written three times within
about a second, and one status write of the parent then says it all."""


@dataclass
class _Waiting:
    """What waits for a key's next run: the merged hint, when it is due (the event loop's
    clock), and the callers awaiting that run's result."""

    hint: Hint
    due: float
    waiters: list[asyncio.Future[str]] = field(default_factory=list)


@dataclass
class _Job:
    """One job of a key in a pool: it takes the key's waiting hint when a thread starts it,
    unless it was withdrawn before (then it takes nothing)."""

    full: bool
    started: bool = False
    withdrawn: bool = False


_Outcome = tuple[_Waiting, str | None, Exception | None]
"""What a job took and ran: the waiting entry, the pass's result or its error."""


def _pool(memo: Any, full: bool) -> Executor | None:
    """kopf's pool for a full pass, the refresh pool for the others (kopf's as a fallback)."""
    kopf_pool: Executor | None = getattr(memo, "executor", None)
    if full:
        return kopf_pool
    refresh: Executor | None = getattr(memo, "refresh_executor", None)
    return refresh or kopf_pool


def _settle(
    waiters: list[asyncio.Future[str]], result: str | None, error: Exception | None
) -> None:
    for waiter in waiters:
        if waiter.done():  # its caller was cancelled meanwhile
            continue
        if error is not None:
            waiter.set_exception(error)
        else:
            waiter.set_result(result or "")


class Coalescer:
    """One waiting hint per parent, merged from every trigger that comes before a thread takes
    it, and one drain task per parent that runs its passes one after the other."""

    def __init__(self, delay: float = 0.0, run: Run = reconcile) -> None:
        self.delay = delay
        self.run = run
        self.submitted = 0
        """Triggers put on the queue (the burst tests and the bench compare it with `runs`)."""
        self.runs = 0
        """Passes run."""
        # The waiting entries are merged into on the event loop and taken by the jobs' threads.
        self._lock = threading.Lock()
        self._waiting: dict[Key, _Waiting] = {}
        self._jobs: dict[Key, _Job] = {}
        self._drains: dict[Key, asyncio.Task[None]] = {}
        self._wakes: dict[Key, asyncio.Event] = {}

    def submit(
        self,
        memo: Any,
        key: Key,
        hint: Hint,
        *,
        delay: float | None = None,
        wait: bool = False,
    ) -> asyncio.Future[str] | None:
        """Put the pass of `key` on the queue, merged with the hint waiting for `key` (also one
        whose job waits for a thread). It is due `delay` seconds from now (default: the queue's
        `delay`), or sooner when an earlier trigger of the key is due sooner; a due pass waits
        only for the key's pass in progress and for a thread. With `wait`, returns a future of
        the result of the run that includes this hint (its exception when that run raised)."""
        loop = asyncio.get_running_loop()
        due = loop.time() + (self.delay if delay is None else delay)
        future: asyncio.Future[str] | None = loop.create_future() if wait else None
        self.submitted += 1
        with self._lock:
            waiting = self._waiting.get(key)
            if waiting is None:
                waiting = self._waiting[key] = _Waiting(hint, due)
            else:
                waiting.hint = waiting.hint.merge(hint)
                waiting.due = min(waiting.due, due)
            if future is not None:
                waiting.waiters.append(future)
            job = self._jobs.get(key)
            if job is not None and waiting.hint.full and not job.full and not job.started:
                # Out of the refresh pool's backlog: the drain queues it in kopf's pool.
                job.withdrawn = True
                del self._jobs[key]
        if key not in self._drains:
            # An empty context: a task inherits its creator's, and inside a handler that holds
            # kopf's cause, the whole decoded watch event, until the task ends. Under a burst
            # that kept ~1,900 raw events alive behind the thread pool's queue.
            self._drains[key] = asyncio.create_task(
                self._drain(memo, key), context=contextvars.Context()
            )
        else:
            self._wake(key)
        return future

    def _wake(self, key: Key) -> None:
        wake = self._wakes.get(key)
        if wake is not None:
            wake.set()

    async def _drain(self, memo: Any, key: Key) -> None:
        """The key's one worker: while a job of the key is in a pool, or a hint waits, queue
        the next job once the hint is due and no job of the key is in a pool, and sleep until
        something changes (a job ends, a trigger comes, the hint falls due)."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                waiting = self._waiting.get(key)
                pause: float | None = None
                if key not in self._jobs:
                    if waiting is None:
                        return
                    pause = waiting.due - loop.time()
                    if pause <= 0:
                        self._queue(memo, key, waiting.hint.full)
                        continue
                wake = self._wakes[key] = asyncio.Event()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(pause):
                        await wake.wait()
                del self._wakes[key]
        finally:
            del self._drains[key]
            self._wakes.pop(key, None)

    def _queue(self, memo: Any, key: Key, full: bool) -> None:
        """Queue a job of the key in its pool (a pool shut down at the term's end raises)."""
        job = _Job(full)
        future = asyncio.get_running_loop().run_in_executor(
            _pool(memo, full), self._take_and_run, memo, key, job
        )
        self._jobs[key] = job
        future.add_done_callback(lambda done: self._done(key, job, done))

    def _take_and_run(self, memo: Any, key: Key, job: _Job) -> _Outcome | None:
        """In a pool's thread: take the key's waiting hint (merged with everything that came
        while the job waited for this thread) and run its pass."""
        with self._lock:
            if job.withdrawn:
                return None
            job.started = True
            waiting = self._waiting.pop(key, None)
        if waiting is None:
            return None
        try:
            return waiting, self.run(memo.context, key, waiting.hint), None
        except Exception as error:
            return waiting, None, error

    def _done(self, key: Key, job: _Job, done: asyncio.Future[_Outcome | None]) -> None:
        """On the event loop: a job ended; settle its callers, and let the key's drain go on."""
        if self._jobs.get(key) is job:
            del self._jobs[key]
        outcome = None if done.cancelled() or done.exception() else done.result()
        if outcome is not None:
            self.runs += 1
            waiting, result, error = outcome
            if error is not None and not waiting.waiters:  # else its caller reports it
                if isinstance(error, KubeError | HubUnavailableError):
                    # The next trigger, or the parent's own handler, tries again.
                    log.warning(
                        "could not reconcile %s/%s (%s): %s", *key, waiting.hint.trigger, error
                    )
                else:
                    log.error(
                        "reconciling %s/%s (%s) failed",
                        *key,
                        waiting.hint.trigger,
                        exc_info=error,
                    )
            _settle(waiting.waiters, result, error)
        self._wake(key)

    def attach(self, memo: Any) -> Attached:
        """The queue as `Context.queue` (call on the event loop the queue runs on)."""
        return Attached(self, memo, asyncio.get_running_loop())

    async def idle(self) -> None:
        """Wait until nothing is waiting or running (the tests wait on it)."""
        while self._drains:
            await asyncio.gather(*self._drains.values(), return_exceptions=True)


class Attached:
    """The coalescer as the reconcile's triggers see it (`reconcile.context.Queue`): `put` from
    any thread — a background loop's, a pass's own worker — hands the trigger to the event
    loop."""

    def __init__(self, coalescer: Coalescer, memo: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._coalescer = coalescer
        self._memo = memo
        self._loop = loop

    def put(self, key: Key, hint: Hint, *, after: float | None = None) -> None:
        """`Coalescer.submit` from any thread; with `after`, on a timer of that many seconds,
        and then due at once (a timer per call, not a delay per run: a fallback that decides
        to wait longer puts itself here again from its worker, and must wait again)."""
        try:
            self._loop.call_soon_threadsafe(self._put, key, hint, after)
        except RuntimeError:
            # The term's event loop has closed: its passes are moot (the next term resumes
            # every parent).
            log.debug("no queue any more for %s/%s (%s)", *key, hint.trigger)

    def _put(self, key: Key, hint: Hint, after: float | None) -> None:
        if after is None:
            self._coalescer.submit(self._memo, key, hint)
        else:
            self._loop.call_later(after, self._due, key, hint)

    def _due(self, key: Key, hint: Hint) -> None:
        self._coalescer.submit(self._memo, key, hint, delay=0.0)
