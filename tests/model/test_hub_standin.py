"""The hub stand-in, proved with the real `huggingface_hub` client through `HF_ENDPOINT`: if the
library resolves, lists, downloads, resumes and raises its own errors against it, the stand-in
speaks the protocol the operator's pre-flight and the downloader rely on."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from huggingface_hub import HfApi, snapshot_download
from huggingface_hub.errors import (
    GatedRepoError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from support.hub_standin import HubRepo, HubStandin, synthetic_model

TOKEN = "hf_granted"
OTHER = "hf_other"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthetic_model(tmp_path_factory.mktemp("model"), weights_bytes=3 << 20, shards=2)


@pytest.fixture
def hub(model_dir: Path) -> Iterator[HubStandin]:
    repos = [
        HubRepo("acme/tiny", model_dir),
        HubRepo("acme/gated", model_dir, gated=True, allowed_tokens=frozenset({TOKEN})),
    ]
    with HubStandin(repos, tokens=frozenset({OTHER})) as standin:
        yield standin


def digest(directory: Path) -> dict[str, str]:
    return {
        p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and ".cache" not in p.parts
    }


def test_model_info_resolves_a_branch_to_the_commit_with_file_sizes(
    hub: HubStandin, model_dir: Path
) -> None:
    info = HfApi(endpoint=hub.url).model_info("acme/tiny", revision="main", files_metadata=True)
    repo = hub.repos["acme/tiny"]
    assert info.sha == repo.sha
    assert len(info.sha) == 40
    sizes = {s.rfilename: s.size for s in info.siblings or []}
    assert sizes == {p.name: p.stat().st_size for p in model_dir.iterdir()}
    weights = [s for s in info.siblings or [] if s.rfilename.endswith(".safetensors")]
    assert weights
    assert all(s.lfs is not None and s.lfs.size == s.size for s in weights)


def test_snapshot_download_fetches_every_file_at_the_resolved_commit(
    hub: HubStandin, model_dir: Path, tmp_path: Path
) -> None:
    path = snapshot_download("acme/tiny", revision="main", endpoint=hub.url, cache_dir=tmp_path)
    assert Path(path).name == hub.repos["acme/tiny"].sha  # snapshots/<commit>
    assert digest(Path(path)) == digest(model_dir)
    # A second call at the commit is served from the cache: no file bytes move again.
    before = len([r for r in hub.requests if r.method == "GET" and "/resolve/" in r.path])
    snapshot_download(
        "acme/tiny", revision=hub.repos["acme/tiny"].sha, endpoint=hub.url, cache_dir=tmp_path
    )
    after = len([r for r in hub.requests if r.method == "GET" and "/resolve/" in r.path])
    assert after == before


CLIENT_CHUNK = 10 << 20
"""`huggingface_hub` writes (and so can resume from) whole 10 MiB chunks (DOWNLOAD_CHUNK_SIZE)."""


def test_a_dropped_connection_resumes_with_a_range_request(tmp_path: Path) -> None:
    big = synthetic_model(tmp_path / "big", weights_bytes=12 << 20)
    cut = CLIENT_CHUNK + (1 << 20)
    with HubStandin([HubRepo("acme/big", big)], cut_after_bytes=cut) as hub:
        path = snapshot_download("acme/big", endpoint=hub.url, cache_dir=tmp_path / "cache")
        assert digest(Path(path)) == digest(big)
        gets = hub.downloads("model.safetensors")
        assert [g.status for g in gets] == [200, 206]
        assert gets[1].range == f"bytes={CLIENT_CHUNK}-"


def test_gated_without_token_and_with_a_token_lacking_access_raise_gated_errors(
    hub: HubStandin, tmp_path: Path
) -> None:
    with pytest.raises(GatedRepoError) as anonymous:
        snapshot_download("acme/gated", endpoint=hub.url, cache_dir=tmp_path, token=False)
    assert anonymous.value.response.status_code == 401
    with pytest.raises(GatedRepoError) as denied:
        snapshot_download("acme/gated", endpoint=hub.url, cache_dir=tmp_path, token=OTHER)
    assert denied.value.response.status_code == 403
    path = snapshot_download("acme/gated", endpoint=hub.url, cache_dir=tmp_path, token=TOKEN)
    assert (Path(path) / "config.json").exists()


def test_unknown_repo_and_revision_raise_not_found_errors(hub: HubStandin, tmp_path: Path) -> None:
    with pytest.raises(RepositoryNotFoundError):
        snapshot_download("acme/missing", endpoint=hub.url, cache_dir=tmp_path, token=False)
    with pytest.raises(RevisionNotFoundError):
        snapshot_download(
            "acme/tiny", revision="no-such-branch", endpoint=hub.url, cache_dir=tmp_path
        )


def test_runs_as_a_process_for_the_real_client(model_dir: Path, tmp_path: Path) -> None:
    script = Path(__file__).resolve().parents[1] / "support" / "hub_standin.py"
    proc = subprocess.Popen(
        [sys.executable, str(script), "--repo", f"acme/tiny={model_dir}"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("listening on http://127.0.0.1:")
        url = line.split()[-1]
        path = snapshot_download("acme/tiny", endpoint=url, cache_dir=tmp_path)
        assert digest(Path(path)) == digest(model_dir)
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_stopped_standin_answers_nothing_even_on_a_kept_alive_connection(
    model_dir: Path,
) -> None:
    """Stopped is an outage: a client that keeps connections alive (httpx, as huggingface_hub
    does) must not still be answered on one opened before the stop."""
    import httpx

    standin = HubStandin([HubRepo("acme/tiny", model_dir)]).start()
    with httpx.Client(base_url=standin.url, timeout=5) as client:
        assert client.get("/api/models/acme/tiny").status_code == 200
        standin.stop()
        with pytest.raises(httpx.TransportError):
            client.get("/api/models/acme/tiny")
