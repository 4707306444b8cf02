"""The agent's own Prometheus metrics: stable `llmop_engine_*` names whatever vLLM calls things."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from llmop_engine.health import Phase, ProbeResult, Verdict
from llmop_engine.vllm_metrics import EngineMetrics

PROBE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class AgentMetrics:
    def __init__(self) -> None:
        reg = self.registry = CollectorRegistry(auto_describe=False)
        self.queue_depth = Gauge(
            "llmop_engine_queue_depth",
            "Requests waiting in the engine (the HPA's Pods metric).",
            registry=reg,
        )
        self.running = Gauge(
            "llmop_engine_running_requests", "Requests in the running batch.", registry=reg
        )
        self.kv_usage = Gauge(
            "llmop_engine_kv_cache_usage_ratio", "KV cache usage, 0..1.", registry=reg
        )
        self.kv_capacity = Gauge(
            "llmop_engine_kv_cache_capacity_tokens",
            "KV cache capacity the engine reports, in tokens.",
            registry=reg,
        )
        self.phase = Gauge(
            "llmop_engine_phase", "1 for the current phase.", ("phase",), registry=reg
        )
        self.ready = Gauge("llmop_engine_ready", "1 when /readyz answers 200.", registry=reg)
        self.live = Gauge("llmop_engine_live", "1 when /livez answers 200.", registry=reg)
        self.probe_latency = Histogram(
            "llmop_engine_deep_probe_latency_seconds",
            "Latency of the idle one-token deep probe.",
            buckets=PROBE_BUCKETS,
            registry=reg,
        )
        self.probes = Counter("llmop_engine_deep_probes_total", "Deep probes sent.", registry=reg)
        self.probe_failures = Counter(
            "llmop_engine_deep_probe_failures_total",
            "Deep probes that failed or timed out.",
            registry=reg,
        )
        self.drain_duration = Gauge(
            "llmop_engine_drain_duration_seconds",
            "Duration of the last drain (0 until one finished).",
            registry=reg,
        )
        for phase in Phase:
            self.phase.labels(phase=phase.value).set(0)

    def update(self, verdict: Verdict, metrics: EngineMetrics | None) -> None:
        for phase in Phase:
            self.phase.labels(phase=phase.value).set(1 if phase is verdict.phase else 0)
        self.ready.set(1 if verdict.ready else 0)
        self.live.set(1 if verdict.live else 0)
        if metrics is None:
            return
        if metrics.waiting is not None:
            self.queue_depth.set(metrics.waiting)
        if metrics.running is not None:
            self.running.set(metrics.running)
        if metrics.kv_usage is not None:
            self.kv_usage.set(metrics.kv_usage)
        if metrics.kv_capacity_tokens is not None:
            self.kv_capacity.set(metrics.kv_capacity_tokens)

    def probe(self, result: ProbeResult) -> None:
        self.probes.inc()
        if result.ok:
            self.probe_latency.observe(result.latency)
        else:
            self.probe_failures.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
