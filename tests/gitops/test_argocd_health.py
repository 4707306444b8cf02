"""The Argo CD health check (docs/gitops/argocd-health.lua) run through Lua 5.1 against
LLMDeployments captured from the real operator on the local cluster (tests/fixtures/, written by
tests/chart/test_chart_cluster.py with LLMOP_CAPTURE_FIXTURES=1), plus the snippets that ship it."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml

from gitops.argocd_lua import FIXTURES, HEALTH_LUA, REPO_ROOT, health

HEALTH_KEY = "resource.customizations.health.serving.llmop.dev_LLMDeployment"
EXPECTED = {
    "ready": "Healthy",
    "progressing": "Progressing",
    "stalled": "Degraded",
    "degraded": "Healthy",
}


def fixture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"llmdeployment-{name}.json").read_text())
    return data


def conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in obj["status"]["conditions"]}


def kstatus(obj: dict[str, Any]) -> str:
    """cli-utils kstatus for a generic resource (what Flux's healthChecks use), reduced to the
    cases LLMDeployments produce: InProgress, Failed or Current."""
    status = obj.get("status") or {}
    if status.get("observedGeneration") != obj["metadata"].get("generation"):
        return "InProgress"
    found = {c["type"]: c["status"] for c in status.get("conditions") or []}
    if found.get("Reconciling") == "True":
        return "InProgress"
    if found.get("Stalled") == "True":
        return "Failed"
    if found.get("Ready") == "False" or found.get("Ready") == "Unknown":
        return "InProgress"
    return "Current"


ARGO_FOR_KSTATUS = {"Current": "Healthy", "Failed": "Degraded", "InProgress": "Progressing"}


@pytest.mark.parametrize("name", EXPECTED)
def test_captured_objects_are_real_operator_output(name: str) -> None:
    obj = fixture(name)
    assert obj["apiVersion"] == "serving.llmop.dev/v1alpha1"
    assert obj["kind"] == "LLMDeployment"
    assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"]
    assert {"Ready", "Reconciling", "Stalled"} <= set(conditions(obj))
    assert "managedFields" not in obj["metadata"]


@pytest.mark.parametrize(("name", "expected"), EXPECTED.items())
def test_captured_statuses_are_classified(name: str, expected: str) -> None:
    status, message = health(fixture(name))
    assert status == expected
    assert message


def test_messages_carry_the_condition_reason() -> None:
    stalled = fixture("stalled")
    _, message = health(stalled)
    assert message.startswith(conditions(stalled)["Stalled"]["reason"] + ": ")
    _, message = health(fixture("progressing"))
    assert message.startswith(conditions(fixture("progressing"))["Ready"]["reason"])


@pytest.mark.parametrize("name", EXPECTED)
def test_a_spec_change_not_yet_observed_is_progressing(name: str) -> None:
    obj = copy.deepcopy(fixture(name))
    obj["metadata"]["generation"] += 1
    status, message = health(obj)
    assert status == "Progressing"
    assert f"generation {obj['metadata']['generation']}" in message


def test_degraded_is_named_but_never_hides_ready_or_stalled() -> None:
    obj = fixture("degraded")
    degraded = conditions(obj)["Degraded"]
    assert (degraded["status"], degraded["reason"]) == ("True", "ContainerRestarting")
    status, message = health(obj)
    assert status == "Healthy"
    assert message.startswith("AllReplicasReady: ")
    assert f"(Degraded: ContainerRestarting: {degraded['message']})" in message
    stalled = copy.deepcopy(obj)
    conditions(stalled)["Stalled"].update(status="True", reason="ProgressDeadlineExceeded")
    assert health(stalled)[0] == "Degraded"
    not_ready = copy.deepcopy(obj)
    conditions(not_ready)["Ready"].update(status="False", reason="WaitingForReplicas")
    status, message = health(not_ready)
    assert status == "Progressing"
    assert "(Degraded: ContainerRestarting" in message


def test_no_status_yet_is_progressing() -> None:
    obj = copy.deepcopy(fixture("ready"))
    del obj["status"]
    assert health(obj)[0] == "Progressing"
    obj["status"] = {"observedGeneration": obj["metadata"]["generation"]}
    assert health(obj)[0] == "Progressing"


def test_stalled_wins_over_a_stale_ready() -> None:
    obj = copy.deepcopy(fixture("ready"))
    for condition in obj["status"]["conditions"]:
        if condition["type"] == "Stalled":
            condition.update(status="True", reason="ProgressDeadlineExceeded", message="stuck")
    assert health(obj) == ("Degraded", "ProgressDeadlineExceeded: stuck")


@pytest.mark.parametrize("name", EXPECTED)
def test_argo_cd_and_flux_agree(name: str) -> None:
    obj = fixture(name)
    bumped = copy.deepcopy(obj)
    bumped["metadata"]["generation"] += 1
    for case in (obj, bumped):
        assert health(case)[0] == ARGO_FOR_KSTATUS[kstatus(case)]


def test_script_needs_nothing_argo_cd_does_not_open() -> None:
    # The sandbox has no `string`/`math`, like Argo CD's VM without useOpenLibs.
    with pytest.raises(Exception, match="string"):
        health(fixture("ready"), 'return {status = string.upper("healthy")}')


@pytest.mark.parametrize(
    ("path", "keys"),
    [
        ("docs/gitops/argocd-cm-patch.yaml", ["data", HEALTH_KEY]),
        ("docs/gitops/argocd-values.yaml", ["configs", "cm", HEALTH_KEY]),
    ],
)
def test_snippets_ship_the_tested_script_verbatim(path: str, keys: list[str]) -> None:
    node: Any = yaml.safe_load((REPO_ROOT / path).read_text())
    for key in keys:
        node = node[key]
    assert node == HEALTH_LUA.read_text()


def test_flux_examples_health_check_llmdeployments() -> None:
    docs = list(yaml.safe_load_all((REPO_ROOT / "docs/gitops/flux.yaml").read_text()))
    kustomizations = [d for d in docs if d["kind"] == "Kustomization"]
    checks = [c for k in kustomizations for c in k["spec"].get("healthChecks", [])]
    assert {"apiVersion": "serving.llmop.dev/v1alpha1", "kind": "LLMDeployment"}.items() <= (
        checks[0].items()
    )
    example = yaml.safe_load((REPO_ROOT / "examples/simulator-small.yaml").read_text())
    assert checks[0]["name"] == example["metadata"]["name"]
    release = next(d for d in docs if d["kind"] == "HelmRelease")
    assert release["spec"]["chart"]["spec"]["chart"] == "./helm/llmop"
    # The app's Kustomization waits for the operator's HelmRelease (CRD first, then CRs).
    app = next(k for k in kustomizations if k["spec"].get("healthChecks"))
    assert app["spec"]["dependsOn"][0]["name"]
