"""Faults of one request at a chosen token, for migration tests and benches.

Chosen per request with the `X-Sim-Fault` header, or for every request that has none with
`POST /sim/fault {"requestFault": SPEC}` or `--sim-request-fault SPEC` (an empty SPEC clears it).
SPEC is one or more `KIND@WHERE`, comma-separated; the first to fire wins.

KIND, what the client sees once the stream has carried the chosen number of tokens:
- `crash`: the connection drops (the transport is closed, the chunked body never terminated), as
  when the engine's process or node dies;
- `hang`: nothing more is sent and the connection stays open until the client closes it (the
  engine is wedged; vLLM's /health would stay 200);
- `cut`: the stream ends cleanly early, as vLLM's engine abort (drain budget over, shutdown with
  `--shutdown-timeout 0`) ends it: a chunk with `finish_reason: "abort"` carrying any held-back
  text and no ids, the usage chunk when asked for, `[DONE]`;
- `error`: vLLM's in-band generation error (`finish_reason == "error"` in its engine):
  `data: {"error": {..., "type": "InternalServerError", "code": 500}}` then `[DONE]`.

WHERE:
- `N`: after N tokens of this request's output (every request carrying the header faults there);
- `ctx:N`: when the request's context (prompt + output) reaches N tokens, on a request whose
  prompt is shorter than N. A continuation sent as `prompt ids + the N - |prompt| ids received`
  starts at N and does not fault again, so a router that forwards the header to the next replica
  sees one fault per spec: `cut@ctx:40,crash@ctx:60` gives two migrations.
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("crash", "hang", "cut", "error")
HEADER = "X-Sim-Fault"


class RequestFaultError(ValueError):
    """A malformed fault spec."""


@dataclass(frozen=True)
class FaultAt:
    kind: str
    at: int
    in_context: bool = False
    """`at` counts the whole context (prompt + output), not this request's output."""

    def tokens_before(self, prompt_tokens: int) -> int | None:
        """Output tokens this request streams before the fault; None when it never fires."""
        if not self.in_context:
            return self.at
        if prompt_tokens >= self.at:
            return None
        return self.at - prompt_tokens


def parse(spec: str | None) -> tuple[FaultAt, ...]:
    if spec is None or not spec.strip():
        return ()
    out = []
    for part in spec.split(","):
        kind, sep, where = part.strip().partition("@")
        if not sep or kind not in KINDS:
            raise RequestFaultError(
                f"bad request fault {part.strip()!r}: KIND@N or KIND@ctx:N, KIND one of "
                f"{', '.join(KINDS)}"
            )
        in_context = where.startswith("ctx:")
        number = where.removeprefix("ctx:")
        if not number.isdigit():
            raise RequestFaultError(f"bad request fault {part.strip()!r}: N must be an integer")
        out.append(FaultAt(kind, int(number), in_context))
    return tuple(out)


def first(faults: tuple[FaultAt, ...], prompt_tokens: int) -> tuple[str, int] | None:
    """The fault this request meets first, as (kind, output tokens before it)."""
    fired = [
        (before, fault.kind)
        for fault in faults
        if (before := fault.tokens_before(prompt_tokens)) is not None
    ]
    if not fired:
        return None
    before, kind = min(fired, key=lambda item: item[0])
    return kind, before
