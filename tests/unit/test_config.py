"""Operator settings: defaults, environment, flags (flags win)."""

from __future__ import annotations

import pytest

from llmop.config import ConfigError, OperatorConfig, load
from llmop.settings import DEFAULT_VLLM_IMAGE


def test_defaults_are_cluster_wide_and_standalone() -> None:
    config = load([], {})
    assert config == OperatorConfig()
    assert config.clusterwide
    assert config.standalone
    assert config.render_settings().vllm_image == DEFAULT_VLLM_IMAGE


def test_environment_is_read() -> None:
    config = load(
        [],
        {
            "LLMOP_NAMESPACES": "a, b,,",
            "LLMOP_VLLM_IMAGE": "registry/vllm:1",
            "LLMOP_SIMULATOR_IMAGE": "registry/sim:1",
            "LLMOP_VLLM_CPU_IMAGE": "registry/vllm-cpu:1",
            "LLMOP_SERVICE_MONITOR": "true",
            "LLMOP_METRICS_PORT": "0",
            "LLMOP_MAX_WORKERS": "4",
            "LLMOP_LOG_FORMAT": "text",
            "LLMOP_GPU_RESOURCE_NAME": "amd.com/gpu",
        },
    )
    assert config.namespaces == ("a", "b")
    assert not config.clusterwide
    assert config.metrics_port == 0
    assert config.max_workers == 4
    assert config.log_format == "text"
    settings = config.render_settings()
    assert settings.gpu_resource_name == "amd.com/gpu"
    assert settings.vllm_cpu_image == "registry/vllm-cpu:1"
    assert (settings.vllm_image, settings.simulator_image, settings.service_monitor) == (
        "registry/vllm:1",
        "registry/sim:1",
        True,
    )


def test_flags_win_over_environment() -> None:
    config = load(
        ["-n", "x", "--namespace", "y", "--vllm-image", "flag/vllm:2", "--no-service-monitor"],
        {"LLMOP_NAMESPACES": "a", "LLMOP_VLLM_IMAGE": "env/vllm:1", "LLMOP_SERVICE_MONITOR": "1"},
    )
    assert config.namespaces == ("x", "y")
    assert config.vllm_image == "flag/vllm:2"
    assert config.service_monitor is False
    assert load(["--gpu-resource-name", "intel.com/gpu"], {}).gpu_resource_name == "intel.com/gpu"


def test_all_namespaces_overrides_the_environment() -> None:
    assert load(["-A"], {"LLMOP_NAMESPACES": "a"}).clusterwide


def test_peering_turns_standalone_off() -> None:
    config = load(["--peering", "default", "--priority", "7"], {})
    assert (config.standalone, config.peering_name, config.priority) == (False, "default", 7)


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        ([], {"LLMOP_SERVICE_MONITOR": "maybe"}),
        ([], {"LLMOP_METRICS_PORT": "70000"}),
        ([], {"LLMOP_LOG_FORMAT": "xml"}),
        (["--max-workers", "0"], {}),
        ([], {"LLMOP_AGENT_READ_INTERVAL_SECONDS": "-1"}),
        (["--agent-read-concurrency", "0"], {}),
    ],
    ids=[
        "bad-bool",
        "bad-port",
        "bad-log-format",
        "no-workers",
        "negative-agent-interval",
        "no-agent-reads-in-flight",
    ],
)
def test_bad_settings_are_config_errors(argv: list[str], env: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        load(argv, env)


def test_agent_reads_from_the_environment_and_flags() -> None:
    assert load([], {}).agent_read_interval_seconds == 10
    config = load(["--agent-read-concurrency", "4"], {"LLMOP_AGENT_READ_INTERVAL_SECONDS": "0"})
    assert (config.agent_read_interval_seconds, config.agent_read_concurrency) == (0, 4)


def test_config_is_frozen() -> None:
    config = load([], {})
    with pytest.raises(AttributeError):
        config.max_workers = 1  # type: ignore[misc]
