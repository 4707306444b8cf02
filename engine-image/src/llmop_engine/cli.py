"""`llmop-engine run | drain | simulate`: the engine image's entrypoint.

- `run [--backend vllm|simulator] [--port 8000] [--probe-port 8081] [flags] [-- <engine args>]`
  is PID 1: it launches the engine, serves probes, drains on SIGTERM, exits with the engine's code.
- `drain` is the preStop hook: asks the agent over its unix socket to drain, waits for it.
- `simulate [<model>] [vLLM flags] [--sim-* flags]` runs the vLLM simulator in the foreground.
- `download --model org/name [--revision sha] [--hf-home /models]` fills a model cache from the
  Hugging Face Hub (the operator's download Job; see `download.py`).
- `hold` does nothing until SIGTERM or SIGINT: the image pre-pull pods
  (`spec.scheduling.prePullImage`) keep the image on their node by running it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence

from llmop_engine import __version__


def _setup_logging(name: str) -> None:
    logging.basicConfig(
        level=os.environ.get("LLMOP_LOG_LEVEL", "INFO").upper(),
        format=f"%(asctime)s %(levelname)s {name}: %(message)s",
        stream=sys.stderr,
    )


def _run(argv: Sequence[str]) -> int:
    from llmop_engine.agent_settings import parse_run_args

    settings = parse_run_args(argv, os.environ)
    _setup_logging("agent")
    if settings.role == "worker":
        from llmop_engine.worker_agent import run as run_worker

        return run_worker(settings)
    from llmop_engine.supervisor import FIRST_LINE_WAIT_SECONDS, start_early

    # The engine first: the agent's own imports (about a second on a busy node) then overlap
    # the engine's start instead of preceding it.
    early = start_early(settings)
    if early is not None:
        early.lines.wait_first(FIRST_LINE_WAIT_SECONDS)
    from llmop_engine.agent import run as run_agent

    return run_agent(settings, early)


def _drain(argv: Sequence[str]) -> int:
    from llmop_engine.agent_settings import socket_path
    from llmop_engine.drain import request_drain

    parser = argparse.ArgumentParser(
        prog="llmop-engine drain",
        description="preStop hook: tell the agent (over its unix socket) to drain, and wait.",
    )
    parser.add_argument(
        "--socket", default=None, help="[LLMOP_AGENT_SOCKET or /tmp/llmop-agent.sock]"
    )
    parser.add_argument("--no-wait", action="store_true", help="return once the drain started")
    parser.add_argument("--timeout", type=float, default=600.0, help="give up waiting after this")
    ns = parser.parse_args(argv)
    _setup_logging("drain")
    return asyncio.run(request_drain(ns.socket or socket_path(), not ns.no_wait, ns.timeout))


def _simulate(argv: Sequence[str]) -> int:
    # The simulator opens no TLS connection, yet importing aiohttp builds a verified TLS
    # context, loading the system's CA bundle (~25 ms of CPU: 0.1 s of a wake at the sample's
    # 250m). With an empty CA file that context is empty and cheap. This process only: the
    # agent and vLLM keep the system's.
    os.environ.setdefault("SSL_CERT_FILE", os.devnull)
    from llmop_engine.simulator import server, sim_config

    if any(a in ("-h", "--help") for a in argv):
        sim_config.build_parser().print_help()
        return 0
    _setup_logging("simulator")
    return server.run(sim_config.parse(argv))


def _download(argv: Sequence[str]) -> int:
    from llmop_engine import download

    _setup_logging("download")
    return download.main(argv)


def _hold(argv: Sequence[str]) -> int:
    """Wait for SIGTERM/SIGINT and exit 0 at once (a pre-pull pod's whole life)."""
    if argv:
        print(f"llmop-engine hold takes no arguments, got {' '.join(argv)!r}", file=sys.stderr)
        return 2
    stop = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    signal.sigwait(stop)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    commands = {
        "run": _run,
        "drain": _drain,
        "simulate": _simulate,
        "download": _download,
        "hold": _hold,
    }
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    if args[0] == "--version":
        print(__version__)
        return 0
    command = commands.get(args[0])
    if command is None:
        print(
            f"llmop-engine: unknown command {args[0]!r}; one of {', '.join(commands)}",
            file=sys.stderr,
        )
        return 2
    return command(args[1:])
