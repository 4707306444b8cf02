"""vLLM's CPU build as a backend (`resources.gpus: 0`, backend vllm): quantities, the CPU planner
(the KV budget the renderer gives the engine against the pod's memory) and the rendered pod."""

from __future__ import annotations

from typing import Any

import pytest

from llmop import sizing
from llmop.api.v1alpha1 import LLMDeployment
from llmop.planner import REASON_CPU_MEMORY, REASON_FITS, REASON_KV
from llmop.planner.cpu import CPU_RUNTIME_OVERHEAD_GIB, default_kv_cache_gib
from llmop.quantity import quantity_gib, quantity_value
from llmop.render import RenderSettings, render_children

SETTINGS = RenderSettings(vllm_image="engine:1", simulator_image="sim:1", vllm_cpu_image="cpu:1")
# The tiny model of the real-engine tests: 2 layers, 4 KV heads of 32, fp32 → 2,048 B per token.
TINY = {
    "parameters": 900_000,
    "layers": 2,
    "kvHeads": 4,
    "headDim": 32,
    "maxPositionEmbeddings": 2048,
}


def cpu_deployment(memory: str | None = "8Gi", **spec: Any) -> LLMDeployment:
    resources = {"gpus": 0, **({"memory": memory} if memory else {}), "cpu": "2"}
    body = {
        "metadata": {"name": "tiny", "namespace": "team"},
        "spec": {
            "model": {"name": "pvc://models/tiny", "architecture": TINY},
            "engine": {"dtype": "float32", "maxModelLen": 2048, **spec.pop("engine", {})},
            "resources": resources,
            **spec,
        },
    }
    return LLMDeployment.model_validate(body)


@pytest.mark.parametrize(
    ("quantity", "gib"),
    [("16Gi", 16.0), ("512Mi", 0.5), (2**31, 2.0), ("1.5Gi", 1.5), ("8G", 8e9 / 2**30),
     ("2e9", 2e9 / 2**30), ("lots", None), ("8Gb", None), (None, None)],
)  # fmt: skip
def test_memory_quantities(quantity: int | str | None, gib: float | None) -> None:
    assert quantity_gib(quantity) == gib


def test_milli_quantity() -> None:
    assert quantity_value("500m") == 0.5


def test_cpu_plan_reads_the_rendered_kv_budget_and_matches_vllms_own_count() -> None:
    """VLLM_CPU_KVCACHE_SPACE=1 with the tiny model: vLLM logs 524,288 tokens."""
    d = cpu_deployment(engine={"env": [{"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"}]})
    result = sizing.plan_for(d.spec)
    assert result.reason == REASON_FITS, result.message
    assert result.plan is not None
    assert result.plan.kv_cache_tokens == 524_288
    assert result.plan.kv_bytes_per_token == 2048
    assert result.plan.max_concurrency == 256


def test_cpu_plan_says_when_the_kv_budget_does_not_fit_the_pod() -> None:
    d = cpu_deployment(
        memory="6Gi", engine={"env": [{"name": "VLLM_CPU_KVCACHE_SPACE", "value": "4"}]}
    )
    result = sizing.plan_for(d.spec)
    assert result.fits is False
    assert result.reason == REASON_CPU_MEMORY
    # 4 GiB KV + 3.5 runtime + ~0 weights = 7.5 > 5.4 usable: memory ≥ ⌈7.5 / 0.9⌉ = 9Gi.
    assert "spec.resources.memory to at least 9Gi" in result.message, result.message


def test_cpu_plan_says_when_the_kv_cache_cannot_hold_one_sequence() -> None:
    big = {**TINY, "layers": 64, "kvHeads": 64, "headDim": 128, "maxPositionEmbeddings": 131072}
    d = cpu_deployment(
        memory="64Gi",
        model={"name": "pvc://models/big", "architecture": big},
        engine={"maxModelLen": 131072, "env": [{"name": "VLLM_CPU_KVCACHE_SPACE", "value": "8"}]},
    )
    result = sizing.plan_for(d.spec)
    assert result.reason == REASON_KV
    assert "Set VLLM_CPU_KVCACHE_SPACE to at least" in result.message


def test_default_kv_budget_from_memory_is_what_the_renderer_sets_and_the_planner_checks() -> None:
    d = cpu_deployment(memory="16Gi")
    env = {e["name"]: e.get("value") for e in _container(d)["env"]}
    expected = default_kv_cache_gib(16)
    assert expected == int((16 * 0.9 - CPU_RUNTIME_OVERHEAD_GIB) // 2)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == str(expected)
    result = sizing.plan_for(d.spec)
    assert result.plan is not None
    assert result.plan.kv_cache_gib_per_gpu == expected


def _pod(d: LLMDeployment) -> dict[str, Any]:
    children = render_children(d, SETTINGS, load_timeout_seconds=900)
    pod: dict[str, Any] = children.deployment["spec"]["template"]["spec"]
    return pod


def _container(d: LLMDeployment) -> dict[str, Any]:
    container: dict[str, Any] = _pod(d)["containers"][0]
    return container


def test_cpu_engine_pod_has_no_gpu_anything_and_the_cpu_image() -> None:
    pod = _pod(cpu_deployment(engine={"env": [{"name": "VLLM_CPU_KVCACHE_SPACE", "value": "2"}]}))
    c = pod["containers"][0]
    assert c["image"] == "cpu:1"
    assert c["resources"] == {
        "limits": {"cpu": "2", "memory": "8Gi"},
        "requests": {"cpu": "2", "memory": "8Gi"},
    }
    assert "tolerations" not in pod
    assert "nodeSelector" not in pod
    assert "--tensor-parallel-size" not in c["args"]
    names = [e["name"] for e in c["env"]]
    # The user's value, once (env is a list-map keyed by name: a duplicate breaks SSA).
    assert names.count("VLLM_CPU_KVCACHE_SPACE") == 1
    assert {e["name"]: e.get("value") for e in c["env"]}["VLLM_CPU_KVCACHE_SPACE"] == "2"
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["sizeLimit"] == "1Gi"


def test_gpu_engines_and_the_simulator_get_no_cpu_kv_budget() -> None:
    gpu = LLMDeployment.model_validate(
        {"metadata": {"name": "g", "namespace": "t"}, "spec": {"model": {"name": "m"}}}
    )
    sim = LLMDeployment.model_validate(
        {
            "metadata": {"name": "s", "namespace": "t"},
            "spec": {"model": {"name": "m"}, "engine": {"backend": "simulator"},
                     "resources": {"gpus": 0}},
        }
    )  # fmt: skip
    for d, image in ((gpu, "engine:1"), (sim, "sim:1")):
        c = _container(d)
        assert c["image"] == image
        assert "VLLM_CPU_KVCACHE_SPACE" not in {e["name"] for e in c["env"]}
