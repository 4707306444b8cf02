"""The operator ↔ engine-agent contract: command line, environment, ports, paths and defaults.

The operator's renderer (`llmop.render.engine_args`) writes a container's `args` and `env` from
these names; the agent (`llmop_engine.settings`) reads them back with the same names. The model
downloader's contract lives here too: the Job's command line (`llmop.render.model_cache` writes
it, `llmop_engine.download` parses it), its exit codes (the Job's failure policy), and the keys
of its `GET /progress` answer (`llmop_engine.download_progress` writes them, the operator reads
them into status.model.download). Both sides
import this module and nothing else of each other, so a renamed variable or flag cannot drift
apart silently. It is stdlib-only and free of I/O: the simulator image ships only
`llmop_engine`, and the operator imports this one module from it. `docs/engine-contract.md`
describes the same contract for humans; `tests/unit/test_engine_contract.py` renders a real
Deployment and feeds its args and env through the agent's own parser.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Literal

# --- Command line -------------------------------------------------------------------------------

ENTRYPOINT: Final = "llmop-engine"
"""The image's entrypoint; container `args` start with a subcommand."""
RUN: Final = "run"
"""Subcommand that supervises the engine (PID 1)."""
DRAIN: Final = "drain"
"""Subcommand of the preStop hook."""
ENGINE_ARGS_SEPARATOR: Final = "--"
"""Everything after it goes to the engine unchanged."""
DOWNLOAD: Final = "download"
"""Subcommand of the model cache's download Job: fill the cache once, with progress."""

Backend = Literal["vllm", "simulator"]
BACKENDS: Final[tuple[Backend, ...]] = ("vllm", "simulator")
"""Engines the agent can launch (`--backend`, `LLMOP_BACKEND`)."""


class Flag:
    """Flags of `llmop-engine run` (each overrides its environment variable)."""

    BACKEND: Final = "--backend"
    PORT: Final = "--port"
    PROBE_PORT: Final = "--probe-port"
    PROBE_HOST: Final = "--probe-host"
    STALL_SECONDS: Final = "--stall-seconds"
    LOAD_TIMEOUT_SECONDS: Final = "--load-timeout-seconds"
    DEEP_PROBE: Final = "--deep-probe"
    DEEP_PROBE_INTERVAL_SECONDS: Final = "--deep-probe-interval-seconds"
    DEEP_PROBE_TIMEOUT_SECONDS: Final = "--deep-probe-timeout-seconds"
    DEEP_PROBE_PROMPT: Final = "--deep-probe-prompt"
    ENDPOINT_PROPAGATION_SECONDS: Final = "--endpoint-propagation-seconds"
    DRAIN_SECONDS: Final = "--drain-seconds"
    MODEL_CACHE_DIR: Final = "--model-cache-dir"
    SOCKET: Final = "--socket"
    POLL_INTERVAL_SECONDS: Final = "--poll-interval-seconds"


class EngineFlag:
    """vLLM flags the renderer writes after `--` and the agent reads back from there."""

    SERVED_MODEL_NAME: Final = "--served-model-name"
    REVISION: Final = "--revision"
    SHUTDOWN_TIMEOUT: Final = "--shutdown-timeout"
    API_KEY: Final = "--api-key"
    HOST: Final = "--host"
    PORT: Final = "--port"
    ENABLE_SERVER_LOAD_TRACKING: Final = "--enable-server-load-tracking"
    """Makes vLLM's `GET /load` count in-flight HTTP requests: the agent's drain waits on it."""
    MIDDLEWARE: Final = "--middleware"
    """An extra ASGI middleware by import path: the agent adds `CLOSE_ON_DRAIN_MIDDLEWARE`."""


class DownloadFlag:
    """Flags of `llmop-engine download`."""

    MODEL: Final = "--model"
    REVISION: Final = "--revision"
    HF_HOME: Final = "--hf-home"
    DEADLINE_SECONDS: Final = "--deadline-seconds"
    MAX_ATTEMPTS: Final = "--max-attempts"
    MAX_WORKERS: Final = "--max-workers"
    INTERVAL: Final = "--interval"
    PROGRESS_FILE: Final = "--progress-file"
    PROGRESS_PORT: Final = "--progress-port"
    TERMINATION_LOG: Final = "--termination-log"


class DownloadExit:
    """Exit codes of `llmop-engine download`; the Job fails at once on FATAL (podFailurePolicy)
    and the operator names each in the Stalled message."""

    OK: Final = 0
    FATAL: Final = 2
    """The Hub refused in a way no retry fixes (access, unknown repo, revision or file)."""
    DEADLINE: Final = 3
    ATTEMPTS: Final = 4


class ProgressKey:
    """Keys of the downloader's `GET /progress` JSON (camelCase, as status.model.download)."""

    PHASE: Final = "phase"
    BYTES_DONE: Final = "bytesDone"
    BYTES_TOTAL: Final = "bytesTotal"
    RATE_BYTES_PER_SECOND: Final = "rateBytesPerSecond"
    ETA_SECONDS: Final = "etaSeconds"
    ATTEMPT: Final = "attempt"
    MESSAGE: Final = "message"


PROGRESS_RETRYING: Final = "retrying"
"""The `phase` value while the downloader waits to retry after a network failure."""


class Env:
    """Environment variables the renderer sets and the agent reads (all optional)."""

    BACKEND: Final = "LLMOP_BACKEND"
    SERVED_MODEL_NAME: Final = "LLMOP_SERVED_MODEL_NAME"
    STALL_SECONDS: Final = "LLMOP_STALL_SECONDS"
    LOAD_TIMEOUT_SECONDS: Final = "LLMOP_LOAD_TIMEOUT_SECONDS"
    DEEP_PROBE_ENABLED: Final = "LLMOP_DEEP_PROBE_ENABLED"
    DEEP_PROBE_INTERVAL_SECONDS: Final = "LLMOP_DEEP_PROBE_INTERVAL_SECONDS"
    DEEP_PROBE_TIMEOUT_SECONDS: Final = "LLMOP_DEEP_PROBE_TIMEOUT_SECONDS"
    DEEP_PROBE_PROMPT: Final = "LLMOP_DEEP_PROBE_PROMPT"
    ENDPOINT_PROPAGATION_SECONDS: Final = "LLMOP_ENDPOINT_PROPAGATION_SECONDS"
    DRAIN_SECONDS: Final = "LLMOP_DRAIN_SECONDS"
    MODEL_CACHE_DIR: Final = "LLMOP_MODEL_CACHE_DIR"
    AGENT_SOCKET: Final = "LLMOP_AGENT_SOCKET"
    POLL_INTERVAL_SECONDS: Final = "LLMOP_POLL_INTERVAL_SECONDS"
    API_KEY: Final = "VLLM_API_KEY"
    """vLLM's own variable; the agent reads it for its deep probes."""
    DRAIN_FLAG: Final = "LLMOP_DRAIN_FLAG"
    """Set by the agent on the engine process (never rendered): the path of a file that exists
    once the pod drains; the engine then answers every response `Connection: close`."""
    HTTP_KEEP_ALIVE_SECONDS: Final = "VLLM_HTTP_TIMEOUT_KEEP_ALIVE"
    """vLLM's own variable: seconds uvicorn keeps an idle keep-alive connection open (the
    simulator reads it too). The agent's drain does not end before that long has passed."""
    HF_TOKEN: Final = "HF_TOKEN"
    HF_HOME: Final = "HF_HOME"
    HF_HUB_OFFLINE: Final = "HF_HUB_OFFLINE"
    """`huggingface_hub` (and so vLLM) reads only its local cache: set with a model cache."""
    VLLM_CPU_KVCACHE_SPACE: Final = "VLLM_CPU_KVCACHE_SPACE"
    """vLLM's CPU build: GiB of host memory for the KV cache (the renderer sets it when
    `resources.gpus` is 0; the planner checks it against the pod's memory)."""


TRUE: Final = "true"
FALSE: Final = "false"
TRUE_WORDS: Final = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS: Final = frozenset({"0", "false", "no", "off"})


def encode_bool(value: bool) -> str:
    """How the renderer spells a boolean variable."""
    return TRUE if value else FALSE


# --- Ports and paths ----------------------------------------------------------------------------

API_PORT: Final = 8000
"""The engine's OpenAI-compatible API (`--port`; the CR's `service.port` overrides it)."""
PROBE_PORT: Final = 8081
"""The agent's probe and metrics port (`--probe-port`), never the API port."""
PROBE_HOST: Final = "0.0.0.0"
LIVEZ_PATH: Final = "/livez"
READYZ_PATH: Final = "/readyz"
STATUS_PATH: Final = "/status"
METRICS_PATH: Final = "/metrics"
LOAD_PATH: Final = "/load"
"""The engine's in-flight request count (`{"server_load": N}`), read by the agent's drain."""
QUEUE_DEPTH_METRIC: Final = "llmop_engine_queue_depth"
"""Per-pod gauge of waiting requests (the HPA's Pods metric via prometheus-adapter)."""
PROGRESS_PATH: Final = "/progress"
"""The downloader's progress (JSON, `ProgressKey`), served on the probe port."""
AGENT_SOCKET: Final = "/tmp/llmop-agent.sock"
"""Default drain socket; the renderer points `LLMOP_AGENT_SOCKET` into a memory volume."""

# --- Defaults (the CRD's defaults are these same values) ------------------------------------------

STALL_SECONDS: Final = 60
LOAD_TIMEOUT_SECONDS: Final = 1800
"""Load budget when nothing better is known (the operator derives one from the model size)."""
DEEP_PROBE_ENABLED: Final = True
DEEP_PROBE_INTERVAL_SECONDS: Final = 10
DEEP_PROBE_TIMEOUT_SECONDS: Final = 5
DEEP_PROBE_PROMPT: Final = "ping"
ENDPOINT_PROPAGATION_SECONDS: Final = 5
DRAIN_SECONDS: Final = 30
ENGINE_EXIT_GRACE_SECONDS: Final = 10
"""After the drain's final SIGTERM, how long the engine gets to exit before the agent SIGKILLs its
process tree. vLLM aborting what is left and exiting: 0.6 s idle, 4.3 s with 8 streams aborted on
a loaded 2-core node (measured); about twice that. The renderer's grace-period margin counts it."""
HTTP_KEEP_ALIVE_SECONDS: Final = 5
"""vLLM's default for `VLLM_HTTP_TIMEOUT_KEEP_ALIVE` (0.32); the simulator uses the same."""
CLOSE_ON_DRAIN_MIDDLEWARE: Final = "llmop_engine.connection_close.CloseOnDrain"
"""The ASGI middleware the agent passes to `vllm serve --middleware` (see `Env.DRAIN_FLAG`)."""
POLL_INTERVAL_SECONDS: Final = 1.0
"""How often the agent reads the engine's /health and /metrics (agent-only; not rendered)."""
DOWNLOAD_DEADLINE_SECONDS: Final = 6 * 3600
"""The downloader's own deadline: 6 h moves 1 TiB at 50 MB/s; a stuck download fails visibly."""


def run_args(
    *, backend: str, api_port: int, probe_port: int, engine_args: Sequence[str]
) -> list[str]:
    """Container args of the engine: `run`, the agent's flags, `--`, the engine's flags."""
    return [
        RUN,
        Flag.BACKEND,
        backend,
        Flag.PORT,
        str(api_port),
        Flag.PROBE_PORT,
        str(probe_port),
        ENGINE_ARGS_SEPARATOR,
        *engine_args,
    ]


def split_engine_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the agent's own args, the engine's args) of a `run` command line."""
    args = list(argv)
    if ENGINE_ARGS_SEPARATOR in args:
        i = args.index(ENGINE_ARGS_SEPARATOR)
        return args[:i], args[i + 1 :]
    return args, []


def drain_flag_path(agent_socket: str) -> str:
    """Where the agent marks the drain for the engine: beside its socket, in the pod's private
    memory volume (the renderer's), so nothing outside the pod can set or clear it."""
    return agent_socket + ".draining"


def drain_command() -> list[str]:
    """The preStop exec command."""
    return [ENTRYPOINT, DRAIN]
