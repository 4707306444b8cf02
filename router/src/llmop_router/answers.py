"""How the router answers when it cannot relay an engine's answer: an OpenAI-shaped JSON error,
or, once a held stream's 200 headers went out, the same error as one SSE event
(`event: error` with the OpenAI error object as its data); the SSE response a held stream
gets its heartbeats in; and the headers of a request or an answer that go on through the router
(`forwarded_headers`; to and from an API outside the cluster, `external_request_headers` and
`external_answer_headers`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from http import HTTPStatus
from typing import Final

from aiohttp import web
from multidict import CIMultiDict


def error_body(status: int, message: str, kind: str, code: str | None = None) -> dict[str, object]:
    """The OpenAI error object (`code`: OpenAI's own, e.g. `rate_limit_exceeded`; else the
    status)."""
    return {"error": {"message": message, "type": kind, "code": code or status}}


def error(
    status: int,
    message: str,
    kind: str,
    headers: Mapping[str, str] | None = None,
    *,
    code: str | None = None,
) -> web.Response:
    """An OpenAI-shaped JSON error."""
    return web.json_response(
        error_body(status, message, kind, code), status=status, headers=headers
    )


def raw_error(
    status: int, message: str, kind: str, headers: Mapping[str, str] | None = None
) -> bytes:
    """The same error as a whole HTTP/1.1 response that closes its connection, for a socket
    that never reached the HTTP server (refused at accept, or its headers never ended)."""
    body = json.dumps(error_body(status, message, kind)).encode()
    lines = [
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
        "Content-Type: application/json; charset=utf-8",
        f"Content-Length: {len(body)}",
        "Connection: close",
        *(f"{name}: {value}" for name, value in (headers or {}).items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


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


UNAVAILABLE_RETRY_AFTER: Final = "5"
"""`Retry-After` of a 503 for a model that cannot answer now (no ready replica, none reached)."""

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)


def forwarded_headers(headers: Mapping[str, str]) -> CIMultiDict[str]:
    """End-to-end headers (Authorization included: the engine checks its API key)."""
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in HOP_BY_HOP)


EXTERNAL_REQUEST_HEADERS: Final = frozenset({"content-type", "accept", "x-request-id"})
"""The client's headers an API outside the cluster gets: what the request needs, nothing that
says who the client is or how the platform is built (cookies, forwarding and tracing headers,
the client's own `OpenAI-Organization`); the gateway's key is added, the tenant's never goes."""
EXTERNAL_ANSWER_HEADERS: Final = frozenset(
    {"content-type", "content-encoding", "cache-control", "retry-after", "retry-after-ms", "date"}
)
"""A provider's answer headers a client gets. Left out: its cookies, the platform's account
(`openai-organization`, `openai-project`), the provider's rate limits for the platform's key
(`x-ratelimit-*`, which would contradict the gateway's own), its request id and server
details."""


def external_request_headers(headers: Mapping[str, str], key: str | None) -> CIMultiDict[str]:
    """What goes to an external model: `EXTERNAL_REQUEST_HEADERS` of the client's, the model's
    own key, and `Accept-Encoding: identity` (the gateway meters the answer's bytes as they
    come, so they must not be compressed)."""
    sent = CIMultiDict((k, v) for k, v in headers.items() if k.lower() in EXTERNAL_REQUEST_HEADERS)
    sent["Accept-Encoding"] = "identity"
    sent["User-Agent"] = "llmop-router"
    if key is not None:
        sent["Authorization"] = f"Bearer {key}"
    return sent


def external_answer_headers(headers: Mapping[str, str]) -> CIMultiDict[str]:
    """What a client gets of an external model's answer headers (`EXTERNAL_ANSWER_HEADERS`)."""
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() in EXTERNAL_ANSWER_HEADERS)
