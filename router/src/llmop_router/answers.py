"""How the router answers when it cannot relay an engine's answer: an OpenAI-shaped JSON error,
or, once a held stream's 200 headers went out, the same error as one SSE event
(`event: error` with the OpenAI error object as its data); and the SSE response a held stream
gets its heartbeats in."""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web


def error(
    status: int, message: str, kind: str, headers: Mapping[str, str] | None = None
) -> web.Response:
    """An OpenAI-shaped JSON error."""
    body = {"error": {"message": message, "type": kind, "code": status}}
    return web.json_response(body, status=status, headers=headers)


def error_event(body: bytes) -> bytes:
    """An error (a JSON body) as one SSE event."""
    return b"event: error\ndata: " + body + b"\n\n"


async def send_error_event(prepared: web.StreamResponse, response: web.Response) -> bool:
    """Write `response`'s JSON error into a stream whose headers were sent, and end it; False
    when the client went away meanwhile."""
    assert isinstance(response.body, bytes)
    try:
        await prepared.write(error_event(response.body))
        await prepared.write_eof()
    except ConnectionResetError:
        return False
    return True


async def prepare_stream(request: web.Request) -> web.StreamResponse:
    """A 200 SSE response with its headers sent (a held stream's heartbeats go into it)."""
    response = web.StreamResponse(
        status=200,
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
    )
    response.headers["X-Accel-Buffering"] = "no"
    await response.prepare(request)
    return response
