"""The engine's persistent compile cache on the model cache (the I/O half of
`compile_cache_rules`).

Before the engine starts, `prepare` gives it a private, empty cache directory on the
container's own filesystem (`VLLM_CACHE_ROOT`, `TORCHINDUCTOR_CACHE_DIR`, `TRITON_CACHE_DIR`)
and, when the model cache holds an entry for this key and platform, copies it there, checking
every file against the manifest's size and sha256 as it goes: a corrupt entry, or one from
another key or platform, is moved away and deleted, never used, and the engine compiles. Once the
engine is ready, `publish` copies the private cache to `<entry>.tmp-<pod>-<pid>` on the model
cache, writes the manifest last, and renames the directory to `<entry>`. A rename onto a name
that does not exist is atomic and fails when another pod's entry got there first (ours is then
deleted), so readers see a complete entry or none, however many pods publish at once, and a pod
that dies mid-way leaves only a temporary directory, deleted once stale. Then the least recently
used entries beyond `keep` are removed.

Nothing here may stop the engine: every failure (a full or read-only volume, a permission, a
corrupt entry) leaves the engine compiling for itself, is logged, and is reported in the
agent's `/status` (`compileCache`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import importlib.metadata
import logging
import os
import platform
import shutil
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from llmop_engine import compile_cache_rules as rules
from llmop_engine import contract
from llmop_engine.compile_cache_rules import FileEntry, Manifest, ManifestError

log = logging.getLogger("llmop_engine.compile_cache")

ENGINE_DIRS: Final = {
    "VLLM_CACHE_ROOT": "vllm",
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
    "TRITON_CACHE_DIR": "triton",
}
"""The engine's cache variables and their folder in the private cache. vLLM keeps its
torch.compile artifacts under `VLLM_CACHE_ROOT/torch_compile_cache` and points TorchInductor
there itself while it compiles; Inductor's own default (`/tmp/torchinductor_<user>`) and Triton's
(`~/.triton`, GPU kernels) catch what is compiled outside it."""
MODELINFOS: Final = "modelinfos"
"""vLLM's cache of what each model class supports, under `VLLM_CACHE_ROOT`."""
SPACE_MARGIN_BYTES: Final = 64 * 2**20
"""Free space left on the model cache after a publish (a full volume would fail model loads)."""
CHUNK: Final = 1 << 20

Seed = Literal["off", "hit", "miss", "rejected", "error"]
Publish = Literal["pending", "published", "skipped", "lost-race", "failed"]


@dataclass
class CacheReport:
    """What `/status` says about the compile cache."""

    key: str
    entry: str
    seed: Seed = "miss"
    seed_message: str | None = None
    seeded_bytes: int = 0
    seed_seconds: float | None = None
    publish: Publish = "pending"
    publish_message: str | None = None
    published_bytes: int | None = None
    pruned: int = 0

    def as_json(self) -> dict[str, object]:
        return {
            "key": self.key,
            "entry": self.entry,
            "seed": self.seed,
            "seedMessage": self.seed_message,
            "seededBytes": self.seeded_bytes,
            "seedSeconds": self.seed_seconds,
            "publish": self.publish,
            "publishMessage": self.publish_message,
            "publishedBytes": self.published_bytes,
            "prunedEntries": self.pruned,
        }


def engine_version() -> str:
    """vLLM's release as installed beside the agent (the images share one interpreter; the
    distribution's metadata only, vLLM is not imported); "" elsewhere."""
    try:
        return importlib.metadata.version("vllm")
    except Exception:
        return ""


def node_platform() -> str:
    """This node's `compile_cache_rules.platform_id` (Linux /proc; NVIDIA GPUs by the driver's
    own listing, which needs no library)."""
    cpuinfo = ""
    with contextlib.suppress(OSError):
        cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
    gpus: list[str] = []
    with contextlib.suppress(OSError):
        for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
            for line in info.read_text(errors="replace").splitlines():
                if line.startswith("Model:"):
                    gpus.append(line.partition(":")[2].strip())
    return rules.platform_id(platform.machine(), cpuinfo, gpus, engine_version())


def _describe(exc: OSError) -> str:
    if exc.errno == errno.ENOSPC:
        return f"the model cache is full ({exc})"
    if exc.errno == errno.EROFS:
        return f"the model cache is read-only ({exc})"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"no permission on the model cache ({exc})"
    return f"{type(exc).__name__}: {exc}"


def _copy(src: Path, dst: Path, stop: threading.Event | None = None) -> FileEntry:
    """Copy one file, hashing it on the way; the entry describes what was written."""
    digest = hashlib.sha256()
    size = 0
    dst.parent.mkdir(parents=True, exist_ok=True)
    with src.open("rb") as fin, dst.open("wb") as fout:
        while chunk := fin.read(CHUNK):
            if stop is not None and stop.is_set():
                raise InterruptedError("stopped")
            digest.update(chunk)
            fout.write(chunk)
            size += len(chunk)
        fout.flush()
        os.fsync(fout.fileno())
    return FileEntry("", size, digest.hexdigest())


def _files(root: Path) -> dict[str, Path]:
    """Regular files under `root` by relative path (links and sockets are not cache content)."""
    out: dict[str, Path] = {}
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            if path.is_file() and not path.is_symlink():
                out[path.relative_to(root).as_posix()] = path
    return out


class CompileCache:
    """One engine's compile cache: `prepare` before it starts, `publish` once it is ready."""

    def __init__(
        self,
        *,
        root: Path,
        key: str,
        local: Path,
        keep: int,
        platform_id: str,
        owner: str,
    ) -> None:
        self.root = root
        self.key = key
        self.local = local
        self.keep = keep
        self.platform = platform_id
        self.owner = owner
        self.name = rules.entry_name(key, platform_id)
        self.entry = root / self.name
        self.seeded: Manifest | None = None
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self.report = CacheReport(key=key, entry=str(self.entry))

    @classmethod
    def from_settings(
        cls, model_cache_dir: str, key: str, local_dir: str, keep: int
    ) -> CompileCache:
        owner = f"{socket.gethostname()}-{os.getpid()}"
        return cls(
            root=Path(model_cache_dir) / contract.COMPILE_CACHE_DIR,
            key=key,
            local=Path(local_dir),
            keep=keep,
            platform_id=node_platform(),
            owner=owner,
        )

    def status(self) -> dict[str, object]:
        with self._lock:
            return self.report.as_json()

    # -- before the engine starts ----------------------------------------------------------

    def prepare(self, environ: Mapping[str, str]) -> dict[str, str]:
        """The variables to give the engine (empty: it keeps its own defaults). Never raises."""
        started = time.monotonic()
        taken = sorted(var for var in ENGINE_DIRS if environ.get(var))
        if taken:
            self._seeded("off", f"{', '.join(taken)} set in the container's environment: kept")
            return {}
        if not rules.valid_key(self.key):
            self._seeded("off", f"compile cache key {self.key!r} is not a sha256 hex digest")
            return {}
        try:
            # Only the folders it owns: the setting could name a directory with other contents.
            for folder in ENGINE_DIRS.values():
                shutil.rmtree(self.local / folder, ignore_errors=True)
                (self.local / folder).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self._seeded("off", f"cannot create {self.local}: {exc}")
            return {}
        env = {var: str(self.local / folder) for var, folder in ENGINE_DIRS.items()}
        try:
            self._seed()
        except Exception as exc:  # the engine starts without the cache, whatever went wrong
            self._clear_local()
            self._seeded("error", f"seeding failed: {type(exc).__name__}: {exc}")
        self._add_image_modelinfos(environ)
        with self._lock:
            self.report.seed_seconds = round(time.monotonic() - started, 3)
        return env

    def _add_image_modelinfos(self, environ: Mapping[str, str]) -> None:
        """The model infos the image keeps in vLLM's default cache root (its Dockerfile fills
        them), copied into the private one where the entry did not bring them: without them
        vLLM asks a second Python process at start. Never raises."""
        image = _default_vllm_cache_root(environ)
        if image is None:
            return
        source, target = (
            image / MODELINFOS,
            self.local / ENGINE_DIRS["VLLM_CACHE_ROOT"] / MODELINFOS,
        )
        try:
            names = [p.name for p in source.iterdir() if p.suffix == ".json" and p.is_file()]
            missing = [name for name in names if not (target / name).exists()]
            if missing:
                target.mkdir(parents=True, exist_ok=True)
                for name in missing:
                    shutil.copyfile(source / name, target / name)
        except FileNotFoundError:
            return  # an image without them
        except OSError as exc:
            log.warning("copying the image's vLLM model infos from %s failed: %s", source, exc)
            return
        if missing:
            log.info("compile cache: %d model infos from the image added", len(missing))

    def _seed(self) -> None:
        try:
            text = (self.entry / rules.MANIFEST).read_text()
        except FileNotFoundError:
            if self.entry.exists():
                # A complete entry always has its manifest (written before the rename).
                self._reject("entry has no manifest")
            else:
                self._seeded("miss", "no entry for this key and platform yet: the engine compiles")
            return
        except OSError as exc:
            self._seeded("error", f"cannot read the entry: {_describe(exc)}")
            return
        try:
            manifest = rules.parse_manifest(text, key=self.key, platform=self.platform)
        except ManifestError as exc:
            self._reject(str(exc))
            return
        for f in manifest.files:
            try:
                got = _copy(self.entry / f.path, self.local / f.path)
            except FileNotFoundError:
                if not self.entry.exists():  # removed or replaced by another pod meanwhile
                    self._clear_local()
                    self._seeded("miss", "the entry was removed while it was read")
                    return
                self._reject(f"{f.path} is missing")
                return
            if (got.size, got.sha256) != (f.size, f.sha256):
                self._reject(
                    f"{f.path}: {got.size} bytes, sha256 {got.sha256[:12]}… "
                    f"where the manifest says {f.size} bytes, {f.sha256[:12]}…"
                )
                return
        self.seeded = manifest
        # Touched on every use: pruning removes the least recently used entries.
        with contextlib.suppress(OSError):
            os.utime(self.entry)
        with self._lock:
            self.report.seeded_bytes = manifest.total_bytes
        self._seeded("hit", f"{len(manifest.files)} files, {manifest.total_bytes} bytes")

    def _reject(self, why: str) -> None:
        """A corrupt entry, or one that is not ours: never used, moved away and deleted so that
        this pod's publish rebuilds it."""
        self._clear_local()
        self._discard(self.entry)
        self._seeded("rejected", f"entry discarded: {why}")

    def _seeded(self, seed: Seed, message: str) -> None:
        level = logging.WARNING if seed in ("rejected", "error") else logging.INFO
        log.log(level, "compile cache %s (%s): %s", seed, self.name, message)
        with self._lock:
            self.report.seed, self.report.seed_message = seed, message

    def _clear_local(self) -> None:
        for folder in ENGINE_DIRS.values():
            shutil.rmtree(self.local / folder, ignore_errors=True)
            with contextlib.suppress(OSError):
                (self.local / folder).mkdir(parents=True, exist_ok=True)

    def _discard(self, path: Path) -> None:
        """Remove a directory from the shared cache: renamed away first (atomic), so no reader
        ever opens a half-deleted entry under its real name."""
        trash = path.with_name(f"{path.name}{rules.TRASH_MARK}{self.owner}-{time.time_ns()}")
        try:
            os.rename(path, trash)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                log.warning("compile cache: cannot remove %s: %s", path, _describe(exc))
            return
        shutil.rmtree(trash, ignore_errors=True)

    # -- once the engine is ready ----------------------------------------------------------

    def publish(self) -> None:
        """Publish the private cache as this key's entry, then prune. Never raises."""
        if self.report.seed == "off":
            with self._lock:
                self.report.publish = "skipped"
                self.report.publish_message = "the compile cache is off"
            return
        tmp = self.root / f"{self.name}{rules.TMP_MARK}{self.owner}"
        try:
            outcome, message, written = self._publish(tmp)
        except InterruptedError:
            outcome, message, written = "skipped", "the agent stopped before it finished", None
        except OSError as exc:
            outcome, message, written = "failed", _describe(exc), None
        except Exception as exc:
            outcome, message, written = "failed", f"{type(exc).__name__}: {exc}", None
        if outcome != "published":
            shutil.rmtree(tmp, ignore_errors=True)
        level = logging.WARNING if outcome == "failed" else logging.INFO
        log.log(level, "compile cache publish %s (%s): %s", outcome, self.name, message)
        pruned = 0
        with contextlib.suppress(Exception):
            pruned = self.prune()
        with self._lock:
            self.report.publish, self.report.publish_message = outcome, message
            self.report.published_bytes = written
            self.report.pruned = pruned

    def _publish(self, tmp: Path) -> tuple[Publish, str, int | None]:
        local = _files(self.local)
        if not local:
            return "skipped", "the engine compiled nothing (eager mode?)", None
        if not rules.has_new_files(self.seeded, local):
            return "skipped", "the entry already holds everything the engine compiled", None
        total = sum(p.stat().st_size for p in local.values())
        self.root.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(self.root).free
        if free < total + SPACE_MARGIN_BYTES:
            return "skipped", f"{free} bytes free on the model cache, {total} needed", None
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        files = []
        for rel, path in sorted(local.items()):
            got = _copy(path, tmp / rel, self.stop)
            files.append(FileEntry(rel, got.size, got.sha256))
        manifest = Manifest(self.key, self.platform, tuple(files), created_by=self.owner)
        with (tmp / rules.MANIFEST).open("w") as out:
            out.write(rules.encode_manifest(manifest))
            out.flush()
            os.fsync(out.fileno())
        if self.seeded is not None:
            # Ours extends the entry we started from (vLLM compiled more): replace it. Between
            # the two renames the entry is missing, which readers take as a miss.
            self._discard(self.entry)
        try:
            os.rename(tmp, self.entry)
        except OSError as exc:
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                return "lost-race", "another pod published this entry first: ours discarded", None
            raise
        with contextlib.suppress(OSError):
            fd = os.open(self.root, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        return (
            "published",
            f"{len(files)} files, {manifest.total_bytes} bytes",
            manifest.total_bytes,
        )

    def prune(self) -> int:
        """Remove entries beyond `keep` (least recently used first) and stale leftovers."""
        entries: dict[str, float] = {}
        leftovers: dict[str, float] = {}
        with os.scandir(self.root) as it:
            for item in it:
                with contextlib.suppress(OSError):
                    if not item.is_dir(follow_symlinks=False):
                        continue
                    mtime = item.stat(follow_symlinks=False).st_mtime
                    if rules.is_entry_name(item.name):
                        entries[item.name] = mtime
                    elif rules.is_leftover(item.name):
                        leftovers[item.name] = mtime
        doomed = rules.to_prune(entries, self.keep, self.name)
        for name in doomed:
            log.info("compile cache: pruning %s (least recently used)", name)
            self._discard(self.root / name)
        for name in rules.stale_leftovers(leftovers, time.time()):
            shutil.rmtree(self.root / name, ignore_errors=True)
        return len(doomed)


def _default_vllm_cache_root(environ: Mapping[str, str]) -> Path | None:
    """vLLM's own default `VLLM_CACHE_ROOT` (`vllm/envs.py`): `$XDG_CACHE_HOME/vllm`, else
    `$HOME/.cache/vllm`; None without either."""
    if environ.get("XDG_CACHE_HOME"):
        return Path(environ["XDG_CACHE_HOME"]) / "vllm"
    if environ.get("HOME"):
        return Path(environ["HOME"]) / ".cache" / "vllm"
    return None
