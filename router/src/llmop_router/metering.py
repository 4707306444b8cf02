"""Pure: how many tokens an answer used, read from the answer itself as it is relayed.

An engine reports `usage` (prompt, completion and cached tokens) at the end of a JSON answer,
and in a stream only when asked (`stream_options.include_usage`): the gateway asks for it in
every stream and, when the client did not, removes that last usage-only event before the
client sees it, so the client gets exactly the answer it asked for. A stream the client
abandons has no usage: it is charged its prompt estimate and one token per content event
relayed (vLLM sends one event per token step), and counted as not exact.
"""

from __future__ import annotations

import json
import re
from typing import Any

from llmop_router.quota import Usage

USAGE = re.compile(rb'"usage"\s*:\s*(\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\})')
"""A `usage` object (it nests one level: `prompt_tokens_details`)."""
TAIL_BYTES = 8192
"""What is kept of a JSON answer to find its `usage` (it comes last, after the choices)."""
EVENT_END = b"\n\n"


USAGE_OPTION = b'"stream_options":{"include_usage":true}'


def with_model(body: bytes, model: str) -> bytes:
    """The body with its `model` set to `model` (a fallback answers it under its own name)."""
    parsed: dict[str, Any] = json.loads(body)
    parsed["model"] = model
    return json.dumps(parsed, separators=(",", ":")).encode()


def with_usage_requested(body: bytes) -> bytes:
    """The body with `stream_options.include_usage: true` (the engine then sends usage).

    `body` is a JSON object (`body.scan` parsed it). Without `stream_options` the member is
    appended to its bytes, with no second parse; a body that has one, or has `\\u` escapes
    (which could spell the name so a byte search misses it), is parsed and written again."""
    if b'"stream_options"' not in body and b"\\u" not in body:
        end = body.rstrip()
        if end.endswith(b"}"):
            return end[:-1] + b"," + USAGE_OPTION + b"}"
    parsed: dict[str, Any] = json.loads(body)
    options = parsed.get("stream_options")
    options = dict(options) if isinstance(options, dict) else {}
    options["include_usage"] = True
    parsed["stream_options"] = options
    return json.dumps(parsed, separators=(",", ":")).encode()


def usage_of(document: object) -> Usage | None:
    if not isinstance(document, dict):
        return None
    prompt = document.get("prompt_tokens")
    completion = document.get("completion_tokens", 0)
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None
    details = document.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Usage(prompt, completion, cached if isinstance(cached, int) else 0)


class Tap:
    """Watches one answer go by; `feed` returns what to send on to the client."""

    def __init__(self, *, stream: bool, strip_usage: bool) -> None:
        self.stream = stream
        self.strip_usage = strip_usage and stream
        self.events = 0
        """Content events relayed (`data:` events other than the usage one and `[DONE]`)."""
        self.usage: Usage | None = None
        self.status: int | None = None
        """The engine's status, once its answer started (the proxy sets it)."""
        self.first_byte: float | None = None
        """When its first byte came (`time.monotonic`)."""
        self._pending = b""
        self._tail = b""

    def feed(self, chunk: bytes) -> bytes:
        if not self.stream:
            self._tail = (self._tail + chunk)[-TAIL_BYTES:]
            return chunk
        data = self._pending + chunk if self._pending else chunk
        end = data.rfind(EVENT_END)
        if end < 0:
            if self.strip_usage:
                self._pending = data
                return b""
            self._pending = data[-TAIL_BYTES:]
            return chunk
        cut = end + 2
        if cut == len(data):  # the usual chunk: whole events (no copy)
            complete, self._pending = data, b""
        else:
            complete, self._pending = data[:cut], data[cut:]
        if not self.strip_usage:
            self._scan(complete)
            return chunk
        return self._scan(complete)

    def _scan(self, complete: bytes) -> bytes:
        """Count the events; find the usage one (and leave it out when stripping)."""
        if b'"usage"' not in complete:
            self.events += complete.count(b"data: {") + complete.count(b"data:{")
            return complete
        kept = []
        for event in complete.split(EVENT_END):
            if not event:
                continue
            usage = self._usage_event(event)
            if usage is None:
                if event.lstrip().startswith(b"data:") and b"[DONE]" not in event:
                    self.events += 1
                kept.append(event + EVENT_END)
                continue
            self.usage = usage
            if not self.strip_usage:
                kept.append(event + EVENT_END)
        return b"".join(kept)

    @staticmethod
    def _usage_event(event: bytes) -> Usage | None:
        """The usage of a usage-only event (no choices left), else None."""
        text = event.strip()
        if not text.startswith(b"data:"):
            return None
        try:
            parsed = json.loads(text[5:])
        except ValueError:
            return None
        if not isinstance(parsed, dict) or parsed.get("choices"):
            return None
        return usage_of(parsed.get("usage"))

    def finish(self) -> bytes:
        """What is left to send when the answer ended (an event without its blank line)."""
        left, self._pending = self._pending, b""
        if not self.stream:
            found = USAGE.findall(self._tail)
            if found:
                try:
                    self.usage = usage_of(json.loads(found[-1]))
                except ValueError:
                    self.usage = None
            return b""
        return left if self.strip_usage else b""

    def used(self, prompt_estimate: int) -> Usage:
        """The answer's usage, or an estimate for one that ended without it."""
        if self.usage is not None:
            return self.usage
        return Usage(prompt_estimate, self.events, exact=False)
