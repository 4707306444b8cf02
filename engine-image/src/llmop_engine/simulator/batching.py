"""Continuous-batching model: one scheduler loop, one step per decode iteration.

Each step admits waiting requests (bounded by `--max-num-seqs`, free KV blocks and the
`--max-num-batched-tokens` prefill budget), sleeps for the step time, then hands every running
request one token. Step time = (decode_ms + decode_ms_per_seq * running) * fault factor + prefill
tokens / prefill rate, so TTFT = queueing + prefill and inter-token latency grows with the batch,
like a real GPU. Requests are only bumped counters and an `asyncio.Event`; there is no task per
token, which keeps three simulators with dozens of streams cheap on a small CPU.

KV blocks for prompt + max_tokens are reserved at admission, so the model never preempts (vLLM
allocates lazily and preempts under pressure; reserving is the conservative simplification).
Aborts (client disconnects) take effect at the next step boundary, so a hung engine (or one waiting
for a late pipeline stage) keeps them, as a wedged vLLM engine core does. Prefix caching (on by
default, as in vLLM) is `prefix_cache`'s model: a request prefills only the tokens after its
longest cached prefix.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from llmop_engine.simulator.faults import FaultState
from llmop_engine.simulator.metrics import SimMetrics
from llmop_engine.simulator.prefix_cache import PrefixCache, cached_tokens
from llmop_engine.simulator.sim_config import SimConfig


class RequestTooLongError(ValueError):
    """Prompt + max_tokens exceed the context or the whole KV cache (vLLM answers 400)."""


@dataclass(eq=False)
class SimRequest:
    request_id: str
    prompt_tokens: int
    max_tokens: int
    arrival: float
    blocks: int
    is_probe: bool = False
    prefix: tuple[int, ...] = ()
    """Chained hashes of the prompt's full blocks (prefix caching)."""
    cached_tokens: int = 0
    stop_after: int | None = None
    """Tokens after which the request finishes with "stop" (its stop string or stop token id,
    known up front: the simulated model is deterministic, `decoding.plan`)."""
    generated: int = 0
    admitted_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    finish_reason: str | None = None
    abort_requested: bool = False
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


UNSCHEDULED_SECONDS = 0.25
"""A waiting request no step has passed over yet counts as waiting after this long."""


class BatchEngine:
    def __init__(
        self,
        cfg: SimConfig,
        metrics: SimMetrics,
        faults: FaultState,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.faults = faults
        self.clock = clock
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.used_blocks = 0
        self.shutting_down = False
        self.dead = False
        self.steps = 0
        self.generation_tokens_total = 0
        self._ids = itertools.count(1)
        # vLLM keeps one block aside (its null block); the rest can hold cached content.
        self.prefix_cache = (
            PrefixCache(max(1, cfg.num_gpu_blocks - 1)) if cfg.enable_prefix_caching else None
        )
        self.scheduled_at = -math.inf
        """When the scheduler last admitted what fit (`reported_waiting`)."""
        self.late_stages: set[int] = set()
        """Pipeline stages (ranks of a multi-node group) that answer late: no step completes
        until they answer (`simulator.group`)."""
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._stopped = False

    # -- requests ---------------------------------------------------------------------------

    def blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.cfg.block_size)

    def submit(
        self,
        prompt_tokens: int,
        max_tokens: int,
        is_probe: bool = False,
        prefix: tuple[int, ...] = (),
        stop_after: int | None = None,
    ) -> SimRequest:
        total = prompt_tokens + max_tokens
        if total > self.cfg.max_model_len:
            raise RequestTooLongError(
                f"This model's maximum context length is {self.cfg.max_model_len} tokens. However, "
                f"you requested {total} tokens ({prompt_tokens} in the messages, {max_tokens} in "
                "the completion)."
            )
        blocks = self.blocks_for(total)
        if blocks > self.cfg.num_gpu_blocks:
            raise RequestTooLongError("request needs more KV cache blocks than the engine has")
        req = SimRequest(
            request_id=f"{next(self._ids)}",
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            arrival=self.clock(),
            blocks=blocks,
            is_probe=is_probe,
            prefix=prefix,
            stop_after=stop_after,
        )
        if self.shutting_down or self.dead:
            # vLLM drain mode: new ADD requests are rejected with an immediate abort.
            self._finish(req, "abort" if self.shutting_down else "error")
            return req
        self.waiting.append(req)
        self._idle.clear()
        self._wake.set()
        return req

    def abort(self, req: SimRequest) -> None:
        """Client went away; honoured at the next step boundary."""
        if not req.finished:
            req.abort_requested = True
            self._wake.set()

    @property
    def kv_usage(self) -> float:
        return self.used_blocks / self.cfg.num_gpu_blocks

    def reported_waiting(self) -> int:
        """`vllm:num_requests_waiting` as vLLM reports it: the requests its last step's
        scheduler passed over (vLLM makes the gauge after a step, and adds what arrived
        meanwhile only before the next one), not one that arrived since and goes in the next
        step. One that waited past `UNSCHEDULED_SECONDS` counts too, so a hung engine's queue
        shows (the agent's stall check needs pending work; vLLM's gauge would freeze)."""
        now = self.clock()
        return sum(
            1
            for r in self.waiting
            if r.arrival <= self.scheduled_at or now - r.arrival > UNSCHEDULED_SECONDS
        )

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- lifecycle --------------------------------------------------------------------------

    def notify(self) -> None:
        """Wake the scheduler (fault changed)."""
        self._wake.set()

    def stage_late(self, rank: int, late: bool) -> None:
        """A pipeline stage stopped answering (True) or answers again (False)."""
        if late:
            self.late_stages.add(rank)
        else:
            self.late_stages.discard(rank)
        self._wake.set()

    def halted(self) -> bool:
        """No step completes: the engine is hung, or waits for a late stage."""
        return self.faults.mode == "hang" or bool(self.late_stages)

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()

    def abort_all(self, reason: str = "abort") -> None:
        for req in [*self.running, *self.waiting]:
            self._finish(req, reason)
        self.running.clear()
        self.waiting.clear()
        self.used_blocks = 0
        self._idle.set()

    async def drain(self, timeout: float) -> bool:
        """vLLM's `--shutdown-timeout`: 0 aborts everything at once; N > 0 finishes work for up
        to N seconds. Returns True when work was left at the deadline: like vLLM, which then
        kills its EngineCore, the caller stops the scheduler and leaves those requests unanswered
        (no abort is delivered)."""
        self.shutting_down = True
        if timeout > 0 and self.has_work():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), timeout)
            if self.has_work():
                return True
        self.abort_all("abort")
        return False

    # -- scheduler --------------------------------------------------------------------------

    def _finish(self, req: SimRequest, reason: str) -> None:
        if req.finished:
            return
        req.finish_reason = reason
        req.changed.set()
        now = self.clock()
        self.metrics.finished(reason)
        self.metrics.e2e.observe(now - req.arrival)

    def _process_aborts(self) -> None:
        if not any(r.abort_requested for r in self.waiting) and not any(
            r.abort_requested for r in self.running
        ):
            return
        for req in [r for r in self.running if r.abort_requested]:
            self.running.remove(req)
            self.used_blocks -= req.blocks
            self._finish(req, "abort")
        kept = deque(r for r in self.waiting if not r.abort_requested)
        for req in self.waiting:
            if req.abort_requested:
                self._finish(req, "abort")
        self.waiting = kept

    def _admit(self, now: float) -> int:
        """Admit what fits; returns the tokens this step must prefill (cached ones excluded)."""
        budget = self.cfg.max_num_batched_tokens
        prefill = 0
        while self.waiting and len(self.running) < self.cfg.max_num_seqs:
            req = self.waiting[0]
            if self.used_blocks + req.blocks > self.cfg.num_gpu_blocks:
                break  # KV cache full: wait for running requests to free blocks
            uncached = req.prompt_tokens - self._cached_tokens(req)
            if prefill and prefill + uncached > budget:
                break  # this step's prefill budget is spent
            self.waiting.popleft()
            self.used_blocks += req.blocks
            req.admitted_at = now
            self.metrics.queue_time.observe(now - req.arrival)
            self._cache_prompt(req)
            prefill += req.prompt_tokens - req.cached_tokens
            self.metrics.prompt_tokens.inc(req.prompt_tokens)
            self.running.append(req)
        return prefill

    def _cached_tokens(self, req: SimRequest) -> int:
        if self.prefix_cache is None or not req.prefix:
            return 0
        hits = self.prefix_cache.match(req.prefix)
        return cached_tokens(hits, req.prompt_tokens, self.cfg.block_size)

    def _cache_prompt(self, req: SimRequest) -> None:
        """Count the request's prefix-cache lookup and keep its blocks cached."""
        if self.prefix_cache is None:
            return
        matched = self.prefix_cache.match(req.prefix)
        req.cached_tokens = cached_tokens(matched, req.prompt_tokens, self.cfg.block_size)
        self.metrics.prefix_cache_queries.inc(req.prompt_tokens)
        self.metrics.prefix_cache_hits.inc(req.cached_tokens)
        # Cached blocks recomputed all the same (the last prompt token's) get a second copy; the
        # KV of every token but the last generated one fills blocks, cached as they fill, and
        # the last block it only partly fills is held uncached. The simulator generates
        # max_tokens unless aborted, so it counts them now.
        size = self.cfg.block_size
        recomputed = matched - req.cached_tokens // size
        computed = req.prompt_tokens + req.max_tokens - 1
        generated = max(0, computed // size - req.prompt_tokens // size)
        partial = 1 if computed % size else 0
        self.prefix_cache.add(req.prefix, anonymous=recomputed + generated, partial=partial)

    def step_seconds(self, batch: int, prefill_tokens: int) -> float:
        decode = (self.cfg.decode_ms + self.cfg.decode_ms_per_seq * batch) / 1000.0
        return decode * self.faults.step_factor + prefill_tokens / self.cfg.prefill_tokens_per_s

    async def run(self) -> None:
        while not self._stopped:
            if not self.halted():
                self._process_aborts()
            if not self.has_work() or self.halted() or self.dead:
                if not self.has_work():
                    self._idle.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            now = self.clock()
            prefill = self._admit(now)
            self.scheduled_at = now
            batch = len(self.running)
            if batch == 0:
                # Waiting requests that cannot be admitted and nothing running cannot happen with
                # reserved blocks unless an abort is pending; wait for the next event.
                self._wake.clear()
                await self._wake.wait()
                continue
            await asyncio.sleep(self.step_seconds(batch, prefill))
            if self.halted() or self.dead or self._stopped:
                continue  # the step never completes
            self._deliver(self.clock(), prefill)

    def _deliver(self, now: float, prefill: int) -> None:  # noqa: C901
        self.steps += 1
        if self.faults.mode == "error":
            # A per-request engine failure: the step ends every running request, no token.
            for req in self.running:
                self._finish(req, "error")
            self.running.clear()
            self.used_blocks = 0
            if not self.has_work():
                self._idle.set()
            return
        done: list[SimRequest] = []
        produced = 0
        for req in self.running:
            if req.finished:
                done.append(req)
                continue
            req.generated += 1
            produced += 1
            if req.first_token_at is None:
                req.first_token_at = now
                self.metrics.ttft.observe(now - req.arrival)
            elif req.last_token_at is not None:
                self.metrics.itl.observe(now - req.last_token_at)
            req.last_token_at = now
            if req.stop_after is not None and req.generated >= req.stop_after:
                self._finish(req, "stop")  # a stop on the last allowed token wins, as in vLLM
                done.append(req)
            elif req.generated >= req.max_tokens:
                self._finish(req, "length")
                done.append(req)
            else:
                req.changed.set()
        self.generation_tokens_total += produced
        self.metrics.generation_tokens.inc(produced)
        for req in done:
            self.running.remove(req)
            self.used_blocks -= req.blocks
        if not self.has_work():
            self._idle.set()
