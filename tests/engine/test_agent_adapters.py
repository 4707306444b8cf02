"""LoRA adapters end to end on one replica: agent + simulator as real processes, a Hub adapter
fetched from the hub stand-in (with `HF_HUB_OFFLINE=1`, as engine pods with a model cache have)
and an adapter on a path; readiness waits for them; a changed file swaps them without taking
the pod out of readiness."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from engine.fleet import Fleet, http_status
from support.hub_standin import HubRepo, HubStandin

pytestmark = pytest.mark.engine

MODEL = "sim-model"
RATE = 64 * 1024  # bytes/s per file body: the Hub adapter's weights (3 chunks) take ~2 s


def adapter(folder: Path, r: int, weights: int = 64) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = {"peft_type": "LORA", "r": r, "target_modules": ["q_proj"], "bias": "none"}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    (folder / "adapter_model.safetensors").write_bytes(os.urandom(weights))
    return folder


def publish(cm: Path, *entries: dict[str, object]) -> None:
    """Replace the file in one step, as the kubelet's symlink swap does."""
    cm.mkdir(parents=True, exist_ok=True)
    full = [{"repo": None, "revision": None, "path": None} | e for e in entries]
    tmp = cm / ".adapters.json.tmp"
    tmp.write_text(json.dumps({"adapters": full}))
    tmp.replace(cm / "adapters.json")


@pytest.mark.timeout(60)
def test_adapters_load_before_ready_and_follow_the_file(fleet: Fleet, tmp_path: Path) -> None:
    hub_files = adapter(tmp_path / "hub" / "sql", r=8, weights=192 * 1024)
    repo = HubRepo("org/sql-lora", hub_files)
    a1 = adapter(tmp_path / "pvc" / "a1", r=16)
    a2 = adapter(tmp_path / "pvc" / "a2", r=8)
    big = adapter(tmp_path / "pvc" / "big", r=64)
    cm = tmp_path / "cm"
    publish(
        cm,
        {"name": "sql", "repo": repo.repo_id, "revision": repo.sha},
        {"name": "a1", "path": str(a1)},
        {"name": "big", "path": str(big)},
    )

    with HubStandin([repo], rate_bytes_per_s=RATE) as hub:
        r = fleet.start(
            ["--sim-load-seconds", "0.5", "--enable-lora", "--max-loras", "2"],
            LLMOP_ADAPTERS_DIR=str(cm),
            LLMOP_ADAPTER_STORE=str(tmp_path / "store"),
            VLLM_ALLOW_RUNTIME_LORA_UPDATING="True",
            HF_ENDPOINT=hub.url,
            HF_HUB_OFFLINE="1",
            HF_HUB_DISABLE_TELEMETRY="1",
        )

        async def scenario() -> None:
            async with aiohttp.ClientSession() as http:

                async def get(url: str) -> Any:
                    async with http.get(url) as resp:
                        return await resp.json()

                async def models() -> set[str]:
                    return {m["id"] for m in (await get(r.api_url + "/v1/models"))["data"]}

                reasons: list[str] = []
                started = time.monotonic()
                while time.monotonic() - started < 30:
                    await asyncio.sleep(0.1)
                    try:
                        async with http.get(r.probe_url + "/readyz") as resp:
                            body = await resp.json()
                    except aiohttp.ClientConnectionError:
                        continue  # the agent's probe server is not up yet
                    if resp.status == 200:
                        break
                    reasons.append(body["reason"])
                else:
                    pytest.fail(f"never ready: {reasons[-3:]} {r.log_tail()}")
                # The engine served before the slow Hub fetch ended; readiness waited for it.
                assert "loading adapters: sql" in reasons, reasons
                status = await get(r.probe_url + "/status")
                adapters = {a["name"]: a for a in status["adapters"]}
                assert {n: a["phase"] for n, a in adapters.items()} == {
                    "sql": "Loaded",
                    "a1": "Loaded",
                    "big": "Failed",
                }
                assert "LoRA rank 64 is greater than max_lora_rank 16" in adapters["big"]["message"]
                assert (adapters["sql"]["rank"], adapters["sql"]["revision"]) == (8, repo.sha)
                assert await models() == {MODEL, "sql", "a1"}
                async with http.post(
                    r.api_url + "/v1/completions",
                    json={"model": "sql", "prompt": "hi", "max_tokens": 4},
                ) as resp:
                    assert resp.status == 200
                async with http.get(r.probe_url + "/metrics") as resp:
                    metrics = await resp.text()
                assert 'llmop_engine_adapter_loaded{adapter="sql"} 1.0' in metrics
                assert 'llmop_engine_adapter_loaded{adapter="big"} 0.0' in metrics

                # A new file: a1 goes, a2 comes; the pod never leaves readiness meanwhile.
                publish(
                    cm,
                    {"name": "sql", "repo": repo.repo_id, "revision": repo.sha},
                    {"name": "a2", "path": str(a2)},
                )
                changed = time.monotonic()
                while await models() != {MODEL, "sql", "a2"}:
                    assert await http_status(http, r.probe_url + "/readyz") == 200
                    assert time.monotonic() - changed < 10, r.log_tail()
                    await asyncio.sleep(0.1)
                print(f"\nadapter change applied in {time.monotonic() - changed:.1f}s")
                status = await get(r.probe_url + "/status")
                assert [(a["name"], a["phase"]) for a in status["adapters"]] == [
                    ("sql", "Loaded"),
                    ("a2", "Loaded"),
                ]

        asyncio.run(scenario())
