"""The agent's persistent compile cache (`llmop_engine.compile_cache` over
`compile_cache_rules`), on real directories: a miss seeds nothing and publishes, a hit seeds
exactly what was published, a corrupt or foreign entry is discarded and rebuilt (never used),
concurrent publishers leave one complete entry, the least recently used entries are pruned, and
a volume that cannot be written leaves the engine its private cache and a reason."""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from llmop_engine import compile_cache, compile_cache_rules
from llmop_engine.compile_cache import ENGINE_DIRS, CompileCache
from llmop_engine.compile_cache_rules import (
    FileEntry,
    Manifest,
    ManifestError,
    parse_manifest,
    platform_id,
    to_prune,
)

KEY = "0f" * 16
OTHER_KEY = "ab" * 16
PLATFORM = "0123456789ab"


def cache(tmp: Path, pod: str, key: str = KEY, keep: int = 4) -> CompileCache:
    return CompileCache(
        root=tmp / "models" / ".llmop" / "compile",
        key=key,
        local=tmp / pod / "local",
        keep=keep,
        platform_id=PLATFORM,
        owner=pod,
    )


def compile_into(env: dict[str, str], files: dict[str, bytes]) -> None:
    """What the engine does: write artifacts under the cache variables it was given."""
    for rel, data in files.items():
        var, _, path = rel.partition(":")
        target = Path(env[var]) / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


ARTIFACTS = {
    "VLLM_CACHE_ROOT:torch_compile_cache/abc/rank_0_0/model": b"compiled graph" * 100,
    "VLLM_CACHE_ROOT:modelinfos/llama.json": b'{"arch": "llama"}',
    "TORCHINDUCTOR_CACHE_DIR:fxgraph/x/y": b"\x00\x01kernel",
}


def tree(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def published(tmp: Path, pod: str = "pod-a") -> CompileCache:
    """A first pod: a miss, compiles, publishes."""
    c = cache(tmp, pod)
    env = c.prepare({})
    compile_into(env, ARTIFACTS)
    c.publish()
    assert c.report.publish == "published", c.report
    return c


def test_a_miss_gives_the_engine_an_empty_private_cache(tmp_path: Path) -> None:
    c = cache(tmp_path, "pod-a")
    env = c.prepare({"PATH": "/bin"})
    assert env == {var: str(c.local / folder) for var, folder in ENGINE_DIRS.items()}
    assert all(Path(p).is_dir() and not any(Path(p).iterdir()) for p in env.values())
    status = c.status()
    assert status["seed"] == "miss"
    assert status["publish"] == "pending"


def test_publish_then_a_second_pod_starts_from_exactly_what_was_published(tmp_path: Path) -> None:
    first = published(tmp_path)
    entry = first.entry
    assert entry.name == f"{KEY}-{PLATFORM}"
    manifest = parse_manifest(
        (entry / compile_cache_rules.MANIFEST).read_text(), key=KEY, platform=PLATFORM
    )
    assert {f.path for f in manifest.files} == set(tree(first.local))
    assert [p.name for p in entry.parent.iterdir()] == [entry.name]  # no temporary left

    second = cache(tmp_path, "pod-b")
    env = second.prepare({})
    assert second.report.seed == "hit"
    assert second.report.seeded_bytes == manifest.total_bytes
    assert tree(second.local) == tree(first.local)
    assert Path(env["VLLM_CACHE_ROOT"]).is_relative_to(second.local)
    second.publish()  # it compiled nothing new: the entry stays as it is
    assert second.report.publish == "skipped"
    assert "already holds" in (second.report.publish_message or "")


def test_a_hit_that_compiled_more_replaces_the_entry(tmp_path: Path) -> None:
    published(tmp_path)
    second = cache(tmp_path, "pod-b")
    env = second.prepare({})
    compile_into(env, {"VLLM_CACHE_ROOT:torch_compile_cache/def/rank_0_0/model": b"another"})
    second.publish()
    assert second.report.publish == "published"
    third = cache(tmp_path, "pod-c")
    third.prepare({})
    assert "vllm/torch_compile_cache/def/rank_0_0/model" in tree(third.local)
    assert "vllm/torch_compile_cache/abc/rank_0_0/model" in tree(third.local)


@pytest.mark.parametrize(
    "damage",
    ["flipped byte", "truncated", "missing file", "no manifest", "garbage manifest", "other key"],
)
def test_a_corrupt_or_foreign_entry_is_discarded_and_rebuilt(tmp_path: Path, damage: str) -> None:
    first = published(tmp_path)
    entry = first.entry
    victim = entry / "vllm" / "torch_compile_cache" / "abc" / "rank_0_0" / "model"
    manifest_path = entry / compile_cache_rules.MANIFEST
    if damage == "flipped byte":
        data = bytearray(victim.read_bytes())
        data[5] ^= 0xFF
        victim.write_bytes(bytes(data))
    elif damage == "truncated":
        victim.write_bytes(victim.read_bytes()[:10])
    elif damage == "missing file":
        victim.unlink()
    elif damage == "no manifest":
        manifest_path.unlink()
    elif damage == "garbage manifest":
        manifest_path.write_text("{not json")
    else:  # an entry written for another key, under this key's name
        raw = json.loads(manifest_path.read_text())
        raw["key"] = OTHER_KEY
        manifest_path.write_text(json.dumps(raw))

    second = cache(tmp_path, "pod-b")
    env = second.prepare({})
    assert second.report.seed == "rejected", second.report
    assert not entry.exists()  # discarded, not left for the next pod
    assert tree(second.local) == {}  # nothing of it reached the engine
    assert set(env) == set(ENGINE_DIRS)  # the engine still gets its private cache

    compile_into(env, ARTIFACTS)
    second.publish()
    assert second.report.publish == "published"
    third = cache(tmp_path, "pod-c")
    third.prepare({})
    assert third.report.seed == "hit"


def test_concurrent_publishers_leave_one_complete_entry(tmp_path: Path) -> None:
    pods = [cache(tmp_path, f"pod-{i}") for i in range(6)]
    for i, c in enumerate(pods):
        env = c.prepare({})
        compile_into(env, {**ARTIFACTS, "VLLM_CACHE_ROOT:who": f"pod-{i}".encode() * 5000})
    start = threading.Barrier(len(pods))

    def run(c: CompileCache) -> None:
        start.wait()
        c.publish()

    threads = [threading.Thread(target=run, args=(c,)) for c in pods]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    outcomes = sorted(c.report.publish for c in pods)
    assert outcomes == ["lost-race"] * 5 + ["published"]
    winner = next(c for c in pods if c.report.publish == "published")
    assert [p.name for p in winner.root.iterdir()] == [winner.entry.name]
    reader = cache(tmp_path, "reader")
    reader.prepare({})
    assert reader.report.seed == "hit"
    assert tree(reader.local) == tree(winner.local)


def test_prune_keeps_the_most_recently_used_and_never_the_current(tmp_path: Path) -> None:
    root = tmp_path / "models" / ".llmop" / "compile"
    now = time.time()
    keys = [f"{i:02x}" * 16 for i in range(6)]
    for age, key in enumerate(keys):
        entry = root / f"{key}-{PLATFORM}"
        entry.mkdir(parents=True)
        (entry / "manifest.json").write_text("{}")
        os.utime(entry, (now - 100 * age, now - 100 * age))
    stale = root / f"{keys[0]}-{PLATFORM}.tmp-dead-1"
    fresh = root / f"{keys[0]}-{PLATFORM}.tmp-alive-2"
    for leftover, age in ((stale, compile_cache_rules.STALE_SECONDS + 10), (fresh, 5.0)):
        leftover.mkdir()
        os.utime(leftover, (now - age, now - age))
    (root / "README").write_text("not ours")
    oldest = cache(tmp_path, "pod-x", key=keys[-1], keep=3)
    assert oldest.prune() == 3
    left = sorted(p.name for p in root.iterdir())
    assert left == sorted(
        ["README", fresh.name, *(f"{k}-{PLATFORM}" for k in (keys[0], keys[1], keys[5]))]
    )


def test_a_model_cache_that_cannot_be_written_costs_only_the_publish(tmp_path: Path) -> None:
    c = cache(tmp_path, "pod-a")
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / ".llmop").write_text("a file where the cache's folder should be")
    env = c.prepare({})
    assert c.report.seed == "error"  # reading the entry failed: the engine compiles
    assert set(env) == set(ENGINE_DIRS)
    compile_into(env, ARTIFACTS)
    c.publish()
    assert c.report.publish == "failed"
    assert tree(c.local)  # the engine's own cache is untouched


@pytest.mark.parametrize(
    ("code", "words"),
    [(errno.EROFS, "read-only"), (errno.ENOSPC, "full"), (errno.EACCES, "permission")],
)
def test_write_errors_are_reported_and_leave_no_partial_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, words: str
) -> None:
    c = cache(tmp_path, "pod-a")
    env = c.prepare({})
    compile_into(env, ARTIFACTS)
    real_copy = compile_cache._copy
    calls = 0

    def failing_copy(src: Path, dst: Path, stop: threading.Event | None = None) -> FileEntry:
        nonlocal calls
        calls += 1
        if calls == 2:  # the volume fails half-way through
            raise OSError(code, os.strerror(code))
        return real_copy(src, dst, stop)

    monkeypatch.setattr(compile_cache, "_copy", failing_copy)
    c.publish()
    assert c.report.publish == "failed"
    assert words in (c.report.publish_message or "")
    assert list(c.root.iterdir()) == []  # the temporary directory is gone, no entry appeared


def test_not_enough_space_skips_the_publish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = cache(tmp_path, "pod-a")
    compile_into(c.prepare({}), ARTIFACTS)
    full = SimpleNamespace(total=2**30, used=2**30 - 4096, free=4096)
    monkeypatch.setattr(compile_cache.shutil, "disk_usage", lambda _p: full)
    c.publish()
    assert c.report.publish == "skipped"
    assert "free" in (c.report.publish_message or "")
    assert list(c.root.iterdir()) == []


def test_variables_the_user_set_are_kept_and_the_cache_is_off(tmp_path: Path) -> None:
    c = cache(tmp_path, "pod-a")
    assert c.prepare({"VLLM_CACHE_ROOT": "/data/mine"}) == {}
    assert c.report.seed == "off"
    c.publish()
    assert c.report.publish == "skipped"


def test_a_key_that_is_not_a_digest_is_refused(tmp_path: Path) -> None:
    c = cache(tmp_path, "pod-a", key="../../etc")
    assert c.prepare({}) == {}
    assert c.report.seed == "off"


def test_an_agent_that_stops_abandons_its_publish(tmp_path: Path) -> None:
    c = cache(tmp_path, "pod-a")
    compile_into(c.prepare({}), ARTIFACTS)
    c.stop.set()
    c.publish()
    assert c.report.publish == "skipped"
    assert list(c.root.iterdir()) == []


# -- the pure rules -------------------------------------------------------------------------


def manifest_text(**over: object) -> str:
    raw: dict[str, object] = {
        "version": 1,
        "key": KEY,
        "platform": PLATFORM,
        "files": [{"path": "vllm/a", "size": 3, "sha256": "0" * 64}],
    }
    raw.update(over)
    return json.dumps(raw)


@pytest.mark.parametrize(
    ("over", "why"),
    [
        ({"version": 2}, "version"),
        ({"key": OTHER_KEY}, "key"),
        ({"platform": "ffffffffffff"}, "platform"),
        ({"files": []}, "no files"),
        ({"files": [{"path": "../escape", "size": 1, "sha256": "0" * 64}]}, "unsafe"),
        ({"files": [{"path": "/etc/passwd", "size": 1, "sha256": "0" * 64}]}, "unsafe"),
        ({"files": [{"path": "a", "size": -1, "sha256": "0" * 64}]}, "size"),
        ({"files": [{"path": "a", "size": 1, "sha256": "xyz"}]}, "digest"),
    ],
)
def test_manifests_that_are_not_this_entrys_are_refused(over: dict[str, object], why: str) -> None:
    with pytest.raises(ManifestError, match=why):
        parse_manifest(manifest_text(**over), key=KEY, platform=PLATFORM)


def test_manifest_round_trip() -> None:
    m = Manifest(KEY, PLATFORM, (FileEntry("vllm/a", 3, "1" * 64),), created_by="pod-a")
    text = compile_cache_rules.encode_manifest(m)
    assert parse_manifest(text, key=KEY, platform=PLATFORM) == m


def test_platform_follows_instruction_sets_gpus_and_engine_not_other_cpu_flags() -> None:
    avx2 = "processor: 0\nflags\t: fpu sse4_2 avx avx2 fma hypervisor md_clear\n"
    noise = "processor: 0\nflags\t: fpu sse4_2 avx avx2 fma\n"
    avx512 = "processor: 0\nflags\t: fpu sse4_2 avx avx2 fma avx512f avx512bw\n"
    base = platform_id("x86_64", avx2, [])
    assert platform_id("x86_64", noise, []) == base
    assert platform_id("x86_64", avx512, []) != base
    assert platform_id("aarch64", avx2, []) != base
    assert platform_id("x86_64", avx2, ["NVIDIA H100 80GB HBM3"]) != base
    assert platform_id("x86_64", avx2, [], "0.33.0") != base
    assert len(base) == 12


def test_to_prune() -> None:
    entries = {"a": 1.0, "b": 5.0, "c": 3.0, "d": 4.0}
    assert to_prune(entries, keep=2, current="a") == ["c", "d"]
    assert to_prune(entries, keep=2, current="z") == ["a", "c"]
    assert to_prune(entries, keep=10, current="a") == []


def test_prepare_empties_only_its_own_folders(tmp_path: Path) -> None:
    c = cache(tmp_path, "pod-a")
    c.local.mkdir(parents=True)
    (c.local / "not-ours").write_text("kept")
    (c.local / "vllm").mkdir()
    (c.local / "vllm" / "stale").write_text("from an earlier container")
    c.prepare({})
    assert (c.local / "not-ours").read_text() == "kept"
    assert not (c.local / "vllm" / "stale").exists()


def test_the_images_model_infos_join_a_private_cache_that_lacks_them(tmp_path: Path) -> None:
    """The image fills vLLM's model-info cache in its default root ($HOME/.cache/vllm); a compile
    cache gives vLLM another root, so they are copied in (without them vLLM asks a second Python
    process at start), never over what the entry brought."""
    home = tmp_path / "home"
    image = home / ".cache" / "vllm" / "modelinfos"
    image.mkdir(parents=True)
    (image / "llama.json").write_bytes(b'{"from": "image"}')
    (image / "qwen.json").write_bytes(b'{"from": "image"}')
    miss = cache(tmp_path, "pod-a")
    env = miss.prepare({"HOME": str(home)})
    infos = Path(env["VLLM_CACHE_ROOT"]) / "modelinfos"
    assert sorted(p.name for p in infos.iterdir()) == ["llama.json", "qwen.json"]
    assert miss.report.seed == "miss"

    first = published(tmp_path, "pod-b")  # its entry holds modelinfos/llama.json of its own
    hit = cache(tmp_path, "pod-c")
    env = hit.prepare({"XDG_CACHE_HOME": str(home / ".cache")})
    infos = Path(env["VLLM_CACHE_ROOT"]) / "modelinfos"
    assert (infos / "llama.json").read_bytes() == (
        first.local / "vllm" / "modelinfos" / "llama.json"
    ).read_bytes()
    assert (infos / "qwen.json").read_bytes() == b'{"from": "image"}'
    assert hit.report.seed == "hit"
    # No image cache (no HOME, or an image without one): nothing added, nothing fails.
    for environ in ({}, {"HOME": str(tmp_path / "nowhere")}):
        env = cache(tmp_path, "pod-d").prepare(environ)
        assert not (Path(env["VLLM_CACHE_ROOT"]) / "modelinfos" / "qwen.json").exists()
