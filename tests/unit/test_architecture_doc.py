"""docs/architecture.md against the code: a module it names must exist, and its layer lists must
be those `tests/unit/test_layers.py` enforces.

What counts as naming a module:

- a dotted name of one of the three packages anywhere in the text (`llmop.render.deployment`,
  `llmop.runnables.TABLE`): its longest prefix that is a module must exist, and what follows it
  must be a top-level name of that module (a function, class, constant or import);
- a path in backticks: under a package (`llmop/reconcile/entry.py`, `llmop_router/`) it is
  looked for under that package's `src/`; under a top-level entry of the repository
  (`tests/unit/test_layers.py`, `operator/src/llmop`) from the repository's root; a bare file
  name (`in_sync.py`) next to the last path before it on the same line, or else anywhere in
  the three packages;
- a relative Markdown link (`[router.md](router.md)`), from docs/.

The layer lists are the fenced block after each `<!-- layers PACKAGE -->` marker: one layer per
line (a line ending in `|` goes on on the next), lowest first, names relative to the package
separated by `|`, `#` starting a comment.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path
from types import ModuleType

from support.modules import load_file
from support.source import parse_file

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
SOURCES = {
    "llmop": ROOT / "operator" / "src",
    "llmop_engine": ROOT / "engine-image" / "src",
    "llmop_router": ROOT / "router" / "src",
}
LAYER_LISTS = {
    "llmop": "OPERATOR_LAYERS",
    "llmop_engine": "ENGINE_LAYERS",
    "llmop_router": "ROUTER_LAYERS",
}

Layers = tuple[tuple[str, ...], ...]

DOTTED = re.compile(r"(?<![\w./-])(llmop(?:_engine|_router)?)((?:\.\w+)+)")
BACKTICKED = re.compile(r"`([^`\n]+)`")
PATH = re.compile(r"[\w.-]+(?:/[\w.-]+)*/?")
LINK = re.compile(r"\]\(([^)\s]+)\)")
MARKER = re.compile(r"<!--\s*layers\s+(\S+)\s*-->")


def _layer_test() -> ModuleType:
    """tests/unit/test_layers.py, loaded from its path (tests/unit is no package)."""
    return load_file("_architecture_doc_layer_test", ROOT / "tests" / "unit" / "test_layers.py")


def module_file(dotted: str, sources: dict[str, Path]) -> Path | None:
    """The file of module `dotted` (a module file or a package's `__init__.py`), if any."""
    parts = dotted.split(".")
    src = sources.get(parts[0])
    if src is None:
        return None
    base = src.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@cache
def top_level_names(path: Path) -> frozenset[str]:
    """What `from <module> import name` could take from `path`: its top-level definitions,
    assignments and imports."""
    found: set[str] = set()
    for node in parse_file(path).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.add(node.name)
        elif isinstance(node, ast.Assign):
            found |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            found |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return frozenset(found)


def dotted_problem(name: str, sources: dict[str, Path]) -> str | None:
    """Why dotted `name` names nothing in the tree, or None when it does."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        path = module_file(".".join(parts[:cut]), sources)
        if path is None:
            continue
        rest = parts[cut:]
        if not rest:
            return None
        if rest[0] in top_level_names(path) or module_file(".".join(parts[: cut + 1]), sources):
            return None
        return f"`{name}`: {'.'.join(parts[:cut])} has no module or name {rest[0]!r}"
    return f"`{name}`: no such package"


def path_problem(
    span: str, line_dir: Path | None, root: Path, sources: dict[str, Path]
) -> tuple[bool, str | None, Path | None]:
    """(whether backticked `span` is a path of the repository; why it names nothing, or None;
    the directory a later bare file name on the same line is looked for in)."""
    first = span.split("/", maxsplit=1)[0]
    if "/" not in span:
        if not span.endswith(".py") or span.startswith("."):
            return False, None, line_dir
        if line_dir is not None:
            found = (line_dir / span).is_file()
            where = f"in {line_dir.relative_to(root).as_posix()}"
        else:
            found = any(any(src.joinpath(p).rglob(span)) for p, src in sources.items())
            where = "in any package"
        return True, (None if found else f"`{span}`: no such file {where}"), line_dir
    if first in sources:
        path = sources[first] / span
    elif (root / first).exists():
        path = root / span
    else:
        return False, None, line_dir
    if not path.exists():
        return True, f"`{span}`: {path.relative_to(root).as_posix()} does not exist", line_dir
    return True, None, path if path.is_dir() else path.parent


def missing_references(
    text: str, root: Path = ROOT, sources: dict[str, Path] = SOURCES, docs: Path | None = None
) -> tuple[list[str], int]:
    """(what `text` names that does not exist, how many names it checked)."""
    docs = docs or root / "docs"
    problems: list[str] = []
    checked = 0
    for number, line in enumerate(text.splitlines(), start=1):
        for match in DOTTED.finditer(line):
            checked += 1
            problem = dotted_problem(match.group(1) + match.group(2), sources)
            if problem:
                problems.append(f"line {number}: {problem}")
        line_dir: Path | None = None
        for span in BACKTICKED.findall(line):
            if not PATH.fullmatch(span):
                continue
            counted, problem, line_dir = path_problem(span, line_dir, root, sources)
            checked += counted
            if problem:
                problems.append(f"line {number}: {problem}")
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:|#", target):
                continue
            checked += 1
            if not (docs / target.split("#")[0]).exists():
                problems.append(f"line {number}: link ({target}) leads nowhere from docs/")
    return problems, checked


def doc_layers(text: str) -> dict[str, Layers]:
    """Each `<!-- layers PACKAGE -->` marker's fenced block, as the layer test writes layers."""
    lines = text.splitlines()
    found: dict[str, Layers] = {}
    for index, line in enumerate(lines):
        marker = MARKER.search(line)
        if marker is None:
            continue
        package = marker.group(1)
        assert package not in found, f"docs/architecture.md: two `<!-- layers {package} -->`"
        fence = index + 1
        while fence < len(lines) and not lines[fence].strip():
            fence += 1
        if fence >= len(lines) or not lines[fence].startswith("```"):
            raise AssertionError(
                f"docs/architecture.md line {index + 1}: a fenced block must follow the marker"
            )
        layers: list[tuple[str, ...]] = []
        layer = ""
        for row in lines[fence + 1 :]:
            if row.startswith("```"):
                break
            layer += row.split("#")[0].strip()
            if layer.endswith("|"):
                continue  # the layer goes on on the next line
            names = [n.strip() for n in layer.split("|") if n.strip()]
            if names:
                layers.append(tuple(f"{package}.{n}" for n in names))
            layer = ""
        else:
            raise AssertionError(f"docs/architecture.md line {fence + 1}: an unclosed block")
        found[package] = tuple(layers)
    return found


def layer_block(package: str, layers: Layers) -> str:
    """The block the doc should hold for `layers`."""
    rows = [" | ".join(name.removeprefix(package + ".") for name in layer) for layer in layers]
    return "\n".join([f"<!-- layers {package} -->", "```text", *rows, "```"])


def layer_difference(package: str, documented: Layers, enforced: Layers) -> list[str]:
    """How `documented` differs from `enforced` (each layer compared as a set), in words."""
    if [set(layer) for layer in documented] == [set(layer) for layer in enforced]:
        return []
    said = {name: i for i, layer in enumerate(documented) for name in layer}
    meant = {name: i for i, layer in enumerate(enforced) for name in layer}
    words = [f"{n}: not in the test (gone or renamed?)" for n in sorted(said.keys() - meant)]
    words += [f"{n}: missing from the doc" for n in sorted(meant.keys() - said)]
    if len(documented) != len(enforced):
        # Every layer above an added or removed one moved: naming each would say nothing.
        return [f"the doc has {len(documented)} layers, the test {len(enforced)}", *words]
    words += [
        f"{n}: in the doc's layer {said[n] + 1}, the test's layer {meant[n] + 1}"
        for n in sorted(said.keys() & meant)
        if said[n] != meant[n]
    ]
    return words


def test_every_module_the_doc_names_exists() -> None:
    problems, checked = missing_references(DOC.read_text(encoding="utf-8"))
    assert checked >= 100, f"only {checked} references found: is the parser still reading the doc?"
    assert not problems, (
        "docs/architecture.md names modules or files that do not exist; rename or drop them "
        "in the doc (the module table, the prose and the diagrams):\n  " + "\n  ".join(problems)
    )


def test_the_doc_layers_are_the_layer_tests() -> None:
    documented = doc_layers(DOC.read_text(encoding="utf-8"))
    layer_test = _layer_test()
    assert sorted(documented) == sorted(LAYER_LISTS), (
        f"docs/architecture.md has layer blocks for {sorted(documented)}, "
        f"expected one `<!-- layers PACKAGE -->` block for each of {sorted(LAYER_LISTS)}"
    )
    wrong = []
    for package, variable in LAYER_LISTS.items():
        enforced: Layers = getattr(layer_test, variable)
        difference = layer_difference(package, documented[package], enforced)
        if difference:
            wrong.append(
                f"{package} (tests/unit/test_layers.py {variable}): "
                + "; ".join(difference)
                + "\nReplace the doc's block with (comments after `#` may be kept):\n"
                + layer_block(package, enforced)
            )
    assert not wrong, "docs/architecture.md's layers differ from the layer test:\n\n" + (
        "\n\n".join(wrong)
    )


def test_the_checks_catch_a_stale_doc(tmp_path: Path) -> None:
    """A check that never fails guards nothing: plant stale names and a moved layer."""
    src = tmp_path / "src"
    for module, source in {
        "llmop/__init__.py": "",
        "llmop/kept.py": "from llmop import other\nTABLE = ()\n",
        "llmop/render/__init__.py": "",
        "llmop/render/deployment.py": "def render() -> None: ...\n",
    }.items():
        (src / module).parent.mkdir(parents=True, exist_ok=True)
        (src / module).write_text(source)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "here.md").write_text("")
    text = "\n".join(
        [
            "`llmop/kept.py` and `llmop.kept.TABLE`, `llmop.kept.other`",
            "`llmop/render/deployment.py`, `deployment.py`; `llmop.render.deployment.render`",
            "[here](here.md) [web](https://example.com) `serving.llmop.dev/v1alpha1` `/healthz`",
            "`llmop/gone.py`, `llmop.render.gone` `llmop.kept.NOTHING` `nowhere.py` [x](gone.md)",
            "`llmop/render/deployment.py` and next to it `kept.py`",
        ]
    )
    problems, checked = missing_references(text, tmp_path, {"llmop": src})
    assert checked == 14
    assert [p.split(":")[0] for p in problems] == ["line 4"] * 5 + ["line 5"], problems
    assert "llmop.render has no module or name 'gone'" in problems[0]
    assert "llmop.kept has no module or name 'NOTHING'" in problems[1]
    assert "src/llmop/gone.py does not exist" in problems[2]
    assert "`nowhere.py`: no such file in any package" in problems[3]
    assert "link (gone.md) leads nowhere" in problems[4]
    assert "`kept.py`: no such file in src/llmop/render" in problems[5]

    layers = (("llmop.api",), ("llmop.render", "llmop.sizing"), ("llmop.reconcile",))
    block = layer_block("llmop", layers).replace("render | sizing", "sizing |  # any order\nrender")
    assert layer_difference("llmop", doc_layers(block)["llmop"], layers) == []
    moved = block.replace("sizing | render", "sizing").replace("reconcile", "reconcile | render")
    difference = layer_difference("llmop", doc_layers(moved)["llmop"], layers)
    assert difference == ["llmop.render: in the doc's layer 3, the test's layer 2"]
    dropped = block.replace("reconcile\n", "").replace("api\n", "api | gone\n")
    assert layer_difference("llmop", doc_layers(dropped)["llmop"], layers) == [
        "the doc has 2 layers, the test 3",
        "llmop.gone: not in the test (gone or renamed?)",
        "llmop.reconcile: missing from the doc",
    ]
