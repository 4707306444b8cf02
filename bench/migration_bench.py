"""Migration benchmark (`make bench-migration`): does a stream whose engine fails mid-answer
continue on another replica token for token, and what does the seam cost.

The rig, all in one process on loopback (tests/support/migration_rig.py, the rig of
tests/router/test_migration.py): three simulator replicas (vLLM's token-id protocol,
`return_token_ids`, token-id prompts, output that depends on the whole context, so a wrong seam
changes every later token) behind a real `llmop-router` with a static table, and streaming
clients. Each faulted stream names its fault with `X-Sim-Fault: KIND@ctx:N` at a random token:

- crash: the connection drops mid-body (a process or node lost);
- hang: the engine goes silent with the connection open (the router's inactivity bound);
- cut: the engine ends the stream early with `finish_reason: "abort"` (a drain budget over);
- error: vLLM's in-band generation error event.

Every answer is compared with the unfaulted answer to the same request: text, token ids (when
the client asked for them), usage and finish reason, one `id` and one `[DONE]`, no error event.
The seam is the router's `llmop_router_migration_seam_seconds` (failure detected to the first
continued event); the client's stall is the longest gap between two events it read, which for a
hang includes the inactivity bound (set here to `--inactivity`, 30 s by default in the router).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The rig is test code (tests/support), shipped in no image.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from llmop_router.migration import Settings
from support.migration_rig import CHAT, COMPLETIONS, KEY, Answer, Rig, parse, rig

KINDS = ("crash", "hang", "cut", "error")
PROMPTS = (
    "the quick brown fox",
    "tell me about request migration between replicas",
    "a long answer about GPUs, queues and drains",
    "one two three four five six",
)
MAX_TOKENS = 48


def body(path: str, prompt: str, with_ids: bool) -> dict[str, Any]:
    common: dict[str, Any] = {
        "model": "llama",
        "max_tokens": MAX_TOKENS,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if with_ids:
        common["return_token_ids"] = True
    if path == CHAT:
        return {**common, "messages": [{"role": "user", "content": prompt}]}
    return {**common, "prompt": prompt}


class SeamRecorder:
    """Stands in for the router's seam histogram: keeps every observation, by trigger, and
    passes it on."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.values: dict[str, list[float]] = defaultdict(list)

    def labels(self, trigger: str) -> Any:
        child, values = self.inner.labels(trigger), self.values[trigger]

        class Child:
            def observe(self, value: float) -> None:
                values.append(value)
                child.observe(value)

        return Child()


@dataclass
class Outcome:
    path: str
    kind: str
    equal: bool
    why: str = ""
    stall: float = 0.0


@dataclass
class Run:
    outcomes: list[Outcome] = field(default_factory=list)
    seams: dict[str, list[float]] = field(default_factory=dict)
    migrations: float = 0.0
    seconds: float = 0.0


async def stream(
    r: Rig, path: str, payload: dict[str, Any], fault: str | None
) -> tuple[Answer, float]:
    """One streaming request: the parsed answer and the longest gap between its reads."""
    headers = {"Authorization": f"Bearer {KEY}"}
    if fault:
        headers["X-Sim-Fault"] = fault
    parts: list[bytes] = []
    stall = 0.0
    async with r.http.post(r.url + path, json=payload, headers=headers) as answer:
        assert answer.status == 200, await answer.text()
        last = time.perf_counter()
        async for chunk in answer.content.iter_any():
            now = time.perf_counter()
            if parts:
                stall = max(stall, now - last)
            last = now
            parts.append(chunk)
    return parse(b"".join(parts).decode()), stall


def compare(got: Answer, want: Answer, with_ids: bool) -> str:
    """Why `got` differs from the unfaulted `want` ("" when equal)."""
    checks = (
        (got.errors == [], f"error events {got.errors}"),
        (got.text == want.text, "text differs"),
        (not with_ids or got.ids == want.ids, "token ids differ"),
        (got.usage == want.usage, f"usage {got.usage} != {want.usage}"),
        (got.finish == want.finish, f"finish {got.finish} != {want.finish}"),
        (got.done == 1, f"{got.done} [DONE]"),
        (len(got.identities) == 1, "more than one identity"),
    )
    return next((why for ok, why in checks if not ok), "")


async def run(faults: int, concurrency: int, inactivity: float, seed: int) -> Run:
    settings = Settings(limit=2, inactivity_seconds=inactivity, unready_idle_seconds=0.3)
    shuffle = random.Random(seed)
    result = Run()
    async with rig(replicas=3, settings=settings, gateway=True) as r:
        recorder = SeamRecorder(r.router.metrics.migration_seam_seconds)
        r.router.metrics.migration_seam_seconds = recorder  # type: ignore[assignment]
        references: dict[tuple[str, str], tuple[Answer, int]] = {}
        for path in (COMPLETIONS, CHAT):
            for prompt in PROMPTS:
                want, _ = await stream(r, path, body(path, prompt, True), None)
                assert not want.errors, want
                assert len(want.ids) == MAX_TOKENS, want
                references[(path, prompt)] = (want, len(want.prompt_ids))
        gate = asyncio.Semaphore(concurrency)

        async def one(n: int) -> None:
            path = (COMPLETIONS, CHAT)[n % 2]
            kind = KINDS[(n // 2) % len(KINDS)]
            prompt = shuffle.choice(PROMPTS)
            with_ids = shuffle.random() < 0.5
            want, prompt_len = references[(path, prompt)]
            fault = f"{kind}@ctx:{prompt_len + shuffle.randrange(1, MAX_TOKENS)}"
            async with gate:
                got, stall = await stream(r, path, body(path, prompt, with_ids), fault)
            why = compare(got, want, with_ids)
            result.outcomes.append(Outcome(path, kind, not why, f"{fault}: {why}", stall))

        started = time.perf_counter()
        await asyncio.gather(*(one(n) for n in range(faults)))
        result.seconds = time.perf_counter() - started
        result.seams = dict(recorder.values)
        result.migrations = sum(
            r.metric("llmop_router_migrations_total", reason=reason, outcome="continued")
            for reason in ("reset", "idle", "abort", "error", "eof", "unready")
        )
    return result


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


TRIGGER = {"crash": "reset", "hang": "idle", "cut": "abort", "error": "error"}


def report(result: Run, inactivity: float) -> bool:
    outcomes = result.outcomes
    print(
        f"\nmigration bench: {len(outcomes)} faulted streams ({MAX_TOKENS} tokens each, a fault "
        f"at a random token), 3 simulator replicas, inactivity bound {inactivity:g} s, "
        f"{result.seconds:.1f} s\n"
    )
    print(
        "| path | fault | streams | equal to the unfaulted answer | client stall p50 ms "
        "| client stall p99 ms |"
    )
    print("|---|---|---|---|---|---|")
    for path in (COMPLETIONS, CHAT):
        for kind in KINDS:
            rows = [o for o in outcomes if o.path == path and o.kind == kind]
            stalls = [o.stall for o in rows]
            print(
                f"| {path} | {kind} | {len(rows)} | {sum(o.equal for o in rows)} | "
                f"{quantile(stalls, 0.5) * 1000:.1f} | {quantile(stalls, 0.99) * 1000:.1f} |"
            )
    print()
    print("| fault | seams | router seam p50 ms | p99 ms |")
    print("|---|---|---|---|")
    for kind in KINDS:
        seams = result.seams.get(TRIGGER[kind], [])
        print(
            f"| {kind} | {len(seams)} | {quantile(seams, 0.5) * 1000:.2f} | "
            f"{quantile(seams, 0.99) * 1000:.2f} |"
        )
    equal = sum(o.equal for o in outcomes)
    print(
        f"\n- {equal} of {len(outcomes)} faulted streams equal to the unfaulted answer "
        f"({100 * equal / max(1, len(outcomes)):.1f} %, goal 100 %); "
        f"{result.migrations:.0f} migrations counted by the router"
    )
    for outcome in [o for o in outcomes if not o.equal][:10]:
        print(f"  differs: {outcome.path} {outcome.why}")
    all_seams = [v for values in result.seams.values() for v in values]
    if all_seams:
        p50, p99 = statistics.median(all_seams) * 1000, quantile(all_seams, 0.99) * 1000
        print(
            f"- seam (failure detected to the first continued event) p50 {p50:.2f} ms, "
            f"p99 {p99:.2f} ms"
        )
    return equal == len(outcomes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--faults", type=int, default=504, help="faulted streams [504]")
    parser.add_argument("--concurrency", type=int, default=12)
    parser.add_argument("--inactivity", type=float, default=0.5, help="router bound, s [0.5]")
    parser.add_argument("--seed", type=int, default=51)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("llmop_engine").setLevel(logging.ERROR)
    result = asyncio.run(run(args.faults, args.concurrency, args.inactivity, args.seed))
    sys.exit(0 if report(result, args.inactivity) else 1)


if __name__ == "__main__":
    main()
