"""The `LLMPriorityClass` API (serving.llmop.dev/v1alpha1, cluster-scoped): what a tenant's
requests wait under when a model is saturated, like Kubernetes' PriorityClass for pods.

Platform-owned and cluster-scoped, named by `LLMTenant.spec.priorityClassName`. The router reads
these objects (`llmop_router.priorities`, the same field names from
`llmop_router.contract.PriorityClassSpec`); the API server refuses what the router could not
use, with the field and the fix.
"""

from __future__ import annotations

from typing import Final

from pydantic import Field

from llmop.api.v1alpha1 import ApiModel
from llmop_router import contract as router_contract

KIND: Final = router_contract.PRIORITY_CLASS_KIND
PLURAL: Final = router_contract.PRIORITY_CLASS_PLURAL
SINGULAR: Final = "llmpriorityclass"
SHORT_NAMES: Final = ("llmpc",)


class PriorityQueueSpec(ApiModel):
    """How the class's requests wait for a slot, per router pod."""

    max_wait_seconds: int | None = Field(
        default=None, ge=1, le=router_contract.MAX_QUEUE_WAIT_SECONDS
    )
    """A request waits at most this long for a slot, then is answered 429 with Retry-After
    (503 when the model has no ready replica left). None: the router's
    `--queue-wait-seconds` (chart `router.limits.queueWaitSeconds`, 30)."""
    max_requests: int | None = Field(default=None, ge=1, le=router_contract.MAX_QUEUED_REQUESTS)
    """The class's requests waiting at once on one router pod, all models; past it 429. None:
    only the pod's own caps (`router.limits.maxQueuedRequests`)."""


class LLMPriorityClassSpec(ApiModel):
    value: int = Field(ge=router_contract.MIN_PRIORITY, le=router_contract.MAX_PRIORITY)
    """Higher is served first: while a request of a higher class waits for a model's slot, no
    request of a lower class gets one (unless the higher class holds its share already)."""
    sheddable: bool = False
    """Refuse this class's requests at once (429 with Retry-After) when no slot of the model is
    free for them, instead of queueing them: for traffic that may be dropped under load."""
    max_share_percent: int = Field(default=100, ge=1, le=100)
    """The most of a model's slots (ready replicas x `maxNumSeqs`) this class's requests may
    hold at once, so higher classes find one free: 75 keeps a quarter of the slots for them.
    At least one slot whatever the percentage."""
    queue: PriorityQueueSpec | None = None
    """Bounds on the class's waiting requests."""
    global_default: bool = False
    """The class of tenants that name none (if several classes say so: the one of lowest
    value)."""


class LLMPriorityClass(ApiModel):
    """A priority class of llmop-router's gateway: tenants name one, and when a model is
    saturated their requests are served by class value (highest first), then fairly between
    tenants of a class by their weights. Cluster-scoped and owned by the platform team."""

    spec: LLMPriorityClassSpec
