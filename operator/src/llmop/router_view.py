"""The llmop router as the operator sees it (pure): where a routed LLMDeployment is reached, and
whether the router can serve it.

The chart tells the operator where its router runs (`LLMOP_ROUTER=<namespace>/<name>:<port>`: a
Service and a Deployment of that name); without it no router is installed and every CR is
reached through its own Service. A routed CR's `status.endpoint` is the router's URL; while the
router Deployment has no ready pod, the CR is `Degraded` with reason `RouterUnavailable` (its own
Service still serves it), and while its engine wants a key that the router's gateway never sends,
with reason `EngineKeyBehindGateway`. The router's readiness is read from its Deployment, which the
operator may read already: no permission beyond what it has for its engines.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmop import conditions
from llmop.pods import PodIssue
from llmop_router import contract as router_contract

_REF = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)/([a-z0-9]([-a-z0-9]*[a-z0-9])?):([0-9]{1,5})$")


@dataclass(frozen=True)
class RouterRef:
    """The router's Service (and Deployment) and its port."""

    namespace: str
    name: str
    port: int
    gateway: bool = False
    """Its gateway is on (`LLMOP_ROUTER_GATEWAY`, the chart's router.gateway.enabled): it
    authenticates clients with LLMTenant keys and sends engines no key of theirs."""

    @classmethod
    def parse(cls, text: str) -> RouterRef:
        """`<namespace>/<name>:<port>`; a ValueError that says the expected form otherwise."""
        match = _REF.match(text.strip())
        if match is None or not 0 < int(match.group(5)) < 65536:
            raise ValueError(
                f"router {text!r} is not <namespace>/<name>:<port> "
                "(e.g. llmop-system/llmop-router:8080)"
            )
        return cls(match.group(1), match.group(3), int(match.group(5)))

    @property
    def endpoint(self) -> str:
        """In-cluster base URL of the router's OpenAI API."""
        return f"http://{self.name}.{self.namespace}.svc:{self.port}/v1"

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class RouterView:
    """The router and whether it can serve now (None: not read yet, or not readable)."""

    ref: RouterRef
    ready: bool | None = None


def deployment_ready(deployment: Mapping[str, Any] | None) -> bool:
    """The router Deployment has at least one ready pod."""
    return int(((deployment or {}).get("status") or {}).get("readyReplicas") or 0) > 0


def endpoint(router: RouterView | None, routed: bool, own: str) -> str:
    """Where clients reach a CR: the router's URL when it is routed and a router is installed,
    else `own` (its Service's)."""
    return router.ref.endpoint if router is not None and routed else own


def router_issue(
    router: RouterView | None, routed: bool, own: str, *, engine_key: bool = False
) -> PodIssue | None:
    """RouterUnavailable while a routed CR's router has no ready pod; EngineKeyBehindGateway
    while its engine wants a key (`engine_key`: `spec.service.apiKeySecretRef`) that the
    router's gateway never sends."""
    if router is None or not routed:
        return None
    if router.ready is False:
        return PodIssue(
            conditions.REASON_ROUTER_UNAVAILABLE,
            f"The router {router.ref} has no ready pod: requests to {router.ref.endpoint} fail. "
            f"Check `kubectl get pods -n {router.ref.namespace} -l "
            f"{router_contract.ROUTER_POD_SELECTOR}`; the model's own Service {own} still "
            "serves it.",
            "",
        )
    if not (engine_key and router.ref.gateway):
        return None
    return PodIssue(
        conditions.REASON_ENGINE_KEY_BEHIND_GATEWAY,
        f"The engine wants its own API key (spec.service.apiKeySecretRef), and the router "
        f"{router.ref} is a gateway: it authenticates clients with LLMTenant keys and sends the "
        f"engine none, so it refuses every request to {router.ref.endpoint} for this model "
        "(503; the engine would answer 401). Remove spec.service.apiKeySecretRef (the engine's "
        "NetworkPolicy admits only the router, the model's own namespace and Prometheus to its "
        f"API port), or set spec.router.enabled: false to serve it only through its own Service "
        f"{own} with its key.",
        "",
    )
