"""`llmop run`: configure and start the kopf operator.

Reads the config once, builds kopf's settings (our own annotation/finalizer prefixes, the last
handled spec kept in memory, server-side label filtering of child watches, quiet Event posting,
worker count), starts the metrics server, and runs kopf with the handlers from `llmop.handlers`.
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
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

import kopf

from llmop import events, handlers, kinds, names
from llmop.config import ConfigError, OperatorConfig, load
from llmop.kube import Kube, KubeError
from llmop.leader import LEASE_NAME, LeaderElector, Timing
from llmop.metrics import Metrics
from llmop.persistence import ProcessDiffBase, QuietProgressStorage
from llmop.reconcile import Context, poll_downloads

DOWNLOAD_POLL_SECONDS = 5.0
"""How often a running model download's progress is read into the status."""

log = logging.getLogger("llmop.main")

FINALIZER = f"{names.KOPF_PREFIX}/finalizer"
"""Never added (no delete handlers, timers or daemons), but named ours in case kopf needs one."""
WATCH_CHUNK_SIZE = 500
COALESCE_SECONDS = 1.0
"""How long a child or pod event waits for later ones of the same object before its refresh
runs (`handlers.Coalescer`): a new Deployment's status is written three times within about a
second, and one status write of the parent then says it all."""


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
    """Threads for the event handlers' status writes and repairs (`handlers._in_worker`)."""
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
    # Shared by every object's copy of the memo: one pending worker run per key, operator-wide.
    return kopf.Memo(context=context, coalescer=handlers.Coalescer(delay=COALESCE_SECONDS))


def _poll_downloads_until(stop: threading.Event, context: Context) -> None:
    """A plain thread, not a kopf timer: kopf timers on a resource add a finalizer to it."""
    while not stop.wait(DOWNLOAD_POLL_SECONDS):
        try:
            poll_downloads(context)
        except Exception:  # a poller that dies would freeze every progress bar
            log.exception("download progress poll failed")


CRD_POLL_SECONDS = 5.0
"""How often a leader started without the CRD looks for it (kopf serves it by itself once it
exists; this only says so)."""
CRD_NAME = f"{kinds.LLMDEPLOYMENT.plural}.{kinds.LLMDEPLOYMENT.group}"
MISSING_CRD = (
    f"the CustomResourceDefinition {CRD_NAME} is not installed, so no LLMDeployment can be "
    "served: install it with the chart (helm upgrade <release> helm/llmop --set crds.enabled=true) "
    "or `kubectl apply --server-side -f crds/` from the llmop release; reconciling starts as "
    "soon as it exists"
)


def _operator_object(kube: Kube, config: OperatorConfig) -> dict[str, Any] | None:
    """What an operator-level Event is about: this process's pod, as the downward API names it
    (POD_NAME, POD_UID: the operator may not read pods by name), else its leader Lease."""
    namespace = lease_namespace(config, dict(os.environ))
    pod, uid = os.environ.get("POD_NAME"), os.environ.get("POD_UID")
    if pod and uid:
        metadata = {"name": pod, "namespace": namespace, "uid": uid}
        return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata}
    if config.leader_elect:
        return kube.read(kinds.LEASE.api_version, kinds.LEASE.kind, namespace, LEASE_NAME)
    return None


def _watch_for_crd(context: Context, config: OperatorConfig, stop: threading.Event) -> None:
    """Say which CRD is missing and how to install it (log and a Warning Event), then say when
    it appears. A thread, so a missing CRD never keeps the process from running (or Ready)."""
    kube = context.kube
    try:
        if kube.serves(kinds.LLMDEPLOYMENT.api_version, kinds.LLMDEPLOYMENT.plural):
            return
    except KubeError as error:
        log.warning("could not check for the CRD %s: %s", CRD_NAME, error)
        return
    log.error(MISSING_CRD)
    try:
        involved = _operator_object(kube, config)
        if involved is not None:
            spec = events.EventSpec("Warning", "CRDMissing", MISSING_CRD)
            kube.create_event(
                events.render_event(involved, spec, now=context.clock(), instance=context.instance)
            )
    except KubeError as error:  # with watchNamespaces, its own namespace may not be granted
        log.warning("could not post the CRDMissing Event: %s", error)
    while not stop.wait(CRD_POLL_SECONDS):
        try:
            if kube.serves(kinds.LLMDEPLOYMENT.api_version, kinds.LLMDEPLOYMENT.plural):
                log.info("the CustomResourceDefinition %s is installed: reconciling", CRD_NAME)
                return
        except KubeError as error:
            log.warning("could not check for the CRD %s: %s", CRD_NAME, error)


LEADER_REQUEST_TIMEOUT_SECONDS = 5.0
"""Deadline of one Lease request: well inside the renew deadline, so one hung request cannot
outlast it."""
LOST_EXIT_CODE = 3
"""The exit code after losing the Lease (Kubernetes restarts the container as a standby)."""


def lease_namespace(config: OperatorConfig, env: dict[str, str]) -> str:
    """The operator's own namespace (the pod's), else the first watched one, else `default`."""
    return env.get("POD_NAMESPACE") or next(iter(config.namespaces), "") or "default"


class _StandbyHealth(BaseHTTPRequestHandler):
    """/healthz of a standby: the process is up and trying for the Lease (kopf's own endpoint
    takes the port over once this process leads)."""

    def do_GET(self) -> None:
        body = b"standby\n" if self.path == "/healthz" else b"not found\n"
        self.send_response(200 if self.path == "/healthz" else 404)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # one line per probe otherwise
        return


@contextlib.contextmanager
def _standby_health(config: OperatorConfig) -> Iterator[None]:
    if not config.liveness_port:
        yield
        return
    server = ThreadingHTTPServer((config.bind_address, config.liveness_port), _StandbyHealth)
    thread = threading.Thread(target=server.serve_forever, name="standby-health", daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


def _wait_for_lease(config: OperatorConfig, elector: LeaderElector) -> bool:
    """Block until this process leads (True) or SIGINT/SIGTERM asks it to stop (False),
    serving /healthz meanwhile: a standby is healthy and Ready."""
    stop = threading.Event()

    def stop_waiting(signum: int, _frame: Any) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, stop_waiting) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with _standby_health(config):
            return elector.acquire(stop)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _on_lost(kopf_stop: threading.Event, grace: float) -> None:
    """Stop reconciling before a standby may start: ask kopf to stop, and end the process
    if it has not within `grace` seconds (a write still in flight is one a leader sent)."""
    kopf_stop.set()
    timer = threading.Timer(grace, lambda: os._exit(LOST_EXIT_CODE))
    timer.daemon = True
    timer.start()


@dataclass
class _Leadership:
    """This process's part in the leader election (no elector with --no-leader-elect)."""

    elector: LeaderElector | None
    kopf_stop: threading.Event = field(default_factory=threading.Event)
    """Set when the Lease is lost: kopf stops, and the process exits with LOST_EXIT_CODE."""
    keeper_stop: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def take(cls, config: OperatorConfig, instance: str, metrics: Metrics) -> _Leadership | None:
        """Return once this process may reconcile (keeping the Lease from then on); None when
        SIGINT/SIGTERM came while it waited as a standby."""
        if not config.leader_elect:
            metrics.leader.set(1)
            return cls(None)
        timing = Timing()
        elector = LeaderElector(
            Kube.connect(pool_size=2, timeout=LEADER_REQUEST_TIMEOUT_SECONDS),
            lease_namespace(config, dict(os.environ)),
            # Unique per process, as client-go's are: two processes on one host (or a pod
            # restarted under the same name) are still two candidates.
            f"{instance}_{uuid.uuid4().hex[:8]}",
            timing=timing,
        )
        metrics.leader.set(0)
        if not _wait_for_lease(config, elector):
            elector.kube.close()
            return None
        leadership = cls(elector)
        grace = max(1.0, timing.lease_duration - timing.renew_deadline - 2)
        threading.Thread(
            target=elector.keep,
            args=(leadership.keeper_stop, lambda: _on_lost(leadership.kopf_stop, grace)),
            name="leader-keeper",
            daemon=True,
        ).start()
        metrics.leader.set(1)
        return leadership

    def end(self) -> None:
        """Stop renewing and hand the Lease over (a clean stop)."""
        self.keeper_stop.set()
        if self.elector is not None:
            self.elector.release()
            self.elector.kube.close()


def run(argv: Sequence[str]) -> int:
    """Run the operator until SIGINT/SIGTERM; returns the process exit code."""
    try:
        config = load(argv, os.environ)
    except ConfigError as error:
        print(f"llmop run: {error}", file=sys.stderr)
        return 2
    _configure_logging(config)
    metrics = Metrics()
    try:
        memo = _memo(config, metrics)
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
    leadership = _Leadership.take(config, memo.context.instance, metrics)
    if leadership is None:  # stopped while a standby
        if server is not None:
            server.shutdown()
        return 0
    stop = threading.Event()
    poller = threading.Thread(
        target=_poll_downloads_until, args=(stop, memo.context), name="download-poller", daemon=True
    )
    poller.start()
    threading.Thread(
        target=_watch_for_crd, args=(memo.context, config, stop), name="crd-check", daemon=True
    ).start()
    settings = build_settings(config)
    tune_garbage_collector()
    # kopf's pool runs the reconciles; the event handlers' writes take a pool of their own
    # (`handlers._in_worker`), kopf's only as a fallback.
    memo.executor = settings.execution.executor
    memo.refresh_executor = ThreadPoolExecutor(
        refresh_workers(config), thread_name_prefix="llmop-refresh"
    )
    # The count handler forgets a deleted object's diff base (kopf never does).
    memo.diffbase = settings.persistence.diffbase_storage
    lost = False

    async def operate() -> None:
        nonlocal lost
        try:
            await kopf.operator(
                settings=settings,
                clusterwide=config.clusterwide,
                namespaces=config.namespaces,
                standalone=config.standalone,
                peering_name=config.peering_name,
                priority=config.priority,
                liveness_endpoint=liveness,
                memo=memo,
                stop_flag=leadership.kopf_stop,
                # kopf would name itself after the OS user, which a pod run as a bare UID (the
                # image's 65532, or OpenShift's random one) has none of: getpwuid() raises.
                identity=cast("Any", memo.context.instance),
            )
        finally:
            lost = leadership.kopf_stop.is_set()
            # kopf waits for its stop flag in a thread of the loop's default executor, which
            # asyncio.run() joins: after a stop by SIGTERM/SIGINT that thread would wait until
            # the pod is killed, renewing the Lease all along, instead of handing it over.
            leadership.kopf_stop.set()

    try:
        asyncio.run(operate())
    finally:
        metrics.leader.set(0)
        leadership.end()
        stop.set()
        poller.join(timeout=DOWNLOAD_POLL_SECONDS + 1)
        memo.refresh_executor.shutdown(wait=False, cancel_futures=True)
        memo.context.kube.close()
        if server is not None:
            server.shutdown()
    return LOST_EXIT_CODE if lost else 0
