"""e2e/lws/webhooks.py: the LWS module's webhook manifests, pointed at a host process.

The manifests here have the shape of sigs.k8s.io/lws v0.9.0's `config/webhook` (a kustomize base
plus one JSON patch per kind that adds the pod webhooks' objectSelector); the real files are
exercised end to end by tests/integration/test_lws_controller.py.
"""

from __future__ import annotations

import base64
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

SCRIPT = Path(__file__).resolve().parents[2] / "e2e" / "lws" / "webhooks.py"
CA = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lws_webhooks", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def hook(name: str, path: str, resource: str) -> dict[str, Any]:
    return {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "clientConfig": {
            "service": {"name": "webhook-service", "namespace": "system", "path": path}
        },
        "failurePolicy": "Fail",
        "sideEffects": "None",
        "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": [resource]}],
    }


def pod_patch(name: str, path: str) -> list[dict[str, Any]]:
    value = hook(name, path, "pods")
    value["objectSelector"] = {
        "matchExpressions": [{"key": "leaderworkerset.sigs.k8s.io/name", "operator": "Exists"}]
    }
    return [{"op": "replace", "path": "/webhooks/1", "value": value}]


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    docs = [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": kind,
            "metadata": {"name": f"{prefix}-webhook-configuration"},
            "webhooks": [
                hook(f"{prefix[0]}lws.kb.io", f"/{verb}-lws", "leaderworkersets"),
                hook(f"{prefix[0]}pod.kb.io", f"/{verb}--v1-pod", "pods"),
            ],
        }
        for kind, prefix, verb in (
            ("MutatingWebhookConfiguration", "mutating", "mutate"),
            ("ValidatingWebhookConfiguration", "validating", "validate"),
        )
    ]
    (tmp_path / "manifests.yaml").write_text(yaml.safe_dump_all(docs))
    (tmp_path / "mutating-patch.yaml").write_text(
        yaml.safe_dump(pod_patch("mpod.kb.io", "/mutate--v1-pod"))
    )
    (tmp_path / "validating-patch.yaml").write_text(
        yaml.safe_dump(pod_patch("vpod.kb.io", "/validate--v1-pod"))
    )
    return tmp_path


def test_every_webhook_points_at_the_local_port_with_the_ca(config_dir: Path) -> None:
    out = load().render(config_dir, 40123, CA)
    assert out["kind"] == "List"
    by_name = {doc["metadata"]["name"]: doc for doc in out["items"]}
    assert set(by_name) == {
        "lws-mutating-webhook-configuration",
        "lws-validating-webhook-configuration",
    }
    hooks = [h for doc in out["items"] for h in doc["webhooks"]]
    assert [h["clientConfig"]["url"] for h in hooks] == [
        "https://127.0.0.1:40123/mutate-lws",
        "https://127.0.0.1:40123/mutate--v1-pod",
        "https://127.0.0.1:40123/validate-lws",
        "https://127.0.0.1:40123/validate--v1-pod",
    ]
    assert {base64.b64decode(h["clientConfig"]["caBundle"]) for h in hooks} == {CA}
    assert all("service" not in h["clientConfig"] for h in hooks)
    assert all(h["failurePolicy"] == "Fail" for h in hooks)


def test_pod_webhooks_only_see_lws_pods(config_dir: Path) -> None:
    out = load().render(config_dir, 40123, CA)
    selectors = {
        h["name"]: h.get("objectSelector") for doc in out["items"] for h in doc["webhooks"]
    }
    only_lws = {
        "matchExpressions": [{"key": "leaderworkerset.sigs.k8s.io/name", "operator": "Exists"}]
    }
    assert selectors == {
        "mlws.kb.io": None,
        "mpod.kb.io": only_lws,
        "vlws.kb.io": None,
        "vpod.kb.io": only_lws,
    }


def test_a_patch_it_does_not_understand_fails(config_dir: Path) -> None:
    (config_dir / "mutating-patch.yaml").write_text(
        yaml.safe_dump([{"op": "add", "path": "/webhooks/-", "value": {}}])
    )
    with pytest.raises(ValueError, match="unsupported webhook patch add"):
        load().render(config_dir, 40123, CA)
