"""The simulator's continuous-batching model, driven in-process with fast steps."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from llmop_engine.simulator.batching import BatchEngine, RequestTooLongError, SimRequest
from llmop_engine.simulator.faults import FaultError, FaultState
from llmop_engine.simulator.metrics import SimMetrics
from llmop_engine.simulator.sim_config import SimConfig, parse

FAST = SimConfig(
    decode_ms=2.0,
    decode_ms_per_seq=0.0,
    max_num_seqs=2,
    num_gpu_blocks=64,
    block_size=16,
    max_model_len=512,
)


def engine(cfg: SimConfig = FAST) -> BatchEngine:
    return BatchEngine(cfg, SimMetrics(cfg), FaultState())


async def finished(reqs: list[SimRequest], timeout: float = 5.0) -> None:
    async def one(r: SimRequest) -> None:
        while not r.finished:
            await r.changed.wait()
            r.changed.clear()

    await asyncio.wait_for(asyncio.gather(*(one(r) for r in reqs)), timeout)


def test_max_num_seqs_bounds_the_batch() -> None:
    async def scenario() -> None:
        e = engine()
        task = asyncio.create_task(e.run())
        reqs = [e.submit(10, 20) for _ in range(5)]
        await asyncio.sleep(0.01)
        assert len(e.running) == 2
        assert len(e.waiting) == 3
        await finished(reqs)
        assert all(r.finish_reason == "length" and r.generated == 20 for r in reqs)
        assert e.generation_tokens_total == 100
        e.stop()
        await task

    asyncio.run(scenario())


def test_kv_blocks_limit_admission() -> None:
    async def scenario() -> None:
        cfg = dataclasses.replace(FAST, max_num_seqs=10, num_gpu_blocks=10)
        e = engine(cfg)
        task = asyncio.create_task(e.run())
        # 100 tokens = 7 blocks each: only one fits in 10 blocks.
        reqs = [e.submit(50, 50) for _ in range(3)]
        await asyncio.sleep(0.01)
        assert len(e.running) == 1
        assert e.kv_usage == pytest.approx(0.7)
        await finished(reqs)
        assert e.used_blocks == 0
        e.stop()
        await task

    asyncio.run(scenario())


def test_step_time_grows_with_batch_and_prefill() -> None:
    e = engine(SimConfig())
    assert e.step_seconds(1, 0) < e.step_seconds(64, 0) < e.step_seconds(256, 0)
    assert e.step_seconds(1, 10000) == pytest.approx(e.step_seconds(1, 0) + 1.0)
    # Realistic default: tens of milliseconds per output token, so 256 tokens take seconds.
    assert 0.01 < e.step_seconds(32, 0) < 0.1


def test_too_long_is_rejected() -> None:
    with pytest.raises(RequestTooLongError):
        engine().submit(500, 100)


@pytest.mark.parametrize(("timeout", "reason"), [(0.0, "abort"), (5.0, "length")])
def test_shutdown_timeout(timeout: float, reason: str) -> None:
    async def scenario() -> None:
        e = engine()
        task = asyncio.create_task(e.run())
        reqs = [e.submit(10, 30) for _ in range(2)]
        await asyncio.sleep(0.01)
        assert not await e.drain(timeout)  # nothing left at the deadline
        assert [r.finish_reason for r in reqs] == [reason, reason]
        late = e.submit(10, 30)  # arrives during shutdown: rejected with an immediate abort
        assert late.finish_reason == "abort"
        e.stop()
        await task

    asyncio.run(scenario())


def test_work_left_at_the_shutdown_deadline_is_reported_not_aborted() -> None:
    """vLLM past --shutdown-timeout kills its EngineCore: leftovers get no finish reason."""

    async def scenario() -> None:
        e = engine()
        task = asyncio.create_task(e.run())
        r = e.submit(10, 400)
        await asyncio.sleep(0.01)
        assert await e.drain(0.05)
        assert r.finish_reason is None
        e.stop()
        await task

    asyncio.run(scenario())


def test_hang_freezes_progress_and_aborts() -> None:
    async def scenario() -> None:
        e = engine()
        task = asyncio.create_task(e.run())
        r = e.submit(10, 400)
        await asyncio.sleep(0.02)
        e.faults.set("hang", 0.0)
        e.notify()
        await asyncio.sleep(0.01)
        frozen = e.generation_tokens_total
        e.abort(r)
        await asyncio.sleep(0.05)
        assert e.generation_tokens_total == frozen
        assert not r.finished
        e.faults.set("none", 0.0)
        e.notify()
        await finished([r])
        assert r.finish_reason == "abort"
        e.stop()
        await task

    asyncio.run(scenario())


def test_a_late_stage_holds_every_step_until_it_answers() -> None:
    """A multi-node group's late rank pauses generation; its answer resumes it (not a hang)."""

    async def scenario() -> None:
        e = engine()
        task = asyncio.create_task(e.run())
        r = e.submit(10, 60)
        await asyncio.sleep(0.02)
        e.stage_late(1, True)
        await asyncio.sleep(0.01)
        held = e.generation_tokens_total
        await asyncio.sleep(0.05)
        assert e.halted()
        assert e.generation_tokens_total == held
        assert not r.finished
        e.stage_late(1, False)
        assert not e.halted()
        await finished([r])
        assert (r.finish_reason, r.generated) == ("length", 60)
        e.stop()
        await task

    asyncio.run(scenario())


def test_error_fault_finishes_requests_with_reason_error_until_cleared() -> None:
    """The error-rate alert's fault: `finished_reason="error"` in vLLM's success counter."""

    async def scenario() -> None:
        e = engine()
        task = asyncio.create_task(e.run())
        e.faults.set("error", 0.0)
        failed = [e.submit(10, 20) for _ in range(3)]
        await finished(failed)
        assert [(r.finish_reason, r.generated) for r in failed] == [("error", 0)] * 3
        assert not e.has_work()
        assert e.used_blocks == 0
        e.faults.set("none", 0.0)
        ok = e.submit(10, 5)
        await finished([ok])
        assert (ok.finish_reason, ok.generated) == ("length", 5)
        success = {
            line.split('finished_reason="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
            for line in e.metrics.render(0, 0, 0.0).decode().splitlines()
            if line.startswith("vllm:request_success_total{")
        }
        assert success == {"error": 3.0, "length": 1.0}
        e.stop()
        await task

    asyncio.run(scenario())


def test_fault_validation() -> None:
    with pytest.raises(FaultError):
        FaultState().set("explode", 0.0)
    with pytest.raises(FaultError):
        FaultState().set("slow", 0.0, slow_factor=0.5)


def test_simulator_flags_accept_and_ignore_vllm_flags() -> None:
    cfg = parse(
        [
            "org/model",
            "--served-model-name",
            "a",
            "b",
            "--max-num-seqs",
            "8",
            "--tensor-parallel-size",
            "2",
            "--enable-prefix-caching",
            "--shutdown-timeout",
            "30",
            "--sim-fault",
            "slow",
        ]
    )
    assert cfg.model == "org/model"
    assert cfg.served_model_name == "a"
    assert cfg.max_num_seqs == 8
    assert cfg.shutdown_timeout == 30
    assert cfg.fault == "slow"


# --- prefix caching ---------------------------------------------------------------------------


def _blocks(text: str) -> tuple[int, ...]:
    from llmop_engine.simulator.prefix_cache import prompt_blocks

    return prompt_blocks(text, FAST.block_size)


SYSTEM = "s" * 64 * 8  # 8 full blocks of 16 tokens (4 characters a token)


def test_a_repeated_prefix_is_prefilled_once() -> None:
    async def scenario() -> None:
        cfg = dataclasses.replace(FAST, max_num_seqs=4, num_gpu_blocks=256)
        e = engine(cfg)
        task = asyncio.create_task(e.run())
        first = e.submit(160, 2, prefix=_blocks(SYSTEM + "first question, long enough" * 3))
        await finished([first])
        second = e.submit(160, 2, prefix=_blocks(SYSTEM + "other question, long enough" * 3))
        await finished([second])
        assert first.cached_tokens == 0
        # The 8 shared blocks hit; the blocks after them differ.
        assert second.cached_tokens == 8 * 16
        text = e.metrics.render(0, 0, 0.0).decode()
        assert "vllm:prefix_cache_queries_total" in text
        assert 'vllm:prefix_cache_hits_total{engine="0",model_name="Qwen/Qwen3-0.6B"} 128.0' in text
        e.stop()
        await task

    asyncio.run(scenario())


def test_cached_tokens_shorten_the_prefill_step() -> None:
    async def scenario() -> None:
        cfg = dataclasses.replace(FAST, num_gpu_blocks=256, prefill_tokens_per_s=1000.0)
        e = engine(cfg)
        task = asyncio.create_task(e.run())
        cold = e.submit(128, 1, prefix=_blocks(SYSTEM))
        await finished([cold])
        warm = e.submit(128, 1, prefix=_blocks(SYSTEM))
        await finished([warm])
        assert cold.first_token_at is not None
        assert warm.first_token_at is not None
        # 128 tokens at 1000/s is 128 ms cold; warm recomputes the block of the last token (vLLM
        # hits whole blocks before the last prompt token only).
        assert warm.cached_tokens == 7 * 16
        assert (warm.first_token_at - warm.arrival) < (cold.first_token_at - cold.arrival) / 4
        e.stop()
        await task

    asyncio.run(scenario())


def test_a_working_set_larger_than_the_kv_cache_evicts_the_oldest_prefix() -> None:
    async def scenario() -> None:
        # 16 blocks (15 cache, as vLLM keeps a null block); each prompt has 8 distinct blocks: the
        # third evicts the first and the last block of the second; the first, back, evicts the
        # rest of the second and the last block of the third.
        cfg = dataclasses.replace(FAST, num_gpu_blocks=16, max_model_len=256)
        e = engine(cfg)
        task = asyncio.create_task(e.run())
        prompts = [c * 64 * 8 for c in "abc"]
        for prompt in prompts:
            await finished([e.submit(128, 1, prefix=_blocks(prompt))])
        again_first = e.submit(128, 1, prefix=_blocks(prompts[0]))
        await finished([again_first])
        again_third = e.submit(128, 1, prefix=_blocks(prompts[2]))
        await finished([again_third])
        assert again_first.cached_tokens == 0
        assert again_third.cached_tokens == 7 * 16
        e.stop()
        await task

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("hit_blocks", "prompt_tokens", "cached"),
    [
        (0, 100, 0),
        (3, 100, 3 * 16),  # whole blocks only
        (8, 129, 8 * 16),
        (8, 128, 7 * 16),  # a prompt of whole blocks recomputes its last block
        (1, 1, 0),
    ],
)
def test_hits_are_whole_blocks_before_the_last_prompt_token(
    hit_blocks: int, prompt_tokens: int, cached: int
) -> None:
    from llmop_engine.simulator.prefix_cache import cached_tokens

    assert cached_tokens(hit_blocks, prompt_tokens, 16) == cached


def test_eviction_takes_a_prefix_from_its_tail_and_anonymous_blocks_first() -> None:
    from llmop_engine.simulator.prefix_cache import PrefixCache

    cache = PrefixCache(capacity=10)
    first, second = (1, 2, 3, 4, 5, 6), (11, 12, 13, 14)
    cache.add(first, anonymous=2)  # e.g. two full blocks of generated tokens
    cache.add(second)
    # 12 blocks cached, 10 kept: the two anonymous ones go, the whole first prompt stays.
    assert (len(cache), cache.match(first), cache.match(second)) == (10, 6, 4)
    cache.add((21, 22, 23))
    # vLLM frees a request's blocks last first: the first prompt loses its tail, keeps its head.
    assert (cache.match(first), cache.match(second)) == (3, 4)
    # A request's partial last block needs a slot while it runs too: one block in, two out.
    cache.add((31,), partial=1)
    assert (len(cache), cache.match(first), cache.match((31,))) == (9, 1, 1)


def test_generated_tokens_and_recomputed_blocks_take_cache_slots() -> None:
    async def scenario() -> None:
        e = engine(dataclasses.replace(FAST, num_gpu_blocks=64))
        task = asyncio.create_task(e.run())
        assert e.prefix_cache is not None
        # 8 prompt blocks + 33 tokens out: the KV of 160 tokens, 10 full blocks, all cached.
        await finished([e.submit(128, 33, prefix=_blocks(SYSTEM))])
        assert len(e.prefix_cache) == 10
        # Again with one token out: 7 blocks hit, the 8th is recomputed into a second copy.
        again = e.submit(128, 1, prefix=_blocks(SYSTEM))
        await finished([again])
        assert (again.cached_tokens, len(e.prefix_cache)) == (7 * 16, 11)
        e.stop()
        await task

    asyncio.run(scenario())


def test_prefix_caching_can_be_turned_off() -> None:
    cfg = parse(["m", "--no-enable-prefix-caching"])
    assert cfg.enable_prefix_caching is False
    assert parse(["m"]).enable_prefix_caching is True
    assert engine(cfg).prefix_cache is None


def test_the_waiting_gauge_counts_what_a_step_passed_over_as_vllm_does() -> None:
    """vLLM makes `num_requests_waiting` after each step: a request that arrived since goes in
    the next step and is not counted; one the scheduler had no room for is."""

    async def scenario() -> None:
        now = [100.0]
        e = BatchEngine(FAST, SimMetrics(FAST), FaultState(), clock=lambda: now[0])
        e.scheduled_at = 99.99  # a step just before
        e.submit(10, 20)
        assert len(e.waiting) == 1
        assert e.reported_waiting() == 0, "arrived after the last step: goes in the next"
        now[0] += 0.3
        assert e.reported_waiting() == 1, "no step for a while: a hung engine's queue shows"
        task = asyncio.create_task(e.run())
        for _ in range(3):
            e.submit(10, 20)
        await asyncio.sleep(0.01)
        # One step ran (the clock stands still): 2 running, the other 2 passed over.
        assert len(e.running) == 2
        assert e.reported_waiting() == 2
        e.stop()
        await task

    asyncio.run(scenario())
