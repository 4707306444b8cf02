"""The simulator's Prometheus metrics, under vLLM 0.33's names, labels and histogram buckets."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from llmop_engine.simulator.config import SimConfig

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
    """Counters are bumped by the batching model; gauges are set when `/metrics` is scraped."""

    def __init__(self, cfg: SimConfig) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        labels = {"model_name": cfg.served_model_name, "engine": "0"}
        reg = self.registry
        self._running = Gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            LABELS,
            registry=reg,
        ).labels(**labels)
        self._waiting = Gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            LABELS,
            registry=reg,
        ).labels(**labels)
        self._kv = Gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            LABELS,
            registry=reg,
        ).labels(**labels)
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
            registry=reg,
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
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", LABELS, registry=reg
        ).labels(**labels)
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", LABELS, registry=reg
        ).labels(**labels)
        # vLLM's prefix-cache counters, in tokens (`_total` on the wire).
        self.prefix_cache_queries = Counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            LABELS,
            registry=reg,
        ).labels(**labels)
        self.prefix_cache_hits = Counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            LABELS,
            registry=reg,
        ).labels(**labels)
        self.preemptions = Counter(
            "vllm:num_preemptions",
            "Cumulative number of preemption from the engine.",
            LABELS,
            registry=reg,
        ).labels(**labels)
        self._success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            (*LABELS, "finished_reason"),
            registry=reg,
        )
        self._labels = labels
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            LABELS,
            buckets=TTFT_BUCKETS,
            registry=reg,
        ).labels(**labels)
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            LABELS,
            buckets=ITL_BUCKETS,
            registry=reg,
        ).labels(**labels)
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            LABELS,
            buckets=REQUEST_LATENCY_BUCKETS,
            registry=reg,
        ).labels(**labels)
        self.queue_time = Histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            LABELS,
            buckets=REQUEST_LATENCY_BUCKETS,
            registry=reg,
        ).labels(**labels)

    def finished(self, reason: str) -> None:
        self._success.labels(**self._labels, finished_reason=reason).inc()

    def render(self, running: int, waiting: int, kv_usage: float) -> bytes:
        self._running.set(running)
        self._waiting.set(waiting)
        self._kv.set(kv_usage)
        return generate_latest(self.registry)
