"""`LLMPriorityClass` objects as the router reads them (`llmop_router.priorities`): defaults,
bounds named with the field, the global default (the lowest value when several claim it), a
tenant naming a class that does not exist (the default, and its status says so), and a request
that may move down a class, never up."""

from __future__ import annotations

from typing import Any

import pytest

from llmop_router.priorities import (
    DEFAULT,
    Classes,
    PriorityClass,
    PriorityClassError,
    parse_priority_class,
)
from llmop_router.tenant_status import UNKNOWN_PRIORITY_CLASS, conditions_of
from llmop_router.tenants import Directory, parse_tenant


def doc(name: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": spec}


def test_a_class_reads_its_fields_and_defaults() -> None:
    assert parse_priority_class(doc("standard", value=0)) == PriorityClass("standard")
    full = parse_priority_class(
        doc(
            "batch",
            value=-5,
            sheddable=True,
            maxSharePercent=75,
            queue={"maxWaitSeconds": 10, "maxRequests": 64},
            globalDefault=True,
        )
    )
    assert full == PriorityClass("batch", -5, True, 75, 10.0, 64, global_default=True)


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ({"value": "high"}, "spec.value must be a whole number"),
        ({"value": 1, "maxSharePercent": 0}, "spec.maxSharePercent must be a whole number from 1"),
        ({"value": 1, "queue": {"maxWaitSeconds": 0}}, "spec.queue.maxWaitSeconds"),
        ({"value": 1, "queue": []}, "spec.queue must be an object"),
        ({"value": 1, "sheddable": "yes"}, "spec.sheddable must be true or false"),
    ],
)
def test_a_bad_class_is_refused_naming_the_field(spec: dict[str, Any], named: str) -> None:
    with pytest.raises(PriorityClassError, match="LLMPriorityClass c: ") as raised:
        parse_priority_class(doc("c", **spec))
    assert named in str(raised.value)


def test_the_default_is_the_lowest_global_default_else_value_0() -> None:
    assert Classes.of(()).default == DEFAULT
    classes = Classes.of(
        [
            PriorityClass("high", 10, global_default=True),
            PriorityClass("low", -1, global_default=True),
            PriorityClass("chat", 100),
        ]
    )
    assert classes.default.name == "low"
    assert classes.of_tenant(None).name == "low"
    assert classes.of_tenant("chat").name == "chat"
    assert classes.of_tenant("gone").name == "low"
    assert classes.missing("gone")
    assert not classes.missing(None)


def test_a_request_may_move_down_or_across_never_up() -> None:
    classes = Classes.of([PriorityClass("chat", 100), PriorityClass("batch", 0)])
    chat = classes.of_tenant("chat")
    assert classes.lowered(chat, "batch") == classes.by_name["batch"]
    assert classes.lowered(chat, "chat") == chat
    refused = classes.lowered(classes.by_name["batch"], "chat")
    assert isinstance(refused, str)
    assert "may only lower its priority" in refused
    assert classes.lowered(chat, "nope") == "no LLMPriorityClass is named 'nope'"


def test_a_tenant_naming_a_missing_class_says_so_in_its_status() -> None:
    tenant = parse_tenant(doc("t", priorityClassName="gold"))
    directory = Directory.of([tenant])
    classes = Classes.of([PriorityClass("standard", 0, global_default=True)])
    found = {c[0]: c for c in conditions_of("t", directory, None, [], 0.0, classes=classes)}
    _, holds, reason, message = found[UNKNOWN_PRIORITY_CLASS]
    assert (holds, reason) == (True, "NotFound")
    assert "no LLMPriorityClass 'gold'" in message
    assert "get LLMPriorityClass 'standard'" in message
    created = Classes.of([*classes.by_name.values(), PriorityClass("gold", 50)])
    found = {c[0]: c for c in conditions_of("t", directory, None, [], 0.0, classes=created)}
    assert found[UNKNOWN_PRIORITY_CLASS][1:3] == (False, "Found")
