"""The agent's own metrics: load series only from a current reading; the drain's cut."""

from __future__ import annotations

from llmop_engine.agent_metrics import AgentMetrics
from llmop_engine.drain import DrainOutcome
from llmop_engine.health import Phase, Verdict
from llmop_engine.vllm_metrics import EngineMetrics

READY = Verdict(phase=Phase.READY, live=True, ready=True, reason="ok")
LOAD = ("llmop_engine_queue_depth", "llmop_engine_running_requests")


def samples(m: AgentMetrics) -> dict[str, float]:
    out = {}
    for line in m.render().decode().splitlines():
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
