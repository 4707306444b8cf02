"""The operator plans a model outside the catalog from its own files (issue 52 item 5), against the
real kube-apiserver and the Hub stand-in serving published configs: the CR is planned from the
hub's `config.json` (status.plan.factsSource, factsRevision), a model too big for its GPUs is
Stalled with the planner's reason and gets no pods, a revision without `config.json` is Stalled
naming the file; with the stand-in stopped, a CR already planned is never stalled (a new
generation is planned from the facts in memory) and a CR never planned waits with a condition
naming the model, revision and error, then is planned once the Hub answers again; an operator
restarted during an outage plans a CR it planned before from the files it recorded."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from support.cluster import wait_until
from support.hub_standin import HubRepo, HubStandin
from support.manifests import H100
from support.operator import OperatorProcess, conditions, free_port
from support.published_configs import CHECKPOINT_GIB, CONFIGS

if TYPE_CHECKING:
    from support.operator import Kit

pytestmark = pytest.mark.cluster

FITS = "google/gemma-3-12b-it"
"""Outside the catalog; 23 GiB of weights on one H100."""
TOO_BIG = "meta-llama/Llama-4-Scout-17B-16E-Instruct"
"""Outside the catalog; its safetensors index says 202 GiB."""
LATE = "microsoft/phi-4"
"""Outside the catalog, and first asked for while the Hub is down."""
NO_CONFIG = "acme/no-config"


def _repo(root: Path, repo: str) -> HubRepo:
    directory = root / repo.replace("/", "--")
    directory.mkdir(parents=True)
    if repo in CONFIGS:
        (directory / "config.json").write_text(json.dumps(CONFIGS[repo]))
    else:
        (directory / "README.md").write_text("weights only\n")
    if repo in CHECKPOINT_GIB:
        total = int(CHECKPOINT_GIB[repo] * (1 << 30))
        index = {"metadata": {"total_size": total}, "weight_map": {}}
        (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return HubRepo(repo, directory)


class Hub:
    """The stand-in on one port that a test may stop and start again (the operator keeps its
    endpoint)."""

    def __init__(self, repos: list[HubRepo]) -> None:
        self.repos = repos
        self.port = free_port()
        self.standin: HubStandin | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> HubStandin:
        self.standin = HubStandin(self.repos, port=self.port).start()
        return self.standin

    def stop(self) -> None:
        if self.standin is not None:
            self.standin.stop()
            self.standin = None

    def asked_for(self, repo: str) -> int:
        """Requests the running stand-in served for `repo`."""
        served = [] if self.standin is None else self.standin.requests
        return sum(1 for r in served if repo in r.path)

    def sha(self, repo: str) -> str:
        return next(r.sha for r in self.repos if r.repo_id == repo)


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    root = tmp_path_factory.mktemp("hub")
    hub = Hub([_repo(root, repo) for repo in (FITS, TOO_BIG, LATE, NO_CONFIG)])
    hub.start()
    try:
        yield hub
    finally:
        hub.stop()


@pytest.fixture(scope="module")
def operator(
    operator_kubeconfig: Path, hub: Hub, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    process = OperatorProcess(
        operator_kubeconfig,
        tmp_path_factory.mktemp("operator-log") / "operator.log",
        extra_env={"LLMOP_HUB_ENDPOINT": hub.url},
    )
    process.start()
    try:
        yield process
    finally:
        process.stop()


def spec(model: str, replicas: int = 1) -> dict[str, Any]:
    return {
        "model": {"name": model},
        "engine": {"backend": "vllm", "maxModelLen": 8192},
        "resources": {"gpus": 1, "gpuProduct": H100},
        "replicas": replicas,
    }


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return conditions(obj)[type_]


def planned(kit: Kit, namespace: str, name: str) -> dict[str, Any]:
    obj = kit.wait_condition(namespace, name, "CapacityPlanned", "True", timeout=30)
    assert condition(obj, "Stalled")["status"] == "False"
    return obj


def test_planned_from_the_hubs_files_too_big_and_no_config_stall(
    operator: OperatorProcess, kit: Kit, namespace: str, hub: Hub
) -> None:
    for name, model in (("fits", FITS), ("big", TOO_BIG), ("bare", NO_CONFIG)):
        kit.apply_llmd(namespace, name, spec(model))

    fits = planned(kit, namespace, "fits")
    plan = fits["status"]["plan"]
    assert (plan["factsSource"], plan["factsRevision"]) == ("hub", hub.sha(FITS))
    assert plan["fits"] is True
    assert plan["kvCacheTokens"] > 100_000
    assert condition(fits, "CapacityPlanned")["reason"] == "Fits"
    wait_until(lambda: kit.deployment(namespace, "fits"), timeout=30, what="the Deployment")

    big = kit.wait_condition(namespace, "big", "Stalled", "True", timeout=30)
    stalled = condition(big, "Stalled")
    assert stalled["reason"] == "WeightsExceedMemory"
    assert big["status"]["plan"]["factsSource"] == "hub"
    assert condition(big, "CapacityPlanned")["status"] == "False"

    bare = kit.wait_condition(namespace, "bare", "Stalled", "True", timeout=30)
    refused = condition(bare, "Stalled")
    assert refused["reason"] == "ModelConfigUnsupported"
    assert "config.json: no such file" in refused["message"]
    assert "spec.model.architecture" in refused["message"]

    for name in ("big", "bare"):
        assert kit.deployment(namespace, name) is None
    assert (
        kit.kube.list("v1", "Pod", namespace, label_selector="serving.llmop.dev/deployment=big")
        == []
    )


def test_a_hub_outage_never_stalls_a_planned_cr_and_a_new_one_waits_for_it(
    operator: OperatorProcess, kit: Kit, namespace: str, hub: Hub
) -> None:
    asked = hub.asked_for(FITS)
    kit.apply_llmd(namespace, "fits", spec(FITS))
    planned(kit, namespace, "fits")
    assert hub.asked_for(FITS) == asked  # the facts read before, kept in memory

    hub.stop()
    # A new generation of the planned CR is planned again from the facts in memory.
    kit.apply_llmd(namespace, "fits", spec(FITS, replicas=2))
    scaled = planned(kit, namespace, "fits")
    assert scaled["status"]["plan"]["factsSource"] == "hub"
    wait_until(
        lambda: (kit.deployment(namespace, "fits") or {}).get("spec", {}).get("replicas") == 2,
        timeout=30,
        what="the Deployment scaled to 2",
    )

    # A CR never planned waits, not stalled, naming the model, the revision and the error.
    kit.apply_llmd(namespace, "late", spec(LATE))
    late = kit.wait_condition(namespace, "late", "Reconciling", "True", timeout=30)
    waiting = wait_until(
        lambda: (
            c
            if (c := condition(kit.get_llmd(namespace, "late") or late, "Reconciling"))["reason"]
            == "ModelFilesUnavailable"
            else None
        ),
        timeout=30,
        what="the late CR waiting for the Hub",
    )
    assert f"{LATE}@main" in waiting["message"]
    assert "the Hub did not answer" in waiting["message"]
    assert "Connect" in waiting["message"]  # the client's error, e.g. ConnectError
    now = kit.get_llmd(namespace, "late")
    assert now is not None
    assert condition(now, "Stalled")["status"] == "False"
    assert kit.deployment(namespace, "late") is None

    # Retried with backoff: planned once the Hub answers again.
    hub.start()
    again = kit.wait_condition(namespace, "late", "CapacityPlanned", "True", timeout=30)
    assert again["status"]["plan"]["factsRevision"] == hub.sha(LATE)
    wait_until(lambda: kit.deployment(namespace, "late"), timeout=30, what="the late Deployment")


def test_an_operator_restarted_during_an_outage_plans_from_the_recorded_files(
    operator: OperatorProcess, kit: Kit, namespace: str, hub: Hub
) -> None:
    """The files read are recorded in the llmop-model-files ConfigMap (through the operator's
    own RBAC), so an operator restarted while the Hub is down plans a new generation of a CR it
    planned before, instead of holding it until the Hub answers."""
    kit.apply_llmd(namespace, "kept", spec(FITS))
    planned(kit, namespace, "kept")
    record = wait_until(
        lambda: kit.kube.read("v1", "ConfigMap", operator.namespace, "llmop-model-files"),
        timeout=30,
        what="the record of model files",
    )
    entries = [json.loads(text) for text in record["data"].values()]
    assert any(e["model"] == FITS and e["commit"] == hub.sha(FITS) for e in entries)

    hub.stop()
    operator.stop()
    operator.start()
    try:
        kit.apply_llmd(namespace, "kept", spec(FITS, replicas=2))
        wait_until(
            lambda: (kit.deployment(namespace, "kept") or {}).get("spec", {}).get("replicas") == 2,
            timeout=60,
            what="the Deployment scaled to 2 by the restarted operator",
        )
        kept = planned(kit, namespace, "kept")
        assert kept["status"]["plan"]["factsRevision"] == hub.sha(FITS)
        assert kept["status"]["plan"]["factsSource"] == "hub"
        assert "planned from the files recorded" in operator.log_path.read_text(errors="replace")
    finally:
        hub.start()
