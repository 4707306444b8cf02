"""The operator's settings, read once at startup from flags and `LLMOP_*` environment variables
into a frozen `OperatorConfig` (flags win over the environment, the environment over defaults).

The environment is a parameter, so tests pass a dict and nothing here reads `os.environ`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from llmop.router_view import RouterRef
from llmop.settings import (
    DEFAULT_GPU_RESOURCE_NAME,
    DEFAULT_SIMULATOR_IMAGE,
    DEFAULT_VLLM_CPU_IMAGE,
    DEFAULT_VLLM_IMAGE,
    RenderSettings,
    parse_peers,
)

ENV_PREFIX = "LLMOP_"
LOG_FORMATS = ("json", "text")


class ConfigError(ValueError):
    """A setting has a value the operator cannot run with."""


@dataclass(frozen=True)
class OperatorConfig:
    """Everything the operator is configured with."""

    namespaces: tuple[str, ...] = ()
    """Namespaces to watch; empty means all namespaces (cluster-wide)."""
    standalone: bool = True
    """Run without kopf peering (one operator replica)."""
    peering_name: str | None = None
    """kopf peering object to join when not standalone."""
    priority: int = 0
    """kopf peering priority (the highest alive operator works; the others wait)."""
    liveness_port: int = 8080
    """Port of kopf's liveness endpoint `/healthz` (0 disables it)."""
    metrics_port: int = 9090
    """Port of the Prometheus `/metrics` endpoint (0 disables it)."""
    bind_address: str = "0.0.0.0"
    """Address the liveness and metrics endpoints listen on."""
    vllm_image: str = DEFAULT_VLLM_IMAGE
    """Default engine image for `backend: vllm`."""
    simulator_image: str = DEFAULT_SIMULATOR_IMAGE
    """Default engine image for `backend: simulator`."""
    vllm_cpu_image: str = DEFAULT_VLLM_CPU_IMAGE
    """Default engine image for `backend: vllm` without GPUs (vLLM's CPU build)."""
    service_monitor: bool = False
    """Render a prometheus-operator ServiceMonitor per LLMDeployment."""
    image_pull_policy: str = "IfNotPresent"
    """Pull policy of engine containers."""
    gpu_resource_name: str = DEFAULT_GPU_RESOURCE_NAME
    """GPU extended resource requested for LLMDeployments that name none."""
    hub_endpoint: str | None = None
    """Model hub base URL for the model pre-flight and download Jobs (None: huggingface.co)."""
    network_policy: str | None = None
    """Peers of each CR's engine NetworkPolicy as JSON (`llmop.render.network_policy`); None:
    the operator renders none."""
    router: RouterRef | None = None
    """The installed llmop router (`llmop.router_view`); None: none is installed."""
    serving_namespaces: tuple[str, ...] = ()
    """The namespaces whose LLMDeployments may serve through the router (the chart's
    router.servingNamespaces); empty: all (`llmop.name_owners`)."""
    own_namespace: str | None = None
    """The operator's own namespace (the pod's, `POD_NAMESPACE`): where it keeps its Lease and
    the record of model name owners; None: outside a pod."""
    name_grace_seconds: float = 600.0
    """How long a model name stays reserved to an owner that was deleted (`llmop.name_owners`)."""
    max_workers: int = 16
    """Threads running the synchronous handlers."""
    retry_delay_seconds: float = 10.0
    """Delay before a reconcile that hit a transient API error runs again."""
    request_timeout_seconds: float = 30.0
    """Deadline of one API request made by the operator's own client."""
    agent_read_interval_seconds: float = 10.0
    """Shortest period between two reads of every engine agent's `/status` (it grows with the
    fleet, see `llmop.fleet`); 0 turns agent reads off (no plan.actual, deep-probe Degraded or
    deletion costs)."""
    agent_read_concurrency: int = 32
    """Agent reads in flight at once."""
    log_format: str = "json"
    """`json` (one object per line) or `text`."""
    verbose: bool = False
    """Debug logging."""
    leader_elect: bool = True
    """Reconcile only while holding the leader Lease (`llmop.leader`): replicas beyond the
    first wait as standbys. Off: this process reconciles alone, at once."""

    @property
    def clusterwide(self) -> bool:
        """Watch every namespace."""
        return not self.namespaces

    def render_settings(self) -> RenderSettings:
        """The renderers' view of this config."""
        return RenderSettings(
            vllm_image=self.vllm_image,
            simulator_image=self.simulator_image,
            vllm_cpu_image=self.vllm_cpu_image,
            service_monitor=self.service_monitor,
            image_pull_policy=self.image_pull_policy,
            gpu_resource_name=self.gpu_resource_name,
            hub_endpoint=self.hub_endpoint,
            network_policy=self.network_policy,
        )


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"not a boolean: {text!r}")


def _port(text: str) -> int:
    port = int(text)
    if not 0 <= port <= 65535:
        raise ConfigError(f"not a port: {text!r}")
    return port


def _parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    def default(key: str, fallback: str) -> str:
        return env.get(ENV_PREFIX + key, fallback)

    defaults = OperatorConfig()
    parser = argparse.ArgumentParser(
        prog="llmop run",
        description="Run the LLMDeployment operator (KUBECONFIG or in-cluster credentials).",
    )
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        dest="namespaces",
        help="watch only this namespace (repeatable; env LLMOP_NAMESPACES, comma-separated)",
    )
    scope.add_argument(
        "-A",
        "--all-namespaces",
        action="store_true",
        help="watch every namespace (the default)",
    )
    peering = parser.add_mutually_exclusive_group()
    peering.add_argument(
        "--standalone",
        action="store_true",
        default=None,
        help="run without peering (the default; one operator replica)",
    )
    peering.add_argument("--peering", dest="peering_name", help="join this kopf peering object")
    parser.add_argument("--priority", type=int, default=int(default("PRIORITY", "0")))
    parser.add_argument(
        "--liveness-port",
        type=_port,
        default=_port(default("LIVENESS_PORT", str(defaults.liveness_port))),
        help="port of /healthz (0 disables it)",
    )
    parser.add_argument(
        "--metrics-port",
        type=_port,
        default=_port(default("METRICS_PORT", str(defaults.metrics_port))),
        help="port of the Prometheus /metrics endpoint (0 disables it)",
    )
    parser.add_argument("--bind-address", default=default("BIND_ADDRESS", defaults.bind_address))
    parser.add_argument("--vllm-image", default=default("VLLM_IMAGE", defaults.vllm_image))
    parser.add_argument(
        "--simulator-image", default=default("SIMULATOR_IMAGE", defaults.simulator_image)
    )
    parser.add_argument(
        "--vllm-cpu-image", default=default("VLLM_CPU_IMAGE", defaults.vllm_cpu_image)
    )
    parser.add_argument(
        "--service-monitor",
        action=argparse.BooleanOptionalAction,
        default=_bool(default("SERVICE_MONITOR", "false")),
        help="render a ServiceMonitor per LLMDeployment (needs the prometheus-operator CRDs)",
    )
    parser.add_argument(
        "--network-policy",
        default=default("NETWORK_POLICY", ""),
        help='render a NetworkPolicy per LLMDeployment admitting these peers: JSON {"api": '
        '[NetworkPolicyPeer...], "probe": [...]} (env LLMOP_NETWORK_POLICY; empty: none)',
    )
    parser.add_argument(
        "--image-pull-policy",
        choices=("Always", "IfNotPresent", "Never"),
        default=default("IMAGE_PULL_POLICY", defaults.image_pull_policy),
    )
    parser.add_argument(
        "--gpu-resource-name",
        default=default("GPU_RESOURCE_NAME", defaults.gpu_resource_name),
        help="GPU extended resource for LLMDeployments that set no resources.gpuResourceName",
    )
    parser.add_argument(
        "--hub-endpoint",
        default=default("HUB_ENDPOINT", "") or None,
        help="model hub base URL (HF_ENDPOINT) for pre-flight checks, the capacity plan of "
        "models outside the catalog and download Jobs "
        "[default: the public Hugging Face Hub]",
    )
    parser.add_argument(
        "--router",
        default=default("ROUTER", "") or None,
        help="the installed llmop router as <namespace>/<name>:<port> (its Service and "
        "Deployment): routed LLMDeployments report its URL as their endpoint "
        "[default: no router]",
    )
    parser.add_argument(
        "--router-gateway",
        default=default("ROUTER_GATEWAY", "false"),
        help="the router's gateway is on (it authenticates clients and sends engines no key): "
        "a routed LLMDeployment whose engine wants a key is Degraded EngineKeyBehindGateway",
    )
    parser.add_argument(
        "--serving-namespaces",
        default=default("SERVING_NAMESPACES", ""),
        help="comma-separated namespaces whose LLMDeployments may serve through the router; "
        "the others are Degraded NamespaceNotServed [default: all]",
    )
    parser.add_argument(
        "--name-grace-seconds",
        type=float,
        default=float(default("NAME_GRACE_SECONDS", str(defaults.name_grace_seconds))),
        help="seconds a model name stays reserved to a deleted owner (a recreated CR of the "
        "same namespace/name takes it back)",
    )
    parser.add_argument(
        "--max-workers", type=int, default=int(default("MAX_WORKERS", str(defaults.max_workers)))
    )
    parser.add_argument(
        "--retry-delay",
        type=float,
        dest="retry_delay_seconds",
        default=float(default("RETRY_DELAY_SECONDS", str(defaults.retry_delay_seconds))),
    )
    parser.add_argument(
        "--request-timeout",
        type=float,
        dest="request_timeout_seconds",
        default=float(default("REQUEST_TIMEOUT_SECONDS", str(defaults.request_timeout_seconds))),
    )
    parser.add_argument(
        "--agent-read-interval",
        type=float,
        dest="agent_read_interval_seconds",
        default=float(
            default("AGENT_READ_INTERVAL_SECONDS", str(defaults.agent_read_interval_seconds))
        ),
        help="seconds between reads of the engine agents' /status at least (0 disables them)",
    )
    parser.add_argument(
        "--agent-read-concurrency",
        type=int,
        default=int(default("AGENT_READ_CONCURRENCY", str(defaults.agent_read_concurrency))),
    )
    parser.add_argument(
        "--log-format", choices=LOG_FORMATS, default=default("LOG_FORMAT", defaults.log_format)
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", default=_bool(default("VERBOSE", "false"))
    )
    parser.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=_bool(default("LEADER_ELECT", "true")),
        help="hold the llmop-operator Lease before reconciling (--no-leader-elect: one process)",
    )
    return parser


def _network_policy(text: str) -> str | None:
    """The validated peers, canonical JSON (one rendering for equal settings); None: off."""
    if not text.strip():
        return None
    try:
        parsed = parse_peers(text)
    except ValueError as error:
        raise ConfigError(
            f"--network-policy (LLMOP_NETWORK_POLICY): {error}; the chart writes it from its "
            "networkPolicy values"
        ) from error
    return json.dumps(parsed, sort_keys=True, separators=(",", ":"))


def _router(ref: str | None, gateway: str) -> RouterRef | None:
    """`--router` and `--router-gateway`, read."""
    try:
        router = RouterRef.parse(ref) if ref else None
    except ValueError as error:
        raise ConfigError(f"--router (LLMOP_ROUTER): {error}") from error
    on = gateway.strip().lower()
    if on not in ("true", "false"):
        raise ConfigError(
            f"--router-gateway (LLMOP_ROUTER_GATEWAY) must be true or false, not {gateway!r}"
        )
    return replace(router, gateway=True) if router is not None and on == "true" else router


def load(argv: Sequence[str], env: Mapping[str, str]) -> OperatorConfig:
    """Parse `argv` (without the program and `run` words) over `env`."""
    try:
        args = _parser(env).parse_args(list(argv))
    except ValueError as error:  # a malformed LLMOP_* value, raised while building defaults
        raise ConfigError(str(error)) from error
    if args.all_namespaces:
        namespaces: tuple[str, ...] = ()
    elif args.namespaces:
        namespaces = tuple(args.namespaces)
    else:
        listed = env.get(ENV_PREFIX + "NAMESPACES", "")
        namespaces = tuple(ns.strip() for ns in listed.split(",") if ns.strip())
    peering_name = args.peering_name or env.get(ENV_PREFIX + "PEERING") or None
    if args.max_workers < 1:
        raise ConfigError("--max-workers must be at least 1")
    if args.agent_read_interval_seconds < 0:
        raise ConfigError("--agent-read-interval must be 0 (off) or positive")
    if args.agent_read_concurrency < 1:
        raise ConfigError("--agent-read-concurrency must be at least 1")
    if args.name_grace_seconds < 0:
        raise ConfigError(
            "--name-grace-seconds (LLMOP_NAME_GRACE_SECONDS) must be 0 or more seconds"
        )
    if args.log_format not in LOG_FORMATS:
        raise ConfigError(f"--log-format must be one of {', '.join(LOG_FORMATS)}")
    router = _router(args.router, args.router_gateway)
    return OperatorConfig(
        namespaces=namespaces,
        standalone=peering_name is None,
        peering_name=peering_name,
        priority=args.priority,
        liveness_port=args.liveness_port,
        metrics_port=args.metrics_port,
        bind_address=args.bind_address,
        vllm_image=args.vllm_image,
        simulator_image=args.simulator_image,
        vllm_cpu_image=args.vllm_cpu_image,
        service_monitor=args.service_monitor,
        image_pull_policy=args.image_pull_policy,
        gpu_resource_name=args.gpu_resource_name,
        hub_endpoint=args.hub_endpoint,
        network_policy=_network_policy(args.network_policy),
        router=router,
        serving_namespaces=tuple(
            sorted({ns.strip() for ns in args.serving_namespaces.split(",") if ns.strip()})
        ),
        name_grace_seconds=args.name_grace_seconds,
        own_namespace=env.get("POD_NAMESPACE") or None,
        max_workers=args.max_workers,
        retry_delay_seconds=args.retry_delay_seconds,
        request_timeout_seconds=args.request_timeout_seconds,
        agent_read_interval_seconds=args.agent_read_interval_seconds,
        agent_read_concurrency=args.agent_read_concurrency,
        log_format=args.log_format,
        verbose=args.verbose,
        leader_elect=args.leader_elect,
    )
