"""The operator's agent reader over real HTTP against stand-in agents on localhost: readings,
failures that stay absent, the timeout and concurrency bounds; and the read period's growth."""

from __future__ import annotations

import asyncio
import time

from llmop import fleet
from llmop.pod_client import AgentClient, ReadResult, Target
from support.standin_agents import agent_status, standin_agents


def target(port: int, pod: str) -> Target:
    return Target("ns", "parent", pod, "127.0.0.1", port)


def test_reads_agents_and_leaves_out_the_ones_that_fail() -> None:
    with standin_agents(["127.0.0.1"] * 3, port=0) as (good, hung, other):
        good.status = agent_status(running=3, waiting=2, kv_tokens=4096)
        hung.hang = 2.0
        other.status = {"hello": "not an agent"}
        targets = [target(a.port, f"p{i}") for i, a in enumerate((good, hung, other))]

        async def read() -> tuple[float, ReadResult]:
            client = AgentClient(timeout=0.5)
            started = time.monotonic()
            try:
                result = await client.read_all(targets)
            finally:
                await client.close()
            return time.monotonic() - started, result

        elapsed, result = asyncio.run(read())
        hung.hang = 0
    assert elapsed < 1.5  # the hung agent cost one timeout, not its 2 s
    assert result.failed == 2
    readings = result.readings
    assert list(readings) == [targets[0]]
    reading = readings[targets[0]]
    assert (reading.pod, reading.load, reading.kv_capacity_tokens) == ("p0", 5, 4096)


def test_concurrency_is_bounded() -> None:
    with standin_agents(["127.0.0.1"] * 12, port=0) as agents:
        for agent in agents:
            agent.hang = 0.1
        targets = [target(a.port, f"p{i}") for i, a in enumerate(agents)]

        async def read() -> int:
            client = AgentClient(concurrency=3, timeout=5)
            try:
                result = await client.read_all(targets)
            finally:
                await client.close()
            return len(result.readings)

        started = time.monotonic()
        assert asyncio.run(read()) == 12
        elapsed = time.monotonic() - started
    # 12 reads of 0.1 s, three at a time: four waves.
    assert elapsed >= 0.39


def test_period_grows_with_the_fleet() -> None:
    assert fleet.period(0, 10) == 10
    assert fleet.period(100, 10) == 10
    assert fleet.period(1000, 10) == 1000 / fleet.READS_PER_SECOND


def test_good_agents_queued_behind_hung_ones_are_still_read() -> None:
    with standin_agents(["127.0.0.1"] * 6, port=0) as agents:
        for agent in agents[:3]:
            agent.hang = 1.5
        targets = [target(a.port, f"p{i}") for i, a in enumerate(agents)]

        async def read() -> ReadResult:
            client = AgentClient(concurrency=2, timeout=0.5)
            try:
                return await client.read_all(targets)
            finally:
                await client.close()

        result = asyncio.run(read())
    # Each good read got its own 0.5 s once its turn came, however long it queued.
    assert sorted(r.pod for r in result.readings.values()) == ["p3", "p4", "p5"]
    assert result.failed == 3
