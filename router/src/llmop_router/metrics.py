"""The router's Prometheus metrics (one registry per router, so tests can run several)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

ROUTING_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1)


class RouterMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "llmop_router_requests",
            "Requests answered, by model and HTTP status",
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

        # Bound children, so a request costs no label lookup (and no lock around one).
        self._requests_by: dict[tuple[str, str], Counter] = {}
        self.routed_by = {
            reason: self.routed.labels(reason)
            for reason in ("prefix", "spill", "least-loaded", "retry")
        }

    def count_request(self, model: str, code: int) -> None:
        key = (model, str(code))
        child = self._requests_by.get(key)
        if child is None:
            child = self._requests_by[key] = self.requests.labels(*key)
        child.inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
