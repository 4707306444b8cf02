"""What the operator remembers of a parent is one record (`reconcile.context.ParentMemory`):
replaced whole, forgotten in one step, and reached only through `Context`'s methods."""

from __future__ import annotations

import ast
import dataclasses
from datetime import UTC, datetime
from pathlib import Path

import pytest

from llmop import reconcile
from llmop.config import OperatorConfig
from llmop.metrics import Metrics
from llmop.reconcile.context import NOTHING, ParentMemory
from support.source import parse_file

SRC = Path(__file__).resolve().parents[2] / "operator" / "src" / "llmop"
KEY = ("ns", "x")


def context() -> reconcile.Context:
    return reconcile.Context(
        kube=None,  # type: ignore[arg-type]  # never called here
        config=OperatorConfig(),
        metrics=Metrics(),
        instance="test",
    )


def test_forgetting_a_parent_drops_every_memory_of_it() -> None:
    ctx = context()
    full = ParentMemory(
        written=("u", {}),
        applied=("u", 1),
        downloading=True,
        fleet=(),
        group_restarts=("u", {}),
        deferred=("u", 1, datetime(2026, 1, 1, tzinfo=UTC)),
    )
    ctx.update(KEY, lambda _: full)
    ctx.update(("ns", "other"), lambda memory: dataclasses.replace(memory, applied=("v", 2)))
    assert ctx.recall(KEY) is full
    ctx.forget(*KEY)
    assert ctx.recall(KEY) is NOTHING
    assert [key for key, _ in ctx.memories()] == [("ns", "other")]


def test_a_record_left_empty_is_not_kept() -> None:
    """Clearing the last memory of a parent (or clearing one of a forgotten parent, which a
    worker still running may do) keeps no record."""
    ctx = context()
    ctx.update(KEY, lambda memory: dataclasses.replace(memory, downloading=True))
    ctx.update(KEY, lambda memory: dataclasses.replace(memory, downloading=False))
    assert ctx.memories() == []
    ctx.update(KEY, lambda memory: dataclasses.replace(memory, problem=None))
    assert ctx.memories() == []


def test_the_record_is_frozen() -> None:
    """Replaced whole (`Context.update`), never changed in place."""
    with pytest.raises(dataclasses.FrozenInstanceError):
        ParentMemory().downloading = True  # type: ignore[misc]


def test_no_module_reaches_into_the_contexts_private_attributes() -> None:
    """Only `reconcile/context.py` touches `Context`'s private attributes (`_memory`, ...)."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path == SRC / "reconcile" / "context.py":
            continue
        for node in ast.walk(parse_file(path)):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and isinstance(node.value, ast.Name)
                and node.value.id in ("ctx", "context")
            ):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}: {node.value.id}.{node.attr}")
    assert found == []
