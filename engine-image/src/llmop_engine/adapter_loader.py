"""The agent's LoRA adapter loader: the I/O half of `adapter_rules` (which decides everything).

It follows `<adapters_dir>/adapters.json`, the ConfigMap the operator mounts as a directory. The
kubelet replaces the file through a symlink swap (no inotify event on the path itself), so the
loader re-reads it every pass and acts only when the content changed. Each pass, once the engine
answers `/health`: read what the engine has registered (`GET /v1/models`), let
`adapter_rules.plan` decide, and carry the actions out:

- fetch a Hub adapter at its pinned revision into the store with the downloader's own code
  (`download.fetch_snapshot`: `huggingface_hub`'s cache, safe for several pods fetching into one
  shared store), on a thread so loads of other adapters go on meanwhile;
- load it from the snapshot (or from its `pvc://` path) through vLLM's
  `POST /v1/load_lora_adapter`, never through vLLM's filesystem resolver (it matches the adapter's
  base against `--model` only, and joins unsanitized names into paths);
- unload what is no longer desired; delete files of a pod-local store only after the unload.

vLLM answers a load only once the adapter is in the engine (0.32), and the next pass checks
`/v1/models` again, so an adapter the engine lost (a restart) is loaded again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from llmop_engine import adapter_rules
from llmop_engine.adapter_rules import AdapterState, Desired
from llmop_engine.contract import ADAPTERS_FILE, AgentSettings
from llmop_engine.download import classify, fetch_snapshot, remove_orphans
from llmop_engine.engine_client import EngineClient

log = logging.getLogger("llmop_engine.adapter_loader")

FILE_POLL_SECONDS = 2.0
"""Longest time between two passes (file read, `/v1/models`); a finished fetch wakes one early."""
LOAD_TIMEOUT_SECONDS = 60.0
"""vLLM loads a small adapter in milliseconds (6-63 ms measured); a large one from a slow disk
takes longer. A load that times out is retried (in place, if it registered meanwhile)."""
MODELS_TIMEOUT_SECONDS = 5.0

T = TypeVar("T")
U = TypeVar("U")
Fetcher = Callable[[str, str | None, Path], Path]
"""(repo, revision, store) → the snapshot folder; raises what `huggingface_hub` raises."""


def hub_fetch(repo: str, revision: str | None, store: Path) -> Path:
    return fetch_snapshot(repo, revision, store, ignore_offline=True, quiet=True)


class AdapterLoader:
    def __init__(
        self,
        settings: AgentSettings,
        client: EngineClient,
        *,
        fetch: Fetcher = hub_fetch,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if settings.adapters_dir is None:
            raise ValueError("the adapter loader needs adapters_dir")
        self.file = Path(settings.adapters_dir) / ADAPTERS_FILE
        self.store = settings.adapter_store
        self.shared_store = adapter_rules.store_is_shared(self.store)
        self.ready_timeout = settings.adapter_ready_timeout_seconds
        self.interval = min(FILE_POLL_SECONDS, settings.poll_interval_seconds)
        self.client = client
        self.fetch = fetch
        self.clock = clock
        self.desired: tuple[Desired, ...] | None = None
        """None until the file was read once (readiness waits for that)."""
        self.states: dict[str, AdapterState] = {}
        self._text: str | None = None
        self._fetches: dict[str, asyncio.Task[None]] = {}
        self._wake = asyncio.Event()

    # -- views ---------------------------------------------------------------------------------

    def gate_reason(self, *, ever_ready: bool, healthy_since: float | None) -> str | None:
        return adapter_rules.gate_reason(
            self.desired,
            self.states,
            ever_ready=ever_ready,
            healthy_since=healthy_since,
            now=self.clock(),
            timeout=self.ready_timeout,
        )

    def statuses(self) -> list[dict[str, object]]:
        return adapter_rules.status_entries(self.desired or (), self.states)

    def loaded(self) -> dict[str, bool]:
        return adapter_rules.loaded_flags(self.desired or (), self.states)

    # -- the desired set -----------------------------------------------------------------------

    def read_desired(self) -> None:
        """Re-read the file; a changed, valid content becomes the desired set."""
        try:
            text = self.file.read_text(encoding="utf-8")
        except OSError as exc:
            if self.desired is None:
                # The renderer always writes the key: an absent file means an absent mount.
                log.warning("cannot read %s (%s): no adapters until it appears", self.file, exc)
                self._use(())
            return
        if text == self._text:
            return
        self._text = text
        try:
            desired = adapter_rules.parse_desired(text)
        except adapter_rules.AdaptersFileError as exc:
            kept = "none" if self.desired is None else len(self.desired)
            log.error("%s is invalid; keeping the %s adapters it had: %s", self.file, kept, exc)
            if self.desired is None:
                self._use(())
            return
        self._use(desired)

    def _use(self, desired: tuple[Desired, ...]) -> None:
        if desired != self.desired:
            log.info("desired adapters: %s", ", ".join(d.name for d in desired) or "none")
        self.desired = desired
        old = self.states
        self.states = adapter_rules.sync(old, desired)
        for name in old.keys() - self.states.keys():
            log.info("adapter %s: no longer desired", name)
        for name, state in self.states.items():
            if old.get(name) is not state:
                self._log_phase(old.get(name), state)

    # -- one pass ------------------------------------------------------------------------------

    async def reconcile(self) -> None:
        """Compare the desired set with the engine's registry and act on the difference."""
        if self.desired is None:
            return
        registered = await self.client.lora_adapters(MODELS_TIMEOUT_SECONDS)
        if registered is None:
            return  # no answer: nothing is known, so nothing is done
        stored = () if self.shared_store else await asyncio.to_thread(self._stored)
        actions = adapter_rules.plan(
            self.desired,
            self.states,
            registered,
            self.clock(),
            store=self.store,
            shared_store=self.shared_store,
            stored=stored,
            fetching_repos={
                s.desired.repo
                for s in self.states.values()
                if s.phase == "Fetching" and s.desired.repo
            },
        )
        for action in actions:
            await self._do(action)

    async def _do(self, action: adapter_rules.Action) -> None:
        if isinstance(action, adapter_rules.Unload):
            answer = await self.client.unload_lora(action.name, LOAD_TIMEOUT_SECONDS)
            if answer.ok or answer.status == 404:  # 404: already gone
                log.info("adapter %s: unloaded (%s)", action.name, action.reason)
            else:
                log.warning("adapter %s: unload failed: %s", action.name, answer.message)
        elif isinstance(action, adapter_rules.Fetch):
            state = self.states[action.name]
            self._set(adapter_rules.fetching(state))
            self._fetches[action.name] = asyncio.create_task(
                self._fetch(state.desired), name=f"fetch-{action.name}"
            )
        elif isinstance(action, adapter_rules.Load):
            await self._load(action)
        else:
            folder = Path(self.store) / action.folder
            log.info("deleting %s: no adapter uses it any more", folder)
            await asyncio.to_thread(shutil.rmtree, folder, True)

    async def _fetch(self, desired: Desired) -> None:
        assert desired.repo is not None
        repo, revision = desired.repo, desired.revision
        try:
            path = await _in_daemon_thread(lambda: self.fetch(repo, revision, Path(self.store)))
        except Exception as exc:  # huggingface_hub's errors: classify decides what a retry fixes
            first = (str(exc).strip().splitlines() or [""])[0]
            message = f"fetching {repo}@{revision or 'main'}: {type(exc).__name__}: {first}"
            deterministic = not classify(exc)
            self._settle_fetch(
                desired,
                lambda s: adapter_rules.failed(
                    s, message, deterministic=deterministic, now=self.clock()
                ),
            )
        else:
            self._settle_fetch(desired, lambda s: adapter_rules.fetched(s, str(path)))
        finally:
            self._fetches.pop(desired.name, None)
            self._wake.set()

    def _settle_fetch(
        self, desired: Desired, change: Callable[[AdapterState], AdapterState]
    ) -> None:
        state = self.states.get(desired.name)
        # The entry may have changed (another revision) or gone while the fetch ran.
        if state is not None and state.desired == desired and state.phase == "Fetching":
            self._set(change(state))

    async def _load(self, action: adapter_rules.Load) -> None:
        state = self.states[action.name]
        rank = await asyncio.to_thread(_read_rank, Path(action.path))
        why = None if action.reason == "desired" else f"loading: {action.reason}"
        self._set(adapter_rules.loading(state, rank, why))
        answer = await self.client.load_lora(
            action.name, action.path, inplace=action.inplace, timeout=LOAD_TIMEOUT_SECONDS
        )
        state = self.states[action.name]
        if answer.ok:
            self._set(adapter_rules.loaded(state))
            return
        deterministic = adapter_rules.load_failure_is_deterministic(answer.status, answer.message)
        message = answer.message if answer.status is not None else f"engine: {answer.message}"
        self._set(
            adapter_rules.failed(state, message, deterministic=deterministic, now=self.clock())
        )

    def _stored(self) -> list[str]:
        try:
            return [e.name for e in os.scandir(self.store) if e.is_dir() and e.name[0] != "."]
        except OSError:
            return []

    def _set(self, state: AdapterState) -> None:
        old = self.states.get(state.name)
        self.states[state.name] = state
        self._log_phase(old, state)

    @staticmethod
    def _log_phase(old: AdapterState | None, new: AdapterState) -> None:
        if old is not None and (old.phase, old.message) == (new.phase, new.message):
            return
        detail = f": {new.message}" if new.message else ""
        rank = f" (r={new.rank})" if new.rank is not None and new.phase == "Loaded" else ""
        source = new.desired.path or f"{new.desired.repo}@{new.desired.revision or 'main'}"
        level = logging.WARNING if new.phase == "Failed" or new.failures else logging.INFO
        log.log(level, "adapter %s [%s]: %s%s%s", new.name, source, new.phase, rank, detail)

    # -- the task ------------------------------------------------------------------------------

    async def run(self, serving: Callable[[], bool]) -> None:
        """Pass after pass until cancelled; acts on the engine only while `serving()`."""
        if not self.shared_store:
            # A pod-local store outlives a container restart (emptyDir): drop the temporaries of
            # fetches the old container was killed in. Only this agent writes there.
            await asyncio.to_thread(self._remove_orphans)
        while True:
            self._wake.clear()
            try:
                self.read_desired()
                if serving():
                    await self.reconcile()
            except Exception:  # one bad pass must not end adapter handling for the pod's life
                log.exception("adapter pass failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval)

    def _remove_orphans(self) -> None:
        for folder in self._stored():
            removed = remove_orphans(Path(self.store) / folder)
            if removed:
                log.info("removed %d partial file(s) in %s", removed, folder)

    def close(self) -> None:
        for task in self._fetches.values():
            task.cancel()


def _read_rank(path: Path) -> int | None:
    try:
        return adapter_rules.rank_of((path / "adapter_config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return None


async def _in_daemon_thread(work: Callable[[], T]) -> T:
    """`asyncio.to_thread` on a daemon thread: the default executor's threads are joined when
    the loop shuts down, and a Hub fetch still running when the engine exits must not hold the
    agent's exit back (the kubelet would wait out the grace period)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def target() -> None:
        try:
            result = work()
        except BaseException as exc:  # handed to the awaiting task, which decides
            _hand_over(loop, _reject, future, exc)
        else:
            _hand_over(loop, _resolve, future, result)

    threading.Thread(target=target, name="adapter-fetch", daemon=True).start()
    return await future


def _hand_over(
    loop: asyncio.AbstractEventLoop,
    settle: Callable[[asyncio.Future[T], U], None],
    future: asyncio.Future[T],
    value: U,
) -> None:
    with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
        loop.call_soon_threadsafe(settle, future, value)


def _resolve(future: asyncio.Future[T], result: T) -> None:
    if not future.done():
        future.set_result(result)


def _reject(future: asyncio.Future[T], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
