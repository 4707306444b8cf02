"""The simulator holds the KV cache its capacity plan computed for the CR's GPU.

Chain under test, each step with the real code: the plan (`desired_state`) → the rendered
container args (`--num-gpu-blocks-override` for backend simulator only) → the agent's parser and
the command it launches → the simulator's own parser → its `vllm:cache_config_info` → the
agent's metrics parser → the operator's shortfall check (`agents.capacity_shortfall`). The
sample `examples/simulator-small.yaml` used to report 262,144 tokens (the simulator's fixed
16,384 blocks) against 1,479,120 planned: `CapacityShortfall` on the README's first command.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from llmop import agents
from llmop.api.v1alpha1 import LLMDeployment
from llmop.cli import load_deployments
from llmop.desired import desired_state
from llmop.planner.capacity import BLOCK_SIZE
from llmop.render import RenderSettings, render_children
from llmop_engine import contract
from llmop_engine.agent_settings import parse_run_args
from llmop_engine.contract import EngineFlag
from llmop_engine.simulator import sim_config
from llmop_engine.simulator.batching import BatchEngine
from llmop_engine.simulator.faults import FaultState
from llmop_engine.simulator.metrics import SimMetrics
from llmop_engine.supervisor import engine_command
from llmop_engine.vllm_metrics import parse as parse_metrics

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SETTINGS = RenderSettings(vllm_image="engine:1", simulator_image="sim:1")
SIMULATOR = {
    "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
    "engine": {"backend": "simulator", "maxModelLen": 8192},
    "resources": {"gpus": 1, "gpuProduct": "NVIDIA-L4"},
}


def cr(spec: dict[str, Any], name: str = "sim") -> LLMDeployment:
    return LLMDeployment.model_validate(
        {"metadata": {"name": name, "namespace": "default"}, "spec": spec}
    )


def container_args(llmd: LLMDeployment) -> list[str]:
    desired = desired_state(llmd, SETTINGS)
    assert desired.children is not None
    workload = desired.children.workload
    template = (
        workload["spec"].get("template")
        or workload["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    )
    args: list[str] = template["spec"]["containers"][0]["args"]
    return args


def simulated(args: list[str]) -> sim_config.SimConfig:
    """The simulator's configuration from the rendered container args, through the agent."""
    assert args[0] == "run"
    command = engine_command(parse_run_args(args[1:], {}), python="python")
    assert command[:4] == ["python", "-m", "llmop_engine", "simulate"]
    return sim_config.parse(command[4:])


def reported_tokens(cfg: sim_config.SimConfig) -> int | None:
    """The KV capacity the agent reads from the simulator's `/metrics`."""
    text = SimMetrics(cfg).render(0, 0, 0.0).decode()
    return parse_metrics(text).kv_capacity_tokens


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_reports_exactly_its_planned_kv_cache(path: Path) -> None:
    for llmd in load_deployments(path):
        desired = desired_state(llmd, SETTINGS)
        plan = desired.sizing.plan
        args = container_args(llmd)
        override = flag(args, EngineFlag.NUM_GPU_BLOCKS_OVERRIDE)
        if llmd.spec.engine.backend != "simulator":
            assert override is None  # vLLM profiles its GPU: never told a block count
            continue
        assert plan is not None
        assert plan.fits
        assert override == str(plan.kv_cache_tokens // 16)
        cfg = simulated(args)
        actual = reported_tokens(cfg)
        assert actual == plan.kv_cache_tokens
        assert agents.capacity_shortfall(plan.kv_cache_tokens, actual) is None


def test_the_renderer_counts_in_the_planners_block() -> None:
    assert contract.DEFAULT_BLOCK_SIZE == BLOCK_SIZE == sim_config.SimConfig().block_size


def test_the_sample_no_longer_falls_short() -> None:
    (llmd,) = load_deployments(EXAMPLES / "simulator-small.yaml")
    plan = desired_state(llmd, SETTINGS).sizing.plan
    assert plan is not None
    assert plan.kv_cache_tokens == 1_479_120  # `llmop plan -f examples/simulator-small.yaml`
    # What the fixed default gave: the warning of the issue.
    assert agents.capacity_shortfall(plan.kv_cache_tokens, 16384 * 16) is not None
    cfg = simulated(container_args(llmd))
    assert (cfg.num_gpu_blocks, cfg.block_size) == (92_445, 16)


def test_blocks_follow_a_block_size_set_in_engine_args() -> None:
    spec = {**SIMULATOR, "engine": {**SIMULATOR["engine"], "args": ["--block-size", "32"]}}
    llmd = cr(spec)
    planned = desired_state(llmd, SETTINGS).sizing.plan
    assert planned is not None
    cfg = simulated(container_args(llmd))
    assert cfg.block_size == 32
    assert cfg.num_gpu_blocks == planned.kv_cache_tokens // 32
    actual = reported_tokens(cfg)
    assert actual is not None
    # Rounded down by less than one block: far inside the shortfall margin.
    assert 0 <= planned.kv_cache_tokens - actual < 32
    assert agents.capacity_shortfall(planned.kv_cache_tokens, actual) is None


def test_a_user_block_count_wins() -> None:
    for extra in (["--num-gpu-blocks-override", "100"], ["--sim-kv-blocks", "100"]):
        spec = {**SIMULATOR, "engine": {**SIMULATOR["engine"], "args": extra}}
        assert simulated(container_args(cr(spec))).num_gpu_blocks == 100


def test_no_plan_no_block_count() -> None:
    # No GPU: nothing to plan, so the simulator keeps its default and nothing is compared.
    spec = {**SIMULATOR, "resources": {"gpus": 0}}
    desired = desired_state(cr(spec), SETTINGS)
    assert desired.sizing.plan is None
    args = container_args(cr(spec))
    assert EngineFlag.NUM_GPU_BLOCKS_OVERRIDE not in args
    assert simulated(args).num_gpu_blocks == 16384


def test_multi_node_simulator_leader_and_workers_get_the_replica_plan() -> None:
    spec = {**SIMULATOR, "engine": {**SIMULATOR["engine"], "pipelineParallelSize": 2}}
    llmd = cr(spec)
    plan = desired_state(llmd, SETTINGS).sizing.plan
    assert plan is not None
    assert plan.fits
    args = container_args(llmd)
    assert flag(args, EngineFlag.NUM_GPU_BLOCKS_OVERRIDE) == str(plan.kv_cache_tokens // 16)
    assert reported_tokens(simulated(args)) == plan.kv_cache_tokens


def test_render_without_a_plan_is_unchanged() -> None:
    """Callers that pass no plan (tools, tests) render what they always did."""
    children = render_children(cr(SIMULATOR), SETTINGS, load_timeout_seconds=900)
    args = children.workload["spec"]["template"]["spec"]["containers"][0]["args"]
    assert EngineFlag.NUM_GPU_BLOCKS_OVERRIDE not in args
    vllm = render_children(
        cr({**SIMULATOR, "engine": {"backend": "vllm"}}),
        SETTINGS,
        load_timeout_seconds=900,
        kv_cache_tokens=1_000_000,
    )
    vllm_args = vllm.workload["spec"]["template"]["spec"]["containers"][0]["args"]
    assert EngineFlag.NUM_GPU_BLOCKS_OVERRIDE not in vllm_args
    assert contract.EngineFlag.BLOCK_SIZE not in vllm_args


def test_a_huge_kv_cache_costs_no_memory() -> None:
    """The block count is a number: the simulator allocates nothing per block (an H200's plan is
    millions of tokens)."""
    cfg = sim_config.parse(["--num-gpu-blocks-override", str(10**9)])
    tracemalloc.start()
    try:
        engine = BatchEngine(cfg, SimMetrics(cfg), FaultState(mode="none"))
        req = engine.submit(1000, 100)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * 1024 * 1024
    assert req.blocks == 69  # ceil(1100 / 16)
    assert engine.kv_usage == 0.0
    assert reported_tokens(cfg) == 10**9 * 16
