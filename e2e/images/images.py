#!/usr/bin/env python3
"""Build llmop's container images without a Docker engine, cache them, import them into containerd.

Why: CI machines and the e2e real node have no Docker daemon and no reachable registry, yet the
node must run our images. This builds the repository's own Dockerfiles (they stay the single
description of each image) with `buildah bud` (daemonless, chroot isolation, --pull=never) into a
private buildah storage under the cache, exports each image as an OCI layout keyed on a hash of
its inputs, and imports images into a containerd given by its socket (an OCI archive streamed
into `ctr images import -`: no second copy of gigabyte layers on disk).

Base images that cannot be pulled are replaced by local stand-ins built from Debian packages
(python:3.11.11-slim-bookworm <- debootstrap + Debian's python3), clearly labelled as such. So
is one image the chart runs as it is: redis:7.0.15 <- Debian's redis-server package on that
stand-in. An image whose base is neither a stand-in nor present in local storage (the GPU engine
image, FROM vllm/vllm-openai) is skipped with a message, never an error.

With a Docker daemon answering (or CONTAINER_TOOL=docker|podman), `build` runs `<tool> build`
instead, the way users with Docker build: no OCI export, no input-key cache (the tool has its own).

Usage (thin wrappers: mk/images.mk, e2e/images/import.sh):
  images.py build [--json] NAME...        build or reuse; NAME: operator router engine-sim engine
                                          engine-cpu pause redis (and `all`: what can be built here)
  images.py import --address SOCK NAME... build or reuse, then import into that containerd
  images.py archive --out F.tar NAME     build or reuse, then write an OCI archive of it
  images.py key NAME                      print the input key (no build)

Environment:
  LLMOP_CACHE / XDG_CACHE_HOME   cache root: $LLMOP_CACHE/images (default ~/.cache/llmop/images)
  LLMOP_IMAGE_TAG                tag (default: version in pyproject.toml)
  LLMOP_IMAGE_REGISTRY           registry prefix (default ghcr.io/llmop)
  LLMOP_IMG_<NAME>               a whole reference for one image (LLMOP_IMG_ENGINE_SIM=...)
  CONTAINER_TOOL                 docker | podman | buildah (default: docker when its daemon
                                 answers, else buildah)
  LLMOP_STORAGE_DRIVER           buildah storage driver: overlay (default) or vfs
  LLMOP_BUILD_CA_BUNDLE          CA bundle RUN steps trust (default: the host's; `none`)
  LLMOP_DEBIAN_MIRROR            Debian mirror for the stand-in (default deb.debian.org)
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import fnmatch
import functools
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

# Bump when how images are built or exported changes (flags, export format), so stale cache
# entries are not reused. It is part of every image's input key.
RECIPE = "4"
# Bump when the stand-in's root filesystem recipe (packages, trimming) changes.
STANDIN_RECIPE = "4"
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = os.environ.get("LLMOP_DEBIAN_MIRROR", "http://deb.debian.org/debian")
STANDIN_PACKAGES = (
    "python3",
    "python3-venv",
    "python3-pip",
    "python-is-python3",
    "ca-certificates",
)
# Debian packages each path needs (installed with apt-get when missing, as root).
BUILDAH_PACKAGES = {"buildah": "buildah", "umoci": "umoci", "debootstrap": "debootstrap"}
IMPORT_PACKAGES = {"ctr": "containerd"}
# Reproducible builds: every timestamp in the images (config, history, file mtimes) is this.
SOURCE_DATE_EPOCH = 0
# Only local transports are trusted: nothing can be pulled behind our back.
POLICY = HERE / "containers" / "policy.json"
# The redis stand-in is made from the Debian packages e2e/redis/redis.sh downloads (the tests'
# redis-server comes from the same ones); its tag is the upstream version they carry.
REDIS_SH = REPO / "e2e" / "redis" / "redis.sh"
REDIS_TAG = "7.0.15"


@dataclass(frozen=True)
class ImageSpec:
    """One image we build: its short name, Dockerfile and the name it is tagged with."""

    name: str
    dockerfile: Path
    repository: str  # without tag
    tag: str
    # Build context: the repository root, or a directory prepared by the builder (pause).
    context: Path = REPO
    # A big image (the CPU engine: ~6 GB of vLLM, torch and its CUDA libraries) is built with
    # buildah's layer cache, so a change to the agent's sources (COPY'd after the pip install)
    # reuses the install layer instead of reinstalling 6 GB, and exported with zstd layers: gzip
    # of gigabytes on one core costs minutes (containerd >= 1.5 unpacks zstd).
    big: bool = False

    @property
    def ref(self) -> str:
        return f"{self.repository}:{self.tag}"


@dataclass(frozen=True)
class StandIn:
    """A base image we can make locally when it cannot be pulled."""

    ref: str  # as written in FROM
    full: str  # the fully qualified name it is stored under
    dockerfile: Path


STANDINS = {
    "python:3.11.11-slim-bookworm": StandIn(
        "python:3.11.11-slim-bookworm",
        "docker.io/library/python:3.11.11-slim-bookworm",
        HERE / "python-standin" / "Dockerfile",
    ),
}


def log(msg: str) -> None:
    print(f"images: {msg}", file=sys.stderr, flush=True)


class ImageError(Exception):
    """A failure with a message meant for the person running the build."""


class SkippedError(Exception):
    """An image that cannot be built on this machine, for a reason that is not an error."""


# ---------------------------------------------------------------------------------------------
# configuration


def project_version() -> str:
    text = (REPO / "pyproject.toml").read_text()
    m = re.search(r'^version = "([^"]+)"', text, re.MULTILINE)
    if not m:
        raise ImageError("cannot read the version from pyproject.toml")
    return m.group(1)


def specs() -> dict[str, ImageSpec]:
    tag = os.environ.get("LLMOP_IMAGE_TAG") or project_version()
    reg = os.environ.get("LLMOP_IMAGE_REGISTRY") or "ghcr.io/llmop"
    out = {
        "operator": ImageSpec("operator", REPO / "operator/Dockerfile", f"{reg}/operator", tag),
        "router": ImageSpec("router", REPO / "router/Dockerfile", f"{reg}/router", tag),
        "engine-sim": ImageSpec(
            "engine-sim", REPO / "engine-image/Dockerfile.sim", f"{reg}/engine-sim", tag
        ),
        "engine": ImageSpec("engine", REPO / "engine-image/Dockerfile", f"{reg}/engine", tag),
        "engine-cpu": ImageSpec(
            "engine-cpu", REPO / "engine-image/Dockerfile.cpu", f"{reg}/engine-cpu", tag, big=True
        ),
        "pause": ImageSpec(
            "pause", HERE / "pause/Dockerfile", "localhost/pause", "3.10", context=HERE / "pause"
        ),
        # A stand-in under the official name: the chart's default Redis image runs offline.
        "redis": ImageSpec(
            "redis",
            HERE / "redis/Dockerfile",
            "docker.io/library/redis",
            REDIS_TAG,
            context=HERE / "redis",
        ),
    }
    # A whole reference per image (make's OPERATOR_IMG etc.) wins over registry + tag.
    for name, spec in list(out.items()):
        ref = os.environ.get("LLMOP_IMG_" + name.upper().replace("-", "_"))
        if ref:
            repo, _, t = ref.rpartition(":")
            if not repo or "/" in t:
                raise ImageError(f"image reference {ref!r} needs an explicit :tag")
            out[name] = ImageSpec(name, spec.dockerfile, repo, t, spec.context, spec.big)
    return out


def cache_root() -> Path:
    base = os.environ.get("LLMOP_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "llmop"
    )
    return Path(base) / "images"


@functools.cache
def storage_driver() -> str:
    """overlay (fast, the default) unless chosen otherwise or impossible: an overlay store cannot
    live on an overlay filesystem (a cache inside a container), vfs (full copies) can."""
    chosen = os.environ.get("LLMOP_STORAGE_DRIVER")
    if chosen:
        return chosen
    d = cache_root()
    while not d.exists():
        d = d.parent
    res = subprocess.run(
        ["stat", "-f", "-c", "%T", str(d)], capture_output=True, text=True, check=False
    )
    if res.returncode == 0 and res.stdout.strip() in ("overlayfs", "overlay"):
        log(f"{d} is on overlayfs: using buildah's vfs storage driver (slower, more disk)")
        return "vfs"
    return "overlay"


# ---------------------------------------------------------------------------------------------
# Dockerfile reading: FROM bases and COPY/ADD sources, for the input key


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue  # comment lines inside a continued instruction are ignored by docker
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        if buf.strip():
            word, _, rest = buf.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
        buf = ""
    if buf.strip():
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def _expand(value: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: args.get(m.group(1), ""), value)


def dockerfile_bases(text: str) -> list[str]:
    """External base images of a Dockerfile (stage names and `scratch` excluded)."""
    args: dict[str, str] = {}
    stages: set[str] = set()
    bases: list[str] = []
    seen_from = False
    for instr, rest in dockerfile_instructions(text):
        if instr == "ARG" and not seen_from:
            name, _, default = rest.partition("=")
            args[name.strip()] = default.strip().strip('"')
        elif instr == "FROM":
            seen_from = True
            words = [w for w in rest.split() if not w.startswith("--")]
            image = _expand(words[0], args)
            stages_to_add = words[2] if len(words) >= 3 and words[1].upper() == "AS" else ""
            if image != "scratch" and image not in stages and image not in bases:
                bases.append(image)
            if stages_to_add:
                stages.add(stages_to_add)
    return bases


def dockerfile_sources(text: str) -> list[str]:
    """Build-context paths (or globs) that COPY/ADD read; `COPY --from=stage` reads none."""
    out: list[str] = []
    for instr, rest in dockerfile_instructions(text):
        if instr not in ("COPY", "ADD"):
            continue
        words = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
        flags = [w for w in words if w.startswith("--")]
        paths = [w for w in words if not w.startswith("--")]
        if any(f.startswith("--from") for f in flags):
            continue
        for src in paths[:-1]:
            if "://" in src:
                raise ImageError(f"ADD from a URL is not reproducible; not supported: {src}")
            out.append(os.path.normpath(src).lstrip("/") if src not in (".", "./") else ".")
    return out


def context_files(context: Path) -> list[str]:
    """Files of a build context, relative paths: git's view (tracked + untracked, not ignored).

    Outside a git work tree (a copy in a test) every file but __pycache__ counts. Inside one, a
    git failure is an error: walking instead would count ignored files and change the key."""
    in_git = any((d / ".git").exists() for d in (context, *context.parents))
    if in_git:
        res = subprocess.run(
            # Only reading: a clone owned by another user (root's, read by a user) is fine.
            [
                "git",
                "-c",
                "safe.directory=*",
                "-C",
                str(context),
                "ls-files",
                "-z",
                "-co",
                "--exclude-standard",
            ],
            capture_output=True,
            check=False,
        )
        if res.returncode != 0:
            raise ImageError(f"git ls-files in {context} failed: {res.stderr.decode().strip()}")
        files = [f for f in res.stdout.decode().split("\0") if f]
    else:
        files = [
            str(p.relative_to(context))
            for p in context.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        ]
    # git also lists files deleted from the work tree but still in the index.
    return sorted(f for f in files if (context / f).is_file())


def matches(path: str, source: str) -> bool:
    if source == ".":
        return True
    return path == source or path.startswith(source + "/") or fnmatch.fnmatch(path, source)


def copied_files(dockerfile_text: str, context: Path) -> list[str]:
    sources = dockerfile_sources(dockerfile_text)
    return [f for f in context_files(context) if any(matches(f, s) for s in sources)]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# buildah plumbing: a private storage and config under the cache, the host's /etc untouched


def buildah_env() -> dict[str, str]:
    env = dict(os.environ)
    env["CONTAINERS_REGISTRIES_CONF"] = str(HERE / "containers/registries.conf")
    # buildah 1.28 has no CONTAINERS_POLICY variable: bud/push get --signature-policy (POLICY).
    env["CONTAINERS_STORAGE_CONF"] = str(storage_conf())
    env["SOURCE_DATE_EPOCH"] = str(SOURCE_DATE_EPOCH)
    env["BUILDAH_ISOLATION"] = "chroot"
    env.pop("REGISTRY_AUTH_FILE", None)
    return env


def storage_conf() -> Path:
    """A storage.conf for our private store (flags alone leave the host's options in force)."""
    root = cache_root()
    path = root / f"storage-{storage_driver()}.conf"
    text = (
        "# Generated by e2e/images/images.py: llmop's private image store.\n"
        "[storage]\n"
        f'driver = "{storage_driver()}"\n'
        f'graphroot = "{root / "storage" / storage_driver()}"\n'
        f'runroot = "{root / "run" / storage_driver()}"\n'
    )
    if not path.is_file() or path.read_text() != text:
        root.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return path


def buildah(*args: str, capture: bool = False) -> str:
    root = cache_root()
    cmd = [
        "buildah",
        "--root",
        str(root / "storage" / storage_driver()),
        "--runroot",
        str(root / "run" / storage_driver()),
        "--storage-driver",
        storage_driver(),
        *args,
    ]
    res = subprocess.run(
        cmd,
        env=buildah_env(),
        # Build logs go to stderr: stdout carries --json results.
        stdout=subprocess.PIPE if capture else sys.stderr,
        stderr=subprocess.PIPE if capture else None,
        text=True,
        check=False,
    )
    if res.returncode != 0:
        detail = (res.stderr or "").strip() if capture else "(see the output above)"
        raise ImageError(f"buildah {' '.join(args[:2])} failed ({res.returncode}): {detail}")
    return res.stdout or ""


def image_in_storage(ref: str) -> dict[str, object] | None:
    """buildah's inspect of an image in our storage, or None when absent."""
    try:
        out = buildah("inspect", "--type", "image", ref, capture=True)
    except ImageError:
        return None
    data: dict[str, object] = json.loads(out)
    return data


def image_labels(info: dict[str, object]) -> dict[str, str]:
    oci = info.get("OCIv1")
    if isinstance(oci, dict):
        cfg = oci.get("config")
        if isinstance(cfg, dict) and isinstance(cfg.get("Labels"), dict):
            return dict(cfg["Labels"])
    return {}


# ---------------------------------------------------------------------------------------------
# tools and privileges


def need_root(what: str) -> None:
    if os.geteuid() != 0:
        raise ImageError(
            f"{what} needs root (chroot builds, debootstrap, containerd's socket); "
            "run as root, e.g. `sudo make images`"
        )


def build_trust_mounts() -> list[str]:
    """RUN steps (pip install) trust what the host trusts: the host's CA bundle is bind-mounted
    over the image's during the build only, so a TLS-intercepting egress proxy works and its CA
    never lands in an image (the mount point exists in the base, nothing is committed there).
    LLMOP_BUILD_CA_BUNDLE names another bundle; `none` turns this off."""
    bundle = os.environ.get("LLMOP_BUILD_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
    if bundle == "none" or not Path(bundle).is_file():
        return []
    return ["--volume", f"{bundle}:/etc/ssl/certs/ca-certificates.crt:ro"]


def ensure_tools(tools: dict[str, str]) -> None:
    missing = sorted({pkg for tool, pkg in tools.items() if shutil.which(tool) is None})
    if not missing:
        return
    if os.geteuid() != 0:
        raise ImageError(
            f"missing tools; install them as root: apt-get install -y {' '.join(missing)}"
        )
    if shutil.which("apt-get") is None:
        raise ImageError(
            f"missing Debian packages {' '.join(missing)} and no apt-get to install them"
        )
    log(f"installing Debian packages: {' '.join(missing)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]
    out = sys.stderr  # stdout carries --json results
    if subprocess.run(cmd, env=env, check=False, stdout=out).returncode != 0:
        # A stale package index is the usual cause on a fresh machine.
        subprocess.run(["apt-get", "update", "-q"], env=env, check=True, stdout=out)
        subprocess.run(cmd, env=env, check=True, stdout=out)


def docker_like_tool() -> str | None:
    """docker/podman when chosen or (docker) when its daemon answers; None: use buildah."""
    tool = os.environ.get("CONTAINER_TOOL", "")
    if tool in ("docker", "podman"):
        if shutil.which(tool) is None:
            raise ImageError(f"CONTAINER_TOOL={tool} but {tool} is not installed")
        return tool
    if tool not in ("", "buildah"):
        raise ImageError(f"CONTAINER_TOOL must be docker, podman or buildah, not {tool!r}")
    if tool == "" and shutil.which("docker"):
        res = subprocess.run(["docker", "info"], capture_output=True, check=False, timeout=20)
        if res.returncode == 0:
            return "docker"
    return None


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """One builder at a time per cache: make and a pytest session may both get here."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# ---------------------------------------------------------------------------------------------
# stand-in bases


def standin_key(s: StandIn) -> str:
    h = hashlib.sha256()
    h.update(
        f"standin={STANDIN_RECIPE} suite={DEBIAN_SUITE} "
        f"pkgs={','.join(STANDIN_PACKAGES)}\n".encode()
    )
    h.update(f"arch={os.uname().machine} timestamp={SOURCE_DATE_EPOCH}\n".encode())
    h.update(s.dockerfile.read_bytes())
    return h.hexdigest()[:16]


def standin_rootfs(dest: Path) -> None:
    """debootstrap a minimal bookworm with Debian's python3, then trim it like a -slim image."""
    rootfs = dest / "rootfs"
    cmd = [
        "debootstrap",
        "--variant=minbase",
        f"--include={','.join(STANDIN_PACKAGES)}",
        DEBIAN_SUITE,
        str(rootfs),
        DEBIAN_MIRROR,
    ]
    log("stand-in: " + " ".join(cmd))
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    # The official python image lets `pip install` write the system site; Debian forbids it.
    for marker in rootfs.glob("usr/lib/python3*/EXTERNALLY-MANAGED"):
        marker.unlink()
    # Where the official image has its python (scripts and venvs may name /usr/local/bin/python3).
    for name in ("python3", "python", "pip3", "pip"):
        link = rootfs / "usr/local/bin" / name
        target = f"/usr/bin/{name}"
        if (rootfs / target.lstrip("/")).exists() and not link.exists():
            link.symlink_to(target)
    # Trim what a slim image does not carry; host files debootstrap copied in; run-time dirs.
    for pattern in (
        "usr/share/doc/*/*",  # all but the copyright files (kept, as in debian -slim)
        "usr/share/man/*",
        "usr/share/info/*",
        "usr/share/lintian/*",
        "usr/share/locale/*",  # translations (32 MB); locale.alias stays, as in debian -slim
        "var/lib/apt/lists/*",
        "var/cache/apt/*",
        "var/cache/debconf/*-old",
        "var/lib/dpkg/*-old",
        "var/log/*",
        "var/cache/ldconfig/aux-cache",  # ldconfig's own cache: differs between two runs
        "dev/*",
        "run/*",
        "tmp/*",
        "proc/*",
        "sys/*",
    ):
        for p in rootfs.glob(pattern):
            if p.name in ("locale.alias", "copyright"):
                continue
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
    # Like debian:bookworm-slim (under the official python image): packages installed later by
    # a Dockerfile leave out docs, man pages and translations too.
    (rootfs / "etc/dpkg/dpkg.cfg.d/llmop-slim").write_text(
        "# LOCAL STAND-IN (llmop): trimmed like debian:bookworm-slim\n"
        "path-exclude /usr/share/doc/*\n"
        "path-include /usr/share/doc/*/copyright\n"
        "path-exclude /usr/share/man/*\n"
        "path-exclude /usr/share/info/*\n"
        "path-exclude /usr/share/locale/*\n"
        "path-include /usr/share/locale/locale.alias\n"
    )
    for name in ("etc/resolv.conf", "etc/hostname", "etc/hosts", "etc/machine-id"):
        p = rootfs / name
        if p.exists() or p.is_symlink():
            p.unlink()
    # Sorted entries, numeric owners, one mtime, no atime/ctime: the tar depends on the tree
    # only (its hash shows up in the image history as `ADD file:<hash>`).
    subprocess.run(
        [
            "tar",
            "-C",
            str(rootfs),
            "--sort=name",
            "--numeric-owner",
            "--xattrs",
            "--format=posix",
            "--pax-option=delete=atime,delete=ctime",
            f"--mtime=@{SOURCE_DATE_EPOCH}",
            "-cf",
            str(dest / "rootfs.tar"),
            ".",
        ],
        check=True,
    )
    shutil.rmtree(rootfs)


def standin_own_name(s: StandIn, key: str) -> str:
    return f"localhost/llmop-stand-in/{s.ref.split(':')[0]}:{s.ref.split(':')[1]}-{key}"


def ensure_standin(s: StandIn) -> str:
    """Make the stand-in base present in our storage under its real name; returns its key."""
    key = standin_key(s)
    info = image_in_storage(s.full)
    if info is not None and image_labels(info).get("dev.llmop.stand-in.key") == key:
        return key
    # Every stand-in also keeps a name of its own, so two checkouts with different recipes
    # sharing this cache (a branch and main) only move the real name back and forth (called
    # under the build lock: the name is right for the whole build that follows).
    own = standin_own_name(s, key)
    if image_in_storage(own) is not None:
        buildah("tag", own, s.full, capture=True)
        # buildah records an image's first name as the org.opencontainers.image.base.name
        # annotation of images built on it: put the real name first again (drop the own name,
        # add it back) so the digest of what we build does not depend on this retag.
        buildah("rmi", own, capture=True)
        buildah("tag", s.full, own, capture=True)
        log(f"stand-in for {s.ref}: {own}")
        return key
    need_root("building the base-image stand-in")
    ensure_tools(BUILDAH_PACKAGES)
    start = time.monotonic()
    work = cache_root() / "standin" / f"{s.ref.replace(':', '-').replace('/', '_')}-{key}"
    cached = (work / ".complete").is_file()
    log(f"stand-in for {s.ref}: building" + ("" if cached else " (debootstrap: 2-4 min)"))
    stage = work.with_name(work.name + ".partial")
    if not (work / ".complete").is_file():
        shutil.rmtree(stage, ignore_errors=True)
        stage.mkdir(parents=True)
        standin_rootfs(stage)
        shutil.rmtree(work, ignore_errors=True)
        stage.rename(work)
        (work / ".complete").write_text(f"{time.time()}\n")
    shutil.copyfile(s.dockerfile, work / "Dockerfile")
    buildah(
        "bud",
        f"--signature-policy={POLICY}",
        "--isolation=chroot",
        "--pull=never",
        "--layers=false",
        "--force-rm",  # no leftover working containers after a failed build
        "--identity-label=false",
        "--format=oci",
        f"--timestamp={SOURCE_DATE_EPOCH}",
        "--label",
        f"dev.llmop.stand-in.key={key}",
        "--annotation",
        "org.opencontainers.image.description="
        f"LOCAL STAND-IN for {s.ref} (Debian python3, debootstrap)",
        "-f",
        str(work / "Dockerfile"),
        "-t",
        s.full,
        "-t",
        own,
        str(work),
    )
    log(f"stand-in for {s.ref}: built in {time.monotonic() - start:.0f}s (key {key})")
    return key


# ---------------------------------------------------------------------------------------------
# input keys


def base_key(base: str, resolve: bool) -> str:
    """What a base contributes to the key: a stand-in's recipe key, or a stored image's id."""
    if base in STANDINS:
        return f"standin:{standin_key(STANDINS[base])}"
    if not resolve:
        return f"external:{base}"
    info = image_in_storage(base)
    if info is None:
        raise SkippedError(
            f"base image {base} is not in local storage and cannot be pulled or made here "
            "(with docker, `make images` builds it; or copy the base into the store: "
            "docs/images.md)"
        )
    return f"external:{base}@{info.get('FromImageID', '')}"


def go_version() -> str:
    if shutil.which("go") is None:
        raise ImageError("the pause image is compiled from e2e/images/pause: it needs Go on PATH")
    return subprocess.run(
        ["go", "env", "GOVERSION"], check=True, capture_output=True, text=True
    ).stdout.strip()


@functools.cache
def redis_context_files() -> dict[str, Path]:
    """The redis stand-in's build context, by name in the context: its entrypoint and the Debian
    packages e2e/redis/redis.sh downloads into the cache (a few seconds when not there yet)."""
    res = subprocess.run([str(REDIS_SH), "ensure"], stdout=subprocess.PIPE, text=True, check=False)
    lines = res.stdout.strip().splitlines()
    if res.returncode != 0 or not lines:
        raise ImageError(f"{REDIS_SH.relative_to(REPO)} ensure failed (see its output above)")
    debs = Path(lines[-1]).parent.parent / "debs"
    files = {"docker-entrypoint.sh": HERE / "redis" / "docker-entrypoint.sh"}
    files |= {f"debs/{deb.name}": deb for deb in sorted(debs.glob("*.deb"))}
    # redis-server_<epoch>%3a<upstream>-<debian revision>_<arch>.deb
    versions = {
        re.sub(r"^(\d+%3a)?([^-]+)-.*", r"\2", d.name.split("_")[1])
        for d in debs.glob("redis-server_*.deb")
    }
    if versions != {REDIS_TAG}:
        raise ImageError(
            f"Debian's redis-server is {', '.join(sorted(versions)) or 'missing'} in {debs}, the "
            f"image is tagged {REDIS_TAG}: change REDIS_TAG here and the chart's Redis image"
        )
    return files


def input_key(spec: ImageSpec, resolve: bool = True) -> tuple[str, list[str]]:
    """Hash of everything the image is made of: the Dockerfile, the context files its COPY/ADD
    read, its bases' keys, the tag and this builder's recipe. Returns (key, bases)."""
    if not spec.dockerfile.is_file():
        raise SkippedError(f"{spec.dockerfile.relative_to(REPO)} does not exist (yet)")
    text = spec.dockerfile.read_text()
    bases = dockerfile_bases(text)
    h = hashlib.sha256()
    h.update(f"recipe={RECIPE} ref={spec.ref} arch={os.uname().machine}\n".encode())
    h.update(b"dockerfile\0" + text.encode() + b"\0")
    if spec.big:  # how it is built and exported (see ImageSpec.big); other keys stay as they were
        h.update(b"big: layer cache, zstd export\n")
    for b in bases:
        h.update(f"base {b} {base_key(b, resolve)}\n".encode())
    if spec.name == "pause":
        # The context is the compiled binary: key on its sources and the compiler instead.
        h.update(f"go={go_version()}\n".encode())
        for f in ("go.mod", "main.go"):
            h.update(f"{f} {sha256_file(spec.context / f)}\n".encode())
    elif spec.name == "redis":
        # The context is prepared (the packages live in the cache): key on what goes into it.
        for name, path in sorted(redis_context_files().items()):
            h.update(f"{name} {sha256_file(path)}\n".encode())
    else:
        for f in copied_files(text, spec.context):
            h.update(f"{f} {sha256_file(spec.context / f)}\n".encode())
    return h.hexdigest()[:16], bases


# ---------------------------------------------------------------------------------------------
# building and exporting


def entry_dir(spec: ImageSpec, key: str) -> Path:
    return cache_root() / "oci" / f"{spec.name}-{spec.tag}-{key}"


def read_entry(d: Path) -> dict[str, str]:
    meta: dict[str, str] = json.loads((d / "image.json").read_text())
    return meta


def prepare_context(spec: ImageSpec, stage: Path) -> Path:
    """The build context buildah sees: exactly the files the key covers, nothing else."""
    ctx = stage / "context"
    ctx.mkdir()
    if spec.name == "pause":
        env = dict(os.environ, CGO_ENABLED="0", GOTOOLCHAIN="local", GOFLAGS="-buildvcs=false")
        subprocess.run(
            [
                "go",
                "build",
                "-trimpath",
                "-ldflags",
                "-s -w -buildid=",
                "-o",
                str(ctx / "pause"),
                ".",
            ],
            cwd=spec.context,
            env=env,
            check=True,
        )
        return ctx
    sources = (
        redis_context_files()
        if spec.name == "redis"
        else {f: spec.context / f for f in copied_files(spec.dockerfile.read_text(), spec.context)}
    )
    for f, src in sources.items():
        dst = ctx / f
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
        # COPY keeps mtimes, and .pyc files written at build time record them: pin them so the
        # image does not depend on when the clone was checked out.
        os.utime(dst, (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH))
    return ctx


def source_date_epoch_arg(spec: ImageSpec) -> list[str]:
    """--build-arg SOURCE_DATE_EPOCH for Dockerfiles that declare `ARG SOURCE_DATE_EPOCH`.

    RUN steps then see it: pip writes hash-based .pyc files instead of ones stamped with the
    time the wheel was unpacked, useradd stamps /etc/shadow with it. buildah 1.28 has no other
    way to give RUN steps a variable (its --env only edits the final config). A Dockerfile
    without the ARG builds the same, only less reproducibly (reported by `--rebuild`)."""
    declared = any(
        instr == "ARG" and rest.split("=")[0].strip() == "SOURCE_DATE_EPOCH"
        for instr, rest in dockerfile_instructions(spec.dockerfile.read_text())
    )
    return ["--build-arg", f"SOURCE_DATE_EPOCH={SOURCE_DATE_EPOCH}"] if declared else []


def write_archive(layout: Path, archive: Path | IO[bytes], ref: str) -> None:
    """An OCI archive (tar of the layout) whose index names the image for `ctr images import`:
    containerd reads io.containerd.image.name before org.opencontainers.image.ref.name."""
    index = json.loads((layout / "index.json").read_text())
    for m in index.get("manifests", []):
        m.setdefault("annotations", {})["io.containerd.image.name"] = ref
    data = (json.dumps(index, separators=(",", ":"), sort_keys=True) + "\n").encode()

    def add_bytes(tf: tarfile.TarFile, name: str, payload: bytes) -> None:
        ti = tarfile.TarInfo(name)
        ti.size = len(payload)
        ti.mtime = SOURCE_DATE_EPOCH
        ti.mode = 0o644
        tf.addfile(ti, io.BytesIO(payload))

    def normalise(ti: tarfile.TarInfo) -> tarfile.TarInfo:
        ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname = SOURCE_DATE_EPOCH, 0, 0, "", ""
        ti.mode = 0o644
        return ti

    with contextlib.ExitStack() as stack:
        out = stack.enter_context(archive.open("wb")) if isinstance(archive, Path) else archive
        # Stream mode (no seeking): the same code writes a file or ctr's stdin.
        tf = stack.enter_context(tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT))
        add_bytes(tf, "oci-layout", (layout / "oci-layout").read_bytes())
        add_bytes(tf, "index.json", data)
        for blob in sorted((layout / "blobs").rglob("*")):
            if blob.is_file():  # streamed: layers of the vLLM images are gigabytes
                tf.add(blob, arcname=str(blob.relative_to(layout)), filter=normalise)


def manifest_digest(layout: Path) -> str:
    index = json.loads((layout / "index.json").read_text())
    digest: str = index["manifests"][0]["digest"]
    return digest


def build_buildah(spec: ImageSpec, rebuild: bool = False) -> dict[str, str]:
    key, bases = input_key(spec, resolve=False)  # cheap: no buildah call on a cache hit
    d = entry_dir(spec, key)
    if rebuild:
        (d / ".complete").unlink(missing_ok=True)
    if (d / ".complete").is_file() and all(b in STANDINS for b in bases):
        return read_entry(d)
    need_root(f"building image {spec.name}")
    ensure_tools(BUILDAH_PACKAGES)
    with locked(cache_root() / ".build.lock"):
        for b in bases:
            if b in STANDINS:
                ensure_standin(STANDINS[b])
        key, bases = input_key(spec, resolve=True)
        d = entry_dir(spec, key)
        if (d / ".complete").is_file():
            return read_entry(d)
        stage = d.with_name(d.name + ".partial")
        shutil.rmtree(stage, ignore_errors=True)
        stage.mkdir(parents=True)
        start = time.monotonic()
        log(
            f"{spec.name}: building {spec.ref} from {spec.dockerfile.relative_to(REPO)} (key {key})"
        )
        ctx = prepare_context(spec, stage)
        buildah(
            "bud",
            "--isolation=chroot",
            "--pull=never",
            # A cached step is reused only when its instruction, its parent and (COPY) the
            # files' content are the same: what the input key covers, step by step.
            f"--layers={'true' if spec.big else 'false'}",
            "--force-rm",  # no leftover working containers after a failed build
            "--identity-label=false",
            "--format=oci",
            f"--timestamp={SOURCE_DATE_EPOCH}",
            "--label",
            f"dev.llmop.input-key={key}",
            *build_trust_mounts(),
            *source_date_epoch_arg(spec),
            "-f",
            str(spec.dockerfile),
            "-t",
            spec.ref,
            str(ctx),
        )
        built = time.monotonic()
        layout = stage / "oci"
        buildah(
            "push",
            f"--signature-policy={POLICY}",
            "--quiet",
            # zstd, not gzip, for the big image: gzip of gigabytes on one core took 313 s
            # (buildah 1.28 ignores --disable-compression for an oci: destination).
            *(["--compression-format", "zstd"] if spec.big else []),
            spec.ref,
            f"oci:{layout}:{spec.tag}",
        )
        shutil.rmtree(ctx)
        meta = {
            "name": spec.name,
            "ref": spec.ref,
            "key": key,
            "digest": manifest_digest(layout),
            "layout": str(d / "oci"),
            "layout_ref": spec.tag,
            "size_bytes": str(sum(f.stat().st_size for f in layout.rglob("*") if f.is_file())),
            "build_seconds": f"{built - start:.1f}",
            "export_seconds": f"{time.monotonic() - built:.1f}",
            "bases": " ".join(bases),
        }
        (stage / "image.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        shutil.rmtree(d, ignore_errors=True)
        stage.rename(d)
        (d / ".complete").write_text(f"{time.time()}\n")
        # A big image's entries are gigabytes each: keep the newest only.
        prune(spec, keep=d, entries=1 if spec.big else 3)
        log(
            f"{spec.name}: {spec.ref} {meta['digest'][:19]} built in {meta['build_seconds']}s, "
            f"exported in {meta['export_seconds']}s, {int(meta['size_bytes']) >> 20} MiB"
        )
        return meta


def prune(spec: ImageSpec, keep: Path, entries: int = 3) -> None:
    """Bound the cache: keep the newest few entries of this image (switching branches back and
    forth stays a cache hit) and drop images in our store that lost their tag to a rebuild."""
    mine = sorted(
        # name-tag-key: `engine-*` alone would also match engine-cpu's and engine-sim's entries.
        (p for p in keep.parent.glob(f"{spec.name}-{spec.tag}-*") if (p / ".complete").is_file()),
        key=lambda p: (p / ".complete").stat().st_mtime,
        reverse=True,
    )
    for old in [p for p in mine if p != keep][entries - 1 :]:
        shutil.rmtree(old, ignore_errors=True)
    with contextlib.suppress(ImageError):
        buildah("rmi", "--prune", capture=True)


def build_docker(tool: str, spec: ImageSpec) -> dict[str, str]:
    if not spec.dockerfile.is_file():
        raise SkippedError(f"{spec.dockerfile.relative_to(REPO)} does not exist (yet)")
    with tempfile.TemporaryDirectory() as tmp:
        ctx = spec.context
        if spec.name in ("pause", "redis"):
            ctx = prepare_context(spec, Path(tmp))
        subprocess.run(
            [tool, "build", "-f", str(spec.dockerfile), "-t", spec.ref, str(ctx)],
            check=True,
            stdout=sys.stderr,
        )
    return {"name": spec.name, "ref": spec.ref, "tool": tool}


def build(
    names: list[str], rebuild: bool = False
) -> tuple[list[dict[str, str]], list[tuple[str, str]]]:
    all_specs = specs()
    tool = docker_like_tool()
    done: list[dict[str, str]] = []
    skipped: list[tuple[str, str]] = []
    for name in names:
        spec = all_specs[name]
        t0 = time.monotonic()
        try:
            meta = build_docker(tool, spec) if tool else build_buildah(spec, rebuild)
        except SkippedError as e:
            log(f"{name}: SKIPPED: {e}")
            skipped.append((name, str(e)))
            continue
        log(f"{name}: {meta['ref']} ready ({time.monotonic() - t0:.2f}s)")
        done.append(meta)
    return done, skipped


# ---------------------------------------------------------------------------------------------
# import into containerd


def ctr(address: str, *args: str) -> str:
    res = subprocess.run(
        ["ctr", "--address", address, "--namespace", "k8s.io", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    if res.returncode != 0:
        raise ImageError(f"ctr {' '.join(args[:2])} failed: {res.stderr.strip()}")
    return res.stdout


def containerd_digest(address: str, ref: str) -> str | None:
    out = ctr(address, "images", "ls", f"name=={ref}")
    for line in out.splitlines()[1:]:
        fields = line.split()
        if fields and fields[0] == ref:
            for f in fields:
                if f.startswith("sha256:"):
                    return f
    return None


def import_images(address: str, metas: list[dict[str, str]]) -> None:
    need_root("importing into containerd")
    ensure_tools(IMPORT_PACKAGES)
    if not Path(address).exists():
        raise ImageError(f"no containerd socket at {address} (is the node's containerd running?)")
    for meta in metas:
        if "layout" not in meta:
            raise ImageError(
                f"{meta['ref']} was built by {meta.get('tool')}, not into the OCI cache; "
                f"import it with `{meta.get('tool')} save {meta['ref']} | ctr ... images import -`"
            )
        have = containerd_digest(address, meta["ref"])
        if have == meta["digest"]:
            log(f"import: {meta['ref']} already present ({have[:19]})")
            continue
        t0 = time.monotonic()
        proc = subprocess.Popen(
            ["ctr", "--address", address, "--namespace", "k8s.io", "images", "import", "-"],
            stdin=subprocess.PIPE,
            stdout=sys.stderr,
        )
        assert proc.stdin is not None
        try:
            write_archive(Path(meta["layout"]), proc.stdin, meta["ref"])
        except BrokenPipeError:
            pass  # ctr gave up; its exit status and message follow
        finally:
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.close()
        if proc.wait() != 0:
            raise ImageError(f"ctr images import of {meta['ref']} failed (see above)")
        got = containerd_digest(address, meta["ref"])
        if got != meta["digest"]:
            raise ImageError(f"import left {meta['ref']} at {got}, expected {meta['digest']}")
        log(f"import: {meta['ref']} {got[:19]} imported in {time.monotonic() - t0:.1f}s")


# ---------------------------------------------------------------------------------------------
# command line


def expand_names(names: list[str]) -> list[str]:
    known = list(specs())
    out: list[str] = []
    for n in names:
        if n == "all":
            out += [k for k in known if k not in out]
        elif n in known:
            if n not in out:
                out.append(n)
        else:
            raise ImageError(f"unknown image {n!r}; known: {', '.join(known)} (or all)")
    return out


def main(argv: list[str] | None = None) -> int:  # noqa: C901
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build or reuse images")
    b.add_argument("--json", action="store_true", help="print one JSON object per built image")
    b.add_argument(
        "--rebuild",
        action="store_true",
        help="build again even on a cache hit (not the stand-in base): checks reproducibility",
    )
    b.add_argument("names", nargs="+")
    i = sub.add_parser("import", help="build or reuse, then import into containerd")
    i.add_argument("--address", required=True, help="containerd socket path")
    i.add_argument("names", nargs="+")
    k = sub.add_parser("key", help="print an image's input key")
    k.add_argument("name")
    ar = sub.add_parser("archive", help="build or reuse, then write an OCI archive (one image)")
    ar.add_argument("--out", required=True, type=Path, help="the .tar to write")
    ar.add_argument("name")
    a = p.parse_args(argv)
    try:
        if a.cmd == "key":
            spec = specs()[expand_names([a.name])[0]]
            print(input_key(spec, resolve=True)[0])
            return 0
        if a.cmd == "archive":
            (name,) = expand_names([a.name])
            done, skipped = build([name])
            if skipped or "layout" not in done[0]:
                raise ImageError(f"{name}: no OCI layout to archive (skipped, or built by docker)")
            write_archive(Path(done[0]["layout"]), a.out, done[0]["ref"])
            print(a.out)
            return 0
        names = expand_names(a.names)
        done, skipped = build(names, rebuild=a.cmd == "build" and a.rebuild)
        if a.cmd == "import":
            # `all` means what can be built here; an image named on its own must be imported.
            named = [n for n, _ in skipped if n in a.names]
            if named:
                raise ImageError(f"cannot import {', '.join(named)}: it could not be built here")
            import_images(a.address, done)
        elif a.json:
            for meta in done:
                print(json.dumps(meta, sort_keys=True))
        for name, why in skipped:
            print(f"images: skipped {name}: {why}", file=sys.stderr)
        return 0
    except ImageError as e:
        log(f"ERROR: {e}")
        return 1
    except subprocess.CalledProcessError as e:
        log(f"ERROR: {shlex.join(str(x) for x in e.cmd)} exited {e.returncode}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
