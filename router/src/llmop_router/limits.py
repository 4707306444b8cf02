"""The router's bounds on what clients send and on what it keeps for them (docs/router.md,
"Limits"): one frozen value, its command-line flags, and nothing else (no I/O).

Every bound is per router pod. The input bounds keep one client from stalling the event loop or
growing the pod's memory (a body's bytes, its JSON values and nesting, how long its headers and
body may take, how many connections are open); the state bounds keep requests for CRs at zero,
and requests waiting for a saturated model's slot, from piling up across CRs (each CR's own
`maxPendingRequests` still applies)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

MIB = 1024 * 1024


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 4 * MIB
    """A body past this is answered 413 (by its Content-Length before any of it is read, or as
    soon as a chunked one passes it). 4 MiB holds a 1M-token prompt's text."""
    max_body_values: int = 256 * 1024
    """JSON values (arrays, objects, strings, numbers, keys) a body may hold: what parsing it can
    cost (about 80 bytes a value at worst: ~20 MiB) stays bounded whatever its shape. A
    128k-token prompt given as token ids is 128k values."""
    max_body_depth: int = 64
    """Arrays and objects nested deeper than this are answered 400 (OpenAI requests nest a few
    levels; a tool's JSON schema a few more)."""
    header_timeout: float = 15.0
    """Seconds from a request's first byte to the end of its headers; then the connection is
    closed (nginx's client_header_timeout)."""
    body_idle_timeout: float = 30.0
    """Seconds the body may go without a byte; then 408 and the connection is closed."""
    body_timeout: float = 120.0
    """Seconds the whole body may take (a body trickled a byte at a time ends here): 408."""
    keepalive_timeout: float = 75.0
    """Seconds an idle kept-alive connection stays open (nginx's default)."""
    max_connections: int = 4096
    """Open client connections per router pod; past it a new one is answered 503 and closed."""
    max_held_requests: int = 10_000
    """Requests held for CRs at zero, all CRs together; past it: 429 with Retry-After."""
    max_held_bytes: int = 64 * MIB
    """Bytes of held requests' bodies, all CRs together; past it: 429 with Retry-After."""
    max_queued_requests: int = 10_000
    """With the gateway: requests waiting for a slot of a saturated model, all models
    together; past it a newcomer displaces a waiting request of a lower priority, or is
    answered 429 with Retry-After."""
    max_queued_bytes: int = 64 * MIB
    """Bytes of those requests' bodies, all models together (as `max_queued_requests`)."""
    queue_wait_seconds: float = 30.0
    """Seconds a request may wait for a slot; then 429 with Retry-After (503 when the model
    has no ready endpoint left)."""


DEFAULT = Limits()


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value:g} must be more than 0 seconds")
    return value


FLAGS: tuple[tuple[str, str, str], ...] = (
    ("--max-body-bytes", "max_body_bytes", "a larger request body is answered 413"),
    ("--max-body-values", "max_body_values", "a body with more JSON values is answered 413"),
    ("--max-body-depth", "max_body_depth", "a body nested deeper is answered 400"),
    ("--header-timeout", "header_timeout", "seconds a request's headers may take, then close"),
    ("--body-idle-timeout", "body_idle_timeout", "seconds a body may pause, then 408"),
    ("--body-timeout", "body_timeout", "seconds a whole body may take, then 408"),
    ("--keepalive-timeout", "keepalive_timeout", "seconds an idle connection stays open"),
    ("--max-connections", "max_connections", "open connections; past it 503 and close"),
    ("--max-held-requests", "max_held_requests", "held requests, all CRs; past it 429"),
    ("--max-held-bytes", "max_held_bytes", "held bodies' bytes, all CRs; past it 429"),
    ("--max-queued-requests", "max_queued_requests", "requests waiting for a slot; past it 429"),
    ("--max-queued-bytes", "max_queued_bytes", "their bodies' bytes; past it 429"),
    ("--queue-wait-seconds", "queue_wait_seconds", "seconds a request may wait for a slot"),
)
"""Flag, field, what it bounds (the help text adds the default)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The bounds as `serve` flags (each names its default in its help)."""
    group = parser.add_argument_group("limits (per router pod; docs/router.md, Limits)")
    for flag, field_name, help_text in FLAGS:
        default = getattr(DEFAULT, field_name)
        kind = _positive_int if isinstance(default, int) else _positive_seconds
        group.add_argument(
            flag,
            dest=field_name,
            type=kind,
            default=default,
            help=f"{help_text} (default {default})",
        )


def from_args(args: argparse.Namespace) -> Limits:
    """The bounds `add_arguments` parsed."""
    return Limits(**{field_name: getattr(args, field_name) for _, field_name, _ in FLAGS})
