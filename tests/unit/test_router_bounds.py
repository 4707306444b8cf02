"""The router's pure bounds: a body's values and nesting are measured before it is parsed
(`body.scan`), and held requests are capped across CRs by count and bytes (`hold.Holding`)."""

from __future__ import annotations

import argparse
import json

import pytest

from llmop_router import limits as limits_module
from llmop_router.body import Refusal, count_values, deeper_than, scan
from llmop_router.hold import Holding, ScaleToZero
from llmop_router.limits import Limits
from llmop_router.prefix import RoutingInfo, routing_info

SMALL = Limits(max_body_values=100, max_body_depth=4)


def chat(content: object) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": content}]}).encode()


def test_a_body_within_the_bounds_routes_as_before() -> None:
    body = chat("plan a trip [to] {Lisbon}, please: " * 50)
    found = scan(body, SMALL)
    assert isinstance(found, RoutingInfo)
    assert found == routing_info(body)


def test_values_are_counted_without_the_strings() -> None:
    # 600 commas and brackets inside a string are text, not values.
    assert isinstance(scan(chat("[],{}:" * 100), SMALL), RoutingInfo)
    assert count_values(b'[1,[2,3],{"a":4}]') == 8  # an upper bound: keys count, as they cost
    refused = scan(chat([[] for _ in range(200)]), SMALL)
    assert isinstance(refused, Refusal)
    assert refused.status == 413
    assert "--max-body-values" in refused.message


@pytest.mark.parametrize(("depth", "refused"), [(4, False), (5, True), (5000, True)])
def test_nesting_past_the_limit_is_refused(depth: int, refused: bool) -> None:
    nested = b"[" * (depth - 1) + b"]" * (depth - 1)  # in the object: `depth` levels
    body = b'{"model":"m","messages":' + nested + b"}"
    found = scan(body, Limits(max_body_depth=4))
    assert isinstance(found, Refusal) == refused
    if refused:
        assert isinstance(found, Refusal)
        assert found.status == 400
        assert "deeper than 4 levels" in found.message


def test_brackets_in_strings_are_not_depth() -> None:
    assert not deeper_than(b'["[[[[[[[[[["]', 4)
    assert isinstance(scan(chat("[[[[[[[[[[[[]]]]]]]]]]]]"), SMALL), RoutingInfo)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b'{"model": "m", "messages": [', "not valid JSON: Expecting value: line 1 column 29"),
        (b"\xff\xfe{", "not valid JSON"),
        (b'{"model": "m"} trailing', "not valid JSON: Extra data"),
        (b"[" * 5000, "deeper than"),
        (b"42", "is a JSON number, not an object"),
        (b'{"model": 7}', 'has no "model" (a string)'),
        (b"  ", "the request body is empty"),
    ],
)
def test_bad_bodies_say_what_is_wrong(body: bytes, says: str) -> None:
    found = scan(body, Limits(max_body_depth=40))
    assert isinstance(found, Refusal)
    assert found.status == 400
    assert says in found.message


def test_held_requests_are_capped_across_crs_by_count_and_bytes() -> None:
    holding = Holding(max_held=3, max_held_bytes=1000)
    settings = ScaleToZero(hold_timeout_seconds=10, max_pending_requests=2)
    a, b, c = ("team", "a"), ("team", "b"), ("team", "c")
    assert holding.admit(a, 0, settings, 100).held is not None
    assert holding.admit(a, 0, settings, 100).held is not None
    assert holding.admit(a, 0, settings, 100).refused == "full"  # the CR's own cap first
    assert holding.admit(b, 0, settings, 900).refused == "router-full"  # 1100 bytes
    assert not holding.holding(b)  # a refused request leaves no episode behind
    assert holding.admit(b, 0, settings, 800).held is not None
    assert holding.admit(c, 0, settings, 0).refused == "router-full"  # 3 held
    assert (holding.total, holding.total_bytes) == (3, 1000)
    # Every way out gives the room back.
    released = holding.release(a, {}, ["10.0.0.1:8000"], concurrency=1)
    assert len(released) == 1
    assert (holding.total, holding.total_bytes) == (2, 900)
    assert len(holding.expire(a, now=20)) == 1
    assert (holding.total, holding.total_bytes) == (1, 800)
    ticket = holding.admit(c, 0, settings, 50).held
    assert ticket is not None
    holding.leave(c, ticket.ticket)
    assert (holding.total, holding.total_bytes) == (1, 800)
    holding.take_all()
    assert (holding.total, holding.total_bytes) == (0, 0)


def test_the_limits_are_flags_that_refuse_nonsense() -> None:
    parser = argparse.ArgumentParser()
    limits_module.add_arguments(parser)
    parsed = limits_module.from_args(parser.parse_args(["--max-body-bytes", "1024"]))
    assert parsed == Limits(max_body_bytes=1024)
    for bad in (["--max-body-bytes", "0"], ["--header-timeout", "-1"], ["--max-held-bytes", "x"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)
