"""Pure: a request body → its routing head, with work and memory bounded before any parse.

`json.loads` of a body builds every value in it: 4 MiB of `[],[],…` is 1.4 million lists
(~110 MiB) and 5,000 levels of `[[[…` end in a RecursionError. So the body is first measured
with a few passes of C-speed byte operations, none building more than one copy of the body:

1. its values are counted (each value follows `[`, `{`, `,` or `:`, or is the whole body: an
   upper bound, exact for valid JSON once strings are left out); past `max_body_values` the
   strings are replaced by one byte each (`STRING`) and the values counted again from what is
   left, the body's structure; still past it: refused (413);
2. its nesting is measured by removing innermost `[]` pairs, one level a pass, at most
   `max_body_depth` passes; still reducible after that (with strings left out): refused (400).

Only then is it parsed, and the routing head taken from it (`prefix.routing_of`). A body that
is not valid JSON, not an object or names no `model` is refused (400) saying what is wrong.
The regular expression follows JSON's own string grammar, so up to the first error of an
invalid body it sees the same strings as the parser: what the parser builds before failing is
counted too.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from llmop_router.limits import Limits
from llmop_router.prefix import RoutingInfo, routing_of

STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
"""A JSON string (its escapes included), written so the engine never backtracks."""
_OPENERS_AS_BRACKETS = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(range(256)).translate(None, b"[]{}")
MODELS_HINT = "GET /v1/models lists the models"
JSON_TYPES: dict[type, str] = {
    list: "array",
    str: "string",
    int: "number",
    float: "number",
    bool: "boolean",
    type(None): "null",
}


@dataclass(frozen=True)
class Refusal:
    """Why a body is not routed: an HTTP status, an OpenAI error type, and what to fix."""

    status: int
    message: str
    kind: str = "BadRequestError"


def count_values(structure: bytes) -> int:
    """An upper bound on the JSON values (keys included) in a body whose strings were replaced."""
    return sum(structure.count(c) for c in (b",", b":", b"[", b"{")) + 1


def deeper_than(structure: bytes, depth: int) -> bool:
    """Whether arrays and objects nest more than `depth` levels. Unbalanced brackets (invalid
    JSON) are not counted as depth: the parser names them."""
    brackets = structure.translate(_OPENERS_AS_BRACKETS, _NOT_BRACKETS)
    for _ in range(depth):
        reduced = brackets.replace(b"[]", b"")
        if reduced == brackets:
            return False
        brackets = reduced
    return b"[]" in brackets


def scan(body: bytes, limits: Limits) -> RoutingInfo | Refusal:
    """The routing head of `body`, or why it is refused."""
    if not body.strip():
        return Refusal(400, 'the request body is empty: send a JSON object with "model"')
    # The raw body's counts are upper bounds (brackets and commas inside strings count too):
    # within the limits, nothing is stripped; else the strings are, and the counts taken again.
    structure = body
    values = count_values(structure)
    if values > limits.max_body_values:
        structure = STRING.sub(b"0", body)
        values = count_values(structure)
    if values > limits.max_body_values:
        return Refusal(
            413,
            f"the request body holds about {values} JSON values, more than this router's "
            f"{limits.max_body_values} (--max-body-values): send fewer, longer strings",
            "PayloadTooLargeError",
        )
    if deeper_than(structure, limits.max_body_depth) and (
        structure is not body or deeper_than(STRING.sub(b"0", body), limits.max_body_depth)
    ):
        return Refusal(400, too_deep(limits))
    del structure
    try:
        parsed = json.loads(body)
    except RecursionError:
        # Unclosed `[[[[…` (not counted as depth above): the parser's stack ends first.
        return Refusal(400, too_deep(limits))
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        return Refusal(400, f"the request body is not valid JSON: {exc}")
    if not isinstance(parsed, dict):
        found = JSON_TYPES.get(type(parsed), "value")
        return Refusal(400, f'the request body is a JSON {found}, not an object with "model"')
    model = parsed.get("model")
    if not isinstance(model, str) or not model:
        return Refusal(400, f'the request body has no "model" (a string): {MODELS_HINT}')
    return routing_of(parsed)


def too_deep(limits: Limits) -> str:
    return (
        f"the request body nests arrays and objects deeper than {limits.max_body_depth} levels "
        f"(--max-body-depth)"
    )
