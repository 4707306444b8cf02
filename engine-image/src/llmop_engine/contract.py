"""The operator ↔ engine-agent contract: command line, environment, ports, paths and defaults.

The operator's renderer (`llmop.render.engine_args`) writes a container's `args` and `env` from
these names; the agent (`llmop_engine.agent_settings`) reads them back with the same names. The
model downloader's contract lives here too: the Job's command line (`llmop.render.model_cache`
writes it, `llmop_engine.download` parses it), its exit codes (the Job's failure policy), and the
keys of its `GET /progress` answer (`llmop_engine.download_progress` writes them, the operator
reads them into status.model.download). Both sides import this module and nothing else of each
other, so a renamed variable or flag cannot drift apart silently. It is stdlib-only and free of
I/O: the simulator image ships only `llmop_engine`, and the operator imports this one module from
it. `docs/engine-contract.md` describes the same contract for humans;
`tests/unit/test_engine_contract.py` renders a real Deployment and feeds its args and env through
the agent's own parser.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Final, Literal, TypeVar, get_args, get_origin, get_type_hints

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
HOLD: Final = "hold"
"""Subcommand of the image pre-pull pods: do nothing until SIGTERM (the image is on the node
while it runs)."""

Backend = Literal["vllm", "simulator"]
BACKENDS: Final[tuple[Backend, ...]] = ("vllm", "simulator")
"""Engines the agent can launch (`--backend`, `LLMOP_BACKEND`)."""

Role = Literal["leader", "worker"]
"""The agent's part in a multi-node group (`--role`, `LLMOP_ROLE`): `leader` serves the API (a
single-pod engine is a leader), `worker` supervises a headless rank (`vllm serve --headless`)."""


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
    MASTER_ADDR: Final = "--master-addr"
    """Multi-node (`--nnodes`): the leader's address; a worker agent watches its rendezvous."""
    MASTER_PORT: Final = "--master-port"
    ENABLE_LORA: Final = "--enable-lora"
    MAX_LORAS: Final = "--max-loras"
    MAX_CPU_LORAS: Final = "--max-cpu-loras"
    MAX_LORA_RANK: Final = "--max-lora-rank"
    BLOCK_SIZE: Final = "--block-size"
    """Tokens per KV cache block (vLLM's default 16 where unset)."""
    NUM_GPU_BLOCKS_OVERRIDE: Final = "--num-gpu-blocks-override"
    """vLLM's flag that fixes the KV cache's block count instead of profiling GPU memory. The
    renderer gives it to the simulator only: the blocks of the planned KV cache, so a simulated
    engine has the capacity its (simulated) GPU would have."""


DEFAULT_BLOCK_SIZE: Final = 16
"""vLLM's default `--block-size` in tokens (CUDA; the CPU build uses 128), the simulator's too:
the block the renderer counts the planned KV cache in when `engine.args` sets none."""


MASTER_PORT: Final = 29501
"""vLLM's default `--master-port` (0.32): the leader's rendezvous (torch TCPStore)."""
MASTER_ADDR: Final = "127.0.0.1"
"""vLLM's default `--master-addr`."""


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
    """Variables outside the settings table: vLLM's and the Hub's own, and the drain mark."""

    API_KEY: Final = "VLLM_API_KEY"
    """vLLM's own variable; the agent reads it for its deep probes."""
    DRAIN_FLAG: Final = "LLMOP_DRAIN_FLAG"
    """Set by the agent on the engine process (never rendered): the path of a file that exists
    once the pod drains; the engine then answers every response `Connection: close`."""
    HTTP_KEEP_ALIVE_SECONDS: Final = "VLLM_HTTP_TIMEOUT_KEEP_ALIVE"
    """vLLM's own variable: seconds uvicorn keeps an idle keep-alive connection open (the
    simulator reads it too). The agent's drain does not end before that long has passed."""
    HF_TOKEN: Final = "HF_TOKEN"
    """The Hub's own token variable: never rendered. A variable is inherited by every child
    process and shows in `/proc/<pid>/environ` and crash reports; the token arrives as a file
    (`HF_TOKEN_PATH`) instead."""
    HF_TOKEN_PATH: Final = "HF_TOKEN_PATH"
    """`huggingface_hub`'s own variable (and so vLLM's): the file its `get_token()` reads when
    `HF_TOKEN` is unset. The renderer points it at the mounted Secret key `HF_TOKEN_FILE`."""
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
HF_TOKEN_DIR: Final = "/var/run/secrets/llmop/hf-token"
"""Where the renderer mounts spec.model.tokenSecretRef's Secret (read-only, the one key)."""
HF_TOKEN_FILE: Final = f"{HF_TOKEN_DIR}/token"
"""The token file itself: `HF_TOKEN_PATH` names it."""
AGENT_SOCKET: Final = "/tmp/llmop-agent.sock"
"""Default drain socket; the renderer points `LLMOP_AGENT_SOCKET` into a memory volume."""

# --- LoRA adapters -----------------------------------------------------------------------------

ADAPTERS_DIR: Final = "/etc/llmop/adapters"
"""Where the ConfigMap `<name>-adapters` is mounted (a directory, never a subPath: the kubelet
then swaps the file in place when the ConfigMap changes, and the agent follows it)."""
ADAPTERS_FILE: Final = "adapters.json"
"""The ConfigMap's one key: `{"adapters": [AdapterKey...]}`, the desired adapter set."""
ADAPTER_STORE: Final = "/var/lib/llmop/adapters"
"""Default directory the agent fetches Hub adapters into when the model has no cache claim (a
pod-local emptyDir the renderer mounts); with a cache it is `<cache>/llmop-adapters`."""
ADAPTER_STORE_IN_CACHE: Final = "llmop-adapters"
"""The adapters' folder under the model cache's mount (one copy shared by every pod)."""
ADAPTER_LOADED_METRIC: Final = "llmop_engine_adapter_loaded"
"""Per-pod gauge, label `adapter`: 1 while the adapter is registered in the engine (vLLM itself
exports no per-adapter series)."""


class AdapterKey:
    """Keys of one entry of `adapters.json` (written by the operator, read by the agent)."""

    NAME: Final = "name"
    """The OpenAI `model` value clients send (`spec.adapters[].name`)."""
    REPO: Final = "repo"
    """Hub repository id for `hf://` sources, else null."""
    REVISION: Final = "revision"
    """The Hub revision to fetch (a commit sha when pinned), else null."""
    PATH: Final = "path"
    """Absolute path inside the pod for `pvc://` sources (the claim's mount + the path), else
    null: the agent fetches `repo` at `revision` into its store and loads from there."""


AdapterPhase = Literal["Pending", "Fetching", "Loading", "Loaded", "Failed"]
ADAPTER_PHASES: Final[tuple[AdapterPhase, ...]] = get_args(AdapterPhase)
"""An adapter's phase in one pod, as the agent's `/status` `adapters[].phase` reports it."""


class AdapterStatusKey:
    """Keys of one entry of the agent's `/status` `adapters` list."""

    NAME: Final = "name"
    PHASE: Final = "phase"
    MESSAGE: Final = "message"
    """Why it failed or waits (vLLM's own message for a refused load), else null."""
    REVISION: Final = "revision"
    RANK: Final = "rank"
    """`r` from the adapter's `adapter_config.json`, once read, else null."""


LORA_RUNTIME_ENV: Final = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
"""vLLM's own variable: serves `/v1/load_lora_adapter` and `/v1/unload_lora_adapter`."""
LOAD_LORA_PATH: Final = "/v1/load_lora_adapter"
UNLOAD_LORA_PATH: Final = "/v1/unload_lora_adapter"


# --- Compile cache -----------------------------------------------------------------------------

COMPILE_CACHE_DIR: Final = ".llmop/compile"
"""Under the model cache's mount: one directory per compile cache entry (`llmop_engine.
compile_cache`), named by `LLMOP_COMPILE_CACHE_KEY` and the node's platform."""
COMPILE_CACHE_LOCAL_DIR: Final = "/tmp/llmop-compile-cache"
"""The engine's private copy (the container's own filesystem): the engine never writes to the
shared entry, so a crash or a concurrent pod cannot leave it half-written."""
COMPILE_CACHE_KEEP: Final = 4
"""Entries kept per model cache; each is a few MB to a few GB."""


# --- Where a start went -------------------------------------------------------------------------

STARTUP_KEY: Final = "startup"
"""The agent's `/status` key: `{"phases": {phase: seconds}, "totalSeconds", "compileHit",
"graphCaptureSeconds"}` (`llmop_engine.startup_log`)."""
STARTUP_PHASES_KEY: Final = "phases"
STARTUP_PHASES: Final = (
    "agentStart",
    "prepare",
    "engineStart",
    "weights",
    "compile",
    "warmup",
    "apiStart",
    "firstProbe",
    "untraced",
)
"""The phases of the engine's part of a start, in order; each is in `phases` once both its ends
were seen; `untraced` (what no line accounts for) once the engine is ready."""
STARTUP_PHASE_METRIC: Final = "llmop_engine_startup_phase_seconds"


# --- Timings that are not settings ---------------------------------------------------------------

ENGINE_EXIT_GRACE_SECONDS: Final = 10
"""After the drain's final SIGTERM, how long the engine gets to exit before the agent SIGKILLs its
process tree. vLLM aborting what is left and exiting: 0.6 s idle, 4.3 s with 8 streams aborted on
a loaded 2-core node (measured); about twice that. The renderer's grace-period margin counts it."""
HTTP_KEEP_ALIVE_SECONDS: Final = 5
"""vLLM's default for `VLLM_HTTP_TIMEOUT_KEEP_ALIVE` (0.32); the simulator uses the same."""
CLOSE_ON_DRAIN_MIDDLEWARE: Final = "llmop_engine.connection_close.CloseOnDrain"
"""The ASGI middleware the agent passes to `vllm serve --middleware` (see `Env.DRAIN_FLAG`)."""
DOWNLOAD_DEADLINE_SECONDS: Final = 6 * 3600
"""The downloader's own deadline: 6 h moves 1 TiB at 50 MB/s; a stuck download fails visibly."""


# --- The agent's settings: one table ------------------------------------------------------------

T = TypeVar("T")

_SETTING = "llmop.setting"
"""Metadata key of a table row on its `AgentSettings` field."""


@dataclass(frozen=True)
class _Row:
    flag: str | None
    env: str | None
    spec: str | None
    help: str


def setting(
    default: T,
    *,
    help: str,
    flag: str | None = None,
    env: str | None = None,
    spec: str | None = None,
) -> T:
    """A field of the settings table: its default, the `run` flag and the variable that set it
    (flag wins), and `spec`, the CR field (camelCase path under `spec`) the operator renders
    into the variable."""
    return field(default=default, metadata={_SETTING: _Row(flag, env, spec, help)})


@dataclass(frozen=True)
class AgentSettings:
    """Everything the agent needs to supervise, probe and drain one engine: the one table of its
    settings. Each row is typed, has its default, and names its flag, its variable and the CR
    field it comes from; the agent's parser and environment reader, the health policy's defaults,
    the CRD's defaults, the operator's rendering and the table in docs/engine-contract.md are all
    made from it. A new setting is a row here (plus its API field when users set it)."""

    backend: Backend = setting(
        "vllm",
        flag="--backend",
        env="LLMOP_BACKEND",
        help="engine to launch (the simulator image sets `simulator`)",
    )
    role: Role = setting(
        "leader",
        flag="--role",
        env="LLMOP_ROLE",
        help="part in a multi-node group: `leader` serves the API (single-pod engines too), "
        "`worker` supervises a headless rank and watches the leader's rendezvous port",
    )
    api_port: int = setting(API_PORT, flag="--port", help="engine API port (`service.port`)")
    probe_port: int = setting(PROBE_PORT, flag="--probe-port", help="agent probe port")
    probe_host: str = setting(PROBE_HOST, flag="--probe-host", help="probe bind address")
    served_model_name: str | None = setting(
        None,
        env="LLMOP_SERVED_MODEL_NAME",
        help="model name of the deep probe (unset: `--served-model-name` of the engine flags, "
        "else the first id from `/v1/models`)",
    )
    stall_seconds: float = setting(
        60,
        flag="--stall-seconds",
        env="LLMOP_STALL_SECONDS",
        spec="health.stallSeconds",
        help="pending work with no generated-token progress for this long → `/livez` fails",
    )
    load_timeout_seconds: float = setting(
        1800,
        flag="--load-timeout-seconds",
        env="LLMOP_LOAD_TIMEOUT_SECONDS",
        spec="health.loadTimeoutSeconds",
        help="budget for the engine to start listening once the process runs (the operator "
        "derives one from the model size when the field is unset)",
    )
    deep_probe_enabled: bool = setting(
        True,
        flag="--deep-probe",
        env="LLMOP_DEEP_PROBE_ENABLED",
        spec="health.deepProbe.enabled",
        help="send idle one-token probes (`true`/`false`; `--no-deep-probe`)",
    )
    deep_probe_interval_seconds: float = setting(
        10,
        flag="--deep-probe-interval-seconds",
        env="LLMOP_DEEP_PROBE_INTERVAL_SECONDS",
        spec="health.deepProbe.intervalSeconds",
        help="idle one-token probe interval",
    )
    deep_probe_timeout_seconds: float = setting(
        5,
        flag="--deep-probe-timeout-seconds",
        env="LLMOP_DEEP_PROBE_TIMEOUT_SECONDS",
        spec="health.deepProbe.timeoutSeconds",
        help="deadline of one deep probe",
    )
    deep_probe_prompt: str = setting(
        "ping",
        flag="--deep-probe-prompt",
        env="LLMOP_DEEP_PROBE_PROMPT",
        spec="health.deepProbe.prompt",
        help="prompt of the deep probe",
    )
    endpoint_propagation_seconds: float = setting(
        5,
        flag="--endpoint-propagation-seconds",
        env="LLMOP_ENDPOINT_PROPAGATION_SECONDS",
        spec="rollout.endpointPropagationSeconds",
        help="wait after readiness flips off before the drain goes on",
    )
    drain_seconds: float = setting(
        30,
        flag="--drain-seconds",
        env="LLMOP_DRAIN_SECONDS",
        spec="rollout.drainSeconds",
        help="upper bound for in-flight work to finish",
    )
    model_cache_dir: str | None = setting(
        None,
        flag="--model-cache-dir",
        env="LLMOP_MODEL_CACHE_DIR",
        help="directory whose growth counts as download progress",
    )
    agent_socket: str = setting(
        AGENT_SOCKET,
        flag="--socket",
        env="LLMOP_AGENT_SOCKET",
        help=f"unix socket of `{ENTRYPOINT} {DRAIN}`",
    )
    poll_interval_seconds: float = setting(
        1.0,
        flag="--poll-interval-seconds",
        env="LLMOP_POLL_INTERVAL_SECONDS",
        help="how often the agent reads the engine's `/health` and `/metrics`",
    )
    engine_keep_alive_seconds: float = setting(
        HTTP_KEEP_ALIVE_SECONDS,
        env=Env.HTTP_KEEP_ALIVE_SECONDS,
        help="vLLM's idle keep-alive timeout (its own variable): the drain's quiet period, so "
        "that idle pooled connections are closed before the engine exits",
    )
    adapters_dir: str | None = setting(
        None,
        flag="--adapters-dir",
        env="LLMOP_ADAPTERS_DIR",
        help=f"directory holding `{ADAPTERS_FILE}`, the desired LoRA adapters (the mounted "
        "ConfigMap); unset: no adapters",
    )
    adapter_store: str = setting(
        ADAPTER_STORE,
        flag="--adapter-store",
        env="LLMOP_ADAPTER_STORE",
        help="directory Hub adapters are fetched into (the model cache's when there is one)",
    )
    adapter_ready_timeout_seconds: float = setting(
        600,
        flag="--adapter-ready-timeout-seconds",
        env="LLMOP_ADAPTER_READY_TIMEOUT_SECONDS",
        help="how long a new pod's readiness waits for adapters that keep failing transiently "
        "(deterministic failures never wait); past it the pod serves the base and retries",
    )
    compile_cache_key: str | None = setting(
        None,
        flag="--compile-cache-key",
        env="LLMOP_COMPILE_CACHE_KEY",
        help="key of the engine's compiled artifacts on the model cache (`<model-cache-dir>/"
        f"{COMPILE_CACHE_DIR}/<key>-<platform>`), rendered when `model.cache.compileCache` is "
        "on; unset: no persistent compile cache",
    )
    compile_cache_local_dir: str = setting(
        COMPILE_CACHE_LOCAL_DIR,
        flag="--compile-cache-local-dir",
        env="LLMOP_COMPILE_CACHE_LOCAL_DIR",
        help="the engine's private compile cache: seeded from the model cache before the engine "
        "starts, published back once it is ready",
    )
    compile_cache_keep: int = setting(
        COMPILE_CACHE_KEEP,
        flag="--compile-cache-keep",
        env="LLMOP_COMPILE_CACHE_KEEP",
        help="compile cache entries kept on the model cache (the least recently used go first)",
    )
    # Not rows: the engine's command line, and the API key the deep probe sends (the engine
    # flag `--api-key`, else vLLM's own `VLLM_API_KEY`, a Secret the operator references).
    engine_args: tuple[str, ...] = ()
    api_key: str | None = None


@dataclass(frozen=True)
class Setting:
    """One row of the settings table, as its readers and writers use it."""

    name: str
    """The `AgentSettings` field."""
    kind: type[float] | type[int] | type[bool] | type[str]
    optional: bool
    choices: tuple[str, ...] | None
    default: object
    flag: str | None
    env: str | None
    spec: str | None
    help: str


def _rows() -> tuple[Setting, ...]:
    hints = get_type_hints(AgentSettings)
    rows = []
    for f in fields(AgentSettings):
        row = f.metadata.get(_SETTING)
        if not isinstance(row, _Row):
            continue
        hint = hints[f.name]
        args = [a for a in get_args(hint) if a is not type(None)]
        optional = len(args) < len(get_args(hint))
        if get_origin(hint) is Literal:
            kind, choices = str, tuple(str(a) for a in get_args(hint))
        else:
            kind, choices = (args[0] if optional else hint), None
        rows.append(
            Setting(
                f.name, kind, optional, choices, f.default, row.flag, row.env, row.spec, row.help
            )
        )
    return tuple(rows)


SETTINGS: Final = _rows()
"""The table's rows in declaration order (the order the renderer writes the variables in)."""
DEFAULTS: Final = AgentSettings()
"""The table's defaults, typed: what an absent flag and an absent variable leave."""


def row(name: str) -> Setting:
    """The row of one setting (`row("agent_socket").env`)."""
    for s in SETTINGS:
        if s.name == name:
            return s
    raise KeyError(f"no agent setting {name!r}")


def run_args(
    *, backend: str, api_port: int, probe_port: int, engine_args: Sequence[str]
) -> list[str]:
    """Container args of the engine: `run`, the agent's flags, `--`, the engine's flags."""
    own = {"backend": backend, "api_port": str(api_port), "probe_port": str(probe_port)}
    flags = [part for name, value in own.items() for part in (_flag(name), value)]
    return [RUN, *flags, ENGINE_ARGS_SEPARATOR, *engine_args]


def _flag(name: str) -> str:
    flag = row(name).flag
    if flag is None:
        raise KeyError(f"agent setting {name!r} has no flag")
    return flag


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


def flag_value(args: Sequence[str], flag: str) -> str | None:
    """The value of `--flag value` or `--flag=value` in an engine command line: the last one
    given, as vLLM's argparse takes it (the renderer puts `engine.args` last so that a user's
    flag wins); None when absent."""
    value: str | None = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1 :]
    return value
