"""`llmop run`: configure and start the kopf operator.

Reads the config once, builds kopf's settings (our own annotation/finalizer prefixes, the last
handled spec kept in memory, server-side label filtering of child watches, quiet Event posting,
worker count), starts the metrics server, and runs kopf with the handlers from `llmop.handlers`.

With leader election the process is a standby until it holds the `llmop-operator` Lease
(`llmop.leader`, `llmop.standby`), then leads for one term: a kopf run of its own with a fresh
memo (`Context`, caches, API client), settings and background loops (`llmop.runnables`, started
before kopf and stopped after it). A term that loses the Lease fences its API client and cancels
kopf at once, stops its loops, waits for its threads and is dropped; the process then stands by
again,
and its next term starts from nothing, as a restarted process would. Only a term that cannot
be wound down in time (kopf or a handler hung) ends the process, with `LOST_EXIT_CODE`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import kopf

from llmop import handlers, kinds, late_crds, names, runnables, standby
from llmop.coalescer import COALESCE_SECONDS, Coalescer
from llmop.config import ConfigError, OperatorConfig, load
from llmop.kube import Kube, KubeError
from llmop.leader import LeaderElector, Timing, lease_namespace
from llmop.metrics import Metrics
from llmop.persistence import ProcessDiffBase, QuietProgressStorage
from llmop.reconcile import Context

log = logging.getLogger("llmop.main")

FINALIZER = f"{names.KOPF_PREFIX}/finalizer"
"""Never added (no delete handlers, timers or daemons), but named ours in case kopf needs one."""
WATCH_CHUNK_SIZE = 500


WORKER_IDLE_SECONDS = 1.0
"""How long kopf keeps an object's worker after its last event (kopf's default: 5 s). A waiting
worker still holds the last event it handled, the whole body with its managedFields: at a
1,000-CR burst the default kept ~20 MiB of them alive at the peak (155-159 → 135-136 MiB,
docs/benchmarks.md). An event after the second costs one new worker task, not a replay."""


def build_settings(config: OperatorConfig) -> kopf.OperatorSettings:
    """kopf's settings for `config`."""
    settings = kopf.OperatorSettings()
    settings.persistence.finalizer = FINALIZER
    # Nothing on the user's object unless a handler retries (`llmop.persistence`).
    settings.persistence.progress_storage = QuietProgressStorage(prefix=names.KOPF_PREFIX)
    settings.persistence.diffbase_storage = ProcessDiffBase(prefix=names.KOPF_PREFIX)
    # kopf posts an Event for every handler log line at INFO; only warnings are worth one.
    settings.posting.level = logging.WARNING
    settings.execution.max_workers = config.max_workers
    settings.execution.default_backoff = config.retry_delay_seconds
    settings.watching.chunk_size = WATCH_CHUNK_SIZE
    settings.queueing.idle_timeout = WORKER_IDLE_SECONDS
    selector = f"{names.LABEL_MANAGED_BY}={names.MANAGED_BY}"
    for kind in (*kinds.WATCHED, *kinds.OBSERVED, kinds.JOB):
        # Without this, kopf would receive every Deployment/Service/Pod in the cluster and
        # filter them client-side.
        settings.watching.label_selectors[kind.api_version, kind.plural] = selector
    settings.peering.standalone = config.standalone
    if config.peering_name is not None:
        settings.peering.name = config.peering_name
        settings.peering.mandatory = True
    settings.peering.priority = config.priority
    return settings


class _QuietWatchHandlers(logging.Filter):
    """Drop kopf's "Handler 'child-…' succeeded." lines: low-level handlers run on every watch
    event, so at INFO they would log every Deployment status change of every LLMDeployment."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.INFO or not isinstance(record.msg, str):
            return True
        return not (
            record.msg.startswith("Handler ")
            and record.msg.endswith(" succeeded.")
            and any(f"'{handler_id}'" in record.msg for handler_id in handlers.WATCH_HANDLER_IDS)
        )


def _configure_logging(config: OperatorConfig) -> None:
    log_format = kopf.LogFormat.JSON if config.log_format == "json" else kopf.LogFormat.FULL
    kopf.configure(verbose=config.verbose, log_format=log_format, log_prefix=True)
    quiet = _QuietWatchHandlers()
    for handler in logging.getLogger().handlers:
        handler.addFilter(quiet)
    # The access log of the liveness endpoint is one line per probe.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


GC_YOUNG_THRESHOLD = 10_000
"""Allocations between two collections of the youngest generation (CPython's default: 700)."""


def tune_garbage_collector() -> None:
    """Keep the cycle collector off the modules and the burst's short-lived objects.

    Measured at a 1,000-CR burst (gc callbacks, 2026-12-02): with CPython's defaults the
    collector took 2.7 of the operator's ~14 CPU-s, 2.0 of it in 12 full collections that each
    walked every object the imports made (87,000: the kubernetes client's models, kopf,
    pydantic) and every cached one. Freezing what exists at startup takes the imports out of
    every later collection; a larger youngest generation lets the watch events' decoded bodies
    die by reference count before a collection promotes them, so full collections become rare
    (2 instead of 12): 0.9 CPU-s in all. Garbage in reference cycles waits a little longer, a
    few MiB at most."""
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, oldest)


def refresh_workers(config: OperatorConfig) -> int:
    """Threads for the queue's passes other than full ones: status writes and repairs
    (`llmop.coalescer`)."""
    return max(1, config.max_workers // 8)


def _memo(config: OperatorConfig, metrics: Metrics) -> kopf.Memo:
    # A connection for every thread that calls the API: kopf's pool, the refresh pool, and the
    # download poller and the odd startup call.
    kube = Kube.connect(
        pool_size=config.max_workers + refresh_workers(config) + 4,
        timeout=config.request_timeout_seconds,
    )
    context = Context(
        kube=kube,
        config=config,
        metrics=metrics,
        instance=os.environ.get("POD_NAME") or socket.gethostname(),
    )
    # Shared by every object's copy of the memo: one waiting pass per parent, operator-wide.
    return kopf.Memo(context=context, coalescer=Coalescer(delay=COALESCE_SECONDS))


LEADER_REQUEST_TIMEOUT_SECONDS = 5.0
"""Deadline of one Lease request: well inside the renew deadline, so one hung request cannot
outlast it."""
LOST_EXIT_CODE = 3
"""The exit code of a process whose lost leadership term could not be wound down in time: kopf
still running `_Term.grace` seconds after the loss, or a handler thread still running
`TERM_DRAIN_SECONDS` after that (a hung handler). A term that winds down in time ends in the
process, which goes back to standby; one that exits is restarted by Kubernetes as a standby."""
TERM_DRAIN_SECONDS = 30.0
"""How long the handler threads of an ended term get to return. Their API calls fail at once
(the term's client is fenced), so only a Hub request (10 s a call) or a hung handler takes long."""
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_exit = os._exit
"""How a term that cannot be wound down ends the process (tests put a recorder here)."""


@contextlib.contextmanager
def _stop_signals(shutdown: threading.Event) -> Iterator[Callable[[], None]]:
    """SIGINT/SIGTERM set `shutdown` while no term's kopf has the signals (a standby, a term
    starting or winding down). Yields what installs the handlers again: asyncio puts the
    default ones back when a term's event loop closes."""

    def stop(signum: int, _frame: Any) -> None:
        log.info("%s: stopping", signal.Signals(signum).name)
        shutdown.set()

    def install() -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, stop)

    if threading.current_thread() is not threading.main_thread():
        yield lambda: None
        return
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    install()
    try:
        yield install
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _elector(config: OperatorConfig, instance: str) -> LeaderElector | None:
    """This process's candidate for the Lease, kept for its whole life (None with
    --no-leader-elect)."""
    if not config.leader_elect:
        return None
    return LeaderElector(
        # Not retried: an attempt that outlasted its timeout fails, and the keeper judges the
        # renew deadline then (retried four times over, a GET to a hung API server would take
        # 20 s, past the lease a standby waits out).
        Kube.connect(pool_size=2, timeout=LEADER_REQUEST_TIMEOUT_SECONDS, retry=False),
        lease_namespace(config, dict(os.environ)),
        # Unique per process, as client-go's are: two processes on one host (or a pod
        # restarted under the same name) are still two candidates. Kept across the process's
        # terms: a Lease it lost but nobody took is its own again at the next attempt.
        f"{instance}_{uuid.uuid4().hex[:8]}",
        timing=Timing(),
    )


class _Term:
    """One leadership term: a kopf run of its own, with a fresh memo (the `Context` and every
    cache in it, the API client), settings (kopf's in-process diff base) and background loops
    (`llmop.runnables`), all dropped when the term ends. kopf itself keeps nothing between
    runs (its indexes, object memories and resume state belong to the run), so the next term
    resumes every object as a restarted process would, from a fresh listing."""

    def __init__(
        self,
        config: OperatorConfig,
        metrics: Metrics,
        memo: kopf.Memo,
        elector: LeaderElector | None,
        shutdown: threading.Event,
        *,
        catch_signals: Callable[[], None] = lambda: None,
    ) -> None:
        """`catch_signals`: makes SIGINT/SIGTERM set `shutdown` again once kopf's loop is
        closed (asyncio then puts the default handlers back)."""
        self.config = config
        self.metrics = metrics
        self.memo = memo
        self.elector = elector
        self.shutdown = shutdown
        self._catch_signals = catch_signals
        self.settings = build_settings(config)
        # kopf's pool runs the full passes; the queue's other passes take a pool of their own
        # (`llmop.coalescer`), kopf's only as a fallback.
        memo.executor = self.settings.execution.executor
        memo.refresh_executor = ThreadPoolExecutor(
            refresh_workers(config), thread_name_prefix="llmop-refresh"
        )
        # The count handler forgets a deleted object's diff base (kopf never does).
        memo.diffbase = self.settings.persistence.diffbase_storage
        timing = elector.timing if elector is not None else Timing()
        self.grace = max(1.0, timing.lease_duration - timing.renew_deadline - 2)
        """How long kopf may take to stop once the Lease is lost, before the process exits."""
        self.kopf_stop = threading.Event()
        self.lost = threading.Event()
        # Handed to kopf, and shared with `llmop.late_crds`: a CRD kopf's discovery missed is
        # served too.
        self.insights = late_crds.new_insights()
        self.runnables = runnables.Term(
            self.context,
            late_crds.KopfRun(self.insights, self.settings, kopf.get_default_registry()),
        )
        self._started: runnables.Started | None = None
        self._lock = threading.Lock()
        self._running: tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]] | None = None
        self._watchdog: threading.Timer | None = None
        self._ended = False

    @property
    def context(self) -> Context:
        context: Context = self.memo.context
        return context

    def lead(self, liveness: str | None) -> bool:
        """Reconcile until the term ends; True when it ended because the Lease was lost (then
        nothing of it runs any more), False on SIGINT/SIGTERM (the Lease released)."""
        keeper_stop = threading.Event()
        if self.elector is not None:
            threading.Thread(
                target=self.elector.keep,
                args=(keeper_stop, self.lose),
                name="leader-keeper",
                daemon=True,
            ).start()
        self.metrics.leader.set(1)
        try:
            asyncio.run(self._operate(liveness))
        finally:
            self._catch_signals()
            self.metrics.leader.set(0)
            self.metrics.forget_objects()
            keeper_stop.set()
            self._wind_down()
            if self.elector is not None and not self.lost.is_set():
                # Only once nothing of this term can write: the standby may start at once.
                self.elector.release()
        return self.lost.is_set()

    def lose(self) -> None:
        """The Lease is lost (called from the keeper's thread): nothing of this term writes from
        now on. The API client is fenced (requests in flight are cut, later ones fail unsent)
        and kopf is cancelled, not asked to finish what it handles; if kopf has not stopped
        within `grace` (before a standby may lead), the process exits with LOST_EXIT_CODE."""
        with self._lock:
            if self._ended:  # too late to matter: the term is being wound down
                return
            self.lost.set()
        self.context.kube.fence()
        self.kopf_stop.set()
        with self._lock:
            running = self._running
            self._watchdog = threading.Timer(self.grace, self._give_up, ("kopf did not stop",))
            self._watchdog.daemon = True
            self._watchdog.start()
        if running is not None:
            loop, task = running
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(task.cancel)

    def _signalled(self, sig: signal.Signals) -> None:
        log.info("%s: stopping", sig.name)
        self.shutdown.set()
        self.kopf_stop.set()

    async def _operate(self, liveness: str | None) -> None:
        loop = asyncio.get_running_loop()
        # kopf in a task of its own: `lose` cancels that one, and a cancellation that comes
        # late (kopf ended meanwhile) is then a no-op instead of this run's end.
        with self._lock:
            if self.lost.is_set() or self.shutdown.is_set():
                return
            kopf_run = asyncio.create_task(self._kopf(liveness), name="llmop-kopf")
            self._running = (loop, kopf_run)
        try:
            await kopf_run
        except asyncio.CancelledError:
            if not kopf_run.cancelled() or not self.lost.is_set():
                raise
            log.info("kopf stopped: the leader Lease is lost")
        finally:
            with self._lock:
                self._running = None
            # kopf waits for its stop flag in a thread of the loop's default executor, which
            # asyncio.run() joins: after a stop by SIGTERM/SIGINT that thread would wait until
            # the pod is killed, renewing the Lease all along, instead of handing it over.
            self.kopf_stop.set()
            if self._started is not None:
                await self._started.stop()

    async def _kopf(self, liveness: str | None) -> None:
        """kopf.operator(), which is spawn_tasks + run_tasks: apart, the signal handlers are
        ours."""
        loop = asyncio.get_running_loop()
        current = asyncio.current_task()
        existing = {task for task in asyncio.all_tasks() if task is not current}
        tasks = await kopf.spawn_tasks(
            settings=self.settings,
            clusterwide=self.config.clusterwide,
            namespaces=self.config.namespaces,
            standalone=self.config.standalone,
            peering_name=self.config.peering_name,
            priority=self.config.priority,
            liveness_endpoint=liveness,
            memo=self.memo,
            insights=self.insights,
            stop_flag=self.kopf_stop,
            # kopf would name itself after the OS user, which a pod run as a bare UID (the
            # image's 65532, or OpenShift's random one) has none of: getpwuid() raises.
            identity=cast("Any", self.context.instance),
        )
        # Before the loops and kopf's handlers: every pass they trigger goes on the one queue.
        handlers.install_queue(self.memo)
        # The loops' tasks inherit the context kopf's setup gave this task (its credentials
        # vault: the late-CRD check calls kopf's API client). Not kopf's to wait for or cancel
        # when it stops (it would wait 5 s for them): `_operate` stops them.
        self._started = started = runnables.start(self.runnables)
        existing |= set(started.tasks.values())
        if threading.current_thread() is threading.main_thread():
            # kopf's own would stop it alike, but say nothing of a signal that came with a
            # lost Lease: the process must then exit, not go back to standby.
            for sig in STOP_SIGNALS:
                loop.add_signal_handler(sig, self._signalled, sig)
        if self.shutdown.is_set():  # a signal before these handlers
            self.kopf_stop.set()
        await kopf.run_tasks(tasks, ignored=existing)

    def _wind_down(self) -> None:
        """After kopf and the term's loops: fence the term's client (also on a clean stop,
        before the Lease is released), wait for the loops' threads and the handlers', bounded,
        so that nothing of it lives on into the next term."""
        with self._lock:
            self._ended = True
            if self._watchdog is not None:
                self._watchdog.cancel()  # kopf stopped in time
        self.context.kube.fence()
        if self._started is not None:
            self._started.signal()
        executors = (self.settings.execution.executor, self.memo.refresh_executor)
        drain = threading.Thread(
            target=lambda: [e.shutdown(wait=True, cancel_futures=True) for e in executors],
            name="term-drain",
            daemon=True,
        )
        drain.start()
        deadline = time.monotonic() + TERM_DRAIN_SECONDS
        stuck = [] if self._started is None else self._started.join(deadline)
        drain.join(max(0.0, deadline - time.monotonic()))
        self.context.kube.close()
        stuck += [drain.name] if drain.is_alive() else []
        if stuck:
            log.error("still running %g s after the term ended: %s", TERM_DRAIN_SECONDS, stuck)
            if self.lost.is_set():
                self._give_up("a handler did not return")

    def _give_up(self, why: str) -> None:
        log.critical(
            "%s after the leader Lease was lost: exiting (code %d) to be restarted as a standby",
            why,
            LOST_EXIT_CODE,
        )
        _exit(LOST_EXIT_CODE)


def run(argv: Sequence[str]) -> int:
    """Run the operator until SIGINT/SIGTERM; returns the process exit code.

    With leader election the process alternates between standby and leading: each time it
    takes the Lease, a `_Term` runs kopf with fresh caches; a term that loses the Lease is
    stopped and dropped, and the process campaigns again (no restart needed)."""
    try:
        config = load(argv, os.environ)
    except ConfigError as error:
        print(f"llmop run: {error}", file=sys.stderr)
        return 2
    _configure_logging(config)
    metrics = Metrics()
    try:
        first = _memo(config, metrics)
        elector = _elector(config, first.context.instance)
    except KubeError as error:
        print(f"llmop run: {error}", file=sys.stderr)
        return 1
    server: Any = None
    if config.metrics_port:
        server = metrics.serve(config.metrics_port, config.bind_address)
    liveness = (
        f"http://{config.bind_address}:{config.liveness_port}/healthz"
        if config.liveness_port
        else None
    )
    log.info(
        "starting llmop operator",
        extra={"namespaces": list(config.namespaces) or "*", "standalone": config.standalone},
    )
    try:
        return _alternate(config, metrics, first, elector, liveness)
    finally:
        metrics.leader.set(0)
        if elector is not None:
            elector.kube.close()
        if server is not None:
            server.shutdown()


def _alternate(
    config: OperatorConfig,
    metrics: Metrics,
    memo: kopf.Memo | None,
    elector: LeaderElector | None,
    liveness: str | None,
) -> int:
    """Stand by and lead, term after term, until SIGINT/SIGTERM; the exit code. `memo` is the
    first term's (built before anything started, to fail early on bad credentials)."""
    shutdown = threading.Event()
    tuned = False
    metrics.leader.set(0)
    with _stop_signals(shutdown) as catch_signals:
        while True:
            if elector is not None and not standby.wait_for_lease(config, elector, shutdown):
                return 0  # stopped while a standby
            if memo is None:
                try:
                    memo = _memo(config, metrics)
                except KubeError as error:
                    log.error("cannot lead: %s", error)
                    return 1
            term = _Term(config, metrics, memo, elector, shutdown, catch_signals=catch_signals)
            memo = None
            if not tuned:
                tune_garbage_collector()
                tuned = True
            lost = term.lead(liveness)
            if not lost or shutdown.is_set():
                return 0
            del term
            gc.collect()  # the term's caches, before another one fills up
            log.warning(
                "lost the leader Lease: standing by; leading again starts from fresh caches"
            )
