"""The CRD from crds/ installs, and the API server rejects invalid LLMDeployments with messages
that name the field — one case per CEL rule in the CRD, and a check that no rule is left out."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.cluster import Cluster
from support.manifests import cel_rules

pytestmark = pytest.mark.cluster

API_VERSION = "serving.llmop.dev/v1alpha1"
CRD_PATH = Path(__file__).resolve().parents[2] / "crds" / "serving.llmop.dev_llmdeployments.yaml"

Mutation = Callable[[dict[str, Any]], None]


def valid() -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "LLMDeployment",
        "metadata": {"name": "cel-case", "namespace": "default"},
        "spec": {
            "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
            "engine": {"backend": "simulator"},
            "resources": {"gpus": 1},
        },
    }


def _set(path: str, value: Any) -> Mutation:
    def mutate(obj: dict[str, Any]) -> None:
        *parents, leaf = path.split(".")
        node = obj
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value

    return mutate


def _all(*mutations: Mutation) -> Mutation:
    def mutate(obj: dict[str, Any]) -> None:
        for mutation in mutations:
            mutation(obj)

    return mutate


ARCH = {"parameters": 1000, "layers": 2, "kvHeads": 2, "headDim": 64, "maxPositionEmbeddings": 4096}

# (id, mutation, a distinctive part of the rule's message, the field the error must name)
CASES: list[tuple[str, Mutation, str, str]] = [
    (
        "fallback-names-one-target",
        _set("spec.router.fallback", [{"model": "small", "externalModel": "managed"}]),
        "a fallback names exactly one of model",
        "spec.router.fallback[0]",
    ),
    (
        "model-name-format",
        _set("spec.model.name", "not a repo!"),
        "Hugging Face repo id",
        "spec.model.name",
    ),
    (
        "mla-needs-rope-dim",
        _set("spec.model.architecture", {**ARCH, "kvLoraRank": 512}),
        "qkRopeHeadDim is required",
        "spec.model.architecture",
    ),
    (
        "env-value-from-exactly-one",
        _set("spec.engine.env", [{"name": "A", "valueFrom": {}}]),
        "exactly one of secretKeyRef",
        "spec.engine.env[0].valueFrom",
    ),
    (
        "env-value-xor-value-from",
        _set(
            "spec.engine.env",
            [{"name": "A", "value": "x", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
        ),
        "either value or valueFrom",
        "spec.engine.env[0]",
    ),
    (
        "batched-tokens-vs-model-len",
        _all(_set("spec.engine.maxModelLen", 8192), _set("spec.engine.maxNumBatchedTokens", 4096)),
        "maxNumBatchedTokens must be at least",
        "spec.engine.maxNumBatchedTokens",
    ),
    (
        "min-not-above-max",
        _set("spec.autoscaling", {"minReplicas": 5, "maxReplicas": 2}),
        "minReplicas must not exceed",
        "spec.autoscaling.minReplicas",
    ),
    (
        "probe-timeout-below-interval",
        _set("spec.health.deepProbe", {"intervalSeconds": 5, "timeoutSeconds": 5}),
        "timeoutSeconds must be below intervalSeconds",
        "spec.health.deepProbe.timeoutSeconds",
    ),
    (
        "surge-or-unavailable",
        _set("spec.rollout", {"maxSurge": 0, "maxUnavailable": 0}),
        "cannot both be 0",
        "spec.rollout.maxSurge",
    ),
    (
        "replicas-xor-autoscaling",
        _all(_set("spec.replicas", 2), _set("spec.autoscaling", {"maxReplicas": 3})),
        "mutually exclusive",
        "spec.replicas",
    ),
    (
        "tp-divides-gpus",
        _all(_set("spec.resources.gpus", 3), _set("spec.engine.tensorParallelSize", 2)),
        "tensorParallelSize must divide",
        "spec.engine.tensorParallelSize",
    ),
    (
        "pp-needs-tp-equal-gpus",
        _all(
            _set("spec.resources.gpus", 8),
            _set("spec.engine.tensorParallelSize", 4),
            _set("spec.engine.pipelineParallelSize", 2),
        ),
        "pipelineParallelSize above 1 needs spec.engine.tensorParallelSize",
        "spec.engine.pipelineParallelSize",
    ),
    (
        "pp-bounds",
        _set("spec.engine.pipelineParallelSize", 65),
        "spec.engine.pipelineParallelSize",
        "spec.engine.pipelineParallelSize",
    ),
    (
        "cpu-engine-needs-memory",
        _all(_set("spec.engine.backend", "vllm"), _set("spec.resources.gpus", 0)),
        "is required for a CPU engine",
        "spec.resources.memory",
    ),
    (
        "model-len-within-architecture",
        _all(_set("spec.model.architecture", ARCH), _set("spec.engine.maxModelLen", 8192)),
        "exceeds spec.model.architecture.maxPositionEmbeddings",
        "spec.engine.maxModelLen",
    ),
    (
        "cache-exactly-one-source",
        _set("spec.model.cache", {"size": "1Gi", "existingClaim": "weights"}),
        "needs exactly one of size",
        "spec.model.cache",
    ),
    (
        "cache-existing-claim-without-class",
        _set("spec.model.cache", {"existingClaim": "weights", "storageClassName": "fast"}),
        "only apply to a claim the operator creates",
        "spec.model.cache.existingClaim",
    ),
    (
        "cache-not-for-pvc-models",
        _all(
            _set("spec.model.name", "pvc://weights/llama"),
            _set("spec.model.cache", {"size": "1Gi"}),
        ),
        "a pvc:// model is already on a volume",
        "spec.model.cache",
    ),
    (
        "cache-size-is-a-quantity",
        _set("spec.model.cache", {"size": "lots"}),
        "spec.model.cache.size",
        "spec.model.cache.size",
    ),
    ("name-length", _set("metadata.name", "a" * 51), "at most 50 characters", "metadata.name"),
    ("name-dns-label", _set("metadata.name", "x.y"), "must start with a letter", "metadata.name"),
    (
        "inference-pool-picker-name",
        _set("spec.router.inferencePool", {"endpointPickerRef": {"name": "EPP_1", "port": 9002}}),
        "endpointPickerRef.name must be the name",
        "spec.router.inferencePool.endpointPickerRef.name",
    ),
    (
        "scale-to-zero-needs-min-0",
        _set("spec.autoscaling", {"minReplicas": 1, "maxReplicas": 2, "scaleToZero": {}}),
        "scaleToZero needs spec.autoscaling.minReplicas: 0",
        "spec.autoscaling.scaleToZero",
    ),
    (
        "min-0-needs-the-router",
        _all(
            _set("spec.autoscaling", {"minReplicas": 0, "maxReplicas": 2}),
            _set("spec.router", {"enabled": False}),
        ),
        "spec.autoscaling.minReplicas 0 needs spec.router.enabled",
        "spec.autoscaling.minReplicas",
    ),
    (
        "adapter-source-malformed",
        _set("spec.adapters", [{"name": "sql", "source": "s3://bucket/sql"}]),
        "spec.adapters[].source must be hf://",
        "spec.adapters[0].source",
    ),
    (
        "adapter-source-dot-dot",
        _set(
            "spec.adapters",
            [{"name": "ok", "source": "hf://a/b"}, {"name": "sql", "source": "pvc://c/x/.."}],
        ),
        "must not contain '..'",
        "spec.adapters[1].source",
    ),
    (
        "adapter-revision-on-pvc",
        _set("spec.adapters", [{"name": "sql", "source": "pvc://c/sql", "revision": "main"}]),
        "revision is for hf:// sources",
        "spec.adapters[0].revision",
    ),
    (
        "adapter-names-repeat",
        _set(
            "spec.adapters",
            [{"name": "sql", "source": "hf://a/b"}, {"name": "sql", "source": "hf://a/c"}],
        ),
        "spec.adapters[].name must be unique",
        "spec.adapters",
    ),
    (
        "adapter-named-like-the-base",
        _set("spec.adapters", [{"name": "cel-case", "source": "hf://a/b"}]),
        "must differ from the base model's served name",
        "spec.adapters",
    ),
    (
        "adapters-with-pipeline-parallel",
        _all(
            _set("spec.engine.pipelineParallelSize", 2),
            _set("spec.adapters", [{"name": "sql", "source": "hf://a/b"}]),
        ),
        "vLLM 0.32 with --enable-lora and pipeline parallelism crashes",
        "spec.engine.pipelineParallelSize",
    ),
    (
        "lora-cpu-slots-below-gpu-slots",
        _set("spec.engine.lora", {"maxLoras": 8, "maxCpuLoras": 4}),
        "maxCpuLoras must be at least",
        "spec.engine.lora.maxCpuLoras",
    ),
    (
        "lora-rank-not-allowed",
        _set("spec.engine.lora", {"maxLoraRank": 48}),
        "supported values",
        "spec.engine.lora.maxLoraRank",
    ),
]


# Transition rules (updates): (id, cache before, cache after, message part, field).
TRANSITIONS: list[tuple[str, dict[str, Any], dict[str, Any], str, str]] = [
    (
        "cache-class-immutable",
        {"size": "1Gi", "storageClassName": "slow"},
        {"size": "1Gi", "storageClassName": "fast"},
        "storageClassName is immutable",
        "spec.model.cache.storageClassName",
    ),
    (
        "cache-class-cannot-be-added",
        {"size": "1Gi"},
        {"size": "1Gi", "storageClassName": "fast"},
        "storageClassName is immutable",
        "spec.model.cache.storageClassName",
    ),
    (
        "cache-access-modes-immutable",
        {"size": "1Gi"},
        {"size": "1Gi", "accessModes": ["ReadWriteMany"]},
        "accessModes is immutable",
        "spec.model.cache.accessModes",
    ),
]


def test_every_cel_rule_has_a_rejection_case() -> None:
    crd = yaml.safe_load(CRD_PATH.read_text())
    messages = [rule["message"] for rule in cel_rules(crd)]
    assert messages, "the CRD has no CEL rules"
    parts = [case[2] for case in CASES] + [t[3] for t in TRANSITIONS]
    uncovered = [m for m in messages if not any(part in m for part in parts)]
    assert uncovered == []


def test_valid_object_is_accepted(llmop_crd: Cluster) -> None:
    obj = valid()
    result = llmop_crd.kubectl(
        "create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(obj)
    )
    created = json.loads(result.stdout)
    # Defaults come from the CRD schema, not from the operator.
    assert created["spec"]["engine"]["gpuMemoryUtilization"] == 0.9
    assert created["spec"]["rollout"]["maxUnavailable"] == 0
    assert "maxSurge" not in created["spec"]["rollout"]  # decided from the room on the nodes
    assert created["spec"]["engine"]["pipelineParallelSize"] == 1


def test_object_with_adapters_is_accepted(llmop_crd: Cluster) -> None:
    obj = valid()
    obj["spec"]["adapters"] = [
        {"name": f"a{i}", "source": f"hf://acme/lora-{i}", "revision": "f" * 40} for i in range(64)
    ]
    result = llmop_crd.kubectl(
        "create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(obj)
    )
    created = json.loads(result.stdout)
    assert len(created["spec"]["adapters"]) == 64
    assert "lora" not in created["spec"]["engine"]  # implied by adapters, never defaulted in


@pytest.mark.parametrize(
    ("gpus", "tp"), [(8, 8), (8, None), (0, None)], ids=["tp-equals-gpus", "tp-unset", "no-gpus"]
)
def test_pipeline_parallel_object_is_accepted(
    llmop_crd: Cluster, gpus: int, tp: int | None
) -> None:
    obj = valid()
    obj["spec"]["resources"]["gpus"] = gpus
    obj["spec"]["engine"]["pipelineParallelSize"] = 2
    if tp is not None:
        obj["spec"]["engine"]["tensorParallelSize"] = tp
    result = llmop_crd.kubectl(
        "create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(obj)
    )
    assert json.loads(result.stdout)["spec"]["engine"]["pipelineParallelSize"] == 2


@pytest.mark.parametrize(
    ("mutation", "message", "field"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_invalid_object_is_rejected_naming_the_field(
    llmop_crd: Cluster, mutation: Mutation, message: str, field: str
) -> None:
    # Server-side dry runs in `default`: admission runs in full, nothing is stored.
    obj = copy.deepcopy(valid())
    mutation(obj)
    result = llmop_crd.kubectl(
        "create", "--dry-run=server", "-f", "-", input=json.dumps(obj), check=False
    )
    assert result.returncode != 0, f"accepted: {json.dumps(obj)}"
    assert message in result.stderr
    assert field in result.stderr


@pytest.mark.parametrize(
    ("before", "after", "message", "field"),
    [t[1:] for t in TRANSITIONS],
    ids=[t[0] for t in TRANSITIONS],
)
def test_immutable_cache_fields_are_rejected_on_update(
    llmop_crd: Cluster, before: dict[str, Any], after: dict[str, Any], message: str, field: str
) -> None:
    obj = copy.deepcopy(valid())
    obj["metadata"]["name"] = "cel-transition"
    obj["spec"]["model"]["cache"] = before
    llmop_crd.kubectl("create", "-f", "-", input=json.dumps(obj))
    try:
        obj["spec"]["model"]["cache"] = after
        result = llmop_crd.kubectl(
            "replace", "--dry-run=server", "-f", "-", input=json.dumps(obj), check=False
        )
        assert result.returncode != 0, f"accepted: {after}"
        assert message in result.stderr
        assert field in result.stderr
        # Switching to a claim of your own is a new cache, so it is allowed.
        obj["spec"]["model"]["cache"] = {"existingClaim": "weights"}
        llmop_crd.kubectl("replace", "--dry-run=server", "-f", "-", input=json.dumps(obj))
    finally:
        llmop_crd.kubectl("delete", "llmd", "cel-transition", "-n", "default", "--wait=false")
