"""LoRA adapters in-process: the simulator's runtime LoRA API (vLLM 0.32's answers, as measured
in shared/reference/lora-and-scale-to-zero.md rows 3a-4b), and the agent's adapter loader
and readiness gate with that simulator as its engine (real HTTP on localhost, no processes)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from llmop_engine import adapter_rules, health
from llmop_engine.adapter_loader import AdapterLoader
from llmop_engine.agent import Agent
from llmop_engine.contract import LORA_RUNTIME_ENV, AgentSettings
from llmop_engine.download import fetch_snapshot
from llmop_engine.engine_client import EngineClient
from llmop_engine.health import Observation, ProbeResult, Reach
from llmop_engine.simulator.server import SimServer
from llmop_engine.simulator.sim_config import SimConfig, parse
from support.hub_standin import HubRepo, HubStandin

MODEL = "sim-model"
CFG = SimConfig(
    model=MODEL,
    enable_lora=True,
    max_lora_rank=16,
    decode_ms=1.0,
    decode_ms_per_seq=0.0,
    crash_exit_delay_seconds=0.05,
)
RANK_64 = (
    "Call to add_lora method failed: Worker failed with error 'LoRA rank 64 is greater than "
    "max_lora_rank 16.', please check the stack trace above for the root cause"
)


def adapter(root: Path, name: str, r: int = 8) -> str:
    """An adapter folder as PEFT writes it (only the config matters to the simulator)."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "peft_type": "LORA",
        "base_model_name_or_path": MODEL,
        "r": r,
        "lora_alpha": 16,
        "target_modules": ["q_proj", "v_proj"],
        "bias": "none",
    }
    (folder / "adapter_config.json").write_text(json.dumps(config))
    (folder / "adapter_model.safetensors").write_bytes(b"\0" * 64)
    return str(folder)


@pytest.fixture
def runtime_updates(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LORA_RUNTIME_ENV, "True")


@contextlib.asynccontextmanager
async def simulator(cfg: SimConfig = CFG) -> AsyncIterator[tuple[SimServer, TestServer]]:
    server = SimServer(cfg)
    engine = asyncio.create_task(server.engine.run())
    site = TestServer(server.app())
    await site.start_server()
    try:
        yield server, site
    finally:
        await site.close()
        server.engine.stop()
        engine.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await engine


class Api:
    def __init__(self, http: aiohttp.ClientSession, site: TestServer) -> None:
        self.http, self.base = http, str(site.make_url("")).rstrip("/")

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        async with self.http.post(self.base + path, json=body) as r:
            text = await r.text()
            is_json = r.content_type == "application/json"
            return r.status, json.loads(text) if is_json else text

    async def models(self) -> dict[str, dict[str, Any]]:
        async with self.http.get(self.base + "/v1/models") as r:
            return {m["id"]: m for m in (await r.json())["data"]}

    async def complete(self, model: str) -> tuple[int, Any]:
        return await self.post("/v1/completions", {"model": model, "prompt": "hi", "max_tokens": 6})

    async def load(self, name: str, path: str, **extra: object) -> tuple[int, Any]:
        return await self.post(
            "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path, **extra}
        )

    async def unload(self, name: str) -> tuple[int, Any]:
        return await self.post("/v1/unload_lora_adapter", {"lora_name": name})


def scenario(cfg: SimConfig, body: Callable[[SimServer, Api], Any]) -> None:
    async def run() -> None:
        async with simulator(cfg) as (server, site), aiohttp.ClientSession() as http:
            await body(server, Api(http, site))

    asyncio.run(run())


def error(status: int, message: str, kind: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


# --- the simulator's LoRA API -------------------------------------------------------------------


def test_load_serve_and_unload_like_vllm(runtime_updates: None, tmp_path: Path) -> None:
    a1, a2 = adapter(tmp_path, "a1"), adapter(tmp_path, "a2")

    async def body(server: SimServer, api: Api) -> None:
        assert await api.load("a1", a1) == (200, "Success: LoRA adapter 'a1' added successfully.")
        assert (await api.load("a2", a2))[0] == 200
        models = await api.models()
        assert list(models) == [MODEL, "a1", "a2"]
        assert models[MODEL]["parent"] is None
        assert {k: models["a1"][k] for k in ("object", "root", "parent")} == {
            "object": "model",
            "root": a1,
            "parent": MODEL,
        }
        # An adapter generates its own text, the same every time, and the base is unchanged.
        texts: dict[str, str] = {}
        for name in (MODEL, "a1", "a2", "a1", MODEL):
            status, answer = await api.complete(name)
            assert status == 200
            assert answer["model"] == name
            texts.setdefault(name, answer["choices"][0]["text"])
            assert texts[name] == answer["choices"][0]["text"]
        assert len(set(texts.values())) == 3

        assert await api.unload("a2") == (200, "Success: LoRA adapter 'a2' removed successfully.")
        assert list(await api.models()) == [MODEL, "a1"]
        assert await api.complete("a2") == (
            404,
            error(
                404,
                f"The model `a2` does not exist. Valid aliases: {MODEL}.",
                "NotFoundError",
                "model",
            ),
        )
        assert await api.unload("a2") == (
            404,
            error(404, "The lora adapter 'a2' cannot be found.", "NotFoundError"),
        )
        # Reloading under the same name serves again.
        assert (await api.load("a2", a2))[0] == 200
        assert (await api.complete("a2"))[0] == 200

    scenario(CFG, body)


def test_duplicate_missing_files_and_rank_are_refused_like_vllm(
    runtime_updates: None, tmp_path: Path
) -> None:
    a1, a2 = adapter(tmp_path, "a1"), adapter(tmp_path, "a2")
    big = adapter(tmp_path, "big", r=64)

    async def body(server: SimServer, api: Api) -> None:
        assert (await api.load("a1", a1))[0] == 200
        assert await api.load("a1", a2) == (
            400,
            error(
                400,
                "The lora adapter 'a1' has already been loaded. If you want to load the adapter "
                "in place, set 'load_inplace' to True.",
                "InvalidUserInput",
            ),
        )
        # load_inplace swaps the files under the name.
        assert (await api.load("a1", a2, load_inplace=True))[0] == 200
        assert (await api.models())["a1"]["root"] == a2

        assert await api.load("nope", str(tmp_path / "nope")) == (
            404,
            error(404, "Loading lora nope failed: No adapter found for <path>", "NotFoundError"),
        )
        assert await api.load("big", big) == (500, error(500, RANK_64, "InternalServerError"))
        assert list(await api.models()) == [MODEL, "a1"]  # refused ones are not registered
        assert (await api.complete(MODEL))[0] == 200  # and the engine keeps serving
        assert (await api.complete("big"))[0] == 404
        status, _ = await api.post("/v1/load_lora_adapter", {"lora_name": "x"})
        assert status == 400

    scenario(CFG, body)


@pytest.mark.parametrize(
    ("env", "enable_lora"), [(None, True), ("0", True), ("True", False), ("yes", True)]
)
def test_the_routes_exist_only_with_enable_lora_and_runtime_updating(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, env: str | None, enable_lora: bool
) -> None:
    if env is None:
        monkeypatch.delenv(LORA_RUNTIME_ENV, raising=False)
    else:
        monkeypatch.setenv(LORA_RUNTIME_ENV, env)
    a1 = adapter(tmp_path, "a1")

    async def body(server: SimServer, api: Api) -> None:
        assert await api.load("a1", a1) == (404, {"detail": "Not Found"})
        assert await api.unload("a1") == (404, {"detail": "Not Found"})

    scenario(SimConfig(model=MODEL, enable_lora=enable_lora), body)


def test_the_api_key_guards_load_and_unload(runtime_updates: None, tmp_path: Path) -> None:
    a1 = adapter(tmp_path, "a1")

    async def body(server: SimServer, api: Api) -> None:
        assert await api.load("a1", a1) == (401, {"error": "Unauthorized"})
        api.http.headers["Authorization"] = "Bearer sekret"
        assert (await api.load("a1", a1))[0] == 200

    scenario(SimConfig(model=MODEL, enable_lora=True, api_key="sekret"), body)


def test_a_request_for_an_adapter_whose_files_are_gone_kills_the_engine(
    runtime_updates: None, tmp_path: Path
) -> None:
    """vLLM 0.32 re-reads an evicted adapter from its path; gone files kill EngineCore and the
    API server exits (reference row 3b)."""
    a1 = adapter(tmp_path, "a1")

    async def body(server: SimServer, api: Api) -> None:
        assert (await api.load("a1", a1))[0] == 200
        (Path(a1) / "adapter_config.json").unlink()
        assert await api.complete("a1") == (
            500,
            error(
                500,
                "EngineCore encountered an issue. See stack trace (above) for the root cause.",
                "InternalServerError",
            ),
        )
        async with api.http.get(api.base + "/health") as r:
            assert r.status == 503
        await asyncio.wait_for(server.stop_event.wait(), 5)  # the server exits

    scenario(CFG, body)


def test_lora_flags_parse_like_vllm() -> None:
    plain = parse([MODEL])
    assert (plain.enable_lora, plain.max_loras, plain.max_cpu_loras, plain.max_lora_rank) == (
        False,
        1,
        1,
        16,
    )
    cfg = parse([MODEL, "--enable-lora", "--max-loras", "2", "--max-lora-rank", "64"])
    assert (cfg.enable_lora, cfg.max_loras, cfg.max_cpu_loras, cfg.max_lora_rank) == (
        True,
        2,
        2,
        64,
    )
    assert parse([MODEL, "--max-loras", "2", "--max-cpu-loras", "8"]).max_cpu_loras == 8
    for bad in (["--max-lora-rank", "12"], ["--max-loras", "4", "--max-cpu-loras", "2"]):
        with pytest.raises(SystemExit):
            parse([MODEL, *bad])


# --- the agent's loader against the simulator ----------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def write_desired(directory: Path, *entries: dict[str, object]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    full = [{"repo": None, "revision": None, "path": None} | e for e in entries]
    (directory / "adapters.json").write_text(json.dumps({"adapters": full}))


def loader_for(
    site: TestServer, tmp_path: Path, **kw: Any
) -> tuple[AdapterLoader, EngineClient, Clock]:
    settings = AgentSettings(
        adapters_dir=str(tmp_path / "cm"),
        adapter_store=str(tmp_path / "store"),
        adapter_ready_timeout_seconds=600,
    )
    client = EngineClient(site.port or 0, host="127.0.0.1")
    clock = Clock()
    return AdapterLoader(settings, client, clock=clock, **kw), client, clock


async def settle(loader: AdapterLoader, passes: int = 20) -> None:
    """Passes until nothing is fetching (fetches run on threads)."""
    for _ in range(passes):
        loader.read_desired()
        await loader.reconcile()
        if not any(s.phase == "Fetching" for s in loader.states.values()):
            return
        await asyncio.sleep(0.05)


def _opt(value: object) -> str | None:
    return None if value is None else str(value)


def phases(loader: AdapterLoader) -> dict[str, tuple[str, str | None]]:
    return {str(s["name"]): (str(s["phase"]), _opt(s["message"])) for s in loader.statuses()}


def test_the_loader_loads_refuses_reloads_and_unloads(
    runtime_updates: None, tmp_path: Path
) -> None:
    cm = tmp_path / "cm"
    a1, big = adapter(tmp_path / "pvc", "a1"), adapter(tmp_path / "pvc", "big", r=64)
    hub_copy = adapter(tmp_path / "hubfiles", "snap")
    fetched: list[tuple[str, str | None]] = []

    def fake_fetch(repo: str, revision: str | None, store: Path) -> Path:
        fetched.append((repo, revision))
        return Path(hub_copy)

    write_desired(
        cm,
        {"name": "a1", "path": a1},
        {"name": "big", "path": big},
        {"name": "sql", "repo": "org/sql", "revision": "abc"},
    )

    async def run() -> None:
        async with simulator() as (server, site):
            site_loader, client, _ = loader_for(site, tmp_path, fetch=fake_fetch)
            try:
                await scenario_body(server, site_loader)
            finally:
                await client.close()

    async def scenario_body(server: SimServer, site_loader: AdapterLoader) -> None:
        assert site_loader.gate_reason(ever_ready=False, healthy_since=None) is not None
        await settle(site_loader)
        assert phases(site_loader) == {
            "a1": ("Loaded", None),
            "big": ("Failed", RANK_64),
            "sql": ("Loaded", None),
        }
        assert fetched == [("org/sql", "abc")]
        assert [s["rank"] for s in site_loader.statuses()] == [8, 64, 8]
        assert site_loader.loaded() == {"a1": True, "big": False, "sql": True}
        assert site_loader.gate_reason(ever_ready=False, healthy_since=0.0) is None
        assert set(server.lora.adapters) == {"a1", "sql"}
        assert server.lora.adapters["sql"].path == hub_copy

        # The engine lost them (an engine restart): the next pass loads them again.
        server.lora.adapters.clear()
        await site_loader.reconcile()
        assert set(server.lora.adapters) == {"a1", "sql"}
        assert phases(site_loader)["a1"] == ("Loaded", None)
        assert fetched == [("org/sql", "abc")]  # the files were there: no new fetch

        # An invalid file changes nothing; removing an entry unloads it.
        (cm / "adapters.json").write_text('{"adapters": [')
        await settle(site_loader)
        assert set(server.lora.adapters) == {"a1", "sql"}
        write_desired(cm, {"name": "sql", "repo": "org/sql", "revision": "abc"})
        await settle(site_loader)
        assert set(server.lora.adapters) == {"sql"}
        assert list(phases(site_loader)) == ["sql"]

    asyncio.run(run())


def test_the_loader_backs_off_on_transient_failures(runtime_updates: None, tmp_path: Path) -> None:
    hub_copy = adapter(tmp_path / "hubfiles", "snap")
    outcomes: list[Exception | None] = [ConnectionError("hub unreachable"), None]

    def flaky_fetch(repo: str, revision: str | None, store: Path) -> Path:
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome
        return Path(hub_copy)

    write_desired(tmp_path / "cm", {"name": "sql", "repo": "org/sql", "revision": "abc"})

    async def run() -> None:
        async with simulator() as (server, site):
            loader, client, clock = loader_for(site, tmp_path, fetch=flaky_fetch)
            try:
                await settle(loader)
                state = loader.states["sql"]
                assert (state.phase, state.retry_at) == ("Pending", clock.now + 1)
                assert state.message is not None
                assert "hub unreachable" in state.message
                assert loader.gate_reason(ever_ready=False, healthy_since=clock.now) == (
                    "loading adapters: sql"
                )
                await settle(loader)  # before the backoff ran out: no new try
                assert outcomes == [None]
                clock.now += 1
                await settle(loader)
                await settle(loader)
                assert loader.states["sql"].phase == "Loaded"
                assert "sql" in server.lora.adapters
            finally:
                await client.close()

    asyncio.run(run())


def test_the_loader_fetches_from_the_hub_into_the_store(
    runtime_updates: None, tmp_path: Path
) -> None:
    """The real fetch (`download.fetch_snapshot`, huggingface_hub's cache) against the hub
    stand-in; an unknown repo fails for good."""
    files = Path(adapter(tmp_path / "repo", "sql-lora"))
    repo = HubRepo("org/sql-lora", files)
    store = tmp_path / "store"

    with HubStandin([repo]) as hub:

        def fetch(repo_id: str, revision: str | None, into: Path) -> Path:
            return fetch_snapshot(repo_id, revision, into, endpoint=hub.url, token=None)

        write_desired(
            tmp_path / "cm",
            {"name": "sql", "repo": "org/sql-lora", "revision": repo.sha},
            {"name": "gone", "repo": "org/missing", "revision": "main"},
        )

        async def run() -> None:
            async with simulator() as (server, site):
                loader, client, _ = loader_for(site, tmp_path, fetch=fetch)
                try:
                    await settle(loader, passes=100)
                    await settle(loader)
                finally:
                    await client.close()
                snapshot = store / "models--org--sql-lora" / "snapshots" / repo.sha
                assert server.lora.adapters["sql"].path == str(snapshot)
                assert (snapshot / "adapter_config.json").is_file()
                sql, gone = loader.statuses()
                assert (sql["phase"], sql["rank"], sql["revision"]) == ("Loaded", 8, repo.sha)
                assert gone["phase"] == "Failed"
                assert "RepositoryNotFoundError" in str(gone["message"])

        asyncio.run(run())


# --- the agent's readiness gate ---------------------------------------------------------------


def test_the_agent_is_not_ready_before_its_adapters_and_stays_ready_after(
    tmp_path: Path,
) -> None:
    write_desired(tmp_path / "cm", {"name": "a1", "path": "/mnt/a1"})
    agent = Agent(
        AgentSettings(adapters_dir=str(tmp_path / "cm"), adapter_store=str(tmp_path / "store"))
    )
    loader = agent.adapters
    assert loader is not None
    now = time.monotonic()
    agent.state = health.observe(
        agent.state, Observation(now=now, process_alive=True, reach=Reach.OK)
    )
    agent.state = health.record_probe(agent.state, ProbeResult(now, now + 0.01, True))

    v = agent.verdict()
    assert (v.ready, v.reason) == (False, "reading the desired adapters")
    loader.read_desired()
    v = agent.verdict()
    assert (v.phase.value, v.ready, v.reason) == ("loading", False, "loading adapters: a1")
    assert agent.status()["adapters"] == [
        {"name": "a1", "phase": "Pending", "message": None, "revision": None, "rank": None}
    ]
    loader.states["a1"] = adapter_rules.loaded(loader.states["a1"])
    assert agent.verdict().ready
    assert 'llmop_engine_adapter_loaded{adapter="a1"} 1.0' in agent.metrics_text().decode()

    # Ready once: a new adapter that is still loading does not take the pod out.
    write_desired(tmp_path / "cm", {"name": "a1", "path": "/mnt/a1"}, {"name": "a2", "path": "/p"})
    loader.read_desired()
    assert agent.verdict().ready
    text = agent.metrics_text().decode()
    assert 'llmop_engine_adapter_loaded{adapter="a2"} 0.0' in text


def test_without_adapters_dir_the_agent_has_no_adapters() -> None:
    agent = Agent(AgentSettings())
    assert agent.adapters is None
    assert "adapters" not in agent.status()
    assert "adapter=" not in agent.metrics_text().decode()
