"""Agent settings from the renderer's environment and flags, and the engine command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from llmop_engine.agent_settings import SettingsError, add_agent_flags, from_env_and_flags
from llmop_engine.supervisor import engine_command, engine_env, engine_port, exit_status


def settings(argv: list[str], env: dict[str, str], engine: list[str] | None = None):  # type: ignore[no-untyped-def]
    parser = argparse.ArgumentParser()
    add_agent_flags(parser)
    return from_env_and_flags(env, parser.parse_args(argv), engine or [])


def test_defaults_with_no_flags() -> None:
    s = settings([], {})
    assert (s.backend, s.api_port, s.probe_port) == ("vllm", 8000, 8081)
    assert (s.stall_seconds, s.load_timeout_seconds, s.drain_seconds) == (60, 1800, 30)
    assert s.deep_probe_enabled
    assert s.deep_probe_prompt == "ping"
    assert s.agent_socket == "/tmp/llmop-agent.sock"
    assert engine_command(s) == [
        "vllm",
        "serve",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        # The agent runs the drain: it counts in-flight requests on /load and SIGTERMs the
        # engine only when idle or out of budget.
        "--enable-server-load-tracking",
        # Once draining, vLLM closes each connection after its response (keep-alive clients).
        "--middleware",
        "llmop_engine.connection_close.CloseOnDrain",
        "--shutdown-timeout",
        "0",
    ]
    assert s.engine_keep_alive_seconds == 5


def test_engine_environment_names_the_drain_flag() -> None:
    s = settings([], {"LLMOP_AGENT_SOCKET": "/run/llmop/agent.sock"})
    env = engine_env(s, {"PATH": "/bin", "PYTHONPATH": "/opt/llmop"})
    assert env["LLMOP_DRAIN_FLAG"] == "/run/llmop/agent.sock.draining"
    assert env["PATH"] == "/bin"
    # From a source tree the agent's package directory is added, so vLLM can import the
    # middleware; the images' own PYTHONPATH stays first.
    paths = env["PYTHONPATH"].split(":")
    assert paths[0] == "/opt/llmop"
    assert Path(paths[-1], "llmop_engine", "connection_close.py").is_file()
    assert settings([], {"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "2"}).engine_keep_alive_seconds == 2


def test_renderer_environment() -> None:
    env = {
        "LLMOP_SERVED_MODEL_NAME": "llama",
        "LLMOP_STALL_SECONDS": "45",
        "LLMOP_LOAD_TIMEOUT_SECONDS": "900",
        "LLMOP_DEEP_PROBE_ENABLED": "false",
        "LLMOP_DEEP_PROBE_INTERVAL_SECONDS": "15",
        "LLMOP_DEEP_PROBE_TIMEOUT_SECONDS": "3",
        "LLMOP_DEEP_PROBE_PROMPT": "hi",
        "LLMOP_ENDPOINT_PROPAGATION_SECONDS": "7",
        "LLMOP_DRAIN_SECONDS": "40",
        "LLMOP_MODEL_CACHE_DIR": "/models",
        "LLMOP_AGENT_SOCKET": "/run/agent.sock",
        "VLLM_API_KEY": "k",
    }
    s = settings([], env)
    assert s.served_model_name == "llama"
    assert s.stall_seconds == 45
    assert s.load_timeout_seconds == 900
    assert not s.deep_probe_enabled
    assert (s.deep_probe_interval_seconds, s.deep_probe_timeout_seconds) == (15, 3)
    assert s.deep_probe_prompt == "hi"
    assert s.endpoint_propagation_seconds == 7
    assert s.drain_seconds == 40
    assert s.model_cache_dir == "/models"
    assert s.agent_socket == "/run/agent.sock"
    assert s.api_key == "k"


def test_flags_override_environment() -> None:
    s = settings(
        ["--stall-seconds", "5", "--backend", "simulator", "--deep-probe"],
        {"LLMOP_STALL_SECONDS": "45", "LLMOP_DEEP_PROBE_ENABLED": "false"},
    )
    assert s.stall_seconds == 5
    assert s.backend == "simulator"
    assert s.deep_probe_enabled


def test_engine_flags_kept_and_served_name_read() -> None:
    engine = ["m", "--served-model-name", "chat", "--port", "9000", "--shutdown-timeout=12"]
    s = settings(["--backend", "simulator"], {}, engine)
    assert s.served_model_name == "chat"
    assert engine_port(s) == 9000
    cmd = engine_command(s, python="py")
    kept = ["m", "--served-model-name", "chat", "--port", "9000"]
    # The renderer's --shutdown-timeout is replaced: the agent owns the drain.
    assert cmd == [
        *["py", "-m", "llmop_engine", "simulate", *kept, "--host", "0.0.0.0"],
        *["--enable-server-load-tracking", "--shutdown-timeout", "0"],
    ]


def test_agent_owns_the_drain_even_without_metrics() -> None:
    """--disable-log-stats: no queue gauges, but /load still counts in-flight requests."""
    engine = ["m", "--disable-log-stats", "--enable-server-load-tracking", "--shutdown-timeout=9"]
    cmd = engine_command(settings([], {}, engine))
    assert cmd.count("--enable-server-load-tracking") == 1
    assert cmd[-2:] == ["--shutdown-timeout", "0"]
    assert "--shutdown-timeout=9" not in cmd


@pytest.mark.parametrize(
    "env",
    [
        {"LLMOP_STALL_SECONDS": "soon"},
        {"LLMOP_DEEP_PROBE_ENABLED": "maybe"},
        {"LLMOP_DRAIN_SECONDS": "-1"},
        {"LLMOP_BACKEND": "tgi"},
    ],
)
def test_bad_values_are_rejected(env: dict[str, str]) -> None:
    with pytest.raises(SettingsError):
        settings([], env)


@pytest.mark.skipif(sys.platform != "linux", reason="wait status encoding")
def test_exit_status() -> None:
    assert exit_status(3 << 8) == 3
    assert exit_status(9) == 137
