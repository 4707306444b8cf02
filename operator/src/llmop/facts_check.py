"""Orchestration: read the files of models outside the catalog, away from the reconcile.

A parse that needs a model's files (`llmop.model_facts.request_for`) only registers the parent
in `Context.facts` (`reconcile.facts.FactsMemory.want`) and plans without them meanwhile (the
plan waits: nothing is created). This thread (a row of `llmop.runnables`) takes the reads that
are due, reads each model's `config.json` and safetensors index at its revision through
`llmop.hub.model_files` with the token of the spec's `tokenSecretRef` (in a small pool, at most
`READERS` at once, so one slow Hub answer holds up no other model), stores what the answer
means (`model_facts.answer_of`) and puts a parent pass of every parent waiting for it on the
queue: the pass plans again with the facts, or shows why it still waits or stalls.

A Hub that did not answer is asked again with backoff (`model_facts.retry_after`: 5 s doubling
to 5 min); a refusal is asked again when the parent's spec changes, and every 10 minutes
(`reconcile.facts.REFUSED_RETRY_SECONDS`: access granted on the Hub, a branch pushed). Nothing
here blocks a reconcile, and a pass never waits on the Hub.
"""

from __future__ import annotations

import base64
import binascii
import logging
import threading
from concurrent.futures import ThreadPoolExecutor

from llmop import hub, kinds, model_facts
from llmop.kube import KubeError
from llmop.model_facts import Answer, FactsRequest, Unavailable
from llmop.reconcile import Context, Hint, enqueue

log = logging.getLogger("llmop.facts_check")

READERS = 4
"""Models whose files are read at once."""
IDLE_SECONDS = 1.0
"""The longest the thread sleeps between two looks (a new read wakes it at once)."""


def _token(ctx: Context, request: FactsRequest) -> str | None:
    """The token in the spec's Secret, as the model gate reads it; a missing Secret or key
    reads anonymously (a public model is still read, a gated one refused naming the Secret;
    the model's own pre-flight reports the missing Secret)."""
    if request.token_secret is None:
        return None
    name, key = request.token_secret
    secret = ctx.kube.read("v1", kinds.SECRET.kind, request.namespace, name)
    value = ((secret or {}).get("data") or {}).get(key)
    if not value:
        return None
    try:
        return base64.b64decode(value).decode().strip() or None
    except (binascii.Error, UnicodeDecodeError):
        return None


def read(ctx: Context, request: FactsRequest, attempt: int) -> Answer:
    """Read `request`'s files (attempt number `attempt`) and say what they mean."""
    try:
        token = _token(ctx, request)
    except KubeError as error:
        detail = f"reading the token Secret {request.token_name}: {error}"
        return Unavailable(detail, attempt, model_facts.retry_after(attempt))
    found = hub.model_files(
        request.model, request.revision, token=token, endpoint=ctx.render_settings.hub_endpoint
    )
    return model_facts.answer_of(request, found, attempts=attempt)


def settle(ctx: Context, request: FactsRequest, attempt: int) -> None:
    """One read, start to end: its answer stored, the waiting parents' passes on the queue. A
    failure of the read itself counts as a Hub that did not answer (retried with backoff), so
    a read is never left under way."""
    try:
        answer = read(ctx, request, attempt)
    except Exception as error:
        log.exception("reading the files of %s failed", request.at)
        detail = f"{type(error).__name__}: {error}"
        answer = Unavailable(detail, attempt, model_facts.retry_after(attempt))
    if isinstance(answer, Unavailable):
        log.warning(
            "files of %s not read (attempt %d, again in %gs): %s",
            request.at,
            attempt,
            answer.retry_in,
            answer.detail,
        )
    elif isinstance(answer, model_facts.Read):
        log.info("read the files of %s at %s", request.at, answer.commit)
    else:
        log.info("the files of %s refuse it: %s: %s", request.at, answer.reason, answer.message)
    for key in ctx.facts.settle(request, answer):
        enqueue(ctx, key, Hint.PARENT)


def _alive(ctx: Context, key: tuple[str, str]) -> bool:
    """The parent is still in the watch cache (else nobody waits for its read)."""
    return any(True for _ in ctx.parents.get(key) or ())


def check(ctx: Context, pool: ThreadPoolExecutor) -> int:
    """Start every read that is due in `pool`; how many."""
    due = ctx.facts.take_due(lambda key: _alive(ctx, key))
    for request, attempt in due:
        pool.submit(settle, ctx, request, attempt)
    return len(due)


def run(ctx: Context, stop: threading.Event) -> None:
    """The thread's body: start the due reads, sleep until the next is due or a new one is
    asked for (at most `IDLE_SECONDS`), until `stop` is set. Reads under way when it stops are
    left to finish on their own (their answer goes to this term's memory, then away with it)."""
    pool = ThreadPoolExecutor(READERS, thread_name_prefix="llmop-model-files")
    try:
        while not stop.is_set():
            try:
                check(ctx, pool)
            except Exception:
                log.exception("starting the reads of model files failed")
            due = ctx.facts.seconds_to_next()
            ctx.facts.wait(IDLE_SECONDS if due is None else min(due, IDLE_SECONDS))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
