"""Pure: the DaemonSet that keeps the engine image on every node the engine pods may run on.

Kubernetes has no object that says "have this image on these nodes"; the platform's standard
is a DaemonSet whose pods run the image and do nothing (Eclipse Che's kubernetes-image-puller;
kube-fledged and OpenKruise's ImagePullJob are the same idea with their own controllers). The
kubelet pulls the image to start the pod, and keeps it while the pod runs (image garbage
collection never removes an image a running container uses). So a wake from zero or a
scale-up onto one of these nodes never waits for the pull; a new image (a rollout) is pulled
on every node at once, before or while the engine pods roll.

The pods go where the engine pods may go (the same node selector, GPU product, tolerations and
node affinity; pod affinity is about engine pods and is left out), ask for no GPU and almost
nothing else, and carry labels of their own, so nothing that selects engine pods (the Service,
the PodMonitor, the NetworkPolicy, the operator's pod watch) takes them for one.
"""

from __future__ import annotations

from typing import Any

from llmop import kinds, names
from llmop.api.v1alpha1 import LLMDeployment
from llmop.render.deployment import RUN_AS_USER, engine_image, node_placement
from llmop.render.metadata import child_metadata
from llmop.settings import RenderSettings
from llmop_engine import contract

RESOURCES = {"requests": {"cpu": "1m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}}
"""`llmop-engine hold` is one idle Python process: 21 MB resident, measured."""


def render_pre_pull(llmd: LLMDeployment, settings: RenderSettings) -> dict[str, Any] | None:
    """The pre-pull DaemonSet with `spec.scheduling.prePullImage`, else None."""
    spec = llmd.spec
    if not spec.scheduling.pre_pull_image:
        return None
    name = llmd.metadata.name
    labels = names.pre_pull_labels(name)
    placement = node_placement(spec, settings)
    affinity = placement.pop("affinity", None) or {}
    if affinity.get("nodeAffinity"):
        placement["affinity"] = {"nodeAffinity": affinity["nodeAffinity"]}
    metadata = child_metadata(llmd)
    metadata["name"] = name + kinds.PRE_PULL.name_suffix
    return {
        "apiVersion": kinds.PRE_PULL.api_version,
        "kind": kinds.PRE_PULL.kind,
        "metadata": metadata,
        "spec": {
            "selector": {"matchLabels": labels},
            # A new image is pulled on every node at once: these pods serve nothing.
            "updateStrategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": "100%"},
            },
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "terminationGracePeriodSeconds": 5,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": RUN_AS_USER,
                        "runAsGroup": RUN_AS_USER,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [
                        {
                            "name": names.PRE_PULL_CONTAINER,
                            "image": engine_image(spec, settings),
                            "imagePullPolicy": settings.image_pull_policy,
                            "args": [contract.HOLD],
                            "resources": RESOURCES,
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "privileged": False,
                                "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"]},
                                "runAsNonRoot": True,
                            },
                        }
                    ],
                    **placement,
                },
            },
        },
    }
