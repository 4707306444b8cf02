"""Pure: where a model's weights are — a Hub repo id, or a `pvc://<claim>/<path>` on a volume —
and where an engine pod finds them. The command line (`engine_args`), the pod's volumes
(`deployment`) and the adapters' paths (`adapters`) all read the scheme here. The Hub token's
volume, mount and variable are here too: the engine pod and the download Job mount it alike.
"""

from __future__ import annotations

from typing import Any

from llmop import names
from llmop.api.v1alpha1 import ModelSpec, SecretKeyRef
from llmop_engine import contract

PVC_SCHEME = "pvc://"


def model_location(model: ModelSpec) -> str:
    """What vLLM loads: the repo id, or the path where the claim is mounted."""
    if model.name.startswith(PVC_SCHEME):
        claim, _, path = model.name[len(PVC_SCHEME) :].partition("/")
        return f"{names.PVC_MOUNT_ROOT}/{claim}/{path}".rstrip("/")
    return model.name


def pvc_claim(model: ModelSpec) -> str | None:
    """The PersistentVolumeClaim holding the weights, when the model lives on one."""
    if model.name.startswith(PVC_SCHEME):
        return model.name[len(PVC_SCHEME) :].partition("/")[0]
    return None


# --- The Hub token: a mounted file, never an environment variable --------------------------------

HF_TOKEN_VOLUME = "hf-token"
HF_TOKEN_MODE = 0o440
"""Owner and group (the pod's fsGroup) read; nobody writes."""


def hub_token_volume(ref: SecretKeyRef) -> dict[str, Any]:
    """The Secret volume of spec.model.tokenSecretRef: only its one key, as `token`."""
    filename = contract.HF_TOKEN_FILE.rpartition("/")[2]
    return {
        "name": HF_TOKEN_VOLUME,
        "secret": {
            "secretName": ref.name,
            "items": [{"key": ref.key, "path": filename}],
            "defaultMode": HF_TOKEN_MODE,
        },
    }


def hub_token_mount() -> dict[str, Any]:
    """Where the engine and the downloader find the token (`HF_TOKEN_PATH` names the file)."""
    return {"name": HF_TOKEN_VOLUME, "mountPath": contract.HF_TOKEN_DIR, "readOnly": True}


def hub_token_env() -> dict[str, Any]:
    """`huggingface_hub` (vLLM, the agent's adapter fetch, the downloader) reads the token from
    this file whenever `HF_TOKEN` is unset: the token is read when needed, not inherited by
    every child process as a variable would be."""
    return {"name": contract.Env.HF_TOKEN_PATH, "value": contract.HF_TOKEN_FILE}
