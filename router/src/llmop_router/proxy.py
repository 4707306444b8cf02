"""The upstream half of a request: send it to the pods of its pick, retrying before the first
byte, and relay the answer chunk by chunk as the engine writes it.

A request that fails before the engine's first response byte (connection refused or reset, or
503 from a draining engine) is retried once on a different pod; after the first byte nothing is
retried (the client has part of an answer), except a non-streaming completions or chat answer
cut mid-generation (`migration.cut_answer`): read whole before any of it is relayed, it runs
again once on the next pod. Streams are `migrating`'s. Answers go out with
`X-Accel-Buffering: no` so that an nginx in front does not hold chunks either. A client that
disconnects cancels the handler, which closes the upstream connection, which makes vLLM abort
the request. The pod counts the request in flight (`RouteTable.start`) until it ends, its
prompt as queued until the first byte.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from llmop_router.answers import (
    UNAVAILABLE_RETRY_AFTER,
    error_event,
    external_answer_headers,
    external_request_headers,
    forwarded_headers,
)
from llmop_router.externals import ExternalModel
from llmop_router.hold import Key
from llmop_router.metering import Tap
from llmop_router.metrics import RouterMetrics
from llmop_router.migrating import StreamForward
from llmop_router.migration import (
    RERUN_BODY_LIMIT,
    RERUN_PATHS,
    Record,
    Settings,
    cut_answer,
    stream_body,
)
from llmop_router.routes import Choice, RouteTable

log = logging.getLogger("llmop_router.proxy")

ATTEMPTS = 2
"""The first pick and one retry on a different pod."""
REFUSAL_BYTES = 64 * 1024
"""The most of an engine's error answer kept for a fallback to replace (the rest is dropped)."""
ENGINE_REFUSED = web.ResponseKey("llmop_engine_refused", int)
"""Set on an engine's own 5xx or 429 kept unsent (`keep_refusals`): its status."""


class Proxy:
    """Sends requests to engine pods over one connection pool and relays their answers."""

    def __init__(
        self,
        table: RouteTable,
        metrics: RouterMetrics,
        *,
        connect_timeout: float,
        draining: Callable[[], bool],
        migration: Settings | None = None,
    ) -> None:
        self.table = table
        self.migration = migration or Settings()
        """How streams whose engine fails after the first byte continue (`migrating`)."""
        self.metrics = metrics
        self.connect_timeout = connect_timeout
        self.draining = draining
        """Whether the router stops: every answer then closes its connection."""
        self._session: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, enable_cleanup_closed=True),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout),
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def forward(
        self,
        request: web.Request,
        body: bytes,
        choice: Choice,
        cr: Key,
        *,
        started: float,
        prepared: web.StreamResponse | None,
        tap: Tap | None = None,
        headers: CIMultiDict[str] | None = None,
        keep_refusals: bool = False,
    ) -> web.StreamResponse | None:
        """Try the pick's pods in order (at most `ATTEMPTS`) and relay the first answer; None
        when every attempt failed before answering. `started`: when the request arrived
        (`perf_counter`), for the routing time; `prepared`: a held stream's response, whose 200
        headers went out already. `tap` (the gateway's) sees the answer go by and may hold back
        what the client did not ask for; `headers`: what to send upstream instead of the
        client's end-to-end headers. With `keep_refusals`, an engine's own 5xx or 429 is not
        sent: it comes back unsent, marked `ENGINE_REFUSED`, for a fallback to replace."""
        if headers is None:
            headers = forwarded_headers(request.headers)
        url_tail = request.rel_url.raw_path_qs
        settings = self.migration
        limit = choice.backend.migration_limit
        if limit is not None and limit != settings.limit:
            settings = replace(settings, limit=limit)
        parsed = stream_body(request.method, request.path, body)
        if parsed is not None:
            # Completions and chat streams: whole events, continued elsewhere on a failure.
            assert self._session is not None
            return await StreamForward(
                session=self._session,
                table=self.table,
                metrics=self.metrics,
                settings=settings,
                record=Record.of(request.path, parsed, settings),
                raw_body=body,
                request=request,
                url_tail=url_tail,
                headers=headers,
                choice=choice,
                cr=cr,
                started=started,
                prepared=prepared,
                tap=tap,
                draining=self.draining(),
                relay_plain=lambda upstream, first_byte: self._relay(
                    request, upstream, prepared, first_byte, tap, keep_refusals=keep_refusals
                ),
            ).forward()
        pick = choice.pick
        attempts = pick.order[:ATTEMPTS]
        for attempt, endpoint in enumerate(attempts):
            last = attempt == len(attempts) - 1
            self.metrics.routed_by[pick.reason if attempt == 0 else "retry"].inc()
            if attempt == 0:
                self.metrics.routing_seconds.observe(time.perf_counter() - started)
            answered = await self._attempt(
                request,
                endpoint,
                url_tail,
                headers,
                body,
                cr=cr,
                prepared=prepared,
                last=last,
                prefill=pick.prefill_on(endpoint),
                tap=tap,
                rerun=not last and settings.limit > 0 and request.path in RERUN_PATHS,
                keep_refusals=keep_refusals,
            )
            if answered is not None:
                return answered
        return None

    async def _attempt(
        self,
        request: web.Request,
        endpoint: str,
        url_tail: str,
        headers: CIMultiDict[str],
        body: bytes,
        *,
        cr: Key,
        prepared: web.StreamResponse | None,
        last: bool,
        prefill: int = 0,
        tap: Tap | None = None,
        rerun: bool = False,
        keep_refusals: bool = False,
    ) -> web.StreamResponse | None:
        """Send to one pod and relay its answer; None when it failed before its first byte and
        another pod may be tried. The pod counts the request in flight until it ends, and its
        `prefill` (prompt characters) as queued until the answer's first byte. With `rerun`, a
        non-streaming completions or chat answer cut mid-generation (`cut_answer`) is held back
        and None returned: the request runs again, once, on the next pod."""
        assert self._session is not None
        table = self.table
        table.start(endpoint, cr, prefill)
        unanswered = [prefill]

        def first_byte() -> None:
            if unanswered:
                table.answered(endpoint, unanswered.pop())

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
                data = await self._held(upstream) if rerun else None
                if data is not None:
                    why = cut_answer(request.path, upstream.status, data)
                    if why is not None:
                        self.metrics.migrations.labels(why, "rerun").inc()
                        log.info(
                            "migration request=%s reason=%s outcome=rerun from=%s: a "
                            "non-streaming answer cut mid-generation runs again on the next pod",
                            str(request.headers.get("X-Request-Id", ""))[:64],
                            why,
                            endpoint,
                        )
                        return None
                if tap is not None:
                    tap.status = upstream.status
                return await self._relay(
                    request,
                    upstream,
                    prepared,
                    first_byte,
                    tap,
                    data=data,
                    keep_refusals=keep_refusals,
                )
        finally:
            first_byte()
            table.end(endpoint)

    async def forward_external(
        self,
        request: web.Request,
        body: bytes,
        external: ExternalModel,
        key: str | None,
        *,
        tap: Tap | None,
        headers: CIMultiDict[str],
    ) -> web.StreamResponse | None:
        """Send to an API outside the cluster with its own key (the tenant's never leaves) and
        relay its answer, whatever it is (one hop: nothing falls back further); None when it
        could not be reached (the caller keeps the model's own answer). The whole answer may
        take `timeoutSeconds`."""
        assert self._session is not None
        sent = external_request_headers(headers, key)
        timeout = aiohttp.ClientTimeout(
            total=external.timeout_seconds, sock_connect=self.connect_timeout
        )
        try:
            upstream = await self._session.request(
                "POST",
                external.url(request.path),
                headers=sent,
                data=body,
                allow_redirects=False,
                timeout=timeout,
            )
        except (TimeoutError, aiohttp.ClientError) as exc:
            self.metrics.upstream_errors.labels(type(exc).__name__).inc()
            log.warning(
                "external model %s/%s failed before answering: %s",
                external.namespace,
                external.name,
                exc,
            )
            return None
        async with upstream:
            if tap is not None:
                tap.status = upstream.status
            return await self._relay(request, upstream, None, tap=tap, external=True)

    @staticmethod
    async def _held(upstream: aiohttp.ClientResponse) -> bytes | None:
        """A whole JSON answer of bounded, known length, read to be checked before any of it is
        relayed; None for anything else (relayed as it comes)."""
        length = upstream.content_length
        if upstream.content_type != "application/json" or length is None:
            return None
        if length > RERUN_BODY_LIMIT:
            return None
        return await upstream.read()

    async def _relay(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        prepared: web.StreamResponse | None = None,
        first_byte: Callable[[], None] = lambda: None,
        tap: Tap | None = None,
        *,
        data: bytes | None = None,
        keep_refusals: bool = False,
        external: bool = False,
    ) -> web.StreamResponse:
        """Relay the answer: its bytes as they come, or `data` when it was read already. With
        `keep_refusals`, an engine's 5xx or 429 is read (bounded) and returned unsent; an
        `external` model's answer keeps only the headers a client may see."""
        if prepared is not None:
            return await self._relay_into(prepared, upstream, first_byte, tap, data)
        if keep_refusals and (upstream.status >= 500 or upstream.status == 429):
            return await _kept(upstream, data)
        response = web.StreamResponse(
            status=upstream.status,
            reason=upstream.reason,
            headers=external_answer_headers(upstream.headers)
            if external
            else forwarded_headers(upstream.headers),
        )
        response.headers["X-Accel-Buffering"] = "no"
        if self.draining():
            # `Connection: close`: the client's next request opens a new connection, which the
            # Service sends to another router pod; a kept-alive one would stay on this one.
            response.force_close()
        if upstream.content_length is not None:
            response.content_length = upstream.content_length
        if upstream.status != 200:
            tap = None  # an error answer: nothing to meter (the engine did no work for it)
        await response.prepare(request)
        try:
            if tap is None:
                async for chunk in _chunks(upstream, data):
                    first_byte()
                    await response.write(chunk)
            else:
                await self._relay_tapped(response, upstream, first_byte, tap, data)
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
        tap: Tap | None = None,
        data: bytes | None = None,
    ) -> web.StreamResponse:
        """The engine's answer into a held stream whose 200 headers (and heartbeats) went out:
        its events as they come, or its error as one SSE error event."""
        try:
            if upstream.status != 200:
                body = data if data is not None else await upstream.read()
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
                await prepared.write(error_event(body))
            elif tap is not None:
                await self._relay_tapped(prepared, upstream, first_byte, tap, data)
            else:
                async for chunk in _chunks(upstream, data):
                    first_byte()
                    await prepared.write(chunk)
            await prepared.write_eof()
        except ConnectionResetError:
            self.metrics.client_disconnects.inc()
        return prepared

    @staticmethod
    async def _relay_tapped(
        response: web.StreamResponse,
        upstream: aiohttp.ClientResponse,
        first_byte: Callable[[], None],
        tap: Tap,
        data: bytes | None = None,
    ) -> None:
        """Relay through the gateway's tap (it meters the answer and may hold back the usage
        event the client did not ask for)."""
        async for chunk in _chunks(upstream, data):
            first_byte()
            if tap.first_byte is None:
                tap.first_byte = time.monotonic()
            out = tap.feed(chunk)
            if out:
                await response.write(out)
        rest = tap.finish()
        if rest:
            await response.write(rest)


async def _kept(upstream: aiohttp.ClientResponse, data: bytes | None) -> web.Response:
    """An engine's error answer, read (at most `REFUSAL_BYTES`) and kept unsent."""
    body = bytearray()
    async for chunk in _chunks(upstream, data):
        body += chunk
        if len(body) >= REFUSAL_BYTES:
            break
    kept = web.Response(
        status=upstream.status,
        reason=upstream.reason,
        body=bytes(body[:REFUSAL_BYTES]),
        headers=forwarded_headers(upstream.headers),
    )
    if upstream.status in (429, 503) and "Retry-After" not in kept.headers:
        # Sent on when no fallback takes it: a refusal the client may retry says when.
        kept.headers["Retry-After"] = UNAVAILABLE_RETRY_AFTER
    kept[ENGINE_REFUSED] = upstream.status
    return kept


async def _chunks(upstream: aiohttp.ClientResponse, data: bytes | None) -> AsyncIterator[bytes]:
    """The answer's bytes: `data` when it was read whole already, else as they arrive."""
    if data is not None:
        if data:
            yield data
        return
    async for chunk in upstream.content.iter_any():
        yield chunk
