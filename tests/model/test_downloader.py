"""`llmop-engine download` as a real process against the hub stand-in: it fills the cache the way
`huggingface_hub` lays it out, reports progress, resumes after SIGKILL without re-fetching
finished files, retries while the hub is unreachable, stops at once on a gated model, and honours
its deadline."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.hub_standin import HubRepo, HubStandin

SMALL = "model-00001-of-00002.safetensors"
LARGE = "model-00002-of-00002.safetensors"
RATE = 8 << 20  # bytes/s per file body: the large shard takes ~2 s


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two uneven shards: the small one finishes long before the large one."""
    directory = tmp_path_factory.mktemp("model")
    rng = random.Random(1)
    (directory / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (directory / SMALL).write_bytes(rng.randbytes(1 << 20))
    (directory / LARGE).write_bytes(rng.randbytes(16 << 20))
    return directory


@pytest.fixture
def hub(model_dir: Path) -> Iterator[HubStandin]:
    repos = [
        HubRepo("acme/tiny", model_dir),
        HubRepo("acme/gated", model_dir, gated=True, allowed_tokens=frozenset({"hf_ok"})),
    ]
    with HubStandin(repos, rate_bytes_per_s=RATE) as standin:
        yield standin


def downloader(
    endpoint: str, home: Path, *args: str, token: str | None = None
) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env |= {"HF_ENDPOINT": endpoint, "HF_HUB_DISABLE_TELEMETRY": "1"}
    if token is not None:
        env["HF_TOKEN"] = token
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llmop_engine",
            "download",
            "--hf-home",
            str(home),
            "--progress-file",
            str(home / "progress.json"),
            "--interval",
            "0.2",
            *args,
        ],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )


def progress(home: Path) -> dict[str, object]:
    path = home / "progress.json"
    return json.loads(path.read_text()) if path.exists() else {}


def snapshot_digest(home: Path, repo: HubRepo) -> dict[str, str]:
    snap = home / "hub" / "models--acme--tiny" / "snapshots" / repo.sha
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(snap.iterdir())}


def source_digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def test_fills_the_cache_and_reports_complete_progress(
    hub: HubStandin, model_dir: Path, tmp_path: Path
) -> None:
    proc = downloader(hub.url, tmp_path, "--model", "acme/tiny", "--revision", "main")
    seen: list[dict[str, object]] = []
    while proc.poll() is None:
        seen.append(progress(tmp_path))
        time.sleep(0.2)
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
    repo = hub.repos["acme/tiny"]
    assert snapshot_digest(tmp_path, repo) == source_digest(model_dir)
    final = progress(tmp_path)
    assert final["phase"] == "complete"
    assert final["bytesDone"] == final["bytesTotal"] == repo.total_bytes
    midway = [p for p in seen if p.get("phase") == "downloading" and p.get("rateBytesPerSecond")]
    assert midway, f"no in-flight progress among {seen}"
    assert all(0 < int(str(p["bytesDone"])) <= repo.total_bytes for p in midway)


def test_resumes_after_sigkill_without_refetching_finished_files(
    hub: HubStandin, model_dir: Path, tmp_path: Path
) -> None:
    first = downloader(hub.url, tmp_path, "--model", "acme/tiny", "--max-workers", "2")
    blobs = tmp_path / "hub" / "models--acme--tiny" / "blobs"
    deadline = time.monotonic() + 30
    # Kill once the small shard is complete and the large one is still in flight.
    while time.monotonic() < deadline:
        done = (
            [b for b in blobs.glob("*") if not b.name.endswith(".incomplete")]
            if blobs.is_dir()
            else []
        )
        partial = list(blobs.glob("*.incomplete")) if blobs.is_dir() else []
        if len(done) >= 2 and partial:
            break
        time.sleep(0.05)
    else:
        pytest.fail("never saw finished files beside an unfinished one")
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    assert list(blobs.glob("*.incomplete")), "the kill left the in-flight file behind"

    second = downloader(hub.url, tmp_path, "--model", "acme/tiny")
    assert second.wait(60) == 0, second.stderr.read() if second.stderr else ""
    assert snapshot_digest(tmp_path, hub.repos["acme/tiny"]) == source_digest(model_dir)
    assert len(hub.downloads(SMALL)) == 1  # never fetched twice
    assert len(hub.downloads(LARGE)) == 2  # the file in flight starts over
    assert not list(blobs.glob("*.incomplete"))  # the orphan was cleaned up


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_retries_with_backoff_until_the_hub_answers(model_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    proc = downloader(f"http://127.0.0.1:{port}", tmp_path, "--model", "acme/tiny")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # attempts fail (connection refused) and back off
        now = progress(tmp_path)
        if now.get("phase") == "retrying" and int(str(now.get("attempt"))) >= 2:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"no second retry reported: {progress(tmp_path)}")
    assert proc.poll() is None
    assert "ConnectError" in str(progress(tmp_path)["message"])
    with HubStandin([HubRepo("acme/tiny", model_dir)], port=port):
        assert proc.wait(60) == 0, proc.stderr.read() if proc.stderr else ""
    final = progress(tmp_path)
    assert final["phase"] == "complete"
    assert int(str(final["attempt"])) >= 2


@pytest.mark.parametrize(
    ("token", "denied"),
    [(None, True), ("hf_nope", True), ("hf_ok", False)],
    ids=["no-token-401", "token-without-access-403", "granted"],
)
def test_gated_model_fails_at_once_without_access(
    hub: HubStandin, tmp_path: Path, token: str | None, denied: bool
) -> None:
    hub.tokens = hub.tokens | {"hf_nope"}
    proc = downloader(hub.url, tmp_path, "--model", "acme/gated", token=token)
    code = proc.wait(60)
    if not denied:
        assert code == 0
        return
    err = proc.stderr.read() if proc.stderr else ""
    assert code == 2, err
    final = progress(tmp_path)
    assert final["phase"] == "failed"
    assert final["attempt"] == 1  # no retries on what a retry cannot fix
    assert "GatedRepo" in err or "gated" in str(final["message"]).lower()


def test_unknown_revision_fails_at_once(hub: HubStandin, tmp_path: Path) -> None:
    proc = downloader(hub.url, tmp_path, "--model", "acme/tiny", "--revision", "nope")
    assert proc.wait(60) == 2
    assert progress(tmp_path)["attempt"] == 1


def test_deadline_stops_a_slow_download(hub: HubStandin, tmp_path: Path) -> None:
    proc = downloader(hub.url, tmp_path, "--model", "acme/tiny", "--deadline-seconds", "1")
    assert proc.wait(30) == 3
    final = progress(tmp_path)
    assert final["phase"] == "failed"
    assert "deadline" in str(final["message"])


def test_operator_reads_progress_from_the_running_downloader(
    hub: HubStandin, tmp_path: Path
) -> None:
    """The operator's read path (`llmop.pod_client`) against the downloader's real
    `GET /progress`, turned into status.model.download."""
    from llmop import pod_client
    from llmop.render import model_cache

    port = free_port()
    proc = downloader(hub.url, tmp_path, "--model", "acme/tiny", "--progress-port", str(port))
    try:
        total = hub.repos["acme/tiny"].total_bytes
        deadline = time.monotonic() + 30
        seen = None
        while time.monotonic() < deadline and proc.poll() is None:
            report = pod_client.read_progress("127.0.0.1", port, timeout=1)
            if report and report.get("phase") == "downloading" and report.get("bytesDone"):
                seen = report
                break
            time.sleep(0.1)
        assert seen is not None, "no in-flight progress served"
        status = model_cache.download_status("Downloading", "", seen, total)
        assert status.bytes_total == total
        assert 0 < (status.bytes_done or 0) <= total
        assert status.summary is not None
        assert status.summary.startswith("Downloading ")
    finally:
        assert proc.wait(60) == 0
    assert pod_client.read_progress("127.0.0.1", port, timeout=1) is None  # gone: None
