"""The model revision each engine pod serves, read from its own engine container and written to
`status.routing.modelRevisions`, so the router continues a stream only on a pod that would have
produced the same tokens."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from llmop import kinds, model_revision, names
from llmop.agents import AgentReading, PodAdapter
from llmop.api.v1alpha1 import LLMDeployment, LLMDeploymentStatus
from llmop.desired import desired_state
from llmop.pods import pod_summary
from llmop.settings import RenderSettings
from llmop.status import Observed, derive_status

PARENT = {
    "apiVersion": "serving.llmop.dev/v1alpha1",
    "kind": "LLMDeployment",
    "metadata": {"name": "rev", "namespace": "team", "uid": "uid-1", "generation": 1},
}
SPEC: dict[str, Any] = {
    "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
    "engine": {"backend": "simulator"},
    "replicas": 2,
}


def llmd(**spec: Any) -> LLMDeployment:
    return LLMDeployment.model_validate({**PARENT, "spec": {**SPEC, **spec}})


def engine_pod(name: str, **spec: Any) -> dict[str, Any]:
    """A pod as the ReplicaSet makes it from the rendered template."""
    children = desired_state(llmd(**spec), RenderSettings()).children
    assert children is not None
    deployment = children.deployment
    assert deployment is not None
    template = deployment["spec"]["template"]
    metadata = {**template["metadata"], "name": name, "namespace": "team"}
    return {"metadata": metadata, "spec": template["spec"], "status": {"phase": "Running"}}


def revision(**spec: Any) -> str | None:
    return model_revision.model_revision(engine_pod("p", **spec))


def test_the_model_and_the_flags_that_decide_tokens_make_the_revision() -> None:
    base = revision()
    assert base is not None
    assert len(base) == 12
    assert revision() == base
    assert revision(model={"name": "Qwen/Qwen2.5-0.5B-Instruct", "revision": "abc123"}) != base
    assert revision(model={"name": "Qwen/Qwen2.5-1.5B-Instruct"}) != base
    assert revision(engine={"backend": "simulator", "dtype": "float16"}) != base
    assert revision(engine={"backend": "simulator", "args": ["--tokenizer", "other/tok"]}) != base


def test_flags_that_change_speed_or_memory_only_keep_it() -> None:
    base = revision()
    assert revision(engine={"backend": "simulator", "maxNumSeqs": 8}) == base
    assert revision(engine={"backend": "simulator", "image": "registry.test/engine:2"}) == base
    assert revision(engine={"backend": "simulator", "args": ["--seed", "7"]}) == base


def test_flag_spellings_and_order_do_not_matter() -> None:
    one = model_revision.revision_of_flags(["m", "--dtype", "half", "--revision", "r1", "--x"])
    other = model_revision.revision_of_flags(["m", "--x", "--revision=r1", "--dtype=half"])
    assert one == other
    assert model_revision.revision_of_flags(["m", "--revision", "r2"]) != one


def test_pods_without_an_api_or_an_engine_have_none() -> None:
    pod = engine_pod("w")
    pod["metadata"]["labels"] = {**pod["metadata"]["labels"], names.LABEL_LWS_WORKER_INDEX: "1"}
    assert model_revision.model_revision(pod) is None
    leader = engine_pod("l")
    leader["metadata"]["labels"] = {
        **leader["metadata"]["labels"],
        names.LABEL_LWS_WORKER_INDEX: "0",
    }
    assert model_revision.model_revision(leader) == revision()
    assert model_revision.model_revision({"metadata": {"name": "x"}, "spec": {}}) is None


def test_the_watch_cache_summary_keeps_only_the_revision_of_the_spec() -> None:
    summary = pod_summary(engine_pod("p-1"))
    assert "spec" not in summary
    assert summary[model_revision.SUMMARY_FIELD] == revision()


def test_revisions_group_pods_and_stay_bounded() -> None:
    pods = [pod_summary(engine_pod(f"old-{i}")) for i in range(2)]
    pods.append(pod_summary(engine_pod("new-0", model={"name": "org/other"})))
    grouped = model_revision.revisions_by_pod(pods)
    assert sorted(grouped.values()) == [["new-0"], ["old-0", "old-1"]]
    many = [
        {"metadata": {"name": f"p-{i:05d}"}, model_revision.SUMMARY_FIELD: f"r{i % 100:03d}"}
        for i in range(5000)
    ]
    bounded = model_revision.revisions_by_pod(many)
    assert len(bounded) <= model_revision.MAX_REVISIONS
    assert sum(len(v) for v in bounded.values()) <= model_revision.MAX_PODS


def derived(
    resource: LLMDeployment, pods: list[dict[str, Any]], **observed: Any
) -> LLMDeploymentStatus:
    """The status the operator derives for `resource` with these pod summaries."""
    seen = Observed(
        "rev",
        "team",
        generation=1,
        previous=LLMDeploymentStatus(),
        children={kinds.DEPLOYMENT: {"status": {}}},
        pods=pods,
        **observed,
    )
    now = datetime(2026, 12, 6, tzinfo=UTC)
    return derive_status(seen, resource.spec, None, template_hash=None, now=now)


def test_the_status_lists_which_pods_serve_which_revision() -> None:
    old = [pod_summary(engine_pod(f"rev-a-{i}")) for i in range(2)]
    new = [pod_summary(engine_pod("rev-b-0", model={"name": "org/other"}))]
    status = derived(llmd(), [*old, *new], routing=["rev"])
    assert status.routing is not None
    listed = {r.revision: r.pods for r in status.routing.model_revisions}
    assert listed == {
        revision(): ["rev-a-0", "rev-a-1"],
        revision(model={"name": "org/other"}): ["rev-b-0"],
    }
    body = status.model_dump(by_alias=True, exclude_none=True)
    assert body["routing"]["modelRevisions"][0].keys() == {"revision", "pods"}
    assert "adapterRevisions" not in body["routing"]  # no adapters


def test_the_status_says_which_adapters_are_settled_at_which_revision() -> None:
    sha = "c" * 40
    adapters = [{"name": "sql", "source": "hf://acme/sql", "revision": sha}]
    pods = []
    for name in ("rev-a-0", "rev-a-1"):
        pod = engine_pod(name, adapters=adapters)
        pod["status"]["containerStatuses"] = [{"name": "engine", "ready": True}]
        pods.append(pod_summary(pod))
    fleet = [
        AgentReading(pod, ready=True, adapters=(PodAdapter("sql", "Loaded", revision=sha),))
        for pod in ("rev-a-0", "rev-a-1")
    ]
    status = derived(llmd(adapters=adapters), pods, fleet=fleet, routing=["rev", "sql"])
    body = status.model_dump(by_alias=True, exclude_none=True)
    settled = [{"name": "sql", "revision": sha, "settled": True}]
    assert body["routing"]["adapterRevisions"] == settled
