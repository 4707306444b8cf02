"""The operator planning a model outside the catalog from its own files (issue 52 item 5): which
specs need the files read (`model_facts.request_for`), what the Hub's answer means
(`answer_of`), what the plan gets meanwhile (`verdict` → `sizing.plan_from` → desired state and
status), and the process's memory of reads (`reconcile.facts.FactsMemory`) as the parse uses
it. The files are published configs (tests/support/published_configs.py); the Hub path itself
runs against the stand-in in tests/integration/test_operator_model_facts.py."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, cast

import pytest

from llmop import kinds, model_facts
from llmop.api.v1alpha1 import LLMDeployment, PlanStatus
from llmop.config import OperatorConfig
from llmop.desired import desired_state
from llmop.metrics import Metrics
from llmop.model_facts import FactsRequest, Read, Refused, Unavailable
from llmop.planner.model_config import ModelFiles
from llmop.preflight import HubFailure
from llmop.reconcile import Context, facts
from llmop.reconcile.caches import parse
from llmop.reconcile.facts import FactsMemory
from llmop.settings import RenderSettings
from llmop.sizing import REASON_MODEL_UNKNOWN, FactsVerdict, plan_for, plan_from
from llmop.status import Observed, derive_status, find_problem, observe_rollout
from support.manifests import H100
from support.published_configs import CONFIGS

GEMMA = "google/gemma-3-12b-it"
"""Outside the catalog; 23 GiB of weights: fits one H100."""
SCOUT = "meta-llama/Llama-4-Scout-17B-16E-Instruct"
"""Outside the catalog; 202 GiB of weights: no single H100 holds it."""
SCOUT_BYTES = int(202.3611 * (1 << 30))
COMMIT = "0123456789abcdef0123456789abcdef01234567"
NOW = datetime(2026, 12, 5, tzinfo=UTC)


def llmd(name: str = GEMMA, *, generation: int = 1, **spec: Any) -> LLMDeployment:
    """An LLMDeployment of model `name` on one H100 (vLLM); `spec` merges into its sections."""
    body: dict[str, Any] = {
        "model": {"name": name},
        "engine": {"backend": "vllm", "maxModelLen": 8192},
        "resources": {"gpus": 1, "gpuProduct": H100},
    }
    for key, value in spec.items():
        body[key] = {**body.get(key, {}), **value} if isinstance(value, dict) else value
    return LLMDeployment.model_validate(
        {
            "apiVersion": "serving.llmop.dev/v1alpha1",
            "kind": "LLMDeployment",
            "metadata": {"name": "m", "namespace": "ns", "uid": "u1", "generation": generation},
            "spec": body,
        }
    )


def files(model: str, *, total_size: int | None = None) -> ModelFiles:
    index = None if total_size is None else json.dumps({"metadata": {"total_size": total_size}})
    return ModelFiles(json.dumps(CONFIGS[model]), index, revision=COMMIT)


def read(model: str, **kw: Any) -> Read:
    answer = model_facts.answer_of(FactsRequest(model, None), files(model, **kw), attempts=1)
    assert isinstance(answer, Read)
    return answer


# -- which specs need the files ----------------------------------------------------------------


def test_a_model_outside_the_catalog_on_a_known_gpu_needs_its_files_at_its_revision() -> None:
    wanted = model_facts.request_for(llmd(model={"name": GEMMA, "revision": COMMIT}))
    assert wanted == FactsRequest(GEMMA, COMMIT)
    assert wanted.at == f"{GEMMA}@{COMMIT}"
    assert FactsRequest(GEMMA, None).at == f"{GEMMA}@main"


def test_the_token_secret_is_part_of_the_request_and_public_models_ask_once() -> None:
    gated = llmd(model={"name": GEMMA, "tokenSecretRef": {"name": "hf", "key": "token"}})
    assert model_facts.request_for(gated) == FactsRequest(GEMMA, None, "ns", ("hf", "token"))
    # Any token reads the same files: the facts are kept by model and revision alone.
    assert FactsRequest(GEMMA, None, "ns", ("hf", "token")).files == (GEMMA, "main")


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param({"model": {"name": "Qwen/Qwen2.5-7B-Instruct"}}, id="catalog"),
        pytest.param(
            {
                "model": {
                    "name": GEMMA,
                    "architecture": {
                        "parameters": 12_000_000_000,
                        "layers": 48,
                        "kvHeads": 8,
                        "headDim": 256,
                        "maxPositionEmbeddings": 131072,
                    },
                }
            },
            id="spec-architecture",
        ),
        pytest.param({"model": {"name": "pvc://weights/gemma"}}, id="pvc"),
        pytest.param(
            {"engine": {"backend": "simulator"}, "resources": {"gpus": 0}}, id="simulator-no-gpu"
        ),
        pytest.param({"resources": {"gpuProduct": None}}, id="gpu-memory-unknown"),
    ],
)
def test_no_files_are_read_when_the_plan_could_not_use_them(spec: dict[str, Any]) -> None:
    assert model_facts.request_for(llmd(**spec)) is None


# -- what the Hub's answer means ---------------------------------------------------------------


def test_the_files_read_are_the_facts_at_the_commit() -> None:
    answer = read(SCOUT, total_size=SCOUT_BYTES)
    assert answer.commit == COMMIT
    assert answer.facts.source == "hub"
    assert answer.facts.checkpoint_bytes == SCOUT_BYTES


def test_a_hub_that_does_not_answer_is_retried_with_backoff() -> None:
    request = FactsRequest(GEMMA, "main")
    outage = HubFailure("unreachable", "ConnectError: [Errno 111] Connection refused")
    answers = [model_facts.answer_of(request, outage, attempts=n) for n in (1, 2, 3, 9)]
    assert all(isinstance(a, Unavailable) for a in answers)
    assert [cast(Unavailable, a).retry_in for a in answers] == [5.0, 10.0, 20.0, 300.0]
    assert cast(Unavailable, answers[0]).detail == outage.detail


@pytest.mark.parametrize(
    ("found", "reason", "named"),
    [
        (HubFailure("repo_not_found", "404"), "ModelNotFound", "check spec.model.name"),
        (HubFailure("revision_not_found", "404"), "ModelNotFound", "set spec.model.revision"),
        (HubFailure("no_token", "401"), "ModelAccessDenied", "spec.model.tokenSecretRef"),
        (HubFailure("access_denied", "403"), "ModelAccessDenied", "Secret hf/token"),
        (ModelFiles(None, revision=COMMIT), "ModelConfigUnsupported", "config.json: no such file"),
        (
            ModelFiles(
                json.dumps({"model_type": "kimi_linear", "linear_attn_config": {}}),
                revision=COMMIT,
            ),
            "ModelConfigUnsupported",
            "config.json: linear_attn_config: model_type 'kimi_linear' has Mamba",
        ),
        (
            ModelFiles(
                json.dumps(
                    {
                        "architectures": ["BambaForCausalLM"],
                        "model_type": "bamba",
                        "mamba_d_state": 16,
                    }
                ),
                revision=COMMIT,
            ),
            "ModelConfigUnsupported",
            "config.json: architectures: BambaForCausalLM was served by vLLM up to 0.23.0",
        ),
        (
            ModelFiles(
                json.dumps({**CONFIGS[GEMMA], "quantization_config": {"quant_method": "hqq"}}),
                revision=COMMIT,
            ),
            "ModelConfigUnsupported",
            "config.json: quantization_config.quant_method: unknown quantization 'hqq'",
        ),
    ],
    ids=[
        "no-repo",
        "no-revision",
        "gated",
        "no-access",
        "no-config",
        "mamba",
        "no-longer-served",
        "quantization",
    ],
)
def test_a_refusal_names_the_file_field_and_fix(
    found: ModelFiles | HubFailure, reason: str, named: str
) -> None:
    request = FactsRequest(GEMMA, "v2", "ns", ("hf", "token"))
    answer = model_facts.answer_of(request, found, attempts=1)
    assert isinstance(answer, Refused)
    assert answer.reason == reason
    assert named in answer.message
    assert GEMMA in answer.message
    assert "spec.model.architecture" in answer.message or "spec.model" in answer.message


# -- what the plan gets ------------------------------------------------------------------------


def test_facts_read_plan_the_spec_as_llmop_plan_does() -> None:
    deployment = llmd()
    request = FactsRequest(GEMMA, None)
    answer = read(GEMMA)
    verdict = model_facts.verdict(request, answer)
    sizing = plan_from(deployment.spec, verdict)
    assert sizing.fits is True
    assert sizing.facts_source == "hub"
    status = sizing.plan_status()
    assert status is not None
    assert (status.facts_source, status.facts_revision) == ("hub", COMMIT)
    # The CLI's own call with the same facts gives the same plan.
    assert plan_for(deployment.spec, facts=answer.facts).plan == sizing.plan
    assert desired_state(deployment, RenderSettings(), facts=verdict).children is not None


def test_a_model_too_big_is_stalled_with_the_planners_reason() -> None:
    verdict = model_facts.verdict(FactsRequest(SCOUT, None), read(SCOUT, total_size=SCOUT_BYTES))
    desired = desired_state(llmd(SCOUT), RenderSettings(), facts=verdict)
    assert desired.sizing.fits is False
    assert desired.sizing.reason == "WeightsExceedMemory"
    assert desired.children is None
    problem = find_problem(
        desired.sizing, observe_rollout(None, desired.llmd.spec, template_hash=None)
    )
    assert problem is not None
    assert problem.reason == "WeightsExceedMemory"


def _conditions(desired: Any, deployment: dict[str, Any] | None = None) -> dict[str, Any]:
    observed = Observed(
        "m",
        "ns",
        generation=1,
        children={} if deployment is None else {kinds.DEPLOYMENT: deployment},
    )
    status = derive_status(
        observed,
        desired.llmd.spec,
        desired.sizing,
        template_hash=desired.template_hash,
        now=NOW,
    )
    return {c.type: c for c in status.conditions} | {"plan": status.plan}


def test_while_the_files_are_read_nothing_is_created_and_the_status_says_why() -> None:
    verdict = model_facts.verdict(FactsRequest(GEMMA, COMMIT), None)
    desired = desired_state(llmd(), RenderSettings(), facts=verdict)
    assert desired.children is None
    assert desired.sizing.fits is None
    found = _conditions(desired)
    assert found["Reconciling"].status == "True"
    assert found["Reconciling"].reason == model_facts.REASON_READING_MODEL_FILES
    assert f"{GEMMA}@{COMMIT}" in found["Reconciling"].message
    assert found["Stalled"].status == "False"
    assert found["CapacityPlanned"].status == "Unknown"


def test_a_hub_outage_before_the_first_plan_waits_naming_model_revision_and_error() -> None:
    outage = Unavailable("ConnectError: [Errno 111] Connection refused", 2, 10.0)
    verdict = model_facts.verdict(FactsRequest(GEMMA, "v2"), outage)
    desired = desired_state(llmd(), RenderSettings(), facts=verdict)
    assert desired.children is None
    found = _conditions(desired)
    assert found["Stalled"].status == "False"
    waiting = found["Reconciling"]
    assert (waiting.status, waiting.reason) == ("True", "ModelFilesUnavailable")
    for part in (f"{GEMMA}@v2", "Connection refused", "attempt 2", "next in 10 s"):
        assert part in waiting.message


def test_an_outage_after_a_restart_keeps_the_running_engines_and_the_last_plan() -> None:
    held = PlanStatus(kv_cache_tokens=123_456, fits=True, facts_source="hub", max_num_seqs=256)
    outage = Unavailable("ReadTimeout", 1, 5.0)
    verdict = model_facts.verdict(FactsRequest(GEMMA, None), outage, held=held)
    desired = desired_state(llmd(), RenderSettings(), facts=verdict)
    assert desired.children is None  # nothing applied, nothing deleted: the engines run on
    ready = {
        "metadata": {"generation": 1, "annotations": {}},
        "spec": {"replicas": 1},
        "status": {
            "observedGeneration": 1,
            "replicas": 1,
            "readyReplicas": 1,
            "updatedReplicas": 1,
            "availableReplicas": 1,
        },
    }
    found = _conditions(desired, ready)
    assert (found["Ready"].status, found["Stalled"].status) == ("True", "False")
    assert found["CapacityPlanned"].reason == "ModelFilesUnavailable"
    assert "running engines and the last status.plan are kept" in found["CapacityPlanned"].message
    assert found["plan"] == held


def test_a_refusal_stalls_before_anything_is_created() -> None:
    refusal = Refused("ModelConfigUnsupported", "config.json: no such file in x")
    verdict = model_facts.verdict(FactsRequest(GEMMA, None), refusal)
    desired = desired_state(llmd(), RenderSettings(), facts=verdict)
    assert desired.children is None
    found = _conditions(desired)
    assert (found["Stalled"].status, found["Stalled"].reason) == (
        "True",
        "ModelConfigUnsupported",
    )
    assert found["CapacityPlanned"].status == "False"


def test_the_simulator_plans_without_files_the_hub_cannot_give() -> None:
    simulator = llmd(engine={"backend": "simulator"})
    request = FactsRequest(GEMMA, None)
    assert model_facts.verdict(request, None, tolerant=True).outcome == "wait"
    for answer in (Refused("ModelNotFound", "no model"), Unavailable("timeout", 1, 5.0)):
        verdict = model_facts.verdict(request, answer, tolerant=True)
        desired = desired_state(simulator, RenderSettings(), facts=verdict)
        assert desired.children is not None
        assert desired.sizing.reason == REASON_MODEL_UNKNOWN
        assert ("no model" in desired.sizing.message) or ("timeout" in desired.sizing.message)


def test_plan_from_without_a_verdict_is_plan_for() -> None:
    spec = llmd("Qwen/Qwen2.5-7B-Instruct").spec
    assert plan_from(spec, None).facts_source == "catalog"
    assert plan_from(spec, FactsVerdict()).facts_source == "catalog"


# -- the memory of reads -----------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_read_is_taken_once_and_its_facts_answer_every_token() -> None:
    clock = Clock()
    memory = FactsMemory(clock=clock)
    public = FactsRequest(GEMMA, None)
    gated = FactsRequest(GEMMA, None, "other", ("hf", "token"))
    assert memory.want(public, ("ns", "a"), ("u1", 1)) is None
    assert memory.want(gated, ("other", "b"), ("u2", 1)) is None
    due = memory.take_due(lambda key: True)
    assert sorted(r.namespace for r, _ in due) == ["", "other"]
    assert memory.take_due(lambda key: True) == []  # under way
    answer = read(GEMMA)
    assert memory.settle(public, answer) == [("ns", "a"), ("other", "b")]
    assert memory.want(gated, ("other", "b"), ("u2", 1)) is answer
    assert memory.seconds_to_next() is None


def test_an_unanswered_read_is_due_again_after_its_backoff() -> None:
    clock = Clock()
    memory = FactsMemory(clock=clock)
    request = FactsRequest(GEMMA, None)
    memory.want(request, ("ns", "a"), ("u1", 1))
    [(taken, attempt)] = memory.take_due(lambda key: True)
    assert attempt == 1
    outage = Unavailable("timeout", attempt, model_facts.retry_after(attempt))
    assert memory.settle(taken, outage) == [("ns", "a")]
    assert memory.want(request, ("ns", "a"), ("u1", 1)) is outage
    assert memory.take_due(lambda key: True) == []
    assert memory.seconds_to_next() == 5.0
    clock.now += 5.0
    assert memory.take_due(lambda key: True) == [(request, 2)]


def test_a_refusal_is_asked_again_for_a_new_generation_and_after_a_while() -> None:
    clock = Clock()
    memory = FactsMemory(clock=clock)
    request = FactsRequest(GEMMA, None)
    memory.want(request, ("ns", "a"), ("u1", 1))
    memory.take_due(lambda key: True)
    refusal = Refused("ModelNotFound", "no model")
    memory.settle(request, refusal)
    assert memory.want(request, ("ns", "a"), ("u1", 1)) is refusal
    assert memory.take_due(lambda key: True) == []
    assert memory.want(request, ("ns", "a"), ("u1", 2)) is None
    assert memory.take_due(lambda key: True) == [(request, 1)]
    # With no change to the spec (access granted on the Hub, a branch pushed): asked again
    # after a while, the refusal standing meanwhile.
    gated = Refused("ModelGated", "no access")
    assert memory.settle(request, gated) == [("ns", "a")]
    assert memory.seconds_to_next() == facts.REFUSED_RETRY_SECONDS
    clock.now += facts.REFUSED_RETRY_SECONDS - 1
    assert memory.take_due(lambda key: True) == []
    clock.now += 1
    assert memory.take_due(lambda key: True) == [(request, 1)]
    assert memory.want(request, ("ns", "a"), ("u1", 2)) is gated  # until the answer comes
    answer = read(GEMMA)
    assert memory.settle(request, answer) == [("ns", "a")]
    assert memory.want(request, ("ns", "a"), ("u1", 2)) is answer


def test_reads_nobody_waits_for_are_dropped_and_the_facts_are_bounded() -> None:
    memory = FactsMemory(capacity=2, clock=Clock())
    gone = FactsRequest("acme/gone", None)
    memory.want(gone, ("ns", "deleted"), ("u1", 1))
    assert memory.take_due(lambda key: key != ("ns", "deleted")) == []
    assert memory.seconds_to_next() is None
    for name in ("a/one", "a/two", "a/three"):
        memory.settle(FactsRequest(name, None), read(GEMMA))
    assert len(memory) == 2
    assert memory.want(FactsRequest("a/one", None), ("ns", "x"), ("u", 1)) is None  # dropped


# -- the parse -----------------------------------------------------------------------------------


def _context() -> Context:
    return Context(kube=cast(Any, None), config=OperatorConfig(), metrics=Metrics(), instance="t")


def _body(deployment: LLMDeployment, status: dict[str, Any] | None = None) -> dict[str, Any]:
    body = deployment.model_dump(by_alias=True, exclude_none=True, mode="json")
    body.pop("status", None)
    if status is not None:
        body["status"] = status
    return body


def test_the_parse_waits_then_plans_again_once_the_files_are_read() -> None:
    ctx = _context()
    body = _body(llmd())
    first = parse(ctx, body)
    assert first.desired is not None
    assert first.desired.sizing.waiting
    assert parse(ctx, body).desired.sizing.waiting  # type: ignore[union-attr]
    [(request, _)] = ctx.facts.take_due(lambda key: True)
    assert ctx.facts.settle(request, read(GEMMA)) == [("ns", "m")]
    planned = parse(ctx, body)
    assert planned.desired is not None
    assert planned.desired.sizing.fits is True
    assert planned.desired.children is not None
    packed = ctx.recall(("ns", "m")).parsed
    assert packed is not None
    assert parse(ctx, body).answer is packed.answer  # kept: not planned a third time


def test_the_parse_holds_the_last_plan_of_this_generation_from_the_hub() -> None:
    ctx = _context()
    plan = {"kvCacheTokens": 1000, "fits": True, "factsSource": "hub", "factsRevision": COMMIT}
    body = _body(llmd(), {"observedGeneration": 1, "plan": plan})
    held = parse(ctx, body).desired
    assert held is not None
    assert held.sizing.waiting
    assert held.sizing.plan_status() == PlanStatus.model_validate(plan)
    newer = _body(llmd(generation=2), {"observedGeneration": 1, "plan": plan})
    assert parse(ctx, newer).desired.sizing.held is None  # type: ignore[union-attr]
