"""The operator's own Prometheus metrics, served on their own port (kopf's liveness endpoint
cannot host extra routes). The only module importing prometheus_client.

Labels are low-cardinality on purpose: no namespace/name labels, so a cluster with thousands of
LLMDeployments does not produce thousands of series.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
)
from prometheus_client import (
    GCCollector as _GCCollector,
)
from prometheus_client import (
    PlatformCollector as _PlatformCollector,
)
from prometheus_client import (
    ProcessCollector as _ProcessCollector,
)

RESULT_OK = "ok"
RESULT_STALLED = "stalled"
RESULT_SKIPPED = "skipped"
RESULT_ERROR = "error"

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
START_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 3600.0)
"""Seconds of one phase of an engine pod's start: sub-second probes to an hour-long download."""


@dataclass
class Outcome:
    """Filled in by the code being timed: how the reconcile ended."""

    result: str = RESULT_OK


@dataclass
class Metrics:
    """Metric objects in their own registry (tests and benchmarks create as many as they like)."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        reg = self.registry
        _ProcessCollector(registry=reg)
        _PlatformCollector(registry=reg)
        _GCCollector(registry=reg)
        self.reconciles = Counter(
            "llmop_reconciles_total",
            "Reconciles of LLMDeployments by trigger (parent, child) and result.",
            ["trigger", "result"],
            registry=reg,
        )
        self.errors = Counter(
            "llmop_reconcile_errors_total",
            "Reconciles that failed, by trigger and error class.",
            ["trigger", "error"],
            registry=reg,
        )
        self.duration = Histogram(
            "llmop_reconcile_duration_seconds",
            "Time one reconcile took, by trigger and result.",
            ["trigger", "result"],
            buckets=DURATION_BUCKETS,
            registry=reg,
        )
        self.child_writes = Counter(
            "llmop_child_writes_total",
            "Server-side applies and deletes of children, by kind and action.",
            ["kind", "action"],
            registry=reg,
        )
        self.status_writes = Counter(
            "llmop_status_writes_total",
            "Patches of LLMDeployment /status (only changed statuses are written).",
            registry=reg,
        )
        self.managed = Gauge(
            "llmop_managed_objects",
            "Objects the operator currently manages, by kind (LLMDeployments and children).",
            ["kind"],
            registry=reg,
        )
        self.leader = Gauge(
            "llmop_leader",
            "1 while this process holds the leader Lease and reconciles; 0 on a standby.",
            registry=reg,
        )
        self.start_phase = Histogram(
            "llmop_startup_phase_seconds",
            "Where engine pods' starts went, each observed once per pod: scheduling, "
            "containerStart (image pull and container creation) and total (created to Ready) "
            "when it first shows Ready in status, the engine's phases from its own log lines "
            "when its agent's report of them arrives.",
            ["phase"],
            buckets=START_BUCKETS,
            registry=reg,
        )
        self._lock = threading.Lock()
        self._seen: dict[str, set[str]] = {}

    @contextmanager
    def reconciling(self, trigger: str) -> Iterator[Outcome]:
        """Time a reconcile; an escaping exception counts as an error of its class."""
        outcome = Outcome()
        started = perf_counter()
        try:
            yield outcome
        except Exception as error:
            outcome.result = RESULT_ERROR
            self.errors.labels(trigger, type(error).__name__).inc()
            raise
        finally:
            self.count_reconcile(trigger, outcome.result, perf_counter() - started)

    def count_reconcile(self, trigger: str, result: str, seconds: float) -> None:
        """Record one finished reconcile (for a decision timed by the caller)."""
        self.reconciles.labels(trigger, result).inc()
        self.duration.labels(trigger, result).observe(seconds)

    def started(self, phases: Iterable[Mapping[str, float]]) -> None:
        """One observation per phase and start (`coldstart.new_phase_seconds`)."""
        for found in phases:
            for phase, seconds in found.items():
                self.start_phase.labels(phase).observe(seconds)

    def observe_object(self, kind: str, key: str, *, present: bool) -> None:
        """Track one managed object from watch events (present=False when it was deleted)."""
        with self._lock:
            keys = self._seen.setdefault(kind, set())
            if present:
                keys.add(key)
            else:
                keys.discard(key)
            self.managed.labels(kind).set(len(keys))

    def forget_objects(self) -> None:
        """Manage nothing any more (a leader that stopped leading)."""
        with self._lock:
            for kind in self._seen:
                self.managed.labels(kind).set(0)
            self._seen.clear()

    def serve(self, port: int, address: str) -> Any:
        """Serve `/metrics` from a daemon thread; returns the server (call `.shutdown()`)."""
        server, _thread = start_http_server(port, addr=address, registry=self.registry)
        return server
