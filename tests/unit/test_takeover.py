"""No takeovers, the pure decisions: a child the watch cache does not show is only created
(`Apply.new`), and an object found in its way is judged by its controller reference
(`plan.takeover`): ours (the cache was behind), a deleted predecessor's (wait for the garbage
collector), or someone else's (refused, with a message naming it, its owner and the fix). The
executor and the real API server's answer are proven in
tests/integration/test_operator_takeover.py."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from llmop import kinds
from llmop.api.v1alpha1 import LLMDeployment
from llmop.desired import desired_state
from llmop.plan import OURS, REFUSE, WAIT, owner_reference, plan_children, takeover, with_owner
from llmop.settings import RenderSettings

PARENT: dict[str, Any] = {
    "apiVersion": "serving.llmop.dev/v1alpha1",
    "kind": "LLMDeployment",
    "metadata": {"name": "foo", "namespace": "team-a", "uid": "uid-now", "generation": 1},
    "spec": {
        "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
        "engine": {"backend": "simulator"},
        "resources": {"gpus": 1, "gpuProduct": "NVIDIA-H100-80GB-HBM3"},
        "autoscaling": {"minReplicas": 2, "maxReplicas": 3},
    },
}


def _service() -> dict[str, Any]:
    manifest = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "foo", "namespace": "team-a"},
        "spec": {"ports": [{"port": 8000}]},
    }
    return with_owner(manifest, owner_reference(PARENT))


def _existing(*references: dict[str, Any]) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "foo", "namespace": "team-a", "uid": "svc-uid"}
    if references:
        metadata["ownerReferences"] = list(references)
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata}


def _reference(kind: str, name: str, uid: str, *, controller: bool = True) -> dict[str, Any]:
    api = "serving.llmop.dev/v1alpha1" if kind == "LLMDeployment" else "apps/v1"
    return {"apiVersion": api, "kind": kind, "name": name, "uid": uid, "controller": controller}


def test_an_object_this_parent_controls_is_applied_as_usual() -> None:
    found = takeover(_service(), _existing(_reference("LLMDeployment", "foo", "uid-now")))
    assert found.verdict == OURS


def test_a_deleted_predecessors_child_waits_for_the_garbage_collector() -> None:
    found = takeover(_service(), _existing(_reference("LLMDeployment", "foo", "uid-before")))
    assert found.verdict == WAIT


def test_an_object_with_no_owner_is_refused_with_a_message_naming_it_and_the_fix() -> None:
    found = takeover(_service(), _existing())
    assert found.verdict == REFUSE
    assert found.message == (
        "Service team-a/foo already exists and is not this LLMDeployment's (no owner), so it "
        "was left untouched: delete or rename that Service, or give the LLMDeployment another "
        "name; the operator creates its Service once the name is free"
    )


@pytest.mark.parametrize(
    ("references", "owner"),
    [
        ([_reference("Deployment", "shop", "d-1")], "controller Deployment shop"),
        ([_reference("LLMDeployment", "bar", "uid-bar")], "controller LLMDeployment bar"),
        (
            [_reference("LLMDeployment", "foo", "uid-now", controller=False)],
            "owner LLMDeployment foo",
        ),
    ],
    ids=["other-controller", "other-llmdeployment", "ours-but-not-controller"],
)
def test_anyone_elses_object_is_refused_naming_its_owner(
    references: list[dict[str, Any]], owner: str
) -> None:
    found = takeover(_service(), _existing(*references))
    assert found.verdict == REFUSE
    assert f"({owner})" in found.message


def test_only_children_the_watch_cache_lacks_are_created_new() -> None:
    desired = desired_state(LLMDeployment.model_validate(PARENT), RenderSettings())
    fresh = plan_children(desired, {}, parent=PARENT)
    by_kind = {apply.kind: apply.new for apply in fresh.applies}
    # Watched kinds are created new; an unwatched kind's absence from the caches says nothing.
    assert by_kind["Service"]
    assert by_kind["Deployment"]
    assert by_kind["HorizontalPodAutoscaler"]
    assert by_kind.get("NetworkPolicy", False) is False
    assert fresh.handover_last is not None
    assert not fresh.handover_last.new
    service = next(a.manifest for a in fresh.applies if a.kind == "Service")
    live = {kinds.SERVICE: copy.deepcopy(service)}
    again = plan_children(desired, live, parent=PARENT)
    assert not next(a for a in again.applies if a.kind == "Service").new
    # A repair of what this process applied for this generation: the cache is only behind.
    repair = plan_children(desired, {}, parent=PARENT, repair=True)
    assert not any(apply.new for apply in repair.applies)
    # A child's own event (it was deleted): recreated new, so a stranger's object is never taken.
    deleted = plan_children(desired, {}, parent=PARENT, only=kinds.SERVICE)
    assert [apply.new for apply in deleted.applies] == [True]
