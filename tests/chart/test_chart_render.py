"""helm/llmop without a cluster: lint, schema, rendering, and the contracts between the chart and
the code it deploys (operator flags/env, RBAC vs. what the operator writes, metric names vs. what
the engine exports, the CRD vs. crds/)."""

from __future__ import annotations

import argparse
import json
import re
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import helm_python as helm
import pytest
import yaml
from chart_helpers import (
    CHART_DIR,
    MATRIX,
    NAMESPACE,
    REPO_ROOT,
    env_of,
    find,
    kinds,
    load_chart,
    operator_container,
    operator_deployment,
    render,
    render_files,
)

from llmop import cli, config, idle, model_files_record, name_owners, names
from llmop import kinds as registry
from llmop.api.v1alpha1 import LLMDeployment
from llmop.render import RenderSettings, render_children
from llmop_router import contract as router_contract
from llmop_router import limits as router_limits

CASES = {"default": {}, **MATRIX}
SEVERITY_WARNING = 2


def example(name: str) -> LLMDeployment:
    return LLMDeployment.model_validate(yaml.safe_load((REPO_ROOT / "examples" / name).read_text()))


# --- lint and schema ---------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_lint_strict_has_no_warnings(case: str) -> None:
    report = helm.lint(CHART_DIR, CASES[case], strict=True, namespace=NAMESPACE)
    assert report["errors"] == []
    serious = [m for m in report["messages"] if m["severity"] >= SEVERITY_WARNING]
    assert serious == [], serious


@pytest.mark.parametrize("case", CASES)
def test_every_case_passes_the_schema_and_renders(case: str) -> None:
    with load_chart() as chart:
        chart.validate_schema(CASES[case])
    docs = render(CASES[case])
    assert operator_deployment(docs)["kind"] == "Deployment"


@pytest.mark.parametrize(
    ("values", "offender"),
    [
        ({"crds": {"enabeld": False}}, "enabeld"),
        ({"operater": {"logFormat": "text"}}, "operater"),
        ({"monitoring": {"prometheusRule": {"enable": True}}}, "enable"),
        ({"operator": {"logFormat": "xml"}}, "logFormat"),
        ({"operator": {"maxWorkers": "many"}}, "maxWorkers"),
        ({"image": {"digest": "latest"}}, "digest"),
        ({"monitoring": {"prometheusRule": {"errorRatio": 5}}}, "errorRatio"),
        ({"replicaCount": 2}, "replicaCount"),
        ({"router": {"migration": {"limit": 11}}}, "limit"),
        ({"router": {"migration": {"inactivitySeconds": 0}}}, "inactivitySeconds"),
        ({"router": {"gateway": {"gpuHourPrice": "2,49"}}}, "gpuHourPrice"),
        ({"router": {"gateway": {"gpuHourCurrency": "dollars"}}}, "gpuHourCurrency"),
    ],
)
def test_schema_rejects_typos_and_bad_values(values: dict[str, Any], offender: str) -> None:
    # Rendering enforces the schema like `helm install`/`helm template` do: the release fails
    # with a message that names the offending key, instead of silently ignoring it.
    with pytest.raises(helm.HelmValuesError, match=offender):
        render_files(values)


def _structured_paths(schema: dict[str, Any], prefix: str = "") -> tuple[set[str], set[str]]:
    """(dotted keys the schema names, the objects among them it closes with additionalProperties
    false). Free-form maps such as resources or labels hold values, not chart keys."""
    keys: set[str] = set()
    closed: set[str] = set()
    for key, sub in schema.get("properties", {}).items():
        keys.add(prefix + key)
        if sub.get("additionalProperties") is False:
            closed.add(prefix + key)
            sub_keys, sub_closed = _structured_paths(sub, f"{prefix}{key}.")
            keys |= sub_keys
            closed |= sub_closed
    return keys, closed


def _values_keys() -> list[tuple[str, int]]:
    """(dotted key, 0-based line) of every mapping key in values.yaml, from its indentation."""
    out: list[tuple[str, int]] = []
    stack: list[tuple[int, str]] = []
    for number, line in enumerate((CHART_DIR / "values.yaml").read_text().splitlines()):
        match = re.match(r"^(\s*)([A-Za-z_][\w-]*):", line)
        if not match:
            continue
        indent = len(match.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match.group(2)))
        out.append((".".join(k for _, k in stack), number))
    return out


SCHEMA_PATHS, SCHEMA_OBJECTS = _structured_paths(
    json.loads((CHART_DIR / "values.schema.json").read_text())
)


def test_schema_and_values_yaml_describe_the_same_keys() -> None:
    in_values = {key for key, _ in _values_keys()}
    assert in_values >= SCHEMA_PATHS
    # A values.yaml key inside a closed object that the schema does not name would make the
    # chart's own defaults fail at install.
    unknown = {
        key
        for key in in_values
        if key not in SCHEMA_PATHS
        and (key.rpartition(".")[0] or "<root>") in SCHEMA_OBJECTS | {"<root>"}
    }
    assert unknown == set()


def test_every_values_key_has_a_comment() -> None:
    lines = (CHART_DIR / "values.yaml").read_text().splitlines()
    undocumented = [
        f"{number + 1}: {key}"
        for key, number in _values_keys()
        if key in SCHEMA_PATHS and not lines[number - 1].lstrip().startswith("#")
    ]
    assert undocumented == []


# --- the default install -----------------------------------------------------------------------


def test_default_objects() -> None:
    assert kinds(render()) == [
        ("ClusterRole", "llmop"),
        ("ClusterRole", "llmop-framework"),
        ("ClusterRole", "llmop-router"),
        ("ClusterRoleBinding", "llmop"),
        ("ClusterRoleBinding", "llmop-framework"),
        ("ClusterRoleBinding", "llmop-router"),
        ("CustomResourceDefinition", "llmdeployments.serving.llmop.dev"),
        ("CustomResourceDefinition", "llmexternalmodels.serving.llmop.dev"),
        ("CustomResourceDefinition", "llmpriorityclasses.serving.llmop.dev"),
        ("CustomResourceDefinition", "llmtenants.serving.llmop.dev"),
        ("Deployment", "llmop"),
        ("Deployment", "llmop-router"),
        ("Deployment", "llmop-router-store"),
        ("NetworkPolicy", "llmop-router"),
        ("NetworkPolicy", "llmop-router-store"),
        ("PodDisruptionBudget", "llmop"),
        ("PodDisruptionBudget", "llmop-router"),
        ("Role", "llmop-leader-election"),
        ("Role", "llmop-router-external"),
        ("RoleBinding", "llmop-leader-election"),
        ("RoleBinding", "llmop-router-external"),
        ("Service", "llmop-metrics"),
        ("Service", "llmop-router"),
        ("Service", "llmop-router-store"),
        ("ServiceAccount", "llmop"),
        ("ServiceAccount", "llmop-router"),
        ("ValidatingAdmissionPolicy", "llmop-guardrails"),
        ("ValidatingAdmissionPolicy", "llmop-router-scale"),
        ("ValidatingAdmissionPolicyBinding", "llmop-guardrails"),
        ("ValidatingAdmissionPolicyBinding", "llmop-router-scale"),
    ]


def test_operator_deployment_is_two_elected_replicas_and_restricted() -> None:
    docs = render()
    deployment = operator_deployment(docs)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    pod = deployment["spec"]["template"]["spec"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    # Preferred anti-affinity: spread over nodes, yet a one-node cluster runs both.
    (term,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == selector
    assert (
        "requiredDuringSchedulingIgnoredDuringExecution" not in pod["affinity"]["podAntiAffinity"]
    )
    pdb = find(docs, "PodDisruptionBudget", "llmop")
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": selector}}
    assert pod["serviceAccountName"] == "llmop"
    assert pod["securityContext"]["runAsNonRoot"] is True
    container = operator_container(docs)
    assert container["image"] == "ghcr.io/llmop/operator:0.1.0"
    assert container["args"] == ["run"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    env = env_of(container)
    assert env["LLMOP_LEADER_ELECT"] == "true"
    (pod_namespace,) = [e for e in container["env"] if e["name"] == "POD_NAMESPACE"]
    assert pod_namespace["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"healthz": 8080, "metrics": 9090}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    service = find(docs, "Service", "llmop-metrics")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"


@pytest.mark.parametrize("case", ["default", "custom-everything", "namespaced"])
def test_operator_understands_the_chart_env(case: str) -> None:
    """The operator parses exactly the flags and LLMOP_* env the chart gives it."""
    values = CASES[case]
    container = operator_container(render(values))
    # The image's entrypoint is `llmop`: its own parser must accept the args, then `run` reads
    # its flags and the environment the way the process in the pod would.
    args = cli._parser().parse_args(container["args"])
    assert args.command == "run"
    cfg = config.load(args.operator_args, env_of(container))
    operator = values.get("operator", {})
    engine = values.get("engine", {})
    metrics = values.get("metrics", {})
    assert cfg.standalone is True
    assert cfg.namespaces == tuple(operator.get("watchNamespaces", ()))
    assert cfg.log_format == operator.get("logFormat", "json")
    assert cfg.verbose is operator.get("verbose", False)
    assert cfg.max_workers == operator.get("maxWorkers", 16)
    assert cfg.retry_delay_seconds == operator.get("retryDelaySeconds", 10)
    assert cfg.request_timeout_seconds == operator.get("requestTimeoutSeconds", 30)
    assert cfg.agent_read_interval_seconds == operator.get("agentReadIntervalSeconds", 10)
    assert cfg.agent_read_concurrency == operator.get("agentReadConcurrency", 32)
    assert cfg.liveness_port == operator.get("livenessPort", 8080)
    assert cfg.leader_elect is operator.get("leaderElection", True)
    assert cfg.metrics_port == metrics.get("port", 9090)
    assert cfg.vllm_image == engine.get("vllmImage", "ghcr.io/llmop/engine:0.1.0")
    assert cfg.simulator_image == engine.get("simulatorImage", "ghcr.io/llmop/engine-sim:0.1.0")
    assert cfg.image_pull_policy == engine.get("imagePullPolicy", "IfNotPresent")
    assert cfg.service_monitor is engine.get("serviceMonitor", False)
    assert cfg.gpu_resource_name == engine.get("gpuResourceName", "nvidia.com/gpu")
    assert cfg.hub_endpoint == (engine.get("hubEndpoint") or None)
    # The router the chart installs beside it: its Service and Deployment, as rendered.
    router = values.get("router", {})
    if router.get("enabled", True):
        docs = render(values)
        service = next(
            d for d in docs if d["kind"] == "Service" and d["metadata"]["name"].endswith("-router")
        )
        assert cfg.router is not None
        assert (cfg.router.namespace, cfg.router.name) == (NAMESPACE, service["metadata"]["name"])
        assert cfg.router.port == service["spec"]["ports"][0]["port"]
        assert find(docs, "Deployment", service["metadata"]["name"])
    else:
        assert cfg.router is None


def test_chart_engine_image_defaults_match_the_operator_defaults() -> None:
    defaults = config.OperatorConfig()
    env = env_of(operator_container(render()))
    assert env["LLMOP_VLLM_IMAGE"] == defaults.vllm_image
    assert env["LLMOP_SIMULATOR_IMAGE"] == defaults.simulator_image
    assert env["LLMOP_GPU_RESOURCE_NAME"] == defaults.gpu_resource_name


def test_metrics_disabled_turns_the_endpoint_off() -> None:
    docs = render(MATRIX["no-crds-no-metrics"])
    container = operator_container(docs)
    assert config.load([], env_of(container)).metrics_port == 0
    assert [p["name"] for p in container["ports"]] == ["healthz"]
    assert ("Service", "llmop-metrics") not in kinds(docs)


def test_custom_image_service_account_and_scheduling() -> None:
    docs = render(MATRIX["custom-everything"])
    assert ("ServiceAccount", "preexisting") not in kinds(docs)
    deployment = find(docs, "Deployment", "llm-operator")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "preexisting"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["tolerations"][0]["key"] == "dedicated"
    assert deployment["spec"]["template"]["metadata"]["labels"]["team"] == "ml"
    container = operator_container(docs)
    assert container["image"] == "registry.example.com/llmop/operator@sha256:" + "a" * 64
    assert env_of(container)["LLMOP_PRIORITY"] == "5"
    rbac = ("RoleBinding", "ClusterRoleBinding")
    for binding in (d for d in docs if d["kind"] in rbac and not _router(d)):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "preexisting", "namespace": NAMESPACE}
        ]


def test_service_account_name_is_required_when_not_created() -> None:
    with pytest.raises(helm.HelmError, match=r"serviceAccount\.name is required"):
        render_files({"serviceAccount": {"create": False}})


def _router(doc: dict[str, Any]) -> bool:
    return doc["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "router"


# --- the router --------------------------------------------------------------------------------


def test_router_is_two_restricted_replicas_behind_its_service_writing_only_scale() -> None:
    docs = render(MATRIX["monitoring-all"])
    deployment = find(docs, "Deployment", "llmop-router")
    pod = deployment["spec"]["template"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert deployment["spec"]["replicas"] == 2
    # Its own name, never the engine Services' selector.
    assert pod["metadata"]["labels"]["app.kubernetes.io/name"] == "llmop-router"
    assert pod["metadata"]["labels"]["app.kubernetes.io/name"] != "llmop-engine"
    (container,) = pod["spec"]["containers"]
    assert container["image"] == "ghcr.io/llmop/router:0.1.0"
    # Then the limits (test_router_limits_default_to_the_routers_own_and_reach_its_args).
    assert container["args"][:15] == [
        *("serve", "--port", "8080", "--admin-port", "8081", "--stale-after-seconds", "300"),
        *("--migration-limit", "2", "--migration-inactivity-seconds", "30"),
        *("--shutdown-delay", "5", "--drain", "60"),
    ]
    # The operator decides who owns each name: a CR without a status yet is not routed.
    assert "--await-name-decisions" in container["args"]
    # The kubelet waits out the delay, the drain and the exit before it kills.
    assert pod["spec"]["terminationGracePeriodSeconds"] == 70
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["spec"]["serviceAccountName"] == "llmop-router"
    (term,) = pod["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == selector
    service = find(docs, "Service", "llmop-router")
    assert service["spec"]["selector"] == selector
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}
    ]
    pdb = find(docs, "PodDisruptionBudget", "llmop-router")
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": selector}}
    role = find(docs, "ClusterRole", "llmop-router")
    assert _grants(role) == {
        ("serving.llmop.dev", "llmdeployments"): {"get", "list", "watch"},
        ("serving.llmop.dev", "llmtenants"): {"get", "list", "watch"},
        ("serving.llmop.dev", "llmtenants/status"): {"patch"},
        ("serving.llmop.dev", "llmpriorityclasses"): {"get", "list", "watch"},
        ("discovery.k8s.io", "endpointslices"): {"get", "list", "watch"},
        # Waking a CR at zero: its workload's scale, 0 -> 1, and nothing else of it.
        ("apps", "deployments/scale"): {"get", "patch"},
        ("leaderworkerset.x-k8s.io", "leaderworkersets/scale"): {"get", "patch"},
    }
    binding = find(docs, "ClusterRoleBinding", "llmop-router")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "llmop-router", "namespace": NAMESPACE}
    ]
    monitor = find(docs, "PodMonitor", "llmop-router")
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "admin"


def test_serving_namespaces_reach_the_router_and_the_operator() -> None:
    """`router.servingNamespaces`: the router routes only those namespaces' CRs, the operator
    tells the others why (NamespaceNotServed); empty (the default) is every namespace."""
    values = {
        **MATRIX["monitoring-all"],
        "router": {"servingNamespaces": ["team-a", "team-b"], "modelNameGraceSeconds": 120},
    }
    docs = render(values)
    (router,) = find(docs, "Deployment", "llmop-router")["spec"]["template"]["spec"]["containers"]
    args = router["args"]
    assert args[args.index("--serving-namespaces") + 1] == "team-a,team-b"
    operator = find(docs, "Deployment", "llmop")["spec"]["template"]["spec"]["containers"][0]
    env = env_of(operator)
    assert env["LLMOP_SERVING_NAMESPACES"] == "team-a,team-b"
    assert env["LLMOP_NAME_GRACE_SECONDS"] == "120"
    loaded = config.load([], env)
    assert loaded.serving_namespaces == ("team-a", "team-b")
    assert loaded.name_grace_seconds == 120
    default = render(MATRIX["monitoring-all"])
    (router,) = find(default, "Deployment", "llmop-router")["spec"]["template"]["spec"][
        "containers"
    ]
    assert "--serving-namespaces" not in router["args"]
    operator = find(default, "Deployment", "llmop")["spec"]["template"]["spec"]["containers"][0]
    assert env_of(operator)["LLMOP_SERVING_NAMESPACES"] == ""


@pytest.mark.parametrize("gateway", [True, False])
def test_the_operator_knows_whether_the_router_is_a_gateway(gateway: bool) -> None:
    """The gateway sends engines no key: the operator is told, to report a routed CR whose
    engine wants one (EngineKeyBehindGateway)."""
    values = {**MATRIX["monitoring-all"], "router": {"gateway": {"enabled": gateway}}}
    operator = find(render(values), "Deployment", "llmop")["spec"]["template"]["spec"][
        "containers"
    ][0]
    env = env_of(operator)
    assert env["LLMOP_ROUTER_GATEWAY"] == str(gateway).lower()
    router = config.load([], env).router
    assert router is not None
    assert router.gateway is gateway


def test_router_admin_port_is_on_its_pods_for_the_operator_and_prometheus_not_its_service() -> None:
    values = {**MATRIX["monitoring-all"], "router": {"adminPort": 9100, "staleAfterSeconds": 45}}
    docs = render(values)
    pod = find(docs, "Deployment", "llmop-router")["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    args = container["args"]
    assert args[args.index("--admin-port") + 1] == "9100"
    assert args[args.index("--stale-after-seconds") + 1] == "45"
    assert args[args.index("--migration-limit") + 1] == "2"
    assert args[args.index("--migration-inactivity-seconds") + 1] == "30"
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
        "http": 8080,
        router_contract.ADMIN_PORT_NAME: 9100,
    }
    # The probes stay on the public port (the kubelet reaches it); clients' Service has only it.
    assert container["readinessProbe"]["httpGet"]["port"] == "http"
    service = find(docs, "Service", "llmop-router")
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]
    assert not [
        d
        for d in docs
        if d["kind"] == "Service"
        and any(p.get("targetPort") in ("admin", 9100) for p in d["spec"]["ports"])
    ]
    # The operator reads each router pod's activity on the port the chart named.
    assert idle.admin_port(pod) == 9100
    (endpoint,) = find(docs, "PodMonitor", "llmop-router")["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == (router_contract.ADMIN_PORT_NAME, "/metrics")


def test_router_admin_port_must_differ_from_its_port() -> None:
    with pytest.raises(helm.HelmError, match=r"router\.adminPort 8080 is router\.port too"):
        render({"router": {"adminPort": 8080}})


def test_router_shutdown_timings_set_its_args_and_the_grace_period() -> None:
    values = {"router": {"shutdownDelaySeconds": 10, "drainSeconds": 600}}
    pod = find(render(values), "Deployment", "llmop-router")["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert args[args.index("--shutdown-delay") + 1] == "10"
    assert args[args.index("--drain") + 1] == "600"
    assert pod["terminationGracePeriodSeconds"] == 615


def test_router_limits_default_to_the_routers_own_and_reach_its_args() -> None:
    """The chart's limits are the router's defaults (one place to read them: docs/router.md),
    and a value set in the chart is the flag the router parses."""

    def limits_of(values: dict[str, Any]) -> router_limits.Limits:
        (container,) = find(render(values), "Deployment", "llmop-router")["spec"]["template"][
            "spec"
        ]["containers"]
        args = container["args"]
        flags = {flag for flag, _, _ in router_limits.FLAGS}
        given = [item for i, item in enumerate(args) if item in flags or args[i - 1] in flags]
        assert len(given) == 2 * len(flags), args
        parser = argparse.ArgumentParser()
        router_limits.add_arguments(parser)
        return router_limits.from_args(parser.parse_args(given))

    assert limits_of({}) == router_limits.DEFAULT
    custom = limits_of({"router": {"limits": {"maxBodyBytes": 1048576, "headerTimeoutSeconds": 5}}})
    assert (custom.max_body_bytes, custom.header_timeout) == (1048576, 5.0)


def test_router_can_be_left_out() -> None:
    assert not [d for d in render({"router": {"enabled": False}}) if _router(d)]


# --- CRD ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("plural", ["llmdeployments", "llmtenants", "llmpriorityclasses"])
def test_crd_template_is_the_generated_crd(plural: str) -> None:
    generated = yaml.safe_load(
        (REPO_ROOT / "crds" / f"serving.llmop.dev_{plural}.yaml").read_text()
    )
    name = generated["metadata"]["name"]
    templated = find(render(), "CustomResourceDefinition", name)
    assert templated["spec"] == generated["spec"]
    assert templated["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}


def test_crd_keep_and_enabled_switches() -> None:
    for crd in [d for d in render(MATRIX["namespaced"]) if d["kind"] == "CustomResourceDefinition"]:
        assert "annotations" not in crd["metadata"]
    assert not [d for d in render(MATRIX["no-crds-no-metrics"]) if d["kind"].startswith("Custom")]
    notes = render_files(MATRIX["namespaced"])["llmop/templates/NOTES.txt"]
    assert "WARNING: crds.keep=false" in notes


# --- RBAC --------------------------------------------------------------------------------------


def _grants(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


def _group(api_version: str) -> str:
    return api_version.rpartition("/")[0]


def test_rbac_grants_exactly_what_the_operator_uses() -> None:
    docs = render(MATRIX["monitoring-all"])  # engine.serviceMonitor adds the servicemonitors rule
    app = _grants(find(docs, "ClusterRole", "llmop"))
    framework = _grants(find(docs, "ClusterRole", "llmop-framework"))
    expected_app: dict[tuple[str, str], set[str]] = {
        ("serving.llmop.dev", "llmdeployments"): {"get", "list", "watch", "patch"},
        ("serving.llmop.dev", "llmdeployments/status"): {"patch"},
        ("serving.llmop.dev", "llmdeployments/finalizers"): {"update"},
        ("", "events"): {"create"},
    }
    # Every child kind, from the one registry: watched kinds are listed and watched, every kind
    # is server-side applied, optional kinds are deleted, read kinds are read back (the
    # Deployment, for the HPA handover).
    for kind in registry.CHILDREN:
        expected_app[(kind.group, kind.plural)] = set(kind.verbs())
    for observed in registry.OBSERVED:  # the engine pods: watched, and their deletion cost set
        expected_app[(observed.group, observed.plural)] = set(observed.verbs())
    assert expected_app[("", "pods")] == {"list", "watch", "patch"}
    for cache_kind in registry.MODEL_CACHE:  # the model cache's claim and download Job
        expected_app[(cache_kind.group, cache_kind.plural)] = set(cache_kind.verbs())
    expected_app[(registry.SECRET.group, registry.SECRET.plural)] = {"get"}  # the Hub token
    # Scale to zero (llmop.idle_check): an idle workload's scale set to 0, as the HPA writes it.
    for workload in registry.WORKLOADS:
        expected_app[(workload.group, f"{workload.plural}/scale")] = {"patch"}
    assert app == expected_app
    assert framework == {
        ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
        # The rollout surge (llmop.reconcile.rollouts): the room on the nodes, counted once per
        # rollout from every namespace's pods, so cluster-wide also with watchNamespaces.
        ("", "nodes"): {"list"},
        ("", "pods"): {"list"},
    }
    # Leader election: exactly the Lease verbs, in the release's namespace only; and the
    # leader's record of model name owners (llmop.name_check), that one ConfigMap by name.
    lease = find(docs, "Role", "llmop-leader-election")
    assert lease["metadata"]["namespace"] == "llmop-system"
    assert _grants(lease) == {
        ("coordination.k8s.io", "leases"): {"create", "get", "update"},
        ("", "configmaps"): {"create", "get", "patch"},
        # Fallbacks to external models that do not exist (llmop.name_check): listed beside the
        # router, in the release's namespace.
        ("serving.llmop.dev", "llmexternalmodels"): {"list"},
    }
    named = [r for r in lease["rules"] if r.get("resourceNames")]
    assert [(r["resourceNames"], sorted(r["verbs"])) for r in named] == [
        (["llmop-operator"], ["get", "update"]),
        ([name_owners.CONFIG_MAP_NAME], ["get", "patch"]),
        ([model_files_record.CONFIG_MAP_NAME], ["get", "patch"]),
    ]
    binding = find(docs, "RoleBinding", "llmop-leader-election")
    assert binding["roleRef"]["name"] == "llmop-leader-election"
    assert binding["subjects"][0]["namespace"] == "llmop-system"
    assert ("monitoring.coreos.com", "servicemonitors") not in _grants(
        find(render(), "ClusterRole", "llmop")
    )


def test_every_rbac_rule_is_commented_at_the_source() -> None:
    # The chart renders its rules from files/rbac.yaml, a symlink to deploy/rbac.yaml.
    link = CHART_DIR / "files" / "rbac.yaml"
    assert link.is_symlink()
    assert link.resolve() == REPO_ROOT / "deploy" / "rbac.yaml"
    text = link.read_text()
    lines = text.splitlines()
    uncommented = [
        lines[i + 1]
        for i, line in enumerate(lines[:-1])
        if lines[i + 1].strip().startswith("- apiGroups") and not line.strip().startswith("#")
    ]
    assert uncommented == []
    assert text.count("- apiGroups") >= 9


def test_namespaced_install_binds_the_application_role_per_namespace() -> None:
    docs = render(MATRIX["namespaced"])
    bindings = [
        d
        for d in docs
        if d["kind"] == "RoleBinding" and d["roleRef"]["kind"] == "ClusterRole" and not _router(d)
    ]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    assert all(b["roleRef"]["name"] == "llmop" for b in bindings)
    cluster_bindings = [d["metadata"]["name"] for d in docs if d["kind"] == "ClusterRoleBinding"]
    assert cluster_bindings == ["llmop-framework"]
    # The router watches the same namespaces, bound per namespace too; and reads its external
    # models and their Secrets in its own namespace only.
    router_bindings = [d for d in docs if d["kind"] == "RoleBinding" and _router(d)]
    assert sorted((b["metadata"]["namespace"], b["roleRef"]["kind"]) for b in router_bindings) == [
        ("llmop-system", "Role"),
        ("team-a", "ClusterRole"),
        ("team-b", "ClusterRole"),
    ]
    external = find(docs, "Role", "llmop-router-external")
    assert external["metadata"]["namespace"] == "llmop-system"
    assert {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]} in external["rules"]
    router = find(docs, "Deployment", "llmop-router")["spec"]["template"]["spec"]["containers"][0]
    assert router["args"][-2:] == ["--namespaces", "team-a,team-b"]
    assert env_of(operator_container(docs))["LLMOP_NAMESPACES"] == "team-a,team-b"


def test_chart_grants_the_same_rules_as_deploy_rbac() -> None:
    """The chart and the plain-kubectl install (deploy/rbac.yaml) grant identical permissions."""
    chart: dict[tuple[str, str], set[str]] = {}
    operator_roles = (
        d for d in render(MATRIX["monitoring-all"]) if d["kind"] == "ClusterRole" and not _router(d)
    )
    for role in operator_roles:
        for key, verbs in _grants(role).items():
            chart.setdefault(key, set()).update(verbs)
    plain: dict[tuple[str, str], set[str]] = {}
    for doc in yaml.safe_load_all((REPO_ROOT / "deploy" / "rbac.yaml").read_text()):
        if doc and doc["kind"] == "ClusterRole":
            plain.update(_grants(doc))
    assert plain == chart


# --- monitoring --------------------------------------------------------------------------------


def _engine_metric_names() -> set[str]:
    """Every sample name the engine agent, the simulator (vLLM's names) and the operator export."""
    from llmop.metrics import Metrics
    from llmop_engine.agent_metrics import AgentMetrics
    from llmop_engine.health import Phase, Verdict
    from llmop_engine.simulator.metrics import SimMetrics
    from llmop_engine.simulator.sim_config import SimConfig
    from llmop_engine.vllm_metrics import EngineMetrics

    sim = SimMetrics(SimConfig())
    sim.finished("stop")  # labelled counters only appear once a label set exists
    agent = AgentMetrics()
    # The load series exist while the agent has a current reading of the engine.
    load = EngineMetrics(waiting=0, running=0, kv_usage=0, kv_capacity_tokens=0)
    agent.update(Verdict(phase=Phase.READY, live=True, ready=True, reason=""), load)
    registries = [agent.registry, sim.registry, Metrics().registry]
    # Family names: a labelled family has no samples until a label set is used.
    return {f.name for r in registries for f in r.collect()}


METRIC_RE = re.compile(r"\b(llmop_[a-z0-9_]+|vllm:[a-z0-9_:]+)")
SAMPLE_SUFFIX = re.compile(r"_(total|bucket|count|sum|created)$")


def _promql_of_rules(docs: list[dict[str, Any]]) -> list[str]:
    rule = find(docs, "PrometheusRule")
    return [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]


def _dashboard_exprs(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p["targets"]]


def test_alerts_and_dashboards_only_use_metrics_that_exist() -> None:
    from llmop_router.metrics import (
        GatewayMetrics,
        GpuCost,
        QueueMetrics,
        RouterMetrics,
        SuggestedShares,
    )

    exported = _engine_metric_names()
    docs = render(MATRIX["monitoring-all"])
    data = find(docs, "ConfigMap", "llmop-dashboard")["data"]
    exprs = _promql_of_rules(docs) + _dashboard_exprs(json.loads(data["llmop.json"]))
    used = {SAMPLE_SUFFIX.sub("", m) for e in exprs for m in METRIC_RE.findall(e)}
    assert used, "no metrics found in the rules"
    assert used - exported == set()
    # The router's dashboard uses the router's series only, each with labels it has.
    metrics = RouterMetrics()
    gateway = GatewayMetrics(metrics.registry)
    queue = QueueMetrics(metrics.registry)
    # Registered by the router only with a GPU-hour price; collected from its route table.
    metrics.registry.register(GpuCost(Decimal(1), "USD", lambda: [("m", 1)]))
    router = {f.name: f for f in metrics.registry.collect()}
    members = {
        **metrics.__dict__,
        **{f"gateway.{k}": v for k, v in gateway.__dict__.items()},
        **{f"queue.{k}": v for k, v in queue.__dict__.items()},
    }
    collectors = {c._name: c for c in members.values() if hasattr(c, "_name")}
    collectors[GpuCost.NAME] = SimpleNamespace(_labelnames=GpuCost.LABELS)
    collectors[SuggestedShares.NAME] = SimpleNamespace(_labelnames=SuggestedShares.LABELS)
    router_exprs = _dashboard_exprs(json.loads(data["llmop-router.json"]))
    for expr in router_exprs:
        series = {SAMPLE_SUFFIX.sub("", m) for m in METRIC_RE.findall(expr)}
        assert series, expr
        assert series <= router.keys(), expr
        # Target labels prometheus-operator adds (pod) and the histogram's `le`, beside the
        # family's own (prometheus_client keeps them on the collector as `_labelnames`).
        allowed = {"pod", "le"}.union(*(collectors[n]._labelnames for n in series))
        grouped = {
            label.strip()
            for group in re.findall(r"by \(([^)]*)\)", expr) + re.findall(r"\{([^}]*)\}", expr)
            for label in re.sub(r'(=~|=|!=)"[^"]*"', "", group).split(",")
            if label.strip()
        }
        assert grouped <= allowed, (expr, grouped - allowed)
    families = {SAMPLE_SUFFIX.sub("", m) for e in router_exprs for m in METRIC_RE.findall(e)}
    assert families == router.keys(), "a router metric without a panel"


def test_alerts_cover_the_required_conditions_with_value_thresholds() -> None:
    docs = render(MATRIX["monitoring-all"])
    rule = find(docs, "PrometheusRule")
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert set(alerts) == {
        "LLMOpTimeToFirstTokenHigh",
        "LLMOpRequestErrorRateHigh",
        "LLMOpReplicasNotReady",
        "LLMOpDeepProbeFailures",
        "LLMOpReplicasUnavailable",
        "LLMOpReconcileErrors",
    }
    assert "histogram_quantile(0.99" in alerts["LLMOpTimeToFirstTokenHigh"]["expr"]
    assert alerts["LLMOpTimeToFirstTokenHigh"]["expr"].rstrip().endswith("> 2")
    assert alerts["LLMOpRequestErrorRateHigh"]["expr"].rstrip().endswith("> 0.05")
    assert alerts["LLMOpReplicasNotReady"]["labels"] == {"severity": "warning", "team": "ml"}
    # The default thresholds are the ones the issue asks for: TTFT p99 > 1 s, errors > 1 %.
    default_rule = find(
        render({"monitoring": {"prometheusRule": {"enabled": True}}}), "PrometheusRule"
    )
    exprs = [r["expr"].rstrip() for g in default_rule["spec"]["groups"] for r in g["rules"]]
    assert any(e.endswith("> 1") and "time_to_first_token" in e for e in exprs)
    assert any(e.endswith("> 0.01") and "request_success" in e for e in exprs)
    assert not any("kube_deployment" in e for e in exprs)


def test_deployment_label_follows_the_values() -> None:
    docs = render(MATRIX["service-label"])
    for expr in _promql_of_rules(docs)[:4]:
        assert "namespace, service" in expr
        assert "llmdeployment" not in expr
    dashboard = find(docs, "ConfigMap", "llmop-dashboard")["data"]["llmop.json"]
    assert "llmdeployment" not in dashboard
    assert "$service" in dashboard
    # The router's series carry their own CR labels, whatever the engines' relabeling says.
    router = find(docs, "ConfigMap", "llmop-dashboard")["data"]["llmop-router.json"]
    assert "llmdeployment_namespace" in router


def test_pod_monitor_scrapes_the_ports_the_renderer_exposes() -> None:
    docs = render(MATRIX["monitoring-all"])
    monitor = find(docs, "PodMonitor", "llmop-engines")
    children = render_children(
        example("simulator-small.yaml"), RenderSettings(), load_timeout_seconds=600
    )
    pod_template = children.deployment["spec"]["template"]
    container_ports = {p["name"] for p in pod_template["spec"]["containers"][0]["ports"]}
    scraped = {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]}
    assert scraped == container_ports == {names.PROBE_PORT_NAME, names.API_PORT_NAME}
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_template["metadata"]["labels"].items()
    relabel = monitor["spec"]["podMetricsEndpoints"][0]["relabelings"][0]
    # Prometheus turns the pod label serving.llmop.dev/deployment into this meta label.
    meta = "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", names.LABEL_DEPLOYMENT)
    assert relabel == {"sourceLabels": [meta], "targetLabel": "llmdeployment"}
    assert names.LABEL_DEPLOYMENT in pod_template["metadata"]["labels"]


def test_prometheus_adapter_exposes_the_hpa_metric_per_pod() -> None:
    docs = render(MATRIX["monitoring-all"])
    config_yaml = find(docs, "ConfigMap", "llmop-prometheus-adapter")["data"]["config.yaml"]
    rules = yaml.safe_load(config_yaml)["rules"]
    assert len(rules) == 1
    rule = rules[0]
    hpa = render_children(
        example("llama-3.1-8b-h100.yaml"), RenderSettings(), load_timeout_seconds=600
    ).hpa
    assert hpa is not None
    metric = hpa["spec"]["metrics"][0]
    assert metric["type"] == "Pods"
    assert rule["name"]["as"] == metric["pods"]["metric"]["name"] == names.QUEUE_DEPTH_METRIC
    assert re.fullmatch(rule["name"]["matches"], names.QUEUE_DEPTH_METRIC)
    assert rule["seriesQuery"].startswith(names.QUEUE_DEPTH_METRIC + "{")
    assert rule["resources"]["overrides"] == {
        "namespace": {"resource": "namespace"},
        "pod": {"resource": "pod"},
    }
    assert "<<.GroupBy>>" in rule["metricsQuery"]


def test_dashboard_is_valid_grafana_json() -> None:
    dashboard = json.loads((CHART_DIR / "files" / "dashboards" / "llmop.json").read_text())
    assert dashboard["uid"] == "llmop-overview"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert all(
        p["targets"] and p["datasource"]["uid"] == "${datasource}" for p in dashboard["panels"]
    )
    docs = render({"monitoring": {"grafanaDashboard": {"enabled": True, "namespace": "grafana"}}})
    configmap = find(docs, "ConfigMap", "llmop-dashboard")
    assert configmap["metadata"]["namespace"] == "grafana"
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    # One key per dashboard for the sidecar; the router's only with the router installed.
    assert set(configmap["data"]) == {"llmop.json", "llmop-router.json"}
    router = json.loads(configmap["data"]["llmop-router.json"])
    assert router["uid"] == "llmop-router"
    assert all(p["targets"] and p["datasource"]["uid"] == "${datasource}" for p in router["panels"])
    assert len({p["id"] for p in router["panels"]}) == len(router["panels"])
    without_router = render(
        {"monitoring": {"grafanaDashboard": {"enabled": True}}, "router": {"enabled": False}}
    )
    assert set(find(without_router, "ConfigMap", "llmop-dashboard")["data"]) == {"llmop.json"}


# --- NOTES -------------------------------------------------------------------------------------


def test_notes_show_how_to_apply_a_sample_and_wait_for_ready() -> None:
    notes = render_files()["llmop/templates/NOTES.txt"]
    sample = re.search(r"kubectl apply -f (\S+)", notes)
    assert sample is not None
    path = REPO_ROOT / sample.group(1)
    name = yaml.safe_load(path.read_text())["metadata"]["name"]
    assert f"kubectl wait llmdeployment/{name} --for=condition=Ready" in notes
    assert "kubectl get llmd" in notes
    assert "deployment/llmop" in notes


def test_notes_without_the_crd_say_to_install_it_and_that_the_router_waits_for_it() -> None:
    notes = render_files({"crds": {"enabled": False}})["llmop/templates/NOTES.txt"]
    assert "kubectl apply --server-side -f crds/" in notes
    assert "router pods stay unready" in notes
    assert "no restart" in notes
    alone = render_files({"crds": {"enabled": False}, "router": {"enabled": False}})
    assert "router pods" not in alone["llmop/templates/NOTES.txt"]
    assert "crds/" not in render_files()["llmop/templates/NOTES.txt"]


def _kind_and_name(doc: dict[str, Any]) -> tuple[str, str]:
    return doc["kind"], doc["metadata"]["name"]


def test_plain_install_manifests_are_the_charts_defaults_and_up_to_date() -> None:
    """deploy/llmop.yaml (`make generate`) is what `helm install` with the default values
    creates, minus the CRD (crds/) and Helm's own labels, plus the namespace."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "deploy_generate", REPO_ROOT / "deploy" / "generate.py"
    )
    assert spec is not None
    assert spec.loader is not None
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    committed = (REPO_ROOT / "deploy" / "llmop.yaml").read_text()
    assert committed == generate.render(), "deploy/llmop.yaml is stale: run `make generate`"
    plain = [d for d in yaml.safe_load_all(committed) if d]
    charted = render(release="llmop", namespace="llmop-system")
    assert {_kind_and_name(d) for d in plain} == {
        _kind_and_name(d) for d in charted if d["kind"] != "CustomResourceDefinition"
    } | {("Namespace", "llmop-system")}
    assert "helm.sh/chart" not in committed
    assert "managed-by: Helm" not in committed
    # ServiceAccounts and RBAC before the Deployments whose pods use them.
    kinds_in_order = [d["kind"] for d in plain]
    assert max(
        i for i, k in enumerate(kinds_in_order) if k in ("ServiceAccount", "ClusterRoleBinding")
    ) < kinds_in_order.index("Deployment")


# --- The gateway ----------------------------------------------------------------------------


def _router_args(values: dict[str, Any]) -> list[str]:
    deployment = find(render(values), "Deployment", "llmop-router")
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def test_the_gateway_is_on_by_default_with_its_own_store_only_the_routers_reach() -> None:
    args = _router_args({})
    at = args.index("--gateway")
    assert args[at : at + 9] == [
        *("--gateway", "--store", "redis://llmop-router-store.llmop-system.svc:6379/0"),
        *("--store-timeout-ms", "250", "--store-on-error", "FailOpen", "--replicas", "2"),
    ]
    docs = render({"networkPolicy": {"enabled": True}})
    store = find(docs, "Deployment", "llmop-router-store")
    (container,) = store["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "docker.io/library/redis:7.0.15"
    assert container["args"] == ["--save", "", "--appendonly", "no", "--protected-mode", "no"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    policy = find(docs, "NetworkPolicy", "llmop-router-store")
    (rule,) = policy["spec"]["ingress"]
    assert rule["from"] == [
        {
            "podSelector": {
                "matchLabels": {
                    "app.kubernetes.io/name": "llmop-router",
                    "app.kubernetes.io/instance": "llmop",
                    "app.kubernetes.io/component": "router",
                }
            }
        }
    ]
    notes = render_files({})["llmop/templates/NOTES.txt"]
    assert "answers every request 401" in notes
    assert "llmop key new" in notes


def test_a_gpu_hour_price_reaches_the_router_only_when_set() -> None:
    assert "--gpu-hour-price" not in _router_args({})
    args = _router_args({"router": {"gateway": {"gpuHourPrice": "2.49", "gpuHourCurrency": "EUR"}}})
    at = args.index("--gpu-hour-price")
    assert args[at : at + 4] == ["--gpu-hour-price", "2.49", "--gpu-hour-currency", "EUR"]


def test_an_existing_store_with_a_password_is_mounted_as_a_file() -> None:
    store = {
        "deploy": False,
        "url": "rediss://cache.example:6380/2",
        "passwordSecretRef": {"name": "cache", "key": "pw"},
        "onError": "FailClosed",
    }
    values = {"router": {"gateway": {"enabled": True, "store": store}}}
    docs = render(values)
    assert not [d for d in docs if d["metadata"]["name"] == "llmop-router-store"]
    deployment = find(docs, "Deployment", "llmop-router")
    pod = deployment["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert args[args.index("--store") + 1] == "rediss://cache.example:6380/2"
    assert args[args.index("--store-on-error") + 1] == "FailClosed"
    assert args[args.index("--store-password-file") + 1] == "/var/run/llmop/store/password"
    volume = next(v for v in pod["volumes"] if v["name"] == "store-password")
    assert volume["secret"] == {"secretName": "cache", "items": [{"key": "pw", "path": "password"}]}


def test_an_open_router_is_a_warning() -> None:
    values = {"router": {"gateway": {"enabled": False, "store": {"deploy": True}}}}
    assert "--gateway" not in _router_args(values)
    assert not [d for d in render(values) if d["metadata"]["name"] == "llmop-router-store"]
    assert (
        "WARNING: router.gateway.enabled=false" in render_files(values)["llmop/templates/NOTES.txt"]
    )
