"""`LLMExternalModel` objects as the router reads them (`llmop_router.externals`): fields and
defaults, refusals naming the field, when a fallback to one may be taken (its key read, below its
concurrency), its `Ready` condition and what each Secret problem says; and a tenant's
`spec.fallback` policy."""

from __future__ import annotations

from typing import Any

import pytest

from llmop_router import contract
from llmop_router.app import Router
from llmop_router.cli import externals_of
from llmop_router.externals import (
    KEY_MISSING,
    SECRET_FORBIDDEN,
    SECRET_NOT_FOUND,
    ExternalModel,
    ExternalModelError,
    Externals,
    SecretRef,
    key_missing,
    parse_external_model,
    secret_problem,
)
from llmop_router.gateway import Gateway
from llmop_router.metrics import GatewayMetrics
from llmop_router.routes import RouteTable
from llmop_router.store import Local
from llmop_router.tenants import TenantError, parse_tenant


def doc(name: str = "managed", **spec: Any) -> dict[str, Any]:
    base = {"baseURL": "https://api.example.com/v1/", "model": "gpt-mini"}
    return {"metadata": {"name": name, "namespace": "llmop-system"}, "spec": {**base, **spec}}


def test_an_external_model_reads_its_fields_and_defaults() -> None:
    found = parse_external_model(doc(apiKeySecretRef={"name": "provider"}))
    assert found == ExternalModel(
        namespace="llmop-system",
        name="managed",
        base_url="https://api.example.com/v1",
        model="gpt-mini",
        secret=SecretRef("provider", "apiKey"),
        max_concurrent=contract.DEFAULT_EXTERNAL_CONCURRENCY,
        timeout_seconds=float(contract.DEFAULT_EXTERNAL_TIMEOUT_SECONDS),
    )
    assert found.url("/v1/chat/completions") == "https://api.example.com/v1/chat/completions"
    assert found.key == ("llmop-system", "LLMExternalModel/managed"), "never a CR's key"


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"baseURL": "ftp://x"}, "spec.baseURL"),
        ({"model": ""}, "spec.model"),
        ({"apiKeySecretRef": {"key": "k"}}, "spec.apiKeySecretRef"),
        ({"maxConcurrentRequests": 0}, "spec.maxConcurrentRequests"),
        ({"timeoutSeconds": 99_999}, "spec.timeoutSeconds"),
    ],
)
def test_a_bad_external_model_is_refused_naming_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(ExternalModelError, match=rf"LLMExternalModel managed: {field}"):
        parse_external_model(doc(**spec))


def test_a_fallback_is_taken_only_with_its_key_and_below_its_concurrency() -> None:
    externals = Externals()
    assert externals.usable("managed") is None, "no such external model"
    externals.put(parse_external_model(doc(apiKeySecretRef={"name": "p"}, maxConcurrentRequests=2)))
    assert externals.usable("managed") is None, "its key is not read yet"
    assert externals.readiness("managed")[:2] == (False, "Pending")
    externals.key_read("managed", "sk-1", None)
    found = externals.usable("managed")
    assert found is not None
    assert found[1] == "sk-1"
    externals.start("managed")
    externals.start("managed")
    assert externals.usable("managed") is None, "at its maxConcurrentRequests"
    externals.end("managed")
    assert externals.usable("managed") is not None
    externals.end("managed")
    assert externals.in_flight == {}
    # The Secret changes: the key read for the old one is dropped until the new one is read.
    externals.put(parse_external_model(doc(apiKeySecretRef={"name": "rotated"})))
    assert externals.usable("managed") is None
    externals.key_read("managed", None, secret_problem(SecretRef("rotated"), "ns", 404))
    ready, reason, message = externals.readiness("managed")
    assert (ready, reason) == (False, SECRET_NOT_FOUND)
    assert "kubectl -n ns create secret generic rotated --from-literal=apiKey=<key>" in message
    externals.put(parse_external_model(doc(apiKeySecretRef={"name": "third"})))
    assert externals.readiness("managed")[:2] == (False, "Pending"), "the old Secret's problem"
    externals.remove("managed")
    assert externals.models == {}
    assert externals.problems == {}


def test_an_external_model_without_a_secret_needs_no_key() -> None:
    externals = Externals()
    externals.put(parse_external_model(doc()))
    assert externals.usable("managed") == (externals.models["managed"], None)
    assert externals.readiness("managed")[0] is True


def test_each_secret_problem_names_the_fix() -> None:
    ref = SecretRef("provider", "token")
    assert secret_problem(ref, "llmop-system", 403)[0] == SECRET_FORBIDDEN
    assert "router's own namespace" in secret_problem(ref, "llmop-system", 403)[1]
    reason, message = key_missing(ref, "llmop-system")
    assert reason == KEY_MISSING
    assert "no key 'token'" in message


def test_a_tenants_fallback_policy_decides_which_fallbacks_answer_it() -> None:
    def tenant(**spec: Any) -> Any:
        return parse_tenant({"metadata": {"name": "t"}, "spec": {"models": ["llama"], **spec}})

    default = tenant()
    assert default.fallback == contract.FALLBACK_IN_CLUSTER_ONLY
    assert default.may_fall_back("llama", external=False)
    assert not default.may_fall_back("qwen", external=False), "not a model it may use"
    assert not default.may_fall_back("managed", external=True), "external APIs cost money"
    allowed = tenant(fallback="Allowed")
    assert allowed.may_fall_back("managed", external=True)
    never = tenant(fallback="Never")
    assert not never.may_fall_back("llama", external=False)
    with pytest.raises(TenantError, match=r"spec\.fallback must be one of Allowed"):
        tenant(fallback="Sometimes")


def test_the_watch_keeps_a_read_key_through_a_relist_and_forgets_what_is_gone() -> None:
    router = Router(RouteTable())
    gateway = Gateway(Local(), GatewayMetrics(router.metrics.registry))
    seen: dict[str, list[dict[str, Any]]] = {}
    priced = doc(
        apiKeySecretRef={"name": "p"}, pricing={"inputPerMillion": "1", "outputPerMillion": "2"}
    )
    externals_of(router, gateway, "SYNC", {"items": [priced]}, seen)
    router.externals.key_read("managed", "sk-1", None)
    key = router.externals.models["managed"].key
    assert key in gateway.prices
    externals_of(router, gateway, "SYNC", {"items": [priced]}, seen)
    assert router.externals.usable("managed") is not None, "a relist keeps the key read"
    externals_of(router, gateway, "MODIFIED", doc(apiKeySecretRef={"name": "other"}), seen)
    assert router.externals.usable("managed") is None, "another Secret: read again first"
    assert key not in gateway.prices, "no pricing any more"
    externals_of(router, gateway, "MODIFIED", doc(baseURL="ftp://nope"), seen)
    assert "managed" not in router.externals.models, "an object it cannot use is dropped"
    externals_of(router, gateway, "SYNC", {"items": [priced]}, seen)
    externals_of(router, gateway, "SYNC", {"items": []}, seen)
    assert router.externals.models == {}
    assert key not in gateway.prices
