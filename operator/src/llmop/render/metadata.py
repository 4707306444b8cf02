"""Pure: the metadata every child carries — the parent's name and namespace, our labels only."""

from __future__ import annotations

from typing import Any

from llmop import names
from llmop.api.v1alpha1 import LLMDeployment


def child_metadata(llmd: LLMDeployment) -> dict[str, Any]:
    """Name and namespace of the parent, and our own labels (never the parent's)."""
    name = llmd.metadata.name
    return {
        "name": name,
        "namespace": llmd.metadata.namespace,
        "labels": names.child_labels(name),
    }
