"""Holding and waking (docs/router.md, "Scale to zero"): the I/O around the pure queues of
`hold.py`.

A request for a CR with no ready endpoint whose Ready condition says `ScaledToZero` is held
(`hold.Holding` decides, a pump task per CR acts): the first one of an episode wakes the CR (its
workload's scale 0 → 1, by `waker`), and the held requests are released in arrival order at the
engines' concurrency once an endpoint is ready (or its agent answered the router's own
readiness question: `StartProbes`), answered 504 past `holdTimeoutSeconds`, refused
429 past `maxPendingRequests` or past the pod's caps across CRs (`--max-held-requests`,
`--max-held-bytes`), and 503 when this router pod stops. A held streaming request gets
an SSE comment every `heartbeat` seconds, so proxies in front see bytes; once that has sent the
200 headers, an error can no longer be a status (`answers.send_error_event`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import aiohttp
from aiohttp import web

from llmop_router import contract
from llmop_router.answers import error, prepare_stream
from llmop_router.hold import PHASE_REQUESTED, Held, Holding, Key
from llmop_router.limits import DEFAULT as DEFAULT_LIMITS
from llmop_router.limits import Limits
from llmop_router.metrics import RouterMetrics
from llmop_router.prefix import RoutingInfo
from llmop_router.routes import Backend, RouteTable

log = logging.getLogger("llmop_router.scale_to_zero")

HEARTBEAT_SECONDS = 10.0
"""A held streaming request gets an SSE comment this often (proxies cut idle streams at 30-60 s)."""
HOLD_TICK_SECONDS = 0.05
"""How often a CR's pump looks at its endpoints and deadlines while requests are held."""
WAKE_RETRY_SECONDS = 2.0
WAKE_TIMEOUT_SECONDS = 10.0
FULL_RETRY_AFTER_SECONDS = "10"
START_PROBE_SECONDS = 0.1
"""How often a starting pod's agent is asked whether it is ready while its CR's requests wait
(the kubelet asks every second, and the EndpointSlice carries its answer later still)."""
START_PROBE_TIMEOUT_SECONDS = 1.0
MAX_START_PROBES = 16
"""Starting pods of one CR asked at once (a wake starts one; an HPA may add more meanwhile):
the rest wait for the kubelet, so a CR of many pods costs a bounded number of tasks."""

Waker = Callable[[Backend], Awaitable[str]]
"""Wakes a CR at zero (scale subresource 0 → 1 when it is 0); returns the phase to wait in."""


class Starting(Protocol):
    """The watch's view of a CR's pods that are starting (`discovery.Catalog`)."""

    def starting_agents(self, service: Key) -> Mapping[str, str]:
        """Its starting endpoints not confirmed ready yet → their agents' `ip:port`."""
        ...

    def confirm_ready(self, service: Key, endpoint: str) -> None:
        """The endpoint's agent answered ready: route to it now."""
        ...


class NoStarting:
    """A static table: no watch, no starting pods to ask."""

    def starting_agents(self, service: Key) -> Mapping[str, str]:
        return {}

    def confirm_ready(self, service: Key, endpoint: str) -> None:
        return None


class StartProbes:
    """While one CR's requests are held and none of its endpoints is ready: each starting pod's
    agent asked `/readyz` every `START_PROBE_SECONDS` by a task of its own. The first 200 makes
    it routable (`Starting.confirm_ready`): the same answer the kubelet's readiness probe acts
    on (one success), without waiting up to its period and the EndpointSlice's update."""

    def __init__(self, key: Key, starting: Starting) -> None:
        self.key = key
        self.starting = starting
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._session: aiohttp.ClientSession | None = None

    def update(self) -> None:
        """Ask every starting endpoint the watch lists now; stop asking the ones it dropped."""
        listed = self.starting.starting_agents(self.key)
        agents = {e: listed[e] for e in sorted(listed)[:MAX_START_PROBES]}
        for endpoint in set(self._tasks) - set(agents):
            self._tasks.pop(endpoint).cancel()
        for endpoint, agent in agents.items():
            if endpoint not in self._tasks:
                self._tasks[endpoint] = asyncio.create_task(self._ask(endpoint, agent))

    @property
    def asking(self) -> frozenset[str]:
        """The endpoints being asked now."""
        return frozenset(self._tasks)

    def follow(self, endpoints: tuple[str, ...]) -> None:
        """Ask while the CR has no routable endpoint; stop once it has one."""
        if endpoints:
            self.stop()
        else:
            self.update()

    def stop(self) -> None:
        """An endpoint is ready: nothing more to ask."""
        for task in self._tasks.values():
            task.cancel()
        self._tasks.clear()

    async def close(self) -> None:
        self.stop()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _ask(self, endpoint: str, agent: str) -> None:
        if self._session is None:
            timeout = aiohttp.ClientTimeout(total=START_PROBE_TIMEOUT_SECONDS)
            self._session = aiohttp.ClientSession(timeout=timeout)
        url = f"http://{agent}{contract.AGENT_READY_PATH}"
        while True:
            try:
                async with self._session.get(url, allow_redirects=False) as answer:
                    if answer.status == 200:
                        log.info(
                            "%s/%s: %s answered ready to the router; routing to it before its "
                            "EndpointSlice says so",
                            *self.key,
                            endpoint,
                        )
                        self.starting.confirm_ready(self.key, endpoint)
                        return
            except (aiohttp.ClientError, TimeoutError, OSError):
                pass  # not listening yet, or busy starting: asked again
            await asyncio.sleep(START_PROBE_SECONDS)


@dataclass(frozen=True)
class Outcome:
    """How a hold ended: `go` (route it now), `timeout` (504), `full` or `router-full` (429,
    never held), `stopping` (503) or `gone` (the client left while held)."""

    kind: str
    phase: str = ""


class Holder:
    """Holds requests for CRs at zero, wakes the CRs and releases the requests."""

    def __init__(
        self,
        table: RouteTable,
        metrics: RouterMetrics,
        *,
        heartbeat: float = HEARTBEAT_SECONDS,
        waker: Waker | None = None,
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        self.table = table
        self.metrics = metrics
        self.heartbeat = heartbeat
        self.waker = waker
        """None (a static table): held requests wait for endpoints, nothing is scaled."""
        self.starting: Starting = NoStarting()
        """The watch's starting pods (a static table has none: held requests wait for ready
        endpoints only)."""
        self.queues = Holding(
            max_held=limits.max_held_requests, max_held_bytes=limits.max_held_bytes
        )
        self._waiters: dict[int, asyncio.Future[Outcome]] = {}
        self._pumps: dict[Key, asyncio.Task[None]] = {}

    def should_hold(self, key: Key, backend: Backend, has_endpoints: bool) -> bool:
        """Hold while others for this CR wait (first come, first served), or when it has no
        ready endpoint and the operator scaled it to zero. A CR at replicas 0 for another
        reason (a hand-set `spec.replicas: 0`) is answered 503, never woken."""
        if self.queues.holding(key):
            return True
        return not has_endpoints and backend.wake.scaled_to_zero

    async def hold(
        self,
        request: web.Request,
        info: RoutingInfo,
        backend: Backend,
        key: Key,
        *,
        size: int = 0,
        priority: int = 0,
    ) -> tuple[Outcome, web.StreamResponse | None]:
        """Wait until released, timed out or stopped (`size`: the body's bytes, held with it;
        `priority`: released before lower ones); returns the outcome and, for a stream that got
        heartbeats, its already prepared response."""
        loop = asyncio.get_running_loop()
        admission = self.queues.admit(key, loop.time(), backend.wake.settings, size, priority)
        if admission.held is None:
            return Outcome(admission.refused), None
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
                            prepared = await prepare_stream(request)
                        await prepared.write(note.encode())
                    except ConnectionResetError:
                        return Outcome("gone"), prepared
        finally:
            self._waiters.pop(held.ticket, None)
            if not future.done():
                # The client went away while held: it leaves the queue.
                self.queues.leave(key, held.ticket)
                self._gauge(key)

    def refusal(self, outcome: Outcome, backend: Backend) -> web.Response:
        """The answer to a hold that did not end in `go` (counted by why)."""
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
        if outcome.kind == "router-full":
            self.metrics.hold_refused.labels(*key, "router-full").inc()
            queues = self.queues
            message = (
                f"this router pod already holds {queues.total} requests ({queues.total_bytes} "
                f"bytes of bodies) for models at zero, its limit (--max-held-requests "
                f"{queues.max_held}, --max-held-bytes {queues.max_held_bytes}); {cr} was not "
                f"woken for this request: retry later"
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

    def stop(self) -> None:
        """Answer every held request 503 (this pod stops; the client's retry goes elsewhere)."""
        for key, held in self.queues.take_all():
            self._resolve(held, Outcome("stopping"))
            self._gauge(key)

    def close(self) -> None:
        """Stop holding and end the pumps (the app is cleaned up)."""
        self.stop()
        for task in self._pumps.values():
            task.cancel()

    def _gauge(self, key: Key) -> None:
        self.metrics.held.labels(*key).set(self.queues.held(key))

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
        probes = StartProbes(key, self.starting)
        try:
            while self.queues.holding(key):
                now = loop.time()
                episode = self.queues.episodes[key]
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
                probes.follow(endpoints)
                if endpoints and not ready_seen:
                    ready_seen = True
                    self.metrics.wake_seconds.observe(now - episode.started)
                phase = episode.phase
                for held in self.queues.expire(key, now):
                    self._resolve(held, Outcome("timeout", phase))
                if backend is not None:
                    released = self.queues.release(
                        key, self.table.in_flight, endpoints, backend.wake.concurrency
                    )
                    for held in released:
                        self._resolve(held, Outcome("go"))
                self._gauge(key)
                await asyncio.sleep(HOLD_TICK_SECONDS)
        finally:
            self._pumps.pop(key, None)
            self._gauge(key)
            await probes.close()

    async def _wake(self, key: Key, backend: Backend | None) -> bool:
        """Wake the CR once for this episode; True when it failed and is to be tried again."""
        if backend is None or not backend.wake.scaled_to_zero:
            # The CR left ScaledToZero (or the table) since: nothing to wake, only to wait.
            self.queues.woke(key, "waiting: the CR is not ScaledToZero, no ready replica yet")
            return False
        if self.waker is None:
            self.queues.woke(key, "waiting: no Kubernetes access to scale, no ready replica yet")
            return False
        try:
            phase = await asyncio.wait_for(self.waker(backend), WAKE_TIMEOUT_SECONDS)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # any failure is retried while requests wait
            log.warning("waking %s/%s failed: %s", *key, exc)
            self.queues.note(key, f"waking: the scale request failed ({exc}); retrying")
            return True
        if phase == PHASE_REQUESTED:
            self.metrics.wakes.labels(*key).inc()
        self.queues.woke(key, phase)
        return False
