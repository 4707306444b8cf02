"""Reading a request's body within the router's limits, and parsing it off the event loop.

The body is read chunk by chunk, never more than `max_body_bytes`: a Content-Length past it is
answered 413 before a byte of the body is read, a chunked body as soon as it passes it. A body
that pauses longer than `body_idle_timeout`, or takes longer than `body_timeout` in all (a body
trickled a byte at a time), is answered 408 and its connection closed. Every refusal is an
OpenAI-shaped JSON error.

Parsing (`body.scan`) is bounded work whatever the body's shape; bodies past `INLINE_BYTES`
are scanned on a small thread pool, so the event loop gets the interpreter back between the
scan's steps and at most `PARSE_THREADS` bodies are being parsed at once (what parsing holds in
memory stays bounded however many such requests arrive together).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

from llmop_router.answers import error
from llmop_router.body import Refusal, scan
from llmop_router.limits import Limits
from llmop_router.prefix import RoutingInfo

INLINE_BYTES = 64 * 1024
"""Bodies up to this are scanned on the event loop: well under a millisecond, less than the
hop to a thread costs. Nearly every chat request is this small."""
PARSE_THREADS = 2


class Intake:
    """Reads and parses request bodies within `limits`."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._pool: ThreadPoolExecutor | None = None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    async def read(self, request: web.Request) -> bytes | web.StreamResponse:
        """The whole body, or the refusal to answer (413, 408: the connection then closes)."""
        limits = self.limits
        declared = request.content_length
        if declared is not None and declared > limits.max_body_bytes:
            return too_large(declared, limits)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limits.body_timeout
        chunks: list[bytes] = []
        size = 0
        while True:
            left = deadline - loop.time()
            wait = min(limits.body_idle_timeout, left)
            try:
                if wait <= 0:
                    raise TimeoutError
                async with asyncio.timeout(wait):
                    chunk = await request.content.readany()
            except TimeoutError:
                whole = wait == left
                return await timed_out(request, size, whole, limits)
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > limits.max_body_bytes:
                return too_large(size, limits, partial=True)
            chunks.append(chunk)

    async def parse(self, body: bytes) -> RoutingInfo | web.Response:
        """The routing head, or the refusal (400, 413) saying what is wrong with the body."""
        if len(body) <= INLINE_BYTES:
            found = scan(body, self.limits)
        else:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(PARSE_THREADS, thread_name_prefix="parse")
            loop = asyncio.get_running_loop()
            found = await loop.run_in_executor(self._pool, scan, body, self.limits)
        if isinstance(found, Refusal):
            return error(found.status, found.message, found.kind)
        return found


def too_large(size: int, limits: Limits, *, partial: bool = False) -> web.Response:
    """413; the connection closes (aiohttp still discards what the client sends for a few
    seconds, so that the client reads this answer rather than a reset)."""
    seen = f"more than {limits.max_body_bytes}" if partial else f"{size}"
    message = (
        f"the request body has {seen} bytes; this router takes at most {limits.max_body_bytes} "
        f"(--max-body-bytes)"
    )
    response = error(413, message, "PayloadTooLargeError")
    response.force_close()
    return response


async def timed_out(
    request: web.Request, size: int, whole: bool, limits: Limits
) -> web.StreamResponse:
    """408, sent now, and the connection closed at once: a client that trickles its body must
    not hold it open while aiohttp would discard the rest."""
    if whole:
        why = f"the whole body took more than {limits.body_timeout:g} s (--body-timeout)"
    else:
        why = f"no byte came for {limits.body_idle_timeout:g} s (--body-idle-timeout)"
    response = error(
        408,
        f"the request body was not sent in time: {why}; {size} bytes came",
        "RequestTimeoutError",
    )
    response.force_close()
    await response.prepare(request)
    await response.write_eof()
    request.protocol.force_close()
    return response
