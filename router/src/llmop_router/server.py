"""The router's HTTP server: an OpenAI endpoint for every routed model, streaming without buffering.

A request's body is read once (requests are small next to their answers) and parsed only for
`model` and the routing key; the answer is relayed chunk by chunk as the engine writes it
(`X-Accel-Buffering: no` so that an nginx in front does not hold chunks either). A request that
fails before the engine's first response byte (connection refused or reset, or 503 from a draining
engine) is retried once on a different pod; after the first byte nothing is retried (the client
has part of an answer). A client that disconnects cancels the handler, which closes the upstream
connection, which makes vLLM abort the request. Engine admin routes never pass (403).

`serve` runs it until SIGTERM, then stops without refusing anyone: unready and still serving for
a delay (the Service's proxies drop the terminating pod meanwhile), then no new connections while
the answers in flight finish.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from llmop_router.metrics import RouterMetrics
from llmop_router.prefix import routing_info
from llmop_router.routes import RouteTable

log = logging.getLogger("llmop_router.server")

INFERENCE_ROUTES = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
)
"""What passes to the engines; every other `/v1/…` route (e.g. `/v1/load_lora_adapter`) is 403."""
MODELS_ROUTE = "/v1/models"
ROUTES_ROUTE = "/routes"
"""The table as the router sees it (model → CR, endpoints, in-flight): for debugging routing."""
ATTEMPTS = 2
"""The first pick and one retry on a different pod."""
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
RETRY_AFTER_SECONDS = "5"
SHUTDOWN_DELAY_SECONDS = 5.0
"""How long the router keeps serving, unready, after SIGTERM: kube-proxy (and any load balancer)
drops a terminating endpoint only after the EndpointSlice update reaches it, and until then new
connections still arrive (docs/router.md, "Router pods")."""
DRAIN_SECONDS = 60.0
"""After the delay, how long answers in flight may take to finish before they are cut."""


def error(
    status: int, message: str, kind: str, headers: Mapping[str, str] | None = None
) -> web.Response:
    """An OpenAI-shaped JSON error."""
    body = {"error": {"message": message, "type": kind, "code": status}}
    return web.json_response(body, status=status, headers=headers)


def forwarded_headers(headers: Mapping[str, str]) -> CIMultiDict[str]:
    """End-to-end headers (Authorization included: the engine checks its API key)."""
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in HOP_BY_HOP)


class Router:
    """The proxy over a `RouteTable` (filled by the watch or a static file)."""

    def __init__(
        self,
        table: RouteTable,
        metrics: RouterMetrics | None = None,
        *,
        connect_timeout: float = 5.0,
    ) -> None:
        self.table = table
        self.metrics = metrics or RouterMetrics()
        self.connect_timeout = connect_timeout
        self.ready = False
        self.draining = False
        """Set on SIGTERM: unready, and every answer closes its connection."""
        self.app_hooks: list[Callable[[web.Application], None]] = []
        """Called with the app before it runs (the watch attaches itself here)."""
        self._session: aiohttp.ClientSession | None = None

    # -- lifecycle ------------------------------------------------------------------------

    async def _on_startup(self, _app: web.Application) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, enable_cleanup_closed=True),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout),
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
        )

    async def _on_cleanup(self, _app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()

    def app(self) -> web.Application:
        app = web.Application(
            client_max_size=64 * 1024 * 1024, middlewares=[self._close_when_draining]
        )
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        app.router.add_get(MODELS_ROUTE, self.list_models)
        for route in INFERENCE_ROUTES:
            app.router.add_post(route, self.proxy)
        app.router.add_route("*", "/v1/{rest:.*}", self.refuse)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics_page)
        app.router.add_get(ROUTES_ROUTE, self.list_routes)
        for hook in self.app_hooks:
            hook(app)
        return app

    @web.middleware
    async def _close_when_draining(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        response = await handler(request)
        if self.draining and not response.prepared:
            response.force_close()
        return response

    # -- small routes ---------------------------------------------------------------------

    async def healthz(self, _request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def readyz(self, _request: web.Request) -> web.Response:
        ready = self.ready and not self.draining
        return web.json_response({"ok": ready}, status=200 if ready else 503)

    async def metrics_page(self, _request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.exposition(), content_type="text/plain")

    async def list_models(self, _request: web.Request) -> web.Response:
        data = [
            {
                "id": model,
                "object": "model",
                "owned_by": f"{backend.namespace}/{backend.name}",
            }
            for model, backend in sorted(self.table.backends.items())
        ]
        return web.json_response({"object": "list", "data": data})

    async def list_routes(self, _request: web.Request) -> web.Response:
        routes = {
            model: {
                "namespace": backend.namespace,
                "name": backend.name,
                "endpoints": {e: self.table.in_flight.get(e, 0) for e in backend.ring.endpoints},
            }
            for model, backend in sorted(self.table.backends.items())
        }
        return web.json_response({"ready": self.ready, "models": routes})

    async def refuse(self, request: web.Request) -> web.Response:
        return error(
            403,
            f"{request.method} {request.path} is not routed: only the inference routes "
            f"({', '.join(INFERENCE_ROUTES)}) and GET {MODELS_ROUTE} pass the router",
            "PermissionDeniedError",
        )

    # -- the proxy ------------------------------------------------------------------------

    async def proxy(self, request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        body = await request.read()
        info = routing_info(body)
        if info.model is None:
            return self._answered(
                "", error(400, "the request body has no `model`", "BadRequestError")
            )
        choice = self.table.choose(info.model, info.key)
        if choice is None:
            message = (
                f"model {info.model!r} is not served here; GET {MODELS_ROUTE} lists the models"
            )
            return self._answered(info.model, error(404, message, "NotFoundError"))
        backend = self.table.backends[info.model]
        if not choice.order:
            message = (
                f"no ready replica of LLMDeployment {backend.namespace}/{backend.name} "
                f"(model {info.model!r})"
            )
            retry = {"Retry-After": RETRY_AFTER_SECONDS}
            return self._answered(info.model, error(503, message, "ServiceUnavailableError", retry))
        headers = forwarded_headers(request.headers)
        url_tail = request.rel_url.raw_path_qs
        attempts = choice.order[:ATTEMPTS]
        self.metrics.in_flight.inc()
        try:
            for attempt, endpoint in enumerate(attempts):
                last = attempt == len(attempts) - 1
                self.metrics.routed_by[choice.reason if attempt == 0 else "retry"].inc()
                if attempt == 0:
                    self.metrics.routing_seconds.observe(time.perf_counter() - started)
                answered = await self._attempt(
                    request, endpoint, url_tail, headers, body, last=last
                )
                if answered is not None:
                    self.metrics.count_request(info.model, answered.status)
                    return answered
        finally:
            self.metrics.in_flight.dec()
        message = f"every replica tried for model {info.model!r} failed before answering"
        return self._answered(info.model, error(502, message, "BadGatewayError"))

    def _answered(self, model: str, response: web.Response) -> web.Response:
        self.metrics.count_request(model, response.status)
        return response

    async def _attempt(
        self,
        request: web.Request,
        endpoint: str,
        url_tail: str,
        headers: CIMultiDict[str],
        body: bytes,
        *,
        last: bool,
    ) -> web.StreamResponse | None:
        """Send to one pod and relay its answer; None when it failed before its first byte and
        another pod may be tried."""
        assert self._session is not None
        table = self.table
        table.in_flight[endpoint] += 1
        try:
            try:
                upstream = await self._session.request(
                    request.method,
                    f"http://{endpoint}{url_tail}",
                    headers=headers,
                    data=body,
                    allow_redirects=False,
                )
            except (TimeoutError, aiohttp.ClientConnectionError) as exc:
                kind = type(exc).__name__
                self.metrics.upstream_errors.labels(kind).inc()
                log.info("upstream %s failed before answering: %s", endpoint, exc)
                return None
            async with upstream:
                if upstream.status == 503 and not last:
                    # A draining engine (or one going unready): the next pod answers instead.
                    self.metrics.upstream_errors.labels("503").inc()
                    return None
                return await self._relay(request, upstream)
        finally:
            table.in_flight[endpoint] -= 1
            if table.in_flight[endpoint] <= 0:
                del table.in_flight[endpoint]

    async def _relay(
        self, request: web.Request, upstream: aiohttp.ClientResponse
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            status=upstream.status,
            reason=upstream.reason,
            headers=forwarded_headers(upstream.headers),
        )
        response.headers["X-Accel-Buffering"] = "no"
        if self.draining:
            # `Connection: close`: the client's next request opens a new connection, which the
            # Service sends to another router pod; a kept-alive one would stay on this one.
            response.force_close()
        if upstream.content_length is not None:
            response.content_length = upstream.content_length
        await response.prepare(request)
        try:
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
        except ConnectionResetError:
            # The client stopped reading (e.g. closed after `data: [DONE]`, before the final
            # empty chunk): leaving here closes the upstream connection too.
            self.metrics.client_disconnects.inc()
        return response


async def serve(
    router: Router,
    host: str,
    port: int,
    *,
    shutdown_delay: float = SHUTDOWN_DELAY_SECONDS,
    drain: float = DRAIN_SECONDS,
    stop: asyncio.Event | None = None,
    listening: Callable[[int], None] = lambda _port: None,
) -> None:
    """Serve until SIGTERM or SIGINT (or `stop` is set), then drain: unready and still serving
    for `shutdown_delay` seconds, then the listener closes and answers in flight get up to
    `drain` seconds to finish. `listening` is told the bound port (`port` 0: any free one)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    # Handler cancellation on: a client that goes away cancels its upstream request at once.
    runner = web.AppRunner(
        router.app(), handler_cancellation=True, access_log=None, shutdown_timeout=drain
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        listening(runner.addresses[0][1])
        await stop.wait()
        router.draining = True
        log.info("stopping: unready, serving %.1f s more, then draining", shutdown_delay)
        await asyncio.sleep(shutdown_delay)
        in_flight = sum(router.table.in_flight.values())
        log.info("no new connections; %d answers in flight get %.0f s to finish", in_flight, drain)
    finally:
        await runner.cleanup()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)


def static_table(path: str) -> RouteTable:
    """A table from a JSON file `{"models": {name: {"namespace", "name", "endpoints"}}}`
    (development and tests; in a cluster the watch fills the table)."""
    with open(path, encoding="utf-8") as handle:
        document: Any = json.load(handle)
    table = RouteTable()
    for model, entry in document.get("models", {}).items():
        table.set(model, entry["namespace"], entry["name"], entry["endpoints"])
    return table
