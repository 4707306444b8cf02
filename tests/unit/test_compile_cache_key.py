"""The persistent compile cache's key (`llmop.render.compile_cache_key`) and where the renderer puts
it: it changes with everything that shapes the compiled graph (revision, maxModelLen, the image
and so the vLLM release, dtype, parallelism, the user's engine flags) and with nothing else
(replicas, drain, health, the served name, the memory share); it is rendered only with a model
cache and `compileCache` on."""

from __future__ import annotations

from typing import Any

import pytest

from llmop.api.v1alpha1 import LLMDeployment
from llmop.desired import desired_state
from llmop.render import compile_cache_key as compile_cache
from llmop.settings import RenderSettings
from llmop_engine import agent_settings, contract

SHA = "0123456789abcdef0123456789abcdef01234567"
OTHER_SHA = "89abcdef0123456789abcdef0123456789abcdef"
KEY_VAR = contract.row("compile_cache_key").env
SETTINGS = RenderSettings()


def spec(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct", "cache": {"size": "10Gi"}},
        "engine": {"maxModelLen": 4096, "dtype": "bfloat16"},
        "resources": {"gpus": 1, "gpuProduct": "NVIDIA-H100-80GB-HBM3"},
    }
    for path, value in over.items():
        node = base
        *parents, leaf = path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return base


def llmd(**over: Any) -> LLMDeployment:
    return LLMDeployment.model_validate(
        {
            "metadata": {"name": "chat", "namespace": "ml", "uid": "u", "generation": 1},
            "spec": spec(**over),
        }
    )


def engine_container(model: LLMDeployment, revision: str = SHA) -> dict[str, Any]:
    desired = desired_state(model, SETTINGS, resolved_revision=revision)
    assert desired.children is not None
    container: dict[str, Any] = desired.children.deployment["spec"]["template"]["spec"][
        "containers"
    ][0]
    return container


def rendered_key(model: LLMDeployment, revision: str = SHA) -> str | None:
    env = {e["name"]: e.get("value") for e in engine_container(model, revision)["env"]}
    return env.get(KEY_VAR)


def test_the_key_is_rendered_and_the_agent_reads_it_back() -> None:
    container = engine_container(llmd())
    key = rendered_key(llmd())
    assert key is not None
    assert len(key) == compile_cache.KEY_HEX_CHARS
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    settings = agent_settings.parse_run_args(container["args"][1:], env)
    assert settings.compile_cache_key == key
    assert settings.model_cache_dir == "/models/cache"


def test_a_new_revision_or_max_model_len_gets_a_new_key() -> None:
    base = rendered_key(llmd())
    assert rendered_key(llmd(), revision=OTHER_SHA) != base
    assert rendered_key(llmd(**{"engine.maxModelLen": 8192})) != base


@pytest.mark.parametrize(
    "change",
    [
        {"engine.dtype": "float16"},
        {"engine.quantization": "fp8"},
        {"engine.kvCacheDtype": "fp8"},
        {"engine.maxNumSeqs": 64},
        {"engine.maxNumBatchedTokens": 8192},
        {"engine.enablePrefixCaching": False},
        {"engine.image": "registry.local/vllm:0.40.0"},
        {"engine.args": ["--enforce-eager"]},
        {"engine.args": ["--compilation-config", '{"level": 0}']},
        {"engine.env": [{"name": "VLLM_USE_AOT_COMPILE", "value": "0"}]},
        {"resources.gpus": 2},
        {"resources.gpuProduct": "NVIDIA-A100-SXM4-80GB"},
        {"model.name": "Qwen/Qwen2.5-1.5B-Instruct"},
    ],
    ids=lambda change: next(iter(change)),
)
def test_what_shapes_the_graph_changes_the_key(change: dict[str, Any]) -> None:
    assert rendered_key(llmd(**change)) != rendered_key(llmd())


@pytest.mark.parametrize(
    "change",
    [
        {"replicas": 3},
        {"model.servedName": "assistant"},
        {"rollout.drainSeconds": 120},
        {"health.stallSeconds": 90},
        {"engine.gpuMemoryUtilization": 0.8},
        {"engine.env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}]},
        {"engine.env": [{"name": "MY_APP_SETTING", "value": "x"}]},
        {"engine.args": ["--disable-log-requests", "--uvicorn-log-level=warning"]},
        {"service.port": 9000},
        {"model.cache": {"existingClaim": "weights"}},
    ],
    ids=lambda change: next(iter(change)),
)
def test_what_does_not_shape_the_graph_keeps_the_key(change: dict[str, Any]) -> None:
    assert rendered_key(llmd(**change)) == rendered_key(llmd())


def test_no_key_without_a_model_cache_or_with_the_switch_off_or_for_the_simulator() -> None:
    assert rendered_key(llmd(**{"model.cache": None})) is None
    assert rendered_key(llmd(**{"model.cache.compileCache": False})) is None
    assert rendered_key(llmd(**{"engine.backend": "simulator"})) is None


def test_the_switch_defaults_on_and_round_trips() -> None:
    assert llmd().spec.model.cache is not None
    assert llmd().spec.model.cache.compile_cache is True
    off = llmd(**{"model.cache.compileCache": False})
    dumped = off.model_dump(by_alias=True, exclude_none=True)
    assert dumped["spec"]["model"]["cache"]["compileCache"] is False


def test_graph_flags_drop_neutral_flags_in_either_spelling() -> None:
    flags = [
        "m",
        "--served-model-name",
        "x",
        "--port=8000",
        "--max-model-len",
        "512",
        "--enable-server-load-tracking",
        "--shutdown-timeout",
        "30",
        "--dtype=float32",
    ]
    assert compile_cache.graph_flags(flags) == ["m", "--max-model-len", "512", "--dtype=float32"]


def test_cpu_engines_with_the_cache_compile_without_aot_unless_the_user_says() -> None:
    """vLLM 0.32's CPU build cannot load its own AOT artifacts (render.compile_cache_key)."""

    def aot(model: LLMDeployment) -> str | None:
        env = {e["name"]: e.get("value") for e in engine_container(model)["env"]}
        return env.get(compile_cache.AOT_COMPILE_ENV)

    cpu = {"resources.gpus": 0, "resources.gpuProduct": None, "resources.memory": "16Gi"}
    assert aot(llmd(**cpu)) == "0"
    assert aot(llmd()) is None  # GPU engines keep vLLM's default
    assert aot(llmd(**cpu, **{"model.cache.compileCache": False})) is None
    mine = [{"name": compile_cache.AOT_COMPILE_ENV, "value": "1"}]
    assert aot(llmd(**cpu, **{"engine.env": mine})) == "1"
