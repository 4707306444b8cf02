"""Agent settings: one frozen value from the environment the renderer sets, overridden by flags.

The variable names and defaults are the ones in `docs/engine-contract.md`; this module is the only
place that reads them, so the rest of the agent receives plain typed values.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

Backend = Literal["vllm", "simulator"]
BACKENDS: tuple[Backend, ...] = ("vllm", "simulator")

DEFAULT_API_PORT = 8000
DEFAULT_PROBE_PORT = 8081
DEFAULT_SOCKET = "/tmp/llmop-agent.sock"

T = TypeVar("T")


@dataclass(frozen=True)
class AgentSettings:
    """Everything the agent needs to supervise, probe and drain one engine."""

    backend: Backend = "vllm"
    api_port: int = DEFAULT_API_PORT
    probe_port: int = DEFAULT_PROBE_PORT
    probe_host: str = "0.0.0.0"
    engine_args: tuple[str, ...] = ()
    served_model_name: str | None = None
    stall_seconds: float = 60.0
    load_timeout_seconds: float = 1800.0
    deep_probe_enabled: bool = True
    deep_probe_interval_seconds: float = 10.0
    deep_probe_timeout_seconds: float = 5.0
    deep_probe_prompt: str = "ping"
    endpoint_propagation_seconds: float = 5.0
    drain_seconds: float = 30.0
    model_cache_dir: str | None = None
    agent_socket: str = DEFAULT_SOCKET
    # How often the engine's /health and /metrics are read. Not in the renderer's set: one second
    # keeps hang detection within a second of stallSeconds at negligible cost.
    poll_interval_seconds: float = 1.0
    api_key: str | None = None


class SettingsError(ValueError):
    """A setting has a value the agent cannot use."""


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise SettingsError(f"{name}={raw!r} is not a number") from exc
    if value < 0:
        raise SettingsError(f"{name}={raw!r} must not be negative")
    return value


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise SettingsError(f"{name}={raw!r} is not a boolean (true/false)")


def _str(env: Mapping[str, str], name: str) -> str | None:
    raw = env.get(name)
    return raw if raw else None


def flag_value(args: Sequence[str], flag: str) -> str | None:
    """The value of `--flag value` or `--flag=value` in an engine command line, if present."""
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg[len(flag) + 1 :]
    return None


def has_flag(args: Sequence[str], flag: str) -> bool:
    return any(arg == flag or arg.startswith(flag + "=") for arg in args)


def add_agent_flags(parser: argparse.ArgumentParser) -> None:
    """Flags of `llmop-engine run`; each overrides its environment variable when given."""
    parser.add_argument(
        "--backend", choices=BACKENDS, default=None, help="engine to launch [LLMOP_BACKEND or vllm]"
    )
    parser.add_argument("--port", type=int, default=None, help="engine API port [8000]")
    parser.add_argument("--probe-port", type=int, default=None, help="agent probe port [8081]")
    parser.add_argument("--probe-host", default=None, help="probe bind address [0.0.0.0]")
    parser.add_argument("--stall-seconds", type=float, default=None)
    parser.add_argument("--load-timeout-seconds", type=float, default=None)
    parser.add_argument(
        "--deep-probe", dest="deep_probe", action=argparse.BooleanOptionalAction, default=None
    )
    parser.add_argument("--deep-probe-interval-seconds", type=float, default=None)
    parser.add_argument("--deep-probe-timeout-seconds", type=float, default=None)
    parser.add_argument("--deep-probe-prompt", default=None)
    parser.add_argument("--endpoint-propagation-seconds", type=float, default=None)
    parser.add_argument("--drain-seconds", type=float, default=None)
    parser.add_argument("--model-cache-dir", default=None)
    parser.add_argument("--socket", default=None, help="unix socket for `llmop-engine drain`")
    parser.add_argument("--poll-interval-seconds", type=float, default=None)


def _pick(flag: T | None, env_value: T) -> T:
    return env_value if flag is None else flag


def from_env_and_flags(
    env: Mapping[str, str], ns: argparse.Namespace, engine_args: Sequence[str]
) -> AgentSettings:
    """Combine the renderer's environment with command-line flags (flags win)."""
    backend_env = env.get("LLMOP_BACKEND", "vllm") or "vllm"
    backend = ns.backend or backend_env
    if backend not in BACKENDS:
        raise SettingsError(f"backend {backend!r} is not one of {', '.join(BACKENDS)}")
    api_key = flag_value(engine_args, "--api-key") or _str(env, "VLLM_API_KEY")
    served = _str(env, "LLMOP_SERVED_MODEL_NAME") or flag_value(engine_args, "--served-model-name")
    settings = AgentSettings(
        backend="simulator" if backend == "simulator" else "vllm",
        api_port=_pick(ns.port, DEFAULT_API_PORT),
        probe_port=_pick(ns.probe_port, DEFAULT_PROBE_PORT),
        probe_host=_pick(ns.probe_host, "0.0.0.0"),
        engine_args=tuple(engine_args),
        served_model_name=served,
        stall_seconds=_pick(ns.stall_seconds, _float(env, "LLMOP_STALL_SECONDS", 60.0)),
        load_timeout_seconds=_pick(
            ns.load_timeout_seconds, _float(env, "LLMOP_LOAD_TIMEOUT_SECONDS", 1800.0)
        ),
        deep_probe_enabled=_pick(ns.deep_probe, _bool(env, "LLMOP_DEEP_PROBE_ENABLED", True)),
        deep_probe_interval_seconds=_pick(
            ns.deep_probe_interval_seconds, _float(env, "LLMOP_DEEP_PROBE_INTERVAL_SECONDS", 10.0)
        ),
        deep_probe_timeout_seconds=_pick(
            ns.deep_probe_timeout_seconds, _float(env, "LLMOP_DEEP_PROBE_TIMEOUT_SECONDS", 5.0)
        ),
        deep_probe_prompt=_pick(ns.deep_probe_prompt, env.get("LLMOP_DEEP_PROBE_PROMPT") or "ping"),
        endpoint_propagation_seconds=_pick(
            ns.endpoint_propagation_seconds, _float(env, "LLMOP_ENDPOINT_PROPAGATION_SECONDS", 5.0)
        ),
        drain_seconds=_pick(ns.drain_seconds, _float(env, "LLMOP_DRAIN_SECONDS", 30.0)),
        model_cache_dir=_pick(ns.model_cache_dir, _str(env, "LLMOP_MODEL_CACHE_DIR")),
        agent_socket=_pick(ns.socket, env.get("LLMOP_AGENT_SOCKET") or DEFAULT_SOCKET),
        poll_interval_seconds=_pick(
            ns.poll_interval_seconds, _float(env, "LLMOP_POLL_INTERVAL_SECONDS", 1.0)
        ),
        api_key=api_key,
    )
    if settings.poll_interval_seconds <= 0:
        raise SettingsError("poll interval must be positive")
    if settings.deep_probe_interval_seconds <= 0:
        raise SettingsError("deep-probe interval must be positive")
    return settings


def socket_path(env: Mapping[str, str] | None = None) -> str:
    """The drain socket path as the preStop hook sees it."""
    source = os.environ if env is None else env
    return source.get("LLMOP_AGENT_SOCKET") or DEFAULT_SOCKET
