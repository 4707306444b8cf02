"""LoRA adapters on the real engine: the agent's loader (`adapter_loader`) in front of vLLM's CPU
build serving the tiny model, with random adapters written at test time (`support.lora_adapter`).

Two engine starts (each ~30 s with `--enable-lora` on CPU), one scenario whose tests run in file
order and each go on from where the previous one left the engine:

1. start with `adapters.json` = {a1 (r=8), nope (its folder does not exist)}: a1 is in
   `/v1/models`, with the served name as its parent, before the agent's `/readyz` first answers
   200 (both polled from the agent's start); nope ends Failed without holding readiness back;
2. greedy output for `model=a1` differs from the base's, and is the same on every call;
3. `big` (r=64 > `--max-lora-rank 16`) added to the file of a ready pod ends Failed with vLLM's
   message, as nope did with its own, while `/readyz` stays 200 and the base and a1 keep serving;
4. EngineCore killed (kill -9): the agent exits non-zero; a new agent on the same directories
   (what a container restart does) has a1 back in `/v1/models` before `/readyz` is 200, serving
   the same output as before;
5. a2 added to the file loads in a ready pod; a1 removed from it is unloaded (`/v1/models` drops
   it, requests for it get 404) and its files stay as they were.

Measured numbers (start times, load times, decode times) go to the terminal summary
(tests/engine/conftest.py) and, with `-s`, to the output as they are taken.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import signal
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from engine import real_vllm
from engine.real_vllm import MEASURED, Engine, http_get
from llmop_engine import contract
from support import lora_adapter

pytestmark = [pytest.mark.vllm, pytest.mark.engine]

BASE = real_vllm.MODEL_NAME
LORA_ARGS = [
    contract.EngineFlag.ENABLE_LORA,
    contract.EngineFlag.MAX_LORAS, "2",
    contract.EngineFlag.MAX_CPU_LORAS, "2",
    contract.EngineFlag.MAX_LORA_RANK, "16",
]  # fmt: skip
START_TIMEOUT = 300.0
POLL = 0.2
"""The test's own polling step: well below the agent's (1 s) so the order of events shows."""
GREEDY_TOKENS = 16
DECODE_TOKENS = 64
DECODE_RUNS = 3
PROMPT = "def main():"


def say(key: str, value: str) -> None:
    MEASURED[key] = value
    print(f"\n[lora] {key}: {value}")


@dataclass
class StartOrder:
    """One agent start as the test saw it: seconds from the agent's launch."""

    listening: float | None = None
    """vLLM's `/v1/models` first answered 200."""
    listed: float | None = None
    """The adapter first appeared there."""
    ready: float | None = None
    """The agent's `/readyz` first answered 200."""
    listed_poll: int | None = None
    ready_poll: int | None = None
    """Poll rounds: `/v1/models` is read before `/readyz` in each, so listed_poll <= ready_poll
    means the adapter was listed before readiness was first granted."""
    not_ready_codes: list[int] = field(default_factory=list)
    """`/readyz` answers between vLLM's first `/v1/models` and the first 200."""


@dataclass
class Lora:
    """The scenario's engines, directories and what earlier steps saw."""

    vllm_dir: Path
    model_dir: Path
    tmp: Path
    a1: Path
    a2: Path
    big: Path
    missing: Path
    engines: list[Engine] = field(default_factory=list)
    outputs: dict[str, str] = field(default_factory=dict)

    @property
    def cm(self) -> Path:
        return self.tmp / "cm"

    @property
    def store(self) -> Path:
        return self.tmp / "store"

    @property
    def engine(self) -> Engine:
        return self.engines[-1]

    def publish(self, **paths: Path) -> None:
        """Replace `adapters.json` in one step, as the kubelet's symlink swap does."""
        self.cm.mkdir(parents=True, exist_ok=True)
        entries = [
            {contract.AdapterKey.NAME: name, contract.AdapterKey.REPO: None,
             contract.AdapterKey.REVISION: None, contract.AdapterKey.PATH: str(path)}
            for name, path in paths.items()
        ]  # fmt: skip
        tmp = self.cm / ".adapters.json.tmp"
        tmp.write_text(json.dumps({"adapters": entries}))
        tmp.replace(self.cm / contract.ADAPTERS_FILE)

    def start(self, adapter: str) -> StartOrder:
        """A new agent (and vLLM) on the same directories; returns what it did when."""
        launched = time.monotonic()
        e = real_vllm.start(
            self.vllm_dir,
            self.model_dir,
            self.tmp / "logs",
            engine_args=LORA_ARGS,
            env={
                contract.LORA_RUNTIME_ENV: "True",
                "LLMOP_ADAPTERS_DIR": str(self.cm),
                "LLMOP_ADAPTER_STORE": str(self.store),
            },
        )
        self.engines.append(e)
        return asyncio.run(start_order(e, adapter, launched))

    def stop(self) -> None:
        for e in self.engines:
            if e.proc.poll() is None:
                e.stop()
            else:
                # Exited and reaped (the crashed one): its PID may be another process's by now,
                # so nothing is signalled; vLLM's processes died with it (PDEATHSIG).
                e._stop_sampler.set()
                e._log.close()


async def start_order(e: Engine, adapter: str, launched: float) -> StartOrder:
    order = StartOrder()
    poll = 0
    async with aiohttp.ClientSession() as http:
        while time.monotonic() - launched < START_TIMEOUT:
            if e.proc.poll() is not None:
                raise RuntimeError(f"agent exited during start: {e.log_tail()}")
            poll += 1
            code, body = await http_get(http, e.api + "/v1/models")
            now = time.monotonic() - launched
            if code == 200:
                order.listening = order.listening or now
                if order.listed is None and adapter in {m["id"] for m in json.loads(body)["data"]}:
                    order.listed, order.listed_poll = now, poll
            ready, _ = await http_get(http, e.probes + "/readyz")
            if ready == 200:
                order.ready, order.ready_poll = time.monotonic() - launched, poll
                return order
            if order.listening is not None:
                order.not_ready_codes.append(ready)
            await asyncio.sleep(POLL)
    raise TimeoutError(f"not ready after {START_TIMEOUT:.0f}s: {e.log_tail()}")


async def get_json(http: aiohttp.ClientSession, url: str, e: Engine) -> Any:
    async with http.get(url, headers=e.headers(), timeout=aiohttp.ClientTimeout(total=10)) as r:
        assert r.status == 200, (url, r.status, await r.text())
        return await r.json(content_type=None)


async def models(http: aiohttp.ClientSession, e: Engine) -> dict[str, dict[str, Any]]:
    """`/v1/models` by id."""
    return {m["id"]: m for m in (await get_json(http, e.api + "/v1/models", e))["data"]}


async def adapter_status(http: aiohttp.ClientSession, e: Engine) -> dict[str, dict[str, Any]]:
    """The agent's `/status` `adapters` list by name."""
    body = await get_json(http, e.probes + "/status", e)
    return {a[contract.AdapterStatusKey.NAME]: a for a in body["adapters"]}


@dataclass(frozen=True)
class Completion:
    status: int
    text: str
    """The completion's text, or the error message."""
    seconds: float
    tokens: int


async def complete(
    http: aiohttp.ClientSession, e: Engine, model: str, tokens: int = GREEDY_TOKENS
) -> Completion:
    """A greedy completion of `tokens` tokens (EOS ignored: a random model emits it anywhere)."""
    payload = {
        "model": model,
        "prompt": PROMPT,
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    started = time.monotonic()
    async with http.post(
        e.api + "/v1/completions",
        json=payload,
        headers=e.headers(),
        timeout=aiohttp.ClientTimeout(total=120),
    ) as r:
        body = await r.json(content_type=None)
        took = time.monotonic() - started
        if r.status != 200:
            return Completion(r.status, str(body.get("error", {}).get("message")), took, 0)
        usage = body.get("usage") or {}
        text = body["choices"][0]["text"]
        return Completion(200, text, took, int(usage.get("completion_tokens") or 0))


async def wait_until(
    http: aiohttp.ClientSession,
    e: Engine,
    done: Callable[[aiohttp.ClientSession], Awaitable[bool]],
    timeout: float,
    what: str,
) -> tuple[float, list[int]]:
    """Poll `done(http)` (an async predicate) and `/readyz` until it holds: (seconds, every
    `/readyz` answer on the way)."""
    started = time.monotonic()
    readyz: list[int] = []
    while time.monotonic() - started < timeout:
        if await done(http):
            return time.monotonic() - started, readyz
        readyz.append((await http_get(http, e.probes + "/readyz"))[0])
        await asyncio.sleep(POLL)
    raise TimeoutError(f"{what}: not within {timeout:.0f}s: {e.log_tail()}")


_PHASE_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*adapter (\S+) \[[^\]]*\]: (Loading|Loaded)\b"
)


def load_seconds(log: str, name: str) -> list[float]:
    """From the agent's log: Loading → Loaded of `name`, each time (vLLM's load call)."""
    out: list[float] = []
    loading: datetime | None = None
    for line in log.splitlines():
        m = _PHASE_LINE.match(line)
        if not m or m.group(2) != name:
            continue
        at = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
        if m.group(3) == "Loading":
            loading = at
        elif loading is not None:
            out.append((at - loading).total_seconds())
            loading = None
    return out


def digest(folder: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.iterdir())
        if p.is_file()
    }


@pytest.fixture(scope="module")
def lora(
    vllm_dir: Path, model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Lora]:
    tmp = tmp_path_factory.mktemp("lora")
    python = str(vllm_dir / "bin" / "python")
    started = time.monotonic()
    pvc = tmp / "pvc"
    state = Lora(vllm_dir, model_dir, tmp, pvc / "a1", pvc / "a2", pvc / "big", pvc / "nope")
    lora_adapter.write(python, model_dir, {state.a1: (8, 1), state.a2: (8, 2), state.big: (64, 3)})
    say("random adapters (3) written", f"{time.monotonic() - started:.1f}s")
    state.publish(a1=state.a1, nope=state.missing)
    try:
        yield state
    finally:
        state.stop()


def check_start(order: StartOrder, e: Engine, label: str) -> None:
    say(
        f"{label}: vLLM listening / a1 listed / agent ready (s after launch)",
        f"{order.listening:.1f} / {order.listed:.1f} / {order.ready:.1f}"
        if order.listening and order.listed and order.ready
        else str(order),
    )
    print(f"[lora] {label}: /readyz while vLLM listened, before ready: {order.not_ready_codes}")
    assert order.listed_poll is not None, (order, e.log_tail())
    assert order.ready_poll is not None
    assert order.listed_poll <= order.ready_poll, order
    loads = load_seconds(e.log_tail(10**7), "a1")
    assert loads, e.log_tail()
    say(f"{label}: a1 load (agent log, Loading to Loaded)", f"{loads[-1] * 1000:.0f} ms")


@pytest.mark.timeout(420)  # the engine's start included
def test_adapter_is_listed_before_the_first_ready(lora: Lora) -> None:
    order = lora.start("a1")
    e = lora.engine
    check_start(order, e, "start 1 (--enable-lora)")

    async def scenario() -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
        async with aiohttp.ClientSession() as http:
            return await models(http, e), await adapter_status(http, e)

    listed, statuses = asyncio.run(scenario())
    assert listed["a1"]["parent"] == BASE, listed
    assert listed["a1"]["root"] == str(lora.a1), listed
    assert "nope" not in listed
    assert statuses["a1"]["phase"] == "Loaded", statuses
    assert statuses["a1"]["rank"] == 8
    # A missing folder is vLLM's 404, final: it is Failed, and did not hold readiness back.
    assert statuses["nope"]["phase"] == "Failed", statuses
    assert "No adapter found" in str(statuses["nope"]["message"]), statuses


@pytest.mark.timeout(180)
def test_adapter_changes_greedy_output(lora: Lora) -> None:
    e = lora.engine

    async def scenario() -> tuple[list[Completion], dict[str, list[Completion]]]:
        async with aiohttp.ClientSession() as http:
            greedy = [await complete(http, e, m) for m in (BASE, "a1", BASE, "a1")]
            decode = {
                m: [await complete(http, e, m, DECODE_TOKENS) for _ in range(DECODE_RUNS)]
                for m in (BASE, "a1")
            }
            return greedy, decode

    greedy, decode = asyncio.run(scenario())
    base, a1, base_again, a1_again = greedy
    print(f"\n[lora] greedy {GREEDY_TOKENS} tokens: base {base.text!r}, a1 {a1.text!r}")
    assert all(c.status == 200 and c.tokens == GREEDY_TOKENS for c in greedy), greedy
    assert a1.text != base.text
    # The same each time: the difference is the adapter's, not noise.
    assert (base_again.text, a1_again.text) == (base.text, a1.text), greedy
    lora.outputs = {BASE: base.text, "a1": a1.text}
    for model, runs in decode.items():
        assert all(c.status == 200 and c.tokens == DECODE_TOKENS for c in runs), runs
        seconds = [c.seconds for c in runs]
        say(
            f"decode {DECODE_TOKENS} tokens, --enable-lora, model {model} (median of "
            f"{DECODE_RUNS})",
            f"{statistics.median(seconds):.2f}s ({', '.join(f'{s:.2f}' for s in seconds)})",
        )


@pytest.mark.timeout(180)
def test_refused_adapters_fail_and_the_base_keeps_serving(lora: Lora) -> None:
    e = lora.engine
    written = time.monotonic()
    lora.publish(a1=lora.a1, nope=lora.missing, big=lora.big)

    async def big_settled(http: aiohttp.ClientSession) -> bool:
        return (await adapter_status(http, e)).get("big", {}).get("phase") == "Failed"

    async def scenario() -> tuple[
        tuple[float, list[int]], dict[str, dict[str, Any]], dict[str, Completion], int, str
    ]:
        async with aiohttp.ClientSession() as http:
            waited = await wait_until(http, e, big_settled, 60, "big Failed")
            statuses = await adapter_status(http, e)
            served = {m: await complete(http, e, m) for m in (BASE, "a1", "big", "nope")}
            readyz, _ = await http_get(http, e.probes + "/readyz")
            _, metrics = await http_get(http, e.probes + "/metrics")
            return waited, statuses, served, readyz, metrics

    (took, readyz_seen), statuses, served, readyz, metrics = asyncio.run(scenario())
    say("big (r=64) written to Failed", f"{time.monotonic() - written:.1f}s (seen {took:.1f}s)")
    print(f"\n[lora] refused: nope {statuses['nope']}, big {statuses['big']}")
    assert statuses["big"]["phase"] == "Failed", statuses
    assert statuses["big"]["rank"] == 64
    assert "LoRA rank 64 is greater than max_lora_rank 16" in str(statuses["big"]["message"])
    assert statuses["nope"]["phase"] == "Failed"
    assert "No adapter found" in str(statuses["nope"]["message"])
    assert statuses["a1"]["phase"] == "Loaded"
    # The engine survived both refusals: readiness never dropped, base and a1 serve as before.
    assert set(readyz_seen) <= {200}, readyz_seen
    assert readyz == 200
    assert (served[BASE].status, served["a1"].status) == (200, 200), served
    if lora.outputs:
        assert served[BASE].text == lora.outputs[BASE]
        assert served["a1"].text == lora.outputs["a1"]
    # Neither was registered: vLLM does not know the names.
    assert (served["big"].status, served["nope"].status) == (404, 404), served
    loaded = {
        line.split('adapter="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith(contract.ADAPTER_LOADED_METRIC + "{")
    }
    assert loaded == {"a1": 1.0, "nope": 0.0, "big": 0.0}, loaded


@pytest.mark.timeout(420)  # the second start included
def test_engine_crash_then_restart_loads_adapter_before_ready(lora: Lora) -> None:
    e = lora.engine

    async def engine_pid() -> int:
        async with aiohttp.ClientSession() as http:
            return int((await get_json(http, e.probes + "/status", e))["enginePid"])

    vllm = asyncio.run(engine_pid())
    cores = [p for p in real_vllm.descendants(vllm) if "EngineCore" in real_vllm.cmdline(p)]
    assert len(cores) == 1, [real_vllm.cmdline(p) for p in e.tree()]
    os.kill(cores[0], signal.SIGKILL)
    killed = time.monotonic()
    code = e.wait_exit(90)
    say("EngineCore SIGKILL: agent exit code / after", f"{code} / {time.monotonic() - killed:.1f}s")
    assert code not in (0, None), e.log_tail()

    order = lora.start("a1")
    e = lora.engine
    check_start(order, e, "start 2 (same directories)")

    async def scenario() -> tuple[dict[str, dict[str, Any]], dict[str, Completion]]:
        async with aiohttp.ClientSession() as http:
            statuses = await adapter_status(http, e)
            return statuses, {m: await complete(http, e, m) for m in (BASE, "a1")}

    statuses, served = asyncio.run(scenario())
    assert {n: s["phase"] for n, s in statuses.items()} == {
        "a1": "Loaded",
        "nope": "Failed",
        "big": "Failed",
    }, statuses
    assert served["a1"].status == 200, served
    if lora.outputs:  # the same files, the same weights, the same greedy output
        assert served["a1"].text == lora.outputs["a1"], served
        assert served[BASE].text == lora.outputs[BASE], served


@pytest.mark.timeout(180)
def test_added_adapter_loads_and_removed_one_is_unloaded_files_kept(lora: Lora) -> None:
    e = lora.engine
    a1_files = digest(lora.a1)

    async def a2_loaded(http: aiohttp.ClientSession) -> bool:
        listed = "a2" in await models(http, e)
        return listed and (await adapter_status(http, e))["a2"]["phase"] == "Loaded"

    async def a1_gone(http: aiohttp.ClientSession) -> bool:
        return "a1" not in await models(http, e)

    async def scenario() -> tuple[
        float, list[int], float, list[int], dict[str, Completion], dict[str, dict[str, Any]]
    ]:
        async with aiohttp.ClientSession() as http:
            lora.publish(a1=lora.a1, nope=lora.missing, big=lora.big, a2=lora.a2)
            add, add_readyz = await wait_until(http, e, a2_loaded, 60, "a2 Loaded")
            lora.publish(nope=lora.missing, big=lora.big, a2=lora.a2)
            remove, remove_readyz = await wait_until(http, e, a1_gone, 60, "a1 unloaded")
            served = {m: await complete(http, e, m) for m in (BASE, "a1", "a2")}
            return add, add_readyz, remove, remove_readyz, served, await adapter_status(http, e)

    add, add_readyz, remove, remove_readyz, served, statuses = asyncio.run(scenario())
    say("a2 added to a ready pod: file written to Loaded", f"{add:.1f}s")
    loads = load_seconds(e.log_tail(10**7), "a2")
    assert loads, e.log_tail()
    say("a2 load (agent log, Loading to Loaded)", f"{loads[-1] * 1000:.0f} ms")
    say("a1 removed: file written to gone from /v1/models", f"{remove:.1f}s")
    assert set(add_readyz + remove_readyz) <= {200}, (add_readyz, remove_readyz)
    assert (served[BASE].status, served["a2"].status) == (200, 200), served
    assert served["a2"].text != served[BASE].text
    assert served["a1"].status == 404, served
    assert "does not exist" in served["a1"].text, served
    assert "a1" not in statuses
    assert "adapter a1: unloaded (no longer desired)" in e.log_tail(10**7)
    # A `path` adapter's files are never the agent's to delete.
    assert digest(lora.a1) == a1_files
