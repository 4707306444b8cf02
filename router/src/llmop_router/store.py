"""Where the gateway's counters live: a shared Redis (or Valkey) for every router replica, or
this process's memory — the one module that talks to the store.

Every router replica charges the same buckets, so a tenant's limit is the tenant's limit, not
the limit times the replicas. Admission is one Lua script (atomic: all of a request's
buckets, its budget and its concurrency lease, or none), settlement another; both take the
time from the store's own clock (`TIME`) so replicas never disagree about it. The scripts of
many requests share round trips (`Pipe`): the router's CPU per request, not Redis, is what a
round trip costs. Keys of
one tenant share a hash tag (`{t:<tenant>}`), so a Redis Cluster keeps them on one shard.

Layout: `llmop:{t:T}:gcra:<bucket>` the bucket's TAT (ms, expires when full again);
`llmop:{t:T}:lease` a sorted set request id → expiry (ms); `llmop:{t:T}:usage:<YYYY-MM>` a hash
of `<model>:in|cached|out|picos` and `total:picos` (kept 400 days);
`llmop:{t:T}:settled:<request id>` a marker that the request was settled (an hour).

`Guarded` wraps the shared store: 3 failed or slow calls in a row open a breaker for a few
seconds, during which requests are admitted by a local store holding `1/replicas` of each
limit, its buckets starting empty (fail open), or refused 503 (fail closed). Settlements the
store did not confirm are sent again when it answers, and its script counts each request once,
so usage is neither lost nor doubled.

`Bus` carries the router pods' messages to each other (slots lent between them: `loans`) on
the store's pub/sub channel `llmop:router:slots`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import itertools
import json
import logging
import ssl
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, cast

from llmop_router.quota import (
    LEASE_MS,
    Admission,
    Bucket,
    Decision,
    Refused,
    Usage,
    bucket_delta,
    gcra,
    settled_tat,
)
from llmop_router.resp import Parser, ProtocolError, ReplyError, pack

log = logging.getLogger("llmop_router.store")

USAGE_TTL_SECONDS = 400 * 86_400
SETTLED_MARKER_MS = 3_600_000
"""How long a request's settlement is remembered (so it counts once): longer than any outage
the router waits out before sending it again."""
LINGER_SECONDS = 0.005
"""How long a settlement may wait for an admission's batch to go with: a lease comes back
and a refund lands that much later, never lost."""
MAX_CONNECTIONS = 4
"""Connections of the client library's pool (a tenant's usage, for its status): requests'
commands go through `Pipe`'s one connection."""
CONCURRENCY_RETRY_MS = 1000
"""Retry-After of a request refused for the tenant's concurrency cap: when a lease frees is
not known (it is when some answer ends), so a second, as OpenAI's clients expect."""

_REFUSED_BY_CHARGE = {
    "requests": Refused.REQUESTS,
    "tokens": Refused.TOKENS,
    "output_tokens": Refused.OUTPUT_TOKENS,
}


def usage_fields(model: str, usage: Usage, cost_picos: int) -> dict[str, int]:
    """The usage hash's increments for one request."""
    fields = {
        f"{model}:in": usage.input_tokens,
        f"{model}:cached": usage.cached_tokens,
        f"{model}:out": usage.output_tokens,
        f"{model}:picos": cost_picos,
        "total:picos": cost_picos,
    }
    return {k: v for k, v in fields.items() if v}


class StoreUnavailableError(Exception):
    """The shared store did not answer and the gateway fails closed."""


class Store(Protocol):
    async def admit(self, ask: Admission) -> Decision: ...

    async def settle(
        self, ask: Admission, usage: Usage, cost_picos: int, *, charged: bool
    ) -> None: ...

    async def renew(self, leases: Iterable[tuple[str, str]]) -> None:
        """Extend the leases (tenant, request id) of requests still running."""
        ...

    async def usage(self, tenant: str, month: str) -> dict[str, int]: ...

    async def close(self) -> None: ...


# --- This process's memory ----------------------------------------------------------------------


@dataclass
class Local:
    """The same arithmetic in memory, with each limit scaled by `share` (1: a lone router;
    1/replicas: this replica's part while the shared store is down)."""

    share: float = 1.0
    clock: Callable[[], float] = time.time
    tats: dict[tuple[str, str], float] = field(default_factory=dict)
    leases: dict[str, dict[str, float]] = field(default_factory=dict)
    totals: dict[tuple[str, str], Counter[str]] = field(default_factory=dict)
    empty_since: float | None = None
    """Set (ms): a bucket not used since starts empty at that moment, not full (the shared
    store may have just admitted a burst: this replica's fallback must not grant another)."""

    def start_empty(self) -> None:
        """From now on, every bucket starts empty."""
        self.tats = {}
        self.empty_since = self.clock() * 1000

    def _tat(self, key: tuple[str, str], bucket: Bucket) -> float | None:
        tat = self.tats.get(key)
        if tat is None and self.empty_since is not None:
            return self.empty_since + bucket.tau_ms
        return tat

    def _scaled(self, bucket: Bucket) -> Bucket:
        if self.share >= 1:
            return bucket
        return replace(bucket, limit=max(1, int(bucket.limit * self.share)))

    async def admit(self, ask: Admission) -> Decision:
        now = self.clock() * 1000
        if ask.budget_picos is not None:
            spent = self.totals.get((ask.tenant, ask.month), Counter())["total:picos"]
            if spent >= ask.budget_picos:
                return Decision(Refused.BUDGET)
        answers = []
        wait, why = 0.0, None
        for bucket in ask.buckets:
            scaled = self._scaled(bucket)
            answer = gcra(self._tat((ask.tenant, bucket.key), scaled), now, scaled)
            if not answer.admitted and answer.retry_after_ms >= wait:
                wait, why = answer.retry_after_ms, _REFUSED_BY_CHARGE[bucket.charge]
            answers.append((bucket, answer))
        if why is not None:
            return Decision(why, retry_after_ms=max(1, int(wait + 0.999)))
        if ask.concurrency is not None:
            held = self.leases.setdefault(ask.tenant, {})
            for request_id in [r for r, expiry in held.items() if expiry <= now]:
                del held[request_id]
            cap = max(1, int(ask.concurrency * self.share)) if self.share < 1 else ask.concurrency
            if len(held) >= cap:
                return Decision(Refused.CONCURRENCY, retry_after_ms=CONCURRENCY_RETRY_MS)
            held[ask.request_id] = now + LEASE_MS
        for bucket, answer in answers:
            self.tats[(ask.tenant, bucket.key)] = answer.tat
        return Decision(
            None,
            remaining={b.key: a.remaining for b, a in answers},
            reset_ms={b.key: int(a.tat - now) for b, a in answers},
        )

    async def settle(self, ask: Admission, usage: Usage, cost_picos: int, *, charged: bool) -> None:
        now = self.clock() * 1000
        if charged:
            for bucket in ask.buckets:
                delta = bucket_delta(bucket, usage.input_tokens, usage.output_tokens, ask.estimate)
                if delta:
                    key = (ask.tenant, bucket.key)
                    scaled = self._scaled(bucket)
                    self.tats[key] = settled_tat(self.tats.get(key), now, delta, scaled.interval_ms)
            self.leases.get(ask.tenant, {}).pop(ask.request_id, None)
        self.add_usage(ask.tenant, ask.month, usage_fields(ask.model, usage, cost_picos))

    def add_usage(self, tenant: str, month: str, fields: dict[str, int]) -> None:
        self.totals.setdefault((tenant, month), Counter()).update(fields)

    async def renew(self, leases: Iterable[tuple[str, str]]) -> None:
        expiry = self.clock() * 1000 + LEASE_MS
        for tenant, request_id in leases:
            held = self.leases.get(tenant, {})
            if request_id in held:
                held[request_id] = expiry

    async def usage(self, tenant: str, month: str) -> dict[str, int]:
        return dict(self.totals.get((tenant, month), Counter()))

    async def close(self) -> None:
        return None


# --- Redis --------------------------------------------------------------------------------------

ADMIT_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local n = tonumber(ARGV[1])
local cap = tonumber(ARGV[2])
local id = ARGV[3]
local lease_ms = tonumber(ARGV[4])
local budget = tonumber(ARGV[5])
if budget >= 0 then
  local spent = tonumber(redis.call('HGET', KEYS[n + 2], 'total:picos') or '0')
  if spent >= budget then return 'budget' end
end
local tats = {}
local out = {'ok'}
local wait, which = 0, 0
for i = 1, n do
  local base = 5 + (i - 1) * 3
  local interval = tonumber(ARGV[base + 1])
  local tau = tonumber(ARGV[base + 2])
  local cost = tonumber(ARGV[base + 3])
  local tat = tonumber(redis.call('GET', KEYS[i]) or '0')
  if tat < now then tat = now end
  local new = tat + cost * interval
  if new - now > tau then
    if new - tau - now >= wait then wait, which = new - tau - now, i end
  end
  tats[i] = new
  out[#out + 1] = string.format('%d', math.floor((tau - (new - now)) / interval))
  out[#out + 1] = string.format('%d', math.ceil(new - now))
end
if which > 0 then return string.format('refused %d %d', math.ceil(wait), which) end
if cap >= 0 then
  local lease = KEYS[n + 1]
  redis.call('ZREMRANGEBYSCORE', lease, '-inf', now)
  if redis.call('ZCARD', lease) >= cap then return 'concurrency' end
  redis.call('ZADD', lease, now + lease_ms, id)
  redis.call('PEXPIRE', lease, lease_ms * 2)
end
for i = 1, n do
  redis.call('SET', KEYS[i], string.format('%.3f', tats[i]), 'PX', math.ceil(tats[i] - now) + 1000)
end
return table.concat(out, ' ')
"""

SETTLE_SCRIPT = """
local n = tonumber(ARGV[1])
if not redis.call('SET', KEYS[n + 3], '1', 'NX', 'PX', tonumber(ARGV[5])) then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local charged = ARGV[2] == '1'
local id = ARGV[3]
local ttl = tonumber(ARGV[4])
if charged then
  for i = 1, n do
    local interval = tonumber(ARGV[5 + (i - 1) * 2 + 1])
    local delta = tonumber(ARGV[5 + (i - 1) * 2 + 2])
    if delta ~= 0 then
      local tat = tonumber(redis.call('GET', KEYS[i]) or '0')
      if tat < now then tat = now end
      tat = tat + delta * interval
      if tat < now then tat = now end
      redis.call('SET', KEYS[i], string.format('%.3f', tat), 'PX', math.ceil(tat - now) + 1000)
    end
  end
end
redis.call('ZREM', KEYS[n + 1], id)
local first = 5 + n * 2 + 1
for j = first, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[n + 2], ARGV[j], ARGV[j + 1])
end
if #ARGV >= first then redis.call('EXPIRE', KEYS[n + 2], ttl) end
return 1
"""
"""Once per request id (a marker key that expires), whatever retries or late deliveries: a
settlement that timed out on the router's side may still run when the store resumes, and the
router sends it again when the store answers (both may happen; only one counts)."""

RENEW_SCRIPT = """
local t = redis.call('TIME')
local expiry = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000 + tonumber(ARGV[1])
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[i - 1], 'XX', expiry, ARGV[i])
end
return 1
"""


SCRIPTS = (ADMIT_SCRIPT, SETTLE_SCRIPT, RENEW_SCRIPT)


def tenant_key(tenant: str, suffix: str) -> str:
    return f"llmop:{{t:{tenant}}}:{suffix}"


class Pipe:
    """Commands to the store on one pipelined connection: every command asked for in one turn of
    the event loop goes out in one write, and each reply resolves its caller's future as soon as
    it is read, in the connection's own callback (`resp` parses it).

    A round trip costs the router more than the script costs Redis, and under load each hop
    through the event loop costs a waiting request a millisecond or more: so no reader task
    and no client-library layers between the socket and the request, and dozens of admissions
    and settlements share a write. A lone admission goes out on the next turn, so it waits for
    no batch to fill; commands nobody waits on (settlements, renewals) linger up to
    `LINGER_SECONDS` for the next admission's batch, so a request costs one round trip, not
    two. Redis runs one connection's commands in order, as it runs many connections' (one
    thread): batches in flight follow each other on the one connection. A batch not answered
    within `timeout` fails every command still waiting and drops the connection; the next
    command opens a new one. Scripts go as `EVALSHA`; one the server does not know (it
    restarted) is sent again as `EVAL`, which loads it."""

    def __init__(self, address: StoreAddress, timeout: float) -> None:
        self.address = address
        self.timeout = timeout
        self._queue: list[_Call] = []
        self._scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._connection: _Connection | None = None
        self._connecting: asyncio.Task[None] | None = None

    def call(
        self,
        *args: Any,
        script: str | None = None,
        abandoned: Callable[[Any], None] | None = None,
        linger: bool = False,
    ) -> asyncio.Future[Any]:
        """The reply of one command (`script`: the body of an `EVALSHA`'s script; an error
        reply is the future's exception). `abandoned` gets the reply of a command whose caller
        stopped waiting for it; `linger`: no request waits on it, it may go with the next
        batch."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._queue.append(_Call(args, future, script, abandoned))
        if self._scheduled:
            pass
        elif not linger:
            # Sent on the next turn, after every request ready in this one has queued its
            # command: they go together, and none waits longer than that turn.
            self._scheduled = True
            loop.call_soon(self._flush)
        elif self._timer is None:
            self._timer = loop.call_later(LINGER_SECONDS, self._flush)
        return future

    def script(
        self,
        body: str,
        sha: str,
        keys: list[str],
        args: list[Any],
        *,
        abandoned: Callable[[Any], None] | None = None,
        linger: bool = False,
    ) -> asyncio.Future[Any]:
        return self.call(
            "EVALSHA", sha, len(keys), *keys, *args, script=body, abandoned=abandoned, linger=linger
        )

    def send(self, *args: Any) -> None:
        """A command whose reply nobody needs (a failure is logged)."""
        self.call(*args, linger=True).add_done_callback(_log_failure)

    def _flush(self) -> None:
        """Send what is queued now as one batch, once connected."""
        self._scheduled = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._queue:
            return
        connection = self._connection
        if connection is not None and connection.open:
            batch, self._queue = self._queue, []
            self._send(connection, batch)
        elif self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())

    def _send(self, connection: _Connection, batch: list[_Call]) -> None:
        connection.send(batch)

    async def _connect(self) -> None:
        """A new connection, then what queued meanwhile; if it fails, what queued fails."""
        try:
            async with asyncio.timeout(self.timeout):
                self._connection = await _Connection.open_to(self.address, self.timeout)
        except BaseException as exc:
            failure = exc if isinstance(exc, Exception) else ConnectionError("cancelled")
            queued, self._queue = self._queue, []
            for call in queued:
                call.fail(failure)
            if not isinstance(exc, Exception):
                raise
        finally:
            self._connecting = None
        self._flush()

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._connecting is not None:
            self._connecting.cancel()
        if self._connection is not None:
            self._connection.close(ConnectionError("the router closed its store connection"))


def url_options(url: str, password: str | None = None) -> dict[str, Any]:
    """The store's URL as redis-py reads it (`parse_url`: `redis://[user:password@]host[:port]
    [/db]`, `rediss://…` for TLS, `unix:///path[?db=N]`), for both of `Redis`'s clients, so
    they connect alike; a password given apart (`--store-password-file`) wins over one in the
    URL."""
    from redis.asyncio.connection import parse_url

    try:
        options: dict[str, Any] = dict(parse_url(url))
    except ValueError as exc:
        raise ValueError(
            f"store URL {url!r}: use redis://host:port/db, rediss://… (TLS) or unix:///path ({exc})"
        ) from exc
    if password is not None:
        options["password"] = password
    return options


@dataclass(frozen=True)
class StoreAddress:
    """Where the pipe connects: the store URL's parts (`url_options`); TLS is verified against
    the system's CAs."""

    host: str = "localhost"
    port: int = 6379
    path: str = ""
    tls: bool = False
    db: int = 0
    username: str | None = None
    password: str | None = None

    @classmethod
    def of(cls, url: str, password: str | None = None) -> StoreAddress:
        from redis.asyncio.connection import SSLConnection

        options = url_options(url, password)
        return cls(
            host=options.get("host") or "localhost",
            port=int(options.get("port") or 6379),
            path=options.get("path") or "",
            tls=options.get("connection_class") is SSLConnection,
            db=int(options.get("db") or 0),
            username=options.get("username"),
            password=options.get("password"),
        )


class _Connection(asyncio.Protocol):
    """One connection to the store: replies come in the order the commands went."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.parser = Parser()
        self.waiting: collections.deque[_Call] = collections.deque()
        self.transport: asyncio.Transport | None = None
        self.open = False

    @classmethod
    async def open_to(cls, address: StoreAddress, timeout: float) -> _Connection:
        loop = asyncio.get_running_loop()
        connection: _Connection
        if address.path:
            _, connection = await loop.create_unix_connection(lambda: cls(timeout), address.path)
        else:
            tls = ssl.create_default_context() if address.tls else None
            _, connection = await loop.create_connection(
                lambda: cls(timeout), address.host, address.port, ssl=tls
            )
        hello: list[_Call] = []
        if address.password is not None:
            who = (address.username,) if address.username else ()
            hello.append(_Call(("AUTH", *who, address.password), loop.create_future()))
        if address.db:
            hello.append(_Call(("SELECT", address.db), loop.create_future()))
        if hello:
            connection.send(hello)
            try:
                await asyncio.gather(*(call.future for call in hello))
            except BaseException:
                connection.close(ConnectionError("the store refused the connection's setup"))
                raise
        connection.open = True
        return connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not `asyncio.Transport` subclasses; both have its methods.
        self.transport = cast(asyncio.Transport, transport)

    def send(self, batch: list[_Call]) -> None:
        assert self.transport is not None
        self.waiting.extend(batch)
        last = batch[-1]
        last.timer = asyncio.get_running_loop().call_later(self.timeout, self._expired, last)
        self.transport.write(pack([call.args for call in batch]))

    def _expired(self, call: _Call) -> None:
        if call.timer is not None:  # still unanswered (an answer cancels its timer)
            self.close(TimeoutError(f"the store did not answer within {self.timeout:g} s"))

    def data_received(self, data: bytes) -> None:
        try:
            replies = self.parser.feed(data)
        except (ProtocolError, ValueError) as exc:
            self.close(ConnectionError(f"the store's answer is not RESP: {exc}"))
            return
        for reply in replies:
            if not self.waiting:
                self.close(ConnectionError("the store answered a command it was not sent"))
                return
            call = self.waiting.popleft()
            if call.timer is not None:
                call.timer.cancel()
                call.timer = None
            if isinstance(reply, ReplyError) and reply.no_script and call.script is not None:
                again = ("EVAL", call.script, *call.args[2:])
                self.send([_Call(again, call.future, None, call.abandoned)])
                continue
            call.answer(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.close(exc or ConnectionError("the store closed the connection"))

    def close(self, failure: Exception) -> None:
        """Fail every command still waiting, and drop the connection."""
        self.open = False
        waiting, self.waiting = self.waiting, collections.deque()
        for call in waiting:
            call.fail(failure)
        if self.transport is not None:
            self.transport.abort()


@dataclass(slots=True)
class _Call:
    args: tuple[Any, ...]
    future: asyncio.Future[Any]
    script: str | None = None
    abandoned: Callable[[Any], None] | None = None
    timer: asyncio.TimerHandle | None = None
    """Set on a batch's last command until it is answered: the batch's bound."""

    def answer(self, reply: Any) -> None:
        if self.future.done():  # its caller stopped waiting (cancelled, timed out)
            if self.abandoned is not None and not isinstance(reply, Exception):
                self.abandoned(reply)
        elif isinstance(reply, Exception):
            self.future.set_exception(reply)
        else:
            self.future.set_result(reply)

    def fail(self, failure: Exception) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if not self.future.done():
            self.future.set_exception(failure)


def _log_failure(future: asyncio.Future[Any]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.info("a store command failed: %s", future.exception())


class Redis:
    """The shared store: one script call to admit a request, one to settle it, batched with
    the other requests' (`Pipe`)."""

    def __init__(self, url: str, *, timeout: float, password: str | None = None) -> None:
        import redis.asyncio as aioredis

        self.options = url_options(url, password)
        """How to reach the store (`url_options`): the pods' messages subscribe with it."""
        pool = aioredis.BlockingConnectionPool(
            **self.options,
            max_connections=MAX_CONNECTIONS,
            timeout=None,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            decode_responses=True,
            health_check_interval=0,
        )
        self.client: Any = aioredis.Redis(connection_pool=pool)
        """For the rare calls (a tenant's usage); requests go through `pipe`."""
        self.pipe = Pipe(StoreAddress.of(url, password), timeout)
        self._shas = {s: hashlib.sha1(s.encode()).hexdigest() for s in SCRIPTS}

    async def admit(self, ask: Admission) -> Decision:
        keys = [tenant_key(ask.tenant, f"gcra:{b.key}") for b in ask.buckets]
        keys += [tenant_key(ask.tenant, "lease"), tenant_key(ask.tenant, f"usage:{ask.month}")]
        args: list[str | int] = [
            len(ask.buckets),
            -1 if ask.concurrency is None else ask.concurrency,
            ask.request_id,
            LEASE_MS,
            -1 if ask.budget_picos is None else ask.budget_picos,
        ]
        for bucket in ask.buckets:
            args += [repr(bucket.interval_ms), repr(bucket.tau_ms), bucket.cost]
        answer = await self.pipe.script(
            ADMIT_SCRIPT,
            self._shas[ADMIT_SCRIPT],
            keys,
            args,
            abandoned=None if ask.concurrency is None else self._release(ask),
        )
        # One string, not an array: the client parses one reply, not one per bucket.
        answer = answer.split()
        verdict = answer[0]
        if verdict == "budget":
            return Decision(Refused.BUDGET)
        if verdict == "concurrency":
            return Decision(Refused.CONCURRENCY, retry_after_ms=CONCURRENCY_RETRY_MS)
        if verdict == "refused":
            bucket = ask.buckets[int(answer[2]) - 1]
            return Decision(
                _REFUSED_BY_CHARGE[bucket.charge], retry_after_ms=max(1, int(answer[1]))
            )
        rest = answer[1:]
        return Decision(
            None,
            remaining={b.key: int(rest[2 * i]) for i, b in enumerate(ask.buckets)},
            reset_ms={b.key: int(rest[2 * i + 1]) for i, b in enumerate(ask.buckets)},
        )

    async def settle(self, ask: Admission, usage: Usage, cost_picos: int, *, charged: bool) -> None:
        keys = [tenant_key(ask.tenant, f"gcra:{b.key}") for b in ask.buckets]
        keys += [
            tenant_key(ask.tenant, "lease"),
            tenant_key(ask.tenant, f"usage:{ask.month}"),
            tenant_key(ask.tenant, f"settled:{ask.request_id}"),
        ]
        args: list[str | int] = [
            len(ask.buckets),
            "1" if charged else "0",
            ask.request_id,
            USAGE_TTL_SECONDS,
            SETTLED_MARKER_MS,
        ]
        for bucket in ask.buckets:
            delta = bucket_delta(bucket, usage.input_tokens, usage.output_tokens, ask.estimate)
            args += [repr(bucket.interval_ms), delta]
        for name, value in usage_fields(ask.model, usage, cost_picos).items():
            args += [name, value]
        await self.pipe.script(SETTLE_SCRIPT, self._shas[SETTLE_SCRIPT], keys, args, linger=True)

    async def renew(self, leases: Iterable[tuple[str, str]]) -> None:
        pairs = list(leases)
        if not pairs:
            return
        keys = [tenant_key(tenant, "lease") for tenant, _ in pairs]
        args = [LEASE_MS, *(r for _, r in pairs)]
        await self.pipe.script(RENEW_SCRIPT, self._shas[RENEW_SCRIPT], keys, args, linger=True)

    def _release(self, ask: Admission) -> Callable[[Any], None]:
        """What to do with the answer of an admission nobody waits for any more (the client
        went away, or the call timed out while the script ran): give its lease back, or the
        tenant's cap counts a request that never runs until the lease expires."""

        def release(answer: Any) -> None:
            if answer.startswith("ok"):
                self.pipe.send("ZREM", tenant_key(ask.tenant, "lease"), ask.request_id)

        return release

    async def usage(self, tenant: str, month: str) -> dict[str, int]:
        raw = await self.client.hgetall(tenant_key(tenant, f"usage:{month}"))
        return {k: int(v) for k, v in raw.items()}

    async def close(self) -> None:
        await self.pipe.close()
        await self.client.aclose()


# --- Messages between router pods ------------------------------------------------------------

SLOTS_CHANNEL = "llmop:router:slots"
MAX_MESSAGE_BYTES = 64 * 1024
"""A message longer than this is not read (a router pod's state is a few hundred bytes)."""
RESUBSCRIBE_SECONDS = 1.0


class Bus:
    """Messages between the router pods that share the store (`loans`): published on the
    request path's pipe (out on the next turn of the loop, one round trip with whatever else
    goes), read on a connection of their own subscribed to `SLOTS_CHANNEL`."""

    def __init__(self, redis: Redis, channel: str = SLOTS_CHANNEL) -> None:
        self.redis = redis
        self.channel = channel

    def _subscriber(self) -> Any:
        """A client of its own for the subscription (not one of the pool's), that never
        reconnects by itself: redis-py's retry reconnects and subscribes again inside a call,
        and the messages sent meanwhile would be lost unnoticed; `listen` must see every gap."""
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        pool = aioredis.ConnectionPool(
            **self.redis.options,
            max_connections=1,
            retry=Retry(NoBackoff(), 0),
            socket_connect_timeout=RESUBSCRIBE_SECONDS,
            decode_responses=True,
            health_check_interval=0,
        )
        return aioredis.Redis(connection_pool=pool)

    def publish(self, message: dict[str, Any], failed: Callable[[], None]) -> None:
        """Send `message` to every subscribed pod (this one too); `failed` is called if the
        store did not take it (it may or may not have reached the others)."""
        data = json.dumps(message, separators=(",", ":"))
        future = self.redis.pipe.call("PUBLISH", self.channel, data)

        def done(sent: asyncio.Future[Any]) -> None:
            if sent.cancelled() or sent.exception() is not None:
                failed()

        future.add_done_callback(done)

    async def listen(
        self, received: Callable[[dict[str, Any]], None], subscribed: Callable[[], None]
    ) -> None:
        """Hand every message to `received`, until cancelled; `subscribed` is called after
        each (re)subscription, as messages may have been lost while there was none."""
        down = False
        while True:
            client = self._subscriber()
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.channel)
                subscribed()
                if down:
                    down = False
                    log.info("router pods' messages: subscribed again")
                while True:
                    message = await pubsub.get_message(timeout=RESUBSCRIBE_SECONDS)
                    if message is not None:
                        _deliver(message.get("data"), received)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the store is down or the connection dropped
                if not down:  # once an outage: the breaker's warning says the rest
                    down = True
                    log.info("router pods' messages: no subscription (%s); trying every 1 s", exc)
                await asyncio.sleep(RESUBSCRIBE_SECONDS)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
                with contextlib.suppress(Exception):
                    await client.aclose()


def _deliver(data: Any, received: Callable[[dict[str, Any]], None]) -> None:
    if not isinstance(data, str) or len(data) > MAX_MESSAGE_BYTES:
        return
    try:
        message = json.loads(data)
    except ValueError:
        return
    if isinstance(message, dict):
        try:
            received(message)
        except Exception:  # a bug here must not end the subscription, nor pass for an outage
            log.exception("a router pod's message could not be handled: %.200s", data)


# --- The breaker between them -------------------------------------------------------------------

OPEN_SECONDS = 5.0
"""After the store failed, how long it is not asked (each request would otherwise wait out
the timeout)."""
FLUSH_BATCH = 256
FAILURES_TO_OPEN = 3
"""Failed calls in a row that open the breaker: one slow answer on a busy node (the timeout
counts the router's own event-loop lag too) is not an outage."""


@dataclass
class Health:
    """What `Guarded` reports to metrics."""

    degraded: Callable[[bool], None] = lambda _on: None
    error: Callable[[str], None] = lambda _op: None
    latency: Callable[[str, float], None] = lambda _op, _s: None


class Guarded:
    """The shared store behind a breaker, with a local store for while it is down."""

    def __init__(
        self,
        shared: Redis,
        *,
        fail_open: bool,
        replicas: int,
        timeout: float,
        health: Health | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.shared = shared
        self.local = Local(share=1.0 / max(1, replicas))
        self.fail_open = fail_open
        self.timeout = timeout
        # Each call's bound, applied by the shared store's pipe to whole batches (a timer per
        # call here would cost more than the call's share of the round trip).
        shared.pipe.timeout = timeout
        self.health = health or Health()
        self.clock = clock
        self.open_until = 0.0
        self.failures = 0
        """Failed calls in a row."""
        self.unsettled: dict[str, tuple[Admission, Usage, int, bool]] = {}
        """Request id → a settlement the shared store has not confirmed (it was down, or the
        request was admitted locally): sent again when it answers; the script counts each
        request once."""
        self.by_local: set[str] = set()
        """Requests admitted by the local store (settled there too)."""
        self._flushing: asyncio.Task[None] | None = None

    @property
    def degraded(self) -> bool:
        return self.clock() < self.open_until

    def _trip(self, op: str, exc: BaseException) -> None:
        self.health.error(op)
        self.failures += 1
        if self.failures < FAILURES_TO_OPEN and not self.degraded:
            log.info("a call to the shared store failed (%s: %s)", op, exc or type(exc).__name__)
            return
        if not self.degraded:
            self.local.start_empty()
            log.warning(
                "the shared store failed (%s: %s): %s for %.0f s",
                op,
                exc or type(exc).__name__,
                "admitting with this replica's share of each limit"
                if self.fail_open
                else "refusing requests",
                OPEN_SECONDS,
            )
        self.open_until = self.clock() + OPEN_SECONDS
        self.health.degraded(True)

    async def _call(self, op: str, call: Callable[[], Any]) -> Any:
        # No timer of its own: `Redis` bounds every call by `timeout` (its pipe a whole batch).
        started = time.perf_counter()
        try:
            result = await call()
        except Exception as exc:
            # A timeout, a refused or reset connection, or anything else the client raises
            self._trip(op, exc)
            raise
        self.health.latency(op, time.perf_counter() - started)
        self.failures = 0
        if self.open_until:
            self.open_until = 0.0
            self.health.degraded(False)
            log.info("the shared store answers again")
        if self.unsettled and (self._flushing is None or self._flushing.done()):
            self._flushing = asyncio.ensure_future(self._flush())
        return result

    async def _flush(self) -> None:
        """Send the settlements the store missed, `FLUSH_BATCH` at a time (they share round
        trips: `Pipe`), until it fails again."""
        while self.unsettled:
            batch = list(itertools.islice(self.unsettled.items(), FLUSH_BATCH))
            results = await asyncio.gather(
                *(self.shared.settle(a, u, c, charged=ch) for _, (a, u, c, ch) in batch),
                return_exceptions=True,
            )
            failed = None
            for (request_id, _), result in zip(batch, results, strict=True):
                if isinstance(result, BaseException):
                    failed = result
                else:
                    self.unsettled.pop(request_id, None)
            if failed is not None:
                self._trip("flush", failed)
                return

    async def admit(self, ask: Admission) -> Decision:
        if not self.degraded:
            try:
                result: Decision = await self._call("admit", lambda: self.shared.admit(ask))
            except Exception:
                pass
            else:
                return result
        if not self.fail_open:
            raise StoreUnavailableError
        self.by_local.add(ask.request_id)
        return await self.local.admit(ask)

    async def settle(self, ask: Admission, usage: Usage, cost_picos: int, *, charged: bool) -> None:
        if ask.request_id in self.by_local:
            self.by_local.discard(ask.request_id)
            await self.local.settle(ask, usage, cost_picos, charged=charged)
            # To the shared store: its usage, and its lease released should the admission
            # have reached the store after all; its buckets were not the store's to correct.
            self.unsettled[ask.request_id] = (ask, usage, cost_picos, False)
            return
        if not self.degraded:
            try:
                await self._call(
                    "settle",
                    lambda: self.shared.settle(ask, usage, cost_picos, charged=charged),
                )
            except Exception:
                pass
            else:
                return
        # Sent again when the store answers (counted once); its lease expires meanwhile.
        self.unsettled[ask.request_id] = (ask, usage, cost_picos, charged)

    async def renew(self, leases: Iterable[tuple[str, str]]) -> None:
        pairs = list(leases)
        await self.local.renew(pairs)
        if not self.degraded:
            try:
                await self._call("renew", lambda: self.shared.renew(pairs))
            except Exception:
                return

    async def usage(self, tenant: str, month: str) -> dict[str, int]:
        found: dict[str, int] = await self._call("usage", lambda: self.shared.usage(tenant, month))
        return found

    async def close(self) -> None:
        if self._flushing is not None:
            self._flushing.cancel()
        await self.shared.close()
