"""The router's HTTP server: an OpenAI endpoint for every routed model, streaming without
buffering, plus health; and on a second, admin port, metrics, the table and the activity the
operator reads (the table names every engine pod's address: clients never see that port).

A request's body is read once, within the router's limits (`intake`: size, time, and a
parse of bounded work), for `model` and the routing key; the table picks its pods, a CR at
zero holds it (`scale_to_zero`), the proxy sends it and relays the answer (`proxy`). With the
gateway, a tenant's request is admitted (`gateway`), takes its turn at a saturated model
(`sharing`), and goes to the model's fallback when the model cannot answer it. Engine admin
routes never pass (403). The public socket caps connections and times headers (`edge`).

`serve` runs it until SIGTERM, then stops without refusing anyone: unready and still serving for
a delay (the Service's proxies drop the terminating pod meanwhile), then no new connections while
the answers in flight finish. The exception is requests held for a CR at zero or queued for a
slot: they are answered 503 with `Retry-After` at once (the client's retry reaches another
router pod).
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from aiohttp import web
from multidict import CIMultiDict

from llmop_router import contract, edge
from llmop_router.answers import (
    UNAVAILABLE_RETRY_AFTER,
    error,
    forwarded_headers,
    prepare_stream,
    send_error_event,
)
from llmop_router.contract import ActivityKey
from llmop_router.discovery import fallback_of
from llmop_router.externals import ExternalModel, Externals, parse_external_model
from llmop_router.gateway import Gateway, Ticket, model_not_found, new_request_id
from llmop_router.hold import DEFAULT_CONCURRENCY, Holding, Key
from llmop_router.intake import INLINE_BYTES, Intake
from llmop_router.limits import DEFAULT as DEFAULT_LIMITS
from llmop_router.limits import Limits
from llmop_router.metering import Tap, with_model, with_usage_requested
from llmop_router.metrics import UNKNOWN_MODEL, QueueMetrics, RouterMetrics
from llmop_router.migration import Settings as MigrationSettings
from llmop_router.prefix import RoutingInfo
from llmop_router.priorities import PriorityClass
from llmop_router.proxy import ENGINE_REFUSED, Proxy
from llmop_router.quota import Usage
from llmop_router.routes import Backend, Choice, Fallback, RouteTable, Wake
from llmop_router.scale_to_zero import HEARTBEAT_SECONDS, Holder, Waker
from llmop_router.sharing import (
    SATURATED,
    UNAVAILABLE,
    Refusal,
    Sharing,
    Turn,
    cost_of,
    priority_of,
)
from llmop_router.tenants import Identity

log = logging.getLogger("llmop_router.app")

RATE_LIMITS = web.RequestKey("llmop_rate_limits", dict[str, str])
"""An admitted request's `x-ratelimit-*` headers, for whichever answer it gets (relayed,
continued elsewhere, or an error)."""
FALLBACK_TO = web.RequestKey("llmop_fallback", str)
"""The fallback model that answers the request (its answer says so)."""
INFERENCE_ROUTES = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
)
"""What passes to the engines; every other `/v1/…` route (e.g. `/v1/load_lora_adapter`) is 403."""
QUEUED_HEARTBEAT = b": waiting for a slot\n\n"
"""The SSE comment a streaming request queued for a slot gets every heartbeat."""
MODELS_ROUTE = "/v1/models"
ACTIVITY_ROUTE = contract.ACTIVITY_PATH
"""Per CR: requests in flight, held, and the newest arrival (the operator's idle check)."""
ROUTES_ROUTE = "/routes"
"""The table as the router sees it (model → CR, endpoints, in-flight): for debugging routing."""
SHUTDOWN_DELAY_SECONDS = 5.0
"""How long the router keeps serving, unready, after SIGTERM: kube-proxy (and any load balancer)
drops a terminating endpoint only after the EndpointSlice update reaches it, and until then new
connections still arrive (docs/router.md, "Router pods")."""
DRAIN_SECONDS = 60.0
"""After the delay, how long answers in flight may take to finish before they are cut."""


class Router:
    """The router over a `RouteTable` (filled by the watch or a static file)."""

    def __init__(
        self,
        table: RouteTable,
        metrics: RouterMetrics | None = None,
        *,
        connect_timeout: float = 5.0,
        heartbeat: float = HEARTBEAT_SECONDS,
        waker: Waker | None = None,
        limits: Limits = DEFAULT_LIMITS,
        migration: MigrationSettings | None = None,
    ) -> None:
        self.table = table
        self.limits = limits
        """What clients may send and what is kept for them (`limits`)."""
        self.intake = Intake(limits)
        self.metrics = metrics or RouterMetrics()
        self.metrics.in_flight.set_function(table.total_in_flight)
        self.proxy = Proxy(
            table,
            self.metrics,
            connect_timeout=connect_timeout,
            draining=lambda: self.draining,
            migration=migration,
        )
        self.holder = Holder(table, self.metrics, heartbeat=heartbeat, waker=waker, limits=limits)
        self.sharing = Sharing(table, QueueMetrics(self.metrics.registry), limits)
        """With the gateway: each saturated model's fair queue (priority, then tenant)."""
        self.last_request: dict[Key, float] = {}
        """Per CR this router has seen a request for: when the newest one arrived (Unix)."""
        self.ready = False
        self.waiting: list[str] = []
        """What readiness waits for, in words (`/readyz` says it while unready)."""
        self.stale: Callable[[], list[str]] = list
        """Why the table is out of date now, in words (none: it is current); asked per probe,
        as staleness grows with time and no event marks it (the watch sets it)."""
        self.draining = False
        """Set on SIGTERM: unready, and every answer closes its connection."""
        self.app_hooks: list[Callable[[web.Application], None]] = []
        """Called with the app before it runs (the watch attaches itself here)."""
        self.gateway: Gateway | None = None
        """Set: every request needs a tenant's API key and is held to its limits (`gateway`)."""
        self.externals = Externals()
        """The APIs outside the cluster a model may fall back to (`LLMExternalModel`s)."""

    @property
    def holding(self) -> Holding:
        """The held requests' queues."""
        return self.holder.queues

    @property
    def waker(self) -> Waker | None:
        return self.holder.waker

    @waker.setter
    def waker(self, waker: Waker | None) -> None:
        self.holder.waker = waker

    # -- lifecycle ------------------------------------------------------------------------

    async def _on_startup(self, _app: web.Application) -> None:
        await self.proxy.open()
        self.sharing.start()

    async def _on_cleanup(self, _app: web.Application) -> None:
        self.holder.close()
        self.sharing.close()
        if self.sharing.readings is not None:
            await self.sharing.readings.close()
        self.intake.close()
        await self.proxy.close()
        if self.gateway is not None:
            await self.gateway.close()

    def app(self) -> web.Application:
        app = web.Application(
            # A backstop only: `Intake` reads the body and refuses it past the limit first.
            client_max_size=self.limits.max_body_bytes,
            middlewares=[self._close_when_draining],
        )
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        app.on_response_prepare.append(_rate_limit_headers)
        app.router.add_get(MODELS_ROUTE, self.list_models)
        for route in INFERENCE_ROUTES:
            app.router.add_post(route, self.route)
        app.router.add_route("*", "/v1/{rest:.*}", self.refuse)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        for hook in self.app_hooks:
            hook(app)
        return app

    def admin_app(self) -> web.Application:
        """The admin port's routes: for the operator, Prometheus and people debugging, never
        for clients (`/routes` lists every engine pod's address)."""
        app = web.Application()
        app.router.add_get("/metrics", self.metrics_page)
        app.router.add_get(ROUTES_ROUTE, self.list_routes)
        app.router.add_get(ACTIVITY_ROUTE, self.list_activity)
        return app

    def unready_reasons(self) -> list[str]:
        """Why this pod should get no new requests now, in words; none: ready."""
        if self.draining:
            return ["draining: stopping"]
        reasons = [] if self.ready else self.waiting or ["starting"]
        return [*reasons, *self.stale()]

    def stop_holding(self) -> None:
        """Answer every held or queued request 503 (this pod stops; the client's retry goes
        elsewhere)."""
        self.holder.stop()
        self.sharing.stop()

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
        reasons = self.unready_reasons()
        body: dict[str, object] = {"ok": not reasons}
        if reasons:
            body["waiting"] = reasons
        return web.json_response(body, status=503 if reasons else 200)

    async def metrics_page(self, _request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.exposition(), content_type="text/plain")

    async def list_models(self, request: web.Request) -> web.Response:
        allowed: Callable[[str], bool] = lambda _model: True  # noqa: E731
        if self.gateway is not None:
            identity = self.gateway.authenticate(request)
            if isinstance(identity, web.Response):
                return identity
            allowed = identity.tenant.may_use
        data = [
            {
                "id": model,
                "object": "model",
                "owned_by": f"{backend.namespace}/{backend.name}",
            }
            for model, backend in sorted(self.table.backends.items())
            if allowed(model)
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
        in_flight = self.table.in_flight_by_cr()
        models = [
            {
                ActivityKey.NAMESPACE: key[0],
                ActivityKey.NAME: key[1],
                ActivityKey.IN_FLIGHT: in_flight[key],
                ActivityKey.HELD: self.holding.held(key),
                ActivityKey.LAST_REQUEST_UNIX: last,
            }
            for key, last in sorted(self.last_request.items())
        ]
        return web.json_response({ActivityKey.MODELS: models})

    async def refuse(self, request: web.Request) -> web.Response:
        return error(
            403,
            f"{request.method} {request.path} is not routed: only the inference routes "
            f"({', '.join(INFERENCE_ROUTES)}) and GET {MODELS_ROUTE} pass the router",
            "PermissionDeniedError",
        )

    # -- an inference request -------------------------------------------------------------

    async def route(self, request: web.Request) -> web.StreamResponse:
        """Read, pick, hold while the CR is at zero, then proxy; with the gateway, the key is
        checked before the body is read and the tenant's limits before the pick."""
        if self.gateway is None:
            return await self._route(request, None)
        identity = self.gateway.authenticate(request)
        if isinstance(identity, web.Response):
            return self._answered(UNKNOWN_MODEL, identity)
        return await self._route(request, self.gateway, identity)

    async def _route(
        self,
        request: web.Request,
        gateway: Gateway | None,
        identity: Identity | None = None,
    ) -> web.StreamResponse:
        started = time.perf_counter()
        body = await self.intake.read(request)
        if isinstance(body, web.StreamResponse):
            return self._answered(UNKNOWN_MODEL, body)
        info = await self.intake.parse(body)
        if isinstance(info, web.StreamResponse):
            return self._answered(UNKNOWN_MODEL, info)
        assert info.model is not None  # `body.scan` refuses a body without one
        if gateway is not None and identity is not None:
            refused = gateway.model_refusal(identity, info.model)
            if refused is not None:
                return self._answered(info.model, refused)
        choice = self.table.choose(info.model, info.key, info.prefill)
        if choice is None:
            if gateway is not None:
                return self._answered(info.model, model_not_found(info.model))
            message = (
                f"model {info.model!r} is not served here; GET {MODELS_ROUTE} lists the models"
            )
            return self._answered(info.model, error(404, message, "NotFoundError"))
        if gateway is None or identity is None:
            return await self._serve(request, body, info, choice, started)
        return await self._serve_tenant(request, gateway, identity, body, info, choice, started)

    async def _serve_tenant(  # noqa: PLR0917 - one request's parts, read once each
        self,
        request: web.Request,
        gateway: Gateway,
        identity: Identity,
        body: bytes,
        info: RoutingInfo,
        choice: Choice,
        started: float,
    ) -> web.StreamResponse:
        """A tenant's request for a routed model: its priority, its limits, its turn in the
        model's fair queue, then the engine; metered however it ends."""
        assert info.model is not None
        priority = priority_of(request, gateway.classes, identity.tenant.priority_class)
        if isinstance(priority, web.Response):
            return self._answered(info.model, priority)
        if choice.backend.engine_key:
            return self._answered(info.model, engine_key_refusal(choice.backend))
        admitted = await self._admit(request, gateway, identity, info, body)
        if isinstance(admitted, web.Response):
            return self._answered(info.model, admitted)
        ticket, body = admitted[0], admitted[1] or body
        if ticket.headers:
            request[RATE_LIMITS] = ticket.headers
        attempt = Attempt(request, ticket, forwarded_headers(request.headers), priority, started)
        gateway.headers_for(attempt.headers, ticket)
        served = (choice.backend.namespace, choice.backend.name)
        status = 499
        try:
            saturated_after = min(
                (f.saturated_after for f in choice.backend.fallback if f.saturated_after),
                default=None,
            )
            answered, why = await self._attempt(
                attempt, body, info, choice, saturated_after, fall_back=True
            )
            if why:
                fallback = await self._fallback(attempt, body, info, choice, why=why)
                if fallback is not None:
                    answered, served = fallback
                elif why == SATURATED:
                    self._answered(info.model, answered)
            status = answered.status
            return answered
        finally:
            gateway.finish(ticket, ticket.tap.status or status, served)

    async def _attempt(
        self,
        attempt: Attempt,
        body: bytes,
        info: RoutingInfo,
        choice: Choice,
        saturated_after: float | None = None,
        *,
        fall_back: bool = False,
    ) -> tuple[web.StreamResponse, str]:
        """One model's try at a tenant's request: its turn in the fair queue, then the engines.
        The answer, and why a fallback should answer instead ("" for none): SATURATED (no slot
        within `saturated_after`), UNAVAILABLE (no replica answered, or, with `fall_back` and
        a fallback for it, the engine refused with its own 5xx or 429; nothing sent yet)."""
        assert info.model is not None
        ticket, key = attempt.ticket, (choice.backend.namespace, choice.backend.name)
        turn: Turn | None = None
        prepared: web.StreamResponse | None = None
        status = 499
        try:
            if self._shared(choice, key):
                estimate = ticket.ask.estimate
                waiting = self.sharing.turn(
                    choice.backend,
                    info.model,
                    tenant=ticket.identity.tenant.name,
                    priority=attempt.priority,
                    weight=ticket.identity.tenant.weight,
                    cost=cost_of(estimate.input_tokens, estimate.output_tokens),
                    size=len(body),
                    saturated_after=saturated_after,
                )
                if isinstance(waiting, Turn | Refusal):
                    given: Turn | Refusal | None = waiting
                else:
                    given, prepared = await self._queued(
                        attempt.request, info.stream, waiting, saturated_after
                    )
                if given is None:
                    assert prepared is not None
                    self.metrics.client_disconnects.inc()  # gone between heartbeats
                    return prepared, ""
                if isinstance(given, Refusal):
                    status = given.answer.status
                    if prepared is not None:
                        return await self._finish(info.model, prepared, given.answer), ""
                    if given.kind == SATURATED:
                        return given.answer, SATURATED  # counted if no fallback takes it
                    return self._answered(info.model, given.answer), ""
                turn = given
                # Picked again now that it has its slot: the loads moved while it waited.
                again = self.table.choose(info.model, info.key, info.prefill)
                choice = self.sharing.free_first(again if again is not None else choice)
            answered = await self._serve(
                attempt.request,
                body,
                info,
                choice,
                attempt.started,
                tap=ticket.tap,
                headers=attempt.headers,
                priority=attempt.priority.value,
                keep_refusals=fall_back and any(f.unavailable for f in choice.backend.fallback),
                prepared=prepared,
            )
            status = answered.status
            unavailable = not answered.prepared and (status == 503 or ENGINE_REFUSED in answered)
            return answered, UNAVAILABLE if unavailable else ""
        finally:
            if turn is not None:
                used = (
                    ticket.tap.used(ticket.ask.estimate.input_tokens)
                    if 200 <= status < 300
                    else Usage(0, 0)
                )
                self.sharing.finish(turn, cost_of(used.input_tokens, used.output_tokens))

    async def _queued(
        self,
        request: web.Request,
        stream: bool,
        waiting: Awaitable[Turn | Refusal],
        saturated_after: float | None,
    ) -> tuple[Turn | Refusal | None, web.StreamResponse | None]:
        """A request's turn in the fair queue. A streaming one that waits long gets its 200
        headers and an SSE comment every heartbeat, as a held one does (proxies in front cut
        idle streams at 30-60 s): then the response already sent comes back too, and None for
        the turn when the client went away meanwhile. The first heartbeat comes after the
        model's `Saturated` fallback would have taken the request (its answer needs headers of
        its own)."""
        task = asyncio.ensure_future(waiting)
        try:
            if not stream:
                return await task, None
            beat = self.holder.heartbeat
            delay = beat if saturated_after is None else max(beat, saturated_after + beat)
            prepared: web.StreamResponse | None = None
            while True:
                done, _ = await asyncio.wait({task}, timeout=delay)
                if done:
                    return task.result(), prepared
                delay = beat
                try:
                    if prepared is None:
                        prepared = await prepare_stream(request)
                    await prepared.write(QUEUED_HEARTBEAT)
                except ConnectionResetError:
                    self._drop(task)
                    return None, prepared
        except asyncio.CancelledError:
            self._drop(task)
            raise

    def _drop(self, task: asyncio.Future[Turn | Refusal]) -> None:
        """A turn nobody will use: it leaves the queue, or gives its slot back."""
        if not task.done():
            task.cancel()
        elif not task.cancelled() and isinstance(turn := task.result(), Turn):
            self.sharing.finish(turn, 0.0)

    async def _fallback(
        self, attempt: Attempt, body: bytes, info: RoutingInfo, choice: Choice, *, why: str
    ) -> tuple[web.StreamResponse, Key] | None:
        """The answer of the first of the model's fallbacks that applies (`why`), that the
        tenant may use and that has a ready replica; None when none does (the first answer
        stands). One hop: the fallback's own fallbacks are not followed."""
        tenant = attempt.ticket.identity.tenant
        for fallback in choice.backend.fallback:
            wanted = fallback.unavailable if why == UNAVAILABLE else bool(fallback.saturated_after)
            if not wanted or not tenant.may_fall_back(fallback.model, external=fallback.external):
                continue
            if fallback.external:
                external = await self._external(attempt, body, fallback, why=why)
                if external is not None:
                    return external
                continue
            target = self.table.choose(fallback.model, info.key, info.prefill)
            if target is None or not target.pick.order:
                continue
            self.sharing.metrics.fallbacks.labels(why).inc()
            attempt.request[FALLBACK_TO] = fallback.model
            rewritten = await _with_model(body, fallback.model)
            answered, _ = await self._attempt(
                attempt, rewritten, replace(info, model=fallback.model), target
            )
            return answered, (target.backend.namespace, target.backend.name)
        return None

    async def _external(
        self, attempt: Attempt, body: bytes, fallback: Fallback, *, why: str
    ) -> tuple[web.StreamResponse, Key] | None:
        """The answer of an external model (an API outside the cluster), when it is usable now
        (its key read, below its concurrency) and could be reached; else None."""
        usable = self.externals.usable(fallback.model)
        if usable is None:
            return None
        external, key = usable
        self.sharing.metrics.fallbacks.labels(why).inc()
        attempt.request[FALLBACK_TO] = external.name
        rewritten = await _with_model(body, external.model)
        self.externals.start(external.name)
        try:
            answered = await self.proxy.forward_external(
                attempt.request,
                rewritten,
                external,
                key,
                tap=attempt.ticket.tap,
                headers=attempt.headers,
            )
        finally:
            self.externals.end(external.name)
        if answered is None:
            del attempt.request[FALLBACK_TO]
            return None
        self.metrics.count_request(self._label(attempt.ticket.ask.model), answered.status)
        return answered, external.key

    def _shared(self, choice: Choice, key: Key) -> bool:
        """Whether the request takes its turn in the model's fair queue: not while the CR is
        held at zero or has no ready endpoint (the hold queue and its 503 answer those), nor
        while this pod drains."""
        if self.draining or not choice.pick.order:
            return False
        return not self.holder.queues.holding(key)

    async def _admit(
        self,
        request: web.Request,
        gateway: Gateway,
        identity: Identity,
        info: RoutingInfo,
        body: bytes,
    ) -> web.Response | tuple[Ticket, bytes | None]:
        """The tenant's admission; and the body asking for usage when the client did not."""
        assert info.model is not None
        strip = info.stream and not info.include_usage
        ticket = await gateway.admit(
            identity,
            info.model,
            prompt_chars=info.prefill.total,
            max_tokens=info.max_tokens,
            stream=info.stream,
            strip_usage=strip,
            # The router's own id keys the store (a lease, the settlement's once-only marker):
            # a client's, reused on purpose, would share a lease or skip its metering.
            request_id=new_request_id(),
            client_request_id=request.headers.get("X-Request-Id", "")[:64],
        )
        if isinstance(ticket, web.Response):
            return ticket
        if not strip:
            return ticket, None
        if len(body) <= INLINE_BYTES:
            return ticket, with_usage_requested(body)
        # A large body is parsed again off the event loop, as `Intake` parsed it.
        loop = asyncio.get_running_loop()
        return ticket, await loop.run_in_executor(None, with_usage_requested, body)

    async def _serve(
        self,
        request: web.Request,
        body: bytes,
        info: RoutingInfo,
        first_choice: Choice,
        started: float,
        *,
        tap: Tap | None = None,
        headers: CIMultiDict[str] | None = None,
        priority: int = 0,
        keep_refusals: bool = False,
        prepared: web.StreamResponse | None = None,
    ) -> web.StreamResponse:
        """Hold the request while its CR wakes (or waits its turn at zero), then send it to an
        engine. `prepared`: the response whose 200 headers went out while it was queued."""
        assert info.model is not None
        choice: Choice | None = first_choice
        backend = first_choice.backend
        key = (backend.namespace, backend.name)
        self.last_request[key] = time.time()
        if (
            prepared is None
            and not self.draining
            and self.holder.should_hold(key, backend, bool(first_choice.pick.order))
        ):
            outcome, prepared = await self.holder.hold(
                request, info, backend, key, size=len(body), priority=priority
            )
            if outcome.kind == "gone" and prepared is not None:
                # The client went away between heartbeats: it has left the queue.
                self.metrics.client_disconnects.inc()
                return prepared
            if outcome.kind != "go":
                refusal = self.holder.refusal(outcome, backend)
                return await self._finish(info.model, prepared, refusal)
            choice = self.table.choose(info.model, info.key, info.prefill)
        if choice is None or not choice.pick.order:
            message = (
                f"no ready replica of LLMDeployment {backend.namespace}/{backend.name} "
                f"(model {info.model!r})"
            )
            retry = {"Retry-After": UNAVAILABLE_RETRY_AFTER}
            refusal = error(503, message, "ServiceUnavailableError", retry)
            return await self._finish(info.model, prepared, refusal)
        answered = await self.proxy.forward(
            request,
            body,
            choice,
            key,
            started=started,
            prepared=prepared,
            tap=tap,
            headers=headers,
            keep_refusals=keep_refusals,
        )
        if answered is not None:
            self.metrics.count_request(self._label(info.model), answered.status)
            return answered
        # Nothing reached an engine (refused, reset before the headers): the model is
        # unavailable for now, and the client may retry, so 503 with Retry-After.
        message = f"every replica tried for model {info.model!r} failed before answering"
        retry = {"Retry-After": UNAVAILABLE_RETRY_AFTER}
        refusal = error(503, message, "ServiceUnavailableError", retry)
        return await self._finish(info.model, prepared, refusal)

    def _label(self, model: str) -> str:
        """The metrics' `model` label: only routed names (a client may send any)."""
        return model if model in self.table.backends else UNKNOWN_MODEL

    def _answered(self, model: str, response: web.StreamResponse) -> web.StreamResponse:
        self.metrics.count_request(self._label(model), response.status)
        return response

    async def _finish(
        self, model: str, prepared: web.StreamResponse | None, response: web.Response
    ) -> web.StreamResponse:
        """Answer with an error: as itself, or as an SSE error event once a held stream's 200
        headers were sent."""
        self.metrics.count_request(self._label(model), response.status)
        if prepared is None:
            return response
        if not await send_error_event(prepared, response):
            self.metrics.client_disconnects.inc()
        return prepared


@dataclass(frozen=True)
class Attempt:
    """What every try at one tenant's request shares (the first model's, then a fallback's)."""

    request: web.Request
    ticket: Ticket
    headers: CIMultiDict[str]
    priority: PriorityClass
    started: float


def engine_key_refusal(backend: Backend) -> web.Response:
    """A model whose engine wants its own key, which the gateway never sends: the engine would
    answer 401, as if the client's key were wrong; this says what is wrong and who fixes it.
    Nothing is charged (before admission)."""
    cr = f"LLMDeployment {backend.namespace}/{backend.name}"
    message = (
        f"{cr} cannot be served through the gateway: its engine wants its own API key "
        "(spec.service.apiKeySecretRef), and the gateway authenticates clients itself and "
        "sends engines none. Its owner removes spec.service.apiKeySecretRef, or serves it "
        "through its own Service (spec.router.enabled: false); the CR is Degraded "
        "EngineKeyBehindGateway meanwhile"
    )
    return error(503, message, "ServiceUnavailableError")


async def _with_model(body: bytes, model: str) -> bytes:
    """The body sent to a fallback: its `model` is the fallback's (parsed off the event loop
    when large, as `Intake` parses)."""
    if len(body) <= INLINE_BYTES:
        return with_model(body, model)
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, with_model, body, model)


async def _rate_limit_headers(request: web.Request, response: web.StreamResponse) -> None:
    """Before an answer's headers go out: the gateway's rate-limit headers, when it admitted
    the request (the engine's own, if it sent any, are not the tenant's)."""
    fallback = request.get(FALLBACK_TO)
    if fallback:
        response.headers[contract.FALLBACK_HEADER] = fallback
    headers = request.get(RATE_LIMITS)
    if headers:
        response.headers.update(headers)


async def serve(
    router: Router,
    host: str,
    port: int,
    *,
    shutdown_delay: float = SHUTDOWN_DELAY_SECONDS,
    drain: float = DRAIN_SECONDS,
    stop: asyncio.Event | None = None,
    listening: Callable[[int], None] = lambda _port: None,
    admin_port: int | None = None,
    admin_listening: Callable[[int], None] = lambda _port: None,
) -> None:
    """Serve until SIGTERM or SIGINT (or `stop` is set), then drain: unready and still serving
    for `shutdown_delay` seconds, then the listener closes and answers in flight get up to
    `drain` seconds to finish. `listening` is told the bound port (`port` 0: any free one).
    With `admin_port`, the admin routes listen there (told to `admin_listening`) until the
    public side has drained: metrics stay scrapable through the drain."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    public = router.app()
    guard = edge.Edge(router.limits)
    public.middlewares.append(guard.middleware)
    # Handler cancellation on: a client that goes away cancels its upstream request at once.
    runner = web.AppRunner(
        public,
        handler_cancellation=True,
        access_log=None,
        shutdown_timeout=drain,
        keepalive_timeout=router.limits.keepalive_timeout,
    )
    admin = web.AppRunner(router.admin_app(), access_log=None, shutdown_timeout=1)
    await runner.setup()
    await admin.setup()
    try:
        if admin_port is not None:
            await web.TCPSite(admin, host, admin_port).start()
            admin_listening(admin.addresses[0][1])
        # The public port behind the connection cap and the header timeout (`edge`).
        await edge.start(runner, guard, host, port)
        listening(runner.addresses[0][1])
        await stop.wait()
        router.draining = True
        router.stop_holding()
        log.info("stopping: unready, serving %.1f s more, then draining", shutdown_delay)
        await asyncio.sleep(shutdown_delay)
        in_flight = router.table.total_in_flight()
        log.info("no new connections; %d answers in flight get %.0f s to finish", in_flight, drain)
    finally:
        await runner.cleanup()
        await admin.cleanup()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)


def static_table(path: str) -> RouteTable:
    """A table from a JSON file `{"models": {name: {"namespace", "name", "endpoints"}}}`
    (development and tests; in a cluster the watch fills the table). An entry with
    `"scaledToZero": true` is a CR at zero: its requests are held (nothing wakes it); one with
    `"maxNumSeqs": N` has engines of that batch (as `status.plan.maxNumSeqs` says), and one with
    `"fallback": [...]` those fallbacks (as `spec.router.fallback` says)."""
    with open(path, encoding="utf-8") as handle:
        document: Any = json.load(handle)
    table = RouteTable()
    for model, entry in document.get("models", {}).items():
        seqs = entry.get("maxNumSeqs")
        wake = Wake(
            scaled_to_zero=entry.get("scaledToZero") is True,
            concurrency=seqs if isinstance(seqs, int) and seqs > 0 else DEFAULT_CONCURRENCY,
        )
        fallback = fallback_of(entry.get("fallback"), (model,))
        table.set(
            model, entry["namespace"], entry["name"], entry["endpoints"], wake, fallback=fallback
        )
    return table


def static_externals(path: str) -> list[tuple[ExternalModel, str | None]]:
    """A static table's `"externalModels": {name: {...}}`: each as an `LLMExternalModel` spec,
    with its key inline as `"apiKey"` (development and tests; in a cluster the key is a
    Secret's)."""
    with open(path, encoding="utf-8") as handle:
        document: Any = json.load(handle)
    found = []
    for name, entry in (document.get("externalModels") or {}).items():
        spec = {k: v for k, v in entry.items() if k != "apiKey"}
        model = parse_external_model({"metadata": {"name": name}, "spec": spec}, "static")
        key = entry.get("apiKey")
        found.append((model, key if isinstance(key, str) else None))
    return found
