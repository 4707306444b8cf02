"""Redis's wire protocol (RESP2), the few parts the gateway's store pipe uses: commands packed
into one buffer, and replies parsed from whatever bytes have arrived (values in, values out).

The pipe reads replies in its connection's `data_received` callback and hands each to the
request waiting for it there, without the client library's reader task and parser layers: under
load each hop through the event loop costs a request a millisecond or more of its time to first
token (docs/benchmarks.md, the gateway benchmark's H).
"""

from __future__ import annotations

from typing import Any

MAX_BULK_BYTES = 64 * 1024 * 1024
"""A bulk reply longer than this is a broken stream (the pipe's replies are short strings)."""


class ReplyError(Exception):
    """An error reply (`-ERR …`): the command failed; the connection is fine."""

    @property
    def no_script(self) -> bool:
        """The server does not know the script (it restarted, or its cache was flushed)."""
        return str(self).startswith("NOSCRIPT")


class ProtocolError(Exception):
    """Bytes that are not RESP: the connection cannot be trusted any more."""


def pack(commands: list[tuple[Any, ...]]) -> bytes:
    """Commands as RESP, in one buffer. Arguments are only ever `str` and `int` here."""
    out = []
    for args in commands:
        out.append(b"*%d\r\n" % len(args))
        for arg in args:
            data = arg.encode() if isinstance(arg, str) else b"%d" % arg
            out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


class Parser:
    """Replies from a byte stream: `feed` the bytes as they come, take the complete replies.
    An error reply is a `ReplyError` value (not raised): it answers one command."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        self._buffer += data
        replies: list[Any] = []
        position = 0
        while True:
            parsed = _reply(self._buffer, position)
            if parsed is None:
                break
            reply, position = parsed
            replies.append(reply)
        del self._buffer[:position]
        return replies


def _reply(buffer: bytearray, start: int) -> tuple[Any, int] | None:
    """The reply at `start` and where the next begins; None while it is incomplete."""
    end = buffer.find(b"\r\n", start)
    if end < 0:
        return None
    kind, line, after = buffer[start], bytes(buffer[start + 1 : end]), end + 2
    if kind == ord("+"):
        return line.decode(), after
    if kind == ord("-"):
        return ReplyError(line.decode(errors="replace")), after
    if kind == ord(":"):
        return int(line), after
    if kind == ord("$"):
        return _bulk(buffer, int(line), after)
    if kind == ord("*"):
        return _array(buffer, int(line), after)
    raise ProtocolError(f"a reply starting with {bytes([kind])!r}")


def _bulk(buffer: bytearray, size: int, start: int) -> tuple[Any, int] | None:
    if size < 0:
        return None, start
    if size > MAX_BULK_BYTES:
        raise ProtocolError(f"a bulk reply of {size} bytes")
    if len(buffer) < start + size + 2:
        return None
    return bytes(buffer[start : start + size]).decode(errors="replace"), start + size + 2


def _array(buffer: bytearray, count: int, start: int) -> tuple[Any, int] | None:
    if count < 0:
        return None, start
    items = []
    position = start
    for _ in range(count):
        parsed = _reply(buffer, position)
        if parsed is None:
            return None
        item, position = parsed
        items.append(item)
    return items, position
