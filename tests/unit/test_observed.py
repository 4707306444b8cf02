"""The cached copies of live objects (`llmop.observed`, `llmop.pods.pod_summary`) share their
keys and short values across objects, and stay equal to what they copy."""

from __future__ import annotations

import json
from typing import Any

from llmop.observed import SHARED_STRING_LENGTH, child_summary, parent_summary, shared_strings
from llmop.pods import pod_summary

CONDITION = {
    "type": "Available",
    "status": "True",
    "reason": "MinimumReplicasAvailable",
    "lastTransitionTime": "2026-12-02T19:33:20Z",
    "message": "Deployment has minimum availability.",
}


def _decoded(value: dict[str, Any]) -> dict[str, Any]:
    """`value` as a watch event brings it: a fresh decode with strings of its own."""
    decoded: dict[str, Any] = json.loads(json.dumps(value))
    return decoded


def _deployment(name: str) -> dict[str, Any]:
    return _decoded(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": "team", "labels": {"app": name}},
            "spec": {"replicas": 1, "template": {"spec": {"containers": [{"name": "engine"}]}}},
            "status": {"conditions": [dict(CONDITION)], "observedGeneration": 1},
        }
    )


def test_two_cached_children_share_keys_and_short_values() -> None:
    first, second = child_summary(_deployment("a")), child_summary(_deployment("b"))
    condition_a, condition_b = first["status"]["conditions"][0], second["status"]["conditions"][0]
    assert next(k for k in condition_a if k == "reason") is next(
        k for k in condition_b if k == "reason"
    )
    assert condition_a["reason"] is condition_b["reason"]
    assert first["status"]["conditions"][0] == CONDITION
    assert first["metadata"]["name"] == "a"


def test_a_long_value_is_copied_as_it_is() -> None:
    long_text = "x" * (SHARED_STRING_LENGTH + 1)
    copy = shared_strings(_decoded({"message": long_text, "items": [{"n": 1}, None, True]}))
    assert copy == {"message": long_text, "items": [{"n": 1}, None, True]}


def test_parent_and_pod_copies_share_too() -> None:
    parents = [
        parent_summary(
            _decoded(
                {
                    "kind": "LLMDeployment",
                    "metadata": {"name": name},
                    "spec": {"replicas": 1},
                    "status": {"conditions": [dict(CONDITION)]},
                }
            )
        )
        for name in ("a", "b")
    ]
    assert (
        parents[0]["status"]["conditions"][0]["type"]
        is parents[1]["status"]["conditions"][0]["type"]
    )
    pods = [
        pod_summary(
            _decoded(
                {
                    "metadata": {"name": name, "namespace": "team"},
                    "status": {
                        "phase": "Running",
                        "conditions": [{"type": "Ready", "status": "True"}],
                    },
                }
            )
        )
        for name in ("a-0", "b-0")
    ]
    assert pods[0]["status"]["phase"] is pods[1]["status"]["phase"]
    assert pods[0]["status"]["conditions"] == [{"type": "Ready", "status": "True"}]
