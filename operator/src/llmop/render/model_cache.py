"""Pure: the model cache's children — the PersistentVolumeClaim and the download Job — and what
a Job's status says about the download.

Why a Job and not an init container: the cache must be filled once per cache, not once per pod.
An init container runs in every engine pod — N replicas starting together would download the
same files N times into one volume (racing on it), and each would hold its GPUs idle while it
waits. A Job runs one downloader per cache and revision, before any engine pod exists, so no
GPU waits on the network; it has its own retry budget (`backoffLimit`), deadline
(`activeDeadlineSeconds`) and a failure policy that stops at once on what a retry cannot fix
(the downloader's exit code 2: no access, unknown repo or revision). Its completion is a durable
record that the cache holds the resolved commit: a restart or a scale-up reads the cache and
downloads nothing. The Job is named after the commit, so a new revision gets a new download
into the same cache (files shared between commits are not fetched again).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from llmop import kinds, names
from llmop.api.v1alpha1 import DownloadStatus, LLMDeployment, ModelCacheSpec
from llmop.cpu_engine import cpu_engine
from llmop.render.metadata import child_metadata
from llmop.render.model_source import hub_token_env, hub_token_mount, hub_token_volume
from llmop.settings import RenderSettings
from llmop_engine import contract

DOWNLOAD_CONTAINER = "download"
DOWNLOAD_APP_NAME = "llmop-model-download"
DOWNLOAD_DEADLINE_SECONDS = contract.DOWNLOAD_DEADLINE_SECONDS
JOB_DEADLINE_MARGIN_SECONDS = 600
"""The Job's deadline allows the downloader's plus scheduling and image pull."""
JOB_BACKOFF_LIMIT = 3
"""Pod-level failures (eviction, OOM, node loss) retried by the Job; the downloader retries
network failures itself, within one pod."""
EXIT_FATAL = contract.DownloadExit.FATAL
RUN_AS_USER = 10001
DEFAULT_ACCESS_MODES = ("ReadWriteOnce",)

DownloadPhase = Literal["Pending", "Downloading", "Complete", "Failed"]


def cache_claim(llmd: LLMDeployment) -> str | None:
    """The claim holding the cache: the user's, or the one the operator creates."""
    cache = llmd.spec.model.cache
    if cache is None:
        return None
    return cache.existing_claim or f"{llmd.metadata.name}-model-cache"


def render_pvc(llmd: LLMDeployment) -> dict[str, Any] | None:
    """The claim the operator creates (None with `existingClaim` or without a cache)."""
    cache: ModelCacheSpec | None = llmd.spec.model.cache
    if cache is None or cache.size is None:
        return None
    spec: dict[str, Any] = {
        "accessModes": list(cache.access_modes or DEFAULT_ACCESS_MODES),
        "resources": {"requests": {"storage": cache.size}},
    }
    if cache.storage_class_name is not None:
        spec["storageClassName"] = cache.storage_class_name
    metadata = child_metadata(llmd)
    metadata["name"] = cache_claim(llmd)
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": metadata, "spec": spec}


def download_labels(llmd: LLMDeployment) -> dict[str, str]:
    """Labels of the Job and its pod: ours (the Job watch filters on managed-by) but never the
    engine's selector labels, so the Service never routes API traffic to the downloader and
    the engine-pod watch never mistakes it for a replica."""
    return {
        names.LABEL_NAME: DOWNLOAD_APP_NAME,
        names.LABEL_INSTANCE: llmd.metadata.name,
        names.LABEL_MANAGED_BY: names.MANAGED_BY,
        names.LABEL_COMPONENT: "model-download",
    }


def download_job_name(llmd: LLMDeployment, revision: str) -> str:
    """`<name>-dl-<commit[:8]>`: at most 50 + 12 characters, under the 63 of a label value."""
    return f"{llmd.metadata.name}-dl-{revision[:8]}"


def render_download_job(
    llmd: LLMDeployment, settings: RenderSettings, *, revision: str
) -> dict[str, Any]:
    """The Job that fills the cache with `revision` (a resolved commit)."""
    spec = llmd.spec
    env: list[dict[str, Any]] = [{"name": contract.Env.HF_HOME, "value": names.MODEL_CACHE_PATH}]
    if settings.hub_endpoint:
        env.append({"name": "HF_ENDPOINT", "value": settings.hub_endpoint})
    token = spec.model.token_secret_ref
    mounts = [{"name": names.MODEL_CACHE_VOLUME, "mountPath": names.MODEL_CACHE_PATH}]
    volumes: list[dict[str, Any]] = [
        {
            "name": names.MODEL_CACHE_VOLUME,
            "persistentVolumeClaim": {"claimName": cache_claim(llmd)},
        }
    ]
    if token is not None:
        # A file, not a variable (model_source.hub_token_env says why).
        env.append(hub_token_env())
        mounts.append(hub_token_mount())
        volumes.append(hub_token_volume(token))
    container = {
        "name": DOWNLOAD_CONTAINER,
        "image": _image(llmd, settings),
        "imagePullPolicy": settings.image_pull_policy,
        "args": [
            contract.DOWNLOAD,
            contract.DownloadFlag.MODEL,
            spec.model.name,
            contract.DownloadFlag.REVISION,
            revision,
            contract.DownloadFlag.HF_HOME,
            names.MODEL_CACHE_PATH,
            contract.DownloadFlag.DEADLINE_SECONDS,
            str(DOWNLOAD_DEADLINE_SECONDS),
            contract.DownloadFlag.PROGRESS_PORT,
            str(names.PROBE_PORT),
        ],
        "env": env,
        "ports": [
            {"name": names.PROBE_PORT_NAME, "containerPort": names.PROBE_PORT, "protocol": "TCP"}
        ],
        "volumeMounts": mounts,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
        },
    }
    metadata = child_metadata(llmd)
    metadata["name"] = download_job_name(llmd, revision)
    labels = download_labels(llmd)
    metadata["labels"] = labels
    return {
        "apiVersion": kinds.JOB.api_version,
        "kind": kinds.JOB.kind,
        "metadata": metadata,
        "spec": {
            "backoffLimit": JOB_BACKOFF_LIMIT,
            "activeDeadlineSeconds": DOWNLOAD_DEADLINE_SECONDS + JOB_DEADLINE_MARGIN_SECONDS,
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "FailJob",
                        "onExitCodes": {
                            "containerName": DOWNLOAD_CONTAINER,
                            "operator": "In",
                            "values": [EXIT_FATAL],
                        },
                    }
                ]
            },
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": RUN_AS_USER,
                        "runAsGroup": RUN_AS_USER,
                        "fsGroup": RUN_AS_USER,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    }


def _image(llmd: LLMDeployment, settings: RenderSettings) -> str:
    """The engine image runs the downloader (it has `huggingface_hub`): no extra image."""
    spec = llmd.spec
    if spec.engine.image:
        return spec.engine.image
    if spec.engine.backend == "simulator":
        return settings.simulator_image
    return settings.vllm_cpu_image if cpu_engine(spec) else settings.vllm_image


def download_phase(job: dict[str, Any] | None) -> tuple[DownloadPhase, str]:
    """What the Job's status says: (phase, message)."""
    if job is None:
        return "Pending", "the download Job does not exist yet"
    status = job.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("status") != "True":
            continue
        if condition.get("type") == "Complete":
            return "Complete", ""
        if condition.get("type") == "Failed":
            reason = condition.get("reason") or "Failed"
            return "Failed", f"{reason}: {condition.get('message') or 'the download Job failed'}"
    if status.get("active"):
        return "Downloading", ""
    if status.get("failed"):
        return "Downloading", f"retrying after {status['failed']} failed pod(s)"
    return "Pending", "waiting for the download pod to start"


def _size(value: float) -> str:
    gib = 1024**3
    return f"{value / gib:.2f} GiB" if value >= gib else f"{value / 2**20:.1f} MiB"


def _duration(seconds: int) -> str:
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and value >= 0 else None


def download_status(
    phase: DownloadPhase,
    message: str,
    progress: Mapping[str, Any] | None,
    total: int | None,
) -> DownloadStatus:
    """status.model.download from the Job's phase and, while it runs, the downloader's own
    progress (`GET /progress`); the summary is what `kubectl get -o wide` prints."""
    done = total if phase == "Complete" else None
    rate = eta = None
    shown: str = phase
    if progress is not None and phase == "Downloading":
        key = contract.ProgressKey
        done = _int(progress.get(key.BYTES_DONE))
        rate = _int(progress.get(key.RATE_BYTES_PER_SECOND))
        eta = _int(progress.get(key.ETA_SECONDS))
        total = _int(progress.get(key.BYTES_TOTAL)) or total
        if progress.get(key.PHASE) == contract.PROGRESS_RETRYING:
            shown = "Retrying"
        message = str(progress.get(key.MESSAGE) or message)
    parts = [shown]
    if total:
        parts.append(f"{_size(done or 0)}/{_size(total)}")
    if rate:
        parts.append(f"{_size(rate)}/s")
    if eta is not None and phase == "Downloading":
        parts.append(f"ETA {_duration(eta)}")
    return DownloadStatus(
        phase="Retrying" if shown == "Retrying" else phase,
        bytes_done=done,
        bytes_total=total,
        rate_bytes_per_second=rate,
        eta_seconds=eta if phase == "Downloading" else None,
        summary=" ".join(parts),
        message=message or None,
    )
