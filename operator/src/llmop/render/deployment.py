"""Pure: the engine pod template (probes, drain arithmetic, scheduling) and the Deployment that
wraps it for one-pod replicas. `render.leader_worker_set` wraps the same template for multi-node
replicas, so there is one engine container, one set of probes, volumes and drain."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from llmop import kinds, names
from llmop.api.v1alpha1 import LLMDeployment, LLMDeploymentSpec
from llmop.cpu_engine import cpu_engine
from llmop.render import adapters, compile_cache_key, engine_args, model_cache
from llmop.render.hashing import template_hash
from llmop.render.metadata import child_metadata
from llmop.render.model_source import hub_token_mount, hub_token_volume, pvc_claim
from llmop.settings import RenderSettings
from llmop_engine import contract

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
PRESTOP_DELIVERY_SECONDS = 10
"""The kubelet's grace clock starts when it execs the preStop hook, the agent's drain clock when
the hook reaches it: 4.6 and 6.1 s measured on a loaded 2-core node (0.5 s idle); the margin
allows 10 s (the hook is a Python process starting on a node busy with the engine)."""
ENGINE_END_SECONDS = contract.ENGINE_EXIT_GRACE_SECONDS + 1
"""At the drain's deadline the agent SIGTERMs the engine and SIGKILLs it after the exit grace;
one more second for the kill and the reaping."""
AGENT_EXIT_SECONDS = 2
"""The agent's own shutdown once the engine is gone (closing its servers): well under 1 s."""
DRAIN_MARGIN_SECONDS = PRESTOP_DELIVERY_SECONDS + ENGINE_END_SECONDS + AGENT_EXIT_SECONDS
"""Grace beyond propagation + drain (the agent's own budget, which it enforces): 23 s. The old
flat 15 s left 3 s in the worst run observed, when vLLM, not the agent, owned the deadline."""
PROGRESS_DEADLINE_MARGIN_SECONDS = 600
DEFAULT_MAX_SURGE = 1
"""The surge written while `spec.rollout.maxSurge` is unset and the room on the nodes was not
counted (a new Deployment: nothing rolls yet); a rollout's own count replaces it
(`llmop.rollout_room`)."""
"""A rollout may take one model load plus scheduling before the Deployment calls it stuck."""
RUN_AS_USER = 10001
"""Both engine images create this non-root user."""
DEFAULT_SHM = {"vllm": "8Gi", "simulator": "64Mi"}
"""NCCL needs a large /dev/shm for tensor parallelism; the simulator needs almost none."""
CPU_ENGINE_SHM = "1Gi"
"""vLLM's CPU build passes inputs between its processes through /dev/shm, no NCCL buffers."""


def termination_grace_period_seconds(spec: LLMDeploymentSpec) -> int:
    """Long enough for readiness to propagate and in-flight work to drain — derived, not guessed."""
    rollout = spec.rollout
    return rollout.endpoint_propagation_seconds + rollout.drain_seconds + DRAIN_MARGIN_SECONDS


def progress_deadline_seconds(load_timeout_seconds: int) -> int:
    """Slow model loads must not read as a stuck rollout."""
    return load_timeout_seconds + PROGRESS_DEADLINE_MARGIN_SECONDS


@dataclass(frozen=True)
class PodRole:
    """What differs between the pods of a multi-node replica: engine flags and env added to the
    one template, and whether the pod serves the API."""

    engine_flags: Sequence[str] = ()
    env: Sequence[dict[str, Any]] = field(default_factory=tuple)
    serves_api: bool = True


ONE_POD = PodRole()
"""A one-pod replica (the Deployment): the template exactly as it always was."""


def pod_template(
    llmd: LLMDeployment,
    settings: RenderSettings,
    *,
    load_timeout_seconds: int,
    role: PodRole = ONE_POD,
    kv_cache_tokens: int | None = None,
) -> dict[str, Any]:
    """The engine pod template (without the template-hash annotation, which its wrapper adds).
    `kv_cache_tokens`: the planned KV cache of one replica (the simulator is given it)."""
    pod_spec = _pod_spec(
        llmd,
        settings,
        load_timeout_seconds=load_timeout_seconds,
        role=role,
        kv_cache_tokens=kv_cache_tokens,
    )
    pod_metadata: dict[str, Any] = {
        "labels": names.child_labels(llmd.metadata.name),
        "annotations": {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(names.PROBE_PORT),
            "prometheus.io/path": names.METRICS_PATH,
        },
    }
    return {"metadata": pod_metadata, "spec": pod_spec}


def render_deployment(
    llmd: LLMDeployment,
    settings: RenderSettings,
    *,
    load_timeout_seconds: int,
    kv_cache_tokens: int | None = None,
) -> dict[str, Any]:
    """The Deployment. Without `spec.replicas` when autoscaling is on: the HPA owns the count."""
    name = llmd.metadata.name
    spec = llmd.spec
    template = pod_template(
        llmd,
        settings,
        load_timeout_seconds=load_timeout_seconds,
        kv_cache_tokens=kv_cache_tokens,
    )
    digest = template_hash(template)
    template["metadata"]["annotations"][names.ANNOTATION_TEMPLATE_HASH] = digest

    deployment_spec: dict[str, Any] = {}
    if spec.autoscaling is None:
        deployment_spec["replicas"] = spec.desired_fixed_replicas
    deployment_spec |= {
        "selector": {"matchLabels": names.selector_labels(name)},
        "strategy": {
            "type": "RollingUpdate",
            "rollingUpdate": {
                "maxSurge": DEFAULT_MAX_SURGE
                if spec.rollout.max_surge is None
                else spec.rollout.max_surge,
                "maxUnavailable": spec.rollout.max_unavailable,
            },
        },
        "progressDeadlineSeconds": progress_deadline_seconds(load_timeout_seconds),
        "revisionHistoryLimit": 3,
        "template": template,
    }
    return {
        "apiVersion": kinds.DEPLOYMENT.api_version,
        "kind": kinds.DEPLOYMENT.kind,
        "metadata": {
            **child_metadata(llmd),
            "annotations": {names.ANNOTATION_TEMPLATE_HASH: digest},
        },
        "spec": deployment_spec,
    }


def _pod_spec(
    llmd: LLMDeployment,
    settings: RenderSettings,
    *,
    load_timeout_seconds: int,
    role: PodRole,
    kv_cache_tokens: int | None,
) -> dict[str, Any]:
    spec = llmd.spec
    scheduling = spec.scheduling
    pod: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": termination_grace_period_seconds(spec),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_USER,
            "runAsGroup": RUN_AS_USER,
            "fsGroup": RUN_AS_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            _engine_container(llmd, settings, load_timeout_seconds, role, kv_cache_tokens)
        ],
        "volumes": _volumes(llmd),
    }
    pod |= node_placement(spec, settings)
    if scheduling.priority_class_name:
        pod["priorityClassName"] = scheduling.priority_class_name
    if scheduling.topology_spread_constraints:
        selector = {"matchLabels": names.selector_labels(llmd.metadata.name)}
        pod["topologySpreadConstraints"] = [
            {"labelSelector": selector, **constraint}
            for constraint in scheduling.topology_spread_constraints
        ]
    return pod


def node_placement(spec: LLMDeploymentSpec, settings: RenderSettings) -> dict[str, Any]:
    """Which nodes the engine pods may run on: node selector (with the GPU product),
    tolerations (with the GPU taint) and affinity, as pod spec fields."""
    scheduling = spec.scheduling
    pod: dict[str, Any] = {}
    node_selector = dict(sorted(scheduling.node_selector.items()))
    if spec.resources.gpu_product:
        node_selector[GPU_PRODUCT_LABEL] = spec.resources.gpu_product
    if node_selector:
        pod["nodeSelector"] = node_selector
    tolerations = [t.model_dump(by_alias=True, exclude_none=True) for t in scheduling.tolerations]
    if spec.resources.gpus > 0:
        # GPU node pools are commonly tainted with the device resource name (GKE, AKS, EKS docs).
        gpu_toleration = {
            "key": gpu_resource_name(spec, settings),
            "operator": "Exists",
            "effect": "NoSchedule",
        }
        if gpu_toleration not in tolerations:
            tolerations.append(gpu_toleration)
    if tolerations:
        pod["tolerations"] = tolerations
    if scheduling.affinity:
        pod["affinity"] = scheduling.affinity
    return pod


def _engine_container(
    llmd: LLMDeployment,
    settings: RenderSettings,
    load_timeout_seconds: int,
    role: PodRole,
    kv_cache_tokens: int | None,
) -> dict[str, Any]:
    spec = llmd.spec
    probe_port = {"port": names.PROBE_PORT_NAME}
    ports = [{"name": names.PROBE_PORT_NAME, "containerPort": names.PROBE_PORT, "protocol": "TCP"}]
    if role.serves_api:
        api_port = {"name": names.API_PORT_NAME, "containerPort": spec.service.port}
        ports.insert(0, {**api_port, "protocol": "TCP"})
    image = engine_image(spec, settings)
    args = engine_args.agent_args(llmd, role.engine_flags, kv_cache_tokens=kv_cache_tokens)
    flags = contract.split_engine_args(args)[1]
    key = compile_cache_key.compile_cache_key(llmd, image=image, flags=flags)
    env = engine_args.agent_env(
        llmd, load_timeout_seconds=load_timeout_seconds, compile_cache_key=key
    )
    return {
        "name": names.ENGINE_CONTAINER,
        "image": image,
        "imagePullPolicy": settings.image_pull_policy,
        "args": args,
        "env": [*role.env, *env, *adapters.hub_env(spec, settings)],
        "ports": ports,
        "resources": _resources(spec, settings),
        # The agent answers /livez from its first second; it alone judges load progress and
        # stalls, so the startup probe only covers the agent's own start (60 s). Every second:
        # the kubelet runs no readiness probe before it passes, so its period delays Ready.
        "startupProbe": {
            "httpGet": {"path": contract.LIVEZ_PATH, **probe_port},
            "periodSeconds": 1,
            "failureThreshold": 60,
            "timeoutSeconds": 2,
        },
        "livenessProbe": {
            "httpGet": {"path": contract.LIVEZ_PATH, **probe_port},
            "periodSeconds": 10,
            "failureThreshold": 3,
            "timeoutSeconds": 5,
        },
        # Every second: a new pod joins the Service within a second of the agent's first good
        # deep probe (a rollout waits on each new pod's Ready), and a draining or hung pod
        # leaves it within two. /readyz answers from the agent's state; measured cost about
        # 1 ms of the agent's CPU per probe (0.1 % of a core per pod).
        "readinessProbe": {
            "httpGet": {"path": contract.READYZ_PATH, **probe_port},
            "periodSeconds": 1,
            "failureThreshold": 2,
            "successThreshold": 1,
            "timeoutSeconds": 3,
        },
        "lifecycle": {"preStop": {"exec": {"command": contract.drain_command()}}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
        },
        "volumeMounts": _volume_mounts(llmd),
    }


def engine_image(spec: LLMDeploymentSpec, settings: RenderSettings) -> str:
    if spec.engine.image:
        return spec.engine.image
    if spec.engine.backend == "simulator":
        return settings.simulator_image
    return settings.vllm_cpu_image if cpu_engine(spec) else settings.vllm_image


def gpu_resource_name(spec: LLMDeploymentSpec, settings: RenderSettings) -> str:
    """The CR's GPU resource name, else the operator's configured one."""
    return spec.resources.gpu_resource_name or settings.gpu_resource_name


def _resources(spec: LLMDeploymentSpec, settings: RenderSettings) -> dict[str, Any]:
    resources = spec.resources
    limits: dict[str, Any] = {}
    requests: dict[str, Any] = {}
    if resources.gpus > 0:
        limits[gpu_resource_name(spec, settings)] = resources.gpus
    if resources.cpu is not None:
        limits["cpu"] = requests["cpu"] = resources.cpu
    if resources.memory is not None:
        limits["memory"] = requests["memory"] = resources.memory
    out: dict[str, Any] = {}
    if limits:
        out["limits"] = limits
    if requests:
        out["requests"] = requests
    return out


def _volumes(llmd: LLMDeployment) -> list[dict[str, Any]]:
    spec = llmd.spec
    default_shm = CPU_ENGINE_SHM if cpu_engine(spec) else DEFAULT_SHM[spec.engine.backend]
    shm = spec.resources.shared_memory or default_shm
    volumes: list[dict[str, Any]] = [
        {"name": names.DEV_SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": shm}},
        _model_cache_volume(llmd),
        {"name": "agent-run", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
    ]
    adapters_volume = adapters.volume(llmd)
    if adapters_volume is not None:
        volumes.append(adapters_volume)
    claim = pvc_claim(spec.model)
    if claim is not None:
        volumes.append(
            {"name": "model-pvc", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
        )
    token = engine_args.engine_hub_token(llmd)
    if token is not None:
        volumes.append(hub_token_volume(token))
    return volumes


def _model_cache_volume(llmd: LLMDeployment) -> dict[str, Any]:
    """The claim the download Job filled (spec.model.cache), else a per-pod emptyDir."""
    claim = model_cache.cache_claim(llmd)
    if claim is None:
        return {"name": names.MODEL_CACHE_VOLUME, "emptyDir": {}}
    return {"name": names.MODEL_CACHE_VOLUME, "persistentVolumeClaim": {"claimName": claim}}


def _volume_mounts(llmd: LLMDeployment) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = [
        {"name": names.DEV_SHM_VOLUME, "mountPath": "/dev/shm"},
        {"name": names.MODEL_CACHE_VOLUME, "mountPath": names.MODEL_CACHE_PATH},
        {"name": "agent-run", "mountPath": names.AGENT_SOCKET_DIR},
    ]
    adapters_mount = adapters.volume_mount(llmd)
    if adapters_mount is not None:
        mounts.append(adapters_mount)
    claim = pvc_claim(llmd.spec.model)
    if claim is not None:
        mounts.append(
            {
                "name": "model-pvc",
                "mountPath": f"{names.PVC_MOUNT_ROOT}/{claim}",
                "readOnly": True,
            }
        )
    if engine_args.engine_hub_token(llmd) is not None:
        mounts.append(hub_token_mount())
    return mounts
