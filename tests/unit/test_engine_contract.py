"""The operator ↔ engine contract, end to end without a cluster: render a real Deployment, then
feed its container args and env through the agent's own parser and command builder, and check
the agent ends up with exactly the settings the CR asked for. A renamed variable or flag on
either side, or a default that differs between the CRD and the agent, fails here."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from llmop import names
from llmop.api.v1alpha1 import LLMDeployment, LLMDeploymentSpec
from llmop.render import RenderSettings, render_children
from llmop.render.engine_args import spec_value
from llmop_engine import contract, health
from llmop_engine.agent_settings import AgentSettings, parse_run_args
from llmop_engine.supervisor import engine_command, engine_port

SETTINGS = RenderSettings(vllm_image="engine:1", simulator_image="sim:1")
LOAD_TIMEOUT = 900


def _render(spec: dict[str, Any]) -> tuple[LLMDeployment, dict[str, Any]]:
    ld = LLMDeployment.model_validate(
        {"metadata": {"name": "llama", "namespace": "team"}, "spec": spec}
    )
    children = render_children(ld, SETTINGS, load_timeout_seconds=LOAD_TIMEOUT)
    container: dict[str, Any] = children.deployment["spec"]["template"]["spec"]["containers"][0]
    return ld, container


def _agent(container: dict[str, Any], secrets: dict[str, str] | None = None) -> AgentSettings:
    """What `llmop-engine run` decides in that container: plain env values as rendered, secret
    references resolved from `secrets` the way the kubelet would."""
    env: dict[str, str] = {}
    for var in container["env"]:
        if "value" in var:
            env[var["name"]] = var["value"]
        elif secrets is not None and var["name"] in secrets:
            env[var["name"]] = secrets[var["name"]]
    args = container["args"]
    assert args[0] == contract.RUN
    return parse_run_args(args[1:], env)


SPECS = {
    "defaults": {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}},
    "everything-set": {
        "model": {
            "name": "meta-llama/Llama-3.1-8B-Instruct",
            "servedName": "llama-8b",
            "revision": "0123abcd",
        },
        "engine": {"backend": "simulator", "args": ["--enforce-eager"]},
        "resources": {"gpus": 2},
        "health": {
            "stallSeconds": 45,
            "loadTimeoutSeconds": 1234,
            "deepProbe": {
                "enabled": False,
                "intervalSeconds": 15,
                "timeoutSeconds": 3,
                "prompt": "hello there",
            },
        },
        "rollout": {"drainSeconds": 90, "endpointPropagationSeconds": 7},
        "service": {"port": 9000, "apiKeySecretRef": {"name": "keys", "key": "api"}},
    },
}


@pytest.mark.parametrize("case", sorted(SPECS))
def test_rendered_container_round_trips_through_the_agent_parser(case: str) -> None:
    ld, container = _render(SPECS[case])
    spec = ld.spec
    agent = _agent(container, secrets={contract.Env.API_KEY: "sk-test"})
    probe = spec.health.deep_probe
    wanted = {
        "backend": spec.engine.backend,
        "api_port": spec.service.port,
        "probe_port": names.PROBE_PORT,
        "served_model_name": spec.model.served_name or "llama",
        "stall_seconds": spec.health.stall_seconds,
        "load_timeout_seconds": spec.health.load_timeout_seconds or LOAD_TIMEOUT,
        "deep_probe_enabled": probe.enabled,
        "deep_probe_interval_seconds": probe.interval_seconds,
        "deep_probe_timeout_seconds": probe.timeout_seconds,
        "deep_probe_prompt": probe.prompt,
        "endpoint_propagation_seconds": spec.rollout.endpoint_propagation_seconds,
        "drain_seconds": spec.rollout.drain_seconds,
        "model_cache_dir": names.MODEL_CACHE_PATH,
        "agent_socket": f"{names.AGENT_SOCKET_DIR}/agent.sock",
        "api_key": "sk-test" if spec.service.api_key_secret_ref else None,
    }
    got = {key: getattr(agent, key) for key in wanted}
    assert got == wanted
    # The engine the agent launches gets the model and listens where the Service and the
    # container port point. The drain budget is the agent's (drain_seconds above): it runs the
    # drain itself, so the engine gets `--shutdown-timeout 0` in place of the rendered budget,
    # and `--enable-server-load-tracking` for the in-flight count the drain waits on.
    command = engine_command(agent)
    assert contract.EngineFlag.ENABLE_SERVER_LOAD_TRACKING in command
    assert ld.spec.model.name in command
    assert command.count(contract.EngineFlag.SHUTDOWN_TIMEOUT) == 1
    shutdown = command.index(contract.EngineFlag.SHUTDOWN_TIMEOUT)
    assert command[shutdown + 1] == "0"
    assert engine_port(agent) == spec.service.port
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {names.API_PORT_NAME: agent.api_port, names.PROBE_PORT_NAME: agent.probe_port}
    assert list(agent.engine_args[len(agent.engine_args) - len(spec.engine.args) :]) == list(
        spec.engine.args
    )


def test_probes_and_prestop_point_at_what_the_agent_serves() -> None:
    _, container = _render(SPECS["defaults"])
    assert container["readinessProbe"]["httpGet"]["path"] == contract.READYZ_PATH
    assert container["livenessProbe"]["httpGet"]["path"] == contract.LIVEZ_PATH
    assert container["startupProbe"]["httpGet"]["path"] == contract.LIVEZ_PATH
    assert container["lifecycle"]["preStop"]["exec"]["command"] == [contract.ENTRYPOINT, "drain"]


def test_every_rendered_variable_is_one_the_agent_reads() -> None:
    _, container = _render(SPECS["everything-set"])
    known = {value for key, value in vars(contract.Env).items() if not key.startswith("_")}
    known |= {row.env for row in contract.SETTINGS if row.env is not None}
    rendered = {var["name"] for var in container["env"]}
    assert rendered <= known, rendered - known


def test_one_set_of_engine_defaults() -> None:
    """The CRD's defaults, the agent's defaults and the health policy's defaults agree: an
    engine started without any variable behaves like one rendered from an empty spec."""
    spec = LLMDeploymentSpec.model_validate({"model": {"name": "m"}})
    agent = AgentSettings()
    policy = health.Policy()
    api = {
        "stall_seconds": spec.health.stall_seconds,
        "deep_probe_enabled": spec.health.deep_probe.enabled,
        "deep_probe_interval_seconds": spec.health.deep_probe.interval_seconds,
        "deep_probe_timeout_seconds": spec.health.deep_probe.timeout_seconds,
        "deep_probe_prompt": spec.health.deep_probe.prompt,
        "drain_seconds": spec.rollout.drain_seconds,
        "endpoint_propagation_seconds": spec.rollout.endpoint_propagation_seconds,
        "api_port": spec.service.port,
    }
    assert {key: getattr(agent, key) for key in api} == api
    shared = {f.name for f in dataclasses.fields(health.Policy)}
    assert {k: getattr(policy, k) for k in shared} == {k: getattr(agent, k) for k in shared}
    # An agent started with no flags and no variables: the same defaults again.
    bare = parse_run_args([], {})
    assert dataclasses.replace(bare, engine_args=()) == agent


def _other_value(row: contract.Setting) -> tuple[object, str]:
    """A value unlike the row's default, and how a flag or a variable spells it."""
    if row.choices is not None:
        other = next(choice for choice in row.choices if choice != row.default)
        return other, other
    if row.kind is bool:
        return (not row.default), contract.encode_bool(not row.default)
    if row.kind is str:
        return "other-value", "other-value"
    number = row.kind(str(row.default or 0)) + 3
    return number, str(number)


@pytest.mark.parametrize("row", contract.SETTINGS, ids=lambda row: row.name)
def test_every_setting_is_read_from_its_flag_and_its_variable(row: contract.Setting) -> None:
    """The agent's parser and environment reader are made from the table: each row's flag and
    variable set its field, and the flag wins over the variable."""
    value, spelled = _other_value(row)
    if row.env is not None:
        assert getattr(parse_run_args([], {row.env: spelled}), row.name) == value
    if row.flag is None:
        return
    if row.kind is bool:
        argv = [row.flag if value else "--no-" + row.flag.removeprefix("--")]
    else:
        argv = [row.flag, spelled]
    env = {row.env: str(row.default)} if row.env is not None else {}
    assert getattr(parse_run_args(argv, env), row.name) == value


@pytest.mark.parametrize(
    "row", [row for row in contract.SETTINGS if row.spec], ids=lambda row: row.name
)
def test_every_cr_field_of_the_table_reaches_the_agent(row: contract.Setting) -> None:
    """A row's CR field is rendered into its variable: set it to a value unlike the default and
    the agent in the rendered container has it; unset, the CRD's default is the table's."""
    assert row.spec is not None
    default_spec = LLMDeploymentSpec.model_validate({"model": {"name": "m"}})
    assert spec_value(default_spec, row.spec) in (row.default, None)
    value, _ = _other_value(row)
    nested: dict[str, Any] = {}
    *parents, leaf = row.spec.split(".")
    cursor = nested
    for key in parents:
        cursor = cursor.setdefault(key, {})
    cursor[leaf] = value
    _, container = _render({"model": {"name": "m"}, **nested})
    assert getattr(_agent(container), row.name) == value
