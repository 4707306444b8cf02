"""The vLLM metrics parser: current names, renamed names, data-parallel engines, KV capacity."""

from __future__ import annotations

import pytest

from llmop_engine.vllm_metrics import EngineMetrics, parse

V033 = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:num_requests_waiting{engine="0",model_name="m"} 7.0
vllm:num_requests_waiting{engine="1",model_name="m"} 1.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
vllm:generation_tokens_total{engine="0",model_name="m"} 1000.0
vllm:generation_tokens_total{engine="1",model_name="m"} 24.0
vllm:generation_tokens_created{engine="0",model_name="m"} 1.7e9
vllm:prompt_tokens_total{engine="0",model_name="m"} 50.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="2000",\
kv_cache_size_tokens="16000"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="1",num_gpu_blocks="2000",\
kv_cache_size_tokens="16000"} 1.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 4.0
"""

LEGACY = """\
vllm:num_requests_running{model_name="m"} 1
vllm:num_requests_waiting{model_name="m"} 0
vllm:gpu_cache_usage_perc{model_name="m"} 0.75
vllm:generation_tokens{model_name="m"} 12
vllm:cache_config_info{block_size="32",num_gpu_blocks="100"} 1
"""

LLMD_SIM = """\
vllm:num_requests_running{model_name="m"} 0
vllm:num_requests_waiting{model_name="m"} 0
vllm:kv_cache_usage_perc{model_name="m"} 0
vllm:cache_config_info{num_gpu_blocks="1024",block_size="16"} 1
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (V033, EngineMetrics(8, 5, 0.375, 32000, 1024, 50)),
        (LEGACY, EngineMetrics(0, 1, 0.75, 3200, 12, None)),
        (LLMD_SIM, EngineMetrics(0, 0, 0.0, 16384, None, None)),
        ("# only http metrics\nhttp_requests_total 4\n", EngineMetrics()),
        ("", EngineMetrics()),
    ],
    ids=["vllm-0.33-dp2", "renamed-legacy", "llm-d-sim", "disable-log-stats", "empty"],
)
def test_parse(text: str, expected: EngineMetrics) -> None:
    assert parse(text) == expected


def test_derived_quantities() -> None:
    m = parse(V033)
    assert m.pending == 13
    assert m.progress_tokens == 1074
    assert EngineMetrics().pending is None
    assert EngineMetrics().progress_tokens is None


def test_labels_with_escapes_and_spaces() -> None:
    text = 'vllm:cache_config_info{a="x\\"y, z",block_size="8",num_gpu_blocks="10"} 1\n'
    assert parse(text).kv_capacity_tokens == 80


def test_new_name_wins_over_deprecated() -> None:
    text = "vllm:kv_cache_usage_perc 0.1\nvllm:gpu_cache_usage_perc 0.9\n"
    assert parse(text).kv_usage == 0.1
