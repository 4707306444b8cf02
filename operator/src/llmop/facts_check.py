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

The files read are also written to the `llmop-model-files` ConfigMap in the operator's own
namespace (`llmop.model_files_record`): when the Hub does not answer for a model and revision
read before, by this process or an earlier one, the plan is made from the recorded files, so
an operator restarted during an outage plans the CRs it planned before (a new generation
included) without waiting for the Hub.
"""

from __future__ import annotations

import base64
import binascii
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

from llmop import hub, kinds, model_facts, model_files_record, names
from llmop.kube import KubeError
from llmop.model_facts import Answer, FactsRequest, Read, Unavailable
from llmop.model_files_record import Entry
from llmop.planner.model_config import ModelFiles
from llmop.reconcile import Context, Hint, enqueue

log = logging.getLogger("llmop.facts_check")

READERS = 4
"""Models whose files are read at once."""
IDLE_SECONDS = 1.0
"""The longest the thread sleeps between two looks (a new read wakes it at once)."""


class Record:
    """The `llmop-model-files` ConfigMap as this process last read or wrote it (read at the
    first need; none without an own namespace: an operator run outside a cluster)."""

    def __init__(self, namespace: str | None) -> None:
        self.namespace = namespace
        self._entries: dict[str, Entry] | None = None
        self._lock = threading.Lock()

    def _loaded(self, ctx: Context) -> dict[str, Entry]:
        if self._entries is None:
            assert self.namespace is not None
            name = model_files_record.CONFIG_MAP_NAME
            found = ctx.kube.read("v1", kinds.CONFIG_MAP.kind, self.namespace, name)
            self._entries = model_files_record.decode((found or {}).get("data"))
        return self._entries

    def keep(self, ctx: Context, request: FactsRequest, files: ModelFiles) -> None:
        """Record `files`, read for `request` (once per model, revision and commit)."""
        now = ctx.clock().timestamp()
        entry = model_files_record.entry_of(request.model, request.revision, files, now)
        if self.namespace is None or entry is None:
            return
        key = model_files_record.key_of(request.model, request.revision)
        with self._lock:
            try:
                entries = self._loaded(ctx)
                known = entries.get(key)
                if known is not None and (known.commit, known.config_text) == (
                    entry.commit,
                    entry.config_text,
                ):
                    return
                kept = model_files_record.with_entry(entries, entry)
                manifest = model_files_record.config_map(self.namespace, kept)
                ctx.kube.apply(
                    manifest, field_manager=names.RECORDS_FIELD_MANAGER, want_result=False
                )
                self._entries = kept
            except KubeError as error:
                log.warning("the files of %s not recorded: %s", request.at, error)

    def recall(self, ctx: Context, request: FactsRequest) -> Entry | None:
        """The recorded files of `request`'s model and revision, if any."""
        if self.namespace is None:
            return None
        with self._lock:
            try:
                entries = self._loaded(ctx)
            except KubeError as error:
                log.warning("the recorded model files not read: %s", error)
                return None
            return entries.get(model_files_record.key_of(request.model, request.revision))


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


def read(ctx: Context, request: FactsRequest, attempt: int, record: Record | None = None) -> Answer:
    """Read `request`'s files (attempt number `attempt`) and say what they mean; files that
    give facts go to `record`."""
    try:
        token = _token(ctx, request)
    except KubeError as error:
        detail = f"reading the token Secret {request.token_name}: {error}"
        return Unavailable(detail, attempt, model_facts.retry_after(attempt))
    found = hub.model_files(
        request.model, request.revision, token=token, endpoint=ctx.render_settings.hub_endpoint
    )
    answer = model_facts.answer_of(request, found, attempts=attempt)
    if record is not None and isinstance(answer, Read) and isinstance(found, ModelFiles):
        record.keep(ctx, request, found)
    return answer


def recalled(ctx: Context, request: FactsRequest, record: Record | None) -> Answer | None:
    """The facts of the files recorded for `request`, when the Hub did not answer."""
    entry = None if record is None else record.recall(ctx, request)
    if entry is None:
        return None
    answer = model_facts.answer_of(request, entry.files(), attempts=1)
    if isinstance(answer, Read):
        log.warning(
            "the Hub did not answer for %s: planned from the files recorded at %s (commit %s)",
            request.at,
            datetime.fromtimestamp(entry.read_at, UTC).isoformat(timespec="seconds"),
            entry.commit,
        )
        return answer
    return None


def settle(ctx: Context, request: FactsRequest, attempt: int, record: Record | None = None) -> None:
    """One read, start to end: its answer stored, the waiting parents' passes on the queue. A
    failure of the read itself counts as a Hub that did not answer (retried with backoff), so
    a read is never left under way. A Hub that did not answer for files `record` holds gives
    the facts of those."""
    try:
        answer = read(ctx, request, attempt, record)
    except Exception as error:
        log.exception("reading the files of %s failed", request.at)
        detail = f"{type(error).__name__}: {error}"
        answer = Unavailable(detail, attempt, model_facts.retry_after(attempt))
    if isinstance(answer, Unavailable):
        answer = recalled(ctx, request, record) or answer
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


def check(ctx: Context, pool: ThreadPoolExecutor, record: Record | None = None) -> int:
    """Start every read that is due in `pool`; how many."""
    due = ctx.facts.take_due(lambda key: _alive(ctx, key))
    for request, attempt in due:
        pool.submit(settle, ctx, request, attempt, record)
    return len(due)


def run(ctx: Context, stop: threading.Event) -> None:
    """The thread's body: start the due reads, sleep until the next is due or a new one is
    asked for (at most `IDLE_SECONDS`), until `stop` is set. Reads under way when it stops are
    left to finish on their own (their answer goes to this term's memory, then away with it)."""
    pool = ThreadPoolExecutor(READERS, thread_name_prefix="llmop-model-files")
    record = Record(ctx.config.own_namespace)
    try:
        while not stop.is_set():
            try:
                check(ctx, pool, record)
            except Exception:
                log.exception("starting the reads of model files failed")
            due = ctx.facts.seconds_to_next()
            ctx.facts.wait(IDLE_SECONDS if due is None else min(due, IDLE_SECONDS))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
