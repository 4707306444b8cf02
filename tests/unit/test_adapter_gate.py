"""The adapter pre-flight wired into the reconcile, against the in-memory API of test_reconcile
and a scripted Hub (`llmop.hub`'s two adapter calls replaced, counted): the parent pass asks
once per adapter question, leaves refused adapters out of the ConfigMap and pins accepted ones,
puts the verdicts in status.adapters, warns once about a floating revision; the child path
never puts a refused adapter back and asks nothing; an unreachable Hub refuses nothing and is
asked again by a later parent pass (30 s on, or a new generation); a deleted parent is
forgotten."""

from __future__ import annotations

import base64
import copy
import json
from datetime import timedelta
from typing import Any

import pytest
from test_reconcile import NOW, FakeKube, parent, run_parent
from test_reconcile import deliver as deliver_named

from llmop import adapter_preflight as ap
from llmop import hub, kinds, names, reconcile
from llmop.config import OperatorConfig
from llmop.metrics import Metrics
from llmop.preflight import HubFailure
from llmop.render.adapters import adapters_revision, lora_restart_message, started_lora_flags
from support.passes import event_pass, event_quiet

SHA = "0123456789abcdef0123456789abcdef01234567"
LORA: dict[str, Any] = {
    "peft_type": "LORA",
    "r": 16,
    "target_modules": ["q_proj", "v_proj"],
    "bias": "none",
}
FILES = ("adapter_config.json", "adapter_model.safetensors")
SQL = {"name": "sql", "source": "hf://acme/sql-lora", "revision": "main"}
BIG = {"name": "big", "source": "hf://acme/big-lora", "revision": SHA}
LOCAL = {"name": "local", "source": "pvc://models/loras/local"}


class ScriptedHub:
    """The Hub's answers by repo (an answer or a config to wrap), and every question asked."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.answers: dict[str, ap.AdapterAnswer] = {
            "acme/sql-lora": self.facts(LORA),
            "acme/big-lora": self.facts(LORA | {"r": 128}),
        }
        self.model_type: str | HubFailure | None = "qwen2"
        self.asked: list[tuple[str, str | None, str | None]] = []
        self.bases: list[str] = []
        monkeypatch.setattr(hub, "adapter_probe", self.adapter_probe)
        monkeypatch.setattr(hub, "model_type", self.base_type)

    @staticmethod
    def facts(config: dict[str, Any]) -> ap.AdapterFacts:
        return ap.AdapterFacts(sha=SHA, files=FILES, adapter_config=json.dumps(config))

    def adapter_probe(
        self, repo: str, revision: str | None, *, token: str | None, endpoint: str | None
    ) -> ap.AdapterAnswer:
        self.asked.append((repo, revision, token))
        return self.answers[repo]

    def base_type(
        self, repo: str, revision: str | None, *, token: str | None, endpoint: str | None
    ) -> str | HubFailure | None:
        self.bases.append(repo)
        return self.model_type


@pytest.fixture
def kube() -> FakeKube:
    return FakeKube()


@pytest.fixture
def ctx(kube: FakeKube) -> reconcile.Context:
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


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> ScriptedHub:
    return ScriptedHub(monkeypatch)


def deliver(ctx: reconcile.Context, kube: FakeKube) -> None:
    """test_reconcile's caches, with the ConfigMap under its parent's name as the real index
    keys it (test_reconcile's keys every child by its own name)."""
    deliver_named(ctx, kube)
    cache = dict(ctx.children[kinds.CONFIG_MAP])
    for (namespace, name), objects in list(cache.items()):
        cache[namespace, name.removesuffix(kinds.CONFIG_MAP.name_suffix)] = objects
    ctx.children[kinds.CONFIG_MAP] = cache


def listed(kube: FakeKube) -> list[tuple[str, str | None]]:
    config_map = kube.objects["ConfigMap", "ns", "x-adapters"]
    entries = json.loads(config_map["data"]["adapters.json"])["adapters"]
    return [(e["name"], e["revision"]) for e in entries]


def adapters(kube: FakeKube) -> dict[str, dict[str, Any]]:
    status = kube.objects["LLMDeployment", "ns", "x"]["status"]
    return {a["name"]: a for a in status["adapters"]}


def events(kube: FakeKube, reason: str) -> int:
    return sum(1 for c in kube.calls if c[0] == "event" and c[1] == reason)


def edit(kube: FakeKube, **spec: Any) -> None:
    body = kube.objects["LLMDeployment", "ns", "x"]
    body["spec"] |= spec
    body["metadata"]["generation"] += 1


def test_parent_pass_refuses_pins_reports_and_warns_once(
    ctx: reconcile.Context, kube: FakeKube, scripted: ScriptedHub
) -> None:
    kube.put(parent(adapters=[SQL, BIG]))
    assert run_parent(ctx, kube) == "ok"  # a refused adapter never stalls the base
    assert scripted.asked == [("acme/sql-lora", "main", None), ("acme/big-lora", SHA, None)]
    assert scripted.bases == ["Qwen/Qwen2.5-0.5B-Instruct"]
    # big (rank 128 > the default 64) never reaches the pods; sql goes pinned to its commit.
    assert listed(kube) == [("sql", SHA)]
    status = adapters(kube)
    assert status["big"]["phase"] == "Failed"
    assert status["big"]["message"].startswith("AdapterRankTooHigh: spec.adapters[big]: rank 128")
    assert (status["sql"]["phase"], status["sql"]["revision"], status["sql"]["rank"]) == (
        "Pending",
        SHA,
        16,
    )
    assert events(kube, "FloatingRevision") == 1  # sql's "main"; big is pinned

    # The same generation again, and a second pass: no new question, no second warning.
    deliver(ctx, kube)
    kube.calls.clear()
    run_parent(ctx, kube)
    assert len(scripted.asked) == 2
    assert events(kube, "FloatingRevision") == 0
    assert not [c for c in kube.calls if c[0].startswith("apply") and c[1] == "ConfigMap"]


def test_child_path_never_puts_a_refused_adapter_back(
    ctx: reconcile.Context, kube: FakeKube, scripted: ScriptedHub
) -> None:
    kube.put(parent(adapters=[SQL, BIG]))
    run_parent(ctx, kube)
    deliver(ctx, kube)
    config_map = kube.objects["ConfigMap", "ns", "x-adapters"]
    # The watch event of our own apply: no drift against what the parent path applied.
    kube.calls.clear()
    assert event_quiet(ctx, "MODIFIED", copy.deepcopy(config_map))
    # Someone edits it: the repair restores the parent path's version, without asking the Hub.
    config_map["data"] = {"adapters.json": '{"adapters": []}'}
    deliver(ctx, kube)
    kube.calls.clear()
    event_pass(ctx, "MODIFIED", copy.deepcopy(config_map))
    assert ("apply:llmop", "ConfigMap", "x-adapters") in kube.calls
    assert listed(kube) == [("sql", SHA)]
    assert len(scripted.asked) == 2


def test_new_generation_rejudges_without_asking_unless_the_question_changed(
    ctx: reconcile.Context, kube: FakeKube, scripted: ScriptedHub
) -> None:
    kube.put(parent(adapters=[SQL, BIG, LOCAL], model={"name": "pvc://models/qwen"}))
    run_parent(ctx, kube)
    assert scripted.bases == []  # a pvc:// base: no model_type to ask, modules unchecked
    assert listed(kube) == [("sql", SHA), ("local", None)]
    # A larger cap: big is judged again from the kept answer.
    edit(kube, engine={"backend": "simulator", "lora": {"maxLoraRank": 128}})
    run_parent(ctx, kube)
    assert len(scripted.asked) == 2
    assert listed(kube) == [("sql", SHA), ("big", SHA), ("local", None)]
    # A new revision is a new question; the unchanged adapter is not asked again.
    edit(kube, adapters=[SQL | {"revision": "v2"}, BIG, LOCAL])
    run_parent(ctx, kube)
    assert scripted.asked[2:] == [("acme/sql-lora", "v2", None)]


def test_a_refusal_is_asked_again_on_a_new_generation_with_the_models_token(
    ctx: reconcile.Context, kube: FakeKube, scripted: ScriptedHub
) -> None:
    scripted.answers["acme/sql-lora"] = HubFailure("access_denied", "403")
    kube.put(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "hf", "namespace": "ns"},
            "data": {"token": base64.b64encode(b"hf_abc\n").decode()},
        }
    )
    model = {"name": "Qwen/Qwen2.5-0.5B-Instruct", "tokenSecretRef": {"name": "hf", "key": "token"}}
    kube.put(parent(adapters=[SQL], model=model))
    run_parent(ctx, kube)
    assert scripted.asked == [("acme/sql-lora", "main", "hf_abc")]
    assert listed(kube) == []
    assert "Secret hf/token has no access" in adapters(kube)["sql"]["message"]
    run_parent(ctx, kube)  # same generation: the refusal stands, nothing asked
    assert len(scripted.asked) == 1
    # Access granted on the Hub, then any spec edit: asked again, and accepted.
    scripted.answers["acme/sql-lora"] = ScriptedHub.facts(LORA)
    edit(kube, replicas=2)
    run_parent(ctx, kube)
    assert len(scripted.asked) == 2
    assert listed(kube) == [("sql", SHA)]


def test_an_unreachable_hub_refuses_nothing_and_is_asked_on_the_next_parent_pass(
    ctx: reconcile.Context, kube: FakeKube, scripted: ScriptedHub
) -> None:
    scripted.answers["acme/sql-lora"] = HubFailure("unreachable", "timed out")
    kube.put(parent(adapters=[SQL, BIG]))
    assert run_parent(ctx, kube) == "ok"
    # The first unreachable answer stops the pass: big is not even asked.
    assert scripted.asked == [("acme/sql-lora", "main", None)]
    assert listed(kube) == [("sql", "main"), ("big", SHA)]  # as declared, unpinned
    assert {a["phase"] for a in adapters(kube).values()} == {"Pending"}
    scripted.answers["acme/sql-lora"] = ScriptedHub.facts(LORA)
    # A pass right after (a download's progress poll) waits on no Hub; one 30 s later asks.
    run_parent(ctx, kube)
    assert len(scripted.asked) == 1
    ctx.clock = lambda: NOW + timedelta(seconds=30)
    run_parent(ctx, kube)
    assert scripted.asked[1:] == [("acme/sql-lora", "main", None), ("acme/big-lora", SHA, None)]
    assert listed(kube) == [("sql", SHA)]
    # A new generation asks at once, whatever the clock (here: an outage again, then a fix).
    scripted.answers["acme/big-lora"] = HubFailure("unreachable", "reset")
    edit(kube, adapters=[SQL, BIG | {"revision": "main"}])
    run_parent(ctx, kube)
    scripted.answers["acme/big-lora"] = ScriptedHub.facts(LORA)
    edit(kube, replicas=2)
    run_parent(ctx, kube)
    assert scripted.asked[3:] == [("acme/big-lora", "main", None)] * 2
    assert listed(kube) == [("sql", SHA), ("big", SHA)]


def test_unknown_target_modules_only_for_a_known_base(
    ctx: reconcile.Context, kube: FakeKube, scripted: ScriptedHub
) -> None:
    scripted.answers["acme/sql-lora"] = ScriptedHub.facts(LORA | {"target_modules": ["c_attn"]})
    scripted.model_type = None  # a base whose config.json names no model_type
    kube.put(parent(adapters=[SQL]))
    run_parent(ctx, kube)
    assert listed(kube) == [("sql", SHA)]
    scripted.model_type = "qwen2"
    edit(kube, model={"name": "Qwen/Qwen2.5-1.5B-Instruct"})  # a new base: asked again
    run_parent(ctx, kube)
    assert scripted.bases == ["Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct"]
    assert listed(kube) == []
    assert adapters(kube)["sql"]["message"].startswith("AdapterUnknownTargetModules")


def test_no_hub_adapters_ask_nothing_and_deletion_forgets(
    ctx: reconcile.Context, kube: FakeKube, scripted: ScriptedHub
) -> None:
    kube.put(parent(adapters=[LOCAL], model={"name": "pvc://models/qwen"}))
    run_parent(ctx, kube)
    assert scripted.asked == []
    assert ctx.recall(("ns", "x")).adapter_gates is None
    edit(kube, adapters=[SQL])
    run_parent(ctx, kube)
    assert ctx.recall(("ns", "x")).adapter_gates is not None
    ctx.forget("ns", "x")
    assert ctx.recall(("ns", "x")).adapter_gates is None


def test_an_accepted_adapter_keeps_its_commit_across_generations_a_refused_one_is_asked_again(
    ctx: reconcile.Context, kube: FakeKube, scripted: ScriptedHub
) -> None:
    scripted.answers["acme/sql-lora"] = ScriptedHub.facts(LORA | {"use_dora": True})
    kube.put(parent(adapters=[SQL]))
    run_parent(ctx, kube)
    assert adapters(kube)["sql"]["message"].startswith("AdapterDoRA")
    # The branch is fixed on the Hub at a new commit; the next generation asks again.
    newer = "f" * 40
    scripted.answers["acme/sql-lora"] = ap.AdapterFacts(
        newer, FILES, adapter_config=json.dumps(LORA)
    )
    edit(kube, replicas=2)
    run_parent(ctx, kube)
    assert listed(kube) == [("sql", newer)]
    assert events(kube, "FloatingRevision") == 1
    # Accepted now: a later generation keeps the commit even if the branch moves again.
    scripted.answers["acme/sql-lora"] = ScriptedHub.facts(LORA)
    edit(kube, replicas=3)
    run_parent(ctx, kube)
    assert len(scripted.asked) == 2
    assert listed(kube) == [("sql", newer)]


def engine_pod(name: str, revision: str | None = None, **metadata: Any) -> dict[str, Any]:
    """A pod as the watch cache summarises it (`llmop.pods.pod_summary`)."""
    annotations = {} if revision is None else {names.ANNOTATION_ADAPTERS_REVISION: revision}
    return {
        "metadata": {"name": name, "namespace": "ns", "annotations": annotations, **metadata},
        "status": {"phase": "Running"},
    }


def annotated(kube: FakeKube) -> dict[str, str | None]:
    return {
        c[2]: c[3][names.ANNOTATION_ADAPTERS_REVISION]
        for c in kube.calls
        if c[0] == "annotate" and c[1] == "Pod"
    }


def test_a_changed_adapter_set_is_written_on_the_running_pods_once(
    ctx: reconcile.Context, kube: FakeKube, scripted: ScriptedHub
) -> None:
    kube.put(parent(adapters=[SQL]))
    run_parent(ctx, kube)
    first = adapters_revision(kube.objects["ConfigMap", "ns", "x-adapters"])
    # Pods that mounted an older set (or none said), one that has this one, one going away.
    ctx.pods = {
        ("ns", "x"): [
            engine_pod("x-old", "0000000000000000"),
            engine_pod("x-new", first),
            engine_pod("x-gone", "0000000000000000", deletionTimestamp="2026-11-28T00:00:00Z"),
        ]
    }
    edit(kube, adapters=[SQL, {"name": "sql2", "source": "hf://acme/sql-lora", "revision": SHA}])
    deliver(ctx, kube)
    kube.calls.clear()
    run_parent(ctx, kube)
    second = adapters_revision(kube.objects["ConfigMap", "ns", "x-adapters"])
    assert second != first
    # Every live pod learns the new set (the annotation change makes its kubelet sync it).
    assert annotated(kube) == {"x-old": second, "x-new": second}

    # The cache shows them written: the same generation again writes no pod.
    ctx.pods = {("ns", "x"): [engine_pod("x-old", second), engine_pod("x-new", second)]}
    deliver(ctx, kube)
    kube.calls.clear()
    run_parent(ctx, kube)
    assert annotated(kube) == {}

    # A new generation that leaves the set as it is writes no pod either.
    edit(kube, replicas=3)
    deliver(ctx, kube)
    kube.calls.clear()
    run_parent(ctx, kube)
    assert annotated(kube) == {}


def test_the_child_path_repair_tells_every_pod_again(
    ctx: reconcile.Context, kube: FakeKube, scripted: ScriptedHub
) -> None:
    kube.put(parent(adapters=[SQL]))
    run_parent(ctx, kube)
    config_map = kube.objects["ConfigMap", "ns", "x-adapters"]
    revision = adapters_revision(config_map)
    # Someone edited the ConfigMap: the repair puts the set back and tells every pod, also the
    # one that already names the revision (its kubelet may have delivered the edit).
    ctx.pods = {("ns", "x"): [engine_pod("x-a", revision), engine_pod("x-b")]}
    config_map["data"] = {"adapters.json": '{"adapters": []}'}
    config_map["metadata"]["resourceVersion"] = "777"
    deliver(ctx, kube)
    kube.calls.clear()
    event_pass(ctx, "MODIFIED", copy.deepcopy(config_map))
    assert ("apply:llmop", "ConfigMap", "x-adapters") in kube.calls
    assert annotated(kube) == {"x-a": f"{revision}.777", "x-b": f"{revision}.777"}

    # A parent pass afterwards leaves them alone: they name the revision.
    ctx.pods = {("ns", "x"): [engine_pod("x-a", f"{revision}.777"), engine_pod("x-b", revision)]}
    deliver(ctx, kube)
    kube.calls.clear()
    edit(kube, replicas=3)
    deliver(ctx, kube)
    run_parent(ctx, kube)
    assert annotated(kube) == {}

    # A second edit is a second nudge, even for pods the first one wrote.
    config_map = kube.objects["ConfigMap", "ns", "x-adapters"]
    config_map["data"] = {"adapters.json": '{"adapters": []}'}
    config_map["metadata"]["resourceVersion"] = "901"
    deliver(ctx, kube)
    kube.calls.clear()
    event_pass(ctx, "MODIFIED", copy.deepcopy(config_map))
    assert annotated(kube) == {"x-a": f"{revision}.901", "x-b": f"{revision}.901"}


def lora_rollouts(kube: FakeKube) -> int:
    return events(kube, "LoRARollout")


def test_turning_lora_on_posts_one_event_saying_every_replica_restarts(
    ctx: reconcile.Context, kube: FakeKube, scripted: ScriptedHub
) -> None:
    kube.put(parent())
    run_parent(ctx, kube)
    assert lora_rollouts(kube) == 0  # a new CR: no replica to restart
    # The first adapter turns LoRA on: the template gains --enable-lora, a drained rollout.
    edit(kube, adapters=[SQL])
    deliver(ctx, kube)
    kube.calls.clear()
    run_parent(ctx, kube)
    assert lora_rollouts(kube) == 1
    # The same generation again, and a second adapter: no template change, no Event.
    deliver(ctx, kube)
    run_parent(ctx, kube)
    edit(kube, adapters=[SQL, {"name": "sql2", "source": "hf://acme/sql-lora", "revision": SHA}])
    deliver(ctx, kube)
    kube.calls.clear()
    run_parent(ctx, kube)
    assert lora_rollouts(kube) == 0
    # New slot values are a restart too.
    edit(kube, engine={"backend": "simulator", "lora": {"maxLoras": 8}})
    deliver(ctx, kube)
    kube.calls.clear()
    run_parent(ctx, kube)
    assert lora_rollouts(kube) == 1


def test_lora_restart_messages_name_the_cause_and_the_fix() -> None:
    on = ("--enable-lora", "--max-loras", "4", "--max-cpu-loras", "16", "--max-lora-rank", "64")
    more = ("--enable-lora", "--max-loras", "8", "--max-cpu-loras", "16", "--max-lora-rank", "64")
    assert lora_restart_message(on, on) is None
    assert lora_restart_message((), ()) is None
    turned_on = lora_restart_message((), on)
    assert turned_on is not None
    assert "every replica restarts" in turned_on
    assert "Set spec.engine.lora when creating" in turned_on
    turned_off = lora_restart_message(on, ())
    assert turned_off is not None
    assert "Keep spec.engine.lora" in turned_off
    slots = lora_restart_message(on, more)
    assert slots is not None
    assert "--max-loras 8" in slots


def test_started_lora_flags_reads_a_deployments_engine_args() -> None:
    deployment = {
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {"args": ["run", "--", "m", "--enable-lora", "--max-loras", "4", "--x"]}
                    ]
                }
            }
        }
    }
    assert started_lora_flags(deployment) == ("--enable-lora", "--max-loras", "4")
    assert started_lora_flags(None) == ()
    assert started_lora_flags({"spec": {}}) == ()


def test_the_hub_check_asks_again_30_s_after_an_outage_with_no_event(
    ctx: reconcile.Context, kube: FakeKube, scripted: ScriptedHub
) -> None:
    """Nothing but `llmop.hub_check` runs the parent pass that asks again: no spec change, no
    child event. Before 30 s it runs none; after, one per waiting parent, then none."""
    from llmop import hub_check

    scripted.answers["acme/sql-lora"] = HubFailure("unreachable", "connection refused")
    kube.put(parent(adapters=[SQL]))
    run_parent(ctx, kube)
    assert listed(kube) == [("sql", "main")]  # as declared, unjudged
    deliver(ctx, kube)
    ctx.clock = lambda: NOW + timedelta(seconds=29)
    assert hub_check.check(ctx) == 0
    assert len(scripted.asked) == 1
    scripted.answers["acme/sql-lora"] = ScriptedHub.facts(LORA)  # the Hub is back
    ctx.clock = lambda: NOW + timedelta(seconds=30)
    assert hub_check.check(ctx) == 1
    assert scripted.asked[1:] == [("acme/sql-lora", "main", None)]
    assert listed(kube) == [("sql", SHA)]  # pinned now
    deliver(ctx, kube)
    ctx.clock = lambda: NOW + timedelta(seconds=120)
    assert hub_check.check(ctx) == 0  # answered: nothing waits
