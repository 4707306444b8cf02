"""Where a routed LLMDeployment is reached and when it is Degraded for want of a router
(`llmop.router_view`, through `status.derive_status`), and the `--router` setting."""

from __future__ import annotations

from typing import Any

import pytest
from test_status import HASH, NOW, ROLLED_OUT, conds, deployment, ld

from llmop import kinds
from llmop.api.v1alpha1 import LLMDeploymentStatus
from llmop.config import ConfigError, load
from llmop.router_view import RouterRef, RouterView, deployment_ready
from llmop.sizing import plan_for
from llmop.status import Observed, derive_status

REF = RouterRef("llmop-system", "llmop-router", 8080)
OWN = "http://x.ns.svc:8000/v1"


def derive(view: RouterView | None, **spec: Any) -> LLMDeploymentStatus:
    resource = ld(replicas=2, **spec)
    observed = Observed(
        "x",
        "ns",
        generation=resource.metadata.generation,
        children={kinds.DEPLOYMENT: deployment(status=ROLLED_OUT)},
        router=view,
    )
    return derive_status(
        observed, resource.spec, plan_for(resource.spec), template_hash=HASH, now=NOW
    )


@pytest.mark.parametrize(
    ("router", "spec", "endpoint", "degraded"),
    [
        # No router installed: the CR's own Service, nothing to degrade.
        (None, {}, OWN, ("False", "AsExpected")),
        # Installed and ready (or not read yet): the router's URL.
        (RouterView(REF, True), {}, REF.endpoint, ("False", "AsExpected")),
        (RouterView(REF, None), {}, REF.endpoint, ("False", "AsExpected")),
        # Installed, no ready pod: Degraded, Ready unchanged (the Service still serves).
        (RouterView(REF, False), {}, REF.endpoint, ("True", "RouterUnavailable")),
        # Not routed: its own Service, whatever the router does.
        (RouterView(REF, False), {"router": {"enabled": False}}, OWN, ("False", "AsExpected")),
    ],
)
def test_endpoint_and_degraded_follow_the_router(
    router: RouterView | None, spec: dict[str, Any], endpoint: str, degraded: tuple[str, str]
) -> None:
    status = derive(router, **spec)
    assert status.endpoint == endpoint
    assert conds(status)["Degraded"] == degraded
    assert conds(status)["Ready"] == ("True", "AllReplicasReady")


def test_router_unavailable_message_says_where_to_look_and_what_still_serves() -> None:
    status = derive(RouterView(REF, False))
    message = next(c.message for c in status.conditions if c.type == "Degraded")
    assert "llmop-system/llmop-router has no ready pod" in message
    assert "app.kubernetes.io/name=llmop-router" in message
    assert OWN in message


GATEWAY = RouterRef("llmop-system", "llmop-router", 8080, gateway=True)
ENGINE_KEY = {"service": {"apiKeySecretRef": {"name": "engine-key", "key": "key"}}}


@pytest.mark.parametrize(
    ("router", "spec", "degraded"),
    [
        # The gateway sends the engine no key: every request through it would be a 401.
        (RouterView(GATEWAY, True), ENGINE_KEY, ("True", "EngineKeyBehindGateway")),
        (RouterView(GATEWAY, None), ENGINE_KEY, ("True", "EngineKeyBehindGateway")),
        # No ready router pod says more first.
        (RouterView(GATEWAY, False), ENGINE_KEY, ("True", "RouterUnavailable")),
        # Without the gateway the router relays the client's own Authorization: fine.
        (RouterView(REF, True), ENGINE_KEY, ("False", "AsExpected")),
        # Not routed, or no engine key: fine.
        (
            RouterView(GATEWAY, True),
            {**ENGINE_KEY, "router": {"enabled": False}},
            ("False", "AsExpected"),
        ),
        (RouterView(GATEWAY, True), {}, ("False", "AsExpected")),
    ],
)
def test_an_engine_key_behind_the_gateway_is_degraded(
    router: RouterView, spec: dict[str, Any], degraded: tuple[str, str]
) -> None:
    status = derive(router, **spec)
    assert conds(status)["Degraded"] == degraded
    assert conds(status)["Ready"] == ("True", "AllReplicasReady")
    if degraded[1] == "EngineKeyBehindGateway":
        message = next(c.message for c in status.conditions if c.type == "Degraded")
        assert "spec.service.apiKeySecretRef" in message
        assert "spec.router.enabled: false" in message
        assert OWN in message


def test_the_router_gateway_setting() -> None:
    assert load(["--router", "a/b:8080"], {}).router == RouterRef("a", "b", 8080)
    on = {"LLMOP_ROUTER_GATEWAY": "True"}
    assert load(["--router", "a/b:8080"], on).router == RouterRef("a", "b", 8080, gateway=True)
    assert load([], on).router is None
    with pytest.raises(ConfigError, match="LLMOP_ROUTER_GATEWAY"):
        load(["--router", "a/b:8080"], {"LLMOP_ROUTER_GATEWAY": "yes"})


@pytest.mark.parametrize(
    ("deployment_body", "ready"),
    [
        (None, False),
        ({"status": {}}, False),
        ({"status": {"readyReplicas": 0}}, False),
        ({"status": {"readyReplicas": 1}}, True),
    ],
)
def test_router_is_ready_with_one_ready_pod(
    deployment_body: dict[str, Any] | None, ready: bool
) -> None:
    assert deployment_ready(deployment_body) is ready


def test_router_setting_is_parsed_or_refused_with_the_form() -> None:
    config = load(["--router", "llmop-system/llmop-router:8080"], {})
    assert config.router == REF
    assert load([], {"LLMOP_ROUTER": "ops/r:9000"}).router == RouterRef("ops", "r", 9000)
    assert load([], {}).router is None
    for bad in ("llmop-router:8080", "ns/Router:80", "ns/r:0", "ns/r"):
        with pytest.raises(ConfigError, match="<namespace>/<name>:<port>"):
            load(["--router", bad], {})
