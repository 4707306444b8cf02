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
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

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

log = logging.getLogger("llmop_router.store")

USAGE_TTL_SECONDS = 400 * 86_400
SETTLED_MARKER_MS = 3_600_000
"""How long a request's settlement is remembered (so it counts once): longer than any outage
the router waits out before sending it again."""
LINGER_SECONDS = 0.005
"""How long a settlement may wait for an admission's batch to go with: a lease comes back
and a refund lands that much later, never lost."""
MAX_CONNECTIONS = 64
"""Connections to the store per router pod: a request waits for one (within the store timeout)
rather than failing as the default pool does past its cap."""
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
    """Commands to the store, batched: every command asked for in one turn of the event loop
    goes out in one write on one connection, and the replies are read back in order.

    A round trip costs the router far more CPU than the script costs Redis (a redis-py call is
    ~120 µs of the router's CPU on the bench machine, most of it in the client's layers and one
    socket write and read each): under load, dozens of admissions and settlements share one.
    A lone admission goes out on the next turn, so it waits for no batch to fill; commands
    nobody waits on (settlements, renewals) linger up to `LINGER_SECONDS` for the next
    admission's batch, so a request costs one round trip, not two. Batches are
    sent concurrently, each on a connection of its own (at most `MAX_CONNECTIONS`); a batch
    that does not finish within `timeout` fails every command in it and drops its connection.
    Scripts go as `EVALSHA`; one the server does not know (it restarted) is sent again as
    `EVAL`, which loads it."""

    def __init__(self, connect: Callable[[], Any], timeout: float) -> None:
        self._connect = connect
        """A new (unconnected) redis-py connection."""
        self.timeout = timeout
        self._idle: list[Any] = []
        self._slots = asyncio.Semaphore(MAX_CONNECTIONS)
        self._queue: list[_Call] = []
        self._scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._sending: set[asyncio.Task[None]] = set()

    def call(
        self,
        *args: Any,
        script: str | None = None,
        abandoned: Callable[[Any], None] | None = None,
        linger: bool = False,
    ) -> asyncio.Future[Any]:
        """The reply of one command (`script`: the body of an `EVALSHA`'s script).
        `abandoned` gets the reply of a command whose caller stopped waiting for it; `linger`:
        no request waits on it, it may go with the next batch."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._queue.append(_Call(args, future, script, abandoned))
        if self._scheduled:
            pass
        elif not linger:
            # The task starts on the next turn, after every request ready in this one has
            # queued its command: they go together, and none waits longer than that turn.
            self._scheduled = True
            self._start()
        elif self._timer is None:
            self._timer = loop.call_later(LINGER_SECONDS, self._start)
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

    def _start(self) -> None:
        task = asyncio.ensure_future(self._flush())
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _flush(self) -> None:
        """Send what is queued now as one batch."""
        self._scheduled = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._queue:
            batch, self._queue = self._queue, []
            await self._send(batch)

    async def _send(self, batch: list[_Call]) -> None:
        async with self._slots:
            connection = self._idle.pop() if self._idle else self._connect()
            try:
                async with asyncio.timeout(self.timeout):
                    replies = await _round_trip(connection, batch)
            except BaseException as exc:
                await connection.disconnect(nowait=True)
                failure = exc if isinstance(exc, Exception) else ConnectionError("cancelled")
                for call in batch:
                    if not call.future.done():
                        call.future.set_exception(failure)
                if not isinstance(exc, Exception):
                    raise
                return
            self._idle.append(connection)
        for call, reply in zip(batch, replies, strict=True):
            if call.future.done():  # its caller stopped waiting (cancelled, timed out)
                if call.abandoned is not None and not isinstance(reply, Exception):
                    call.abandoned(reply)
            elif isinstance(reply, Exception):
                call.future.set_exception(reply)
            else:
                call.future.set_result(reply)

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for task in list(self._sending):
            task.cancel()
        for connection in self._idle:
            await connection.disconnect()
        self._idle = []


@dataclass(slots=True)
class _Call:
    args: tuple[Any, ...]
    future: asyncio.Future[Any]
    script: str | None
    abandoned: Callable[[Any], None] | None


def _log_failure(future: asyncio.Future[Any]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.info("a store command failed: %s", future.exception())


def pack(commands: list[tuple[Any, ...]]) -> bytes:
    """Commands as RESP, in one buffer. The client's own packer checks each argument's type
    through a general encoder (~5 µs an argument here, ~20 arguments a script call); these
    are only ever `str` and `int`."""
    out = []
    for args in commands:
        out.append(b"*%d\r\n" % len(args))
        for arg in args:
            data = arg.encode() if isinstance(arg, str) else b"%d" % arg
            out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


async def _round_trip(connection: Any, batch: list[_Call]) -> list[Any]:
    """The batch's replies; scripts the server did not know are sent again as `EVAL`."""
    from redis.exceptions import NoScriptError

    replies = await _exchange(connection, [c.args for c in batch])
    unknown = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
    if unknown:
        again = [("EVAL", batch[i].script, *batch[i].args[2:]) for i in unknown]
        for i, reply in zip(unknown, await _exchange(connection, again), strict=True):
            replies[i] = reply
    return replies


async def _exchange(connection: Any, commands: list[tuple[Any, ...]]) -> list[Any]:
    """Send `commands` in one write and read their replies (an error reply is its exception)."""
    from redis.exceptions import ResponseError

    if not connection.is_connected:
        await connection.connect()
    await connection.send_packed_command(pack(commands), check_health=False)
    replies: list[Any] = []
    for _ in commands:
        try:
            replies.append(await connection.read_response())
        except ResponseError as exc:
            replies.append(exc)
    return replies


class Redis:
    """The shared store: one script call to admit a request, one to settle it, batched with
    the other requests' (`Pipe`)."""

    def __init__(self, url: str, *, timeout: float, password: str | None = None) -> None:
        import redis.asyncio as aioredis

        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=MAX_CONNECTIONS,
            timeout=None,
            password=password,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            decode_responses=True,
            health_check_interval=0,
        )
        self.client: Any = aioredis.Redis(connection_pool=pool)
        """For the rare calls (a tenant's usage); requests go through `pipe`."""
        # The pipe's connections have no per-read timeout (each would cost a timer per reply):
        # the pipe bounds a whole batch instead.
        options = {**pool.connection_kwargs, "socket_timeout": None}
        self.pipe = Pipe(lambda: pool.connection_class(**options), timeout)
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
