"""The served version of the LLMDeployment API."""

from llmop.api.v1alpha1 import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    Condition,
    LLMDeployment,
    LLMDeploymentSpec,
    LLMDeploymentStatus,
)

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "PLURAL",
    "VERSION",
    "Condition",
    "LLMDeployment",
    "LLMDeploymentSpec",
    "LLMDeploymentStatus",
]
