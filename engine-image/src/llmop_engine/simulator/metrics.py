"""The simulator's Prometheus metrics, under vLLM 0.33's names, labels and histogram buckets."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from llmop_engine.simulator.sim_config import SimConfig

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
REQUEST_LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
LABELS = ("model_name", "engine")


class SimMetrics:
    """Counters are bumped by the batching model; gauges are set when `/metrics` is scraped.
    Names, help texts and labels are vLLM's (0.32), so everything that reads vLLM reads this."""

    def __init__(self, cfg: SimConfig) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        labels = {"model_name": cfg.served_model_name, "engine": "0"}
        self._labels = labels
        self._running = self._gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        )
        self._waiting = self._gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        )
        self._kv = self._gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        )
        info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            (
                "block_size",
                "num_gpu_blocks",
                "gpu_memory_utilization",
                "cache_dtype",
                "enable_prefix_caching",
                "kv_cache_size_tokens",
                "engine",
            ),
            registry=self.registry,
        )
        info.labels(
            block_size=str(cfg.block_size),
            num_gpu_blocks=str(cfg.num_gpu_blocks),
            gpu_memory_utilization=str(cfg.gpu_memory_utilization),
            cache_dtype="auto",
            enable_prefix_caching=str(cfg.enable_prefix_caching),
            kv_cache_size_tokens=str(cfg.num_gpu_blocks * cfg.block_size),
            engine="0",
        ).set(1)
        self.generation_tokens = self._counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        self.prompt_tokens = self._counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed."
        )
        # Prefix-cache lookups and hits, in tokens (`_total` on the wire).
        self.prefix_cache_queries = self._counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        )
        self.prefix_cache_hits = self._counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self.preemptions = self._counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        )
        self._success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            (*LABELS, "finished_reason"),
            registry=self.registry,
        )
        self.ttft = self._histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        )
        self.itl = self._histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
        )
        self.e2e = self._histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.queue_time = self._histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )

    def _gauge(self, name: str, documentation: str) -> Gauge:
        return Gauge(name, documentation, LABELS, registry=self.registry).labels(**self._labels)

    def _counter(self, name: str, documentation: str) -> Counter:
        return Counter(name, documentation, LABELS, registry=self.registry).labels(**self._labels)

    def _histogram(self, name: str, documentation: str, buckets: tuple[float, ...]) -> Histogram:
        metric = Histogram(name, documentation, LABELS, buckets=buckets, registry=self.registry)
        return metric.labels(**self._labels)

    def finished(self, reason: str) -> None:
        self._success.labels(**self._labels, finished_reason=reason).inc()

    def render(self, running: int, waiting: int, kv_usage: float) -> bytes:
        self._running.set(running)
        self._waiting.set(waiting)
        self._kv.set(kv_usage)
        return generate_latest(self.registry)
