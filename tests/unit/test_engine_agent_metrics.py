"""The agent's own metrics: load series only from a current reading; the drain's cut."""

from __future__ import annotations

import time

from llmop_engine import health
from llmop_engine.agent import Agent
from llmop_engine.agent_metrics import AgentMetrics
from llmop_engine.agent_settings import AgentSettings
from llmop_engine.drain import DrainOutcome
from llmop_engine.health import Observation, Phase, Reach, Verdict
from llmop_engine.vllm_metrics import EngineMetrics

READY = Verdict(phase=Phase.READY, live=True, ready=True, reason="ok")
LOAD = ("llmop_engine_queue_depth", "llmop_engine_running_requests")
LOAD_ALL = (
    *LOAD,
    "llmop_engine_kv_cache_usage_ratio",
    "llmop_engine_kv_cache_capacity_tokens",
)


def samples(m: AgentMetrics) -> dict[str, float]:
    return parse(m.render())


def parse(text: bytes) -> dict[str, float]:
    out = {}
    for line in text.decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_load_series_follow_the_latest_reading_and_vanish_without_one() -> None:
    """Bug 7: no reading (engine unreachable, no metrics) means no series, not the old value."""
    m = AgentMetrics()
    m.update(READY, EngineMetrics(waiting=7, running=3, kv_usage=0.5, kv_capacity_tokens=1024))
    got = samples(m)
    assert (got["llmop_engine_queue_depth"], got["llmop_engine_running_requests"]) == (7, 3)
    assert got["llmop_engine_kv_cache_capacity_tokens"] == 1024
    m.update(READY, None)
    got = samples(m)
    assert not any(name in got for name in LOAD), got
    assert got["llmop_engine_ready"] == 1


def test_drain_cut_is_exported() -> None:
    m = AgentMetrics()
    assert samples(m)["llmop_engine_drain_cut_requests"] == 0
    m.cut(8)
    assert samples(m)["llmop_engine_drain_cut_requests"] == 8
    m.drained(DrainOutcome(4.2, over_budget=True, cut_requests=None, killed=True))
    got = samples(m)
    assert got["llmop_engine_drain_cut_requests"] == -1
    assert got["llmop_engine_drain_duration_seconds"] == 4.2


def test_a_loading_engine_exports_no_queue_depth_so_the_hpa_counts_it_as_missing() -> None:
    """What a replica exports while its engine loads, pinned through the agent's own /metrics
    and /status. The HPA's replica calculator (Kubernetes v1.36.3,
    pkg/controller/podautoscaler/replica_calculator.go, calcPlainMetricReplicas and groupPods)
    does not look at readiness for Pods metrics: a pod WITH a sample is averaged in as it is, a
    Running pod WITHOUT one is "missing" (0 on a scale-up, the target on a scale-down). So a
    loading replica must export no sample: a 0 would read as spare capacity on a scale-down, and
    a value kept from before a restart would trigger a second scale-up (docs/operations.md,
    "Loading replicas and the HPA")."""
    agent = Agent(AgentSettings())

    def exported() -> tuple[dict[str, float], object]:
        return parse(agent.metrics_text()), agent.status()["queueDepth"]

    def poll(reach: Reach, metrics: EngineMetrics | None = None, at: float | None = None) -> None:
        now = time.monotonic() if at is None else at
        agent.state = health.observe(
            agent.state, Observation(now=now, process_alive=True, reach=reach, metrics=metrics)
        )

    got, queue = exported()  # engine process just started, not polled yet
    assert (got["llmop_engine_ready"], got['llmop_engine_phase{phase="starting"}']) == (0, 1)
    assert "llmop_engine_queue_depth" not in got
    assert queue is None

    for _ in range(3):  # vLLM loads weights with its port closed: connection refused
        poll(Reach.REFUSED)
    got, queue = exported()
    assert (got["llmop_engine_ready"], got['llmop_engine_phase{phase="loading"}']) == (0, 1)
    assert got["llmop_engine_live"] == 1
    assert not any(name in got for name in LOAD_ALL), got
    assert queue is None

    poll(Reach.OK, EngineMetrics(waiting=9, running=4, kv_usage=0.8, kv_capacity_tokens=4096))
    got, queue = exported()
    assert (got["llmop_engine_queue_depth"], queue) == (9, 9)

    # The engine restarts in place (or stops answering): loading again, the 9 is not its queue.
    for reach in (Reach.REFUSED, Reach.ERROR):
        poll(reach)
        got, queue = exported()
        assert not any(name in got for name in LOAD_ALL), (reach, got)
        assert queue is None

    # A reading older than two polls (a poll stuck on a hung engine) is not exported either.
    poll(Reach.OK, EngineMetrics(waiting=5, running=1), at=time.monotonic() - 30)
    got, queue = exported()
    assert "llmop_engine_queue_depth" not in got
    assert queue is None
