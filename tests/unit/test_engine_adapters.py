"""The agent's pure LoRA adapter rules (`llmop_engine.adapter_rules`), by tables: the adapters
file, the state machine, failure classification and backoff, the plan (removal order included),
and the readiness gate."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import pytest

from llmop_engine import adapter_rules as a
from llmop_engine.adapter_rules import AdapterState, DeleteFiles, Desired, Fetch, Load, Unload
from llmop_engine.contract import ADAPTER_STORE, AdapterStatusKey
from support.source import parse_file

SHARED = "/models/llmop-adapters"
SHA1, SHA2 = "1" * 40, "2" * 40
HUB = Desired("sql", repo="org/sql-lora", revision=SHA1)
PVC = Desired("chat", path="/mnt/adapters/chat")
SNAP1 = f"{SHARED}/models--org--sql-lora/snapshots/{SHA1}"
SNAP2 = f"{SHARED}/models--org--sql-lora/snapshots/{SHA2}"


def doc(*entries: dict[str, object]) -> str:
    return json.dumps({"adapters": list(entries)})


# --- adapters.json -------------------------------------------------------------------------------


def test_parse_reads_hub_and_path_entries() -> None:
    text = doc(
        {"name": "sql", "repo": "org/sql-lora", "revision": SHA1, "path": None},
        {"name": "chat", "repo": None, "revision": None, "path": "/mnt/adapters/chat"},
    )
    assert a.parse_desired(text) == (HUB, PVC)
    assert a.parse_desired(doc()) == ()


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("{", "not JSON"),
        ("[]", "expected an object"),
        ('{"adapters": {}}', "expected an object"),
        ('{"adapters": ["sql"]}', "adapters[0] is not an object"),
        (doc({"repo": "org/x"}), "name must be a non-empty string"),
        (doc({"name": "", "repo": "org/x"}), "name must be a non-empty string"),
        (doc({"name": "x", "repo": "o/x"}, {"name": "x", "repo": "o/y"}), "listed twice"),
        (doc({"name": "x"}), "exactly one of 'repo' and 'path'"),
        (doc({"name": "x", "repo": "o/x", "path": "/p"}), "exactly one of 'repo' and 'path'"),
        (doc({"name": "x", "path": "rel/p"}), "must be absolute"),
        (doc({"name": "x", "repo": "o/x", "revision": 3}), "revision must be a non-empty"),
    ],
)
def test_parse_rejects_a_bad_file_with_a_clear_error(text: str, error: str) -> None:
    with pytest.raises(a.AdaptersFileError, match=re.escape(error)):
        a.parse_desired(text)


# --- the state machine -------------------------------------------------------------------------


def test_sync_keeps_unchanged_states_restarts_changed_ones_and_drops_removed_ones() -> None:
    loaded = a.loaded(a.fetched(a.new_state(HUB), SNAP1))
    chat = a.new_state(PVC)
    bumped = Desired("sql", repo="org/sql-lora", revision=SHA2)
    assert a.sync({"sql": loaded, "chat": chat}, [HUB]) == {"sql": loaded}
    restarted = a.sync({"sql": loaded}, [bumped])["sql"]
    assert (restarted.phase, restarted.path, restarted.desired) == ("Pending", None, bumped)
    # A path entry knows its files at once; a Hub entry only once fetched.
    assert a.sync({}, [PVC])["chat"].path == PVC.path


@pytest.mark.parametrize("failures", [1, 2, 3, 4, 5, 6, 7, 8, 20])
def test_backoff_doubles_from_one_second_up_to_sixty(failures: int) -> None:
    expected = {1: 1, 2: 2, 3: 4, 4: 8, 5: 16, 6: 32}.get(failures, 60)
    assert a.retry_delay(failures) == expected


def test_a_transient_failure_waits_pending_and_a_deterministic_one_fails_for_good() -> None:
    state = a.fetching(a.new_state(HUB))
    once = a.failed(state, "ConnectionError: refused", deterministic=False, now=100.0)
    assert (once.phase, once.failures, once.retry_at) == ("Pending", 1, 101.0)
    assert once.message == "ConnectionError: refused (attempt 1; retrying in 1s)"
    twice = a.failed(a.fetching(once), "timeout", deterministic=False, now=200.0)
    assert (twice.failures, twice.retry_at) == (2, 202.0)
    done = a.loaded(a.fetched(twice, SNAP1))
    assert (done.phase, done.failures, done.retry_at, done.message) == ("Loaded", 0, None, None)
    final = a.failed(
        state, "LoRA rank 64 is greater than max_lora_rank 16.", deterministic=True, now=1
    )
    assert (final.phase, final.retry_at) == ("Failed", None)
    assert final.message == "LoRA rank 64 is greater than max_lora_rank 16."


RANK_500 = (
    "Call to add_lora method failed: Worker failed with error 'LoRA rank 64 is greater than "
    "max_lora_rank 16.', please check the stack trace above for the root cause"
)


@pytest.mark.parametrize(
    ("status", "message", "deterministic"),
    [
        (None, "ClientConnectorError: connection refused", False),
        (None, "no answer within 60s", False),
        (404, "Loading lora x failed: No adapter found for <path>", True),
        (400, "The lora adapter 'x' has already been loaded. If you want to ...", False),
        (400, "Both 'lora_name' and 'lora_path' must be provided.", True),
        (401, "Unauthorized", True),
        (422, "validation error", True),
        (408, "request timeout", False),
        (429, "too many requests", False),
        (500, RANK_500, True),
        (500, "... expected target modules in {'q_proj'} but received ['x_proj']", True),
        (500, "vLLM does not yet support DoRA.", True),
        (500, "Adapter bias cannot be used without bias_enabled.", True),
        (
            500,
            "EngineCore encountered an issue. See stack trace (above) for the root cause.",
            False,
        ),
        (503, "Service Unavailable", False),
    ],
)
def test_load_failures_are_classified(
    status: int | None, message: str, deterministic: bool
) -> None:
    assert a.load_failure_is_deterministic(status, message) is deterministic


# --- the plan ----------------------------------------------------------------------------------


def plan(
    desired: list[Desired],
    states: dict[str, AdapterState],
    registered: dict[str, str],
    now: float = 0.0,
    **kw: Any,
) -> list[a.Action]:
    options: dict[str, Any] = {"store": SHARED, "shared_store": True} | kw
    return a.plan(desired, states, registered, now, **options)


FETCHED = a.fetched(a.fetching(a.new_state(HUB)), SNAP1)
LOADED = a.loaded(FETCHED)


@pytest.mark.parametrize(
    ("state", "registered", "expected"),
    [
        (a.new_state(HUB), {}, [Fetch("sql", "org/sql-lora", SHA1)]),
        (a.fetching(a.new_state(HUB)), {}, []),
        (FETCHED, {}, [Load("sql", SNAP1, False, "desired")]),
        (LOADED, {"sql": SNAP1}, []),
        (LOADED, {"sql": SNAP1 + "/"}, []),  # the same path, spelled differently
        # After an engine restart /v1/models no longer lists it: load it again.
        (LOADED, {}, [Load("sql", SNAP1, False, "the engine lost it (restarted?)")]),
        (LOADED, {"sql": SNAP2}, [Load("sql", SNAP1, True, f"the engine has it from {SNAP2}")]),
        # A new revision while the old one serves: fetch, then replace it in place.
        (a.new_state(HUB), {"sql": SNAP2}, [Fetch("sql", "org/sql-lora", SHA1)]),
        (FETCHED, {"sql": SNAP2}, [Load("sql", SNAP1, True, "new version")]),
        (a.failed(FETCHED, "rank", deterministic=True, now=0), {}, []),
        (
            a.failed(FETCHED, "rank", deterministic=True, now=0),
            {"sql": SNAP2},
            [Unload("sql", "its desired version failed")],
        ),
    ],
)
def test_plan_for_one_hub_adapter(
    state: AdapterState, registered: dict[str, str], expected: list[a.Action]
) -> None:
    assert plan([HUB], {"sql": state}, registered) == expected


def test_a_path_adapter_is_loaded_without_a_fetch() -> None:
    assert plan([PVC], {}, {}) == [Load("chat", PVC.path or "", False, "desired")]


def test_a_transient_failure_is_retried_only_after_its_backoff() -> None:
    waiting = a.failed(a.fetching(a.new_state(HUB)), "timeout", deterministic=False, now=10.0)
    assert plan([HUB], {"sql": waiting}, {}, now=10.5) == []
    assert plan([HUB], {"sql": waiting}, {}, now=11.0) == [Fetch("sql", "org/sql-lora", SHA1)]
    load_waiting = a.failed(FETCHED, "engine: refused", deterministic=False, now=10.0)
    assert plan([HUB], {"sql": load_waiting}, {}, now=11.0) == [
        Load("sql", SNAP1, False, "desired")
    ]


def test_unloads_come_first_and_only_adapters_with_a_parent_are_considered() -> None:
    # `registered` holds /v1/models entries with a parent only: the base model is never in it.
    actions = plan([PVC], {}, {"zeta": "/x/zeta", "old": "/x/old"})
    assert actions == [
        Unload("old", "no longer desired"),
        Unload("zeta", "no longer desired"),
        Load("chat", PVC.path or "", False, "desired"),
    ]


def test_removal_unloads_first_and_deletes_pod_local_files_only_once_unregistered() -> None:
    store = ADAPTER_STORE
    snap = f"{store}/models--org--sql-lora/snapshots/{SHA1}"
    local: dict[str, Any] = {"store": store, "shared_store": False}
    stored = ["models--org--sql-lora", "models--org--other"]
    # Removed while registered: unload; its files stay (vLLM re-reads an evicted adapter).
    assert plan([], {}, {"sql": snap}, stored=stored, **local) == [
        Unload("sql", "no longer desired"),
        DeleteFiles("models--org--other"),
    ]
    # The next pass sees it unregistered: now its files go.
    assert plan([], {}, {}, stored=stored, **local) == [
        DeleteFiles("models--org--other"),
        DeleteFiles("models--org--sql-lora"),
    ]
    # Files of a desired adapter, or of a fetch still running, are never deleted.
    loaded = a.loaded(a.fetched(a.new_state(HUB), snap))
    assert plan([HUB], {"sql": loaded}, {"sql": snap}, stored=stored, **local) == [
        DeleteFiles("models--org--other")
    ]
    assert (
        plan([], {}, {}, stored=["models--org--other"], fetching_repos=["org/other"], **local) == []
    )


def test_a_shared_store_is_never_cleaned() -> None:
    stored = ["models--org--sql-lora"]
    assert plan([], {}, {}, stored=stored, store=SHARED, shared_store=True) == []
    assert a.store_is_shared(SHARED)
    assert not a.store_is_shared(ADAPTER_STORE + "/")


@pytest.mark.parametrize(
    ("path", "folder"),
    [
        (f"{SHARED}/models--org--x/snapshots/abc", "models--org--x"),
        (f"{SHARED}/models--org--x", "models--org--x"),
        (SHARED, None),
        ("/mnt/adapters/chat", None),
        (f"{SHARED}-other/models--org--x", None),
    ],
)
def test_store_folder(path: str, folder: str | None) -> None:
    assert a.store_folder(path, SHARED) == folder
    assert a.hub_folder("org/x") == "models--org--x"


# --- readiness, status, metrics ---------------------------------------------------------------


def gate(
    states: dict[str, AdapterState],
    desired: list[Desired] | None = None,
    *,
    ever_ready: bool = False,
    healthy_since: float | None = 0.0,
    now: float = 10.0,
) -> str | None:
    return a.gate_reason(
        [HUB, PVC] if desired is None else desired,
        states,
        ever_ready=ever_ready,
        healthy_since=healthy_since,
        now=now,
        timeout=600,
    )


LOADED_CHAT = a.loaded(a.new_state(PVC))
TRANSIENT = a.failed(a.fetching(a.new_state(HUB)), "timeout", deterministic=False, now=0)
FAILED = a.failed(FETCHED, RANK_500, deterministic=True, now=0)


def test_readiness_waits_until_every_adapter_is_loaded_or_failed_for_good() -> None:
    assert gate({}) == "loading adapters: sql, chat"
    assert gate({"sql": TRANSIENT, "chat": LOADED_CHAT}) == "loading adapters: sql"
    assert gate({"sql": LOADED, "chat": LOADED_CHAT}) is None
    assert gate({"sql": FAILED, "chat": LOADED_CHAT}) is None  # the base still serves
    assert gate({}, desired=[]) is None
    assert not a.settled([HUB, PVC], {"sql": TRANSIENT, "chat": LOADED_CHAT})
    assert a.settled([HUB, PVC], {"sql": FAILED, "chat": LOADED_CHAT})


def test_readiness_stops_waiting_at_the_timeout_and_never_gates_a_pod_that_was_ready() -> None:
    states = {"sql": TRANSIENT, "chat": LOADED_CHAT}
    assert gate(states, now=599.0) == "loading adapters: sql"
    assert gate(states, now=600.0) is None
    assert gate(states, ever_ready=True) is None
    # Before the engine answered /health there is no timeout to count; before the file was
    # read there is no desired set to judge.
    assert gate(states, healthy_since=None, now=10_000) == "loading adapters: sql"
    assert (
        a.gate_reason(None, {}, ever_ready=False, healthy_since=0.0, now=1.0, timeout=600)
        == "reading the desired adapters"
    )


def test_status_entries_and_loaded_flags() -> None:
    rank = a.loaded(a.loading(FETCHED, 8))
    entries = a.status_entries([HUB, PVC], {"sql": rank})
    assert entries == [
        {
            AdapterStatusKey.NAME: "sql",
            AdapterStatusKey.PHASE: "Loaded",
            AdapterStatusKey.MESSAGE: None,
            AdapterStatusKey.REVISION: SHA1,
            AdapterStatusKey.RANK: 8,
        },
        {
            AdapterStatusKey.NAME: "chat",
            AdapterStatusKey.PHASE: "Pending",
            AdapterStatusKey.MESSAGE: None,
            AdapterStatusKey.REVISION: None,
            AdapterStatusKey.RANK: None,
        },
    ]
    assert a.loaded_flags([HUB, PVC], {"sql": rank, "chat": FAILED}) == {
        "sql": True,
        "chat": False,
    }


@pytest.mark.parametrize(
    ("text", "rank"),
    [
        ('{"r": 8, "peft_type": "LORA"}', 8),
        ('{"r": 0}', None),
        ('{"r": true}', None),
        ('{"lora_alpha": 16}', None),
        ("{", None),
        ("[8]", None),
    ],
)
def test_rank_of_adapter_config(text: str, rank: int | None) -> None:
    assert a.rank_of(text) == rank


def test_the_module_is_pure() -> None:
    """No clock, environment, filesystem or network: only the stdlib's pure parts and the
    engine's own pure modules."""
    tree = parse_file(Path(a.__file__))
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            roots.add(node.module)
    allowed = {
        "__future__",
        "json",
        "posixpath",
        "collections.abc",
        "dataclasses",
        "llmop_engine.contract",
        "llmop_engine.download_progress",
    }
    assert roots <= allowed, roots - allowed
