"""Rolling replacement of three replicas under 32 streaming clients: zero loss with the agent,
measurable loss with a bare simulator (plain SIGTERM, no shutdown timeout)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from support.harness.rollout import RolloutConfig, rolling_replace

pytestmark = pytest.mark.engine


@pytest.mark.timeout(240)
def test_rolling_replace_under_load(tmp_path: Path) -> None:
    cfg = RolloutConfig()
    with_agent = asyncio.run(rolling_replace(tmp_path / "agent", True, cfg))
    baseline = asyncio.run(rolling_replace(tmp_path / "bare", False, cfg))
    for r in (with_agent, baseline):
        label = "agent" if r.with_agent else "bare simulator"
        print(
            f"\n{label}: {r.load.total} requests, {r.load.failed} failed, {r.load.truncated} "
            f"truncated, {r.replaced} replaced in {r.seconds:.0f}s; {dict(r.load.reasons)}"
        )
    assert with_agent.load.total >= 100
    assert with_agent.load.lost == 0, with_agent.load.reasons
    # The agent is what prevents the loss: the same rollout without it drops requests.
    assert baseline.load.lost > 0
