"""The `LLMDeployment` API (serving.llmop.dev/v1alpha1): the single source of the CRD schema.

Field docstrings become `kubectl explain` descriptions; `Field` bounds become schema bounds;
cross-field rules are CEL (`x-kubernetes-validations`) so the API server rejects bad objects at
admission with a message that names the field and the fix. `crdgen` turns these models into YAML.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict

from llmop_engine import contract
from llmop_router import contract as router_contract

GROUP = router_contract.GROUP
VERSION = router_contract.VERSION
API_VERSION = router_contract.API_VERSION
KIND = router_contract.KIND
PLURAL = router_contract.PLURAL
SINGULAR = "llmdeployment"
SHORT_NAMES = ("llmd",)
CATEGORIES = ("llmop",)

MAX_NAME_LENGTH = 50
"""Children are named after the CR; 50 leaves room for ReplicaSet/Pod suffixes under 63."""

Quantity = Annotated[
    int | str,
    WithJsonSchema({"x-kubernetes-int-or-string": True}),
]
"""A Kubernetes resource quantity such as `4`, `500m`, `32Gi`."""

FreeFormObject = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]
"""A Kubernetes object passed through verbatim (affinity, topology spread constraints)."""


def cel(rule: str, message: str, field_path: str | None = None) -> JsonDict:
    """One `x-kubernetes-validations` entry."""
    entry: JsonDict = {"rule": rule, "message": message}
    if field_path is not None:
        entry["fieldPath"] = field_path
    return entry


class ApiModel(BaseModel):
    """Base for every API object: camelCase on the wire, frozen, attribute docstrings as docs."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        frozen=True,
        extra="ignore",
        use_attribute_docstrings=True,
    )


# --------------------------------------------------------------------------------------------
# spec.model


class SecretKeyRef(ApiModel):
    """A key in a Secret in the LLMDeployment's namespace."""

    name: str = Field(min_length=1, max_length=253)
    """Name of the Secret."""
    key: str = Field(default="token", min_length=1, max_length=253)
    """Key inside the Secret whose value is used."""


class ArchitectureSpec(ApiModel):
    """Architecture facts the capacity planner needs for models missing from its catalog."""

    parameters: int = Field(ge=1)
    """Total parameter count (all experts for mixture-of-experts models), e.g. 8030261248."""
    layers: int = Field(ge=1, le=1024)
    """Number of transformer layers (`num_hidden_layers` in config.json)."""
    kv_heads: int = Field(ge=1, le=1024)
    """Key/value attention heads (`num_key_value_heads`; equals attention heads without GQA)."""
    head_dim: int = Field(ge=1, le=4096)
    """Dimension of one attention head (`head_dim`, or hidden_size / num_attention_heads)."""
    max_position_embeddings: int = Field(ge=1)
    """Longest context the model supports (`max_position_embeddings`)."""
    kv_lora_rank: int | None = Field(default=None, ge=1)
    """Multi-head latent attention only (DeepSeek V2/V3): `kv_lora_rank` from config.json."""
    qk_rope_head_dim: int | None = Field(default=None, ge=0)
    """Multi-head latent attention only: `qk_rope_head_dim` from config.json."""


AccessMode = Literal["ReadWriteOnce", "ReadWriteOncePod", "ReadWriteMany", "ReadOnlyMany"]


class ModelCacheSpec(ApiModel):
    """A PersistentVolumeClaim holding the model's files, filled once by a download Job before
    any engine pod starts; engine pods then read it offline, so a restart or a new replica
    downloads nothing. Either the operator creates the claim (`size`) or you name one
    (`existingClaim`)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "has(self.size) != has(self.existingClaim)",
                    "spec.model.cache needs exactly one of size (the operator creates a claim) "
                    "or existingClaim (use a claim you made)",
                ),
                cel(
                    "!has(self.existingClaim) "
                    "|| (!has(self.storageClassName) && !has(self.accessModes))",
                    "spec.model.cache.storageClassName and accessModes only apply to a claim the "
                    "operator creates: remove them, or remove existingClaim and set size",
                    ".existingClaim",
                ),
                # Transition rules (updates only). On the cache object, not the fields, so that
                # setting or removing a field counts as a change too; switching to or from an
                # existing claim is a new cache, so it is allowed.
                cel(
                    "has(self.existingClaim) || has(oldSelf.existingClaim) "
                    "|| (has(self.storageClassName) ? self.storageClassName : '') "
                    "== (has(oldSelf.storageClassName) ? oldSelf.storageClassName : '')",
                    "spec.model.cache.storageClassName is immutable (a claim cannot move to "
                    "another class): delete and recreate the LLMDeployment, or use existingClaim",
                    ".storageClassName",
                ),
                cel(
                    "has(self.existingClaim) || has(oldSelf.existingClaim) "
                    "|| (has(self.accessModes) ? self.accessModes : ['ReadWriteOnce']) "
                    "== (has(oldSelf.accessModes) ? oldSelf.accessModes : ['ReadWriteOnce'])",
                    "spec.model.cache.accessModes is immutable (a bound claim keeps its modes): "
                    "delete and recreate the LLMDeployment, or use existingClaim",
                    ".accessModes",
                ),
            ]
        }
    )

    size: (
        Annotated[
            str,
            Field(
                min_length=1,
                max_length=64,
                pattern=r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$",
            ),
        ]
        | None
    ) = None
    """Capacity of the claim the operator creates, e.g. `40Gi`. Checked before anything is
    created against the model's size on the Hub plus 5 % headroom."""
    storage_class_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
    )
    """StorageClass of the claim the operator creates; the cluster default when unset."""
    access_modes: list[AccessMode] | None = Field(
        default=None,
        min_length=1,
        max_length=4,
    )
    """Access modes of the claim the operator creates (default `ReadWriteOnce`).
    `ReadWriteMany` lets replicas on different nodes share one download; with `ReadWriteOnce`
    they must share a node."""
    existing_claim: str | None = Field(
        default=None, min_length=1, max_length=253, pattern=r"^[a-z0-9]([-.a-z0-9]*[a-z0-9])?$"
    )
    """Name of a PersistentVolumeClaim in the LLMDeployment's namespace to use as the cache.
    The operator never deletes it."""
    compile_cache: bool = True
    """Keep the engine's compiled artifacts (vLLM's torch.compile cache, TorchInductor's and
    Triton's) on this claim under `.llmop/compile/<key>`, so that a restart, a new replica or a
    wake from zero loads them instead of compiling again. The key covers the model, revision,
    engine image and vLLM version and the engine flags that shape the compiled graph; a change of
    any of them compiles afresh. `false`: every pod compiles for itself."""


class ModelSpec(ApiModel):
    """Which model to serve and where its weights come from."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    r"self.name.matches('^(pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?/.*"
                    r"|[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?)$')",
                    "spec.model.name must be a Hugging Face repo id like "
                    "'meta-llama/Llama-3.1-8B-Instruct' or 'pvc://<claim>/<path>' for weights "
                    "on a PersistentVolumeClaim",
                    ".name",
                ),
                cel(
                    "!has(self.cache) || !self.name.startsWith('pvc://')",
                    "spec.model.cache is for models downloaded from the Hub; a pvc:// model is "
                    "already on a volume: remove spec.model.cache",
                    ".cache",
                ),
                cel(
                    "!has(self.architecture) || !has(self.architecture.kvLoraRank) "
                    "|| has(self.architecture.qkRopeHeadDim)",
                    "spec.model.architecture.qkRopeHeadDim is required when kvLoraRank is set "
                    "(multi-head latent attention needs both)",
                    ".architecture",
                ),
            ]
        }
    )

    name: str = Field(min_length=1, max_length=512)
    """Hugging Face repo id (`org/name`) or `pvc://<claim>/<path>` for weights on a volume."""
    revision: str | None = Field(default=None, min_length=1, max_length=128)
    """Model revision. Pin a commit sha for reproducible rollouts; a branch or tag is accepted
    but reported as a floating revision in status."""
    served_name: str | None = Field(default=None, min_length=1, max_length=256)
    """Name clients use in the OpenAI API `model` field. Defaults to the LLMDeployment's name."""
    token_secret_ref: SecretKeyRef | None = None
    """Secret holding a Hugging Face token for gated models (mounted as a file: HF_TOKEN_PATH)."""
    architecture: ArchitectureSpec | None = None
    """Overrides the built-in architecture catalog for capacity planning."""
    cache: ModelCacheSpec | None = None
    """A persistent model cache filled once by a download Job (unset: each engine pod downloads
    into its own emptyDir at start, as before)."""


# --------------------------------------------------------------------------------------------
# spec.engine


class SpeculativeSpec(ApiModel):
    """Speculative decoding with a draft model."""

    model: str = Field(min_length=1, max_length=512)
    """Draft model (Hugging Face repo id) or method name understood by vLLM (e.g. `ngram`)."""
    num_speculative_tokens: int = Field(default=4, ge=1, le=16)
    """Tokens proposed per step."""


class KeySelector(ApiModel):
    """A key in a Secret or ConfigMap."""

    name: str = Field(min_length=1, max_length=253)
    """Name of the object."""
    key: str = Field(min_length=1, max_length=253)
    """Key inside the object."""


class EnvVarSource(ApiModel):
    """Where an environment variable's value comes from."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "has(self.secretKeyRef) != has(self.configMapKeyRef)",
                    "valueFrom needs exactly one of secretKeyRef or configMapKeyRef",
                )
            ]
        }
    )

    secret_key_ref: KeySelector | None = None
    """Value from a Secret key."""
    config_map_key_ref: KeySelector | None = None
    """Value from a ConfigMap key."""


class EnvVar(ApiModel):
    """An environment variable for the engine container."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!(has(self.value) && has(self.valueFrom))",
                    "env entries take either value or valueFrom, not both",
                )
            ]
        }
    )

    name: str = Field(min_length=1, max_length=256, pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*$")
    """Variable name."""
    value: str | None = Field(default=None, max_length=32768)
    """Literal value."""
    value_from: EnvVarSource | None = None
    """Value taken from a Secret or ConfigMap."""


Backend = Literal["vllm", "simulator"]
Dtype = Literal["auto", "bfloat16", "float16", "half", "float32"]
Quantization = Literal[
    "none", "awq", "awq_marlin", "gptq", "gptq_marlin", "fp8", "compressed-tensors", "bitsandbytes"
]
KvCacheDtype = Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"]


LoraRank = Literal[8, 16, 32, 64, 128, 256]


class LoraSpec(ApiModel):
    """LoRA slots of the engine (`--enable-lora` and its three flags). Changing any of them
    restarts the engine pods (a drained rollout): vLLM sizes the slots at start. Adding or
    removing `spec.adapters` never does."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.maxCpuLoras >= self.maxLoras",
                    "spec.engine.lora.maxCpuLoras must be at least spec.engine.lora.maxLoras "
                    "(vLLM keeps every GPU slot's adapter in the CPU cache too): raise "
                    "maxCpuLoras or lower maxLoras",
                    ".maxCpuLoras",
                )
            ]
        }
    )

    max_loras: int = Field(default=4, ge=1, le=64)
    """Adapters one batch can mix (`--max-loras`): GPU slots, each sized for `maxLoraRank`."""
    max_cpu_loras: int = Field(default=16, ge=1, le=1024)
    """Adapters kept in host memory (`--max-cpu-loras`). More adapters than this still serve:
    vLLM re-reads an evicted adapter from disk on its next request (a few to tens of ms)."""
    max_lora_rank: LoraRank = 64
    """Largest adapter rank `r` the slots hold (`--max-lora-rank`). An adapter above it fails
    as `AdapterRankTooHigh`; the engine is not restarted for it."""


class EngineSpec(ApiModel):
    """How the inference engine runs. Typed fields become vLLM flags; `args` are passed last."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.maxNumBatchedTokens) || !has(self.maxModelLen) "
                    "|| (has(self.enableChunkedPrefill) && self.enableChunkedPrefill) "
                    "|| self.maxNumBatchedTokens >= self.maxModelLen",
                    "spec.engine.maxNumBatchedTokens must be at least spec.engine.maxModelLen "
                    "unless enableChunkedPrefill is true: raise maxNumBatchedTokens or enable "
                    "chunked prefill",
                    ".maxNumBatchedTokens",
                )
            ]
        }
    )

    backend: Backend = "vllm"
    """`vllm` runs the real engine on GPUs; `simulator` runs llmop's vLLM-compatible simulator
    (CPU only, for CI and clusters without GPUs)."""
    image: str | None = Field(default=None, min_length=1, max_length=512)
    """Engine image. Defaults to the operator's configured image for the backend."""
    dtype: Dtype = "auto"
    """Weight and activation dtype (`--dtype`); `auto` uses the model's own."""
    quantization: Quantization = "none"
    """Weight quantization method (`--quantization`); `none` serves the checkpoint as is."""
    kv_cache_dtype: KvCacheDtype = "auto"
    """KV cache dtype (`--kv-cache-dtype`); `fp8` halves KV memory."""
    max_model_len: int | None = Field(default=None, ge=16, le=10_485_760)
    """Longest sequence (prompt + output) in tokens (`--max-model-len`); defaults to the model's."""
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=0.98)
    """Fraction of each GPU's memory vLLM may use (`--gpu-memory-utilization`), above 0 and at
    most 0.98."""
    max_num_seqs: int | None = Field(default=None, ge=1, le=65536)
    """Most sequences in one batch (`--max-num-seqs`; vLLM default 256 on datacenter GPUs)."""
    max_num_batched_tokens: int | None = Field(default=None, ge=16, le=10_485_760)
    """Most tokens in one scheduler step (`--max-num-batched-tokens`)."""
    enable_prefix_caching: bool | None = None
    """Automatic prefix caching (`--enable-prefix-caching` / `--no-enable-prefix-caching`)."""
    enable_chunked_prefill: bool | None = None
    """Chunked prefill (`--enable-chunked-prefill` / `--no-enable-chunked-prefill`)."""
    tensor_parallel_size: int | None = Field(default=None, ge=1, le=64)
    """GPUs one model replica is split across (`--tensor-parallel-size`); defaults to
    `resources.gpus` and must divide it."""
    pipeline_parallel_size: int = Field(default=1, ge=1, le=64)
    """Pods one model replica is split across (`--pipeline-parallel-size`), each with
    `resources.gpus` GPUs, for models bigger than one node. 1 (the default) is one pod per
    replica. Above 1 needs `tensorParallelSize` unset or equal to `resources.gpus` (both
    backends, vllm and simulator, take it; `resources.gpus: 0` is allowed)."""
    speculative: SpeculativeSpec | None = None
    """Speculative decoding (`--speculative-config`)."""
    lora: LoraSpec | None = None
    """LoRA slots. Set it up front when adapters will come later: turning LoRA on is a
    rollout, adding an adapter is not. Implied (with its defaults) by a non-empty
    `spec.adapters`."""
    args: list[Annotated[str, Field(max_length=4096)]] = Field(default_factory=list, max_length=128)
    """Extra engine flags, passed after the generated ones (so they win where the engine takes
    the last value)."""
    env: list[EnvVar] = Field(default_factory=list, max_length=128)
    """Extra environment variables for the engine container."""


# --------------------------------------------------------------------------------------------
# spec.resources / spec.scheduling


class ResourcesSpec(ApiModel):
    """Compute resources of one engine pod."""

    gpus: int = Field(default=1, ge=0, le=64)
    """GPUs per pod (the GPU resource limit). Zero runs the simulator, or with the vllm backend
    vLLM's CPU build (the operator's CPU engine image; needs `memory`, which bounds the weights,
    the KV cache `VLLM_CPU_KVCACHE_SPACE` and vLLM's runtime)."""
    gpu_resource_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=r"^([a-z0-9.-]+/)?[A-Za-z0-9._-]+$",
    )
    """Extended resource name of the GPU device plugin. Defaults to the operator's setting
    (`nvidia.com/gpu` unless the operator was installed with another, e.g. `amd.com/gpu`)."""
    gpu_product: str | None = Field(default=None, min_length=1, max_length=128)
    """GPU product as labelled by GPU feature discovery (`nvidia.com/gpu.product`, e.g.
    `NVIDIA-H100-80GB-HBM3`). Becomes a node selector and tells the planner the GPU's memory."""
    gpu_memory_gib: float | None = Field(default=None, gt=0, le=4096, alias="gpuMemoryGiB")
    """Memory of one GPU in GiB, for products missing from the planner's catalog (wins over it)."""
    cpu: Quantity | None = None
    """CPU request and limit of the engine container, e.g. `8`."""
    memory: Quantity | None = None
    """Memory request and limit of the engine container, e.g. `64Gi`."""
    shared_memory: Quantity | None = None
    """Size of the in-memory `/dev/shm` volume (tensor parallelism needs it); defaults to 8Gi
    for vLLM and 64Mi for the simulator."""


class Toleration(ApiModel):
    """A Kubernetes toleration."""

    key: str | None = Field(default=None, max_length=316)
    """Taint key; empty with operator Exists matches every taint."""
    operator: Literal["Exists", "Equal"] | None = None
    """`Exists` or `Equal` (default Equal)."""
    value: str | None = Field(default=None, max_length=63)
    """Taint value for `Equal`."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to match; empty matches all."""
    toleration_seconds: int | None = None
    """For NoExecute: how long the pod stays bound after the taint appears."""


class SchedulingSpec(ApiModel):
    """Where engine pods may run."""

    node_selector: dict[str, str] = Field(default_factory=dict)
    """Node labels the pods require (merged with the GPU product selector)."""
    tolerations: list[Toleration] = Field(default_factory=list, max_length=64)
    """Tolerations for tainted GPU nodes."""
    affinity: FreeFormObject | None = None
    """Pod affinity rules (core/v1 Affinity), passed through."""
    priority_class_name: str | None = Field(default=None, max_length=253)
    """PriorityClass of the engine pods."""
    topology_spread_constraints: list[FreeFormObject] = Field(default_factory=list, max_length=16)
    """Topology spread constraints (core/v1), passed through; the pod selector is filled in when
    `labelSelector` is omitted."""
    pre_pull_image: bool = False
    """Keep the engine image on every node the engine pods may run on (the same node selector,
    GPU product, tolerations and node affinity), before any engine pod lands there: a DaemonSet
    `<name>-prepull` of one idle container per node (1m CPU, 32Mi memory, no GPU), so a wake
    from zero or a scale-up never waits for an image pull. `status.prePull` says on how many
    nodes the image is."""


# --------------------------------------------------------------------------------------------
# spec.autoscaling


class ScaleUpSpec(ApiModel):
    """How fast the HPA adds replicas. GPU pods are slow to start, so scale up early."""

    stabilization_window_seconds: int = Field(default=0, ge=0, le=3600)
    """Look-back window before scaling up."""
    max_pods_per_minute: int = Field(default=2, ge=1, le=1000)
    """Pods added per minute at most (with `maxPercentPerMinute`, whichever allows more)."""
    max_percent_per_minute: int = Field(default=100, ge=1, le=1000)
    """Percent of current replicas added per minute at most."""


class ScaleDownSpec(ApiModel):
    """How slowly the HPA removes replicas. Model loads are expensive, so scale down late."""

    stabilization_window_seconds: int = Field(default=300, ge=0, le=3600)
    """Look-back window before scaling down (the highest recommendation in it wins)."""
    pods_per_period: int = Field(default=1, ge=1, le=1000)
    """Pods removed per period at most."""
    period_seconds: int = Field(default=120, ge=1, le=1800)
    """Length of the scale-down period."""


class ScaleToZeroSpec(ApiModel):
    """Idle models release their pods; llmop-router holds the first request after and wakes
    the model (docs/router.md)."""

    idle_seconds: int = Field(default=router_contract.DEFAULT_IDLE_SECONDS, ge=10, le=86400)
    """Seconds with nothing held or in flight at the router and nothing queued or running at
    the engines before the operator scales the engine workload to 0."""
    hold_timeout_seconds: int = Field(
        default=router_contract.DEFAULT_HOLD_TIMEOUT_SECONDS, ge=1, le=3600
    )
    """How long the router holds a request for a model at zero before it answers 504."""
    max_pending_requests: int = Field(
        default=router_contract.DEFAULT_MAX_PENDING_REQUESTS, ge=1, le=100000
    )
    """Requests the router holds per router pod for a model at zero; the next one gets 429
    with Retry-After."""


class AutoscalingSpec(ApiModel):
    """Queue-depth autoscaling through a HorizontalPodAutoscaler owned by this LLMDeployment."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.minReplicas <= self.maxReplicas",
                    "spec.autoscaling.minReplicas must not exceed spec.autoscaling.maxReplicas",
                    ".minReplicas",
                ),
                cel(
                    "!has(self.scaleToZero) || self.minReplicas == 0",
                    "spec.autoscaling.scaleToZero needs spec.autoscaling.minReplicas: 0 (set "
                    "it, or remove scaleToZero)",
                    ".scaleToZero",
                ),
            ]
        }
    )

    min_replicas: int = Field(default=1, ge=0, le=1000)
    """Fewest replicas. 0: the model scales to zero when idle (`scaleToZero`) and llmop-router
    wakes it on the next request; the HPA itself keeps 1 to `maxReplicas`."""
    max_replicas: int = Field(ge=1, le=1000)
    """Most replicas."""
    target_queue_depth: float = Field(default=4, gt=0, le=10000)
    """Average waiting requests per ready replica the HPA aims for (metric
    `llmop_engine_queue_depth`)."""
    scale_up: ScaleUpSpec = Field(default_factory=ScaleUpSpec)
    """Scale-up behaviour."""
    scale_down: ScaleDownSpec = Field(default_factory=ScaleDownSpec)
    """Scale-down behaviour."""
    scale_to_zero: ScaleToZeroSpec | None = None
    """Scale to zero settings, with `minReplicas: 0` (defaults apply when minReplicas is 0 and
    this is unset)."""

    @property
    def scales_to_zero(self) -> bool:
        """Whether the operator may take this model to 0 when idle."""
        return self.min_replicas == 0

    @property
    def zero(self) -> ScaleToZeroSpec:
        """The scale-to-zero settings in effect (the defaults when unset)."""
        return self.scale_to_zero or ScaleToZeroSpec()


# --------------------------------------------------------------------------------------------
# spec.health / spec.rollout / spec.service


class DeepProbeSpec(ApiModel):
    """The engine agent's real one-token generation, sent only while the engine is idle."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.timeoutSeconds < self.intervalSeconds",
                    "spec.health.deepProbe.timeoutSeconds must be below intervalSeconds",
                    ".timeoutSeconds",
                )
            ]
        }
    )

    enabled: bool = contract.DEFAULTS.deep_probe_enabled
    """Send deep probes. When false, readiness relies on the engine's /health alone."""
    interval_seconds: int = Field(
        default=int(contract.DEFAULTS.deep_probe_interval_seconds), ge=2, le=3600
    )
    """Seconds between deep probes on an idle engine."""
    timeout_seconds: int = Field(
        default=int(contract.DEFAULTS.deep_probe_timeout_seconds), ge=1, le=600
    )
    """Deadline of one deep probe."""
    prompt: str = Field(default=contract.DEFAULTS.deep_probe_prompt, min_length=1, max_length=1024)
    """Prompt of the probe request (one output token is generated)."""


class HealthSpec(ApiModel):
    """How the engine agent tells a busy engine from a hung one."""

    deep_probe: DeepProbeSpec = Field(default_factory=DeepProbeSpec)
    """Idle deep probe."""
    stall_seconds: int = Field(default=int(contract.DEFAULTS.stall_seconds), ge=5, le=3600)
    """An engine with pending work and no generated-token progress for this long is hung and
    restarted."""
    load_timeout_seconds: int | None = Field(default=None, ge=30, le=86400)
    """Budget for the engine to load weights and start listening; defaults to a value derived
    from the model's size. Downloads with growing bytes do not count against it."""


class RolloutSpec(ApiModel):
    """Rolling updates and drain."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.maxSurge) || self.maxSurge + self.maxUnavailable > 0",
                    "spec.rollout.maxSurge and spec.rollout.maxUnavailable cannot both be 0: "
                    "set maxSurge to 1 (needs spare GPUs) or maxUnavailable to 1",
                    ".maxSurge",
                )
            ]
        }
    )

    max_surge: int | None = Field(default=None, ge=0, le=100)
    """Extra pods during a rollout (each needs its own GPUs). Unset: decided when a rollout
    starts from the room on the nodes the engine pods can run on (allocatable minus what the
    pods there request): as many as fit, at most a second full copy; none when nothing fits,
    and then one pod at a time is replaced (maxUnavailable at least 1)."""
    max_unavailable: int = Field(default=0, ge=0, le=100)
    """Pods that may be unavailable during a rollout."""
    drain_seconds: int = Field(default=int(contract.DEFAULTS.drain_seconds), ge=1, le=3600)
    """Upper bound for in-flight requests to finish on shutdown (vLLM `--shutdown-timeout`)."""
    endpoint_propagation_seconds: int = Field(
        default=int(contract.DEFAULTS.endpoint_propagation_seconds), ge=0, le=120
    )
    """Wait after readiness turns off before the engine stops accepting work, so Service
    endpoints and load balancers stop sending requests first."""


class ServiceSpec(ApiModel):
    """The Service in front of the engine pods (OpenAI-compatible API)."""

    port: int = Field(default=contract.API_PORT, ge=1, le=65535)
    """API port of the Service and the engine."""
    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = "ClusterIP"
    """Service type."""
    annotations: dict[str, str] = Field(default_factory=dict)
    """Annotations on the Service (e.g. for a cloud load balancer)."""
    api_key_secret_ref: SecretKeyRef | None = None
    """Secret holding the API key clients must send (vLLM `--api-key`)."""


DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
"""An RFC 1123 label: what a Service name must be."""


class EndpointPickerRef(ApiModel):
    """The endpoint picker (EPP) Service a Gateway API Inference Extension gateway asks which
    engine pod serves each request."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    f"self.name.matches('{DNS_LABEL}')",
                    "spec.router.inferencePool.endpointPickerRef.name must be the name of the "
                    "endpoint picker's Service in this namespace: lowercase letters, digits and "
                    "'-', starting and ending with a letter or digit",
                    ".name",
                )
            ]
        }
    )

    name: str = Field(min_length=1, max_length=63)
    """Name of the endpoint picker's Service, in the LLMDeployment's namespace."""
    port: int = Field(ge=1, le=65535)
    """Port of that Service (the service port, e.g. 9002 for the upstream EPP's gRPC port)."""
    failure_mode: Literal["FailOpen", "FailClose"] = "FailClose"
    """What the gateway does while the endpoint picker does not answer: `FailClose` rejects
    requests, `FailOpen` sends them to an engine pod of its own choosing."""


class InferencePoolSpec(ApiModel):
    """An `inference.networking.k8s.io/v1` InferencePool of this model's engine pods, for a
    gateway that implements the Gateway API Inference Extension (docs/router.md)."""

    endpoint_picker_ref: EndpointPickerRef
    """The endpoint picker the gateway consults for this pool (you run it: docs/router.md)."""


DECIMAL_PATTERN: Final = r"^[0-9]{1,12}(\.[0-9]{1,6})?$"
"""An amount of money: up to 6 decimals, so a price per million tokens is a whole number of
millionths of a millionth per token and costs add up exactly."""


class Pricing(ApiModel):
    """What this model's tokens cost, for the gateway's metering and tenants' budgets."""

    currency: str = Field(default="USD", pattern=r"^[A-Z]{3}$")
    """ISO 4217 code; tenants' budgets are in it."""
    input_per_million: str = Field(pattern=DECIMAL_PATTERN)
    """Price of a million prompt tokens (a decimal string, e.g. "0.10")."""
    cached_input_per_million: str | None = Field(default=None, pattern=DECIMAL_PATTERN)
    """Price of a million prompt tokens served from the prefix cache [default: the input
    price]."""
    output_per_million: str = Field(pattern=DECIMAL_PATTERN)
    """Price of a million generated tokens."""


FallbackWhen = Literal["Unavailable", "Saturated"]


def _unavailable_only() -> list[FallbackWhen]:
    return ["Unavailable"]


class FallbackSpec(ApiModel):
    """Another routed model, or an API outside the cluster, that answers this model's requests
    when this one cannot."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "has(self.model) != has(self.externalModel)",
                    "a fallback names exactly one of model (another routed model) and "
                    "externalModel (an LLMExternalModel in the router's namespace)",
                )
            ]
        }
    )

    model: str | None = Field(default=None, min_length=1, max_length=253)
    """The other model's served name (`spec.model.servedName` of its LLMDeployment, or an
    adapter's name). The request is sent as for that model: the tenant must be allowed to use
    it (and its `spec.fallback` not Never), and is metered at its price."""
    external_model: str | None = Field(default=None, min_length=1, max_length=253)
    """An `LLMExternalModel` in the router's namespace: an OpenAI-compatible API outside the
    cluster, called with its own key. Only for tenants whose `spec.fallback` is Allowed;
    metered at the external model's price."""
    when: list[FallbackWhen] = Field(default_factory=_unavailable_only, min_length=1, max_length=2)
    """Unavailable: this model has no ready replica (and is not waking from zero), every
    replica tried failed before answering, or its engine refused with its own 5xx or 429.
    Saturated: the request waited `afterSeconds` for a
    slot (the gateway's fair queue). Only ever before the first byte of an answer."""
    after_seconds: int = Field(default=router_contract.DEFAULT_FALLBACK_AFTER_SECONDS, ge=1, le=600)
    """Saturated: how long a request waits for a slot of this model before it goes to the
    fallback."""


class RouterSpec(ApiModel):
    """How llmop-router serves this model (docs/router.md)."""

    enabled: bool = True
    """Serve this model through llmop-router, where one runs: its OpenAI endpoint routes
    requests whose `model` is the served name to this CR's ready engine pods. The CR's own
    Service serves it either way."""
    inference_pool: InferencePoolSpec | None = None
    """Render an InferencePool named like this LLMDeployment selecting its engine pods, for a
    Gateway API Inference Extension gateway (needs the extension's CRDs v1.x in the cluster;
    without them the CR is Degraded with reason InferencePoolUnavailable and serves through its
    Service as before). Removing this field deletes the pool."""
    pricing: Pricing | None = None
    """Prices per million tokens: the router's gateway meters each tenant's cost with them
    (llmop_gateway_cost_total, LLMTenant budgets). Unset: the tokens are counted, at no cost."""
    migration_limit: int | None = Field(default=None, ge=0, le=10)
    """How many times the router may continue one streaming answer on another replica when
    its engine fails, hangs or drains mid-answer (request migration, docs/router.md); 0 turns
    migration off for this model (a cut stream then ends with an error event). Unset: the
    router's `--migration-limit` (2 by default)."""
    fallback: list[FallbackSpec] = Field(
        default_factory=list, max_length=router_contract.MAX_FALLBACKS
    )
    """With the router's gateway: models to send a request to, in order, when this one cannot
    answer it (docs/gateway.md, "Fallback"). One hop: a fallback's own fallbacks are not
    followed, so a cycle cannot loop. The answer says which model gave it (`X-Llmop-Fallback`).
    A `model` no other routed LLMDeployment serves, or an `externalModel` naming no
    LLMExternalModel in the router's namespace, is skipped, and the CR is Degraded with reason
    FallbackNotRouted; an existing external model's problems are on its own status."""


# --------------------------------------------------------------------------------------------
# spec.adapters

ADAPTER_SOURCE_PATTERN: Final = (
    r"^(hf://[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?"
    r"|pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?/[^/].*)$"
)
"""`hf://org/repo` or `pvc://claim/path` (the CEL rule and the operator's parser share it)."""
MAX_ADAPTERS: Final = 64


class AdapterSpec(ApiModel):
    """A LoRA adapter of the base model, served under its own OpenAI `model` name."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    f"self.source.matches('{ADAPTER_SOURCE_PATTERN}')",
                    "spec.adapters[].source must be hf://<org>/<repo> (a Hugging Face repo) "
                    "or pvc://<claim>/<path> on a claim the engine pods mount (the model's or "
                    "the model cache's)",
                    ".source",
                ),
                cel(
                    "!has(self.revision) || self.source.startsWith('hf://')",
                    "spec.adapters[].revision is for hf:// sources; a pvc:// adapter is read "
                    "as it is on the volume: remove revision",
                    ".revision",
                ),
                cel(
                    "!self.source.contains('/../') && !self.source.endsWith('/..')",
                    "spec.adapters[].source must not contain '..': name the adapter's folder "
                    "directly",
                    ".source",
                ),
            ]
        }
    )

    name: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    """The OpenAI `model` value clients send for this adapter (a DNS label, unique in the
    LLMDeployment and not the base model's served name)."""
    source: str = Field(min_length=1, max_length=512)
    """`hf://<org>/<repo>` or `pvc://<claim>/<path>`. Gated Hub adapters use
    `spec.model.tokenSecretRef`."""
    revision: str | None = Field(default=None, min_length=1, max_length=128)
    """Hub revision of an hf:// adapter. Pin a commit sha; a branch or tag (or none) floats
    and is reported like the base model's."""


# --------------------------------------------------------------------------------------------
# The resource


class LLMDeploymentSpec(ApiModel):
    """Desired state of an LLMDeployment."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!(has(self.replicas) && has(self.autoscaling))",
                    "spec.replicas and spec.autoscaling are mutually exclusive: remove "
                    "spec.replicas to let the autoscaler own the count, or remove "
                    "spec.autoscaling for a fixed count",
                    ".replicas",
                ),
                cel(
                    "!has(self.engine.tensorParallelSize) "
                    "|| self.resources.gpus % self.engine.tensorParallelSize == 0",
                    "spec.engine.tensorParallelSize must divide spec.resources.gpus: set it to "
                    "the GPU count or a divisor of it",
                    ".engine.tensorParallelSize",
                ),
                cel(
                    "!has(self.engine.pipelineParallelSize) || self.engine.pipelineParallelSize "
                    "== 1 || !has(self.engine.tensorParallelSize) "
                    "|| self.engine.tensorParallelSize == self.resources.gpus",
                    "spec.engine.pipelineParallelSize above 1 needs spec.engine.tensorParallelSize "
                    "unset or equal to spec.resources.gpus: each pod of a replica holds one "
                    "pipeline stage on all its GPUs",
                    ".engine.pipelineParallelSize",
                ),
                cel(
                    "self.engine.backend == 'simulator' || self.resources.gpus >= 1 "
                    "|| has(self.resources.memory)",
                    "spec.resources.memory is required for a CPU engine (backend vllm with "
                    "resources.gpus 0): it must hold the weights, the KV cache "
                    "(VLLM_CPU_KVCACHE_SPACE) and vLLM's runtime; set it, e.g. 16Gi",
                    ".resources.memory",
                ),
                cel(
                    "!has(self.autoscaling) || !has(self.autoscaling.minReplicas) "
                    "|| self.autoscaling.minReplicas > 0 || !has(self.router) "
                    "|| !has(self.router.enabled) || self.router.enabled",
                    "spec.autoscaling.minReplicas 0 needs spec.router.enabled (llmop-router "
                    "holds the first request and wakes the model): remove spec.router.enabled: "
                    "false, or set minReplicas to 1 or more",
                    ".autoscaling.minReplicas",
                ),
                cel(
                    "!has(self.adapters) || self.adapters.all(a, "
                    "self.adapters.exists_one(b, b.name == a.name))",
                    "spec.adapters[].name must be unique: each name is the OpenAI model value "
                    "of one adapter",
                    ".adapters",
                ),
                cel(
                    "!has(self.engine.pipelineParallelSize) || self.engine.pipelineParallelSize "
                    "== 1 || ((!has(self.adapters) || size(self.adapters) == 0) "
                    "&& !has(self.engine.lora))",
                    "spec.adapters and spec.engine.lora need spec.engine.pipelineParallelSize 1: "
                    "vLLM 0.32 with --enable-lora and pipeline parallelism crashes on the first "
                    "request; serve adapters from a model that fits one pod",
                    ".engine.pipelineParallelSize",
                ),
                cel(
                    "!has(self.engine.maxModelLen) || !has(self.model.architecture) "
                    "|| self.engine.maxModelLen <= self.model.architecture.maxPositionEmbeddings",
                    "spec.engine.maxModelLen exceeds "
                    "spec.model.architecture.maxPositionEmbeddings: lower maxModelLen",
                    ".engine.maxModelLen",
                ),
            ]
        }
    )

    model: ModelSpec
    """The model to serve."""
    engine: EngineSpec = Field(default_factory=EngineSpec)
    """Inference engine settings."""
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    """Per-pod compute resources."""
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec)
    """Node placement."""
    replicas: int | None = Field(default=None, ge=0, le=1000)
    """Fixed replica count (1 when neither this nor autoscaling is set). Mutually exclusive
    with `autoscaling`. Changed by `kubectl scale`."""
    autoscaling: AutoscalingSpec | None = None
    """Queue-depth autoscaling; the HPA owns the replica count while this is set."""
    health: HealthSpec = Field(default_factory=HealthSpec)
    """Probe behaviour."""
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    """Rollout and drain behaviour."""
    service: ServiceSpec = Field(default_factory=ServiceSpec)
    """The API Service."""
    router: RouterSpec = Field(default_factory=RouterSpec)
    """Routing through llmop-router."""
    adapters: list[AdapterSpec] = Field(default_factory=list, max_length=MAX_ADAPTERS)
    """LoRA adapters loaded on every replica at runtime: adding or removing one restarts no
    pod."""

    @property
    def desired_fixed_replicas(self) -> int:
        """Replicas when autoscaling is off: absent `replicas` means one."""
        return 1 if self.replicas is None else self.replicas

    @property
    def tensor_parallel_size(self) -> int:
        """TP degree: explicit, else every GPU of the pod (at least 1). Planner and renderer
        both read it here, so planning does not import rendering."""
        return self.engine.tensor_parallel_size or max(1, self.resources.gpus)

    @property
    def pipeline_parallel_size(self) -> int:
        """PP degree: pods per replica (1 = one pod)."""
        return self.engine.pipeline_parallel_size

    @property
    def lora_slots(self) -> LoraSpec | None:
        """The LoRA slots the engine starts with: `engine.lora`, else its defaults when any
        adapter is declared, else None (LoRA off). Planner and renderer both read it here."""
        if self.engine.lora is not None:
            return self.engine.lora
        return LoraSpec() if self.adapters else None


ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(ApiModel):
    """One observation of the LLMDeployment's state (metav1.Condition)."""

    type: str = Field(max_length=316)
    """Condition type: Ready, Reconciling, Stalled, CapacityPlanned, Degraded."""
    status: ConditionStatus
    """True, False or Unknown."""
    observed_generation: int | None = Field(default=None, ge=0)
    """The .metadata.generation this condition was computed from."""
    last_transition_time: str = Field(json_schema_extra={"format": "date-time"})
    """When the status last changed (not when the reason or message did)."""
    reason: str = Field(max_length=1024)
    """CamelCase machine-readable cause."""
    message: str = Field(default="", max_length=32768)
    """Human-readable explanation."""


class ActualCapacity(ApiModel):
    """Capacity the running engine reported."""

    kv_cache_tokens: int | None = Field(default=None, ge=0)
    """KV cache tokens of one replica as reported by the engine."""


FactsSource = Literal["spec", "catalog", "files", "hub"]


class PlanStatus(ApiModel):
    """The capacity planner's estimate for one replica."""

    gpu_memory_gib: float | None = Field(default=None, alias="gpuMemoryGiB")
    """Memory of one GPU used for the estimate."""
    weights_gib_per_gpu: float | None = Field(default=None, alias="weightsGiBPerGPU")
    """Model weights held by each GPU."""
    kv_bytes_per_token: int | None = None
    """KV cache bytes one token takes on each GPU."""
    kv_cache_tokens: int | None = None
    """Tokens the KV cache of one replica holds."""
    max_model_len: int | None = None
    """Effective maximum sequence length."""
    max_concurrency: float | None = None
    """Sequences of maxModelLen tokens that fit in the KV cache at once."""
    max_num_seqs: int | None = None
    """Sequences the engine runs at once (`--max-num-seqs` as the engine gets it: set in
    spec.engine, else vLLM's default for the GPU); llmop-router releases held requests to each
    replica up to it."""
    fits: bool | None = None
    """Whether the model fits with these settings."""
    facts_source: FactsSource | None = None
    """Where the model's facts came from: spec.model.architecture, the planner's catalog, or
    the model's own config.json and safetensors index at the resolved revision (hub)."""
    facts_revision: str | None = Field(default=None, max_length=128)
    """The commit whose config.json and safetensors index the facts were read from (with
    factsSource hub)."""
    max_num_batched_tokens: int | None = None
    """The scheduler's token budget per step the engine will use (vLLM's default for the GPU
    unless spec.engine sets one)."""
    decode_ceiling_tokens_per_second: int | None = None
    """Output tokens/s one replica cannot exceed at its largest batch, from memory bandwidth
    (weights + KV read per decode step): a ceiling, not a forecast."""
    active_weights_gib_per_gpu: float | None = Field(default=None, alias="activeWeightsGiBPerGPU")
    """Weights each GPU reads per decode step (an MoE reads its active experts only)."""
    memory_bandwidth_gbs: float | None = Field(default=None, alias="memoryBandwidthGBs")
    """The GPU's nameplate memory bandwidth (GB/s) behind the decode ceiling; with the
    router's `--gpu-hour-price`, a CR without `spec.router.pricing` is charged the GPU time
    its requests take at it (docs/gateway.md, "Cost in GPU time")."""
    actual: ActualCapacity | None = None
    """What the running engine reported."""


DownloadPhase = Literal["Pending", "Downloading", "Retrying", "Complete", "Failed"]


class DownloadStatus(ApiModel):
    """Progress of the download Job that fills the model cache."""

    phase: DownloadPhase | None = None
    """Pending (Job not running yet), Downloading, Retrying, Complete or Failed."""
    bytes_done: int | None = Field(default=None, ge=0)
    """Bytes of the model's files in the cache so far."""
    bytes_total: int | None = Field(default=None, ge=0)
    """Bytes of the model's files on the Hub at the resolved revision."""
    rate_bytes_per_second: int | None = Field(default=None, ge=0)
    """Download rate over the last few seconds."""
    eta_seconds: int | None = Field(default=None, ge=0)
    """Seconds left at the current rate."""
    summary: str | None = None
    """`done/total GiB, rate, ETA` in one line (printed by `kubectl get -o wide`)."""
    message: str | None = Field(default=None, max_length=4096)
    """The downloader's last word (e.g. why it is retrying or failed)."""


class ModelStatus(ApiModel):
    """What the pre-flight found out about the model, and the cache's state."""

    resolved_revision: str | None = Field(default=None, max_length=128)
    """Commit sha that spec.model.revision resolved to at the Hub; engine pods serve exactly
    this commit."""
    floating_revision: bool | None = None
    """True when spec.model.revision is a branch or tag (or unset), which may move."""
    size_bytes: int | None = Field(default=None, ge=0)
    """Total size of the model's files at the resolved revision."""
    cache_claim: str | None = None
    """Name of the PersistentVolumeClaim holding the cache."""
    download: DownloadStatus | None = None
    """Progress of the download into the cache."""


StartupPhase = Literal["Scheduling", "PullingImage", "Starting", "Downloading", "Loading", "Ready"]
CompileCacheOutcome = Literal["hit", "miss", "off", "rejected", "error"]


class EngineStartPhases(ApiModel):
    """Seconds of the engine's part of one start, read by its agent from the engine's own log
    lines (vLLM's, which the simulator prints too). Consecutive: once ready they add up to the
    agent process's start → ready. A phase whose lines were not seen is unset (its seconds are
    then in `untracedSeconds`)."""

    agent_start_seconds: float | None = Field(default=None, ge=0)
    """The agent's process created → it prepares the engine's start (Python's start; without a
    compile cache the engine is spawned then, and the agent's own imports overlap its start)."""
    prepare_seconds: float | None = Field(default=None, ge=0)
    """→ engine spawned (the compile cache seeded)."""
    engine_start_seconds: float | None = Field(default=None, ge=0)
    """Engine spawned → loading the model (importing torch and vLLM, config, tokenizer,
    starting the engine core and workers)."""
    weights_seconds: float | None = Field(default=None, ge=0)
    """Loading the weights (every worker)."""
    compile_seconds: float | None = Field(default=None, ge=0)
    """Compiling the model (torch.compile; on CPU the compile warm-up): what the compile cache
    saves."""
    warmup_seconds: float | None = Field(default=None, ge=0)
    """The rest of the engine's init: memory profiling, the KV cache, CUDA graph capture."""
    api_start_seconds: float | None = Field(default=None, ge=0)
    """Init done → the engine's API answers `/health`."""
    first_probe_seconds: float | None = Field(default=None, ge=0)
    """`/health` answers → the agent's first good one-token probe (the pod reports ready)."""
    untraced_seconds: float | None = Field(default=None, ge=0)
    """What no line accounts for (set once ready)."""


class ReplicaStartup(ApiModel):
    """Where one engine pod's cold start went, in seconds after the pod was created."""

    pod: str
    """Pod name."""
    phase: StartupPhase
    """Scheduling, PullingImage (image pull and container creation), Starting (the agent up,
    engine not yet known), Downloading or Loading (the agent's word), Ready."""
    created: str = Field(json_schema_extra={"format": "date-time"})
    """When the pod was created."""
    scheduled_after_seconds: int | None = None
    """Pod created → bound to a node."""
    started_after_seconds: int | None = None
    """Pod created → engine container running (scheduling, image pull, container creation)."""
    ready_after_seconds: int | None = None
    """Pod created → Ready (everything: download and weight loading included)."""
    downloaded_bytes: int | None = Field(default=None, ge=0)
    """While the engine downloads the weights itself (no `spec.model.cache`): the bytes in the
    pod's model directory so far, as its agent measured them."""
    compile_cache: CompileCacheOutcome | None = None
    """With `spec.model.cache.compileCache`, what this start found: hit (it loads what an
    earlier start compiled for the same key), miss (it compiles, and publishes for the next),
    off (not used: the agent's `/status.compileCache.seedMessage` says why), rejected (an entry
    that failed its checks: compiled afresh) or error. Unset without a compile cache."""
    engine: EngineStartPhases | None = None
    """The engine's part of the start, phase by phase, as far as it got."""


class StartupStatus(ApiModel):
    """The engine pods' cold starts."""

    summary: str = ""
    """The slowest replica not ready yet and its phase, or how long the slowest ready one
    took (printed by `kubectl get -o wide`)."""
    replicas: list[ReplicaStartup] = Field(default_factory=list, max_length=10)
    """Per replica, the ones not ready first, then the newest (at most 10)."""


class PrePullStatus(ApiModel):
    """The engine image on the nodes (with `spec.scheduling.prePullImage`)."""

    nodes: int = Field(default=0, ge=0)
    """Nodes the engine pods may run on (the pre-pull DaemonSet's desired pods)."""
    pulled: int = Field(default=0, ge=0)
    """Of those, nodes where the current image is pulled (its pre-pull pod is ready)."""
    message: str = Field(default="", max_length=1024)
    """`image on N of M nodes`, and why not on the others (an image pull error)."""


class ScaleToZeroStatus(ApiModel):
    """When the model last went to zero and last woke (with `spec.autoscaling.minReplicas: 0`)."""

    last_scaled_to_zero_time: str | None = None
    """When the operator last saw the engine workload at 0 after its idle period."""
    last_wake_time: str | None = None
    """When the operator last saw the workload leave 0 (llmop-router woke it)."""
    last_wake_seconds: float | None = None
    """Seconds from that wake to the first ready replica (unset while it is still waking)."""


AdapterPhase = Literal["Pending", "Loading", "Ready", "Degraded", "Failed"]


class AdapterStatus(ApiModel):
    """One adapter across the engine replicas."""

    name: str
    """`spec.adapters[].name`."""
    revision: str | None = None
    """The revision the replicas load (a commit sha when pinned or resolved)."""
    rank: int | None = None
    """`r` from the adapter's adapter_config.json, once a pre-flight or a replica read it."""
    phase: AdapterPhase
    """Pending (no replica has it yet), Loading, Ready (every ready replica serves it),
    Degraded (some replicas serve it, another failed it) or Failed (refused: see message)."""
    ready_replicas: int = 0
    """Ready replicas serving it."""
    replicas: int = 0
    """Ready replicas (that should serve it)."""
    message: str | None = Field(default=None, max_length=4096)
    """Why it failed or waits, with the fix (the engine's own words for a refused load)."""


class ModelRevision(ApiModel):
    """The pods that serve one model revision."""

    revision: str = Field(max_length=64)
    """A hash of the model and the engine flags that decide its tokens (model revision,
    tokenizer, dtype, quantization), read from the pod's engine container."""
    pods: list[str] = Field(default_factory=list, max_length=2000)
    """The names of the engine pods serving it (leaders only in a multi-node group)."""


class AdapterRevision(ApiModel):
    """One adapter's revision, as the router pins a stream of it to the files that began it."""

    name: str = Field(max_length=253)
    """`spec.adapters[].name`."""
    revision: str | None = Field(default=None, max_length=256)
    """The revision the operator asks the replicas to load (`status.adapters[].revision`);
    absent for files that carry none (`pvc://`)."""
    settled: bool = False
    """Every ready replica serves the adapter at `revision`. While not (an adapter being
    loaded, or replaced in place by a new revision), a stream of it cut mid-answer is not
    continued: which files a replica serves is not known."""


class RoutingStatus(ApiModel):
    """What the shared router may route to this LLMDeployment, as the operator decided."""

    served_names: list[str] = Field(default_factory=list, max_length=MAX_ADAPTERS + 1)
    """The model names (served name, adapter names) this LLMDeployment owns: the router routes
    a name only to the LLMDeployment that lists it here. A name another LLMDeployment owns is
    missing (Degraded, reason ModelNameConflict), and so is every name of one whose namespace
    may not serve through the router (reason NamespaceNotServed)."""
    model_revisions: list[ModelRevision] = Field(default_factory=list, max_length=64)
    """Which pods serve which model revision. The router continues a stream cut mid-answer
    only on a pod of the revision that started it (docs/router.md, "Request migration"): during a
    rollout that changes the model, old and new pods serve the same names."""
    adapter_revisions: list[AdapterRevision] | None = Field(default=None, max_length=MAX_ADAPTERS)
    """The declared adapters' revisions (absent without adapters). A stream of an adapter is
    continued only while the adapter is settled at the revision it had when the stream
    began: an adapter's files change in place, without a new pod."""


class LLMDeploymentStatus(ApiModel):
    """Observed state of an LLMDeployment (written only by the operator)."""

    observed_generation: int | None = None
    """The .metadata.generation the operator last acted on."""
    replicas: int | None = None
    """Engine pods that exist (the scale subresource's status replicas)."""
    ready_replicas: int | None = None
    """Engine pods that are ready to serve."""
    updated_replicas: int | None = None
    """Engine pods running the current template."""
    selector: str | None = None
    """Label selector of the engine pods (for the scale subresource and the HPA)."""
    replica_summary: str | None = None
    """Ready and desired replicas as `ready/desired` (printed by `kubectl get`)."""
    group_summary: str | None = None
    """With spec.engine.pipelineParallelSize > 1: ready and desired groups and the pods in each,
    as `ready/desired (N pods each)` (printed by `kubectl get -o wide`)."""
    endpoint: str | None = None
    """In-cluster base URL of the OpenAI-compatible API: the llmop router's when the model is
    routed and a router is installed, else the LLMDeployment's own Service's."""
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
    )
    """Ready, Reconciling, Stalled, CapacityPlanned and Degraded conditions."""
    plan: PlanStatus | None = None
    """Capacity plan."""
    model: ModelStatus | None = None
    """Resolved model revision and cache download progress (with spec.model.cache)."""
    startup: StartupStatus | None = None
    """Cold-start breakdown of the engine pods."""
    pre_pull: PrePullStatus | None = None
    """The engine image on the nodes (with `spec.scheduling.prePullImage`)."""
    inference_pool: str | None = None
    """Name of the InferencePool the operator applied for spec.router.inferencePool (kept so
    that removing the field deletes the pool without a request for every LLMDeployment)."""
    scale_to_zero: ScaleToZeroStatus | None = None
    """Scale-to-zero history (with spec.autoscaling.minReplicas: 0)."""
    adapters: list[AdapterStatus] | None = Field(
        default=None,
        max_length=MAX_ADAPTERS,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    """Per adapter: phase and how many ready replicas serve it (with spec.adapters)."""
    adapters_summary: str | None = None
    """Adapters every ready replica serves, as `ready/desired` (printed by `kubectl get`)."""
    routing: RoutingStatus | None = None
    """The model names this LLMDeployment owns through the shared router (with a router
    installed and spec.router.enabled)."""


class ObjectMeta(ApiModel):
    """The parts of metadata the operator reads."""

    name: str
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = None
    resource_version: str | None = None
    deletion_timestamp: str | None = None


class LLMDeployment(ApiModel):
    """An LLM served on GPUs: engine pods, a Service, and optionally an HPA, a PDB and an
    InferencePool."""

    api_version: str = API_VERSION
    kind: str = KIND
    metadata: ObjectMeta
    spec: LLMDeploymentSpec
    status: LLMDeploymentStatus = Field(default_factory=LLMDeploymentStatus)


ROOT_VALIDATIONS = (
    cel(
        f"size(self.metadata.name) <= {MAX_NAME_LENGTH}",
        f"metadata.name must be at most {MAX_NAME_LENGTH} characters (engine pods and the "
        "Service are named after it)",
    ),
    cel(
        "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
        "metadata.name must start with a letter and contain only lowercase letters, digits "
        "and '-' (it names the Service, a DNS-1035 label)",
    ),
    cel(
        "!has(self.spec) || !has(self.spec.adapters) || self.spec.adapters.all(a, a.name != "
        "(has(self.spec.model.servedName) ? self.spec.model.servedName : self.metadata.name))",
        "spec.adapters[].name must differ from the base model's served name "
        "(spec.model.servedName, else metadata.name): clients pick the base or an adapter by "
        "that name",
    ),
)
"""CEL on the object root (where metadata.name is visible)."""

PRINTER_COLUMNS = (
    {
        "name": "Model",
        "type": "string",
        "jsonPath": ".spec.model.name",
        "description": "Model being served",
    },
    {
        "name": "Ready",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
        "description": "Ready condition",
    },
    {
        "name": "Replicas",
        "type": "string",
        "jsonPath": ".status.replicaSummary",
        "description": "Ready / desired replicas",
    },
    {
        "name": "Endpoint",
        "type": "string",
        "jsonPath": ".status.endpoint",
        "description": "In-cluster API URL",
    },
    {
        "name": "Adapters",
        "type": "string",
        "jsonPath": ".status.adaptersSummary",
        "description": "LoRA adapters every ready replica serves / declared",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {
        "name": "Reason",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
        "priority": 1,
        "description": "Why the deployment is or is not ready",
    },
    {
        "name": "Download",
        "type": "string",
        "jsonPath": ".status.model.download.summary",
        "priority": 1,
        "description": "Model cache download: done/total, rate, ETA",
    },
    {
        "name": "Startup",
        "type": "string",
        "jsonPath": ".status.startup.summary",
        "priority": 1,
        "description": "The slowest replica still starting and its phase",
    },
    {
        "name": "Groups",
        "type": "string",
        "jsonPath": ".status.groupSummary",
        "priority": 1,
        "description": "Multi-node replicas: ready / desired groups and the pods in each",
    },
)
