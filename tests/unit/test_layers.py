"""Layer contracts for both packages, checked over the AST (in the style of import-linter's
`layers` and `independence` contracts, without the dependency).

A module may import from its own layer or a lower one, never a higher one; modules marked
independent may not import each other even within a layer. Imports inside functions count too
(a lazy import is still a dependency). A new violation fails `make test`. Nor may any modules
import each other around a loop (`test_no_import_cycles`), within a layer or not.

Operator: api < planner < foundation (periodic among them) < sizing | render < desired < status
          | adapter_status | adapter_preflight | plan | rollout_room | events | preflight
          | model_facts < cache_gate < credentials < config
          | kube | metrics | hub | pod_client | persistence
          < reconcile < fleet | leader | router_check | name_check | pool_check | hub_check
          | facts_check | group_check | idle_check | late_crds | crd_check | download_poll
          | standby | coalescer
          < runnables (the table of background loops) < handlers | main < cli | crdgen_io
Engine:   contract < vllm_metrics | simulator < health | connections | agent_settings
          | download_progress | worker | adapter_rules | startup_log < supervisor | engine_client
          | agent_metrics | probe_server | drain | download | adapter_loader < agent | worker_agent
          < cli
Router:   contract < prefix | hold | fairqueue | loans | priorities | externals | metrics | tenants
          < ring | body
          | quota | migration < routes | metering | tenant_status < discovery | answers | store
          | migrating < proxy | scale_to_zero | kube | intake | edge | gateway | sharing < app
          < cli
Across:   the operator imports of the router only `llmop_router.contract` (as of the engine only
          `llmop_engine.contract`), the router nothing of the operator or the engine, and the
          router's contract only the stdlib.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from support.source import parse_file

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
        "llmop.cpu_engine",
        "llmop.pods",
        "llmop.group_restarts",
        "llmop.agents",
        "llmop.coldstart",
        "llmop.router_view",
        "llmop.name_owners",
        "llmop.model_revision",
        "llmop.pool_view",
        "llmop.idle",
        "llmop.periodic",
        "llmop.model_files_record",
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
        "llmop.model_facts",
    ),
    ("llmop.cache_gate",),
    ("llmop.credentials",),
    (
        "llmop.config",
        "llmop.kube",
        "llmop.metrics",
        "llmop.hub",
        "llmop.pod_client",
        "llmop.persistence",
    ),
    ("llmop.reconcile",),
    (
        "llmop.fleet",
        "llmop.leader",
        "llmop.router_check",
        "llmop.name_check",
        "llmop.pool_check",
        "llmop.hub_check",
        "llmop.facts_check",
        "llmop.group_check",
        "llmop.idle_check",
        "llmop.late_crds",
        "llmop.crd_check",
        "llmop.download_poll",
        "llmop.standby",
        "llmop.coalescer",
    ),
    # The background loops of a leadership term, one row each.
    ("llmop.runnables",),
    ("llmop.handlers", "llmop.main"),
    ("llmop.cli", "llmop.crdgen_io"),
)
OPERATOR_INDEPENDENT = (
    ("llmop.sizing", "llmop.render"),  # planning never depends on rendering, nor the reverse
    ("llmop.planner", "llmop.render"),
    ("llmop.status", "llmop.plan"),
    ("llmop.config", "llmop.kube"),
    ("llmop.kube", "llmop.metrics"),
    ("llmop.kube", "llmop.pod_client"),  # the API server and the pods we run: one client each
)

ENGINE_LAYERS: tuple[tuple[str, ...], ...] = (
    ("llmop_engine.contract",),
    ("llmop_engine.connection_close",),
    ("llmop_engine.vllm_metrics", "llmop_engine.simulator"),
    (
        "llmop_engine.health",
        "llmop_engine.connections",
        "llmop_engine.agent_settings",
        "llmop_engine.download_progress",
        "llmop_engine.worker",
        "llmop_engine.adapter_rules",
        "llmop_engine.compile_cache_rules",
        "llmop_engine.startup_log",
    ),
    (
        "llmop_engine.supervisor",
        "llmop_engine.engine_client",
        "llmop_engine.agent_metrics",
        "llmop_engine.probe_server",
        "llmop_engine.drain",
        "llmop_engine.download",
        "llmop_engine.adapter_loader",
        "llmop_engine.compile_cache",
    ),
    ("llmop_engine.agent", "llmop_engine.worker_agent"),
    ("llmop_engine.cli", "llmop_engine.__main__"),
)
ENGINE_INDEPENDENT = (
    ("llmop_engine.simulator", "llmop_engine.vllm_metrics"),  # the simulator speaks for vLLM
)

ROUTER_LAYERS: tuple[tuple[str, ...], ...] = (
    ("llmop_router.contract", "llmop_router.limits", "llmop_router.resp"),
    (
        "llmop_router.prefix",
        "llmop_router.hold",
        "llmop_router.fairqueue",
        "llmop_router.loans",
        "llmop_router.engine_load",
        "llmop_router.share_advice",
        "llmop_router.priorities",
        "llmop_router.externals",
        "llmop_router.metrics",
        "llmop_router.tenants",
    ),
    ("llmop_router.ring", "llmop_router.body", "llmop_router.quota", "llmop_router.migration"),
    (
        "llmop_router.routes",
        "llmop_router.metering",
        "llmop_router.tenant_status",
        "llmop_router.gpu_price",
    ),
    (
        "llmop_router.discovery",
        "llmop_router.answers",
        "llmop_router.store",
        "llmop_router.migrating",
        "llmop_router.engine_readings",
    ),
    (
        "llmop_router.proxy",
        "llmop_router.scale_to_zero",
        "llmop_router.kube",
        "llmop_router.intake",
        "llmop_router.edge",
        "llmop_router.gateway",
        "llmop_router.sharing",
    ),
    ("llmop_router.app",),
    ("llmop_router.cli", "llmop_router.__main__"),
)
ROUTER_INDEPENDENT = (
    ("llmop_router.proxy", "llmop_router.scale_to_zero"),  # relaying and holding: the app joins
    ("llmop_router.proxy", "llmop_router.kube"),
    ("llmop_router.scale_to_zero", "llmop_router.kube"),  # the waker comes in as a function
    ("llmop_router.gateway", "llmop_router.proxy"),  # the gateway's tap comes in as a value
    ("llmop_router.gateway", "llmop_router.kube"),  # tenants come in as watch events
    ("llmop_router.sharing", "llmop_router.gateway"),  # a tenant's turn: the app joins them
    ("llmop_router.sharing", "llmop_router.scale_to_zero"),  # held at zero or queued: one each
)


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def imports(path: Path, package: str) -> set[str]:
    """Absolute names of the in-package modules `path` imports (at any depth of the file)."""
    tree = parse_file(path)
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
        ("llmop_router", ROOT / "router" / "src", ROUTER_LAYERS, ROUTER_INDEPENDENT),
    ],
    ids=["operator", "engine", "router"],
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


def module_graph(package: str, src: Path) -> dict[str, set[str]]:
    """Each in-package module → the in-package modules it imports (module level or inside a
    function: a lazy import is still a dependency). `from pkg import mod` is an edge to `pkg.mod`
    when that is a module, else to `pkg` (a name from its `__init__`); a submodule's implicit
    import of its own package's `__init__` is not an edge (that is how packages load)."""
    paths = sorted((src / package).rglob("*.py"))
    known = {module_name(path, src) for path in paths}
    graph: dict[str, set[str]] = {}
    for path in paths:
        name = module_name(path, src)
        tree = parse_file(path)
        targets: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names if a.name.split(".")[0] == package}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module.split(".")[0] != package:
                    continue
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    targets.add(sub if sub in known else node.module)
        graph[name] = {t for t in targets if t in known and t != name}
    return graph


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module `start` imports, directly or through others."""
    seen: set[str] = set()
    todo = list(graph.get(start, ()))
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo += graph.get(node, ())
    return seen


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other around a loop (each group sorted)."""
    reach = {node: reachable(graph, node) for node in graph}
    groups = {
        tuple(sorted({node} | {other for other in reach[node] if node in reach[other]}))
        for node in graph
        if node in reach[node]
    }
    return sorted(list(group) for group in groups)


@pytest.mark.parametrize(
    ("package", "src"),
    [
        ("llmop", ROOT / "operator" / "src"),
        ("llmop_engine", ROOT / "engine-image" / "src"),
        ("llmop_router", ROOT / "router" / "src"),
    ],
    ids=["operator", "engine", "router"],
)
def test_no_import_cycles(package: str, src: Path) -> None:
    """Two modules that import each other (directly or around a loop) are one module in two
    files, and work only by the order they happen to load in: move the shared piece down."""
    assert import_cycles(module_graph(package, src)) == []


def test_the_cycle_checker_catches_a_loop(tmp_path: Path) -> None:
    package = tmp_path / "llmop"
    for module, source in {
        "__init__": "",
        "render/__init__": "from llmop.render.a import x\n",
        "render/a": "from llmop.render import b\nx = 1\n",
        "render/b": "def f():\n    from llmop.render.c import y\n",
        "render/c": "import llmop.render.a\ny = 2\n",
        "render/d": "from llmop.render import helper\n",  # a name from render/__init__
        "kinds": "from llmop.render import a\n",  # a package's own submodule: no loop
    }.items():
        path = package / f"{module}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    cycles = import_cycles(module_graph("llmop", tmp_path))
    assert cycles == [["llmop.render.a", "llmop.render.b", "llmop.render.c"]]
    (package / "render" / "__init__.py").write_text("from llmop.render import d\nhelper = 1\n")
    cycles = import_cycles(module_graph("llmop", tmp_path))
    assert ["llmop.render", "llmop.render.d"] in cycles


def foreign_imports(path: Path, packages: set[str]) -> set[str]:
    """The modules of `packages` that `path` imports (`from pkg import mod` names `pkg.mod`)."""
    found: set[str] = set()
    for node in ast.walk(parse_file(path)):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [node.module]
            if node.module in packages:
                targets = [f"{node.module}.{alias.name}" for alias in node.names]
        found |= {t for t in targets if t.split(".")[0] in packages}
    return found


def test_the_operator_meets_the_router_only_through_its_contract() -> None:
    """The operator imports of the router only its contract; the router imports nothing of the
    operator or the engine (its image ships only `llmop_router`); the contract, which the
    operator's image keeps, imports only the stdlib."""
    operator = ROOT / "operator" / "src" / "llmop"
    for path in sorted(operator.rglob("*.py")):
        wrong = foreign_imports(path, {"llmop_router"}) - {"llmop_router.contract"}
        assert not wrong, f"{path.relative_to(ROOT)} imports {sorted(wrong)}"
    router = ROOT / "router" / "src" / "llmop_router"
    for path in sorted(router.rglob("*.py")):
        wrong = foreign_imports(path, {"llmop", "llmop_engine"})
        assert not wrong, f"{path.relative_to(ROOT)} imports {sorted(wrong)}"
    contract = parse_file(router / "contract.py")
    roots = {
        name.split(".")[0]
        for node in ast.walk(contract)
        for name in (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module]
            if isinstance(node, ast.ImportFrom) and node.module
            else []
        )
    }
    assert roots <= set(sys.stdlib_module_names) | {"__future__"}, roots
