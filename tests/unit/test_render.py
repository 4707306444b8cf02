"""Renderers: every branch of the Deployment, Service, HPA, PDB and ServiceMonitor output."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from llmop import kinds, names
from llmop.api.v1alpha1 import LLMDeployment
from llmop.render import Children, RenderSettings, render_children
from llmop.render.autoscaling import quantity
from llmop.render.engine_args import engine_flags

SETTINGS = RenderSettings(vllm_image="engine:1", simulator_image="sim:1")


def deployment(**spec: Any) -> LLMDeployment:
    body = {
        "metadata": {"name": "llama", "namespace": "team"},
        "spec": {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, **spec},
    }
    return LLMDeployment.model_validate(body)


def render(**spec: Any) -> Children:
    return render_children(deployment(**spec), SETTINGS, load_timeout_seconds=900)


def pod_spec(children: Children) -> dict[str, Any]:
    spec: dict[str, Any] = children.deployment["spec"]["template"]["spec"]
    return spec


def container(children: Children) -> dict[str, Any]:
    engine: dict[str, Any] = pod_spec(children)["containers"][0]
    return engine


def env(children: Children) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(children)["env"]}


def test_rendering_is_deterministic() -> None:
    assert json.dumps(render().wanted()) == json.dumps(render().wanted())


def test_children_carry_our_labels_only_and_no_owner_reference() -> None:
    for child in render(replicas=3, autoscaling=None).wanted():
        assert child["metadata"]["labels"] == names.child_labels("llama")
        assert "ownerReferences" not in child["metadata"]
        assert child["metadata"]["namespace"] == "team"


@pytest.mark.parametrize(
    ("spec", "replicas"),
    [
        ({}, 1),
        ({"replicas": 3}, 3),
        ({"replicas": 0}, 0),
        ({"autoscaling": {"maxReplicas": 4}}, None),
    ],
    ids=["default-one", "fixed-three", "scaled-to-zero", "autoscaling-omits-replicas"],
)
def test_replicas_are_absent_when_autoscaling(spec: dict[str, Any], replicas: int | None) -> None:
    assert render(**spec).deployment["spec"].get("replicas") == replicas


def test_drain_arithmetic() -> None:
    children = render(rollout={"drainSeconds": 120, "endpointPropagationSeconds": 10})
    # Margin 23 s: preStop delivery 10 (4.6 and 6.1 s measured) + engine end 10 + 1 (4.3 s
    # measured, doubled; then SIGKILL) + agent exit 2.
    assert pod_spec(children)["terminationGracePeriodSeconds"] == 10 + 120 + 23
    flags = container(children)["args"]
    assert flags[flags.index("--shutdown-timeout") + 1] == "120"
    assert env(children)["LLMOP_ENDPOINT_PROPAGATION_SECONDS"] == "10"
    assert env(children)["LLMOP_DRAIN_SECONDS"] == "120"
    assert container(children)["lifecycle"]["preStop"]["exec"]["command"] == [
        "llmop-engine",
        "drain",
    ]


def test_probes_point_at_the_agent() -> None:
    engine = container(render())
    assert engine["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "probe"}
    assert engine["startupProbe"]["httpGet"]["path"] == "/livez"
    assert engine["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "probe"}
    assert {p["name"]: p["containerPort"] for p in engine["ports"]} == {"http": 8000, "probe": 8081}


def test_readiness_is_probed_every_second_so_a_new_pod_joins_within_one() -> None:
    readiness = container(render())["readinessProbe"]
    assert (readiness["periodSeconds"], readiness["successThreshold"]) == (1, 1)
    assert readiness["failureThreshold"] == 2
    # Readiness is not probed before the startup probe passed: it too runs every second, with
    # the same 60 s for the agent's own start.
    startup = container(render())["startupProbe"]
    assert (startup["periodSeconds"], startup["failureThreshold"]) == (1, 60)


def test_restricted_security_context() -> None:
    children = render()
    pod = pod_spec(children)
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    engine = container(children)["securityContext"]
    assert engine["allowPrivilegeEscalation"] is False
    assert engine["capabilities"] == {"drop": ["ALL"]}


def test_gpu_limits_selector_and_toleration() -> None:
    children = render(
        resources={"gpus": 2, "gpuProduct": "NVIDIA-H100-80GB-HBM3", "cpu": 8, "memory": "64Gi"},
        scheduling={"nodeSelector": {"pool": "gpu"}},
    )
    resources = container(children)["resources"]
    assert resources["limits"] == {"nvidia.com/gpu": 2, "cpu": 8, "memory": "64Gi"}
    assert resources["requests"] == {"cpu": 8, "memory": "64Gi"}
    assert pod_spec(children)["nodeSelector"] == {
        "pool": "gpu",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    }
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod_spec(
        children
    )["tolerations"]


@pytest.mark.parametrize(
    ("spec_name", "operator_name", "expected"),
    [
        (None, "nvidia.com/gpu", "nvidia.com/gpu"),
        (None, "amd.com/gpu", "amd.com/gpu"),
        ("intel.com/gpu", "amd.com/gpu", "intel.com/gpu"),
    ],
    ids=["default", "operator-setting", "cr-wins"],
)
def test_gpu_resource_name_from_cr_else_operator(
    spec_name: str | None, operator_name: str, expected: str
) -> None:
    resources: dict[str, Any] = {"gpus": 1}
    if spec_name:
        resources["gpuResourceName"] = spec_name
    settings = RenderSettings(gpu_resource_name=operator_name)
    children = render_children(deployment(resources=resources), settings, load_timeout_seconds=900)
    assert container(children)["resources"]["limits"] == {expected: 1}
    assert pod_spec(children)["tolerations"] == [
        {"key": expected, "operator": "Exists", "effect": "NoSchedule"}
    ]


def test_simulator_without_gpus_has_no_gpu_limit_or_toleration() -> None:
    children = render(resources={"gpus": 0}, engine={"backend": "simulator"})
    assert container(children)["image"] == "sim:1"
    assert (
        "resources" not in container(children) or "limits" not in container(children)["resources"]
    )
    assert "tolerations" not in pod_spec(children)
    assert "--tensor-parallel-size" not in container(children)["args"]
    shm = next(v for v in pod_spec(children)["volumes"] if v["name"] == names.DEV_SHM_VOLUME)
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Mi"}


def test_image_override_wins() -> None:
    assert container(render(engine={"image": "mine:2"}))["image"] == "mine:2"
    assert container(render())["image"] == "engine:1"


FLAG_CASES = [
    ({}, ["meta-llama/Llama-3.1-8B-Instruct", "--served-model-name", "llama"]),
    ({"engine": {"dtype": "float16"}}, ["--dtype", "float16"]),
    ({"engine": {"quantization": "awq"}}, ["--quantization", "awq"]),
    ({"engine": {"kvCacheDtype": "fp8"}}, ["--kv-cache-dtype", "fp8"]),
    ({"engine": {"maxModelLen": 4096}}, ["--max-model-len", "4096"]),
    ({"engine": {"gpuMemoryUtilization": 0.85}}, ["--gpu-memory-utilization", "0.85"]),
    ({"engine": {"maxNumSeqs": 64}}, ["--max-num-seqs", "64"]),
    ({"engine": {"maxNumBatchedTokens": 16384}}, ["--max-num-batched-tokens", "16384"]),
    ({"engine": {"enablePrefixCaching": True}}, ["--enable-prefix-caching"]),
    ({"engine": {"enablePrefixCaching": False}}, ["--no-enable-prefix-caching"]),
    ({"engine": {"enableChunkedPrefill": False}}, ["--no-enable-chunked-prefill"]),
    ({"resources": {"gpus": 4}}, ["--tensor-parallel-size", "4"]),
    (
        {"resources": {"gpus": 4}, "engine": {"tensorParallelSize": 2}},
        ["--tensor-parallel-size", "2"],
    ),
    (
        {"engine": {"speculative": {"model": "ngram", "numSpeculativeTokens": 3}}},
        ["--speculative-config", '{"method":"ngram","num_speculative_tokens":3}'],
    ),
    (
        {"engine": {"speculative": {"model": "acme/draft"}}},
        ["--speculative-config", '{"model":"acme/draft","num_speculative_tokens":4}'],
    ),
    ({"model": {"name": "acme/m", "revision": "abc123"}}, ["--revision", "abc123"]),
    ({"model": {"name": "acme/m", "servedName": "chat"}}, ["--served-model-name", "chat"]),
    ({"model": {"name": "pvc://weights/llama/8b"}}, ["/models/pvc/weights/llama/8b"]),
]


@pytest.mark.parametrize(
    ("spec", "expected"), FLAG_CASES, ids=[str(i) for i in range(len(FLAG_CASES))]
)
def test_engine_flags(spec: dict[str, Any], expected: list[str]) -> None:
    flags = engine_flags(deployment(**spec))
    start = flags.index(expected[0])
    assert flags[start : start + len(expected)] == expected


def test_user_args_come_last_and_absent_settings_emit_nothing() -> None:
    flags = engine_flags(
        deployment(engine={"args": ["--max-model-len", "1024", "--enforce-eager"]})
    )
    assert flags[-3:] == ["--max-model-len", "1024", "--enforce-eager"]
    defaults = engine_flags(deployment())
    for flag in ("--dtype", "--quantization", "--kv-cache-dtype", "--max-model-len", "--revision"):
        assert flag not in defaults


def test_agent_command_wraps_engine_flags() -> None:
    args = container(render(service={"port": 9000}))["args"]
    assert args[: args.index("--")] == [
        "run",
        "--backend",
        "vllm",
        "--port",
        "9000",
        "--probe-port",
        "8081",
    ]


def test_agent_environment_and_secrets() -> None:
    children = render(
        model={"name": "acme/m", "tokenSecretRef": {"name": "hf"}},
        service={"apiKeySecretRef": {"name": "api", "key": "k"}},
        health={"stallSeconds": 90, "deepProbe": {"enabled": False, "prompt": "hi"}},
        engine={
            "env": [
                {"name": "A", "value": "1"},
                {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}},
            ]
        },
    )
    values = env(children)
    # The token is a mounted file (huggingface_hub reads HF_TOKEN_PATH), never a variable.
    assert "HF_TOKEN" not in values
    assert values["HF_TOKEN_PATH"] == "/var/run/secrets/llmop/hf-token/token"
    pod = pod_spec(children)
    volume = next(v for v in pod["volumes"] if v["name"] == "hf-token")
    assert volume["secret"] == {
        "secretName": "hf",
        "items": [{"key": "token", "path": "token"}],
        "defaultMode": 0o440,
    }
    mounts = pod["containers"][0]["volumeMounts"]
    assert {
        "name": "hf-token",
        "mountPath": "/var/run/secrets/llmop/hf-token",
        "readOnly": True,
    } in (mounts)
    assert not any("secretKeyRef" in str(v) and "hf" in str(v) for v in values.values())
    assert values["VLLM_API_KEY"] == {"secretKeyRef": {"name": "api", "key": "k"}}
    assert values["LLMOP_STALL_SECONDS"] == "90"
    assert values["LLMOP_DEEP_PROBE_ENABLED"] == "false"
    assert values["LLMOP_DEEP_PROBE_PROMPT"] == "hi"
    assert values["LLMOP_LOAD_TIMEOUT_SECONDS"] == "900"
    assert values["A"] == "1"
    assert values["B"] == {"configMapKeyRef": {"name": "c", "key": "k"}}


def test_explicit_load_timeout_wins_and_sets_progress_deadline() -> None:
    children = render(health={"loadTimeoutSeconds": 3000})
    assert env(children)["LLMOP_LOAD_TIMEOUT_SECONDS"] == "3000"
    assert render().deployment["spec"]["progressDeadlineSeconds"] == 900 + 600


def test_pvc_model_mounts_the_claim_read_only() -> None:
    children = render(model={"name": "pvc://weights/llama"})
    volumes = {v["name"]: v for v in pod_spec(children)["volumes"]}
    assert volumes["model-pvc"]["persistentVolumeClaim"] == {
        "claimName": "weights",
        "readOnly": True,
    }
    mounts = {m["name"]: m for m in container(children)["volumeMounts"]}
    assert mounts["model-pvc"] == {
        "name": "model-pvc",
        "mountPath": "/models/pvc/weights",
        "readOnly": True,
    }


def test_scheduling_passthrough_and_spread_selector() -> None:
    children = render(
        scheduling={
            "priorityClassName": "inference",
            "affinity": {"nodeAffinity": {"x": 1}},
            "tolerations": [{"key": "gpu", "operator": "Exists"}],
            "topologySpreadConstraints": [
                {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}
            ],
        }
    )
    pod = pod_spec(children)
    assert pod["priorityClassName"] == "inference"
    assert pod["affinity"] == {"nodeAffinity": {"x": 1}}
    assert pod["tolerations"][0] == {"key": "gpu", "operator": "Exists"}
    spread = pod["topologySpreadConstraints"][0]
    assert spread["labelSelector"] == {"matchLabels": names.selector_labels("llama")}
    assert spread["maxSkew"] == 1


def test_template_hash_changes_with_the_template_only() -> None:
    base = render().deployment
    digest = base["metadata"]["annotations"][names.ANNOTATION_TEMPLATE_HASH]
    assert (
        base["spec"]["template"]["metadata"]["annotations"][names.ANNOTATION_TEMPLATE_HASH]
        == digest
    )
    scaled = render(replicas=5).deployment
    assert scaled["metadata"]["annotations"][names.ANNOTATION_TEMPLATE_HASH] == digest
    changed = render(engine={"maxModelLen": 2048}).deployment
    assert changed["metadata"]["annotations"][names.ANNOTATION_TEMPLATE_HASH] != digest


def test_service() -> None:
    service = render(service={"type": "LoadBalancer", "annotations": {"b": "2", "a": "1"}}).service
    assert service["spec"]["type"] == "LoadBalancer"
    assert service["spec"]["selector"] == names.selector_labels("llama")
    assert list(service["metadata"]["annotations"]) == ["a", "b"]
    assert [p["name"] for p in service["spec"]["ports"]] == ["http", "probe"]


def test_hpa_scales_on_queue_depth_with_gpu_sane_behaviour() -> None:
    children = render(autoscaling={"minReplicas": 2, "maxReplicas": 8, "targetQueueDepth": 2.5})
    hpa = children.hpa
    assert hpa is not None
    spec = hpa["spec"]
    assert spec["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "llama",
    }
    assert (spec["minReplicas"], spec["maxReplicas"]) == (2, 8)
    metric = spec["metrics"][0]["pods"]
    assert metric["metric"]["name"] == "llmop_engine_queue_depth"
    assert metric["target"] == {"type": "AverageValue", "averageValue": "2500m"}
    up, down = spec["behavior"]["scaleUp"], spec["behavior"]["scaleDown"]
    assert up["stabilizationWindowSeconds"] == 0
    assert {(p["type"], p["value"], p["periodSeconds"]) for p in up["policies"]} == {
        ("Percent", 100, 60),
        ("Pods", 2, 60),
    }
    assert down["stabilizationWindowSeconds"] == 300
    assert down["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 120}]


@pytest.mark.parametrize(("value", "expected"), [(4, "4"), (2.5, "2500m"), (0.1, "100m")])
def test_quantity(value: float, expected: str) -> None:
    assert quantity(value) == expected


@pytest.mark.parametrize(
    ("spec", "has_pdb"),
    [
        ({}, False),
        ({"replicas": 2}, True),
        ({"autoscaling": {"maxReplicas": 1}}, False),
        ({"autoscaling": {"maxReplicas": 3}}, True),
    ],
    ids=["single", "fixed-two", "autoscale-max-one", "autoscale-max-three"],
)
def test_pdb_only_when_more_than_one_replica_can_exist(spec: dict[str, Any], has_pdb: bool) -> None:
    children = render(**spec)
    assert (children.pdb is not None) is has_pdb
    if children.pdb is not None:
        assert children.pdb["spec"]["maxUnavailable"] == 1


def test_wanted_and_unwanted() -> None:
    fixed = render()
    assert [c["kind"] for c in fixed.wanted()] == ["Service", "Deployment"]
    assert fixed.unwanted() == [
        kinds.CONFIG_MAP,
        kinds.PRE_PULL,
        kinds.PDB,
        kinds.HPA,
        kinds.INFERENCE_POOL,
    ]
    pool = {"endpointPickerRef": {"name": "epp", "port": 9002}}
    scaled = render(
        autoscaling={"maxReplicas": 3},
        router={"inferencePool": pool},
        adapters=[{"name": "sql", "source": "hf://acme/sql"}],
        scheduling={"prePullImage": True},
    )
    assert [c["kind"] for c in scaled.wanted()] == [
        "Service",
        "ConfigMap",
        "DaemonSet",
        "Deployment",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
        "InferencePool",
    ]
    assert scaled.unwanted() == []


def test_service_monitor_when_enabled() -> None:
    settings = RenderSettings(service_monitor=True)
    children = render_children(deployment(), settings, load_timeout_seconds=900)
    monitor = children.service_monitor
    assert monitor is not None
    # The HPA's metric alone every 5 s, the rest every 15 s: each series has one writer.
    only_queue = {"sourceLabels": ["__name__"], "regex": "llmop_engine_queue_depth"}
    assert monitor["spec"]["endpoints"] == [
        {
            "port": "probe",
            "path": "/metrics",
            "interval": "15s",
            "metricRelabelings": [only_queue | {"action": "drop"}],
        },
        {
            "port": "probe",
            "path": "/metrics",
            "interval": "5s",
            "relabelings": [{"targetLabel": "llmop_scrape", "replacement": "queue-depth"}],
            "metricRelabelings": [only_queue | {"action": "keep"}],
        },
    ]
    assert render().service_monitor is None


def test_render_does_not_mutate_its_input() -> None:
    source = deployment(engine={"args": ["--x"]})
    before = copy.deepcopy(source.model_dump())
    render_children(source, SETTINGS, load_timeout_seconds=900)
    assert source.model_dump() == before


def test_pod_runs_as_the_user_the_engine_images_create() -> None:
    repo = Path(__file__).resolve().parents[2]
    for dockerfile in ("engine-image/Dockerfile", "engine-image/Dockerfile.sim"):
        text = (repo / dockerfile).read_text(encoding="utf-8")
        user = re.search(r"^USER (\d+)", text, re.MULTILINE)
        assert user is not None, dockerfile
        assert pod_spec(render())["securityContext"]["runAsUser"] == int(user.group(1))


def test_the_pre_pull_daemon_set_goes_where_the_engine_pods_go_and_is_never_one() -> None:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                ]
            }
        },
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []},
    }
    children = render(
        resources={"gpus": 2, "gpuProduct": "NVIDIA-H100-80GB-HBM3"},
        scheduling={
            "prePullImage": True,
            "nodeSelector": {"pool": "gpu"},
            "tolerations": [{"key": "dedicated", "operator": "Exists"}],
            "affinity": affinity,
            "priorityClassName": "llm",
        },
    )
    ds = children.pre_pull
    assert ds is not None
    assert ds["metadata"]["name"] == "llama-prepull"
    assert ds["metadata"]["labels"][names.LABEL_MANAGED_BY] == names.MANAGED_BY
    pod = ds["spec"]["template"]["spec"]
    engine = pod_spec(children)
    # Where the engine pods may run, GPU taint and product included; not their pod affinity.
    for key in ("nodeSelector", "tolerations"):
        assert pod[key] == engine[key]
    assert pod["affinity"] == {"nodeAffinity": affinity["nodeAffinity"]}
    assert "priorityClassName" not in pod
    [hold] = pod["containers"]
    assert hold["image"] == container(children)["image"]
    assert hold["args"] == ["hold"]
    assert "nvidia.com/gpu" not in str(hold["resources"])
    # Nothing that selects engine pods may select these.
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert ds["spec"]["selector"]["matchLabels"] == labels
    for selector in (
        names.selector_labels("llama"),
        children.service["spec"]["selector"],
        {names.LABEL_MANAGED_BY: names.MANAGED_BY},  # the operator's pod watch
    ):
        assert not selector.items() <= labels.items(), selector
    assert render().pre_pull is None


def test_turning_pre_pull_on_changes_no_engine_pod() -> None:
    plain, pulled = render(), render(scheduling={"prePullImage": True})
    assert pulled.deployment == plain.deployment
