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
the answers in flight finish. The exception is requests held for a CR at zero: they are answered
503 with `Retry-After` at once (the client's retry reaches another router pod, which holds it).

Scale to zero (docs/router.md, "Scale to zero"): a request for a CR with no ready endpoint whose
Ready condition says `ScaledToZero` is held (`hold.py` decides, a pump task per CR acts): the
first one of an episode wakes the CR (its workload's scale 0 → 1, by `waker`), and the held
requests are released in arrival order at the engines' concurrency once an endpoint is ready,
answered 504 past `holdTimeoutSeconds`, refused 429 past `maxPendingRequests`. A held streaming
request gets an SSE comment every `heartbeat` seconds, so proxies in front see bytes; once that
has sent the 200 headers, an error can no longer be a status: it comes as one SSE event
`event: error` with the OpenAI error object as its data, and the stream ends.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from llmop_router.hold import PHASE_REQUESTED, Held, Holding, Key
from llmop_router.metrics import RouterMetrics
from llmop_router.prefix import RoutingInfo, routing_info
from llmop_router.routes import Backend, RouteTable

log = logging.getLogger("llmop_router.server")

INFERENCE_ROUTES = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
)
"""What passes to the engines; every other `/v1/…` route (e.g. `/v1/load_lora_adapter`) is 403."""
MODELS_ROUTE = "/v1/models"
ACTIVITY_ROUTE = "/llmop/activity"
"""Per CR: requests in flight, held, and the newest arrival (the operator's idle check)."""
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
HEARTBEAT_SECONDS = 10.0
"""A held streaming request gets an SSE comment this often (proxies cut idle streams at 30-60 s)."""
HOLD_TICK_SECONDS = 0.05
"""How often a CR's pump looks at its endpoints and deadlines while requests are held."""
WAKE_RETRY_SECONDS = 2.0
WAKE_TIMEOUT_SECONDS = 10.0
FULL_RETRY_AFTER_SECONDS = "10"

Waker = Callable[[Backend], Awaitable[str]]
"""Wakes a CR at zero (scale subresource 0 → 1 when it is 0); returns the phase to wait in."""


@dataclass
class Activity:
    """One CR's traffic through this router since it started."""

    in_flight: int = 0
    last_request_unix: float | None = None


@dataclass(frozen=True)
class Outcome:
    """How a hold ended: `go` (route it now), `timeout` (504), `full` (429, never held),
    `stopping` (503) or `gone` (the client left while held)."""

    kind: str
    phase: str = ""


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
        heartbeat: float = HEARTBEAT_SECONDS,
        waker: Waker | None = None,
    ) -> None:
        self.table = table
        self.metrics = metrics or RouterMetrics()
        self.connect_timeout = connect_timeout
        self.heartbeat = heartbeat
        self.waker = waker
        """None (a static table): held requests wait for endpoints, nothing is scaled."""
        self.holding = Holding()
        self.activity: dict[Key, Activity] = {}
        self._waiters: dict[int, asyncio.Future[Outcome]] = {}
        self._pumps: dict[Key, asyncio.Task[None]] = {}
        self.ready = False
        self.waiting: list[str] = []
        """What readiness waits for, in words (`/readyz` says it while unready)."""
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
        self.stop_holding()
        for task in self._pumps.values():
            task.cancel()
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
        app.router.add_get(ACTIVITY_ROUTE, self.list_activity)
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
        body: dict[str, object] = {"ok": ready}
        if not ready:
            body["waiting"] = ["draining: stopping"] if self.draining else self.waiting
        return web.json_response(body, status=200 if ready else 503)

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
                "scaledToZero": backend.wake.scaled_to_zero,
                "held": self.holding.held((backend.namespace, backend.name)),
            }
            for model, backend in sorted(self.table.backends.items())
        }
        return web.json_response({"ready": self.ready, "models": routes})

    async def list_activity(self, _request: web.Request) -> web.Response:
        models = [
            {
                "namespace": namespace,
                "name": name,
                "inFlight": seen.in_flight,
                "held": self.holding.held((namespace, name)),
                "lastRequestUnix": seen.last_request_unix,
            }
            for (namespace, name), seen in sorted(self.activity.items())
        ]
        return web.json_response({"models": models})

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
        choice = self.table.choose(info.model, info.key, info.prefill)
        if choice is None:
            message = (
                f"model {info.model!r} is not served here; GET {MODELS_ROUTE} lists the models"
            )
            return self._answered(info.model, error(404, message, "NotFoundError"))
        backend = self.table.backends[info.model]
        key = (backend.namespace, backend.name)
        seen = self.activity.setdefault(key, Activity())
        seen.last_request_unix = time.time()
        prepared: web.StreamResponse | None = None
        if self._should_hold(key, backend, bool(choice.order)):
            outcome, prepared = await self._hold(request, info, backend, key)
            if outcome.kind == "gone" and prepared is not None:
                # The client went away between heartbeats: it has left the queue.
                self.metrics.client_disconnects.inc()
                return prepared
            if outcome.kind != "go":
                return await self._finish(info.model, prepared, self._hold_error(outcome, backend))
            choice = self.table.choose(info.model, info.key, info.prefill)
        if choice is None or not choice.order:
            message = (
                f"no ready replica of LLMDeployment {backend.namespace}/{backend.name} "
                f"(model {info.model!r})"
            )
            retry = {"Retry-After": RETRY_AFTER_SECONDS}
            refusal = error(503, message, "ServiceUnavailableError", retry)
            return await self._finish(info.model, prepared, refusal)
        headers = forwarded_headers(request.headers)
        url_tail = request.rel_url.raw_path_qs
        attempts = choice.order[:ATTEMPTS]
        self.metrics.in_flight.inc()
        seen.in_flight += 1
        try:
            for attempt, endpoint in enumerate(attempts):
                last = attempt == len(attempts) - 1
                self.metrics.routed_by[choice.reason if attempt == 0 else "retry"].inc()
                if attempt == 0:
                    self.metrics.routing_seconds.observe(time.perf_counter() - started)
                answered = await self._attempt(
                    request,
                    endpoint,
                    url_tail,
                    headers,
                    body,
                    prepared=prepared,
                    last=last,
                    prefill=choice.prefill_on(endpoint),
                )
                if answered is not None:
                    self.metrics.count_request(info.model, answered.status)
                    return answered
        finally:
            self.metrics.in_flight.dec()
            seen.in_flight -= 1
        message = f"every replica tried for model {info.model!r} failed before answering"
        return await self._finish(info.model, prepared, error(502, message, "BadGatewayError"))

    def _answered(self, model: str, response: web.Response) -> web.Response:
        self.metrics.count_request(model, response.status)
        return response

    async def _finish(
        self, model: str, prepared: web.StreamResponse | None, response: web.Response
    ) -> web.StreamResponse:
        """Answer with an error: as itself, or as an SSE error event once a held stream's 200
        headers were sent."""
        self.metrics.count_request(model, response.status)
        if prepared is None:
            return response
        assert isinstance(response.body, bytes)
        try:
            await prepared.write(b"event: error\ndata: " + response.body + b"\n\n")
            await prepared.write_eof()
        except ConnectionResetError:
            self.metrics.client_disconnects.inc()
        return prepared

    # -- holding (scale to zero) ----------------------------------------------------------

    def _should_hold(self, key: Key, backend: Backend, has_endpoints: bool) -> bool:
        """Hold while others for this CR wait (first come, first served), or when it has no
        ready endpoint and the operator scaled it to zero. A CR at replicas 0 for another
        reason (a hand-set `spec.replicas: 0`) is answered 503, never woken."""
        if self.draining:
            return False
        if self.holding.holding(key):
            return True
        return not has_endpoints and backend.wake.scaled_to_zero

    async def _hold(
        self, request: web.Request, info: RoutingInfo, backend: Backend, key: Key
    ) -> tuple[Outcome, web.StreamResponse | None]:
        """Wait until released, timed out or stopped; returns the outcome and, for a stream
        that got heartbeats, its already prepared response."""
        loop = asyncio.get_running_loop()
        admission = self.holding.admit(key, loop.time(), backend.wake.settings)
        if admission.held is None:
            return Outcome("full"), None
        held = admission.held
        self.metrics.held_total.labels(*key).inc()
        self._gauge(key)
        if key not in self._pumps:
            self._pumps[key] = asyncio.create_task(self._pump(key, info.model or ""))
        future: asyncio.Future[Outcome] = loop.create_future()
        self._waiters[held.ticket] = future
        prepared: web.StreamResponse | None = None
        try:
            while True:
                wait = self.heartbeat if info.stream else None
                try:
                    return await asyncio.wait_for(asyncio.shield(future), wait), prepared
                except TimeoutError:
                    note = f": waiting for {key[0]}/{key[1]} to wake\n\n"
                    try:
                        if prepared is None:
                            prepared = await self._prepare_stream(request)
                        await prepared.write(note.encode())
                    except ConnectionResetError:
                        return Outcome("gone"), prepared
        finally:
            self._waiters.pop(held.ticket, None)
            if not future.done():
                # The client went away while held: it leaves the queue.
                self.holding.leave(key, held.ticket)
                self._gauge(key)

    async def _prepare_stream(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(
            status=200,
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
        )
        response.headers["X-Accel-Buffering"] = "no"
        await response.prepare(request)
        return response

    def _hold_error(self, outcome: Outcome, backend: Backend) -> web.Response:
        key = (backend.namespace, backend.name)
        cr = f"LLMDeployment {key[0]}/{key[1]}"
        settings = backend.wake.settings
        if outcome.kind == "full":
            self.metrics.hold_refused.labels(*key, "full").inc()
            message = (
                f"{settings.max_pending_requests} requests already wait for {cr} to wake "
                f"(spec.autoscaling.scaleToZero.maxPendingRequests)"
            )
            retry = {"Retry-After": FULL_RETRY_AFTER_SECONDS}
            return error(429, message, "RateLimitError", retry)
        if outcome.kind == "timeout":
            self.metrics.hold_refused.labels(*key, "timeout").inc()
            message = (
                f"{cr} did not wake within {settings.hold_timeout_seconds:g} s "
                f"(spec.autoscaling.scaleToZero.holdTimeoutSeconds); the request waited in "
                f"phase {outcome.phase!r}"
            )
            return error(504, message, "GatewayTimeoutError")
        self.metrics.hold_refused.labels(*key, "stopping").inc()
        message = f"this router pod is stopping while {cr} wakes; retry (another pod holds it)"
        return error(503, message, "ServiceUnavailableError", {"Retry-After": "1"})

    def _gauge(self, key: Key) -> None:
        self.metrics.held.labels(*key).set(self.holding.held(key))

    def _resolve(self, held: Held, outcome: Outcome) -> None:
        future = self._waiters.get(held.ticket)
        if future is not None and not future.done():
            future.set_result(outcome)

    async def _pump(self, key: Key, model: str) -> None:
        """While requests for this CR are held: wake it once, then release them as endpoints
        get free slots and time out the ones past their deadline."""
        loop = asyncio.get_running_loop()
        current = None
        ready_seen = False
        next_wake = 0.0
        try:
            while self.holding.holding(key):
                now = loop.time()
                episode = self.holding.episodes[key]
                if episode is not current:
                    # A new episode began while this task slept (the last one's queue emptied
                    # and a new request came): its own wake and its own wake time.
                    current, ready_seen, next_wake = episode, False, now
                backend = self.table.backends.get(model)
                endpoints = backend.ring.endpoints if backend is not None else ()
                if not episode.woken and not endpoints and now >= next_wake:
                    if await self._wake(key, backend):
                        next_wake = now + WAKE_RETRY_SECONDS
                    continue
                if endpoints and not ready_seen:
                    ready_seen = True
                    self.metrics.wake_seconds.observe(now - episode.started)
                phase = episode.phase
                for held in self.holding.expire(key, now):
                    self._resolve(held, Outcome("timeout", phase))
                if backend is not None:
                    released = self.holding.release(
                        key, self.table.in_flight, endpoints, backend.wake.concurrency
                    )
                    for held in released:
                        self._resolve(held, Outcome("go"))
                self._gauge(key)
                await asyncio.sleep(HOLD_TICK_SECONDS)
        finally:
            self._pumps.pop(key, None)
            self._gauge(key)

    async def _wake(self, key: Key, backend: Backend | None) -> bool:
        """Wake the CR once for this episode; True when it failed and is to be tried again."""
        if backend is None or not backend.wake.scaled_to_zero:
            # The CR left ScaledToZero (or the table) since: nothing to wake, only to wait.
            self.holding.woke(key, "waiting: the CR is not ScaledToZero, no ready replica yet")
            return False
        if self.waker is None:
            self.holding.woke(key, "waiting: no Kubernetes access to scale, no ready replica yet")
            return False
        try:
            phase = await asyncio.wait_for(self.waker(backend), WAKE_TIMEOUT_SECONDS)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # any failure is retried while requests wait
            log.warning("waking %s/%s failed: %s", *key, exc)
            self.holding.note(key, f"waking: the scale request failed ({exc}); retrying")
            return True
        if phase == PHASE_REQUESTED:
            self.metrics.wakes.labels(*key).inc()
        self.holding.woke(key, phase)
        return False

    def stop_holding(self) -> None:
        """Answer every held request 503 (this pod stops; the client's retry goes elsewhere)."""
        for key, held in self.holding.take_all():
            self._resolve(held, Outcome("stopping"))
            self._gauge(key)

    async def _attempt(
        self,
        request: web.Request,
        endpoint: str,
        url_tail: str,
        headers: CIMultiDict[str],
        body: bytes,
        *,
        prepared: web.StreamResponse | None,
        last: bool,
        prefill: int = 0,
    ) -> web.StreamResponse | None:
        """Send to one pod and relay its answer; None when it failed before its first byte and
        another pod may be tried. The pod counts the request in flight until it ends, and its
        `prefill` (prompt characters) as queued until the answer's first byte."""
        assert self._session is not None
        table = self.table
        table.in_flight[endpoint] += 1
        table.queued[endpoint] += prefill
        unanswered = [prefill]

        def first_byte() -> None:
            if unanswered:
                table.queued[endpoint] -= unanswered.pop()
                if table.queued[endpoint] <= 0:
                    del table.queued[endpoint]

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
                return await self._relay(request, upstream, prepared, first_byte)
        finally:
            first_byte()
            table.in_flight[endpoint] -= 1
            if table.in_flight[endpoint] <= 0:
                del table.in_flight[endpoint]

    async def _relay(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        prepared: web.StreamResponse | None = None,
        first_byte: Callable[[], None] = lambda: None,
    ) -> web.StreamResponse:
        if prepared is not None:
            return await self._relay_into(prepared, upstream, first_byte)
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
                first_byte()
                await response.write(chunk)
            await response.write_eof()
        except ConnectionResetError:
            # The client stopped reading (e.g. closed after `data: [DONE]`, before the final
            # empty chunk): leaving here closes the upstream connection too.
            self.metrics.client_disconnects.inc()
        return response

    async def _relay_into(
        self,
        prepared: web.StreamResponse,
        upstream: aiohttp.ClientResponse,
        first_byte: Callable[[], None] = lambda: None,
    ) -> web.StreamResponse:
        """The engine's answer into a held stream whose 200 headers (and heartbeats) went out:
        its events as they come, or its error as one SSE error event."""
        try:
            if upstream.status != 200:
                body = await upstream.read()
                try:
                    json.loads(body)
                except ValueError:
                    body = json.dumps(
                        {
                            "error": {
                                "message": body.decode(errors="replace"),
                                "code": upstream.status,
                            }
                        }
                    ).encode()
                await prepared.write(b"event: error\ndata: " + body + b"\n\n")
            else:
                async for chunk in upstream.content.iter_any():
                    first_byte()
                    await prepared.write(chunk)
            await prepared.write_eof()
        except ConnectionResetError:
            self.metrics.client_disconnects.inc()
        return prepared


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
        router.stop_holding()
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
