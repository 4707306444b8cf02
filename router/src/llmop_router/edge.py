"""The router's listening socket with bounds aiohttp's server lacks: a cap on open connections
and a timeout on a request's headers.

aiohttp (3.14) reads headers for as long as a client sends them: its only timer is the
keep-alive one, which closes a connection idle since its start or its last answer. So every
connection's protocol is wrapped (`Guard`): past `max_connections` open ones a new connection
is answered 503 and closed before anything of it is read; and from the first byte of a
request, its headers get `header_timeout` seconds to end, else the client is answered 408 and
the connection closed. A kept-alive connection that sends nothing is closed by aiohttp after
`keepalive_timeout`. The body's own bounds are `intake`'s.

The guard knows a request's headers ended when aiohttp makes its request object (the server's
`request_factory`, wrapped), and that the request ended when the app's middleware returns.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, cast

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from llmop_router.answers import raw_error
from llmop_router.limits import Limits

log = logging.getLogger("llmop_router.edge")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Edge:
    """Open connections and their guards, for one listening socket."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.guards: dict[RequestHandler, Guard] = {}
        """Each open connection's guard, by aiohttp's protocol object of it."""
        self.refused = 0
        """Connections answered 503 at the cap (since start)."""
        self.header_timeouts = 0
        """Connections closed because their headers did not end in time (since start)."""
        self._full = raw_error(
            503,
            f"this router pod has {limits.max_connections} connections open "
            f"(--max-connections); retry",
            "ServiceUnavailableError",
            {"Retry-After": "1"},
        )
        self._slow = raw_error(
            408,
            f"the request's headers did not end within {limits.header_timeout:g} s "
            f"(--header-timeout)",
            "RequestTimeoutError",
        )

    @property
    def open(self) -> int:
        return len(self.guards)

    def factory(self, server: web.Server) -> Callable[[], asyncio.Protocol]:
        """The protocol factory of the listening socket: aiohttp's, guarded."""
        make_request = server.request_factory

        def request_factory(*args: Any) -> web.BaseRequest:
            request = make_request(*args)
            guard = self.guards.get(request.protocol)
            if guard is not None:
                guard.headers_ended()
            return request

        server.request_factory = request_factory
        return lambda: Guard(self, server())

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await handler(request)
        guard = self.guards.get(request.protocol)
        # The next bytes are the next request's headers only on a connection that stays open
        # and whose body was read whole; else aiohttp discards the rest of the body for a few
        # seconds (lingering) and closes, or its keep-alive timer bounds what follows.
        if guard is not None and response.keep_alive is not False and request.content.is_eof():
            guard.request_ended()
        return response


class Guard(asyncio.Protocol):
    """One connection: aiohttp's protocol behind the connection cap and the header timer."""

    def __init__(self, edge: Edge, inner: RequestHandler) -> None:
        self.edge = edge
        self.inner = inner
        self.transport: asyncio.Transport | None = None
        self.awaiting_headers = True
        """No request of this connection is between its headers' end and its answer."""
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but they are transports.
        transport = cast(asyncio.Transport, transport)
        edge = self.edge
        if edge.open >= edge.limits.max_connections:
            edge.refused += 1
            transport.write(edge._full)
            transport.close()
            return
        self.transport = transport
        edge.guards[self.inner] = self
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.transport is None:
            return  # refused at the cap: what it sends is dropped with it
        if self.awaiting_headers and self.timer is None:
            loop = asyncio.get_running_loop()
            self.timer = loop.call_later(self.edge.limits.header_timeout, self._headers_late)
        self.inner.data_received(data)

    def eof_received(self) -> None:
        if self.transport is not None:
            self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is None:
            return
        self._stop_timer()
        self.edge.guards.pop(self.inner, None)
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def headers_ended(self) -> None:
        self.awaiting_headers = False
        self._stop_timer()

    def request_ended(self) -> None:
        """The next bytes start the next request's headers (keep-alive)."""
        self.awaiting_headers = True

    def _stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _headers_late(self) -> None:
        self.timer = None
        if not self.awaiting_headers or self.transport is None:
            return
        self.edge.header_timeouts += 1
        log.info(
            "closing a connection whose request headers took over %g s",
            self.edge.limits.header_timeout,
        )
        self.transport.write(self.edge._slow)
        self.inner.force_close()


async def start(
    runner: web.AppRunner, edge: Edge, host: str, port: int, backlog: int = 1024
) -> web.BaseSite:
    """Listen on `host:port` with `edge`'s guard in front of `runner`'s server (set up)."""
    site = GuardedSite(runner, edge, host, port, backlog=backlog)
    await site.start()
    return site


class GuardedSite(web.TCPSite):
    """aiohttp's TCP site, its protocol factory guarded by an `Edge`."""

    __slots__ = ("_edge",)

    def __init__(
        self, runner: web.AppRunner, edge: Edge, host: str, port: int, backlog: int
    ) -> None:
        super().__init__(runner, host, port, backlog=backlog)
        self._edge = edge

    async def start(self) -> None:
        await super(web.TCPSite, self).start()  # BaseSite's: registers the site
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._edge.factory(server), self._host, self._port, backlog=self._backlog
        )
        self._bound_port = self._server.sockets[0].getsockname()[1]
