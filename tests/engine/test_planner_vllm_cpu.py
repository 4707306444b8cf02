"""The CPU planner against real vLLM (CPU build): the tiny test model, small Mamba-1, Mamba-2
and gated-delta-net hybrids and small pure Mamba models (tests/support/hybrid_configs.py)
served with dummy weights under `--dtype auto`, `VLLM_CPU_KVCACHE_SPACE=1` and
`--max-model-len 512`: does the plan give the "CPU KV cache size: N tokens, Maximum
concurrency ...: Cx" that vLLM logs?

Seventeen vLLM starts take ~10 min on the project's 2-core machine, so this is opt-in
(`LLMOP_VLLM_PLANNER=1 pytest tests/engine/test_planner_vllm_cpu.py`); the figures it checks
are kept as a unit test (tests/unit/test_planner_hybrids.py), which runs in `make test`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from engine import real_vllm
from llmop.planner.cpu import REASON_CPU_UNSUPPORTED, CpuPlanRequest, plan_cpu_capacity
from llmop.planner.model_config import facts_from_config
from support import tiny_model
from support.harness.replicas import free_port
from support.hybrid_configs import HYBRIDS_LOGGED, OLMO_HYBRID_TINY, STATE_MODELS_LOGGED

OPT_IN = "LLMOP_VLLM_PLANNER"
pytestmark = real_vllm.opt_in(OPT_IN, "seventeen vLLM starts, ~10 min")

LOGGED = re.compile(
    r"CPU KV cache size: ([0-9,]+) tokens, Maximum concurrency for 512 tokens per request: "
    r"([0-9.]+)x"
)
START_TIMEOUT = 240.0


def logged_capacity(
    venv: Path, model: Path, log: Path, extra: tuple[str, ...] = ()
) -> tuple[int, float]:
    """Start `vllm serve` on `model` until it logs its KV cache; its tokens and concurrency."""
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1"}
    env["HF_HUB_OFFLINE"] = "1"
    argv = [str(venv / "bin" / "vllm"), "serve", str(model), "--load-format", "dummy"]
    argv += ["--max-model-len", "512", "-O0", "--port", str(free_port()), *extra]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline and proc.poll() is None:
            found = LOGGED.search(log.read_text(errors="replace"))
            if found:
                return int(found.group(1).replace(",", "")), float(found.group(2))
            time.sleep(0.5)
        raise AssertionError(f"vLLM logged no KV cache size: {log}")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def model_dir(tmp_path: Path, tiny: Path, config: dict[str, Any]) -> Path:
    """A model directory of `config` with the tiny model's tokenizer (weights: vLLM's dummy)."""
    model = tmp_path / "model"
    model.mkdir()
    for path in tiny.iterdir():
        if path.name.startswith("tokenizer") or path.name == "special_tokens_map.json":
            shutil.copy(path, model / path.name)
    (model / "config.json").write_text(json.dumps(config))
    return model


@pytest.mark.parametrize("name", ["tiny-llama", *HYBRIDS_LOGGED, *STATE_MODELS_LOGGED])
def test_the_cpu_plan_gives_what_vllm_logs(name: str, tmp_path: Path) -> None:
    """The plan against a fresh vLLM start, and the figures the unit tests keep
    (support.hybrid_configs) against the same start."""
    venv = real_vllm.venv()
    tiny = Path(tiny_model.ensure(str(venv / "bin" / "python")))
    kept = {**HYBRIDS_LOGGED, **STATE_MODELS_LOGGED}.get(name)
    config = kept[0] if kept else json.loads((tiny / "config.json").read_text())
    model = model_dir(tmp_path, tiny, config)
    # The multimodal wrapper's tower is loaded but never fed: the tiny tokenizer has no image
    # tokens, and the text model's cache is what is sized.
    extra = ("--limit-mm-per-prompt", '{"image": 0, "video": 0}') if "text_config" in config else ()
    tokens, concurrency = logged_capacity(venv, model, tmp_path / "vllm.log", extra)
    facts = facts_from_config(config, name=name, checkpoint_bytes=8 * 1024**2)
    plan = plan_cpu_capacity(CpuPlanRequest(facts, memory_gib=8, kv_cache_gib=1, max_model_len=512))
    assert (plan.kv_cache_tokens, round(plan.max_concurrency, 2)) == (tokens, concurrency)
    if kept:
        assert kept[1:] == (tokens, concurrency)


def test_vllm_cpu_cannot_load_olmo_hybrid_as_the_cpu_plan_says(tmp_path: Path) -> None:
    """OLMo Hybrid: vLLM 0.32's CPU build dies building its gated-delta-net layer (a Triton
    allocator its Triton lacks), so the CPU plan refuses it; should a later CPU build load
    it, this fails and the refusal goes."""
    venv = real_vllm.venv()
    model = model_dir(
        tmp_path, Path(tiny_model.ensure(str(venv / "bin" / "python"))), OLMO_HYBRID_TINY
    )
    log = tmp_path / "vllm.log"
    with pytest.raises(AssertionError, match="logged no KV cache size"):
        logged_capacity(venv, model, log)
    assert "has no attribute 'set_allocator'" in log.read_text(errors="replace")
    facts = facts_from_config(OLMO_HYBRID_TINY, name="olmo", checkpoint_bytes=8 * 1024**2)
    plan = plan_cpu_capacity(CpuPlanRequest(facts, memory_gib=8, kv_cache_gib=1))
    assert plan.reason == REASON_CPU_UNSUPPORTED
