"""Agent settings: read from the environment the renderer sets, overridden by flags.

The settings themselves are the table `llmop_engine.contract.AgentSettings` (each row: type,
default, flag, variable); this module turns that table into the `run` parser and the environment
reader, so the rest of the agent receives plain typed values and a new row needs no code here.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from typing import Any

from llmop_engine import contract
from llmop_engine.contract import (
    DEFAULTS,
    SETTINGS,
    AgentSettings,
    EngineFlag,
    Env,
    Setting,
    flag_value,
)

__all__ = [
    "AgentSettings",
    "SettingsError",
    "add_agent_flags",
    "flag_value",
    "from_env_and_flags",
    "has_flag",
    "parse_run_args",
    "socket_path",
]


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


def _int(env: Mapping[str, str], name: str, default: object) -> object:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise SettingsError(f"{name}={raw!r} is not an integer") from exc


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


def has_flag(args: Sequence[str], flag: str) -> bool:
    return any(arg == flag or arg.startswith(flag + "=") for arg in args)


def add_agent_flags(parser: argparse.ArgumentParser) -> None:
    """Flags of `llmop-engine run`, one per table row that has one; each overrides its variable."""
    for s in SETTINGS:
        if s.flag is None:
            continue
        where = f"{s.env} or {s.default}" if s.env else f"{s.default}"
        help_text = f"{s.help} [{where}]"
        if s.kind is bool:
            action = argparse.BooleanOptionalAction
            parser.add_argument(s.flag, dest=s.name, action=action, default=None, help=help_text)
        else:
            metavar = s.flag.removeprefix("--").replace("-", "_").upper()
            parser.add_argument(
                s.flag,
                dest=s.name,
                metavar=None if s.choices else metavar,
                type=s.kind,
                choices=s.choices,
                default=None,
                help=help_text,
            )


def _from_env(env: Mapping[str, str], s: Setting) -> Any:
    if s.env is None:
        return s.default
    if s.kind is float:
        return _float(env, s.env, float(str(s.default)))
    if s.kind is bool:
        return _bool(env, s.env, bool(s.default))
    if s.kind is int:
        return _int(env, s.env, s.default)
    raw = _str(env, s.env)
    if raw is None:
        return s.default
    if s.choices is not None and raw not in s.choices:
        raise SettingsError(f"{s.env}={raw!r} is not one of {', '.join(s.choices)}")
    return raw


def from_env_and_flags(
    env: Mapping[str, str], ns: argparse.Namespace, engine_args: Sequence[str]
) -> AgentSettings:
    """Combine the renderer's environment with command-line flags (flags win)."""
    values: dict[str, Any] = {}
    for s in SETTINGS:
        given = getattr(ns, s.name, None) if s.flag is not None else None
        values[s.name] = _from_env(env, s) if given is None else given
    if values["served_model_name"] is None:
        values["served_model_name"] = flag_value(engine_args, EngineFlag.SERVED_MODEL_NAME)
    api_key = flag_value(engine_args, EngineFlag.API_KEY) or _str(env, Env.API_KEY)
    settings = AgentSettings(**values, engine_args=tuple(engine_args), api_key=api_key)
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
    variable = contract.row("agent_socket").env
    return (source.get(variable) if variable else None) or DEFAULTS.agent_socket
