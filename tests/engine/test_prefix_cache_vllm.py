"""The simulator's prefix cache against real vLLM (CPU build) on the same prompts.

One real vLLM engine (tiny random-weight model, 64 KV blocks of 32 tokens) and one bare simulator
configured alike get the same sequence of requests, one at a time; after each, the deltas of
`vllm:prefix_cache_queries_total` and `vllm:prefix_cache_hits_total` of both are compared.

The simulator has no tokenizer (4 characters a token). The completion prompts here are made of
words that the tiny model's tokenizer turns into exactly one token each and that are exactly 4
characters long (" def", " for", ...), so both count the same tokens and cut the same blocks, and
their queries and hits are compared exactly (vLLM's own `usage.prompt_tokens` is checked first:
the premise). Chat prompts go through each side's chat template, which differ (the tiny model's
`<|role|>\\n...</s>\\n` plus a generation prompt, the simulator's `<|role|>\\n...<|end|>\\n`), so
there the token counts differ by a few tokens a message and the shared prefix may end one block
earlier or later: hits are compared within one block.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from engine import real_vllm
from engine.real_vllm import MEASURED, Engine, metric_values
from support.harness.replicas import Replica

pytestmark = [pytest.mark.vllm, pytest.mark.engine]

BLOCK = 32
"""Tokens a KV block (vLLM's CPU backend wants a multiple of 32)."""
BLOCKS = 64
"""KV blocks of both engines: 63 usable by vLLM (one is its null block), so 2,016 tokens, and the
prompts below (about 20 blocks each) overflow it within a few requests."""
ENGINE_ARGS = [
    "--block-size",
    str(BLOCK),
    "--num-gpu-blocks-override",
    str(BLOCKS),
    # vLLM refuses to start when one request of max-model-len does not fit the KV cache.
    "--max-model-len",
    "1024",
    "--max-num-seqs",
    "4",
]
START_TIMEOUT = 300.0

# Single tokens of the tiny model's tokenizer (a byte-level BPE trained on Python's standard
# library, tests/support/tiny_model.py), each exactly 4 characters: a leading space and 3 letters.
# Its pre-tokenizer splits before every space, so no two of them ever merge into one token.
WORDS = tuple(
    f" {w}"
    for w in (
        *("def", "for", "not", "and", "int", "len", "str", "set", "key", "get", "has", "max"),
        *("min", "new", "old", "one", "out", "run", "sys", "end", "env", "err", "exc", "obj"),
        *("msg", "map", "log", "raw", "res", "add", "all", "any", "arg", "buf", "cls", "cmd"),
        *("col", "cur", "dir", "doc"),
    )
)


def text(seed: int, tokens: int) -> str:
    """`tokens` words, a sequence of its own for each seed (first words differ across seeds)."""
    n = len(WORDS)
    return "".join(WORDS[(seed + i * (seed % 7 + 1) + i * i) % n] for i in range(tokens))


@dataclass(frozen=True)
class Step:
    name: str
    body: dict[str, Any]
    exact: bool
    """Both count the same tokens (completions of one-token words): compared exactly."""


def completion(name: str, prompt: str, max_tokens: int = 1) -> Step:
    # ignore_eos: the random model may end at any token; the blocks its output fills count.
    body = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
    return Step(name, body, exact=True)


def chat(name: str, system: str, user: str) -> Step:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    return Step(name, {"messages": messages, "max_tokens": 1}, exact=False)


def steps(seed: int = 0) -> list[Step]:
    """The sequence; another `seed`, other texts (for a second run on a used engine)."""
    a = text(seed + 1, 20 * BLOCK + 5)
    system = text(seed + 50, 3 * BLOCK + 10)

    def filler(n: int) -> str:
        return text(seed + 10 + n, 20 * BLOCK + 5)

    return [
        completion("cold prompt", a),
        completion("same prompt again", a),
        # vLLM never hits the block of a prompt's last token: whole blocks hit one less.
        completion("its first 20 blocks exactly", a[: 20 * BLOCK * 4]),
        completion("10 blocks + 10 tokens shared, then not", a[: 330 * 4] + text(seed + 2, 330)),
        # Prompts of 20 new blocks overflow the 63 usable: the least recently used go, each
        # prompt's last blocks before its first (vLLM frees a request's blocks last first). The
        # last filler's output fills one more block, cached too, which leaves the first filler
        # one block instead of two (so do vLLM's null block and a partial block while it runs).
        completion("filler 1", filler(1)),
        completion("filler 2", filler(2)),
        completion("filler 3", filler(3)),
        completion("filler 4, 40 tokens out", filler(4), max_tokens=40),
        completion("filler 1 again: its head outlived its tail", filler(1)),
        completion("first prompt again: evicted", a),
        chat("chat, cold system prompt", system, text(seed + 6, 40)),
        chat("chat, same system prompt, other question", system, text(seed + 7, 40)),
    ]


STEPS = steps()


@dataclass(frozen=True)
class Delta:
    queries: int
    hits: int
    prompt_tokens: int


async def counters(http: aiohttp.ClientSession, api: str) -> tuple[int, int]:
    async with http.get(api + "/metrics") as r:
        body = await r.text()
    queries = metric_values(body, "vllm:prefix_cache_queries_total")
    hits = metric_values(body, "vllm:prefix_cache_hits_total")
    return int(sum(queries)), int(sum(hits))


async def run_steps(api: str, steps: list[Step]) -> list[Delta]:
    """Send each step alone, wait for its answer, and read how both counters moved."""
    out = []
    async with aiohttp.ClientSession() as http:
        for step in steps:
            before = await counters(http, api)
            chat_step = "messages" in step.body
            path = "/v1/chat/completions" if chat_step else "/v1/completions"
            body = {**step.body, "model": real_vllm.MODEL_NAME, "temperature": 0}
            async with http.post(api + path, json=body) as r:
                answer = await r.json()
                assert r.status == 200, answer
            # vLLM's API server counts the request when its output comes back: poll briefly.
            after = before
            deadline = time.monotonic() + 10
            while after[0] == before[0] and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
                after = await counters(http, api)
            prompt_tokens = int(answer["usage"]["prompt_tokens"])
            out.append(Delta(after[0] - before[0], after[1] - before[1], prompt_tokens))
    return out


def table(sequence: list[Step], vllm: list[Delta], sim: list[Delta]) -> str:
    rows = [f"{'step':<45} {'vLLM q/h':>12} {'sim q/h':>12}"]
    for step, v, s in zip(sequence, vllm, sim, strict=True):
        rows.append(f"{step.name:<45} {v.queries:>6}/{v.hits:<5} {s.queries:>6}/{s.hits:<5}")
    return "\n".join(rows)


@pytest.fixture(scope="module")
def engine(
    vllm_dir: Path, model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Engine]:
    model = model_dir
    # No deep probes: their one-token completions would count as prefix-cache queries too.
    e = real_vllm.start(
        vllm_dir,
        model,
        tmp_path_factory.mktemp("vllm-prefix"),
        engine_args=ENGINE_ARGS,
        env={"LLMOP_DEEP_PROBE_ENABLED": "false"},
    )
    try:
        took = asyncio.run(real_vllm.wait_ready(e, START_TIMEOUT))
        MEASURED["prefix-cache engine: start to ready"] = f"{took:.1f}s"
        yield e
    finally:
        e.stop()


@pytest.fixture
def simulator(tmp_path: Path) -> Iterator[Replica]:
    sim = Replica.start(
        tmp_path,
        with_agent=False,
        model=real_vllm.MODEL_NAME,
        engine_args=[*ENGINE_ARGS, "--sim-load-seconds", "0"],
    )
    try:
        asyncio.run(sim.wait_ready(30))
        yield sim
    finally:
        sim.stop()


VLLM_HITS = [0, 640, 608, 320, 0, 0, 0, 0, 32, 0]
"""What vLLM 0.32's CPU build hits on the completion steps (measured): every full block of a
repeated prompt; one block less for a prompt of whole blocks (the last token's block is
recomputed); the shared full blocks of a diverging prompt (not the 10 shared tokens after them);
after the fillers, only the head of the first filler, and nothing of the first prompt."""
CHAT_OVERHEAD_PER_MESSAGE = 12
"""Template tokens a message that vLLM counts and the simulator does not: the tiny tokenizer
has no special tokens, so `<|system|>\\n` and `</s>\\n` cost several tokens each (measured:
vLLM 172, the simulator 154 for two messages of 146 tokens; 4 a message is the simulator's
estimate, closer to real models' templates)."""


@pytest.mark.timeout(420)
def test_prefix_cache_counters_match_vllm(engine: Engine, simulator: Replica) -> None:
    vllm = asyncio.run(run_steps(engine.api, STEPS))
    sim = asyncio.run(run_steps(simulator.api_url, STEPS))
    print("\n" + table(STEPS, vllm, sim))
    MEASURED["prefix cache, per step (queries/hits)"] = "\n" + table(STEPS, vllm, sim)
    exact = [(step, v, s) for step, v, s in zip(STEPS, vllm, sim, strict=True) if step.exact]
    # The scenario does what it says on vLLM (a cold start, repeats, a divergence, evictions).
    assert [v.hits for _, v, _ in exact] == VLLM_HITS, table(STEPS, vllm, sim)
    for step, v, s in exact:
        # The premise: one token a word in vLLM, four characters a token in the simulator.
        assert v.prompt_tokens == s.prompt_tokens == len(step.body["prompt"]) // 4, step.name
        assert (v.queries, v.hits) == (s.queries, s.hits), (step.name, v, s)
    for step, v, s in zip(STEPS, vllm, sim, strict=True):
        if not step.exact:
            messages = len(step.body["messages"])
            assert 0 <= v.queries - s.queries <= CHAT_OVERHEAD_PER_MESSAGE * messages, step.name
            assert abs(v.hits - s.hits) <= BLOCK, (step.name, v, s)
    # The second chat shares its system prompt (3 blocks and more): both hit some of it.
    assert min(vllm[-1].hits, sim[-1].hits) >= BLOCK, (vllm[-1], sim[-1])
