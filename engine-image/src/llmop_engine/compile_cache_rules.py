"""Pure: the rules of the persistent compile cache — entry names, the manifest and its checks,
the node's platform, and which entries to prune. `llmop_engine.compile_cache` does the I/O.

An entry is a directory `<model-cache>/.llmop/compile/<key>-<platform>` holding the files of the
engine's private cache (`vllm/`, `inductor/`, `triton/`) and `manifest.json`, written last: the
size and sha256 of every file, the key and the platform. The key comes from the operator
(`llmop.render.compile_cache_key`: model, revision, image, vLLM version, graph-shaping flags); the
platform is this node's (CPU instruction sets, GPU models), because compiled kernels are
machine code: AVX-512 kernels on an AVX2 node die of SIGILL, every start, a crash loop. An
entry is used only when its manifest matches both and every file its sizes and digests.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

MANIFEST: Final = "manifest.json"
MANIFEST_VERSION: Final = 1
TMP_MARK: Final = ".tmp-"
"""`<entry>.tmp-<pod>-<pid>`: a publish in progress (renamed to `<entry>` when complete)."""
TRASH_MARK: Final = ".trash-"
"""`<entry>.trash-<pod>-<pid>`: an entry being removed (renamed away first, then deleted)."""
STALE_SECONDS: Final = 3600.0
"""A temporary or trash directory untouched this long belongs to a pod that died mid-way."""
KEY_PATTERN: Final = re.compile(r"^[0-9a-f]{8,64}$")
"""What the operator renders: hex of a sha256 (anything else could name a path)."""
ISA_FLAGS: Final = frozenset(
    {
        "sse4_2",
        "avx",
        "avx2",
        "fma",
        "f16c",
        "avx512f",
        "avx512bw",
        "avx512vl",
        "avx512_vnni",
        "avx512_bf16",
        "avx512_fp16",
        "amx_bf16",
        "amx_int8",
        "amx_tile",
        "asimd",
        "sve",
        "sve2",
    }
)
"""CPU features a compiler may emit code for (x86 and Arm). Only these enter the platform:
the full flag list differs between kernels and hypervisors for reasons no kernel cares about."""


class ManifestError(ValueError):
    """The manifest cannot be used; the message says why (it goes to the log and /status)."""


@dataclass(frozen=True)
class FileEntry:
    """One file of an entry: its path relative to the entry, size in bytes, sha256 hex."""

    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    key: str
    platform: str
    files: tuple[FileEntry, ...]
    created_by: str = ""

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def valid_key(key: str) -> bool:
    return bool(KEY_PATTERN.match(key))


def entry_name(key: str, platform: str) -> str:
    return f"{key}-{platform}"


def is_entry_name(name: str) -> bool:
    """A complete entry (not a publish in progress, not trash, not some other file)."""
    if TMP_MARK in name or TRASH_MARK in name:
        return False
    key, _, platform = name.rpartition("-")
    return valid_key(key) and bool(re.fullmatch(r"[0-9a-f]{12}", platform))


def is_leftover(name: str) -> bool:
    """A temporary or trash directory (removed once stale)."""
    return TMP_MARK in name or TRASH_MARK in name


def platform_id(
    machine: str, cpuinfo: str, gpu_models: Sequence[str], engine_version: str = ""
) -> str:
    """12 hex characters naming what compiled code depends on besides the operator's key: the
    architecture, the CPU's instruction sets (from /proc/cpuinfo's first `flags`/`Features`
    line), the GPU models, and the engine release actually installed ("" when unknown)."""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() in ("flags", "Features"):
            flags = set(value.split()) & ISA_FLAGS
            break
    text = json.dumps(
        {
            "machine": machine,
            "isa": sorted(flags),
            "gpus": sorted(gpu_models),
            "engine": engine_version,
        },
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def safe_relative(path: str) -> bool:
    """A manifest path that stays inside the entry (a hostile or broken manifest must not make
    the agent read or write elsewhere)."""
    if not path or path.startswith("/") or "\\" in path or "\0" in path:
        return False
    return all(part not in ("", ".", "..") for part in path.split("/"))


def encode_manifest(manifest: Manifest) -> str:
    return json.dumps(
        {
            "version": MANIFEST_VERSION,
            "key": manifest.key,
            "platform": manifest.platform,
            "createdBy": manifest.created_by,
            "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in manifest.files],
        },
        indent=1,
    )


def parse_manifest(text: str, *, key: str, platform: str) -> Manifest:
    """The manifest of the entry for (`key`, `platform`); ManifestError when it is not one."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ManifestError(f"manifest is not JSON ({exc.msg})") from exc
    if not isinstance(raw, dict):
        raise ManifestError("manifest is not an object")
    if raw.get("version") != MANIFEST_VERSION:
        raise ManifestError(f"manifest version {raw.get('version')!r}, not {MANIFEST_VERSION}")
    if raw.get("key") != key:
        raise ManifestError(f"manifest is for key {raw.get('key')!r}, not {key!r}")
    if raw.get("platform") != platform:
        raise ManifestError(f"manifest is for platform {raw.get('platform')!r}, not {platform!r}")
    files = raw.get("files")
    if not isinstance(files, list) or not files:
        raise ManifestError("manifest lists no files")
    return Manifest(
        key=key,
        platform=platform,
        files=tuple(_file_entry(f) for f in files),
        created_by=str(raw.get("createdBy") or ""),
    )


def _file_entry(raw: Any) -> FileEntry:
    if not isinstance(raw, dict):
        raise ManifestError("a manifest file entry is not an object")
    path, size, digest = raw.get("path"), raw.get("size"), raw.get("sha256")
    if not isinstance(path, str) or not safe_relative(path) or path == MANIFEST:
        raise ManifestError(f"manifest names an unsafe path {path!r}")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ManifestError(f"manifest gives {path} the size {size!r}")
    if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise ManifestError(f"manifest gives {path} the digest {digest!r}")
    return FileEntry(path, size, digest)


def has_new_files(seeded: Manifest | None, local: Iterable[str]) -> bool:
    """The engine wrote files the seeded entry did not hold: it compiled something (a miss, or
    a config vLLM hashes apart within one key), so the entry is worth (re)publishing."""
    known = set() if seeded is None else {f.path for f in seeded.files}
    return any(path not in known for path in local)


def to_prune(entries: Mapping[str, float], keep: int, current: str) -> list[str]:
    """Entries (name → mtime, touched on every use) beyond the `keep` most recently used; the
    current entry is never among them."""
    ranked = sorted(entries, key=lambda name: (entries[name], name), reverse=True)
    kept = [current] if current in entries else []
    for name in ranked:
        if len(kept) >= max(1, keep):
            break
        if name not in kept:
            kept.append(name)
    return sorted(name for name in entries if name not in kept)


def stale_leftovers(leftovers: Mapping[str, float], now: float) -> list[str]:
    """Temporary and trash directories (name → mtime) of pods that died mid-way: untouched for
    `STALE_SECONDS` (a live publish writes a file at least every few seconds)."""
    return sorted(name for name, mtime in leftovers.items() if now - mtime >= STALE_SECONDS)
