"""The router ↔ operator contract: the API's names, the CR fields the router reads, the engine
Service's port, the router pods' label, the scale subresources, the scale-to-zero defaults and
the admin port and the activity route with its JSON keys.

The operator writes what the router reads (the CRD, a CR's status, the engine Service) and
reads what the router writes (`GET /llmop/activity`); both sides take the names from here, so a
renamed key or a changed default cannot drift apart silently. The operator imports this module
and nothing else of the router (as it imports `llmop_engine.contract` of the engine); the router
imports nothing of the operator. It is stdlib-only and free of I/O: the router image ships only
`llmop_router`, and the operator's image keeps this one module of it.
`tests/unit/test_router_contract.py` renders children and derives a status with the operator's
own functions and feeds them through the router's discovery, and the router's activity answer
through the operator's parser.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Final

# --- The API ------------------------------------------------------------------------------------

GROUP: Final = "serving.llmop.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "LLMDeployment"
PLURAL: Final = "llmdeployments"
CRD_NAME: Final = f"{PLURAL}.{GROUP}"
"""The CustomResourceDefinition's name (the router says it when the CRD is not installed)."""
GROUP_VERSION_PATH: Final = f"/apis/{GROUP}/{VERSION}"
"""The API server path of the group version (the router lists and watches under it)."""

READY: Final = "Ready"
"""The condition type whose reason says a CR is at zero."""
REASON_SCALED_TO_ZERO: Final = "ScaledToZero"
"""`Ready` True with this reason: the operator took the workload to 0 (or a fixed 0)."""


class Spec:
    """The CR's spec keys the router reads (camelCase, as the API serves them)."""

    SERVICE: Final = "service"
    SERVICE_API_KEY_SECRET_REF: Final = "apiKeySecretRef"
    """`spec.service.apiKeySecretRef`: the engine wants this key, which the gateway never sends
    (it authenticates clients itself): such a model is refused at the gateway, not sent."""
    ROUTER: Final = "router"
    ENABLED: Final = "enabled"
    """`spec.router.enabled`: false keeps the CR out of the router."""
    MIGRATION_LIMIT: Final = "migrationLimit"
    """`spec.router.migrationLimit`: migrations per streaming request for this CR (0: off)."""
    FALLBACK: Final = "fallback"
    """`spec.router.fallback`: other routed models to answer with when this one cannot."""
    FALLBACK_MODEL: Final = "model"
    FALLBACK_EXTERNAL_MODEL: Final = "externalModel"
    """`spec.router.fallback[].externalModel`: an `LLMExternalModel` in the router's namespace."""
    FALLBACK_WHEN: Final = "when"
    FALLBACK_AFTER_SECONDS: Final = "afterSeconds"
    MODEL: Final = "model"
    SERVED_NAME: Final = "servedName"
    """`spec.model.servedName`: the model name, else the CR's own name."""
    ADAPTERS: Final = "adapters"
    ADAPTER_NAME: Final = "name"
    """`spec.adapters[].name`: each LoRA adapter is a model name of its own."""
    AUTOSCALING: Final = "autoscaling"
    MIN_REPLICAS: Final = "minReplicas"
    """`spec.autoscaling.minReplicas: 0`: the operator may take the CR to zero, the router wakes
    it."""
    SCALE_TO_ZERO: Final = "scaleToZero"
    IDLE_SECONDS: Final = "idleSeconds"
    HOLD_TIMEOUT_SECONDS: Final = "holdTimeoutSeconds"
    MAX_PENDING_REQUESTS: Final = "maxPendingRequests"
    RESOURCES: Final = "resources"
    GPUS: Final = "gpus"
    """`spec.resources.gpus`: GPUs per engine pod (default 1), for the GPU-time cost."""
    ENGINE: Final = "engine"
    PIPELINE_PARALLEL_SIZE: Final = "pipelineParallelSize"
    """`spec.engine.pipelineParallelSize` above 1: the workload is a LeaderWorkerSet."""


class Status:
    """The CR's status keys the router reads."""

    CONDITIONS: Final = "conditions"
    PLAN: Final = "plan"
    MAX_NUM_SEQS: Final = "maxNumSeqs"
    """`status.plan.maxNumSeqs`: the sequences the engine runs at once (`--max-num-seqs` as the
    engine really gets it: set, or vLLM's default for the GPU); the router releases held
    requests to each pod up to it."""
    MEMORY_BANDWIDTH: Final = "memoryBandwidthGBs"
    """`status.plan.memoryBandwidthGBs`: the GPU's nameplate bandwidth. With it and the keys
    below, and the router's `--gpu-hour-price`, a CR without `spec.router.pricing` is charged
    the GPU time its requests take (`llmop_router.gpu_price`)."""
    ACTIVE_WEIGHTS: Final = "activeWeightsGiBPerGPU"
    """`status.plan.activeWeightsGiBPerGPU`: the weights each GPU reads per decode step."""
    KV_BYTES_PER_TOKEN: Final = "kvBytesPerToken"
    """`status.plan.kvBytesPerToken`: one token's KV cache on each GPU."""
    KV_CACHE_TOKENS: Final = "kvCacheTokens"
    """`status.plan.kvCacheTokens`: the tokens a replica's KV cache holds."""
    MAX_NUM_BATCHED_TOKENS: Final = "maxNumBatchedTokens"
    """`status.plan.maxNumBatchedTokens`: the scheduler's token budget per step."""
    ROUTING: Final = "routing"
    SERVED_NAMES: Final = "servedNames"
    """`status.routing.servedNames`: the model names the operator decided this CR owns
    (`llmop.name_owners`); the router routes a name only to the CR that lists it. Where no
    claimant of a name carries `status.routing` yet (a new CR before its first status, an
    operator of an older version), the router falls back to the oldest claimant."""
    MODEL_REVISIONS: Final = "modelRevisions"
    """`status.routing.modelRevisions`: `[{revision, pods}]`, which engine pods serve which
    model revision (`llmop.model_revision`); a stream is continued only on a pod of the
    revision that began it. Absent (an operator of an older version): not pinned."""
    REVISION: Final = "revision"
    PODS: Final = "pods"
    ADAPTER_REVISIONS: Final = "adapterRevisions"
    """`status.routing.adapterRevisions`: `[{name, revision, settled}]`, each adapter's revision
    and whether every ready replica serves it (`llmop.adapter_status.routing_revisions`); a
    stream of an adapter is continued only while the adapter stays settled at the revision it
    had when the stream began. Absent: adapters pinned as the base model is."""
    NAME: Final = "name"
    SETTLED: Final = "settled"


# --- Scale to zero ------------------------------------------------------------------------------

DEFAULT_IDLE_SECONDS: Final = 300
"""`scaleToZero.idleSeconds` when unset."""
DEFAULT_HOLD_TIMEOUT_SECONDS: Final = 300
"""`scaleToZero.holdTimeoutSeconds` when unset."""
DEFAULT_MAX_PENDING_REQUESTS: Final = 1000
"""`scaleToZero.maxPendingRequests` when unset."""
DEFAULT_MAX_NUM_SEQS: Final = 256
"""Requests in flight per engine pod when `status.plan.maxNumSeqs` is absent: vLLM's smallest
default `--max-num-seqs` (the simulator's too)."""

DEPLOYMENTS: Final = "deployments"
LEADER_WORKER_SETS: Final = "leaderworkersets"
WORKLOAD_API_VERSIONS: Final[Mapping[str, str]] = {
    DEPLOYMENTS: "apps/v1",
    LEADER_WORKER_SETS: "leaderworkerset.x-k8s.io/v1",
}
"""The workloads whose scale subresource goes 1 → 0 (the operator) and 0 → 1 (the router), by
resource: their API version."""


def workload_resource(pipeline_parallel_size: object) -> str:
    """The resource of a CR's engine workload from its raw `spec.engine.pipelineParallelSize`:
    a LeaderWorkerSet above 1, else a Deployment."""
    multi_node = isinstance(pipeline_parallel_size, int) and pipeline_parallel_size > 1
    return LEADER_WORKER_SETS if multi_node else DEPLOYMENTS


def scale_path(resource: str, namespace: str, name: str) -> str:
    """The API server path of a workload's scale subresource (named like the CR)."""
    return f"/apis/{WORKLOAD_API_VERSIONS[resource]}/namespaces/{namespace}/{resource}/{name}/scale"


# --- The engine Service and the router pods -----------------------------------------------------

API_PORT_NAME: Final = "http"
"""The engine Service's API port name: the router takes the EndpointSlices' port of this name."""

AGENT_PORT_NAME: Final = "probe"
"""The engine Service's port of the engine agent (probes, `/status`): while requests are held
for a waking CR, the router asks its starting pods' agents whether they are ready."""
AGENT_READY_PATH: Final = "/readyz"
"""The agent's readiness route (the kubelet's readiness probe asks the same): 200 when ready."""

ROUTER_POD_LABELS: Final[Mapping[str, str]] = {"app.kubernetes.io/name": "llmop-router"}
"""What the chart labels the router's pods with (the operator lists them by it)."""
ROUTER_POD_SELECTOR: Final = ",".join(f"{k}={v}" for k, v in ROUTER_POD_LABELS.items())

ADMIN_PORT_NAME: Final = "admin"
"""The router container's port for `/metrics`, `/routes` and the activity route: kept off the
Service clients use (it lists every engine pod's address), so the operator finds it by this
name on each router pod and Prometheus scrapes it by this name."""
DEFAULT_ADMIN_PORT: Final = 8081
"""`llmop-router serve --admin-port` when unset (and the operator's guess for a router pod that
does not name its admin port)."""


# --- The activity route -------------------------------------------------------------------------

ACTIVITY_PATH: Final = "/llmop/activity"
"""Per CR this router pod has seen traffic for: requests in flight, held, and the newest
arrival (the operator's idle check reads it from every ready router pod)."""


class ActivityKey:
    """The keys of `GET /llmop/activity`: `{MODELS: [{NAMESPACE, NAME, IN_FLIGHT, HELD,
    LAST_REQUEST_UNIX}]}`."""

    MODELS: Final = "models"
    NAMESPACE: Final = "namespace"
    NAME: Final = "name"
    IN_FLIGHT: Final = "inFlight"
    """Requests being proxied now."""
    HELD: Final = "held"
    """Requests waiting for a wake."""
    LAST_REQUEST_UNIX: Final = "lastRequestUnix"
    """Arrival of the newest request (Unix seconds), or null."""


# --- The gateway: tenants and their keys --------------------------------------------------------

TENANT_KIND: Final = "LLMTenant"
TENANT_PLURAL: Final = "llmtenants"
TENANT_CRD_NAME: Final = f"{TENANT_PLURAL}.{GROUP}"
API_KEY_PREFIX: Final = "llmop_"
"""Every key `llmop key new` mints starts with it, so secret scanners can recognise one."""
API_KEY_PATTERN: Final = r"^[0-9a-f]{64}$"
"""What `spec.apiKeys[].sha256` must be: the hex SHA-256 of the key (never the key itself)."""
MAX_API_KEY_BYTES: Final = 256
"""A presented key longer than this is refused unhashed (a key is ~50 characters)."""


class TenantSpec:
    """The `LLMTenant` spec keys the router reads (camelCase, as the API serves them)."""

    API_KEYS: Final = "apiKeys"
    KEY_NAME: Final = "name"
    KEY_SHA256: Final = "sha256"
    KEY_NOT_AFTER: Final = "notAfter"
    KEY_DISABLED: Final = "disabled"
    MODELS: Final = "models"
    LIMITS: Final = "limits"
    MODEL_LIMITS: Final = "modelLimits"
    MODEL: Final = "model"
    REQUESTS_PER_MINUTE: Final = "requestsPerMinute"
    TOKENS_PER_MINUTE: Final = "tokensPerMinute"
    OUTPUT_TOKENS_PER_MINUTE: Final = "outputTokensPerMinute"
    MAX_CONCURRENT_REQUESTS: Final = "maxConcurrentRequests"
    MAX_TOKENS_PER_REQUEST: Final = "maxTokensPerRequest"
    RESERVE_OUTPUT_TOKENS: Final = "reserveOutputTokens"
    BURST_SECONDS: Final = "burstSeconds"
    MODE: Final = "mode"
    BUDGET: Final = "budget"
    MONTHLY: Final = "monthly"
    CURRENCY: Final = "currency"
    PRIORITY_CLASS_NAME: Final = "priorityClassName"
    WEIGHT: Final = "weight"
    FALLBACK: Final = "fallback"
    """Which fallbacks may answer the tenant's requests (`FALLBACK_POLICIES`)."""


FALLBACK_ALLOWED: Final = "Allowed"
"""A tenant's `spec.fallback`: any fallback, external APIs (which cost money) included."""
FALLBACK_IN_CLUSTER_ONLY: Final = "InClusterOnly"
"""A tenant's `spec.fallback` (the default): other routed models only, never an external API."""
FALLBACK_NEVER: Final = "Never"
"""A tenant's `spec.fallback`: no fallback; a model that cannot answer answers as it is."""
FALLBACK_POLICIES: Final = (FALLBACK_ALLOWED, FALLBACK_IN_CLUSTER_ONLY, FALLBACK_NEVER)


WHEN_UNAVAILABLE: Final = "Unavailable"
"""A fallback's trigger: no ready replica, every replica tried failed before answering, or the
engine refused with its own 5xx or 429 (nothing sent to the client yet)."""
WHEN_SATURATED: Final = "Saturated"
"""A fallback's trigger: the request waited `afterSeconds` in the fair queue without a slot."""
DEFAULT_FALLBACK_AFTER_SECONDS: Final = 2
MAX_FALLBACKS: Final = 4
FALLBACK_HEADER: Final = "X-Llmop-Fallback"
"""On an answer that came from a fallback model: that model's name."""
EXTERNAL_MODEL_KIND: Final = "LLMExternalModel"
EXTERNAL_MODEL_PLURAL: Final = "llmexternalmodels"
DEFAULT_EXTERNAL_CONCURRENCY: Final = 64
"""`spec.maxConcurrentRequests` of an `LLMExternalModel` when unset (per router pod)."""
DEFAULT_EXTERNAL_TIMEOUT_SECONDS: Final = 120
"""`spec.timeoutSeconds` of an `LLMExternalModel` when unset: the whole answer's time."""
MAX_EXTERNAL_TIMEOUT_SECONDS: Final = 3600
MAX_EXTERNAL_CONCURRENCY: Final = 10_000


class ExternalModelSpec:
    """The `LLMExternalModel` spec keys the router reads."""

    BASE_URL: Final = "baseURL"
    """The API's base URL up to and including its version (`https://api.example.com/v1`): the
    request's route after `/v1` is appended (`/chat/completions`)."""
    MODEL: Final = "model"
    """The model name sent upstream."""
    API_KEY_SECRET_REF: Final = "apiKeySecretRef"
    SECRET_NAME: Final = "name"
    SECRET_KEY: Final = "key"
    MAX_CONCURRENT_REQUESTS: Final = "maxConcurrentRequests"
    TIMEOUT_SECONDS: Final = "timeoutSeconds"


PRIORITY_CLASS_KIND: Final = "LLMPriorityClass"
PRIORITY_CLASS_PLURAL: Final = "llmpriorityclasses"


class PriorityClassSpec:
    """The `LLMPriorityClass` spec keys the router reads."""

    VALUE: Final = "value"
    SHEDDABLE: Final = "sheddable"
    MAX_SHARE_PERCENT: Final = "maxSharePercent"
    QUEUE: Final = "queue"
    MAX_WAIT_SECONDS: Final = "maxWaitSeconds"
    MAX_REQUESTS: Final = "maxRequests"
    GLOBAL_DEFAULT: Final = "globalDefault"


DEFAULT_BURST_SECONDS: Final = 10
"""`limits.burstSeconds` when unset: a tenant may send this many seconds of its rate at once."""
DEFAULT_RESERVE_OUTPUT_TOKENS: Final = 512
"""`limits.reserveOutputTokens` when unset: the output a request without `max_tokens` is
charged at admission, settled against its real usage afterwards."""
MIN_PRIORITY: Final = -1_000_000
MAX_PRIORITY: Final = 1_000_000
"""`spec.value` of an `LLMPriorityClass`: higher is served first when a model is saturated."""
MAX_QUEUE_WAIT_SECONDS: Final = 3600
MAX_QUEUED_REQUESTS: Final = 1_000_000
MAX_WEIGHT: Final = 100
"""`spec.weight` of a tenant: its share of a saturated model among tenants of its class."""
PRIORITY_CLASS_HEADER: Final = "X-Llmop-Priority-Class"
"""A request may move to a class of lower or equal value (never higher) with this header."""
MODE_ENFORCE: Final = "Enforce"
MODE_SHADOW: Final = "Shadow"


class Pricing:
    """`spec.router.pricing` keys of an LLMDeployment: prices per million tokens, as decimal
    strings (so a price is exact)."""

    PRICING: Final = "pricing"
    CURRENCY: Final = "currency"
    INPUT: Final = "inputPerMillion"
    CACHED_INPUT: Final = "cachedInputPerMillion"
    OUTPUT: Final = "outputPerMillion"


def api_key_hash(key: str) -> str:
    """The SHA-256 (hex) an `LLMTenant` stores for `key`: keys are machine-made with 256 bits
    of entropy, so a fast hash is safe to publish and lets the router look a key up in O(1)."""
    return hashlib.sha256(key.encode()).hexdigest()
