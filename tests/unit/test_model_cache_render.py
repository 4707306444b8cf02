"""Pure rendering of the model cache: the claim, the download Job, what a Job's status means,
and the engine Deployment reading the cache offline at the resolved commit."""

from __future__ import annotations

from typing import Any

import pytest

from llmop import names
from llmop.api.v1alpha1 import LLMDeployment
from llmop.desired import desired_state
from llmop.render import model_cache
from llmop.settings import RenderSettings

SHA = "0123456789abcdef0123456789abcdef01234567"
SETTINGS = RenderSettings(hub_endpoint="http://hub.local:8080")


def llmd(cache: dict[str, Any] | None, **model: Any) -> LLMDeployment:
    spec_model: dict[str, Any] = {"name": "Qwen/Qwen2.5-0.5B-Instruct", **model}
    if cache is not None:
        spec_model["cache"] = cache
    return LLMDeployment.model_validate(
        {
            "metadata": {"name": "chat", "namespace": "ml", "uid": "u", "generation": 1},
            "spec": {
                "model": spec_model,
                "engine": {"backend": "simulator"},
                "resources": {"gpus": 1, "gpuProduct": "NVIDIA-H100-80GB-HBM3"},
            },
        }
    )


def test_operator_made_claim() -> None:
    pvc = model_cache.render_pvc(llmd({"size": "40Gi", "storageClassName": "fast"}))
    assert pvc is not None
    assert pvc["metadata"]["name"] == "chat-model-cache"
    assert pvc["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "40Gi"}},
        "storageClassName": "fast",
    }


def test_existing_claim_is_used_not_created() -> None:
    model = llmd({"existingClaim": "weights"})
    assert model_cache.render_pvc(model) is None
    assert model_cache.cache_claim(model) == "weights"
    assert model_cache.cache_claim(llmd(None)) is None


def test_download_job() -> None:
    job = model_cache.render_download_job(
        llmd({"size": "1Gi"}, tokenSecretRef={"name": "hf", "key": "tok"}),
        SETTINGS,
        revision=SHA,
    )
    assert job["metadata"]["name"] == "chat-dl-01234567"
    spec = job["spec"]
    rule = spec["podFailurePolicy"]["rules"][0]
    assert rule["action"] == "FailJob"
    assert rule["onExitCodes"]["values"] == [model_cache.EXIT_FATAL]
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    container = pod["containers"][0]
    assert container["args"][:5] == [
        "download",
        "--model",
        "Qwen/Qwen2.5-0.5B-Instruct",
        "--revision",
        SHA,
    ]
    env = {e["name"]: e for e in container["env"]}
    assert env["HF_ENDPOINT"]["value"] == "http://hub.local:8080"
    assert env["HF_HOME"]["value"] == names.MODEL_CACHE_PATH
    # The token is a file the downloader's huggingface_hub reads (HF_TOKEN_PATH), not a variable.
    assert "HF_TOKEN" not in env
    assert env["HF_TOKEN_PATH"]["value"] == "/var/run/secrets/llmop/hf-token/token"
    assert pod["volumes"] == [
        {
            "name": names.MODEL_CACHE_VOLUME,
            "persistentVolumeClaim": {"claimName": "chat-model-cache"},
        },
        {
            "name": "hf-token",
            "secret": {
                "secretName": "hf",
                "items": [{"key": "tok", "path": "token"}],
                "defaultMode": 0o440,
            },
        },
    ]
    assert container["volumeMounts"][1] == {
        "name": "hf-token",
        "mountPath": "/var/run/secrets/llmop/hf-token",
        "readOnly": True,
    }


def test_download_pod_is_never_selected_as_an_engine_replica() -> None:
    job = model_cache.render_download_job(llmd({"size": "1Gi"}), SETTINGS, revision=SHA)
    labels = job["spec"]["template"]["metadata"]["labels"]
    selector = names.selector_labels("chat")
    assert not selector.items() <= labels.items()
    assert names.LABEL_DEPLOYMENT not in labels  # the engine-pod watch keys on it
    assert labels[names.LABEL_MANAGED_BY] == names.MANAGED_BY  # the Job watch filters on it


@pytest.mark.parametrize(
    ("status", "phase"),
    [
        (None, "Pending"),
        ({}, "Pending"),
        ({"active": 1}, "Downloading"),
        ({"failed": 1}, "Downloading"),
        ({"conditions": [{"type": "Complete", "status": "True"}]}, "Complete"),
        ({"conditions": [{"type": "Failed", "status": "True", "reason": "X"}]}, "Failed"),
        ({"conditions": [{"type": "Failed", "status": "False"}], "active": 1}, "Downloading"),
    ],
)
def test_download_phase(status: dict[str, Any] | None, phase: str) -> None:
    job = None if status is None else {"status": status}
    assert model_cache.download_phase(job)[0] == phase


def test_engine_reads_the_cache_offline_at_the_resolved_commit() -> None:
    desired = desired_state(
        llmd({"size": "1Gi"}, revision="main", tokenSecretRef={"name": "hf"}),
        SETTINGS,
        resolved_revision=SHA,
    )
    assert desired.children is not None
    pod = desired.children.deployment["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == names.MODEL_CACHE_VOLUME)
    assert volume["persistentVolumeClaim"] == {"claimName": "chat-model-cache"}
    container = pod["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["HF_HUB_OFFLINE"]["value"] == "1"
    assert "HF_TOKEN_PATH" not in env  # offline: the token stays with the download Job
    assert not any(v["name"] == "hf-token" for v in pod["volumes"])
    args = container["args"]
    assert args[args.index("--revision") + 1] == SHA


def test_without_a_cache_nothing_changes() -> None:
    desired = desired_state(llmd(None, revision="main"), SETTINGS)
    assert desired.children is not None
    pod = desired.children.deployment["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == names.MODEL_CACHE_VOLUME)
    assert volume == {"name": names.MODEL_CACHE_VOLUME, "emptyDir": {}}
    env = {e["name"] for e in pod["containers"][0]["env"]}
    assert "HF_HUB_OFFLINE" not in env


GIB = 1024**3


def test_download_status_while_running_shows_bytes_rate_and_eta() -> None:
    progress = {
        "phase": "downloading",
        "bytesDone": 3 * GIB,
        "bytesTotal": 16 * GIB,
        "rateBytesPerSecond": 100 * 2**20,
        "etaSeconds": 133,
        "message": "commit abc",
    }
    status = model_cache.download_status("Downloading", "", progress, 16 * GIB)
    assert status.phase == "Downloading"
    assert (status.bytes_done, status.bytes_total) == (3 * GIB, 16 * GIB)
    assert status.rate_bytes_per_second == 100 * 2**20
    assert status.eta_seconds == 133
    assert status.summary == "Downloading 3.00 GiB/16.00 GiB 100.0 MiB/s ETA 2m13s"


def test_download_status_retrying_names_why() -> None:
    progress = {"phase": "retrying", "bytesDone": 0, "bytesTotal": GIB, "message": "ConnectError"}
    status = model_cache.download_status("Downloading", "", progress, GIB)
    assert status.phase == "Retrying"
    assert status.message == "ConnectError"


@pytest.mark.parametrize(
    ("phase", "summary", "done"),
    [
        ("Pending", "Pending 0.0 MiB/1.00 GiB", None),
        ("Complete", "Complete 1.00 GiB/1.00 GiB", GIB),
    ],
)
def test_download_status_without_progress(phase: str, summary: str, done: int | None) -> None:
    status = model_cache.download_status(phase, "", None, GIB)  # type: ignore[arg-type]
    assert status.summary == summary
    assert status.bytes_done == done
    assert status.eta_seconds is None
