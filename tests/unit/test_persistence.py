"""kopf's memory of LLMDeployments kept off the objects (`llmop.persistence`): the last handled
essence in the process, and progress annotations (with kopf's marker) only while a handler
retries."""

from __future__ import annotations

from typing import Any

import kopf

from llmop import main
from llmop.config import OperatorConfig
from llmop.persistence import MARKER_SUFFIX, ProcessDiffBase, QuietProgressStorage

PREFIX = "serving.llmop.dev"
MARKER = f"{PREFIX}/{MARKER_SUFFIX}"


def body(uid: str = "u-1", annotations: dict[str, str] | None = None, **spec: Any) -> kopf.Body:
    return kopf.Body(
        {
            "apiVersion": "serving.llmop.dev/v1alpha1",
            "kind": "LLMDeployment",
            "metadata": {
                "name": "chat",
                "namespace": "ns",
                "uid": uid,
                "generation": 3,
                "resourceVersion": "42",
                "labels": {"team": "ml"},
                "annotations": dict(annotations or {}),
            },
            "spec": {"replicas": 1, **spec},
            "status": {"observedGeneration": 3},
        }
    )


def test_settings_keep_the_diff_base_in_the_process() -> None:
    settings = main.build_settings(OperatorConfig())
    assert isinstance(settings.persistence.diffbase_storage, ProcessDiffBase)
    assert isinstance(settings.persistence.progress_storage, QuietProgressStorage)
    assert settings.persistence.progress_storage.prefix == PREFIX


def test_unknown_object_has_no_diff_base_so_kopf_handles_it() -> None:
    assert ProcessDiffBase(PREFIX).fetch(body=body()) is None


def test_stored_essence_comes_back_per_uid_and_writes_nothing() -> None:
    storage = ProcessDiffBase(PREFIX)
    essence = storage.build(body=body())
    patch = kopf.Patch()
    storage.store(body=body(), patch=patch, essence=essence)
    assert not patch
    assert storage.fetch(body=body()) == essence
    assert storage.fetch(body=body(uid="u-2")) is None
    assert essence == {"spec": {"replicas": 1}, "metadata": {"labels": {"team": "ml"}}}


def test_a_spec_or_user_annotation_change_differs_but_status_and_our_records_do_not() -> None:
    storage = ProcessDiffBase(PREFIX)
    base = storage.build(body=body())
    retrying = {f"{PREFIX}/reconcile": '{"retries":1}', MARKER: "yes"}
    old_diffbase = {f"{PREFIX}/last-handled-configuration": '{"spec":{}}'}
    assert storage.build(body=body(annotations=retrying)) == base
    assert storage.build(body=body(annotations=old_diffbase)) == base
    assert storage.build(body=body(replicas=2)) != base
    assert storage.build(body=body(annotations={"note": "x"})) != base


def test_the_essence_is_kopfs_without_copying_the_rest_of_the_body() -> None:
    """The same essence as kopf's own build, from a body with the parts
    kopf would copy and drop: managedFields, status, identity."""
    full = body(annotations={"note": "x", MARKER: "yes", f"{PREFIX}/reconcile": "{}"})
    full["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]
    full["metadata"]["finalizers"] = ["x"]
    ours = ProcessDiffBase(PREFIX).build(body=full)
    # kopf's own build (its marker on our prefix drops our records there too).
    assert ours == kopf.AnnotationsDiffBaseStorage(prefix="other.example").build(body=full)
    assert ours == {
        "spec": {"replicas": 1},
        "metadata": {"labels": {"team": "ml"}, "annotations": {"note": "x"}},
    }
    # Nothing of the body is shared with the essence: later changes do not leak into it.
    full["spec"]["replicas"] = 5
    full["metadata"]["labels"]["team"] = "other"
    assert ours["spec"] == {"replicas": 1}
    assert ours["metadata"]["labels"] == {"team": "ml"}


def test_a_child_has_no_essence_so_kopf_sees_no_change_in_it() -> None:
    """kopf asks for an essence on every event of every watched kind; only the LLMDeployment has
    change handlers, so a child's essence (its spec copied) would be built for nothing."""
    deployment = kopf.Body(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "chat", "namespace": "ns", "uid": "d-1"},
            "spec": {"replicas": 1, "template": {"spec": {"containers": [{"name": "engine"}]}}},
        }
    )
    storage = ProcessDiffBase(PREFIX)
    assert storage.build(body=deployment) is None
    assert storage.fetch(body=deployment) is None


def test_forget_drops_a_deleted_object() -> None:
    storage = ProcessDiffBase(PREFIX)
    storage.store(body=body(), patch=kopf.Patch(), essence=storage.build(body=body()))
    assert len(storage) == 1
    storage.forget("u-1")
    storage.forget("u-1")  # twice is harmless: DELETED may be seen after a relist
    assert len(storage) == 0
    assert storage.fetch(body=body()) is None


def _record(**fields: Any) -> Any:
    return {"started": "2026-11-24T00:00:00", "retries": 0, **fields}


def test_a_handler_that_succeeds_at_once_leaves_the_object_untouched() -> None:
    storage = QuietProgressStorage(prefix=PREFIX)
    patch = kopf.Patch()
    key: Any = "reconcile"
    storage.store(key=key, record=_record(success=True), body=body(), patch=patch)
    assert patch  # kopf's own storage writes the record and its marker...
    storage.purge(key=key, body=body(), patch=patch)
    assert not patch  # ...and the purge of a success leaves nothing to send


def test_a_retrying_handler_keeps_its_record_and_marker() -> None:
    storage = QuietProgressStorage(prefix=PREFIX)
    patch = kopf.Patch()
    key: Any = "reconcile"
    storage.store(key=key, record=_record(retries=1, delayed="x"), body=body(), patch=patch)
    annotations = patch["metadata"]["annotations"]
    assert set(annotations) == {f"{PREFIX}/reconcile", MARKER}


def test_a_success_after_retries_removes_the_record_and_keeps_the_marker() -> None:
    storage = QuietProgressStorage(prefix=PREFIX)
    retried = body(annotations={f"{PREFIX}/reconcile": '{"retries":1}', MARKER: "yes"})
    patch = kopf.Patch()
    key: Any = "reconcile"
    storage.store(key=key, record=_record(success=True, retries=1), body=retried, patch=patch)
    storage.purge(key=key, body=retried, patch=patch)
    assert patch == {"metadata": {"annotations": {f"{PREFIX}/reconcile": None}}}


def test_other_metadata_in_the_patch_is_kept() -> None:
    storage = QuietProgressStorage(prefix=PREFIX)
    patch = kopf.Patch({"metadata": {"labels": {"a": "b"}}})
    key: Any = "reconcile"
    storage.store(key=key, record=_record(success=True), body=body(), patch=patch)
    storage.purge(key=key, body=body(), patch=patch)
    assert patch == {"metadata": {"labels": {"a": "b"}}}
