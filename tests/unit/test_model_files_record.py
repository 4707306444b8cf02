"""The record of model files read from the Hub (`llmop.model_files_record`): an entry gives the
planner the same facts as the files it was made from, the ConfigMap round-trips, malformed
entries are left out, and the record stays within its bounds, oldest reads first out."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmop import model_files_record as record
from llmop.planner.model_config import ModelFiles, facts_from_files
from support.published_configs import CHECKPOINT_GIB, CONFIGS

MODEL = "microsoft/phi-4"
COMMIT = "0" * 40


def files(model: str = MODEL, *, config: dict[str, Any] | None = None) -> ModelFiles:
    total = int(CHECKPOINT_GIB[model] * (1 << 30))
    index = json.dumps({"metadata": {"total_size": total}, "weight_map": {"a": "b"}})
    return ModelFiles(json.dumps(config or CONFIGS[model]), index_text=index, revision=COMMIT)


def test_an_entry_plans_as_the_files_it_was_made_from() -> None:
    entry = record.entry_of(MODEL, None, files(), 1000.0)
    assert entry is not None
    assert entry.commit == COMMIT
    assert entry.total_size == int(CHECKPOINT_GIB[MODEL] * (1 << 30))
    direct = facts_from_files(files(), name=MODEL, source="hub")
    recorded = facts_from_files(entry.files(), name=MODEL, source="hub")
    assert recorded == direct


def test_the_config_map_round_trips_and_its_keys_are_valid() -> None:
    entries: dict[str, record.Entry] = {}
    for revision in (None, "main", COMMIT):
        entry = record.entry_of(MODEL, revision, files(), 5.0)
        assert entry is not None
        entries = record.with_entry(entries, entry)
    manifest = record.config_map("llmop-system", entries)
    assert manifest["metadata"]["name"] == record.CONFIG_MAP_NAME
    data = manifest["data"]
    assert len(data) == 3
    assert all(set(key) <= set("abcdefghijklmnopqrstuvwxyz0123456789-") for key in data)
    assert record.decode(data) == entries
    assert record.key_of(MODEL, None) != record.key_of(MODEL, "main")


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        json.dumps({"model": MODEL}),
        json.dumps({"model": MODEL, "config": "{}", "readAt": "yesterday"}),
        json.dumps({"model": MODEL, "config": "{}", "readAt": 1, "totalSize": "9"}),
        json.dumps({"model": MODEL, "config": "{}", "readAt": 1, "commit": 7}),
    ],
)
def test_a_malformed_entry_is_left_out(text: str) -> None:
    good = record.entry_of(MODEL, "main", files(), 1.0)
    assert good is not None
    data = {record.key_of(MODEL, None): text, record.key_of(MODEL, "main"): good.encode()}
    assert record.decode(data) == {record.key_of(MODEL, "main"): good}


def test_an_entry_under_another_key_is_left_out() -> None:
    """An entry is found by its own model and revision, never under another's key."""
    entry = record.entry_of(MODEL, "main", files(), 1.0)
    assert entry is not None
    assert record.decode({record.key_of("other/model", "main"): entry.encode()}) == {}
    assert record.decode({"unrelated": entry.encode()}) == {}
    assert record.decode(None) == {}


def test_nothing_to_plan_from_or_too_large_is_not_kept() -> None:
    assert record.entry_of(MODEL, None, ModelFiles(None, revision=COMMIT), 1.0) is None
    big = {**CONFIGS[MODEL], "padding": "x" * record.MAX_CONFIG_BYTES}
    assert record.entry_of(MODEL, None, files(config=big), 1.0) is None
    # Sized from the safetensors headers, which the record does not keep.
    headers = ModelFiles(json.dumps(CONFIGS[MODEL]), dtype_counts={"BF16": 10}, revision=COMMIT)
    assert record.entry_of(MODEL, None, headers, 1.0) is None


def test_the_oldest_reads_go_first_when_the_record_is_full() -> None:
    entries: dict[str, record.Entry] = {}
    for n in range(record.MAX_ENTRIES + 5):
        entry = record.entry_of(f"org/model-{n}", None, files(), float(n))
        assert entry is not None
        entries = record.with_entry(entries, entry)
    kept = {e.model for e in entries.values()}
    assert len(kept) <= record.MAX_ENTRIES
    assert "org/model-0" not in kept
    assert f"org/model-{record.MAX_ENTRIES + 4}" in kept
    size = len(json.dumps(record.config_map("ns", entries)["data"]))
    assert size <= record.MAX_TOTAL_BYTES + 64 * len(entries)


def test_a_new_read_replaces_the_same_model_and_revision() -> None:
    first = record.entry_of(MODEL, "main", files(), 1.0)
    second = record.entry_of(MODEL, "main", ModelFiles('{"x": 1}', revision="f" * 40), 2.0)
    assert first is not None
    assert second is not None
    entries = record.with_entry(record.with_entry({}, first), second)
    assert list(entries.values()) == [second]
