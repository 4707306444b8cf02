"""Layer contracts for both packages, checked over the AST (in the style of import-linter's
`layers` and `independence` contracts, without the dependency).

A module may import from its own layer or a lower one, never a higher one; modules marked
independent may not import each other even within a layer. Imports inside functions count too
(a lazy import is still a dependency). A new violation fails `make test`.

Operator: api < planner < foundation (periodic among them) < sizing | render < desired < status
          | adapter_status | adapter_preflight | plan | rollout_room | events | preflight
          < cache_gate < credentials < config
          | kube | metrics | hub | engine_client | persistence
          < reconcile < fleet | leader | router_check | pool_check | hub_check | group_check
          | idle_check | late_crds
          < handlers | main < cli
Engine:   contract < vllm_metrics | simulator < health | connections | settings | download_progress
          | worker | adapters < supervisor | engine_client | agent_metrics | probe_server | drain
          | download | adapter_loader < agent | worker_agent < cli
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

OPERATOR_LAYERS: tuple[tuple[str, ...], ...] = (
    ("llmop.api", "llmop.quantity"),
    ("llmop.planner",),
    # Foundation: names, the kind registry, condition bookkeeping, operator-wide render
    # settings, the cached-object shapes, and the CRD generator (reads only the API).
    (
        "llmop.names",
        "llmop.kinds",
        "llmop.conditions",
        "llmop.settings",
        "llmop.observed",
        "llmop.crdgen",
        "llmop.cpu",
        "llmop.pods",
        "llmop.group_restarts",
        "llmop.agents",
        "llmop.coldstart",
        "llmop.router_view",
        "llmop.pool_view",
        "llmop.idle",
        "llmop.periodic",
    ),
    ("llmop.sizing", "llmop.render"),
    ("llmop.desired",),
    (
        "llmop.status",
        "llmop.adapter_status",
        "llmop.adapter_preflight",
        "llmop.plan",
        "llmop.rollout_room",
        "llmop.events",
        "llmop.preflight",
    ),
    ("llmop.cache_gate",),
    ("llmop.credentials",),
    (
        "llmop.config",
        "llmop.kube",
        "llmop.metrics",
        "llmop.hub",
        "llmop.engine_client",
        "llmop.persistence",
    ),
    ("llmop.reconcile",),
    (
        "llmop.fleet",
        "llmop.leader",
        "llmop.router_check",
        "llmop.pool_check",
        "llmop.hub_check",
        "llmop.group_check",
        "llmop.idle_check",
        "llmop.late_crds",
    ),
    ("llmop.handlers", "llmop.main"),
    ("llmop.cli",),
)
OPERATOR_INDEPENDENT = (
    ("llmop.sizing", "llmop.render"),  # planning never depends on rendering, nor the reverse
    ("llmop.planner", "llmop.render"),
    ("llmop.status", "llmop.plan"),
    ("llmop.config", "llmop.kube"),
    ("llmop.kube", "llmop.metrics"),
    ("llmop.kube", "llmop.engine_client"),  # the API server and the agents: one client each
)

ENGINE_LAYERS: tuple[tuple[str, ...], ...] = (
    ("llmop_engine.contract",),
    ("llmop_engine.connection_close",),
    ("llmop_engine.vllm_metrics", "llmop_engine.simulator"),
    (
        "llmop_engine.health",
        "llmop_engine.connections",
        "llmop_engine.settings",
        "llmop_engine.download_progress",
        "llmop_engine.worker",
        "llmop_engine.adapters",
    ),
    (
        "llmop_engine.supervisor",
        "llmop_engine.engine_client",
        "llmop_engine.agent_metrics",
        "llmop_engine.probe_server",
        "llmop_engine.drain",
        "llmop_engine.download",
        "llmop_engine.adapter_loader",
    ),
    ("llmop_engine.agent", "llmop_engine.worker_agent"),
    ("llmop_engine.cli", "llmop_engine.__main__"),
)
ENGINE_INDEPENDENT = (
    ("llmop_engine.simulator", "llmop_engine.vllm_metrics"),  # the simulator speaks for vLLM
)


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def imports(path: Path, package: str) -> set[str]:
    """Absolute names of the in-package modules `path` imports (at any depth of the file)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == package}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] != package:
                continue
            # `from pkg import mod` imports pkg.mod; `from pkg.mod import name` imports pkg.mod.
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def owner(module: str, layers: tuple[tuple[str, ...], ...]) -> tuple[int, str] | None:
    """(layer index, the layer entry) that `module` belongs to (longest prefix wins). The
    package's own `__init__` (version string, docstring) sits below every layer."""
    if "." not in module:
        return (-1, module)
    best: tuple[int, str] | None = None
    for index, layer in enumerate(layers):
        for entry in layer:
            if (module == entry or module.startswith(entry + ".")) and (
                best is None or len(entry) > len(best[1])
            ):
                best = (index, entry)
    return best


def violations(
    package: str,
    src: Path,
    layers: tuple[tuple[str, ...], ...],
    independent: tuple[tuple[str, str], ...],
) -> list[str]:
    found = []
    for path in sorted((src / package).rglob("*.py")):
        name = module_name(path, src)
        mine = owner(name, layers)
        if mine is None:
            found.append(f"{name} is in no layer")
            continue
        for target in sorted(imports(path, package)):
            theirs = owner(target, layers)
            if theirs is None or theirs[1] == mine[1]:
                continue
            if theirs[0] > mine[0]:
                found.append(f"{name} (layer {mine[0]}) imports {target} (layer {theirs[0]})")
            for a, b in independent:
                if {mine[1], theirs[1]} == {a, b}:
                    found.append(f"{name} imports {target}: {a} and {b} are independent")
    return found


@pytest.mark.parametrize(
    ("package", "src", "layers", "independent"),
    [
        ("llmop", ROOT / "operator" / "src", OPERATOR_LAYERS, OPERATOR_INDEPENDENT),
        ("llmop_engine", ROOT / "engine-image" / "src", ENGINE_LAYERS, ENGINE_INDEPENDENT),
    ],
    ids=["operator", "engine"],
)
def test_layers(
    package: str,
    src: Path,
    layers: tuple[tuple[str, ...], ...],
    independent: tuple[tuple[str, str], ...],
) -> None:
    assert violations(package, src, layers, independent) == []


def test_the_checker_catches_an_upward_import(tmp_path: Path) -> None:
    """A checker that never fails guards nothing: plant the violations the layers forbid."""
    package = tmp_path / "llmop"
    for module, source in {
        "__init__": "",
        "sizing": "from llmop.render.engine_args import x\n",
        "render/__init__": "",
        "render/engine_args": "x = 1\n",
        "status": "def f():\n    from llmop import reconcile\n",
        "reconcile": "",
        "planner/__init__": "import llmop.render\n",
    }.items():
        path = package / f"{module}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    found = violations("llmop", tmp_path, OPERATOR_LAYERS, OPERATOR_INDEPENDENT)
    assert any("llmop.sizing imports llmop.render" in v for v in found)
    assert any("llmop.status (layer 5) imports llmop.reconcile" in v for v in found)
    assert any("llmop.planner (layer 1) imports llmop.render" in v for v in found)
    assert any("llmop.__init__" not in v for v in found)
