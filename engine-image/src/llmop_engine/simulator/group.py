"""The simulator's part in a multi-node group: the two roles of vLLM's `--nnodes N` mode.

vLLM's native multi-node mode (`--nnodes N --node-rank R --master-addr A [--master-port P]`,
`--distributed-executor-backend mp`) runs rank 0 as the API server and ranks 1..N-1 `--headless`.
What llmop relies on, and what the simulator therefore models (observed on vLLM 0.32's CPU build,
`../shared/reference/multinode-lws.md`):

- Rank 0 listens on nothing until every rank has joined its rendezvous on `A:P` (the torch
  TCPStore) and the weights are loaded: connection refused meanwhile, as for a one-pod engine.
- A headless rank has no HTTP at all; it keeps trying to reach `A:P` until it joins, and exits
  with an error once its leader is gone.
- When a rank dies while serving, rank 0 does not notice: `/health` stays 200 and `/metrics`
  answers, but no forward pass completes again (a completion hangs). The simulator's `hang` fault
  is exactly that, so a lost rank applies it; only a restart of the group heals it.
- A rank that is only late (stopped, wedged, or its process held up on a loaded node) holds every
  forward pass until it answers, and the pipeline goes on when it does: vLLM's stages wait for
  each other, they do not give up. So a late rank pauses the scheduler and an answer resumes it.

The rendezvous here is a plain TCP line protocol (a rank sends `llmop-sim rank R`, rank 0 answers
`ok`) on the same port, so the worker agent's reachability check (a bare connect) works unchanged.
A forward pass needs every stage, so rank 0 pings each rank every second; a rank that closes its
connection (its process died) has lost the pipeline, one that leaves a ping unanswered for
`STAGE_LATE_SECONDS` holds it until its answer comes. Late is not lost: a process of this 2-core
machine's pods was once held up for 17 s under load, and taking that for a dead stage hung
groups whose every process was fine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from llmop_engine.contract import MASTER_ADDR, MASTER_PORT

log = logging.getLogger("llmop_engine.simulator")

HELLO = b"llmop-sim rank "
OK = b"ok\n"
HELLO_TIMEOUT_SECONDS = 5.0
"""A connection that names no rank within this is a bare reachability check: closed."""
RETRY_SECONDS = 0.5
"""A headless rank's pause between tries to reach its leader (pod not up, name not resolvable)."""
PING = b"ping\n"
PONG = b"pong\n"
PING_EVERY_SECONDS = 1.0
STAGE_LATE_SECONDS = 3.0
"""A stage that answers no ping for this long holds the pipeline (no step completes) until it
answers: what a stopped or wedged rank does to vLLM's forward passes."""


@dataclass(frozen=True)
class GroupConfig:
    """The multi-node flags vLLM takes; `nnodes` 1 is a one-pod engine."""

    nnodes: int = 1
    node_rank: int = 0
    headless: bool = False
    master_addr: str = MASTER_ADDR
    master_port: int = MASTER_PORT

    @property
    def multi_node(self) -> bool:
        return self.nnodes > 1

    @property
    def worker_ranks(self) -> frozenset[int]:
        return frozenset(range(1, self.nnodes))


def parse_hello(line: bytes) -> int | None:
    """The rank a joining process names, or None for anything else."""
    if not line.startswith(HELLO):
        return None
    try:
        return int(line[len(HELLO) :].strip())
    except ValueError:
        return None


class Rendezvous:
    """Rank 0's side: accept the other ranks, say when all joined, report a rank late (and
    back) or lost."""

    def __init__(
        self,
        group: GroupConfig,
        on_lost: Callable[[int], None],
        on_late: Callable[[int, bool], None],
    ) -> None:
        self.group = group
        self.on_lost = on_lost
        self.on_late = on_late
        """Called with (rank, True) when a rank stops answering, (rank, False) when it answers
        again."""
        self.joined: set[int] = set()
        self.all_joined = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        # All addresses: the headless ranks run in other pods.
        self._server = await asyncio.start_server(self._handle, "0.0.0.0", self.group.master_port)
        log.info(
            "rendezvous on port %d: waiting for %d other rank(s)",
            self.group.master_port,
            len(self.group.worker_ranks),
        )

    async def close(self) -> None:
        """Stop listening and drop the ranks' connections (they see their leader gone)."""
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        rank: int | None = None
        self._writers.add(writer)
        try:
            try:
                rank = parse_hello(await asyncio.wait_for(reader.readline(), HELLO_TIMEOUT_SECONDS))
            except (TimeoutError, ConnectionError):
                rank = None
            if rank not in self.group.worker_ranks:
                return
            self.joined.add(rank)
            writer.write(OK)
            await writer.drain()
            log.info("rank %d joined (%d/%d)", rank, len(self.joined) + 1, self.group.nnodes)
            if self.joined >= self.group.worker_ranks:
                self.all_joined.set()
            why = await self._watch_stage(rank, reader, writer)
            self.joined.discard(rank)
            if self.all_joined.is_set():
                # Past the distributed init the group is one engine: no stage can be replaced.
                log.error("rank %d %s: the pipeline stalls (no forward pass completes)", rank, why)
                self.on_lost(rank)
            else:
                log.warning("rank %d %s before the group formed", rank, why)
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _watch_stage(
        self, rank: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> str:
        """Ping a joined rank until it is gone; a late answer holds the pipeline meanwhile."""
        late = False
        try:
            while True:
                writer.write(PING)
                await writer.drain()
                try:
                    answer = await asyncio.wait_for(reader.readline(), STAGE_LATE_SECONDS)
                except TimeoutError:
                    # Also when this process was held up past the deadline with the answer
                    # already here (the timer and the read fire in one loop turn): the read
                    # below then returns it at once, and the pause lasts that one turn.
                    late = True
                    log.warning(
                        "rank %d answered no ping for %gs: the pipeline waits for it",
                        rank,
                        STAGE_LATE_SECONDS,
                    )
                    self.on_late(rank, True)
                    answer = await reader.readline()
                if answer != PONG:
                    return "is gone"
                if late:
                    late = False
                    log.info("rank %d answers again: the pipeline goes on", rank)
                    self.on_late(rank, False)
                await asyncio.sleep(PING_EVERY_SECONDS)
        except ConnectionError:
            return "is gone"
        finally:
            if late:
                self.on_late(rank, False)


async def run_headless(group: GroupConfig, stop: asyncio.Event) -> int:
    """A headless rank: join the leader, then run until told to stop (0) or the leader is gone
    (1, as a rank whose peers vanished)."""
    log.info(
        "headless rank %d of %d: joining %s:%d",
        group.node_rank,
        group.nnodes,
        group.master_addr,
        group.master_port,
    )
    tries = 0
    while not stop.is_set():
        tries += 1
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(group.master_addr, group.master_port), RETRY_SECONDS * 4
            )
        except (OSError, TimeoutError) as exc:
            if tries == 1 or tries % 20 == 0:
                log.info("leader not reachable yet (%s); retrying", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), RETRY_SECONDS)
            continue
        try:
            writer.write(HELLO + str(group.node_rank).encode() + b"\n")
            await writer.drain()
            if await reader.readline() != OK:
                log.warning("leader refused rank %d; retrying", group.node_rank)
                await asyncio.sleep(RETRY_SECONDS)
                continue
            log.info("joined the group as rank %d", group.node_rank)
            return await _until_stopped_or_orphaned(reader, writer, stop)
        except ConnectionError as exc:
            log.warning("lost the leader while joining (%s); retrying", exc)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
    log.info("headless rank stopped before joining")
    return 0


async def _until_stopped_or_orphaned(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, stop: asyncio.Event
) -> int:
    gone = asyncio.ensure_future(_answer_pings(reader, writer))
    stopped = asyncio.ensure_future(stop.wait())
    done, pending = await asyncio.wait({gone, stopped}, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    if stopped in done:
        log.info("headless rank: stop requested, exiting")
        return 0
    log.error("the leader's rendezvous closed: this rank has no group any more")
    return 1


async def _answer_pings(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answer the leader's pings until it closes the connection."""
    with contextlib.suppress(ConnectionError):
        while line := await reader.readline():
            if line == PING:
                writer.write(PONG)
                await writer.drain()
