"""The proxy's path for streaming completions and chat: relay whole SSE events, and when the
upstream fails after its first byte, continue the answer on another replica of the same CR
(`migration`), or end it with one `event: error` that says why — never a silent truncation.

Failures after the first byte: the connection lost or reset, the body ended without
`[DONE]`, an in-band error event or `finish_reason` "abort"/"error" (eligible streams only:
the router parses their events; the others are relayed as bytes, so those two reach the client
as the engine sent them), no event for `inactivity_seconds` after the first one, or none for
`unready_idle_seconds` while the endpoint has left the route table. A failed endpoint is never
tried again for the request. Before the first 200 the proxy's rule holds: connect errors and a
503 are retried once on the next pod of the pick.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from llmop_router.answers import error_event, forwarded_headers
from llmop_router.hold import Key
from llmop_router.metering import Tap
from llmop_router.metrics import RouterMetrics
from llmop_router.migration import (
    DONE,
    MinTokensSpan,
    Record,
    Seen,
    Settings,
    Verdict,
    dumps,
    error_document,
)
from llmop_router.routes import Backend, Choice, RouteTable

log = logging.getLogger("llmop_router.migration")

ATTEMPTS = 2
"""Before the first 200: the first pick and one retry on a different pod (as the proxy)."""
TICK = 0.25
"""How often a quiet stream checks its inactivity bounds."""
DECODE_SECONDS = 1.0
"""The most a stream's last event waits for the engine to decode which of a merged event's
tokens completed a stop string (`StopChunk`); past it every id is kept."""
MAX_PENDING = 1 << 22
"""An incomplete event longer than this is relayed as bytes (and the stream no longer parsed)."""
EVENT_END = b"\n\n"
SPAN = "span"
"""`_events`' verdict for an event that needs decoding before its stop search (`_span`)."""

RelayPlain = Callable[[aiohttp.ClientResponse, Callable[[], None]], Awaitable[web.StreamResponse]]
"""The proxy's own relay, for answers that are not an SSE 200 (errors, a JSON answer)."""


class StreamForward:
    """One streaming request, over as many attempts as it takes."""

    def __init__(
        self,
        *,
        session: aiohttp.ClientSession,
        table: RouteTable,
        metrics: RouterMetrics,
        settings: Settings,
        record: Record,
        raw_body: bytes,
        request: web.Request,
        url_tail: str,
        headers: CIMultiDict[str],
        choice: Choice,
        cr: Key,
        started: float,
        prepared: web.StreamResponse | None,
        tap: Tap | None,
        draining: bool,
        relay_plain: RelayPlain,
    ) -> None:
        self.session = session
        self.table = table
        self.metrics = metrics
        self.settings = settings
        self.record = record
        self.raw_body = raw_body
        self.request = request
        self.url_tail = url_tail
        self.headers = headers
        self.choice = choice
        self.cr = cr
        self.started = started
        self.response = prepared
        self.tap = tap
        self.draining = draining
        self.relay_plain = relay_plain
        self.parse = record.refused is None
        """Eligible at the start: its events are parsed, recorded and rewritten."""
        self.opened = False
        """An upstream answered 200 (SSE): from here on every failure ends or migrates."""
        self.seam: tuple[float, str] | None = None
        """A continuation under way: when the failure was detected, and why."""
        self._first_byte: Callable[[], None] = lambda: None
        self.body = b""
        """What the next attempt sends."""
        self.failed: list[str] = []
        """Endpoints that failed this request: never tried again for it."""
        self.tries = 0
        """Attempts before the first 200."""
        self.migrations = 0
        self.revision: str | None = None
        """The model revision of the pod that began the answer (None: not known)."""
        self.pinned = False
        """The next attempt continues generated tokens: only a pod of `revision` may take it."""
        self._stopped: dict[str, object] | None = None
        """The event in which the router's stop string ended the answer, not yet sent."""
        self._span: tuple[MinTokensSpan, bytes] | None = None
        """The event crossing `min_tokens` and the events after it, to decode first."""

    # -- the attempts --------------------------------------------------------------------

    async def forward(self) -> web.StreamResponse | None:
        """Relay the answer, continuing it elsewhere as needed; None when every attempt failed
        before the first byte (the caller answers 503)."""
        self.body = self._body(None)
        try:
            while True:
                endpoint = self._next(self.failed, self.tries)
                if endpoint is None:
                    if not self.opened:
                        return None
                    return await self._give_up("no other ready replica", "no_replica")
                outcome = await self._attempt(endpoint, self.body, self._routed(endpoint))
                if isinstance(outcome, web.StreamResponse):
                    return outcome
                if outcome is None:
                    await self._end(b"")
                    return self.response
                self.failed.append(endpoint)
                if outcome == "connect" and not self.opened:
                    continue  # before the first byte: the proxy's plain retry
                ended = await self._recover(outcome, endpoint)
                if ended is not None:
                    return ended
        except ConnectionResetError:
            # The client went away: leaving closes the upstream connection too.
            self.metrics.client_disconnects.inc()
            return self.response

    def _routed(self, endpoint: str) -> bool:
        """Count the attempt; whether it is the last before the first byte (its 503 is then
        relayed, not retried)."""
        if self.opened:
            self.metrics.routed_by["retry"].inc()
            return False
        tries = self.tries
        self.metrics.routed_by[self.choice.pick.reason if tries == 0 else "retry"].inc()
        if tries == 0:
            self.metrics.routing_seconds.observe(time.perf_counter() - self.started)
        self.tries += 1
        return tries == ATTEMPTS - 1 or self._next([*self.failed, endpoint], tries + 1) is None

    async def _recover(self, trigger: str, endpoint: str) -> web.StreamResponse | None:
        """After an attempt failed mid-answer: end the answer (whole, or with an error event
        saying why), or set up the next attempt (None)."""
        record = self.record
        if self.parse and record.finished is not None:
            # Only the usage and `[DONE]` were lost: the answer itself is whole.
            self._count(trigger, "completed", endpoint, None)
            await self._end(record.ending(None))
            return self.response
        restart = record.events == 0 and not record.generated
        limit = self.settings.limit
        if self.migrations >= limit:
            why = "migration is off" if limit <= 0 else f"the migration limit ({limit}) is reached"
            return await self._give_up(why, "limit", trigger, endpoint)
        if not restart and record.refused is not None:
            why = f"the request cannot be continued ({record.refused})"
            return await self._give_up(why, "not_eligible", trigger, endpoint)
        continuation = record.continuation() if self.parse else None
        if self.parse and continuation is None:
            self._count(trigger, "completed", endpoint, None)
            await self._end(record.ending("length"))
            return self.response
        self.pinned = not restart
        following = self._next(self.failed, self.tries)
        if following is None:
            if self.pinned and self._unpinned_target():
                why = "no other ready replica serves the model revision that began it"
                return await self._give_up(why, "other_revision", trigger, endpoint)
            return await self._give_up("no other ready replica", "no_replica", trigger, endpoint)
        self.migrations += 1
        record.next_attempt()
        self.body = self._body(continuation)
        self.seam = (time.perf_counter(), trigger)
        self._count(trigger, "restarted" if restart else "continued", endpoint, following)
        return None

    def _body(self, continuation: dict[str, object] | None) -> bytes:
        if not self.parse:
            return self.raw_body
        if continuation is None:
            continuation = dict(self.record.body)
        continuation["return_token_ids"] = True
        return dumps(continuation)

    def _live(self, pinned: bool) -> set[str]:
        """The CR's endpoints in the table now (ready, not terminating); `pinned`: only those
        whose pod serves the revision that began the answer, where the CR's status says which
        pods serve which (`Backend.revisions`)."""
        live: set[str] = set()
        revisions: dict[str, str] | None = None
        own = self._own_backend()
        if own is not None:
            # The request's own name: an adapter's pins differ from its base's.
            live.update(own.ring.endpoints)
            revisions = own.revisions
        else:
            for backend in self.table.backends.values():
                if (backend.namespace, backend.name) == self.cr:
                    live.update(backend.ring.endpoints)
                    revisions = backend.revisions if revisions is None else revisions
        if not pinned or revisions is None:
            return live
        return {e for e in live if self.revision is not None and revisions.get(e) == self.revision}

    def _unpinned_target(self) -> bool:
        """Some pod other than the failed ones could take the request, revision aside."""
        return bool(self._live(pinned=False) - set(self.failed))

    def _own_backend(self) -> Backend | None:
        """The table's backend of the request's model name now, when it is still this CR's."""
        model = self.record.body.get("model")
        backend = self.table.backends.get(model) if isinstance(model, str) else None
        if backend is None or (backend.namespace, backend.name) != self.cr:
            return None
        return backend

    def _revision_of(self, endpoint: str) -> str | None:
        # The pick's backend knows the endpoint it picked; the table's, where the status named
        # it since.
        revisions = self.choice.backend.revisions
        if revisions is None or endpoint in revisions:
            return None if revisions is None else revisions[endpoint]
        own = self._own_backend()
        if own is not None and own.revisions is not None:
            return own.revisions.get(endpoint)
        return None

    def _next(self, failed: list[str], tries: int) -> str | None:
        """The next pod: before the first 200 the pick's order (at most `ATTEMPTS`); after it,
        any pod of the CR still in the table, the pick's order first, then the least loaded;
        never one that failed this request."""
        order = self.choice.pick.order
        if not self.opened:
            if tries >= ATTEMPTS:
                return None
            return next((e for e in order if e not in failed), None)
        live = self._live(self.pinned)
        ranked = [e for e in order if e in live]
        ranked += sorted(live - set(order), key=lambda e: (self.table.in_flight[e], e))
        return next((e for e in ranked if e not in failed), None)

    async def _attempt(
        self, endpoint: str, body: bytes, last: bool
    ) -> str | web.StreamResponse | None:
        """One upstream request: None when the answer ended well, a response when the proxy's
        relay answered (not an SSE 200), else why it failed."""
        table = self.table
        prefill = self.choice.pick.prefill_on(endpoint) if not self.opened else 0
        table.start(endpoint, self.cr, prefill)
        unanswered = [prefill]

        def first_byte() -> None:
            if unanswered:
                table.answered(endpoint, unanswered.pop())

        self._first_byte = first_byte
        try:
            try:
                upstream = await self.session.request(
                    "POST",
                    f"http://{endpoint}{self.url_tail}",
                    headers=self.headers,
                    data=body,
                    allow_redirects=False,
                )
            except (TimeoutError, aiohttp.ClientConnectionError) as exc:
                self.metrics.upstream_errors.labels(type(exc).__name__).inc()
                log.info("upstream %s failed before answering: %s", endpoint, exc)
                return "connect"
            async with upstream:
                sse = upstream.content_type == "text/event-stream"
                if upstream.status != 200 or not sse:
                    if self.opened:
                        upstream.close()
                        return "status"
                    if upstream.status == 503 and not last:
                        self.metrics.upstream_errors.labels("503").inc()
                        return "connect"
                    if self.tap is not None:
                        self.tap.status = upstream.status
                    return await self.relay_plain(upstream, first_byte)
                if not self.opened:
                    self.revision = self._revision_of(endpoint)
                    await self._open(upstream)
                outcome = await self._pump(upstream, endpoint)
                if outcome is not None:
                    upstream.close()  # vLLM aborts a request whose client left
                return outcome
        finally:
            first_byte()
            table.end(endpoint)

    async def _open(self, upstream: aiohttp.ClientResponse) -> None:
        """The first SSE 200: the client's response goes out (unless a held stream's did)."""
        self.opened = True
        if self.tap is not None:
            self.tap.status = upstream.status
        if self.response is not None:
            return
        headers = forwarded_headers(upstream.headers)
        response = web.StreamResponse(status=200, reason=upstream.reason, headers=headers)
        response.headers["X-Accel-Buffering"] = "no"
        if self.draining:
            response.force_close()
        self.response = response
        await response.prepare(self.request)

    # -- one attempt's events --------------------------------------------------------------

    async def _pump(self, upstream: aiohttp.ClientResponse, endpoint: str) -> str | None:
        """Relay whole events until `[DONE]` (None) or a failure (its reason)."""
        pending = b""
        got_event = False
        while True:
            data = await self._read(upstream.content, endpoint, got_event)
            if isinstance(data, str):
                return data
            self._first_byte()
            if self.tap is not None and self.tap.first_byte is None:
                self.tap.first_byte = time.monotonic()
            pending += data
            cut = pending.rfind(EVENT_END)
            if cut < 0:
                if len(pending) > MAX_PENDING:
                    # An event too large to hold: relayed as bytes, no longer understood.
                    self.parse = False
                    self.record.refused = self.record.refused or "an event too large to parse"
                    await self._write(pending)
                    pending = b""
                continue
            complete, pending = pending[: cut + 2], pending[cut + 2 :]
            got_event = True
            verdict = await self._relay(complete, endpoint)
            if verdict == "stopped":
                upstream.close()  # vLLM aborts a request whose client left
                await self._write(await self._stop_event(endpoint))
                return None
            if verdict:
                return None if verdict == "done" else verdict

    async def _read(
        self, content: aiohttp.StreamReader, endpoint: str, got_event: bool
    ) -> bytes | str:
        """The next bytes, or why there will be none: the connection failed (reset), the body
        ended (eof: no `[DONE]` came), no event for the inactivity bound (idle, after the
        first event: before it the engine may be queueing), or none for the shorter bound
        while the endpoint has left the route table (unready)."""
        loop = asyncio.get_running_loop()
        since = loop.time()
        settings = self.settings
        while True:
            try:
                async with asyncio.timeout(TICK):
                    data = await content.readany()
            except TimeoutError:
                idle = loop.time() - since
                if got_event and idle >= settings.inactivity_seconds:
                    return "idle"
                if idle >= settings.unready_idle_seconds and endpoint not in self._live(
                    pinned=False
                ):
                    return "unready"
                continue
            except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, ConnectionError):
                return "reset"
            return data or "eof"

    def _raw(self, complete: bytes) -> tuple[bytes, str]:
        """Events relayed as bytes: only their count and the end are looked for."""
        done = complete.find(DONE)
        if done >= 0:
            return complete[: done + len(DONE)], "done"
        self.record.events += complete.count(b"data:")
        return complete, ""

    async def _relay(self, complete: bytes, endpoint: str) -> str:
        """Send whole events on; their verdict ("": go on, "stopped", "done", or why the
        attempt failed)."""
        out, verdict = self._events(complete) if self.parse else self._raw(complete)
        while verdict == SPAN:
            if out:
                await self._write(out)
            out, verdict = await self._past_min_tokens(endpoint)
        if out:
            await self._write(out)
        return verdict

    def _events(self, complete: bytes) -> tuple[bytes, str]:
        """Parsed events: what to send on, and "" (go on), "done" or why the attempt failed."""
        out: list[bytes] = []
        record = self.record
        parts = complete.split(EVENT_END)
        for at, raw in enumerate(parts):
            if not raw.strip():
                continue
            data = _data(raw)
            if data is None:
                out.append(raw + EVENT_END)  # a comment or a named event: passed as is
                continue
            if data == b"[DONE]":
                out.append(DONE)
                return b"".join(out), "done"
            fast = record.see_bytes(data) if self.seam is None else None
            if fast is not None:
                out.append(b"data: " + fast + EVENT_END)
                continue
            try:
                doc = json.loads(data)
            except ValueError:
                record.refused = record.refused or "an event that is not JSON"
                out.append(raw + EVENT_END)
                continue
            span = record.min_tokens_span(doc) if record.stops is not None else None
            if span is not None:
                # Rare (once a stream at most): decoded before the event goes on.
                self._span = (span, EVENT_END.join(parts[at:]))
                return b"".join(out), SPAN
            verdict = self._seen(record.see(doc), doc, out)
            if verdict:
                return b"".join(out), verdict
        return b"".join(out), ""

    def _seen(self, seen: Seen, doc: dict[str, Any], out: list[bytes]) -> str:
        """One event as `Record.see` judged it: added to `out` ("": go on), or the attempt's
        verdict."""
        if seen.verdict is Verdict.FAIL:
            return seen.reason
        if seen.verdict is Verdict.DROP:
            return ""
        self._seam_relayed()
        if seen.verdict is Verdict.STOP:
            # The router's stop string ends the answer here; the engine's rest is dropped
            # (closing the upstream aborts it), and the event goes out from `_stop_event`.
            self._stopped = doc
            return "stopped"
        out.append(b"data: " + dumps(doc) + EVENT_END)
        return ""

    async def _past_min_tokens(self, endpoint: str) -> tuple[bytes, str]:
        """The event whose tokens cross `min_tokens` (`MinTokensSpan`, held by `_events`),
        once the engine's tokenizer said where in its text the stop search begins, and the
        events after it."""
        assert self._span is not None
        (span, rest), self._span = self._span, None
        texts = await self._decode(endpoint, span.prefixes())
        self.record.past_min_tokens(span.offset(texts))
        return self._events(rest)

    async def _stop_event(self, endpoint: str) -> bytes:
        """The event that completed the router's stop string, and the answer's end: when it
        carried several tokens, only those up to the one that completed the string are kept
        (as vLLM keeps them), which the engine's tokenizer says (`/detokenize`)."""
        doc, self._stopped = self._stopped, None
        assert doc is not None
        chunk = self.record.stop_chunk
        if chunk is not None:
            texts = await self._decode(endpoint, chunk.prefixes())
            self.record.keep_stop_ids(doc, chunk.kept(texts))
        return b"data: " + dumps(doc) + EVENT_END + self.record.ending(None)

    async def _decode(self, endpoint: str, prefixes: list[list[int]]) -> list[str | None]:
        """The engine's text of each id list (vLLM's `POST /detokenize`, all at once); None for
        one it did not answer (an engine without the route, gone, or slower than
        `DECODE_SECONDS`)."""
        headers = {"Content-Type": "application/json"}
        if "Authorization" in self.headers:
            headers["Authorization"] = self.headers["Authorization"]
        model = self.record.body.get("model")

        async def one(ids: list[int]) -> str | None:
            body = dumps({"model": model, "tokens": ids})
            url = f"http://{endpoint}/detokenize"
            async with self.session.post(url, data=body, headers=headers) as answer:
                if answer.status != 200:
                    return None
                doc = await answer.json(content_type=None)
            text = doc.get("prompt") if isinstance(doc, dict) else None
            return text if isinstance(text, str) else None

        try:
            async with asyncio.timeout(DECODE_SECONDS):
                return list(await asyncio.gather(*(one(ids) for ids in prefixes)))
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            log.info("%s could not decode a stop string's tokens: %r", endpoint, exc)
            return [None] * len(prefixes)

    def _seam_relayed(self) -> None:
        """A continuation's first event goes out: the seam's time is measured."""
        if self.seam is not None:
            detected, trigger = self.seam
            self.seam = None
            seconds = time.perf_counter() - detected
            self.metrics.migration_seam_seconds.labels(trigger).observe(seconds)

    # -- the client's side ---------------------------------------------------------------

    async def _write(self, out: bytes) -> None:
        assert self.response is not None
        if self.tap is not None:
            out = self.tap.feed(out)
            if not out:
                return
        await self.response.write(out)

    async def _end(self, tail: bytes) -> None:
        assert self.response is not None
        if tail:
            await self._write(tail)
        if self.tap is not None:
            rest = self.tap.finish()
            if rest:
                await self.response.write(rest)
        await self.response.write_eof()

    async def _give_up(
        self,
        why: str,
        outcome: str,
        trigger: str = "connect",
        endpoint: str = "",
    ) -> web.StreamResponse:
        """End the stream with one error event saying why it stopped."""
        self._count(trigger, outcome, endpoint, None)
        assert self.response is not None
        message = f"the answer was cut: its engine failed ({trigger}) and {why}"
        if self.tap is not None:
            rest = self.tap.finish()
            if rest:
                await self.response.write(rest)
        await self.response.write(error_event(error_document(message)))
        await self.response.write_eof()
        return self.response

    def _count(self, trigger: str, outcome: str, endpoint: str, following: str | None) -> None:
        self.metrics.migrations.labels(trigger, outcome).inc()
        record = self.record
        request_id = self.request.headers.get("X-Request-Id") or record.identity.get("id", "")
        log.info(
            "migration request=%s reason=%s outcome=%s from=%s to=%s prompt_ids=%d "
            "generated=%d attempt=%d",
            str(request_id)[:64],
            trigger,
            outcome,
            endpoint,
            following or "-",
            len(record.prompt_ids or ()),
            len(record.generated),
            record.attempt,
        )


def _data(raw: bytes) -> bytes | None:
    """The data of an event that is one `data:` line, else None."""
    if not raw.startswith(b"data:") or b"\n" in raw.strip():
        return None
    return raw[5:].strip()
