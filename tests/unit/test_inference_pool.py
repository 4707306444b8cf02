"""spec.router.inferencePool: the API's bounds, the pure renderer, the plan's handling of an
unserved or unwanted pool, the status view (`pool_view`), and the parent pass against an
in-memory API (the fake of llmop.kube from test_reconcile) — applied when served, Degraded when
not, deleted once unwanted, and no request at all for a parent that never had one."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from pydantic import ValidationError
from test_reconcile import NOW, FakeKube, conds, deliver, parent, run_parent

from llmop import conditions, kinds, names, pool_check, pool_view, reconcile
from llmop.api.v1alpha1 import LLMDeployment, LLMDeploymentSpec, LLMDeploymentStatus
from llmop.config import OperatorConfig
from llmop.desired import desired_state
from llmop.kube import KubeError
from llmop.metrics import Metrics
from llmop.plan import plan_children
from llmop.reconcile import pools
from llmop.render import RenderSettings, render_children
from llmop.render.inference_pool import render_inference_pool
from support.passes import parent_pass, status_pass

POOL = {"endpointPickerRef": {"name": "vllm-epp", "port": 9002}}


def llmd(**spec: Any) -> LLMDeployment:
    body = {
        "metadata": {"name": "llama", "namespace": "team", "uid": "u1", "generation": 1},
        "spec": {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, **spec},
    }
    return LLMDeployment.model_validate(body)


# --- API ---------------------------------------------------------------------------------------


def test_the_field_is_optional_and_failure_mode_defaults_to_fail_close() -> None:
    assert llmd().spec.router.inference_pool is None
    ref = llmd(router={"inferencePool": POOL}).spec.router.inference_pool
    assert ref is not None
    assert (ref.endpoint_picker_ref.failure_mode, ref.endpoint_picker_ref.port) == (
        "FailClose",
        9002,
    )


@pytest.mark.parametrize(
    "ref",
    [
        {"name": "epp"},  # no port
        {"name": "epp", "port": 0},
        {"name": "epp", "port": 65536},
        {"name": "", "port": 9002},
        {"name": "x" * 64, "port": 9002},
        {"name": "epp", "port": 9002, "failureMode": "Sometimes"},
    ],
)
def test_out_of_bounds_references_are_refused(ref: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        llmd(router={"inferencePool": {"endpointPickerRef": ref}})


def test_the_crd_schema_checks_the_service_name_with_a_message_naming_the_fix() -> None:
    schema = LLMDeploymentSpec.model_json_schema()
    ref = schema["$defs"]["EndpointPickerRef"]
    (rule,) = ref["x-kubernetes-validations"]
    assert rule["fieldPath"] == ".name"
    assert "spec.router.inferencePool.endpointPickerRef.name" in rule["message"]
    assert "lowercase letters, digits and '-'" in rule["message"]
    assert ref["required"] == ["name", "port"]


# --- renderer ----------------------------------------------------------------------------------


def test_no_pool_without_the_field() -> None:
    assert render_inference_pool(llmd()) is None
    children = render_children(llmd(), RenderSettings(), load_timeout_seconds=900)
    assert children.inference_pool is None
    assert kinds.INFERENCE_POOL in children.unwanted()


def test_pool_selects_exactly_the_services_pods_on_the_engine_port() -> None:
    spec = {"router": {"inferencePool": POOL}, "service": {"port": 8080}}
    children = render_children(llmd(**spec), RenderSettings(), load_timeout_seconds=900)
    pool = children.inference_pool
    assert pool is not None
    assert pool in children.wanted()
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert pool["kind"] == "InferencePool"
    assert pool["metadata"] == {
        "name": "llama",
        "namespace": "team",
        "labels": names.child_labels("llama"),
    }
    assert pool["spec"]["selector"] == {"matchLabels": children.service["spec"]["selector"]}
    assert pool["spec"]["targetPorts"] == [{"number": 8080}]
    assert pool["spec"]["endpointPickerRef"] == {
        "group": "",
        "kind": "Service",
        "name": "vllm-epp",
        "port": {"number": 9002},
        "failureMode": "FailClose",
    }


def test_failure_mode_is_passed_through() -> None:
    ref = {"name": "epp", "port": 9002, "failureMode": "FailOpen"}
    pool = render_inference_pool(llmd(router={"inferencePool": {"endpointPickerRef": ref}}))
    assert pool is not None
    assert pool["spec"]["endpointPickerRef"]["failureMode"] == "FailOpen"


# --- plan --------------------------------------------------------------------------------------

BODY = {"metadata": {"name": "llama", "namespace": "team", "uid": "u1"}}
STUB = {"metadata": {"name": "llama", "namespace": "team"}}


def _plan(spec: dict[str, Any], live: dict[Any, Any], **options: Any) -> list[str]:
    desired = desired_state(llmd(**spec), RenderSettings())
    plan = plan_children(desired, live, parent=BODY, **options)
    return [f"{step.kind_name}:{type(step).__name__}" for step in plan.steps()]


def test_a_wanted_pool_is_applied_with_an_owner_reference() -> None:
    desired = desired_state(llmd(router={"inferencePool": POOL}), RenderSettings())
    plan = plan_children(desired, {}, parent=BODY)
    (apply,) = [a for a in plan.applies if a.kind == "InferencePool"]
    assert apply.field_manager == names.FIELD_MANAGER
    assert apply.manifest["metadata"]["ownerReferences"][0]["uid"] == "u1"


def test_an_unserved_pool_is_neither_applied_nor_deleted() -> None:
    unserved = (kinds.INFERENCE_POOL,)
    steps = _plan({"router": {"inferencePool": POOL}}, {}, unserved=unserved)
    assert "InferencePool:Apply" not in steps
    assert "InferencePool:Delete" not in _plan({}, {kinds.INFERENCE_POOL: STUB}, unserved=unserved)


def test_an_unwanted_pool_is_deleted_only_when_known_to_exist() -> None:
    assert "InferencePool:Delete" in _plan({}, {kinds.INFERENCE_POOL: STUB})
    assert not [s for s in _plan({}, {}) if s.startswith("InferencePool")]


# --- status view -------------------------------------------------------------------------------

WANTS = LLMDeploymentSpec.model_validate(
    {"model": {"name": "m"}, "router": {"inferencePool": POOL}}
)
NOT_WANTED = LLMDeploymentSpec.model_validate({"model": {"name": "m"}})
UNAVAILABLE = LLMDeploymentStatus.model_validate(
    {
        "conditions": [
            {
                "type": "Degraded",
                "status": "True",
                "reason": conditions.REASON_INFERENCE_POOL_UNAVAILABLE,
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ]
    }
)
RECORDED = LLMDeploymentStatus(inference_pool="llama")


@pytest.mark.parametrize(
    ("spec", "previous", "verdict", "expected"),
    [
        # This process's verdict decides.
        (WANTS, RECORDED, pool_view.PoolVerdict("u1", True, False), ("llama", None)),
        (WANTS, RECORDED, pool_view.PoolVerdict("u1", False, True), (None, "unavailable")),
        (NOT_WANTED, RECORDED, pool_view.PoolVerdict("u1", False, False), (None, None)),
        # None for this uid (a restart, another parent of the name): the stored status stands.
        (NOT_WANTED, RECORDED, None, ("llama", None)),
        (WANTS, RECORDED, pool_view.PoolVerdict("old", False, False), ("llama", None)),
        (WANTS, UNAVAILABLE, None, (None, "unavailable")),
        # ...but not a verdict of unavailability once the spec wants no pool.
        (NOT_WANTED, UNAVAILABLE, None, (None, None)),
        (NOT_WANTED, LLMDeploymentStatus(), None, (None, None)),
    ],
)
def test_pool_state(
    spec: LLMDeploymentSpec,
    previous: LLMDeploymentStatus,
    verdict: pool_view.PoolVerdict | None,
    expected: tuple[str | None, str | None],
) -> None:
    recorded, issue = pool_view.pool_state(
        name="llama", namespace="team", uid="u1", spec=spec, previous=previous, verdict=verdict
    )
    assert (recorded, None if issue is None else "unavailable") == expected
    if issue is not None:
        assert issue.reason == conditions.REASON_INFERENCE_POOL_UNAVAILABLE


def test_the_unavailable_message_says_what_to_install_and_what_still_serves() -> None:
    message = pool_view.unavailable_issue("llama", "team").message
    assert "Gateway API Inference Extension CRDs v1.x" in message
    assert "inferencepools.inference.networking.k8s.io" in message
    assert "llama.team.svc" in message


# --- the parent pass ---------------------------------------------------------------------------


class DiscoveryKube(FakeKube):
    """The fake API server, serving the InferencePool API or not."""

    def __init__(self) -> None:
        super().__init__()
        self.serving = True

    def serves(self, api_version: str, plural: str) -> bool:
        self.calls.append(("serves", api_version, plural))
        return self.serving


@pytest.fixture
def kube() -> DiscoveryKube:
    return DiscoveryKube()


@pytest.fixture
def ctx(kube: DiscoveryKube) -> reconcile.Context:
    context = reconcile.Context(
        kube=kube,  # type: ignore[arg-type]
        config=OperatorConfig(),
        metrics=Metrics(),
        instance="test",
        clock=lambda: NOW,
    )
    context.children = {kind: {} for kind in kinds.WATCHED}
    context.parents = {}
    return context


def _create(kube: DiscoveryKube, ctx: reconcile.Context, **spec: Any) -> str:
    kube.put(parent(**spec))
    deliver(ctx, kube)
    return run_parent(ctx, kube)


def _update(kube: DiscoveryKube, ctx: reconcile.Context, **spec: Any) -> str:
    body = kube.objects["LLMDeployment", "ns", "x"]
    updated = parent(**spec)
    body["spec"] = updated["spec"]
    body["metadata"]["generation"] += 1
    deliver(ctx, kube)
    return run_parent(ctx, kube)


def _pool_calls(kube: DiscoveryKube) -> list[tuple[str, str, str]]:
    return [c for c in kube.calls if "InferencePool" in c[1] or c[0] == "serves"]


def test_a_parent_without_a_pool_costs_no_request(
    ctx: reconcile.Context, kube: DiscoveryKube
) -> None:
    _create(kube, ctx)
    _update(kube, ctx, replicas=2)
    assert _pool_calls(kube) == []
    assert "inferencePool" not in kube.objects["LLMDeployment", "ns", "x"]["status"]


def test_pool_applied_recorded_and_deleted_when_the_field_goes(
    ctx: reconcile.Context, kube: DiscoveryKube
) -> None:
    _create(kube, ctx, router={"inferencePool": POOL})
    assert ("InferencePool", "ns", "x") in kube.objects
    assert kube.objects["LLMDeployment", "ns", "x"]["status"]["inferencePool"] == "x"
    assert conds(kube)["Degraded"]["status"] == "False"
    # Discovery once per process, not once per parent pass.
    _update(kube, ctx, router={"inferencePool": POOL}, replicas=2)
    assert [c for c in kube.calls if c[0] == "serves"] == [
        ("serves", "inference.networking.k8s.io/v1", "inferencepools")
    ]
    _update(kube, ctx)
    assert ("InferencePool", "ns", "x") not in kube.objects
    assert "inferencePool" not in kube.objects["LLMDeployment", "ns", "x"]["status"]
    kube.calls.clear()
    _update(kube, ctx, replicas=3)
    assert _pool_calls(kube) == []


def test_a_restarted_operator_deletes_a_pool_its_status_recorded(
    ctx: reconcile.Context, kube: DiscoveryKube
) -> None:
    _create(kube, ctx, router={"inferencePool": POOL})
    ctx.forget("ns", "x")  # a new process: no memory, only the stored status
    _update(kube, ctx)
    assert ("delete", "InferencePool", "x") in kube.calls
    assert ("InferencePool", "ns", "x") not in kube.objects


def test_without_the_api_the_parent_is_degraded_and_serves_then_the_pool_comes(
    ctx: reconcile.Context, kube: DiscoveryKube
) -> None:
    kube.serving = False
    _create(kube, ctx, router={"inferencePool": POOL})
    assert not [c for c in kube.calls if c[0].startswith("apply") and c[1] == "InferencePool"]
    assert ("Deployment", "ns", "x") in kube.objects  # the rest is applied as ever
    degraded = conds(kube)["Degraded"]
    assert (degraded["status"], degraded["reason"]) == ("True", "InferencePoolUnavailable")
    assert conds(kube)["Stalled"]["status"] == "False"
    # Other status paths keep the verdict.
    deliver(ctx, kube)
    status_pass(ctx, "ns", "x")
    assert conds(kube)["Degraded"]["reason"] == "InferencePoolUnavailable"
    # The CRDs arrive: the recheck names the waiting parent; its pass creates the pool.
    assert pools.recheck(ctx) == []
    kube.serving = True
    assert pools.recheck(ctx) == [("ns", "x")]
    deliver(ctx, kube)
    parent_pass(ctx, copy.deepcopy(kube.objects["LLMDeployment", "ns", "x"]))
    assert ("InferencePool", "ns", "x") in kube.objects
    assert conds(kube)["Degraded"]["status"] == "False"
    assert pools.recheck(ctx) == []


class VanishingKube(DiscoveryKube):
    """The CRD was deleted after discovery said it was served: the pool's apply gets a 404."""

    def apply(self, manifest: dict[str, Any], *, field_manager: str, **kw: Any) -> dict[str, Any]:
        if manifest["kind"] == "InferencePool" and not self.serving:
            raise KubeError(
                "APPLY: HTTP 404: the server could not find the requested resource", 404
            )
        return super().apply(manifest, field_manager=field_manager, **kw)


def test_an_api_that_vanished_is_asked_for_again_and_reported(ctx: reconcile.Context) -> None:
    kube = VanishingKube()
    ctx.kube = kube  # type: ignore[assignment]
    _create(kube, ctx, router={"inferencePool": POOL})
    kube.serving = False  # the CRD goes; the operator still believes it is served
    with pytest.raises(KubeError):
        _update(kube, ctx, router={"inferencePool": POOL}, replicas=2)
    # kopf retries the pass: discovery is asked again, and the CR reports the missing API.
    run_parent(ctx, kube)
    assert conds(kube)["Degraded"]["reason"] == "InferencePoolUnavailable"
    assert "inferencePool" not in kube.objects["LLMDeployment", "ns", "x"]["status"]


def test_the_pool_check_reconciles_the_waiting_parents_once_served(
    ctx: reconcile.Context, kube: DiscoveryKube
) -> None:
    kube.serving = False
    _create(kube, ctx, router={"inferencePool": POOL})
    assert pool_check.check(ctx) == 0
    kube.serving = True
    deliver(ctx, kube)
    assert pool_check.check(ctx) == 1
    assert ("InferencePool", "ns", "x") in kube.objects
    assert pool_check.check(ctx) == 0
