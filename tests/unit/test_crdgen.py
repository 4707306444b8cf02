"""The generated CRD: structural, documented, up to date, and its CEL rules decide correctly.

CEL rules are evaluated here with cel-python against objects defaulted the way the API server
defaults them; the integration tests prove the same rules in a real kube-apiserver.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml

from llmop import crdgen
from llmop.api.v1alpha1 import LLMDeploymentSpec

REPO = Path(__file__).resolve().parents[2]
CRD = crdgen.build_crd()
ROOT_SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
SPEC_SCHEMA = ROOT_SCHEMA["properties"]["spec"]
FORBIDDEN_KEYS = {"$ref", "$defs", "anyOf", "allOf", "oneOf", "title", "definitions"}


def walk(
    node: Any, path: str = "", *, fields_only: bool = False
) -> list[tuple[str, dict[str, Any]]]:
    """Every schema node below `node`; with `fields_only`, only named properties."""
    if not isinstance(node, dict):
        return []
    found = [(path, node)]
    for name, sub in node.get("properties", {}).items():
        found += walk(sub, f"{path}.{name}", fields_only=fields_only)
    for key, suffix in (("items", "[]"), ("additionalProperties", "{}")):
        sub = node.get(key)
        if isinstance(sub, dict):
            below = walk(sub, f"{path}{suffix}", fields_only=fields_only)
            found += below[1:] if fields_only else below
    return found


@pytest.mark.parametrize(
    ("relative", "render"),
    [
        (crdgen.CRD_PATH, crdgen.render_crd_yaml),
        (crdgen.HELM_CRD_PATH, crdgen.render_helm_crd_template),
        (crdgen.API_REFERENCE_PATH, crdgen.render_api_reference),
    ],
    ids=["crd", "helm-template", "api-reference"],
)
def test_generated_file_is_up_to_date(relative: Path, render: Any) -> None:
    committed = (REPO / relative).read_text(encoding="utf-8")
    assert committed == render(), f"{relative} is stale: run `make generate`"


def test_engine_contract_settings_table_is_up_to_date() -> None:
    committed = (REPO / crdgen.ENGINE_CONTRACT_PATH).read_text(encoding="utf-8")
    assert committed == crdgen.render_engine_contract(committed), (
        f"{crdgen.ENGINE_CONTRACT_PATH} is stale: run `make generate`"
    )


def test_schema_is_structural() -> None:
    for path, node in walk(ROOT_SCHEMA):
        assert not FORBIDDEN_KEYS & node.keys(), f"{path} has {FORBIDDEN_KEYS & node.keys()}"
        assert not ("properties" in node and "additionalProperties" in node), path
        structural = (
            "type" in node
            or node.get("x-kubernetes-int-or-string")
            or node.get("x-kubernetes-preserve-unknown-fields")
        )
        assert structural, f"{path} has no type"
        for bound in ("exclusiveMinimum", "exclusiveMaximum"):
            assert node.get(bound, True) is True, f"{path}: {bound} must be boolean"


def test_every_field_is_documented() -> None:
    for section in ("spec", "status"):
        schema = ROOT_SCHEMA["properties"][section]
        for path, node in walk(schema, f".{section}", fields_only=True):
            assert node.get("description"), f"{path} has no description"


def test_object_defaults_satisfy_their_own_cel_rules() -> None:
    # The API server evaluates an object's rules against its default as written.
    for path, node in walk(SPEC_SCHEMA):
        if isinstance(node.get("default"), dict) and node.get("x-kubernetes-validations"):
            assert violations(node["default"], node) == [], path


def test_optionals_are_nullable_and_defaults_cascade() -> None:
    model = SPEC_SCHEMA["properties"]["model"]["properties"]
    assert model["revision"]["nullable"] is True
    engine_default = SPEC_SCHEMA["properties"]["engine"]["default"]
    assert engine_default["gpuMemoryUtilization"] == 0.9
    assert engine_default["backend"] == "vllm"
    assert SPEC_SCHEMA["properties"]["health"]["default"]["deepProbe"]["timeoutSeconds"] == 5
    engine = SPEC_SCHEMA["properties"]["engine"]["properties"]
    assert engine["gpuMemoryUtilization"]["default"] == 0.9
    assert engine["gpuMemoryUtilization"]["exclusiveMinimum"] is True
    assert "default" not in SPEC_SCHEMA["properties"]["replicas"]


def test_crd_metadata() -> None:
    spec = CRD["spec"]
    assert CRD["metadata"]["name"] == "llmdeployments.serving.llmop.dev"
    assert spec["names"]["shortNames"] == ["llmd"]
    assert spec["names"]["categories"] == ["llmop"]
    version = spec["versions"][0]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert list(columns) == [
        "Model", "Ready", "Replicas", "Endpoint", "Adapters", "Age", "Reason", "Download",
        "Startup", "Groups",
    ]  # fmt: skip
    assert columns["Reason"]["priority"] == 1
    assert columns["Download"]["priority"] == 1  # -o wide
    assert columns["Startup"]["priority"] == 1  # -o wide
    assert columns["Startup"]["jsonPath"] == ".status.startup.summary"
    assert columns["Groups"]["priority"] == 1  # -o wide
    assert columns["Groups"]["jsonPath"] == ".status.groupSummary"
    conditions = ROOT_SCHEMA["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]


def test_helm_template_is_guarded() -> None:
    text = crdgen.render_helm_crd_template()
    assert text.startswith("{{- if .Values.crds.enabled }}")
    assert "helm.sh/resource-policy: keep" in text
    assert text.rstrip().endswith("{{- end }}")


# ---------------------------------------------------------------------------------------------
# CEL rules


_CEL = celpy.Environment()


def defaulted(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec as the API server stores it: schema defaults applied, absent optionals absent."""
    dumped: dict[str, Any] = LLMDeploymentSpec.model_validate(spec).model_dump(
        by_alias=True, exclude_none=True
    )
    return dumped


def is_transition(rule: dict[str, str]) -> bool:
    """A transition rule (it reads `oldSelf`), which the API server runs on updates only."""
    return "oldSelf" in rule["rule"]


def violations(obj: Any, schema: dict[str, Any]) -> list[str]:
    """Messages of every CEL rule that `obj` breaks, walking the schema like the API server."""
    if obj is None:
        return []
    messages = []
    for rule in schema.get("x-kubernetes-validations", []):
        if is_transition(rule):
            continue  # evaluated on updates only; the API server tests cover them
        program = _CEL.program(_CEL.compile(rule["rule"]))
        if not bool(program.evaluate({"self": celpy.json_to_cel(obj)})):
            messages.append(rule["message"])
    if isinstance(obj, dict):
        for name, sub in schema.get("properties", {}).items():
            messages += violations(obj.get(name), sub)
    if isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for item in obj:
            messages += violations(item, schema["items"])
    return messages


def spec(**overrides: Any) -> dict[str, Any]:
    return {"model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"}, **overrides}


CEL_CASES = [
    ("valid-minimal", spec(), None),
    ("valid-pvc-model", spec(model={"name": "pvc://weights/llama/8b"}), None),
    ("bad-model-name", spec(model={"name": "not a repo"}), "spec.model.name"),
    ("replicas-and-autoscaling", spec(replicas=2, autoscaling={"maxReplicas": 3}), "spec.replicas"),
    ("min-above-max", spec(autoscaling={"minReplicas": 4, "maxReplicas": 3}), "minReplicas"),
    (
        "tp-does-not-divide-gpus",
        spec(resources={"gpus": 4}, engine={"tensorParallelSize": 3}),
        "tensorParallelSize",
    ),
    ("valid-tp", spec(resources={"gpus": 4}, engine={"tensorParallelSize": 2}), None),
    (
        "pp-with-tp-below-gpus",
        spec(resources={"gpus": 8}, engine={"tensorParallelSize": 4, "pipelineParallelSize": 2}),
        "pipelineParallelSize",
    ),
    (
        "pp-with-tp-equal-gpus",
        spec(resources={"gpus": 8}, engine={"tensorParallelSize": 8, "pipelineParallelSize": 2}),
        None,
    ),
    ("pp-with-tp-unset", spec(resources={"gpus": 8}, engine={"pipelineParallelSize": 2}), None),
    (
        "pp-without-gpus",
        spec(resources={"gpus": 0}, engine={"backend": "simulator", "pipelineParallelSize": 2}),
        None,
    ),
    # vLLM's CPU build: allowed, with the memory that bounds weights + KV cache + runtime.
    ("cpu-vllm-without-memory", spec(resources={"gpus": 0}), "spec.resources.memory"),
    ("cpu-vllm-with-memory", spec(resources={"gpus": 0, "memory": "16Gi"}), None),
    ("simulator-without-gpus", spec(resources={"gpus": 0}, engine={"backend": "simulator"}), None),
    (
        "fallback-to-a-model-and-an-external-api",
        spec(router={"fallback": [{"model": "small"}, {"externalModel": "managed-api"}]}),
        None,
    ),
    (
        "fallback-naming-both",
        spec(router={"fallback": [{"model": "small", "externalModel": "managed-api"}]}),
        "exactly one of model",
    ),
    (
        "fallback-naming-neither",
        spec(router={"fallback": [{"when": ["Saturated"]}]}),
        "exactly one",
    ),
    (
        "max-model-len-above-architecture",
        spec(
            model={
                "name": "acme/custom",
                "architecture": {
                    "parameters": 10,
                    "layers": 1,
                    "kvHeads": 1,
                    "headDim": 8,
                    "maxPositionEmbeddings": 1024,
                },
            },
            engine={"maxModelLen": 2048},
        ),
        "maxPositionEmbeddings",
    ),
    (
        "mla-needs-rope-dim",
        spec(
            model={
                "name": "acme/mla",
                "architecture": {
                    "parameters": 10,
                    "layers": 1,
                    "kvHeads": 1,
                    "headDim": 8,
                    "maxPositionEmbeddings": 1024,
                    "kvLoraRank": 512,
                },
            }
        ),
        "qkRopeHeadDim",
    ),
    (
        "batched-tokens-below-model-len",
        spec(engine={"maxModelLen": 8192, "maxNumBatchedTokens": 2048}),
        "maxNumBatchedTokens",
    ),
    (
        "batched-tokens-below-model-len-with-chunked-prefill",
        spec(
            engine={"maxModelLen": 8192, "maxNumBatchedTokens": 2048, "enableChunkedPrefill": True}
        ),
        None,
    ),
    (
        "probe-timeout-not-below-interval",
        spec(health={"deepProbe": {"intervalSeconds": 5, "timeoutSeconds": 5}}),
        "timeoutSeconds",
    ),
    ("surge-and-unavailable-zero", spec(rollout={"maxSurge": 0}), "maxSurge"),
    (
        "env-value-and-value-from",
        spec(
            engine={
                "env": [
                    {
                        "name": "A",
                        "value": "1",
                        "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}},
                    }
                ]
            }
        ),
        "value",
    ),
    ("env-value-from-empty", spec(engine={"env": [{"name": "A", "valueFrom": {}}]}), "exactly one"),
    ("cache-size", spec(model={"name": "acme/m", "cache": {"size": "40Gi"}}), None),
    (
        "cache-size-rwx",
        spec(
            model={
                "name": "acme/m",
                "cache": {
                    "size": "40Gi",
                    "accessModes": ["ReadWriteMany"],
                    "storageClassName": "x",
                },
            }
        ),
        None,
    ),
    ("cache-existing", spec(model={"name": "acme/m", "cache": {"existingClaim": "w"}}), None),
    ("cache-empty", spec(model={"name": "acme/m", "cache": {}}), "exactly one of size"),
    (
        "cache-both",
        spec(model={"name": "acme/m", "cache": {"size": "1Gi", "existingClaim": "w"}}),
        "exactly one of size",
    ),
    (
        "cache-existing-with-class",
        spec(model={"name": "acme/m", "cache": {"existingClaim": "w", "storageClassName": "x"}}),
        "only apply to a claim the operator creates",
    ),
    (
        "cache-for-pvc-model",
        spec(model={"name": "pvc://w/m", "cache": {"size": "1Gi"}}),
        "a pvc:// model is already on a volume",
    ),
    (
        "inference-pool",
        spec(router={"inferencePool": {"endpointPickerRef": {"name": "vllm-epp", "port": 9002}}}),
        None,
    ),
    (
        "inference-pool-bad-service-name",
        spec(router={"inferencePool": {"endpointPickerRef": {"name": "EPP.svc", "port": 9002}}}),
        "endpointPickerRef.name must be the name of the endpoint picker's Service",
    ),
    (
        "scale-to-zero",
        spec(autoscaling={"minReplicas": 0, "maxReplicas": 3, "scaleToZero": {"idleSeconds": 60}}),
        None,
    ),
    (
        "scale-to-zero-without-min-0",
        spec(autoscaling={"minReplicas": 1, "maxReplicas": 3, "scaleToZero": {}}),
        "scaleToZero needs spec.autoscaling.minReplicas: 0",
    ),
    (
        "min-0-without-router",
        spec(autoscaling={"minReplicas": 0, "maxReplicas": 3}, router={"enabled": False}),
        "spec.autoscaling.minReplicas 0 needs spec.router.enabled",
    ),
    (
        "adapters",
        spec(
            adapters=[
                {"name": "sql", "source": "hf://acme/sql-lora", "revision": "a" * 40},
                {"name": "chat", "source": "pvc://adapters/chat/v2"},
            ],
            engine={"lora": {"maxLoras": 2, "maxCpuLoras": 8, "maxLoraRank": 16}},
        ),
        None,
    ),
    (
        "adapter-source-malformed",
        spec(adapters=[{"name": "sql", "source": "s3://bucket/sql"}]),
        "spec.adapters[].source must be hf://",
    ),
    (
        "adapter-source-dot-dot",
        spec(adapters=[{"name": "sql", "source": "pvc://adapters/x/../../etc"}]),
        "must not contain '..'",
    ),
    (
        "adapter-revision-on-pvc",
        spec(adapters=[{"name": "sql", "source": "pvc://adapters/sql", "revision": "main"}]),
        "revision is for hf:// sources",
    ),
    (
        "adapter-names-repeat",
        spec(
            adapters=[
                {"name": "sql", "source": "hf://acme/a"},
                {"name": "sql", "source": "hf://acme/b"},
            ]
        ),
        "spec.adapters[].name must be unique",
    ),
    (
        "adapters-with-pp",
        spec(
            resources={"gpus": 8},
            engine={"pipelineParallelSize": 2},
            adapters=[{"name": "sql", "source": "hf://acme/a"}],
        ),
        "vLLM 0.32 with --enable-lora and pipeline parallelism crashes",
    ),
    (
        "lora-cpu-slots-below-gpu-slots",
        spec(engine={"lora": {"maxLoras": 8, "maxCpuLoras": 4}}),
        "maxCpuLoras must be at least",
    ),
]


@pytest.mark.parametrize(("case", "body", "expected"), CEL_CASES, ids=[c[0] for c in CEL_CASES])
def test_cel_rules(case: str, body: dict[str, Any], expected: str | None) -> None:
    found = violations(defaulted(body), SPEC_SCHEMA)
    if expected is None:
        assert found == [], case
    else:
        assert len(found) == 1, found
        assert expected in found[0]


def test_every_cel_rule_is_exercised_by_a_failing_case() -> None:
    rules = {
        rule["message"]
        for _, node in walk(SPEC_SCHEMA)
        for rule in node.get("x-kubernetes-validations", [])
        if not is_transition(rule)
    }
    broken = set()
    for _, body, expected in CEL_CASES:
        if expected is not None:
            broken |= set(violations(defaulted(body), SPEC_SCHEMA))
    assert rules == broken


@pytest.mark.parametrize(
    ("name", "ok"),
    [("llama", True), ("a" * 50, True), ("a" * 51, False), ("9lives", False), ("Big", False)],
    ids=["plain", "longest", "too-long", "leading-digit", "uppercase"],
)
def test_root_rules_on_the_name(name: str, ok: bool) -> None:
    assert (
        violations(
            {"metadata": {"name": name}},
            {"x-kubernetes-validations": ROOT_SCHEMA["x-kubernetes-validations"]},
        )
        == []
    ) is ok


@pytest.mark.parametrize(
    ("served", "adapter", "ok"),
    [(None, "sql", True), (None, "llama", False), ("base", "llama", True), ("base", "base", False)],
    ids=["other-name", "equals-metadata-name", "served-name-set", "equals-served-name"],
)
def test_root_rule_adapter_names_differ_from_the_base(
    served: str | None, adapter: str, ok: bool
) -> None:
    model: dict[str, Any] = {"name": "acme/m"}
    if served is not None:
        model["servedName"] = served
    body = {
        "metadata": {"name": "llama"},
        "spec": {"model": model, "adapters": [{"name": adapter, "source": "hf://acme/a"}]},
    }
    found = violations(body, {"x-kubernetes-validations": ROOT_SCHEMA["x-kubernetes-validations"]})
    assert (found == []) is ok, found


def test_committed_crd_parses_as_yaml() -> None:
    assert yaml.safe_load((REPO / crdgen.CRD_PATH).read_text()) == CRD
