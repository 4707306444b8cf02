"""The `LLMTenant` API (serving.llmop.dev/v1alpha1, cluster-scoped): who may call the router's
gateway, with which keys, for which models, within which limits and budget.

Platform-owned (tenants must not raise their own limits), so cluster-scoped and GitOps-able: a
key is stored only as its SHA-256, which may be committed. The router reads these objects
(`llmop_router.tenants`, the same field names from `llmop_router.contract.TenantSpec`); the
API server refuses what the router could not use, with the field and the fix.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import ConfigDict, Field

from llmop.api.v1alpha1 import DECIMAL_PATTERN, ApiModel, Condition, cel
from llmop_router import contract as router_contract

KIND: Final = router_contract.TENANT_KIND
PLURAL: Final = router_contract.TENANT_PLURAL
SINGULAR: Final = "llmtenant"
SHORT_NAMES: Final = ("llmt",)
MAX_KEYS: Final = 32
MAX_MODELS: Final = 64
KEY_NAME_PATTERN: Final = r"^[a-z0-9]([-a-z0-9._]*[a-z0-9])?$"
ModelPattern = Annotated[str, Field(min_length=1, max_length=253)]
"""A served model name or a glob (`qwen-*`, `*`)."""


class ApiKeySpec(ApiModel):
    """One API key of the tenant, as its SHA-256 (the key itself is never stored)."""

    name: str = Field(min_length=1, max_length=63, pattern=KEY_NAME_PATTERN)
    """Unique in the tenant; shown in the access log and status, never in a metric label."""
    sha256: str = Field(min_length=64, max_length=64, pattern=router_contract.API_KEY_PATTERN)
    """The key's SHA-256 as 64 lowercase hex digits (`llmop key new` prints it; or
    `printf %s "$KEY" | sha256sum`)."""
    prefix: str | None = Field(default=None, max_length=16)
    """The key's first characters, for people and secret scanners (optional)."""
    not_after: str | None = Field(default=None, json_schema_extra={"format": "date-time"})
    """After this time the key is refused: rotate by adding the new key, moving clients to it,
    then deleting the old one."""
    disabled: bool = False
    """Refuse the key without deleting it."""


class RateLimits(ApiModel):
    """Per-minute limits; each optional."""

    requests_per_minute: int | None = Field(default=None, ge=1, le=10_000_000)
    """Requests a minute."""
    tokens_per_minute: int | None = Field(default=None, ge=1, le=10_000_000_000)
    """Input and output tokens a minute (the prompt estimated at admission, settled from the
    answer's usage)."""
    output_tokens_per_minute: int | None = Field(default=None, ge=1, le=10_000_000_000)
    """Output tokens a minute."""


class TenantLimits(RateLimits):
    """The tenant's limits across every model."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.outputTokensPerMinute) || !has(self.tokensPerMinute) || "
                    "self.outputTokensPerMinute <= self.tokensPerMinute",
                    "spec.limits.outputTokensPerMinute must not exceed tokensPerMinute (which "
                    "counts output tokens too): lower it or raise tokensPerMinute",
                ),
                cel(
                    "!has(self.maxTokensPerRequest) || !has(self.reserveOutputTokens) || "
                    "self.reserveOutputTokens <= self.maxTokensPerRequest",
                    "spec.limits.reserveOutputTokens must not exceed maxTokensPerRequest (no "
                    "request may ask for more)",
                ),
            ]
        }
    )

    max_concurrent_requests: int | None = Field(default=None, ge=1, le=100_000)
    """Requests running at once (each holds a lease that expires by itself if a router dies)."""
    max_tokens_per_request: int | None = Field(default=None, ge=1, le=10_000_000)
    """A request asking for more `max_tokens` is answered 400."""
    reserve_output_tokens: int | None = Field(default=None, ge=0, le=10_000_000)
    """Output tokens charged at admission when `max_tokens` is unset or larger
    [default 512]; the answer's usage settles the difference."""
    burst_seconds: int | None = Field(default=None, ge=1, le=3600)
    """How many seconds of its rate the tenant may send at once [default 10]."""
    mode: Literal["Enforce", "Shadow"] = "Enforce"
    """Shadow: count and report what would be refused (llmop_gateway_shadow_rejected_total),
    refuse nothing."""


class ModelLimits(RateLimits):
    """Stricter limits of the tenant on some models."""

    model: str = Field(min_length=1, max_length=253)
    """A served model name or a glob (`qwen-*`)."""


class Budget(ApiModel):
    """Spending per calendar month (UTC), at the models' prices (`spec.router.pricing` of each
    LLMDeployment)."""

    monthly: str = Field(pattern=DECIMAL_PATTERN)
    """Past it the tenant's requests are answered 403 insufficient_quota until the month ends
    (a decimal string, e.g. "500")."""


class LLMTenantSpec(ApiModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.apiKeys) || self.apiKeys.all(k, "
                    "self.apiKeys.exists_one(o, o.name == k.name))",
                    "spec.apiKeys[].name must be unique in the tenant",
                    ".apiKeys",
                ),
                cel(
                    "!has(self.apiKeys) || self.apiKeys.all(k, "
                    "self.apiKeys.exists_one(o, o.sha256 == k.sha256))",
                    "spec.apiKeys[].sha256 is listed twice: each key once",
                    ".apiKeys",
                ),
            ]
        }
    )

    api_keys: list[ApiKeySpec] = Field(default_factory=list, max_length=MAX_KEYS)
    """The tenant's keys (SHA-256 only). A hash listed by two tenants is refused for both
    (status DuplicateKeyHash names them)."""
    models: list[ModelPattern] = Field(default_factory=lambda: ["*"], max_length=MAX_MODELS)
    """Served model names or globs the tenant may use (`*`: every routed model). Any other
    model is answered 404, as if it did not exist, and `/v1/models` lists only these."""
    limits: TenantLimits | None = None
    """Limits across models (none: unlimited)."""
    model_limits: list[ModelLimits] = Field(default_factory=list, max_length=MAX_MODELS)
    """Stricter limits on some models (the first entry matching a model applies)."""
    budget: Budget | None = None
    """A monthly spending cap."""
    priority_class_name: str | None = Field(default=None, min_length=1, max_length=253)
    """The `LLMPriorityClass` its requests wait under when a model is saturated (every slot of
    its engines busy): higher classes are served first. None: the class marked
    `globalDefault`, else value 0. A request may move to a class of lower or equal value with
    the `X-Llmop-Priority-Class` header, never to a higher one."""
    weight: int = Field(default=1, ge=1, le=router_contract.MAX_WEIGHT)
    """The tenant's share of a saturated model among the tenants of its class: weights 2 and 1
    get service (input + 2 x output tokens) in the ratio 2:1."""
    fallback: Literal["Allowed", "InClusterOnly", "Never"] = (
        router_contract.FALLBACK_IN_CLUSTER_ONLY
    )
    """Which fallbacks (`spec.router.fallback` of the model asked for) may answer its
    requests when the model cannot: InClusterOnly, other routed models it may use; Allowed,
    those and external APIs (LLMExternalModel: they cost money); Never, none."""


class TenantUsage(ApiModel):
    """The month's use, as the routers metered it."""

    month: str = Field(pattern=r"^[0-9]{4}-[0-9]{2}$")
    input_tokens: int = Field(default=0, ge=0)
    cached_input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)
    cost: str = Field(default="0", pattern=DECIMAL_PATTERN)


class LLMTenantStatus(ApiModel):
    conditions: list[Condition] = Field(default_factory=list, max_length=16)
    """Ready, DuplicateKeyHash, KeyExpiringSoon, UnknownModels."""
    usage: TenantUsage | None = None
    """This month's tokens and cost."""


class LLMTenant(ApiModel):
    """A caller of llmop-router's gateway: API keys (SHA-256 only), the models it may use, its
    limits (requests, tokens, concurrency per minute; optionally per model) and a monthly
    budget. Cluster-scoped and owned by the platform team."""

    spec: LLMTenantSpec
    status: LLMTenantStatus | None = None
