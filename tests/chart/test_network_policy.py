"""The NetworkPolicies llmop ships (the chart's router policy, and the engine policy the operator
renders per LLMDeployment from the chart's LLMOP_NETWORK_POLICY), proven with a NetworkPolicy
evaluator (`support.netpol`), checked on Kubernetes' documented examples first, then asked which
paths the rendered policies admit: every path, in milliseconds. The same policies enforced on the
real node (kube-router's NetworkPolicy controller) are proven by
`tests/e2e/test_helm_install.py::test_the_network_policies_are_enforced_on_the_real_node`. Also: the
guardrails' list of the operator's own variables covers every variable the renderer writes."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from chart_helpers import NAMESPACE, render

from llmop import config, names
from llmop.api.v1alpha1 import LLMDeployment
from llmop.render import render_children
from llmop_engine import contract
from llmop_router import contract as router_contract
from support.netpol import External, Node, Pod, admitted

NS = {
    "default": {"kubernetes.io/metadata.name": "default"},
    "myproject": {"kubernetes.io/metadata.name": "myproject", "project": "myproject"},
    "other": {"kubernetes.io/metadata.name": "other"},
}

# https://kubernetes.io/docs/concepts/services-networking/network-policies/#networkpolicy-resource
DOCS_EXAMPLE: dict[str, Any] = {
    "metadata": {"name": "test-network-policy", "namespace": "default"},
    "spec": {
        "podSelector": {"matchLabels": {"role": "db"}},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [
            {
                "from": [
                    {"ipBlock": {"cidr": "172.17.0.0/16", "except": ["172.17.1.0/24"]}},
                    {"namespaceSelector": {"matchLabels": {"project": "myproject"}}},
                    {"podSelector": {"matchLabels": {"role": "frontend"}}},
                ],
                "ports": [{"protocol": "TCP", "port": 6379}],
            }
        ],
    },
}
DB = Pod("db", "default", {"role": "db"}, node="n1")


def test_evaluator_on_the_documented_example() -> None:
    def ok(source: Any, port: int = 6379) -> bool:
        return admitted([DOCS_EXAMPLE], NS, source, DB, port)

    assert ok(Pod("fe", "default", {"role": "frontend"}))
    assert not ok(Pod("fe", "default", {"role": "frontend"}), port=80)
    assert not ok(Pod("fe", "other", {"role": "frontend"}))  # podSelector alone: own namespace
    assert ok(Pod("any", "myproject"))
    assert not ok(Pod("any", "other"))
    assert ok(External("172.17.0.5"))
    assert not ok(External("172.17.1.5"))  # in `except`
    assert ok(Node("n1"))  # the pod's own node is always admitted
    assert not ok(Node("n2"))
    # A pod no policy selects admits everything.
    assert admitted([DOCS_EXAMPLE], NS, Pod("x", "other"), Pod("web", "default"), 80)


def test_evaluator_and_versus_or_and_the_default_policies() -> None:
    # The docs' "Behavior of to and from selectors": one peer with both selectors is an AND.
    def policy(peers: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "metadata": {"name": "p", "namespace": "default"},
            "spec": {"podSelector": {}, "ingress": [{"from": peers}]},
        }

    alice = {"namespaceSelector": {"matchLabels": {"project": "myproject"}}}
    client = {"podSelector": {"matchLabels": {"role": "client"}}}
    both = policy([alice | client])
    either = policy([alice, client])
    web = Pod("web", "default")
    stranger = Pod("s", "myproject", {"role": "other"})
    assert not admitted([both], NS, stranger, web, 80)
    assert admitted([either], NS, stranger, web, 80)
    assert admitted([both], NS, Pod("c", "myproject", {"role": "client"}), web, 80)
    deny_all = {
        "metadata": {"name": "d", "namespace": "default"},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"]},
    }
    allow_all = {
        "metadata": {"name": "a", "namespace": "default"},
        "spec": {"podSelector": {}, "ingress": [{}]},
    }
    assert not admitted([deny_all], NS, Pod("x", "default"), web, 80)
    assert admitted([deny_all, allow_all], NS, Pod("x", "other"), web, 80)  # policies add up
    expressions = {"matchExpressions": [{"key": "role", "operator": "NotIn", "values": ["x"]}]}
    assert admitted([policy([{"podSelector": expressions}])], NS, Pod("y", "default"), web, 1)


# --- llmop's policies --------------------------------------------------------------------------

CLUSTER = {
    NAMESPACE: {"kubernetes.io/metadata.name": NAMESPACE},
    "monitoring": {"kubernetes.io/metadata.name": "monitoring"},
    "team-a": {"kubernetes.io/metadata.name": "team-a"},
    "team-b": {"kubernetes.io/metadata.name": "team-b"},
}
API, PROBE = contract.API_PORT, contract.PROBE_PORT
ADMIN, PUBLIC = router_contract.DEFAULT_ADMIN_PORT, 8080


def _operator_settings(objects: list[dict[str, Any]]) -> config.OperatorConfig:
    """The operator's config from the chart's own Deployment env."""
    deployment = next(
        o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "llmop"
    )
    env = {
        e["name"]: e["value"]
        for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        if "value" in e
    }
    return config.load([], env)


def _engine_policy(objects: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    llmd = LLMDeployment.model_validate(
        {
            "metadata": {"name": "chat", "namespace": "team-a"},
            "spec": {"model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"}, **spec},
        }
    )
    settings = _operator_settings(objects).render_settings()
    children = render_children(llmd, settings, load_timeout_seconds=900)
    assert children.network_policy is not None
    return children.network_policy


@pytest.fixture(scope="module")
def chart() -> list[dict[str, Any]]:
    return render()


def labels_of(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, str]:
    found = next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)
    template_labels: dict[str, str] = found["spec"]["template"]["metadata"]["labels"]
    return template_labels


def test_the_rendered_policies_admit_exactly_llmops_paths(chart: list[dict[str, Any]]) -> None:
    engine_policy = _engine_policy(chart)
    router_policy = next(o for o in chart if o["kind"] == "NetworkPolicy")
    policies = [engine_policy, router_policy]
    ports = {names.API_PORT_NAME: API, names.PROBE_PORT_NAME: PROBE}
    engine = Pod("chat-0", "team-a", names.child_labels("chat"), node="n1", ports=ports)
    router_ports = {"http": PUBLIC, router_contract.ADMIN_PORT_NAME: ADMIN}
    router = Pod(
        "router", NAMESPACE, labels_of(chart, "Deployment", "llmop-router"), ports=router_ports
    )
    operator = Pod("operator", NAMESPACE, labels_of(chart, "Deployment", "llmop"))
    prometheus = Pod("prom", "monitoring", {"app.kubernetes.io/name": "prometheus"})
    neighbour = Pod("app", "team-a", {"app": "notebook"})
    stranger = Pod("app", "team-b", {"app": "notebook"})

    def ok(source: Any, dest: Pod, port: int) -> bool:
        return admitted(policies, CLUSTER, source, dest, port)

    # Allowed: router -> engine API and agent (a waking pod's /readyz), Prometheus -> both
    # metrics ports, operator -> agent, kubelet -> probes, the CR's own namespace -> API,
    # anyone -> the router's public port.
    assert ok(router, engine, API)
    assert ok(router, engine, PROBE)
    assert ok(prometheus, engine, API)
    assert ok(prometheus, engine, PROBE)
    assert ok(operator, engine, PROBE)
    assert ok(Node("n1"), engine, PROBE)
    assert ok(neighbour, engine, API)
    assert ok(stranger, router, PUBLIC)
    assert ok(External("203.0.113.9"), router, PUBLIC)
    assert ok(operator, router, ADMIN)
    assert ok(prometheus, router, ADMIN)
    # Denied: another namespace -> engine API (where vLLM's LoRA load/unload routes and the
    # simulator's /sim/fault live: NetworkPolicy is L4, so the port is what is fenced), any pod
    # -> the agent's port, a client -> the router's admin port.
    assert not ok(stranger, engine, API)
    assert not ok(External("203.0.113.9"), engine, API)
    assert not ok(neighbour, engine, PROBE)
    assert not ok(stranger, engine, PROBE)
    assert not ok(stranger, router, ADMIN)
    assert not ok(neighbour, router, ADMIN)
    assert not ok(Node("n2"), engine, PROBE)  # another node's address is not the pod's node
    # Other ports of the engine pod (a debugger, torch's rendezvous) only between its own pods.
    assert not ok(neighbour, engine, contract.MASTER_PORT)
    worker = Pod("chat-0-1", "team-a", names.child_labels("chat"), ports={"probe": PROBE})
    assert ok(worker, engine, contract.MASTER_PORT)


def test_the_api_port_follows_the_crs_service_port_and_values_widen_it() -> None:
    objects = render(
        {
            "networkPolicy": {
                "engineApiFrom": [
                    {
                        "namespaceSelector": {
                            "matchLabels": {"kubernetes.io/metadata.name": "team-b"}
                        }
                    }
                ],
                "engineProbeFrom": [{"ipBlock": {"cidr": "10.0.0.0/16"}}],
                "prometheus": None,
            }
        }
    )
    policy = _engine_policy(objects, service={"port": 9000})
    engine = Pod(
        "chat-0", "team-a", names.child_labels("chat"), ports={"http": 9000, "probe": PROBE}
    )
    assert admitted([policy], CLUSTER, Pod("x", "team-b"), engine, 9000)
    assert not admitted([policy], CLUSTER, Pod("x", "team-b"), engine, API)
    assert admitted([policy], CLUSTER, External("10.0.3.4"), engine, PROBE)  # a node CIDR
    prometheus = Pod("prom", "monitoring", {"app.kubernetes.io/name": "prometheus"})
    assert not admitted([policy], CLUSTER, prometheus, engine, PROBE)  # null: none admitted


def test_off_renders_no_policy_no_setting_no_rbac() -> None:
    objects = render({"networkPolicy": {"enabled": False}})
    assert not [o for o in objects if o["kind"] == "NetworkPolicy"]
    assert _operator_settings(objects).network_policy is None
    rules = [r for o in objects if o["kind"] == "ClusterRole" for r in o["rules"]]
    assert not [r for r in rules if "networkpolicies" in r["resources"]]
    on = [r for o in render() if o["kind"] == "ClusterRole" for r in o["rules"]]
    assert [r["verbs"] for r in on if "networkpolicies" in r["resources"]] == [
        ["create", "patch", "list"]
    ]


def test_a_malformed_setting_names_the_setting_and_the_fix() -> None:
    with pytest.raises(config.ConfigError, match=r"LLMOP_NETWORK_POLICY.*\"probe\".*networkPolicy"):
        config.load([], {"LLMOP_NETWORK_POLICY": '{"api": [], "probe": {}}'})
    with pytest.raises(config.ConfigError, match="not JSON"):
        config.load([], {"LLMOP_NETWORK_POLICY": "{"})


def test_the_guardrails_refuse_every_variable_the_operator_writes(
    chart: list[dict[str, Any]],
) -> None:
    policy = next(
        o
        for o in chart
        if o["kind"] == "ValidatingAdmissionPolicy" and "guardrails" in o["metadata"]["name"]
    )
    denied_expr = next(
        v["expression"] for v in policy["spec"]["variables"] if v["name"] == "deniedEnv"
    )
    denied = set(json.loads(denied_expr))
    llmd = LLMDeployment.model_validate(
        {
            "metadata": {"name": "chat", "namespace": "team-a"},
            "spec": {
                "model": {"name": "acme/m", "tokenSecretRef": {"name": "hf"}},
                "service": {"apiKeySecretRef": {"name": "k"}},
                "engine": {"lora": {}},
            },
        }
    )
    settings = _operator_settings(chart).render_settings()
    settings = replace(settings, hub_endpoint="http://hub")
    children = render_children(llmd, settings, load_timeout_seconds=900)
    assert children.deployment is not None
    rendered = {
        e["name"] for e in children.deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    not_denied = {n for n in rendered if not n.startswith("LLMOP_") and n not in denied}
    assert not_denied == set(), f"add these to templates/guardrails.yaml: {sorted(not_denied)}"
    contract_names = {v for k, v in vars(contract.Env).items() if k.isupper()}
    # A CR may size the CPU engine's KV cache itself; the renderer keeps its value.
    assert contract_names - denied - {"LLMOP_DRAIN_FLAG"} == {contract.Env.VLLM_CPU_KVCACHE_SPACE}
