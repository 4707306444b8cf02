"""Agent settings: one frozen value from the environment the renderer sets, overridden by flags.

Every variable name, flag and default comes from `llmop_engine.contract`, which the operator's
renderer imports too; this module is the only place that reads them, so the rest of the agent
receives plain typed values.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from llmop_engine import contract
from llmop_engine.contract import BACKENDS, Backend, EngineFlag, Env, Flag

T = TypeVar("T")


@dataclass(frozen=True)
class AgentSettings:
    """Everything the agent needs to supervise, probe and drain one engine."""

    backend: Backend = "vllm"
    api_port: int = contract.API_PORT
    probe_port: int = contract.PROBE_PORT
    probe_host: str = contract.PROBE_HOST
    engine_args: tuple[str, ...] = ()
    served_model_name: str | None = None
    stall_seconds: float = contract.STALL_SECONDS
    load_timeout_seconds: float = contract.LOAD_TIMEOUT_SECONDS
    deep_probe_enabled: bool = contract.DEEP_PROBE_ENABLED
    deep_probe_interval_seconds: float = contract.DEEP_PROBE_INTERVAL_SECONDS
    deep_probe_timeout_seconds: float = contract.DEEP_PROBE_TIMEOUT_SECONDS
    deep_probe_prompt: str = contract.DEEP_PROBE_PROMPT
    endpoint_propagation_seconds: float = contract.ENDPOINT_PROPAGATION_SECONDS
    drain_seconds: float = contract.DRAIN_SECONDS
    model_cache_dir: str | None = None
    agent_socket: str = contract.AGENT_SOCKET
    # How often the engine's /health and /metrics are read. Not in the renderer's set: one second
    # keeps hang detection within a second of stallSeconds at negligible cost.
    poll_interval_seconds: float = contract.POLL_INTERVAL_SECONDS
    api_key: str | None = None
    # vLLM's idle keep-alive timeout (its own variable, inherited by the engine): the drain's quiet
    # period, so that idle pooled connections are closed before the engine exits.
    engine_keep_alive_seconds: float = contract.HTTP_KEEP_ALIVE_SECONDS


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
    if lowered in contract.TRUE_WORDS:
        return True
    if lowered in contract.FALSE_WORDS:
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
        Flag.BACKEND,
        choices=BACKENDS,
        default=None,
        help=f"engine to launch [{Env.BACKEND} or vllm]",
    )
    parser.add_argument(
        Flag.PORT, type=int, default=None, help=f"engine API port [{contract.API_PORT}]"
    )
    parser.add_argument(
        Flag.PROBE_PORT, type=int, default=None, help=f"agent probe port [{contract.PROBE_PORT}]"
    )
    parser.add_argument(
        Flag.PROBE_HOST, default=None, help=f"probe bind address [{contract.PROBE_HOST}]"
    )
    parser.add_argument(Flag.STALL_SECONDS, type=float, default=None)
    parser.add_argument(Flag.LOAD_TIMEOUT_SECONDS, type=float, default=None)
    parser.add_argument(
        Flag.DEEP_PROBE, dest="deep_probe", action=argparse.BooleanOptionalAction, default=None
    )
    parser.add_argument(Flag.DEEP_PROBE_INTERVAL_SECONDS, type=float, default=None)
    parser.add_argument(Flag.DEEP_PROBE_TIMEOUT_SECONDS, type=float, default=None)
    parser.add_argument(Flag.DEEP_PROBE_PROMPT, default=None)
    parser.add_argument(Flag.ENDPOINT_PROPAGATION_SECONDS, type=float, default=None)
    parser.add_argument(Flag.DRAIN_SECONDS, type=float, default=None)
    parser.add_argument(Flag.MODEL_CACHE_DIR, default=None)
    parser.add_argument(
        Flag.SOCKET, default=None, help=f"unix socket for `{contract.ENTRYPOINT} drain`"
    )
    parser.add_argument(Flag.POLL_INTERVAL_SECONDS, type=float, default=None)


def _pick(flag: T | None, env_value: T) -> T:
    return env_value if flag is None else flag


_DEFAULTS = AgentSettings()
"""The contract's defaults, typed: what an absent flag and an absent variable leave."""


def from_env_and_flags(
    env: Mapping[str, str], ns: argparse.Namespace, engine_args: Sequence[str]
) -> AgentSettings:
    """Combine the renderer's environment with command-line flags (flags win)."""
    backend = ns.backend or env.get(Env.BACKEND) or _DEFAULTS.backend
    if backend not in BACKENDS:
        raise SettingsError(f"backend {backend!r} is not one of {', '.join(BACKENDS)}")
    api_key = flag_value(engine_args, EngineFlag.API_KEY) or _str(env, Env.API_KEY)
    served = _str(env, Env.SERVED_MODEL_NAME) or flag_value(
        engine_args, EngineFlag.SERVED_MODEL_NAME
    )
    d = _DEFAULTS
    settings = AgentSettings(
        backend="simulator" if backend == "simulator" else "vllm",
        api_port=_pick(ns.port, d.api_port),
        probe_port=_pick(ns.probe_port, d.probe_port),
        probe_host=_pick(ns.probe_host, d.probe_host),
        engine_args=tuple(engine_args),
        served_model_name=served,
        stall_seconds=_pick(ns.stall_seconds, _float(env, Env.STALL_SECONDS, d.stall_seconds)),
        load_timeout_seconds=_pick(
            ns.load_timeout_seconds,
            _float(env, Env.LOAD_TIMEOUT_SECONDS, d.load_timeout_seconds),
        ),
        deep_probe_enabled=_pick(
            ns.deep_probe, _bool(env, Env.DEEP_PROBE_ENABLED, d.deep_probe_enabled)
        ),
        deep_probe_interval_seconds=_pick(
            ns.deep_probe_interval_seconds,
            _float(env, Env.DEEP_PROBE_INTERVAL_SECONDS, d.deep_probe_interval_seconds),
        ),
        deep_probe_timeout_seconds=_pick(
            ns.deep_probe_timeout_seconds,
            _float(env, Env.DEEP_PROBE_TIMEOUT_SECONDS, d.deep_probe_timeout_seconds),
        ),
        deep_probe_prompt=_pick(
            ns.deep_probe_prompt, env.get(Env.DEEP_PROBE_PROMPT) or d.deep_probe_prompt
        ),
        endpoint_propagation_seconds=_pick(
            ns.endpoint_propagation_seconds,
            _float(env, Env.ENDPOINT_PROPAGATION_SECONDS, d.endpoint_propagation_seconds),
        ),
        drain_seconds=_pick(ns.drain_seconds, _float(env, Env.DRAIN_SECONDS, d.drain_seconds)),
        model_cache_dir=_pick(ns.model_cache_dir, _str(env, Env.MODEL_CACHE_DIR)),
        agent_socket=_pick(ns.socket, env.get(Env.AGENT_SOCKET) or d.agent_socket),
        poll_interval_seconds=_pick(
            ns.poll_interval_seconds,
            _float(env, Env.POLL_INTERVAL_SECONDS, d.poll_interval_seconds),
        ),
        api_key=api_key,
        engine_keep_alive_seconds=_float(
            env, Env.HTTP_KEEP_ALIVE_SECONDS, d.engine_keep_alive_seconds
        ),
    )
    if settings.poll_interval_seconds <= 0:
        raise SettingsError("poll interval must be positive")
    if settings.deep_probe_interval_seconds <= 0:
        raise SettingsError("deep-probe interval must be positive")
    return settings


def parse_run_args(
    argv: Sequence[str], env: Mapping[str, str], *, prog: str = f"{contract.ENTRYPOINT} run"
) -> AgentSettings:
    """The settings of `llmop-engine run <argv>` under `env`: the agent's real parser, which
    the renderer's round-trip test drives too. Bad input exits like argparse does (status 2)."""
    own, engine_args = contract.split_engine_args(argv)
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Supervise the engine (PID 1): probes on --probe-port, drain on SIGTERM. "
        "Everything after `--` goes to the engine. Settings also come from LLMOP_* variables.",
    )
    add_agent_flags(parser)
    ns = parser.parse_args(own)
    try:
        return from_env_and_flags(env, ns, engine_args)
    except SettingsError as exc:
        parser.error(str(exc))


def socket_path(env: Mapping[str, str] | None = None) -> str:
    """The drain socket path as the preStop hook sees it."""
    source = os.environ if env is None else env
    return source.get(Env.AGENT_SOCKET) or contract.AGENT_SOCKET
