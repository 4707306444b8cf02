"""LoRA adapters in the rendered children: only start flags in the pod template (so an adapter
change restarts nothing), the desired set in the `<name>-adapters` ConfigMap, and where each
adapter's files are inside a pod."""

from __future__ import annotations

import json
from typing import Any

from llmop import kinds
from llmop.api.v1alpha1 import LLMDeployment
from llmop.desired import desired_state
from llmop.plan import plan_children
from llmop.render import RenderSettings, render_children
from llmop.render import adapters as render_adapters
from llmop_engine import contract
from llmop_engine.agent_settings import parse_run_args

SETTINGS = RenderSettings()
SQL = {"name": "sql", "source": "hf://acme/sql-lora", "revision": "a" * 40}
CHAT = {"name": "chat", "source": "hf://acme/chat-lora"}


def deployment(name: str = "llama", **spec: Any) -> LLMDeployment:
    body = {
        "metadata": {"name": name, "namespace": "team", "generation": 1, "uid": "u"},
        "spec": {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, **spec},
    }
    return LLMDeployment.model_validate(body)


def template(**spec: Any) -> dict[str, Any]:
    children = render_children(deployment(**spec), SETTINGS, load_timeout_seconds=900)
    out: dict[str, Any] = children.workload["spec"]["template"]
    return out


def engine(**spec: Any) -> dict[str, Any]:
    out: dict[str, Any] = template(**spec)["spec"]["containers"][0]
    return out


def env(**spec: Any) -> dict[str, Any]:
    return {v["name"]: v.get("value", v.get("valueFrom")) for v in engine(**spec)["env"]}


def config_map(**spec: Any) -> dict[str, Any] | None:
    return render_children(deployment(**spec), SETTINGS, load_timeout_seconds=900).adapters


def test_no_lora_no_flags_no_configmap_no_volume() -> None:
    container = engine()
    assert contract.EngineFlag.ENABLE_LORA not in container["args"]
    assert contract.LORA_RUNTIME_ENV not in env()
    assert all(v["name"] != render_adapters.ADAPTERS_VOLUME for v in template()["spec"]["volumes"])
    assert config_map() is None


def test_adapters_imply_lora_with_the_default_slots() -> None:
    args = engine(adapters=[SQL])["args"]
    i = args.index(contract.EngineFlag.ENABLE_LORA)
    assert args[i : i + 7] == [
        "--enable-lora", "--max-loras", "4", "--max-cpu-loras", "16", "--max-lora-rank", "64"
    ]  # fmt: skip
    variables = env(adapters=[SQL])
    assert variables[contract.LORA_RUNTIME_ENV] == "True"
    assert variables["LLMOP_ADAPTERS_DIR"] == contract.ADAPTERS_DIR
    assert variables["LLMOP_ADAPTER_STORE"] == "/models/cache/llmop-adapters"


def test_the_agent_reads_the_rendered_adapter_settings_back() -> None:
    container = engine(adapters=[SQL])
    environ = {v["name"]: v["value"] for v in container["env"] if "value" in v}
    settings = parse_run_args(container["args"][1:], environ)  # after the `run` subcommand
    assert settings.adapters_dir == contract.ADAPTERS_DIR
    assert settings.adapter_store == "/models/cache/llmop-adapters"
    assert "--enable-lora" in settings.engine_args


def test_explicit_slots_are_rendered_as_set() -> None:
    lora = {"maxLoras": 2, "maxCpuLoras": 8, "maxLoraRank": 16}
    args = engine(engine={"lora": lora})["args"]
    i = args.index("--enable-lora")
    assert args[i : i + 7] == [
        "--enable-lora", "--max-loras", "2", "--max-cpu-loras", "8", "--max-lora-rank", "16"
    ]  # fmt: skip


def test_adding_or_removing_an_adapter_never_changes_the_pod_template() -> None:
    lora = {"maxLoras": 2}
    before = template(engine={"lora": lora})
    one = template(engine={"lora": lora}, adapters=[SQL])
    two = template(engine={"lora": lora}, adapters=[SQL, CHAT])
    assert before == one == two
    # Also without spec.engine.lora, between non-empty adapter lists.
    assert template(adapters=[SQL]) == template(adapters=[SQL, CHAT]) == template(adapters=[CHAT])


def test_turning_lora_on_is_a_template_change() -> None:
    assert template() != template(adapters=[SQL])


def test_configmap_is_mounted_as_a_directory_and_applied_before_the_workload() -> None:
    pod = template(adapters=[SQL])["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == render_adapters.ADAPTERS_VOLUME)
    assert volume == {"name": "adapters", "configMap": {"name": "llama-adapters"}}
    mount = next(
        m
        for m in pod["containers"][0]["volumeMounts"]
        if m["name"] == render_adapters.ADAPTERS_VOLUME
    )
    assert mount == {"name": "adapters", "mountPath": contract.ADAPTERS_DIR, "readOnly": True}
    assert "subPath" not in mount  # the kubelet only updates whole-directory mounts
    order = [kind.kind for kind in kinds.CHILDREN]
    assert order.index("ConfigMap") < order.index("Deployment")


def test_configmap_lists_the_desired_adapters_in_the_agents_format() -> None:
    cm = config_map(
        model={"name": "pvc://weights/llama"},
        adapters=[SQL, {"name": "b", "source": "pvc://weights/x/b/"}],
    )
    assert cm is not None
    assert cm["metadata"]["name"] == "llama-adapters"
    assert cm["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "llmop"
    payload = json.loads(cm["data"][contract.ADAPTERS_FILE])
    assert payload == {
        "adapters": [
            {"name": "sql", "repo": "acme/sql-lora", "revision": "a" * 40, "path": None},
            {"name": "b", "repo": None, "revision": None, "path": "/models/pvc/weights/x/b"},
        ]
    }


def test_lora_without_adapters_still_has_an_empty_configmap() -> None:
    cm = config_map(engine={"lora": {}})
    assert cm is not None
    assert json.loads(cm["data"]["adapters.json"]) == {"adapters": []}


def test_pvc_adapter_on_the_model_cache_claim_is_under_the_cache_mount() -> None:
    llmd = deployment(
        model={"name": "acme/m", "cache": {"existingClaim": "shared"}},
        adapters=[{"name": "x", "source": "pvc://shared/loras/x"}],
    )
    assert render_adapters.pod_path(llmd, llmd.spec.adapters[0]) == "/models/cache/loras/x"


def test_pvc_adapter_on_a_claim_the_pods_do_not_mount_is_refused_by_name() -> None:
    llmd = deployment(
        model={"name": "acme/m", "cache": {"size": "10Gi"}},
        adapters=[SQL, {"name": "x", "source": "pvc://elsewhere/x"}],
    )
    refused = render_adapters.refusals(llmd)
    assert list(refused) == ["x"]
    assert refused["x"].reason == "AdapterClaimNotMounted"
    assert "'elsewhere'" in refused["x"].message
    assert "'llama-model-cache'" in refused["x"].message
    names = [e["name"] for e in render_adapters.desired_entries(llmd)]
    assert names == ["sql"]


def test_gated_hub_adapters_get_the_token_also_with_a_model_cache() -> None:
    token = {"name": "hf", "key": "token"}
    cached = {"name": "acme/m", "cache": {"size": "10Gi"}, "tokenSecretRef": token}
    assert "HF_TOKEN_PATH" not in env(model=cached)
    assert not any(v["name"] == "hf-token" for v in engine_volumes(model=cached))
    # A mounted file that huggingface_hub (the agent's adapter fetch) reads, never a variable.
    assert env(model=cached, adapters=[SQL])["HF_TOKEN_PATH"] == (
        "/var/run/secrets/llmop/hf-token/token"
    )
    assert "HF_TOKEN" not in env(model=cached, adapters=[SQL])
    volume = next(
        v for v in engine_volumes(model=cached, adapters=[SQL]) if v["name"] == "hf-token"
    )
    assert volume["secret"]["secretName"] == "hf"
    # Given with LoRA on, before any Hub adapter: adding the first one is no template change.
    lora = {"engine": {"lora": {}}}
    assert "HF_TOKEN_PATH" in env(model=cached, **lora)


def engine_volumes(**spec: Any) -> list[dict[str, Any]]:
    children = render_children(deployment(**spec), SETTINGS, load_timeout_seconds=900)
    assert children.deployment is not None
    volumes: list[dict[str, Any]] = children.deployment["spec"]["template"]["spec"]["volumes"]
    return volumes


def test_the_operators_hub_endpoint_reaches_the_agent_while_lora_is_on() -> None:
    settings = RenderSettings(hub_endpoint="http://hub.internal:8080")

    def variables(**spec: Any) -> dict[str, Any]:
        llmd = deployment(**spec)
        children = render_children(llmd, settings, load_timeout_seconds=900)
        container = children.workload["spec"]["template"]["spec"]["containers"][0]
        return {v["name"]: v.get("value") for v in container["env"]}

    assert "HF_ENDPOINT" not in variables()
    assert variables(engine={"lora": {}})["HF_ENDPOINT"] == "http://hub.internal:8080"
    assert variables(adapters=[SQL])["HF_ENDPOINT"] == "http://hub.internal:8080"


def test_turning_lora_off_deletes_the_configmap_by_its_own_name() -> None:
    live = {kinds.CONFIG_MAP: {"metadata": {"name": "llama-adapters"}}}
    plan = plan_children(
        desired_state(deployment(), SETTINGS),
        live,
        parent={"apiVersion": "serving.llmop.dev/v1alpha1", "kind": "LLMDeployment",
                "metadata": {"name": "llama", "namespace": "team", "uid": "u"}},
    )  # fmt: skip
    deletes = [(d.kind.kind, d.name) for d in plan.deletes]
    assert deletes == [("ConfigMap", "llama-adapters")]
