"""LoRA adapters through the operator, against the real API server and under deploy/rbac.yaml:
the `<name>-adapters` ConfigMap carries the desired set and adding an adapter changes it and
nothing in the pod template (no rollout); status.adapters, the Adapters column, AdaptersReady
and the adapter Events come from the agents' reports (stand-in agents on loopback addresses, in
the real agent's `/status` shape); a rank the slots cannot hold fails that adapter while the base
stays Ready; an adapter on a claim the pods do not mount is refused by the operator and never
reaches the pods, nor does one the Hub pre-flight refuses (a hub stand-in serves the adapter
repos: rank above the slots); turning LoRA off deletes the ConfigMap."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from integration.test_operator_agents import conds, engine_pods, loopback_hosts, point_at
from support.cluster import wait_until
from support.hub_standin import HubRepo, HubStandin, synthetic_adapter
from support.manifests import simulator_spec as spec
from support.operator import OperatorProcess
from support.standin_agents import standin_agents

if TYPE_CHECKING:
    from support.operator import Kit

pytestmark = pytest.mark.cluster

NAME = "loras"
CHAT = {"name": "chat", "source": "hf://acme/chat-lora"}
BIG = {"name": "big", "source": "hf://acme/big-lora"}
ELSEWHERE = {"name": "far", "source": "pvc://other-claim/loras/far"}
RANK_ERROR = (
    "Call to add_lora method failed: Worker failed with error 'LoRA rank 64 is greater than "
    "max_lora_rank 16.', please check the stack trace above for the root cause"
)


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubStandin]:
    root = tmp_path_factory.mktemp("adapters")
    repos = [
        HubRepo("acme/sql-lora", synthetic_adapter(root / "sql", r=8)),
        HubRepo("acme/chat-lora", synthetic_adapter(root / "chat", r=16, seed=1)),
        HubRepo("acme/big-lora", synthetic_adapter(root / "big", r=64, seed=2)),
    ]
    with HubStandin(repos) as standin:
        yield standin


@pytest.fixture(scope="module")
def operator(
    operator_kubeconfig: Path, hub: HubStandin, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    process = OperatorProcess(
        operator_kubeconfig,
        tmp_path_factory.mktemp("operator-log") / "operator.log",
        extra_env={"LLMOP_HUB_ENDPOINT": hub.url},
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LLMOP_AGENT_READ_INTERVAL_SECONDS", "1")
        process.start()
    try:
        yield process
    finally:
        process.stop()


def desired_names(kit: Kit, namespace: str) -> list[str] | None:
    cm = kit.get("v1", "ConfigMap", namespace, f"{NAME}-adapters")
    if cm is None:
        return None
    return [a["name"] for a in json.loads(cm["data"]["adapters.json"])["adapters"]]


def adapters_of(kit: Kit, namespace: str) -> dict[str, dict[str, Any]]:
    status = (kit.get_llmd(namespace, NAME) or {}).get("status") or {}
    return {a["name"]: a for a in status.get("adapters") or []}


def reported(*phases: tuple[str, str, str | None]) -> list[dict[str, Any]]:
    return [
        {"name": n, "phase": p, "message": m, "revision": None, "rank": 8} for n, p, m in phases
    ]


def test_adapters_reach_the_pods_without_a_rollout_and_report_per_adapter(  # noqa: PLR0915
    operator: OperatorProcess, kit: Kit, namespace: str, hub: HubStandin
) -> None:
    sha = hub.repos["acme/sql-lora"].sha
    sql = {"name": "sql", "source": "hf://acme/sql-lora", "revision": sha}
    lora = {"maxLoras": 2, "maxCpuLoras": 4, "maxLoraRank": 16}
    base = spec(replicas=2, engine={"backend": "simulator", "lora": lora})
    kit.apply_llmd(namespace, NAME, base | {"adapters": [sql, ELSEWHERE, BIG]})
    kit.wait_condition(namespace, NAME, "Ready", "True", timeout=60)
    # The refused adapters never reach the pods: an unmounted claim, a rank above the slots.
    wait_until(lambda: desired_names(kit, namespace) == ["sql"], timeout=30, what="the ConfigMap")
    cm = kit.get("v1", "ConfigMap", namespace, f"{NAME}-adapters")
    assert cm is not None
    entry = json.loads(cm["data"]["adapters.json"])["adapters"][0]
    assert entry == {"name": "sql", "repo": "acme/sql-lora", "revision": sha, "path": None}
    big = wait_until(
        lambda: (
            adapters_of(kit, namespace).get("big", {}).get("phase") == "Failed"
            and adapters_of(kit, namespace)["big"]
        ),
        timeout=30,
        what="the pre-flight's refusal",
    )
    assert big["message"].startswith("AdapterRankTooHigh: ")
    assert "spec.engine.lora.maxLoraRank" in big["message"]
    assert "64" in big["message"]
    deployment = kit.deployment(namespace, NAME)
    assert deployment is not None
    pod = deployment["spec"]["template"]["spec"]
    assert "--enable-lora" in pod["containers"][0]["args"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["adapters"]["configMap"]["name"] == f"{NAME}-adapters"
    generation = deployment["metadata"]["generation"]
    far = wait_until(
        lambda: (
            adapters_of(kit, namespace).get("far", {}).get("phase") == "Failed"
            and adapters_of(kit, namespace)
        ),
        timeout=30,
        what="the refused adapter's status",
    )["far"]
    assert far["message"].startswith("AdapterClaimNotMounted: ")
    assert "'other-claim'" in far["message"]

    # Adding an adapter edits the ConfigMap only: the Deployment is not touched.
    kit.apply_llmd(namespace, NAME, base | {"adapters": [sql, CHAT]})
    wait_until(
        lambda: desired_names(kit, namespace) == ["sql", "chat"], timeout=30, what="chat added"
    )
    kit.wait_condition(namespace, NAME, "Ready", "True", timeout=30)
    deployment = kit.deployment(namespace, NAME)
    assert deployment is not None
    assert deployment["metadata"]["generation"] == generation

    pods = engine_pods(kit, namespace, NAME)
    assert len(pods) == 2
    with standin_agents(loopback_hosts(2)) as agents:
        for agent in agents:
            agent.status["adapters"] = reported(("sql", "Loaded", None), ("chat", "Loading", None))
        for pod_obj, agent in zip(pods, agents, strict=True):
            point_at(kit, pod_obj, agent)

        def phases() -> dict[str, str]:
            return {n: a["phase"] for n, a in adapters_of(kit, namespace).items()}

        wait_until(
            lambda: phases() == {"sql": "Ready", "chat": "Loading"}, timeout=30, what="loading"
        )
        obj = kit.get_llmd(namespace, NAME)
        assert obj is not None
        assert obj["status"]["adaptersSummary"] == "1/2"
        assert conds(obj)["AdaptersReady"]["reason"] == "AdaptersLoading"
        sql_status = obj["status"]["adapters"][0]
        assert (sql_status["readyReplicas"], sql_status["replicas"], sql_status["rank"]) == (
            2,
            2,
            8,
        )
        assert sql_status["revision"] == sha

        for agent in agents:
            agent.status["adapters"] = reported(("sql", "Loaded", None), ("chat", "Loaded", None))
        wait_until(lambda: phases() == {"sql": "Ready", "chat": "Ready"}, timeout=30, what="ready")
        obj = kit.wait_condition(namespace, NAME, "AdaptersReady", "True", timeout=30)
        assert obj["status"]["adaptersSummary"] == "2/2"
        table = kit.cluster.kubectl("get", "llmd", NAME, "-n", namespace).stdout
        assert "ADAPTERS" in table
        assert "2/2" in table

        # A rank the slots cannot hold fails that adapter, not the base model.
        agents[1].status["adapters"] = reported(
            ("sql", "Loaded", None), ("chat", "Failed", RANK_ERROR)
        )
        wait_until(lambda: phases().get("chat") == "Degraded", timeout=30, what="degraded")
        obj = kit.wait_condition(namespace, NAME, "AdaptersReady", "False", timeout=30)
        assert conds(obj)["AdaptersReady"]["reason"] == "AdapterRankTooHigh"
        assert "spec.engine.lora.maxLoraRank (16)" in conds(obj)["AdaptersReady"]["message"]
        assert conds(obj)["Ready"]["status"] == "True"

        def adapter_events() -> list[tuple[str, str]]:
            return sorted(
                (e["type"], e["reason"])
                for e in kit.kube.list("v1", "Event", namespace)
                if e["involvedObject"]["name"] == NAME and e["reason"].startswith("Adapter")
            )

        wanted = {("Normal", "AdapterReady"), ("Warning", "AdapterDegraded")}
        wait_until(lambda: wanted <= set(adapter_events()), timeout=15, what="adapter events")

    # LoRA off: the ConfigMap goes, and the template loses the flags (a rollout).
    kit.apply_llmd(namespace, NAME, spec(replicas=2))
    wait_until(lambda: desired_names(kit, namespace) is None, timeout=30, what="ConfigMap deleted")
    obj = kit.wait_condition(namespace, NAME, "Ready", "True", timeout=60)
    assert "adapters" not in obj["status"]
    assert "AdaptersReady" not in conds(obj)
    deployment = kit.deployment(namespace, NAME)
    assert deployment is not None
    assert "--enable-lora" not in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
