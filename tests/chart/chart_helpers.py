"""Lint and render helm/llmop in-process with the Helm v4 SDK.

`helm-python-sdk` (import name `helm_python`) is a ctypes binding to `libhelm_c`, a C ABI
compiled from Helm's own Go SDK (`helm.sh/helm/v4` v4.2.3, see `go version -m` on the bundled
library). It installs from PyPI as a wheel with the library inside, needs no helm binary, no Go
toolchain and no network at run time, and renders, lints, validates `values.schema.json` and
installs releases exactly as the helm CLI does, because it is the same code.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping
from typing import Any

import helm_python as helm
import yaml

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "helm" / "llmop"
RELEASE = "llmop"
NAMESPACE = "llmop-system"

# Non-default values that together switch on every template branch. Each case must lint, pass
# the schema, render, and (in test_chart_cluster) be accepted by the real API server.
MATRIX: dict[str, dict[str, Any]] = {
    "monitoring-all": {
        "engine": {"serviceMonitor": True},
        "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}},
        "monitoring": {
            "podMonitor": {"enabled": True, "labels": {"release": "prom"}},
            "prometheusRule": {
                "enabled": True,
                "kubeStateMetrics": True,
                "alertLabels": {"team": "ml"},
                "ttftP99Seconds": 2,
                "errorRatio": 0.05,
            },
            "grafanaDashboard": {"enabled": True, "annotations": {"grafana_folder": "LLM"}},
            "prometheusAdapter": {"enabled": True},
        },
    },
    "service-label": {
        "engine": {"serviceMonitor": True, "hubEndpoint": "http://hub-mirror.internal:8080"},
        "monitoring": {
            "deploymentLabel": "service",
            "prometheusRule": {"enabled": True},
            "grafanaDashboard": {"enabled": True},
        },
    },
    "namespaced": {
        "operator": {"watchNamespaces": ["team-a", "team-b"], "logFormat": "text"},
        "crds": {"keep": False},
    },
    "no-crds-no-metrics": {"crds": {"enabled": False}, "metrics": {"enabled": False}},
    "custom-everything": {
        "fullnameOverride": "llm-operator",
        "image": {
            "repository": "registry.example.com/llmop/operator",
            "digest": "sha256:" + "a" * 64,
            "pullPolicy": "Always",
        },
        "imagePullSecrets": [{"name": "regcred"}],
        "serviceAccount": {"create": False, "name": "preexisting"},
        "engine": {
            "vllmImage": "registry.example.com/llmop/engine:0.2.0",
            "simulatorImage": "registry.example.com/llmop/engine-sim:0.2.0",
            "imagePullPolicy": "Always",
            "gpuResourceName": "amd.com/gpu",
        },
        "operator": {
            "verbose": True,
            "maxWorkers": 4,
            "retryDelaySeconds": 2.5,
            "requestTimeoutSeconds": 15,
            "agentReadIntervalSeconds": 0,
            "agentReadConcurrency": 8,
            "livenessPort": 8088,
            "extraEnv": [{"name": "LLMOP_PRIORITY", "value": "5"}],
            "podAnnotations": {"example.com/owner": "ml-platform"},
            "podLabels": {"team": "ml"},
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
            "priorityClassName": "system-cluster-critical",
        },
        "metrics": {"port": 9191, "service": {"port": 8443, "annotations": {"a": "b"}}},
    },
}


def load_chart() -> helm.Chart:
    """The chart as Helm loads it (templates, files, values.yaml, values.schema.json)."""
    return helm.Chart.load(CHART_DIR)


def render_files(
    values: Mapping[str, Any] | None = None, *, release: str = RELEASE, namespace: str = NAMESPACE
) -> dict[str, str]:
    """Rendered text per template path, as `helm template` would print it (schema enforced)."""
    with load_chart() as chart:
        return chart.render(dict(values or {}), name=release, namespace=namespace)


def render(
    values: Mapping[str, Any] | None = None, *, release: str = RELEASE, namespace: str = NAMESPACE
) -> list[dict[str, Any]]:
    """The rendered Kubernetes objects (NOTES.txt and empty documents left out)."""
    docs: list[dict[str, Any]] = []
    for path, text in sorted(render_files(values, release=release, namespace=namespace).items()):
        if path.endswith("NOTES.txt"):
            continue
        docs.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return docs


def render_yaml(values: Mapping[str, Any] | None = None, **kwargs: Any) -> str:
    """The rendered objects as one multi-document YAML stream (what `kubectl apply -f -` reads)."""
    return yaml.safe_dump_all(render(values, **kwargs), sort_keys=False)


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    """The one object of `kind` (and `name`); fails listing what exists instead."""
    hits = [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    assert len(hits) == 1, f"expected one {kind} {name or ''}, got {[kinds(docs)]}"
    return hits[0]


def kinds(docs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(kind, name) of every object, sorted."""
    return sorted((d["kind"], d["metadata"]["name"]) for d in docs)


def operator_deployment(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The operator's Deployment (the chart also renders the router's)."""
    hits = [d for d in docs if d["kind"] == "Deployment" and _component(d) == "operator"]
    assert len(hits) == 1, f"expected one operator Deployment, got {kinds(docs)}"
    return hits[0]


def _component(deployment: Mapping[str, Any]) -> str | None:
    labels = deployment["spec"]["selector"]["matchLabels"]
    component: str | None = labels.get("app.kubernetes.io/component")
    return component


def operator_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The operator container of the rendered Deployment."""
    deployment = operator_deployment(docs)
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


def env_of(container: Mapping[str, Any]) -> dict[str, str]:
    """Literal env vars of a container (valueFrom entries left out)."""
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
