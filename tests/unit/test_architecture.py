"""Import boundaries: the pure core imports no I/O library; each kind of I/O has one module."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from support.source import parse_file

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "src" / "llmop"

OWNERS = {
    "kubernetes": set(),  # the operator's client is its own (kube.py, credentials.py)
    "urllib3": {"kube.py"},
    "aiohttp": {"pod_client.py"},
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
    "model_facts.py",
    "model_files_record.py",
    "pods.py",
    "group_restarts.py",
    "agents.py",
    "coldstart.py",
    "pool_view.py",
    "idle.py",
    "adapter_status.py",
    "adapter_preflight.py",
    "cpu_engine.py",
    "quantity.py",
    "router_view.py",
    "name_owners.py",
    "model_revision.py",
    "rollout_room.py",
)
IMPURE_STDLIB = {
    "os",
    "time",
    "socket",
    "subprocess",
    "threading",
    "asyncio",
    "random",
    "shutil",
    "tempfile",
    "glob",
    "io",
    "argparse",
    "logging",
}
# Calls that read or write files (or the terminal): a pure module takes contents and returns
# them; its caller does the I/O (crdgen renders, crdgen_io writes).
FILE_IO_CALLS = {"open", "print", "input"}
FILE_IO_METHODS = {
    "read_text",
    "write_text",
    "read_bytes",
    "write_bytes",
    "mkdir",
    "unlink",
    "rmdir",
    "touch",
    "exists",
    "iterdir",
    "glob",
    "rglob",
}
# Modules whose docstring says "pure" without claiming it for themselves.
NOT_A_CLAIM = {
    "reconcile/__init__.py": "orchestration; its docstring names the pure functions it calls",
}


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def imported_roots(path: Path) -> set[str]:
    tree = parse_file(path)
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


def file_io_calls(path: Path) -> set[str]:
    """The file (and terminal) I/O calls in `path`: `open(…)`, `print(…)`, `x.write_text(…)`…"""
    found: set[str] = set()
    for node in ast.walk(parse_file(path)):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in FILE_IO_CALLS:
                found.add(f"{func.id}()")
            elif isinstance(func, ast.Attribute) and func.attr in FILE_IO_METHODS:
                found.add(f".{func.attr}()")
    return found


def says_pure(path: Path) -> bool:
    """Whether the module's docstring calls anything pure (a claim unless NOT_A_CLAIM)."""
    docstring = ast.get_docstring(parse_file(path)) or ""
    return re.search(r"\bpure\b", docstring, re.IGNORECASE) is not None


def test_pure_core_reads_no_clock_environment_network_or_files() -> None:
    for path in modules():
        name = relative(path)
        if not name.startswith(PURE):
            continue
        bad = imported_roots(path) & (IMPURE_STDLIB | set(OWNERS) | {"llmop.kube"})
        assert not bad, f"{name} is pure but imports {bad}"
        source = path.read_text(encoding="utf-8")
        for call in ("datetime.now(", "datetime.utcnow(", "time.time(", "os.environ"):
            assert call not in source, f"{name} is pure but calls {call}"
        assert not file_io_calls(path), f"{name} is pure but calls {file_io_calls(path)}"


def test_every_module_that_says_it_is_pure_is_checked() -> None:
    """A module cannot claim purity unchecked: one whose docstring says "pure" is in PURE (and so
    checked above), or in NOT_A_CLAIM with the reason its word is not a claim."""
    unchecked = [
        relative(path)
        for path in modules()
        if says_pure(path)
        and not relative(path).startswith(PURE)
        and relative(path) not in NOT_A_CLAIM
    ]
    assert unchecked == [], f"say they are pure but are not in PURE: {unchecked}"
    assert all((PACKAGE / name).exists() for name in NOT_A_CLAIM), "NOT_A_CLAIM lists a ghost"


def test_pure_core_does_not_import_orchestration() -> None:
    orchestration = {
        "llmop.kube",
        "llmop.handlers",
        "llmop.main",
        "llmop.metrics",
        "llmop.pod_client",
        "llmop.reconcile",
    }
    for path in modules():
        if not relative(path).startswith(PURE):
            continue
        tree = parse_file(path)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in orchestration:
                pytest.fail(f"{relative(path)} imports {node.module}")


def test_operator_meets_the_engine_only_through_the_contract() -> None:
    """The operator imports one engine module, the contract, which imports only the stdlib
    (the simulator image ships `llmop_engine` alone)."""
    for path in modules():
        tree = parse_file(path)
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
ROUTER_PURE = {
    "contract.py",
    "prefix.py",
    "ring.py",
    "routes.py",
    "discovery.py",
    "hold.py",
    "fairqueue.py",
    "loans.py",
    "engine_load.py",
    "share_advice.py",
    "priorities.py",
    "externals.py",
    "body.py",
    "limits.py",
    "tenants.py",
    "quota.py",
    "gpu_price.py",
    "metering.py",
    "tenant_status.py",
    "migration.py",
}
ROUTER_OWNERS = {
    "aiohttp": {
        *("app.py", "answers.py", "proxy.py", "scale_to_zero.py", "cli.py", "kube.py"),
        *("intake.py", "edge.py", "gateway.py", "migrating.py", "sharing.py"),
        "engine_readings.py",
    },
    "yaml": {"kube.py", "cli.py"},  # cli.py: --static-tenants
    "multidict": {"answers.py", "proxy.py", "app.py", "gateway.py", "migrating.py"},  # headers
    "redis": {"store.py"},
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
        "re",
        "argparse",  # limits.py: its flags (parsing, no I/O)
        "fnmatch",
        "datetime",  # tenants.py: parsing notAfter (the clock is a parameter)
        "decimal",
        "enum",
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


ROUTER_NOT_A_CLAIM = {
    "__init__.py": "the package's summary: it names its pure core",
    "scale_to_zero.py": "the I/O around the pure queues of hold.py, which it names",
    "sharing.py": "the I/O around the pure queues of fairqueue.py, which it names",
}


def test_every_router_module_that_says_it_is_pure_is_checked() -> None:
    unchecked = [
        path.name
        for path in sorted(ROUTER.rglob("*.py"))
        if says_pure(path) and path.name not in ROUTER_PURE | ROUTER_NOT_A_CLAIM.keys()
    ]
    assert unchecked == [], f"say they are pure but are not in ROUTER_PURE: {unchecked}"


ENGINE = PACKAGE.parents[2] / "engine-image" / "src" / "llmop_engine"
ENGINE_PURE = {
    "adapter_rules.py",
    "compile_cache_rules.py",
    "download_progress.py",
    "health.py",
    "startup_log.py",
    "vllm_metrics.py",
    "worker.py",
}
ENGINE_NOT_A_CLAIM = {
    "agent.py": "the I/O half of the agent; it names `health` as the pure judgement",
}
ENGINE_IO_LIBRARIES = {"aiohttp", "httpx", "huggingface_hub", "prometheus_client", "uvloop"}


def test_engine_pure_modules_do_no_io() -> None:
    """The engine's pure modules (values in, values out) import no clock, environment, network
    or file library, call no file I/O, and import only the contract and each other."""
    for name in sorted(ENGINE_PURE):
        path = ENGINE / name
        roots = imported_roots(path)
        bad = roots & (IMPURE_STDLIB | ENGINE_IO_LIBRARIES)
        assert not bad, f"llmop_engine/{name} is pure but imports {bad}"
        assert not file_io_calls(path), f"llmop_engine/{name} calls {file_io_calls(path)}"
        tree = parse_file(path)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                parts = node.module.split(".")
                if parts[0] != "llmop_engine":
                    continue
                targets = parts[1:2] or [alias.name for alias in node.names]
                for target in targets:
                    assert target == "contract" or f"{target}.py" in ENGINE_PURE, (
                        f"llmop_engine/{name} is pure but imports llmop_engine.{target}"
                    )


def test_every_engine_module_that_says_it_is_pure_is_checked() -> None:
    unchecked = [
        path.relative_to(ENGINE).as_posix()
        for path in sorted(ENGINE.rglob("*.py"))
        if says_pure(path)
        and path.relative_to(ENGINE).as_posix() not in ENGINE_PURE | ENGINE_NOT_A_CLAIM.keys()
    ]
    assert unchecked == [], f"say they are pure but are not in ENGINE_PURE: {unchecked}"
