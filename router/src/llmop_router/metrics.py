"""The router's Prometheus metrics (one registry per router, so tests can run several)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from decimal import Decimal
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

ROUTING_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1)
WAKE_BUCKETS = (1, 2, 5, 10, 20, 30, 45, 60, 90, 120, 180, 300, 600, 1200)
"""Cold starts run from seconds (a cached small model) to many minutes (a node to add, weights
to download)."""
SEAM_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
CR_LABELS = ("llmdeployment_namespace", "llmdeployment")
"""Which CR a scale-to-zero series is about. Not `namespace`: Prometheus sets that target label
to the router pod's own namespace and would rename a scraped one to `exported_namespace`."""


UNKNOWN_MODEL = "unknown"
"""The `model` label of every request whose model is not in the routing table (or that named
none): a client's made-up names never become series."""


class RouterMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "llmop_router_requests",
            f"Requests answered, by model (a routed one, or {UNKNOWN_MODEL!r}) and HTTP status",
            ["model", "code"],
            registry=self.registry,
        )
        self.routed = Counter(
            "llmop_router_routed",
            "Upstream attempts by why the pod was chosen: prefix (the key's own pod), spill "
            "(the key's pod was over the load bound), least-loaded (no key), retry",
            ["reason"],
            registry=self.registry,
        )
        self.upstream_errors = Counter(
            "llmop_router_upstream_errors",
            "Upstream attempts that failed before the first response byte, by kind",
            ["kind"],
            registry=self.registry,
        )
        self.client_disconnects = Counter(
            "llmop_router_client_disconnects",
            "Answers whose client went away before their end (the upstream request is closed)",
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "llmop_router_in_flight_requests",
            "Requests being proxied now",
            registry=self.registry,
        )
        self.routing_seconds = Histogram(
            "llmop_router_routing_seconds",
            "Time the router spends before the upstream request is sent (read, parse, pick)",
            buckets=ROUTING_BUCKETS,
            registry=self.registry,
        )
        self.held = Gauge(
            "llmop_router_held_requests",
            "Requests held now for a CR at zero, by CR",
            CR_LABELS,
            registry=self.registry,
        )
        self.held_total = Counter(
            "llmop_router_held",
            "Requests that were held for a CR at zero, by CR",
            CR_LABELS,
            registry=self.registry,
        )
        self.wakes = Counter(
            "llmop_router_wakes",
            "Wakes: scale subresources this router set from 0 to 1 (at most one per episode of "
            "held requests; none when the workload was no longer at 0)",
            CR_LABELS,
            registry=self.registry,
        )
        self.wake_seconds = Histogram(
            "llmop_router_wake_seconds",
            "From the first held request of a wake to the CR's first ready endpoint",
            buckets=WAKE_BUCKETS,
            registry=self.registry,
        )
        self.hold_refused = Counter(
            "llmop_router_hold_refused",
            "Held requests not served, by why: timeout (504), full (429: maxPendingRequests), "
            "router-full (429: the pod's caps across CRs), stopping (503: this router pod "
            "stopped), by CR",
            [*CR_LABELS, "reason"],
            registry=self.registry,
        )

        self.migrations = Counter(
            "llmop_router_migrations",
            "Streams whose engine failed after the first byte, by why (reset, eof, error, "
            "abort, idle, unready, status, connect) and what the router did (continued, "
            "restarted: nothing was sent yet, completed: only the end was lost, not_eligible, "
            "limit, no_replica, other_revision: ended with an error event)",
            ["reason", "outcome"],
            registry=self.registry,
        )
        self.migration_seam_seconds = Histogram(
            "llmop_router_migration_seam_seconds",
            "From a stream's failure detected to the continuation's first event relayed",
            ["reason"],
            buckets=SEAM_BUCKETS,
            registry=self.registry,
        )
        self.watch_age = Gauge(
            "llmop_router_watch_age_seconds",
            "Seconds since the watch of a resource last heard from the API server (a list, a "
            "watch opened, an event or a bookmark; the stalest watched namespace): past "
            "--stale-after-seconds the router pod is unready",
            ["resource"],
            registry=self.registry,
        )
        self.watch_ages: Callable[[], Mapping[str, float]] = dict
        """Resource → age now (the watch sets it; a static table has none)."""

        # Bound children, so a request costs no label lookup (and no lock around one).
        self._requests_by: dict[tuple[str, str], Counter] = {}
        self.routed_by = {
            reason: self.routed.labels(reason)
            for reason in ("prefix", "spill", "least-loaded", "retry")
        }

    def count_request(self, model: str, code: int) -> None:
        """Count an answered request; `model` must be a routed model or `UNKNOWN_MODEL` (the
        caller knows the table)."""
        key = (model, str(code))
        child = self._requests_by.get(key)
        if child is None:
            child = self._requests_by[key] = self.requests.labels(*key)
        child.inc()

    def exposition(self) -> bytes:
        # Ages grow with time, not with events: read at each scrape.
        for resource, age in self.watch_ages().items():
            self.watch_age.labels(resource).set(age)
        return generate_latest(self.registry)


QUEUE_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class QueueMetrics:
    """The gateway's fair queue (`sharing`): no tenant or model label (a pod-wide view; the
    gateway's per-tenant series say who was refused)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.waiting = Gauge(
            "llmop_gateway_queue_waiting",
            "Requests waiting for a slot of a saturated model, all models",
            registry=registry,
        )
        self.outcomes = Counter(
            "llmop_gateway_queue",
            "Requests through the fair queue, by outcome: dispatched (at once or after a "
            "wait), shed (sheddable priority while saturated), full, displaced (by a higher "
            "priority), timeout, stopping, left (the client went away)",
            ["outcome"],
            registry=registry,
        )
        self.fallbacks = Counter(
            "llmop_gateway_fallbacks",
            "Requests sent to a fallback model (spec.router.fallback), by why: unavailable "
            "(no replica answered) or saturated (no slot in time)",
            ["reason"],
            registry=registry,
        )
        self.wait_seconds = Histogram(
            "llmop_gateway_queue_wait_seconds",
            "Time a dispatched request waited for its slot (0: a slot was free)",
            buckets=QUEUE_WAIT_BUCKETS,
            registry=registry,
        )
        self.suggested = SuggestedShares()
        registry.register(self.suggested)
        self.withheld = Gauge(
            "llmop_gateway_engine_slots_withheld",
            "Slots of the plan's (status.plan.maxNumSeqs, this pod's share) held back because "
            "the engines' own readings show requests waiting in them: engines that run fewer "
            "than the plan says, or take requests past the router",
            registry=registry,
        )
        self.loans = Counter(
            "llmop_gateway_slot_loans",
            "Slots of a saturated model this router pod passed to another (--replicas with a "
            "shared store): lend (its waiting work outranked this pod's) or return (a "
            "borrowed slot given back)",
            ["kind"],
            registry=registry,
        )


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "llmop_gateway_requests",
            "Requests the gateway admitted, by tenant, model and the HTTP status they were "
            "answered with (refusals: llmop_gateway_rejected_total)",
            ["tenant", "model", "code"],
            registry=registry,
        )
        self.tokens = Counter(
            "llmop_gateway_tokens",
            "Tokens used, by tenant, model and kind (input, cached_input, output)",
            ["tenant", "model", "kind"],
            registry=registry,
        )
        self.estimated = Counter(
            "llmop_gateway_tokens_estimated",
            "Tokens charged by estimate (answers that ended without usage: aborted streams)",
            ["tenant", "model"],
            registry=registry,
        )
        self.cost = Counter(
            "llmop_gateway_cost",
            "Cost of the tokens used, in the model's currency (spec.router.pricing)",
            ["tenant", "model", "currency"],
            registry=registry,
        )
        self.rejected = Counter(
            "llmop_gateway_rejected",
            "Requests refused by the gateway, by tenant and reason",
            ["tenant", "reason"],
            registry=registry,
        )
        self.shadow_rejected = Counter(
            "llmop_gateway_shadow_rejected",
            "Requests a tenant in Shadow mode sent that its limits would have refused",
            ["tenant", "reason"],
            registry=registry,
        )
        self.in_flight = Gauge(
            "llmop_gateway_inflight",
            "Admitted requests not yet answered, by tenant",
            ["tenant"],
            registry=registry,
        )
        self.store_seconds = Histogram(
            "llmop_gateway_store_seconds",
            "Round trip of a call to the shared store, by operation",
            ["op"],
            buckets=(0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1),
            registry=registry,
        )
        self.store_errors = Counter(
            "llmop_gateway_store_errors",
            "Calls to the shared store that failed or timed out, by operation",
            ["op"],
            registry=registry,
        )
        self.store_degraded = Gauge(
            "llmop_gateway_store_degraded",
            "1 while the shared store is not used (its breaker is open)",
            registry=registry,
        )
        self._children: dict[tuple[object, tuple[str, ...]], Any] = {}

    def of(self, metric: Counter | Gauge | Histogram, *labels: str) -> Any:
        """`metric.labels(*labels)`, bound once: a request's few counters then cost no label
        lookup (and no lock around one). The labels are bounded (declared tenants, routed
        models, HTTP codes), so is this."""
        key = (metric, labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child


class GpuCost:
    """`llmop_gateway_gpu_cost_per_hour{model, currency}`: what the GPUs behind each routed
    model's ready endpoints cost per hour now, at the router's `--gpu-hour-price`. Read from the
    route table at each scrape, so it is never stale; every router pod reports the same figure
    (dashboards take the max across pods). Divided by the tokens the gateway metered, it is the
    cost of a token in GPU time, which an idle model makes high."""

    NAME = "llmop_gateway_gpu_cost_per_hour"
    LABELS = ("model", "currency")

    def __init__(
        self, price: Decimal, currency: str, in_use: Callable[[], Iterable[tuple[str, int]]]
    ) -> None:
        self.price, self.currency, self.in_use = price, currency, in_use

    def describe(self) -> list[Metric]:
        return [GaugeMetricFamily(self.NAME, self._help(), labels=self.LABELS)]

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(self.NAME, self._help(), labels=self.LABELS)
        for model, gpus in self.in_use():
            if gpus > 0:
                family.add_metric([model, self.currency], float(self.price * gpus))
        yield family

    @staticmethod
    def _help() -> str:
        return (
            "Cost per hour of the GPUs behind each routed model's ready endpoints "
            "(--gpu-hour-price times spec.resources.gpus times the pods of a replica)"
        )


class SuggestedShares:
    """`llmop_gateway_suggested_max_share_percent{llmdeployment, priority_class}`: the
    `maxSharePercent` that would let the requests of the classes above a class find a slot free
    at once 95 % of the time, from the load they brought (`share_advice`). Read at each scrape;
    labels bounded by the routed CRs (`namespace/name`) and the declared classes."""

    NAME = "llmop_gateway_suggested_max_share_percent"
    LABELS = ("llmdeployment", "priority_class")

    def __init__(self) -> None:
        self.suggestions: Callable[[], Iterable[tuple[str, str, int]]] = list
        """(CR, class, percent) now: set by the fair queue (`sharing`)."""

    def describe(self) -> list[Metric]:
        return [GaugeMetricFamily(self.NAME, self._help(), labels=self.LABELS)]

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(self.NAME, self._help(), labels=self.LABELS)
        for cr, name, percent in self.suggestions():
            family.add_metric([cr, name], float(percent))
        yield family

    @staticmethod
    def _help() -> str:
        return (
            "The LLMPriorityClass spec.maxSharePercent suggested for a class at a model: the "
            "slots the classes above it need held back to find one free at once 95 % of the "
            "time (Erlang C of their measured load)"
        )
