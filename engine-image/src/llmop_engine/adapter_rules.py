"""Pure bookkeeping of the LoRA adapters one engine should serve: values in, decisions out.

The agent (`adapter_loader`, the I/O half) reads `adapters.json` from the mounted ConfigMap, asks
the engine which adapters it has registered (`GET /v1/models` entries with a `parent`), fetches
Hub adapters and calls vLLM's runtime API; every decision it takes is made here, without I/O and
without a clock (`now` is a parameter), so the rules are table-tested:

- `parse_desired`: the file's text → the desired entries, or `AdaptersFileError` (the caller then
  keeps the set it had: a half-written or hand-broken file is "no change", never "remove all").
- The per-adapter state machine: Pending → Fetching (Hub sources only) → Loading → Loaded.
  `Failed` means *deterministically* failed: a retry cannot fix it (vLLM refused the files, the
  Hub has no such repo or revision), so it is never retried until the desired entry changes.
  A transient failure (engine unreachable, timeout, 5xx without a known cause, Hub network error)
  goes back to Pending with the error as its message and a retry time, with exponential backoff
  from 1 s to 60 s. So the operator reads `Failed` as final and `Pending` + message as "waiting".
- `plan`: desired set + states + what the engine has registered → actions. It unloads first
  (adapters no longer desired, or whose desired revision failed), then fetches and loads (again
  when the engine lost a Loaded one, e.g. after a restart; in place when a new revision replaces a
  registered one, so the name never stops serving), and deletes files last. Files are deleted
  only in a pod-local store and only once nothing registered or desired refers to them: vLLM
  re-reads an evicted adapter from its path and dies if the files are gone (measured, vLLM 0.32).
  A store on the shared model cache is never cleaned: other pods may have the files registered.
- `gate_reason`: readiness of a pod that was never ready waits until the desired set is
  `settled` (each adapter Loaded or Failed) or `adapter_ready_timeout_seconds` after the engine
  first answered `/health`; once ready, adapter changes never take the pod out of readiness.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from llmop_engine.contract import ADAPTER_STORE, AdapterKey, AdapterPhase, AdapterStatusKey
from llmop_engine.download_progress import backoff_seconds

RETRY_BASE_SECONDS = 1.0
RETRY_CAP_SECONDS = 60.0

# vLLM 0.32 answers a refused adapter (rank above --max-lora-rank, unknown target modules, DoRA,
# a bias) with a 500 whose message names the cause; the same files fail the same way next time.
_DETERMINISTIC_500_WORDS = ("rank", "target modules", "dora", "bias")
_DUPLICATE = "has already been loaded"


class AdaptersFileError(ValueError):
    """`adapters.json` cannot be read as the desired set."""


@dataclass(frozen=True)
class Desired:
    """One entry of `adapters.json`: a Hub adapter (`repo` at `revision`) or files at `path`."""

    name: str
    repo: str | None = None
    revision: str | None = None
    path: str | None = None


def parse_desired(text: str) -> tuple[Desired, ...]:
    """The desired adapters of `adapters.json` (`{"adapters": [{name, repo, revision, path}]}`)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise AdaptersFileError(f"not JSON: {exc}") from exc
    entries = doc.get("adapters") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise AdaptersFileError('expected an object {"adapters": [...]}')
    out: list[Desired] = []
    for index, entry in enumerate(entries):
        where = f"adapters[{index}]"
        if not isinstance(entry, dict):
            raise AdaptersFileError(f"{where} is not an object")
        name = entry.get(AdapterKey.NAME)
        if not isinstance(name, str) or not name:
            raise AdaptersFileError(f"{where}.{AdapterKey.NAME} must be a non-empty string")
        if any(d.name == name for d in out):
            raise AdaptersFileError(f"{where}: adapter {name!r} is listed twice")
        repo, revision, path = (
            _optional_str(entry, key, where)
            for key in (AdapterKey.REPO, AdapterKey.REVISION, AdapterKey.PATH)
        )
        if (repo is None) == (path is None):
            raise AdaptersFileError(
                f"{where} ({name}): exactly one of {AdapterKey.REPO!r} and {AdapterKey.PATH!r}"
            )
        if path is not None and not path.startswith("/"):
            raise AdaptersFileError(f"{where} ({name}): {AdapterKey.PATH!r} must be absolute")
        out.append(Desired(name, repo, revision, path))
    return tuple(out)


def _optional_str(entry: Mapping[str, object], key: str, where: str) -> str | None:
    value = entry.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise AdaptersFileError(f"{where}.{key} must be a non-empty string or null")
    return value


# --- The per-adapter state machine -------------------------------------------------------------


@dataclass(frozen=True)
class AdapterState:
    """Where one desired adapter stands in this pod."""

    desired: Desired
    phase: AdapterPhase = "Pending"
    message: str | None = None
    path: str | None = None
    """The files to load: the entry's own path, or the fetched snapshot once fetched."""
    rank: int | None = None
    failures: int = 0
    """Transient failures in a row (the backoff's exponent)."""
    retry_at: float | None = None
    """No action before this (monotonic seconds) after a transient failure."""

    @property
    def name(self) -> str:
        return self.desired.name


def new_state(desired: Desired) -> AdapterState:
    return AdapterState(desired, path=desired.path)


def sync(states: Mapping[str, AdapterState], desired: Sequence[Desired]) -> dict[str, AdapterState]:
    """The states for a (new) desired set: unchanged entries keep theirs, a new or changed entry
    starts over (a changed revision is fetched and loaded in place), removed ones are dropped
    (`plan` unloads them from what the engine reports, not from a remembered state)."""
    out: dict[str, AdapterState] = {}
    for d in desired:
        state = states.get(d.name)
        out[d.name] = state if state is not None and state.desired == d else new_state(d)
    return out


def fetching(state: AdapterState) -> AdapterState:
    return replace(state, phase="Fetching", message=None)


def fetched(state: AdapterState, path: str) -> AdapterState:
    return replace(state, phase="Loading", path=path, message=None, failures=0, retry_at=None)


def loading(state: AdapterState, rank: int | None, why: str | None = None) -> AdapterState:
    return replace(state, phase="Loading", rank=rank, message=why)


def loaded(state: AdapterState) -> AdapterState:
    return replace(state, phase="Loaded", message=None, failures=0, retry_at=None)


def failed(state: AdapterState, message: str, *, deterministic: bool, now: float) -> AdapterState:
    """A failed fetch or load: Failed for good, or Pending until the backoff's retry time."""
    if deterministic:
        return replace(state, phase="Failed", message=message, retry_at=None)
    failures = state.failures + 1
    delay = retry_delay(failures)
    return replace(
        state,
        phase="Pending",
        failures=failures,
        retry_at=now + delay,
        message=f"{message} (attempt {failures}; retrying in {delay:.0f}s)",
    )


def retry_delay(failures: int) -> float:
    """Seconds before the retry after `failures` transient failures in a row: 1, 2, 4 … 60."""
    return backoff_seconds(failures, base=RETRY_BASE_SECONDS, cap=RETRY_CAP_SECONDS)


def is_duplicate(status: int | None, message: str) -> bool:
    """vLLM's 400 for a name that is already registered (the load was not `load_inplace`)."""
    return status == 400 and _DUPLICATE in message


def load_failure_is_deterministic(status: int | None, message: str) -> bool:
    """Whether a refused `POST /v1/load_lora_adapter` would be refused again (never retried).

    No answer (refused, reset, timeout): transient. 404 (no adapter at the path), 400 other than
    "already loaded" (which the next plan turns into an in-place load), 401/403 (the API key) and
    other 4xx: deterministic, except 408/429. 5xx: deterministic only when vLLM's message names a
    property of the files (rank, target modules, DoRA, bias), else transient."""
    if status is None:
        return False
    if status >= 500:
        lowered = message.lower()
        return any(word in lowered for word in _DETERMINISTIC_500_WORDS)
    if is_duplicate(status, message):
        return False
    return status >= 400 and status not in (408, 429)


# --- The plan ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fetch:
    name: str
    repo: str
    revision: str | None


@dataclass(frozen=True)
class Load:
    name: str
    path: str
    inplace: bool
    """The name is registered already (another revision, or the same files): replace it in
    place, so requests for it never see a 404 in between."""
    reason: str


@dataclass(frozen=True)
class Unload:
    name: str
    reason: str


@dataclass(frozen=True)
class DeleteFiles:
    folder: str
    """A top-level folder of the store (`models--org--name`)."""


Action = Fetch | Load | Unload | DeleteFiles


def hub_folder(repo: str) -> str:
    """The folder `huggingface_hub` keeps a model repo in, under its cache directory."""
    return "models--" + repo.replace("/", "--")


def store_folder(path: str, store: str) -> str | None:
    """The store's top-level folder that holds `path`, or None when `path` is elsewhere."""
    prefix = posixpath.normpath(store) + "/"
    normal = posixpath.normpath(path)
    if not normal.startswith(prefix):
        return None
    return normal[len(prefix) :].split("/", 1)[0] or None


def store_is_shared(store: str) -> bool:
    """Whether other pods may read the store (the model cache's claim). Only the renderer's
    pod-local default is ours alone; anything else is treated as shared, so never cleaned."""
    return posixpath.normpath(store) != posixpath.normpath(ADAPTER_STORE)


def plan(
    desired: Sequence[Desired],
    states: Mapping[str, AdapterState],
    registered: Mapping[str, str],
    now: float,
    *,
    store: str,
    shared_store: bool,
    stored: Collection[str] = (),
    fetching_repos: Collection[str] = (),
) -> list[Action]:
    """What to do next. `registered`: adapter name → the path the engine loaded it from (its
    `/v1/models` `root`); `stored`: the store's top-level folders; `fetching_repos`: Hub repos
    whose fetch is still running (their files are being written)."""
    actions: list[Action] = []
    wanted = {d.name for d in desired}
    # Unload first: it frees the engine's slots for the loads that follow.
    actions += [
        Unload(name, "no longer desired") for name in sorted(registered) if name not in wanted
    ]
    for d in desired:
        state = states.get(d.name) or new_state(d)
        action = _next_step(state, registered.get(d.name), now)
        if action is not None:
            actions.append(action)
    if not shared_store:
        keep = {hub_folder(d.repo) for d in desired if d.repo is not None}
        keep |= {hub_folder(repo) for repo in fetching_repos}
        keep |= {f for root in registered.values() if (f := store_folder(root, store))}
        actions += [DeleteFiles(folder) for folder in sorted(stored) if folder not in keep]
    return actions


def _next_step(state: AdapterState, root: str | None, now: float) -> Action | None:
    name = state.name
    if state.phase == "Failed":
        # The engine may still serve an older revision under this name: what it serves is no
        # longer what is desired, so it goes (the status says why).
        return Unload(name, "its desired version failed") if root is not None else None
    if state.phase == "Fetching" or (state.retry_at is not None and now < state.retry_at):
        return None
    if state.phase == "Loaded":
        if root is None:
            assert state.path is not None
            return Load(name, state.path, False, "the engine lost it (restarted?)")
        if state.path is not None and posixpath.normpath(root) != posixpath.normpath(state.path):
            return Load(name, state.path, True, f"the engine has it from {root}")
        return None
    if state.path is None:
        assert state.desired.repo is not None  # parse_desired: a repo or a path
        return Fetch(name, state.desired.repo, state.desired.revision)
    return Load(name, state.path, root is not None, "new version" if root else "desired")


# --- Readiness, status, metrics -------------------------------------------------------------


def waiting(desired: Sequence[Desired], states: Mapping[str, AdapterState]) -> list[str]:
    """Desired adapters neither Loaded nor (deterministically) Failed."""
    return [
        d.name
        for d in desired
        if (s := states.get(d.name)) is None or s.phase not in ("Loaded", "Failed")
    ]


def settled(desired: Sequence[Desired], states: Mapping[str, AdapterState]) -> bool:
    return not waiting(desired, states)


def gate_reason(
    desired: Sequence[Desired] | None,
    states: Mapping[str, AdapterState],
    *,
    ever_ready: bool,
    healthy_since: float | None,
    now: float,
    timeout: float,
) -> str | None:
    """Why a pod that has never been ready must not turn ready yet (None: it may). `desired`
    None: the adapters file was not read yet."""
    if ever_ready:
        return None
    if healthy_since is not None and now - healthy_since >= timeout:
        return None
    if desired is None:
        return "reading the desired adapters"
    names = waiting(desired, states)
    if not names:
        return None
    return f"loading adapters: {', '.join(names)}"


def status_entries(
    desired: Sequence[Desired], states: Mapping[str, AdapterState]
) -> list[dict[str, object]]:
    """The agent's `/status` `adapters` list, in the desired order."""
    out: list[dict[str, object]] = []
    for d in desired:
        s = states.get(d.name) or new_state(d)
        out.append(
            {
                AdapterStatusKey.NAME: d.name,
                AdapterStatusKey.PHASE: s.phase,
                AdapterStatusKey.MESSAGE: s.message,
                AdapterStatusKey.REVISION: d.revision,
                AdapterStatusKey.RANK: s.rank,
            }
        )
    return out


def loaded_flags(desired: Sequence[Desired], states: Mapping[str, AdapterState]) -> dict[str, bool]:
    """Per desired adapter: registered in the engine (the `llmop_engine_adapter_loaded` gauge)."""
    return {d.name: (s := states.get(d.name)) is not None and s.phase == "Loaded" for d in desired}


def rank_of(adapter_config: str) -> int | None:
    """`r` of an `adapter_config.json` text, when it is a positive integer."""
    try:
        doc = json.loads(adapter_config)
    except json.JSONDecodeError:
        return None
    r = doc.get("r") if isinstance(doc, dict) else None
    return r if isinstance(r, int) and not isinstance(r, bool) and r > 0 else None
