"""Reading agent `/status` payloads: the shape the real agent answers, and what the operator
derives from them (load, deletion cost and when it is worth rewriting)."""

from __future__ import annotations

from typing import Any

import pytest

from llmop.agents import (
    AgentReading,
    actual_kv_tokens,
    capacity_shortfall,
    cost_changed,
    deletion_cost,
    parse_status,
)

# What `llmop_engine.agent.Agent.status()` returns for a serving simulator (captured shape).
SERVING: dict[str, Any] = {
    "phase": "ready",
    "ready": True,
    "live": True,
    "reason": "serving",
    "queueDepth": 3,
    "running": 4,
    "kvCacheUsage": 0.12,
    "kvCacheCapacityTokens": 245760,
    "lastDeepProbe": {"ok": True, "latencySeconds": 0.02, "ageSeconds": 3.1, "error": None},
    "servedModelName": "qwen",
    "modelRevision": None,
    "backend": "simulator",
    "enginePid": 42,
    "engineExitCode": None,
    "drainDurationSeconds": None,
    "drainCutRequests": None,
}


def test_parse_a_serving_agent() -> None:
    reading = parse_status("p-1", SERVING)
    assert reading == AgentReading(
        pod="p-1",
        phase="ready",
        ready=True,
        running=4,
        waiting=3,
        kv_capacity_tokens=245760,
        deep_probe_ok=True,
        deep_probe_error=None,
    )
    assert reading.load == 7
    assert deletion_cost(reading) == 7


def test_an_agent_without_a_fresh_engine_read_reports_no_load() -> None:
    starting = {**SERVING, "phase": "Loading", "ready": False, "queueDepth": None}
    starting |= {"running": None, "kvCacheCapacityTokens": None, "lastDeepProbe": None}
    reading = parse_status("p-1", starting)
    assert reading.load is None
    assert deletion_cost(reading) is None
    assert reading.deep_probe_ok is None
    assert actual_kv_tokens([reading]) is None


@pytest.mark.parametrize("payload", [[], "ok", {"status": "ok"}, None])
def test_something_else_on_the_port_is_an_error(payload: Any) -> None:
    with pytest.raises(ValueError, match="p-1"):
        parse_status("p-1", payload)


@pytest.mark.parametrize(
    ("current", "wanted", "write"),
    [
        (None, 0, True),  # never written
        ("junk", 3, True),  # someone else's value
        ("0", 0, False),
        ("0", 1, True),  # idle → busy matters most
        ("10", 12, False),  # jitter
        ("10", 14, True),
        ("40", 31, False),
        ("40", 30, True),
        ("5", 0, True),
    ],
)
def test_deletion_cost_is_rewritten_only_on_material_change(
    current: str | None, wanted: int, write: bool
) -> None:
    assert cost_changed(current, wanted) is write


def test_shortfall_needs_both_figures_and_a_margin() -> None:
    assert capacity_shortfall(None, 10) is None
    assert capacity_shortfall(1000, None) is None
    assert capacity_shortfall(1000, 950) is None
    message = capacity_shortfall(1000, 700)
    assert message is not None
    assert "30% below the planned 1000 (300 tokens short)" in message
