"""The `LLMExternalModel` API (serving.llmop.dev/v1alpha1, namespaced): an OpenAI-compatible
API outside the cluster that answers a routed model's requests when the model cannot
(`spec.router.fallback[].externalModel` of an LLMDeployment).

Namespaced because its key is a Secret beside it, and the router reads Secrets in its own
namespace only: an `LLMExternalModel` anywhere else is never used. The router reads these
objects (`llmop_router.externals`, the same field names from
`llmop_router.contract.ExternalModelSpec`) and writes their status.
"""

from __future__ import annotations

from typing import Final

from pydantic import Field

from llmop.api.v1alpha1 import ApiModel, Condition, Pricing
from llmop_router import contract as router_contract

KIND: Final = router_contract.EXTERNAL_MODEL_KIND
PLURAL: Final = router_contract.EXTERNAL_MODEL_PLURAL
SINGULAR: Final = "llmexternalmodel"
SHORT_NAMES: Final = ("llmx",)
BASE_URL_PATTERN: Final = r"^https?://[^\s/?#]+(/[^\s?#]*)?$"
"""http(s), a host, an optional path; no query or fragment (the route is appended)."""


class SecretKeyRef(ApiModel):
    """A key of a Secret in the LLMExternalModel's own namespace."""

    name: str = Field(min_length=1, max_length=253)
    """The Secret's name."""
    key: str = Field(default="apiKey", min_length=1, max_length=253)
    """The key in the Secret's data whose value is the API key."""


class LLMExternalModelSpec(ApiModel):
    base_url: str = Field(alias="baseURL", max_length=2048, pattern=BASE_URL_PATTERN)
    """The API's base URL, up to and including its version, e.g. `https://api.example.com/v1`:
    the request's route after `/v1` is appended (`.../v1/chat/completions`)."""
    model: str = Field(min_length=1, max_length=256)
    """The model name sent upstream (the request's `model` is rewritten to it)."""
    api_key_secret_ref: SecretKeyRef | None = None
    """The API key, sent as `Authorization: Bearer <key>` instead of the tenant's (the tenant's
    key never leaves the cluster). Unset: no key is sent."""
    pricing: Pricing | None = None
    """What the API charges, for the gateway's metering and tenants' budgets (unset: the
    tokens are counted at no cost)."""
    max_concurrent_requests: int = Field(
        default=router_contract.DEFAULT_EXTERNAL_CONCURRENCY,
        ge=1,
        le=router_contract.MAX_EXTERNAL_CONCURRENCY,
    )
    """Requests in flight to the API at once, per router pod; a fallback past it is not taken
    (the model's own answer stands)."""
    timeout_seconds: int = Field(
        default=router_contract.DEFAULT_EXTERNAL_TIMEOUT_SECONDS,
        ge=1,
        le=router_contract.MAX_EXTERNAL_TIMEOUT_SECONDS,
    )
    """The most one answer may take, stream included; past it the answer is cut."""


class LLMExternalModelStatus(ApiModel):
    conditions: list[Condition] = Field(default_factory=list, max_length=8)
    """Ready: True when the router has the API key (or none is needed); False with reason
    SecretNotFound, SecretForbidden, KeyMissing or WrongNamespace and the fix."""


class LLMExternalModel(ApiModel):
    """An OpenAI-compatible API outside the cluster that llmop-router's gateway falls back to
    when a routed model cannot answer (`spec.router.fallback[].externalModel`). Lives in the
    router's namespace, beside the Secret holding its key; only tenants whose `spec.fallback`
    is Allowed are ever sent to it."""

    spec: LLMExternalModelSpec
    status: LLMExternalModelStatus | None = None
