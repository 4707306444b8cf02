"""Pure: where a model's weights are — a Hub repo id, or a `pvc://<claim>/<path>` on a volume —
and where an engine pod finds them. The command line (`engine_args`), the pod's volumes
(`deployment`) and the adapters' paths (`adapters`) all read the scheme here.
"""

from __future__ import annotations

from llmop import names
from llmop.api.v1alpha1 import ModelSpec

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
