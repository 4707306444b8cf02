"""The simulator's multi-node flags and rendezvous lines (llmop_engine.simulator.group)."""

from __future__ import annotations

import pytest

from llmop_engine.simulator import config
from llmop_engine.simulator.group import HELLO, GroupConfig, parse_hello


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
    cfg = config.parse(["m"])
    assert cfg.group == GroupConfig()
    assert not cfg.group.multi_node


def test_the_renderers_leader_and_worker_flags() -> None:
    flags = ["--pipeline-parallel-size", "2", "--nnodes", "2", "--node-rank", "0"]
    leader = config.parse(["m", *flags, "--master-addr", "llm-0.llm.ns"])
    assert leader.group == GroupConfig(nnodes=2, node_rank=0, master_addr="llm-0.llm.ns")
    assert leader.group.worker_ranks == frozenset({1})
    worker = config.parse(
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
        config.parse(["m", *argv])
    assert message in capsys.readouterr().err
