"""The LLMTenant and LLMPriorityClass CRDs from crds/ on a real API server: a valid tenant is
accepted, each CEL rule and pattern refuses what the router could not use with a message naming
the field (and a class's bounds likewise); and the router's gateway follows the objects through
its watches: a key works once its tenant exists and is refused within 2 s of being disabled, and
a tenant's status says whether the priority class it names exists."""

from __future__ import annotations

import asyncio
import copy
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp.test_utils import TestServer

from llmop_router.app import Router
from llmop_router.cli import watching
from llmop_router.contract import api_key_hash
from llmop_router.gateway import Gateway
from llmop_router.kube import ApiServer
from llmop_router.metrics import GatewayMetrics
from llmop_router.routes import RouteTable
from llmop_router.store import Local
from support.cluster import Cluster, apply_crd
from support.manifests import cel_rules

pytestmark = pytest.mark.cluster

CRD_PATH = Path(__file__).resolve().parents[2] / "crds" / "serving.llmop.dev_llmtenants.yaml"
CLASS_CRD_PATH = CRD_PATH.with_name("serving.llmop.dev_llmpriorityclasses.yaml")
EXTERNAL_CRD_PATH = CRD_PATH.with_name("serving.llmop.dev_llmexternalmodels.yaml")
KEY = "llmop_integration-test-key-0123456789abcdefghijkl"
Mutation = Callable[[dict[str, Any]], None]


@pytest.fixture(scope="module")
def tenant_crd(llmop_crd: Cluster) -> Cluster:
    for path, plural in (
        (CRD_PATH, "llmtenants"),
        (CLASS_CRD_PATH, "llmpriorityclasses"),
        (EXTERNAL_CRD_PATH, "llmexternalmodels"),
    ):
        apply_crd(llmop_crd, path, f"{plural}.serving.llmop.dev")
    return llmop_crd


def valid(name: str = "cel-case") -> dict[str, Any]:
    return {
        "apiVersion": "serving.llmop.dev/v1alpha1",
        "kind": "LLMTenant",
        "metadata": {"name": name},
        "spec": {
            "apiKeys": [{"name": "main", "sha256": api_key_hash(KEY)}],
            "models": ["llama", "qwen-*"],
            "limits": {"requestsPerMinute": 60, "tokensPerMinute": 1000},
            "budget": {"monthly": "12.50"},
        },
    }


def _spec(**changes: Any) -> Mutation:
    def mutate(obj: dict[str, Any]) -> None:
        obj["spec"].update(changes)

    return mutate


KEY_ENTRY = {"name": "main", "sha256": "a" * 64}
CASES: list[tuple[str, Mutation, str, str]] = [
    (
        "key-names-unique",
        _spec(apiKeys=[KEY_ENTRY, {**KEY_ENTRY, "sha256": "b" * 64}]),
        "name must be unique",
        "spec.apiKeys",
    ),
    (
        "key-hashes-unique",
        _spec(apiKeys=[KEY_ENTRY, {**KEY_ENTRY, "name": "other"}]),
        "listed twice",
        "spec.apiKeys",
    ),
    (
        "output-within-total",
        _spec(limits={"tokensPerMinute": 10, "outputTokensPerMinute": 20}),
        "must not exceed tokensPerMinute",
        "spec.limits",
    ),
    (
        "reserve-within-max",
        _spec(limits={"maxTokensPerRequest": 10, "reserveOutputTokens": 20}),
        "must not exceed maxTokensPerRequest",
        "spec.limits",
    ),
    (
        "hash-is-hex",
        _spec(apiKeys=[{"name": "k", "sha256": "A" * 64}]),
        "should match",
        "spec.apiKeys[0].sha256",
    ),
    ("budget-is-decimal", _spec(budget={"monthly": "lots"}), "should match", "spec.budget.monthly"),
    (
        "limits-positive",
        _spec(limits={"requestsPerMinute": 0}),
        "should be greater than",
        "spec.limits.requestsPerMinute",
    ),
]


def test_every_cel_rule_has_a_rejection_case() -> None:
    messages = [rule["message"] for rule in cel_rules(yaml.safe_load(CRD_PATH.read_text()))]
    assert messages
    assert [m for m in messages if not any(case[2] in m for case in CASES)] == []


def test_a_valid_tenant_is_accepted(tenant_crd: Cluster) -> None:
    result = tenant_crd.kubectl(
        "create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(valid())
    )
    assert json.loads(result.stdout)["spec"]["limits"]["mode"] == "Enforce"


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"value": 10_000_000}, "spec.value"),
        ({"value": 1, "maxSharePercent": 101}, "spec.maxSharePercent"),
        ({"value": 1, "queue": {"maxWaitSeconds": 0}}, "spec.queue.maxWaitSeconds"),
        ({"sheddable": True}, "spec.value"),
    ],
    ids=["value-bounded", "share-a-percentage", "wait-positive", "value-required"],
)
def test_a_priority_class_out_of_bounds_is_refused_naming_the_field(
    tenant_crd: Cluster, spec: dict[str, Any], field: str
) -> None:
    obj = {
        "apiVersion": "serving.llmop.dev/v1alpha1",
        "kind": "LLMPriorityClass",
        "metadata": {"name": "bounds"},
        "spec": spec,
    }
    result = tenant_crd.kubectl(
        "create", "--dry-run=server", "-f", "-", input=json.dumps(obj), check=False
    )
    assert result.returncode != 0, f"accepted: {json.dumps(obj)}"
    assert field in result.stderr


@pytest.mark.parametrize(
    ("mutation", "message", "field"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_an_invalid_tenant_is_refused_naming_the_field(
    tenant_crd: Cluster, mutation: Mutation, message: str, field: str
) -> None:
    obj = copy.deepcopy(valid())
    mutation(obj)
    result = tenant_crd.kubectl(
        "create", "--dry-run=server", "-f", "-", input=json.dumps(obj), check=False
    )
    assert result.returncode != 0, f"accepted: {json.dumps(obj)}"
    assert message in result.stderr
    assert field in result.stderr


async def _status(http: aiohttp.ClientSession, url: str) -> int:
    body = {"model": "llama", "prompt": "hi", "max_tokens": 1}
    headers = {"Authorization": f"Bearer {KEY}"}
    async with http.post(url + "/v1/completions", json=body, headers=headers) as answer:
        return answer.status


async def _until(http: aiohttp.ClientSession, url: str, status: int, timeout: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if await _status(http, url) == status:
            return time.monotonic() - started
        await asyncio.sleep(0.05)
    raise AssertionError(f"not {status} within {timeout} s")


async def _status_written(cluster: Cluster, name: str) -> dict[str, Any]:
    for _ in range(100):
        found = cluster.kubectl("get", "llmtenant", name, "-o", "json", check=False)
        if found.returncode == 0:
            status: dict[str, Any] = json.loads(found.stdout).get("status") or {}
            if status.get("conditions"):
                return status
        await asyncio.sleep(0.1)
    raise AssertionError(f"the router wrote no status of LLMTenant {name}")


def test_the_router_follows_tenants_through_its_watch(tenant_crd: Cluster) -> None:
    """No LLMDeployment routes `llama`, so an accepted key gets 404 model_not_found and a
    refused one 401: the watch's effect is seen without an engine."""

    async def run() -> None:
        router = Router(RouteTable())
        router.gateway = Gateway(Local(), GatewayMetrics(router.metrics.registry))
        api = ApiServer.from_kubeconfig(str(tenant_crd.kubeconfig))
        router.app_hooks.append(lambda app: watching(app, router, api, ()))
        site = TestServer(router.app(), host="127.0.0.1")
        await site.start_server()
        url = f"http://127.0.0.1:{site.port}"
        name = "watched-tenant"
        try:
            async with aiohttp.ClientSession() as http:
                await _until(http, url, 401, 30)
                assert "llmtenants/" not in " ".join(router.waiting)
                gold = {
                    "apiVersion": "serving.llmop.dev/v1alpha1",
                    "kind": "LLMPriorityClass",
                    "metadata": {"name": "watched-gold"},
                    "spec": {"value": 50},
                }
                tenant_crd.kubectl("apply", "-f", "-", input=json.dumps(gold))
                named = valid(name)
                named["spec"]["priorityClassName"] = "watched-gold"
                await asyncio.sleep(0.5)  # the class's watch event before the tenant's
                tenant_crd.kubectl("apply", "-f", "-", input=json.dumps(named))
                await _until(http, url, 404, 5)
                # The router writes its status: no LLMDeployment serves `llama` here.
                status = await _status_written(tenant_crd, name)
                conditions = {c["type"]: c for c in status["conditions"]}
                assert conditions["Ready"]["status"] == "True"
                assert conditions["UnknownModels"]["status"] == "True"
                assert "llama" in conditions["UnknownModels"]["message"]
                assert conditions["DuplicateKeyHash"]["status"] == "False"
                assert conditions["UnknownPriorityClass"]["status"] == "False"
                assert "'watched-gold'" in conditions["UnknownPriorityClass"]["message"]
                assert status["usage"]["cost"] == "0.000000"
                disabled = valid(name)
                disabled["spec"]["apiKeys"][0]["disabled"] = True
                tenant_crd.kubectl("apply", "-f", "-", input=json.dumps(disabled))
                revoked_after = await _until(http, url, 401, 5)
                assert revoked_after <= 2.0
        finally:
            tenant_crd.kubectl("delete", "llmtenant", name, "--ignore-not-found", check=False)
            tenant_crd.kubectl(
                "delete", "llmpriorityclass", "watched-gold", "--ignore-not-found", check=False
            )
            await site.close()

    asyncio.run(asyncio.wait_for(run(), timeout=90))


def external_model(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "serving.llmop.dev/v1alpha1",
        "kind": "LLMExternalModel",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"baseURL": "http://127.0.0.1:9/v1", "model": "upstream", **spec},
    }


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"baseURL": "api.example.com/v1"}, "spec.baseURL"),
        ({"baseURL": "https://api.example.com/v1?key=1"}, "spec.baseURL"),
        ({"timeoutSeconds": 0}, "spec.timeoutSeconds"),
        ({"maxConcurrentRequests": 100_000}, "spec.maxConcurrentRequests"),
    ],
    ids=["url-has-a-scheme", "url-has-no-query", "timeout-positive", "concurrency-bounded"],
)
def test_an_external_model_out_of_bounds_is_refused_naming_the_field(
    tenant_crd: Cluster, spec: dict[str, Any], field: str
) -> None:
    obj = external_model("bounds", **spec)
    result = tenant_crd.kubectl(
        "create", "--dry-run=server", "-f", "-", input=json.dumps(obj), check=False
    )
    assert result.returncode != 0, f"accepted: {json.dumps(obj)}"
    assert field in result.stderr


def test_the_router_reads_external_models_and_their_keys_and_reports_each(
    tenant_crd: Cluster,
) -> None:
    """In the router's namespace: one external model whose Secret holds its key (Ready, the key
    read), one naming a Secret that does not exist (Ready False SecretNotFound, the fix); the
    Secret created later is read at once, at the model's next change."""

    def ready_of(name: str) -> dict[str, Any] | None:
        found = tenant_crd.kubectl(
            "get", "llmexternalmodel", name, "-n", "default", "-o", "json", check=False
        )
        if found.returncode != 0:
            return None
        conditions = (json.loads(found.stdout).get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == "Ready"), None)

    async def until(check: Callable[[], Any], what: str) -> Any:
        for _ in range(200):
            found = check()
            if found:
                return found
            await asyncio.sleep(0.1)
        raise AssertionError(what)

    async def run() -> None:
        router = Router(RouteTable())
        router.gateway = Gateway(Local(), GatewayMetrics(router.metrics.registry))
        api = ApiServer.from_kubeconfig(str(tenant_crd.kubeconfig))
        router.app_hooks.append(
            lambda app: watching(app, router, api, (), external_namespace="default")
        )
        site = TestServer(router.app(), host="127.0.0.1")
        await site.start_server()
        try:
            tenant_crd.kubectl(
                "create",
                "secret",
                "generic",
                "provider-key",
                "-n",
                "default",
                "--from-literal=apiKey=sk-from-the-secret\n",
            )
            keyed = external_model("keyed", apiKeySecretRef={"name": "provider-key"})
            keyed["spec"]["pricing"] = {"inputPerMillion": "0.15", "outputPerMillion": "0.60"}
            missing = external_model("missing", apiKeySecretRef={"name": "absent", "key": "k"})
            for obj in (keyed, missing):
                tenant_crd.kubectl("apply", "-f", "-", input=json.dumps(obj))
            usable = await until(lambda: router.externals.usable("keyed"), "keyed not usable")
            assert usable[1] == "sk-from-the-secret", "the key, trimmed of its newline"
            assert router.gateway is not None
            assert ("default", "LLMExternalModel/keyed") in router.gateway.prices
            ready = await until(lambda: ready_of("keyed"), "no status on keyed")
            assert (ready["status"], ready["reason"]) == ("True", "KeyRead")
            ready = await until(lambda: ready_of("missing"), "no status on missing")
            assert (ready["status"], ready["reason"]) == ("False", "SecretNotFound")
            assert "kubectl -n default create secret generic absent" in ready["message"]
            assert router.externals.usable("missing") is None
            tenant_crd.kubectl(
                "create", "secret", "generic", "absent", "-n", "default", "--from-literal=k=sk-2"
            )
            missing["spec"]["timeoutSeconds"] = 30
            tenant_crd.kubectl("apply", "-f", "-", input=json.dumps(missing))
            usable = await until(lambda: router.externals.usable("missing"), "missing not read")
            assert usable[1] == "sk-2"
            ready = await until(
                lambda: (r := ready_of("missing")) and r["status"] == "True" and r,
                "missing not Ready",
            )
            tenant_crd.kubectl("delete", "llmexternalmodel", "keyed", "-n", "default")
            await until(lambda: "keyed" not in router.externals.models, "keyed not forgotten")
        finally:
            for kind, name in (
                ("llmexternalmodel", "keyed"),
                ("llmexternalmodel", "missing"),
                ("secret", "provider-key"),
                ("secret", "absent"),
            ):
                tenant_crd.kubectl(
                    "delete", kind, name, "-n", "default", "--ignore-not-found", check=False
                )
            await site.close()

    asyncio.run(asyncio.wait_for(run(), timeout=90))
