"""The daemonless image builder (e2e/images/images.py) on the simulator and pause images.

Builds (or reuses from ~/.cache/llmop/images) the engine simulator image from
engine-image/Dockerfile.sim and checks what a node would run: the config the Dockerfile declares,
a valid OCI layout, a cache hit on the second build, an input key that follows the COPYed files,
`llmop-engine --help` inside the image's root filesystem, and an idempotent import into a
throwaway containerd. A cold run builds the python-slim stand-in first (debootstrap, minutes);
a warm run takes seconds. Where this host cannot build (not Linux, not root) every test here
skips with the reason; the Dockerfile-reading tests in test_dockerfile_parse.py still run.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from builder import REPO, SCRIPT, cannot_build_reason, load_builder

REASON = cannot_build_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"CANNOT BUILD IMAGES HERE: {REASON}")


def build(*names: str) -> list[dict[str, str]]:
    res = subprocess.run(
        [sys.executable, str(SCRIPT), "build", "--json", *names],
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    assert res.returncode == 0, f"images.py build failed:\n{res.stderr[-4000:]}"
    return [json.loads(line) for line in res.stdout.splitlines() if line.strip()]


@pytest.fixture(scope="session")
def sim() -> dict[str, str]:
    (meta,) = build("engine-sim")
    return meta


@pytest.fixture(scope="session")
def pause() -> dict[str, str]:
    (meta,) = build("pause")
    return meta


def blob(layout: Path, digest: str) -> bytes:
    algo, _, hexdigest = digest.partition(":")
    return (layout / "blobs" / algo / hexdigest).read_bytes()


def manifest_and_config(meta: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    layout = Path(meta["layout"])
    manifest = json.loads(blob(layout, meta["digest"]))
    config = json.loads(blob(layout, manifest["config"]["digest"]))
    return manifest, config


def test_config_matches_the_dockerfile(sim: dict[str, str]) -> None:
    images = load_builder()
    text = (REPO / "engine-image/Dockerfile.sim").read_text()
    declared = dict(images.dockerfile_instructions(text))
    _, config = manifest_and_config(sim)
    cfg = config["config"]
    assert cfg["Entrypoint"] == json.loads(declared["ENTRYPOINT"])
    assert cfg["Cmd"] == json.loads(declared["CMD"])
    assert cfg["User"] == "10001"
    env = dict(e.split("=", 1) for e in cfg["Env"])
    assert env["PYTHONPATH"] == "/opt/llmop"
    assert env["LLMOP_BACKEND"] == "simulator"
    assert env["LLMOP_AGENT_SOCKET"] == "/tmp/llmop-agent.sock"
    assert set(cfg["ExposedPorts"]) == {"8000/tcp", "8081/tcp"}
    assert sim["ref"].startswith("ghcr.io/llmop/engine-sim:")
    # Built with --timestamp 0: nothing in the config depends on when it was built.
    assert config["created"].startswith("1970-01-01T00:00:00")
    # The base is a local stand-in and says so.
    assert cfg["Labels"]["dev.llmop.stand-in.for"] == "python:3.11.11-slim-bookworm"


def test_oci_layout_is_valid(sim: dict[str, str]) -> None:
    layout = Path(sim["layout"])
    assert json.loads((layout / "oci-layout").read_text())["imageLayoutVersion"] == "1.0.0"
    index = json.loads((layout / "index.json").read_text())
    assert index["schemaVersion"] == 2
    (desc,) = index["manifests"]
    assert desc["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    manifest_bytes = blob(layout, desc["digest"])
    assert len(manifest_bytes) == desc["size"]
    manifest = json.loads(manifest_bytes)
    assert len(manifest["layers"]) >= 2  # the stand-in base plus the Dockerfile's layers
    for d in [desc, manifest["config"], *manifest["layers"]]:
        data = blob(layout, d["digest"])
        assert "sha256:" + hashlib.sha256(data).hexdigest() == d["digest"]
        assert len(data) == d["size"]
    # The archive is what `ctr images import` reads: same index, named for containerd.
    out = subprocess.run(
        ["tar", "-xOf", sim["archive"], "index.json"], capture_output=True, check=True
    ).stdout
    (named,) = json.loads(out)["manifests"]
    assert named["digest"] == desc["digest"]
    assert named["annotations"]["io.containerd.image.name"] == sim["ref"]


def test_second_build_is_a_cache_hit(sim: dict[str, str]) -> None:
    start = time.monotonic()
    (again,) = build("engine-sim")
    elapsed = time.monotonic() - start
    assert again == sim
    assert elapsed < 3.0, f"a cache hit took {elapsed:.1f}s"


def test_input_key_follows_copied_files(tmp_path: Path) -> None:
    images = load_builder()
    # A copy of the build inputs outside git: the key falls back to walking the directory.
    (tmp_path / "engine-image").mkdir()
    shutil.copy(REPO / "engine-image/Dockerfile.sim", tmp_path / "engine-image/Dockerfile.sim")
    shutil.copytree(
        REPO / "engine-image/src/llmop_engine",
        tmp_path / "engine-image/src/llmop_engine",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    (tmp_path / "unrelated.txt").write_text("not copied by the Dockerfile\n")
    spec = images.ImageSpec(
        "engine-sim", tmp_path / "engine-image/Dockerfile.sim", "x/engine-sim", "t", tmp_path
    )

    def key() -> str:
        k: str = images.input_key(spec, resolve=False)[0]
        return k

    first = key()
    assert key() == first
    (tmp_path / "unrelated.txt").write_text("changed\n")
    assert key() == first, "a file the Dockerfile does not COPY must not change the key"
    cli = tmp_path / "engine-image/src/llmop_engine/cli.py"
    cli.write_text(cli.read_text() + "\n# changed\n")
    second = key()
    assert second != first, "a COPYed source file changed but the key did not"
    df = tmp_path / "engine-image/Dockerfile.sim"
    df.write_text(df.read_text() + "\nLABEL x=y\n")
    assert key() not in (first, second), "the Dockerfile changed but the key did not"


@pytest.fixture(scope="session")
def sim_rootfs(sim: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    bundle = tmp_path_factory.mktemp("sim-bundle") / "bundle"
    subprocess.run(
        ["umoci", "unpack", "--image", f"{sim['layout']}:{sim['layout_ref']}", str(bundle)],
        check=True,
        capture_output=True,
    )
    return bundle / "rootfs"


def test_llmop_engine_runs_in_the_image(sim: dict[str, str], sim_rootfs: Path) -> None:
    _, config = manifest_and_config(sim)
    cfg = config["config"]
    # As the kubelet would: the image's user and environment, its entrypoint with --help.
    res = subprocess.run(
        [
            "chroot",
            f"--userspec={cfg['User']}:{cfg['User']}",
            str(sim_rootfs),
            "/usr/bin/env",
            "-i",
            *cfg["Env"],
            *cfg["Entrypoint"],
            "--help",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert "run" in res.stdout
    assert "simulate" in res.stdout
    # The build-time CA mount (host trust for pip) left nothing of the host's bundle behind.
    host_bundle = Path("/etc/ssl/certs/ca-certificates.crt")
    image_bundle = sim_rootfs / "etc/ssl/certs/ca-certificates.crt"
    if host_bundle.is_file() and image_bundle.is_file():
        host_certs = host_bundle.read_text().count("BEGIN CERTIFICATE")
        image_certs = image_bundle.read_text().count("BEGIN CERTIFICATE")
        assert image_certs <= host_certs


def test_pause_image_exits_cleanly_on_sigterm(pause: dict[str, str], tmp_path: Path) -> None:
    assert pause["ref"] == "localhost/pause:3.10"
    _, config = manifest_and_config(pause)
    assert config["config"]["Entrypoint"] == ["/pause"]
    bundle = tmp_path / "bundle"
    subprocess.run(
        ["umoci", "unpack", "--image", f"{pause['layout']}:{pause['layout_ref']}", str(bundle)],
        check=True,
        capture_output=True,
    )
    proc = subprocess.Popen([str(bundle / "rootfs/pause")])
    time.sleep(0.3)
    assert proc.poll() is None, "pause exited on its own"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0


@pytest.fixture
def containerd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A throwaway containerd (no CRI) whose root, state and socket live in a temp dir."""
    if shutil.which("containerd") is None:
        pytest.skip("containerd is not installed (apt-get install containerd)")
    # Short path: unix socket names are limited to 108 bytes.
    d = Path(os.environ.get("TMPDIR", "/tmp")) / f"llmop-ctrd-{os.getpid()}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    sock = d / "c.sock"
    (d / "config.toml").write_text(
        "version = 2\n"
        f'root = "{d}/root"\nstate = "{d}/state"\n'
        'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
        f'[grpc]\naddress = "{sock}"\n[ttrpc]\naddress = "{sock}.ttrpc"\n'
        f'[plugins."io.containerd.internal.v1.opt"]\npath = "{d}/opt"\n'
    )
    log = (d / "containerd.log").open("w")
    proc = subprocess.Popen(
        ["containerd", "--config", str(d / "config.toml")], stdout=log, stderr=log
    )
    try:
        deadline = time.monotonic() + 20
        while not sock.exists():
            assert proc.poll() is None, (d / "containerd.log").read_text()
            assert time.monotonic() < deadline, "containerd did not open its socket in 20 s"
            time.sleep(0.1)
        yield str(sock)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        # Unpacked snapshots are overlay directories; nothing stays mounted once it stops.
        shutil.rmtree(d, ignore_errors=True)


def test_import_into_containerd_is_idempotent(
    sim: dict[str, str], pause: dict[str, str], containerd: str
) -> None:
    script = REPO / "e2e/images/import.sh"

    def run_import() -> str:
        res = subprocess.run(
            [str(script), containerd, "engine-sim", "pause"],
            capture_output=True,
            text=True,
            check=False,
            timeout=600,
        )
        assert res.returncode == 0, res.stderr
        return res.stderr

    first = run_import()
    assert "imported" in first
    listed = subprocess.run(
        ["ctr", "--address", containerd, "-n", "k8s.io", "images", "ls"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for meta in (sim, pause):
        line = next(line for line in listed.splitlines() if line.startswith(meta["ref"] + " "))
        assert meta["digest"] in line
    second = run_import()
    assert "imported" not in second
    assert second.count("already present") == 2
