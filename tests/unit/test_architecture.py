"""Import boundaries: the pure core imports no I/O library; each kind of I/O has one module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "src" / "llmop"

OWNERS = {
    "kubernetes": set(),  # the operator's client is its own (kube.py, credentials.py)
    "urllib3": {"kube.py"},
    "aiohttp": {"engine_client.py"},
    "prometheus_client": {"metrics.py"},
    # The framework: its registrations, its settings, its storage extension point, and the
    # rescan of a CRD its discovery missed.
    "kopf": {"handlers.py", "main.py", "persistence.py", "late_crds.py"},
    "huggingface_hub": {"hub.py"},
    "httpx2": {"hub.py"},  # huggingface_hub's HTTP client: its transport errors
}
PURE = (
    "api/",
    "planner/",
    "render/",
    "status.py",
    "conditions.py",
    "names.py",
    "kinds.py",
    "settings.py",
    "observed.py",
    "sizing.py",
    "desired.py",
    "plan.py",
    "cache_gate.py",
    "events.py",
    "crdgen.py",
    "preflight.py",
    "pods.py",
    "group_restarts.py",
    "agents.py",
    "coldstart.py",
    "pool_view.py",
    "idle.py",
    "adapter_status.py",
    "adapter_preflight.py",
)
IMPURE_STDLIB = {"os", "time", "socket", "subprocess", "threading", "asyncio", "random"}


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def relative(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


@pytest.mark.parametrize("library", sorted(OWNERS))
def test_each_io_library_has_exactly_its_owners(library: str) -> None:
    importers = {relative(p) for p in modules() if library in imported_roots(p)}
    assert importers <= OWNERS[library], (
        f"{library} imported outside its owners: {importers - OWNERS[library]}"
    )


def test_pure_core_reads_no_clock_environment_or_network() -> None:
    for path in modules():
        name = relative(path)
        if not name.startswith(PURE):
            continue
        bad = imported_roots(path) & (IMPURE_STDLIB | set(OWNERS) | {"llmop.kube"})
        assert not bad, f"{name} is pure but imports {bad}"
        source = path.read_text(encoding="utf-8")
        for call in ("datetime.now(", "datetime.utcnow(", "time.time(", "os.environ"):
            assert call not in source, f"{name} is pure but calls {call}"


def test_pure_core_does_not_import_orchestration() -> None:
    orchestration = {
        "llmop.kube",
        "llmop.handlers",
        "llmop.main",
        "llmop.metrics",
        "llmop.engine_client",
        "llmop.reconcile",
    }
    for path in modules():
        if not relative(path).startswith(PURE):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in orchestration:
                pytest.fail(f"{relative(path)} imports {node.module}")


def test_operator_meets_the_engine_only_through_the_contract() -> None:
    """The operator imports one engine module, the contract, which imports only the stdlib
    (the simulator image ships `llmop_engine` alone)."""
    for path in modules():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module]
                if node.module == "llmop_engine":
                    targets = [f"llmop_engine.{alias.name}" for alias in node.names]
            for target in targets:
                if target.split(".")[0] == "llmop_engine":
                    assert target == "llmop_engine.contract", f"{relative(path)} imports {target}"
    contract = PACKAGE.parents[2] / "engine-image" / "src" / "llmop_engine" / "contract.py"
    assert imported_roots(contract) <= {"__future__", "collections", "dataclasses", "typing"}


ROUTER = PACKAGE.parents[2] / "router" / "src" / "llmop_router"
ROUTER_PURE = {"prefix.py", "ring.py", "routes.py", "discovery.py", "hold.py"}
ROUTER_OWNERS = {
    "aiohttp": {"server.py", "cli.py", "kube.py"},
    "yaml": {"kube.py"},
    "multidict": {"server.py"},
    "prometheus_client": {"metrics.py"},
    "uvloop": {"cli.py"},
}


def test_router_is_its_own_package_with_a_pure_core() -> None:
    """The router imports no operator or engine code (its image ships only `llmop_router`);
    its routing core is pure; each I/O library has its one module."""
    stdlib_ok = {
        "__future__",
        "bisect",
        "collections",
        "dataclasses",
        "hashlib",
        "json",
        "math",
        "typing",
    }
    for path in sorted(ROUTER.rglob("*.py")):
        roots = imported_roots(path)
        assert not roots & {"llmop", "llmop_engine", "kopf", "kubernetes"}, (
            f"router/{path.name} imports {roots & {'llmop', 'llmop_engine', 'kopf', 'kubernetes'}}"
        )
        for library, owners in ROUTER_OWNERS.items():
            if library in roots:
                assert path.name in owners, f"{library} imported by router/{path.name}"
        if path.name in ROUTER_PURE:
            assert roots <= stdlib_ok | {"llmop_router"}, f"router/{path.name}: {roots}"
