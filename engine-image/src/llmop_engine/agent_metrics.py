"""The agent's own Prometheus metrics: stable `llmop_engine_*` names whatever vLLM calls things.

The load series (queue depth, running, KV usage, KV capacity) are exported only while the agent
has a current reading: when the engine stops answering or exports no metrics they disappear
instead of repeating the last value (the HPA then holds, rather than scaling on old numbers).
`llmop_engine_adapter_loaded{adapter}` has one series per desired LoRA adapter (vLLM exports no
per-adapter series); an adapter removed from the desired set loses its series.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from llmop_engine.contract import ADAPTER_LOADED_METRIC, STARTUP_PHASE_METRIC
from llmop_engine.drain import DrainOutcome
from llmop_engine.health import Phase, ProbeResult, Verdict
from llmop_engine.vllm_metrics import EngineMetrics

PROBE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


_LOAD = (
    (
        "llmop_engine_queue_depth",
        "Requests waiting in the engine (the HPA's Pods metric).",
        "waiting",
    ),
    ("llmop_engine_running_requests", "Requests in the running batch.", "running"),
    ("llmop_engine_kv_cache_usage_ratio", "KV cache usage, 0..1.", "kv_usage"),
    (
        "llmop_engine_kv_cache_capacity_tokens",
        "KV cache capacity the engine reports, in tokens.",
        "kv_capacity_tokens",
    ),
)


class _LoadCollector(Collector):
    """The load gauges of the latest reading; absent when there is none."""

    def __init__(self) -> None:
        self.current: EngineMetrics | None = None

    def collect(self) -> Iterator[Metric]:
        for name, doc, attr in _LOAD:
            value = None if self.current is None else getattr(self.current, attr)
            family = GaugeMetricFamily(name, doc)
            if value is not None:
                family.add_metric([], float(value))
                yield family

    def describe(self) -> Iterator[Metric]:
        return iter(())


class _AdapterCollector(Collector):
    """1 per desired adapter registered in the engine, 0 per one that is not (yet)."""

    def __init__(self) -> None:
        self.current: Mapping[str, bool] = {}

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            ADAPTER_LOADED_METRIC,
            "1 while the desired LoRA adapter is registered in the engine, else 0.",
            labels=("adapter",),
        )
        for name, loaded in sorted(self.current.items()):
            family.add_metric([name], 1.0 if loaded else 0.0)
        yield family

    def describe(self) -> Iterator[Metric]:
        return iter(())


class AgentMetrics:
    def __init__(self) -> None:
        reg = self.registry = CollectorRegistry(auto_describe=False)
        self._load = _LoadCollector()
        reg.register(self._load)
        self._adapters = _AdapterCollector()
        reg.register(self._adapters)
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
        self.drain_cut = Gauge(
            "llmop_engine_drain_cut_requests",
            "Requests still in the engine when the last drain ran out of budget and the agent "
            "ended them (finish_reason abort); 0 when it finished within budget, -1 unknown.",
            registry=reg,
        )
        self.startup_phase = Gauge(
            STARTUP_PHASE_METRIC,
            "Seconds this engine's start spent in each phase, from the engine's own log lines "
            "(set once, when it is first ready; `untraced`: what no line accounts for).",
            ("phase",),
            registry=reg,
        )
        for phase in Phase:
            self.phase.labels(phase=phase.value).set(0)

    def startup(self, phases: Mapping[str, float]) -> None:
        for name, seconds in phases.items():
            self.startup_phase.labels(phase=name).set(seconds)

    def update(self, verdict: Verdict, metrics: EngineMetrics | None) -> None:
        for phase in Phase:
            self.phase.labels(phase=phase.value).set(1 if phase is verdict.phase else 0)
        self.ready.set(1 if verdict.ready else 0)
        self.live.set(1 if verdict.live else 0)
        self._load.current = metrics

    def adapters(self, loaded: Mapping[str, bool]) -> None:
        self._adapters.current = dict(loaded)

    def cut(self, requests: int | None) -> None:
        self.drain_cut.set(-1 if requests is None else requests)

    def drained(self, outcome: DrainOutcome) -> None:
        self.drain_duration.set(outcome.duration)
        self.cut(outcome.cut_requests)

    def probe(self, result: ProbeResult) -> None:
        self.probes.inc()
        if result.ok:
            self.probe_latency.observe(result.latency)
        else:
            self.probe_failures.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
