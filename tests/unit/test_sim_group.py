"""The simulator's multi-node flags and rendezvous lines (llmop_engine.simulator.group)."""

from __future__ import annotations

import asyncio

import pytest

from llmop_engine.simulator import group, sim_config
from llmop_engine.simulator.group import HELLO, PING, PONG, GroupConfig, Rendezvous, parse_hello
from support.harness.replicas import free_port


@pytest.mark.parametrize(
    ("line", "rank"),
    [
        (HELLO + b"1\n", 1),
        (HELLO + b"15\n", 15),
        (b"", None),  # a bare connect (the worker agent's reachability check)
        (b"GET / HTTP/1.1\r\n", None),
        (HELLO + b"one\n", None),
    ],
)
def test_parse_hello(line: bytes, rank: int | None) -> None:
    assert parse_hello(line) == rank


def test_one_node_by_default() -> None:
    cfg = sim_config.parse(["m"])
    assert cfg.group == GroupConfig()
    assert not cfg.group.multi_node


def test_the_renderers_leader_and_worker_flags() -> None:
    flags = ["--pipeline-parallel-size", "2", "--nnodes", "2", "--node-rank", "0"]
    leader = sim_config.parse(["m", *flags, "--master-addr", "llm-0.llm.ns"])
    assert leader.group == GroupConfig(nnodes=2, node_rank=0, master_addr="llm-0.llm.ns")
    assert leader.group.worker_ranks == frozenset({1})
    worker = sim_config.parse(
        ["m", "--nnodes", "4", "--node-rank", "3", "--headless", "--master-port", "29600"]
    )
    assert worker.group.headless
    assert (worker.group.node_rank, worker.group.master_port) == (3, 29600)
    assert worker.group.worker_ranks == frozenset({1, 2, 3})


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nnodes", "2", "--node-rank", "2"], "--node-rank 2 is outside 0..1"),
        (["--node-rank", "1"], "--node-rank 1 is outside 0..0"),
        (["--nnodes", "2", "--headless"], "--headless is for ranks other than 0"),
    ],
)
def test_impossible_ranks_are_refused(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        sim_config.parse(["m", *argv])
    assert message in capsys.readouterr().err


def test_a_late_rank_holds_the_pipeline_and_a_gone_one_loses_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 0's rendezvous: an answer that comes late pauses the pipeline and resumes it (a
    process held up on a loaded node is not a dead stage); a closed connection is a lost rank."""
    monkeypatch.setattr(group, "STAGE_LATE_SECONDS", 0.2)
    monkeypatch.setattr(group, "PING_EVERY_SECONDS", 0.05)
    events: list[tuple[str, int, bool]] = []

    async def scenario() -> None:
        port = free_port()
        rendezvous = Rendezvous(
            GroupConfig(nnodes=2, master_addr="127.0.0.1", master_port=port),
            lambda rank: events.append(("lost", rank, True)),
            lambda rank, late: events.append(("late", rank, late)),
        )
        await rendezvous.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(HELLO + b"1\n")
        assert await reader.readline() == b"ok\n"
        await asyncio.wait_for(rendezvous.all_joined.wait(), 2)
        assert await reader.readline() == PING
        writer.write(PONG)
        assert await reader.readline() == PING
        await asyncio.sleep(0.4)  # past the late bound: held
        assert events == [("late", 1, True)]
        writer.write(PONG)  # the answer comes after all: going on
        assert await reader.readline() == PING
        assert events == [("late", 1, True), ("late", 1, False)]
        writer.close()
        for _ in range(50):
            if ("lost", 1, True) in events:
                break
            await asyncio.sleep(0.02)
        await rendezvous.close()

    asyncio.run(scenario())
    assert events == [("late", 1, True), ("late", 1, False), ("lost", 1, True)]
