"""Pure: the record of the model files the planner read from the Hub, kept in the
`llmop-model-files` ConfigMap (in the operator's own namespace), so that an operator restarted
during a Hub outage plans a CR it planned before from the same files, instead of holding it
until the Hub answers.

One entry per model and requested revision: the commit it resolved to, `config.json`'s text
and the safetensors index's `metadata.total_size` (all the planner reads of the index). The
entry is what was read, not what was derived from it: a newer operator re-derives the facts
with its own planner. Bounded: a `config.json` over `MAX_CONFIG_BYTES` is not kept (it is
planned from the Hub as before), and past `MAX_ENTRIES` entries or `MAX_TOTAL_BYTES` the
oldest read goes first. An entry that does not parse is left out, never fatal.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmop.names import record_config_map
from llmop.planner.model_config import ModelFiles, total_size_from_index

CONFIG_MAP_NAME = "llmop-model-files"
MAX_CONFIG_BYTES = 64 * 1024
"""A `config.json` larger than this is not kept (published configs are a few KiB)."""
MAX_ENTRIES = 128
MAX_TOTAL_BYTES = 900 * 1024
"""What the entries may take together (a ConfigMap holds at most 1 MiB)."""
KEY_PREFIX = "files-"


@dataclass(frozen=True)
class Entry:
    """The files of `model` at the requested `revision` (None: the default branch)."""

    model: str
    revision: str | None
    commit: str | None
    """The commit the revision resolved to when they were read."""
    config_text: str
    total_size: int | None
    read_at: float
    """Unix seconds of the read: the oldest goes first when the record is full."""

    def files(self) -> ModelFiles:
        """The files as the planner reads them (the index reduced to its `total_size`)."""
        index = (
            None
            if self.total_size is None
            else json.dumps({"metadata": {"total_size": self.total_size}})
        )
        return ModelFiles(self.config_text, index_text=index, revision=self.commit)

    def encode(self) -> str:
        return json.dumps(
            {
                "model": self.model,
                "revision": self.revision,
                "commit": self.commit,
                "config": self.config_text,
                "totalSize": self.total_size,
                "readAt": self.read_at,
            },
            sort_keys=True,
            separators=(",", ":"),
        )


def key_of(model: str, revision: str | None) -> str:
    """The entry's data key: ConfigMap keys allow `[-._a-zA-Z0-9]` only, a model id has `/`."""
    digest = hashlib.sha256(f"{model}@{revision or ''}".encode()).hexdigest()
    return KEY_PREFIX + digest[:40]


def entry_of(model: str, revision: str | None, files: ModelFiles, read_at: float) -> Entry | None:
    """What to keep of `files` read for `model` at `revision`; None when there is nothing to
    plan from (no config.json) or it is too large to keep."""
    if files.config_text is None or len(files.config_text.encode()) > MAX_CONFIG_BYTES:
        return None
    total = None if files.index_text is None else total_size_from_index(files.index_text)
    if files.dtype_counts is not None and total is None:
        return None  # sized from the headers, which the entry does not keep
    return Entry(model, revision, files.revision, files.config_text, total, read_at)


def decode(data: Mapping[str, Any] | None) -> dict[str, Entry]:
    """The entries of the ConfigMap's `data` (malformed ones left out)."""
    found: dict[str, Entry] = {}
    for key, text in (data or {}).items():
        entry = _entry(text) if key.startswith(KEY_PREFIX) else None
        if entry is not None and key == key_of(entry.model, entry.revision):
            found[key] = entry
    return found


def _entry(text: object) -> Entry | None:
    try:
        raw = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None
    if not isinstance(raw, dict):
        return None
    model, revision, commit = raw.get("model"), raw.get("revision"), raw.get("commit")
    config, total, read_at = raw.get("config"), raw.get("totalSize"), raw.get("readAt")
    if not isinstance(model, str) or not isinstance(config, str):
        return None
    if not all(v is None or isinstance(v, str) for v in (revision, commit)):
        return None
    if total is not None and (isinstance(total, bool) or not isinstance(total, int)):
        return None
    if isinstance(read_at, bool) or not isinstance(read_at, int | float):
        return None
    return Entry(model, revision, commit, config, total, float(read_at))


def with_entry(entries: Mapping[str, Entry], entry: Entry) -> dict[str, Entry]:
    """`entries` with `entry` (replacing the same model and revision's), the oldest reads
    dropped until the bounds hold."""
    kept = {**entries, key_of(entry.model, entry.revision): entry}
    by_age = sorted(kept, key=lambda k: kept[k].read_at)
    while len(kept) > MAX_ENTRIES or _size(kept) > MAX_TOTAL_BYTES:
        del kept[by_age.pop(0)]
    return kept


def _size(entries: Mapping[str, Entry]) -> int:
    return sum(len(k) + len(e.encode().encode()) for k, e in entries.items())


def config_map(namespace: str, entries: Mapping[str, Entry]) -> dict[str, Any]:
    """The ConfigMap holding `entries`, for a server-side apply."""
    data = {key: entry.encode() for key, entry in sorted(entries.items())}
    return record_config_map(CONFIG_MAP_NAME, namespace, data)
