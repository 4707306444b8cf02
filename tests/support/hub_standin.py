"""A local stand-in for the Hugging Face Hub's HTTP API, for tests without the internet.

It speaks the part of the Hub protocol that `huggingface_hub` (2.x) uses to resolve, check and
download a model, checked against that library's source (`hf_api.py`, `file_download.py`,
`utils/_http.py`), not guessed:

- `GET /api/models/{repo}` and `/api/models/{repo}/revision/{rev}` → model info: `id`, `sha` (the
  resolved commit), `gated`, `siblings` (`rfilename`; with `?blobs=true` also `size`, `blobId`,
  `lfs` {`sha256`, `size`, `pointerSize`}) — `HfApi.model_info(files_metadata=True)`.
- `GET /api/models/{repo}/tree/{rev}[/{path}]?recursive=…` → `[{type, oid, size, path, lfs}]`
  (`HfApi.list_repo_tree`, which `snapshot_download` calls; one page, so no `Link` header).
- `HEAD|GET /{repo}/resolve/{rev}/{file}` → the bytes, with `X-Repo-Commit`, `ETag` (git blob
  sha1, or the sha256 for LFS files), `X-Linked-Etag` + `X-Linked-Size` for LFS files,
  `Content-Length`, `Accept-Ranges: bytes`; `Range: bytes=N-` → 206 + `Content-Range` (how
  `http_get` resumes after a dropped connection).
- Errors carry `X-Error-Code` / `X-Error-Message`, which `hf_raise_for_status` maps to the
  library's own exceptions: unknown repo → 404 `RepoNotFound` (`RepositoryNotFoundError`),
  unknown revision → 404 `RevisionNotFound`, unknown file → 404 `EntryNotFound`, a gated repo's
  files without a token → 401 `GatedRepo` and with a token lacking access → 403 `GatedRepo`
  (`GatedRepoError`); an unknown token → 401 "Invalid credentials in Authorization header". As on
  the real Hub, a gated repo's metadata (info, tree) is public; only its files are gated.

A LoRA adapter repo is a repo like any other (`synthetic_adapter` makes one's files:
`adapter_config.json` + `adapter_model.safetensors`), which is what the operator's adapter
pre-flight (`hub.adapter_probe`: info, then a GET of `adapter_config.json`) and the engine agent's
adapter fetch read.

Knobs for tests: `rate_bytes_per_s` throttles file bodies (so a test can kill a download midway),
`cut_after_bytes` drops the connection once per file after that many body bytes (so the client's
own Range resume is exercised), and `requests` logs every request (method, path, Range).

Run in-process (`HubStandin(...).start()`) or as a process:
`python tests/support/hub_standin.py --port 0 --repo org/name=DIR [--gated org/name] …` prints
`listening on http://127.0.0.1:PORT` once it serves.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import random
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

LFS_THRESHOLD = 1 << 20
"""Files this large (or any *.safetensors / *.bin) are "LFS" files, as on the Hub."""
LFS_POINTER_SIZE = 134
CHUNK = 64 * 1024


def _truthy(query: dict[str, list[str]], name: str) -> bool:
    return query.get(name, [""])[-1].lower() in {"true", "1"}


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


@dataclass(frozen=True)
class HubFile:
    path: str
    source: Path
    size: int
    blob_id: str
    sha256: str | None  # set for LFS files

    @property
    def etag(self) -> str:
        return self.sha256 or self.blob_id


def _hub_file(rel: str, source: Path) -> HubFile:
    data = source.read_bytes()
    lfs = len(data) >= LFS_THRESHOLD or rel.endswith((".safetensors", ".bin"))
    return HubFile(
        path=rel,
        source=source,
        size=len(data),
        blob_id=git_blob_sha1(data),
        sha256=hashlib.sha256(data).hexdigest() if lfs else None,
    )


@dataclass
class HubRepo:
    """One model repository: one commit of a directory's files, reachable by sha or branch."""

    repo_id: str
    directory: Path
    gated: bool = False
    allowed_tokens: frozenset[str] = frozenset()
    branches: tuple[str, ...] = ("main",)
    files: dict[str, HubFile] = field(default_factory=dict)
    sha: str = ""

    def __post_init__(self) -> None:
        for path in sorted(p for p in self.directory.rglob("*") if p.is_file()):
            rel = path.relative_to(self.directory).as_posix()
            self.files[rel] = _hub_file(rel, path)
        listing = "".join(f"{f.path}\0{f.etag}\n" for f in self.files.values())
        self.sha = hashlib.sha1(
            f"{self.repo_id}\n{listing}".encode(), usedforsecurity=False
        ).hexdigest()

    def resolve(self, revision: str) -> str | None:
        if revision == self.sha or revision in self.branches:
            return self.sha
        return None

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files.values())


@dataclass(frozen=True)
class Logged:
    method: str
    path: str
    range: str | None
    status: int


class HubStandin:
    """The stand-in server: `start()` serves on a thread, `url` is the `HF_ENDPOINT`."""

    def __init__(
        self,
        repos: list[HubRepo],
        *,
        tokens: frozenset[str] = frozenset(),
        rate_bytes_per_s: float | None = None,
        cut_after_bytes: int | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.repos = {r.repo_id: r for r in repos}
        self.tokens = tokens | frozenset(t for r in repos for t in r.allowed_tokens)
        self.rate_bytes_per_s = rate_bytes_per_s
        self.cut_after_bytes = cut_after_bytes
        self.requests: list[Logged] = []
        self._cut_done: set[str] = set()
        self._lock = threading.Lock()
        standin = self

        class Handler(_Handler):
            hub = standin

        self.server = _Server((host, port), Handler)
        self.server.daemon_threads = True
        self._thread: threading.Thread | None = None

    def add(self, repo: HubRepo) -> None:
        """Serve one more repository (a test that makes its model after the stand-in started)."""
        with self._lock:
            self.repos = {**self.repos, repo.repo_id: repo}
            self.tokens = self.tokens | repo.allowed_tokens

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> HubStandin:
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop as an outage does: the port refuses, and the keep-alive connections clients
        hold close too (a stopped server's handler threads would go on answering on them)."""
        self.server.shutdown()
        self.server.server_close()
        self.server.close_connections()

    def __enter__(self) -> HubStandin:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log(self, entry: Logged) -> None:
        with self._lock:
            self.requests.append(entry)

    def take_cut(self, key: str) -> bool:
        """True once per file when a connection cut is configured (then the file flows)."""
        with self._lock:
            if self.cut_after_bytes is None or key in self._cut_done:
                return False
            self._cut_done.add(key)
            return True

    def downloads(self, file: str) -> list[Logged]:
        """GET requests that fetched `file`'s bytes (any repo, any revision)."""
        return [r for r in self.requests if r.method == "GET" and r.path.endswith("/" + file)]


class _Server(ThreadingHTTPServer):
    """Keeps its open client connections, so that stopping can close them."""

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(address, handler)
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()

    def get_request(self) -> tuple[socket.socket, Any]:
        connection, address = super().get_request()
        with self._open_lock:
            self._open.add(connection)
        return connection, address

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        with self._open_lock:
            connections, self._open = list(self._open), set()
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
            connection.close()


class _Handler(BaseHTTPRequestHandler):
    hub: HubStandin
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        return  # the request log is `HubStandin.requests`; stderr noise helps nobody

    # -- plumbing ---------------------------------------------------------------------------

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self.hub.log(Logged(self.command, self.path, self.headers.get("Range"), status))

    def _json(self, status: int, value: object, headers: dict[str, str] | None = None) -> None:
        self._send(
            status,
            json.dumps(value).encode(),
            {"Content-Type": "application/json", **(headers or {})},
        )

    def _error(self, status: int, code: str | None, message: str) -> None:
        headers = {"X-Error-Message": message}
        if code is not None:
            headers["X-Error-Code"] = code
        self._json(status, {"error": message}, headers)

    def _token(self) -> str | None:
        auth = self.headers.get("Authorization", "")
        return auth[len("Bearer ") :] if auth.startswith("Bearer ") else None

    def _split_repo(self, rest: str) -> tuple[HubRepo, str] | None:
        """The repo a path starts with (ids hold a slash, so match known ids) and the rest."""
        for repo_id, repo in self.hub.repos.items():
            if rest == repo_id or rest.startswith(repo_id + "/"):
                return repo, rest[len(repo_id) + 1 :]
        return None

    # -- routes -----------------------------------------------------------------------------

    def do_HEAD(self) -> None:
        self._route()

    def do_GET(self) -> None:
        self._route()

    def _route(self) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        token = self._token()
        if token is not None and token not in self.hub.tokens:
            self._error(401, None, "Invalid credentials in Authorization header")
            return
        if url.path.startswith("/api/models/"):
            self._api(url.path[len("/api/models/") :], query)
            return
        found = self._split_repo(url.path.lstrip("/"))
        if found is None:
            self._error(404, "RepoNotFound", "Repository not found")
            return
        repo, rest = found
        if not rest.startswith("resolve/"):
            self._error(404, None, "Not found")
            return
        revision, _, filename = rest[len("resolve/") :].partition("/")
        self._resolve(repo, unquote(revision), unquote(filename), token)

    def _api(self, rest: str, query: dict[str, list[str]]) -> None:
        found = self._split_repo(rest)
        if found is None:
            self._error(404, "RepoNotFound", "Repository not found")
            return
        repo, tail = found
        if tail == "" or tail.startswith("revision/"):
            revision = unquote(tail[len("revision/") :]) if tail else "main"
            sha = repo.resolve(revision)
            if sha is None:
                self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
                return
            self._json(200, self._info(repo, blobs=_truthy(query, "blobs")))
        elif tail.startswith("tree/"):
            revision, _, sub = tail[len("tree/") :].partition("/")
            sha = repo.resolve(unquote(revision))
            if sha is None:
                self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
                return
            self._json(200, self._tree(repo, unquote(sub), _truthy(query, "recursive")))
        else:
            self._error(404, None, "Not found")

    def _info(self, repo: HubRepo, *, blobs: bool) -> dict[str, object]:
        siblings: list[dict[str, object]] = []
        for f in repo.files.values():
            sibling: dict[str, object] = {"rfilename": f.path}
            if blobs:
                sibling |= {"size": f.size, "blobId": f.blob_id}
                if f.sha256 is not None:
                    sibling["lfs"] = {
                        "sha256": f.sha256,
                        "size": f.size,
                        "pointerSize": LFS_POINTER_SIZE,
                    }
            siblings.append(sibling)
        return {
            "_id": repo.sha[:24],
            "id": repo.repo_id,
            "modelId": repo.repo_id,
            "sha": repo.sha,
            "private": False,
            "disabled": False,
            "gated": "manual" if repo.gated else False,
            "tags": [],
            "siblings": siblings,
            "lastModified": "2026-01-01T00:00:00.000Z",
        }

    def _tree(self, repo: HubRepo, sub: str, recursive: bool) -> list[dict[str, object]]:
        prefix = f"{sub.strip('/')}/" if sub.strip("/") else ""
        entries: list[dict[str, object]] = []
        dirs: set[str] = set()
        for f in repo.files.values():
            if not f.path.startswith(prefix):
                continue
            inner = f.path[len(prefix) :]
            if "/" in inner:
                top = prefix + inner.split("/")[0]
                if top not in dirs:
                    dirs.add(top)
                    entries.append({"type": "directory", "oid": repo.sha, "path": top})
                if not recursive:
                    continue
            entry: dict[str, object] = {
                "type": "file",
                "oid": f.blob_id,
                "size": f.size,
                "path": f.path,
            }
            if f.sha256 is not None:
                entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": LFS_POINTER_SIZE}
            entries.append(entry)
        return entries

    def _resolve(self, repo: HubRepo, revision: str, filename: str, token: str | None) -> None:
        sha = repo.resolve(revision)
        if sha is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return
        if repo.gated and token is None:
            self._error(
                401,
                "GatedRepo",
                f"Access to model {repo.repo_id} is restricted. You must have access to it and "
                "be authenticated to access it. Please log in.",
            )
            return
        if repo.gated and token not in repo.allowed_tokens:
            self._error(
                403,
                "GatedRepo",
                f"Access to model {repo.repo_id} is restricted and you are not in the "
                "authorized list.",
            )
            return
        hub_file = repo.files.get(filename)
        if hub_file is None:
            self._error(404, "EntryNotFound", f"{filename} does not exist on {revision}")
            return
        headers = {
            "X-Repo-Commit": sha,
            "ETag": f'"{hub_file.etag}"',
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        if hub_file.sha256 is not None:
            headers["X-Linked-Etag"] = f'"{hub_file.sha256}"'
            headers["X-Linked-Size"] = str(hub_file.size)
        start = 0
        range_header = self.headers.get("Range")
        status = 200
        if range_header and range_header.startswith("bytes="):
            first, _, last = range_header[len("bytes=") :].partition("-")
            start = int(first or 0)
            if last:  # a bounded range: the client never asks for one, refuse loudly
                self._error(416, None, "bounded ranges are not supported by the stand-in")
                return
            if start >= hub_file.size:
                self._send(416, b"", {"Content-Range": f"bytes */{hub_file.size}"})
                return
            status = 206
            headers["Content-Range"] = f"bytes {start}-{hub_file.size - 1}/{hub_file.size}"
        self._stream(hub_file, start, status, headers, key=f"{repo.repo_id}/{filename}")

    def _stream(
        self, hub_file: HubFile, start: int, status: int, headers: dict[str, str], key: str
    ) -> None:
        length = hub_file.size - start
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(length))
        self.end_headers()
        self.hub.log(Logged(self.command, self.path, self.headers.get("Range"), status))
        if self.command == "HEAD":
            return
        cut = self.hub.cut_after_bytes if self.hub.take_cut(key) else None
        rate = self.hub.rate_bytes_per_s
        began = time.monotonic()
        sent = 0
        with hub_file.source.open("rb") as source:
            source.seek(start)
            while sent < length:
                chunk = source.read(min(CHUNK, length - sent))
                if not chunk:
                    break
                if cut is not None and sent + len(chunk) > cut:
                    self.wfile.write(chunk[: max(cut - sent, 0)])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)  # a dropped connection, mid-body
                    return
                self.wfile.write(chunk)
                sent += len(chunk)
                if rate:
                    ahead = sent / rate - (time.monotonic() - began)
                    if ahead > 0:
                        time.sleep(ahead)


def synthetic_model(directory: Path, weights_bytes: int, shards: int = 1, seed: int = 0) -> Path:
    """A model-shaped directory (config, tokenizer files, `shards` weight files of random bytes
    totalling `weights_bytes`) for download tests that need size, not a loadable model."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"})
    )
    (directory / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 2048}))
    rng = random.Random(seed)
    per = weights_bytes // shards
    for i in range(shards):
        name = (
            "model.safetensors" if shards == 1 else f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        )
        with (directory / name).open("wb") as out:
            left = per
            while left:
                n = min(left, 1 << 20)
                out.write(rng.randbytes(n))
                left -= n
    return directory


def synthetic_adapter(
    directory: Path, *, r: int = 8, weights_bytes: int = 4096, seed: int = 0, **config: object
) -> Path:
    """A LoRA-adapter-shaped directory, as PEFT saves one: `adapter_config.json` (PEFT's keys
    for a plain LoRA of rank `r` on a llama-style base; `config` overrides or adds keys, e.g.
    `use_dora=True`) and `adapter_model.safetensors` of `weights_bytes` random bytes. An adapter
    repo is served like any other (`HubRepo(repo_id, directory)`): gated, missing revisions and
    missing repos behave as for a model."""
    directory.mkdir(parents=True, exist_ok=True)
    doc: dict[str, object] = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": "acme/llama",
        "r": r,
        "lora_alpha": 2 * r,
        "lora_dropout": 0.0,
        "target_modules": ["q_proj", "v_proj"],
        "bias": "none",
        "use_dora": False,
        "modules_to_save": None,
    }
    (directory / "adapter_config.json").write_text(json.dumps(doc | config))
    rng = random.Random(seed)
    (directory / "adapter_model.safetensors").write_bytes(rng.randbytes(weights_bytes))
    return directory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--repo", action="append", default=[], help="ORG/NAME=DIRECTORY")
    parser.add_argument("--gated", action="append", default=[], help="repo id that is gated")
    parser.add_argument("--grant", action="append", default=[], help="ORG/NAME=TOKEN access")
    parser.add_argument("--token", action="append", default=[], help="a known token")
    parser.add_argument("--rate", type=float, default=None, help="bytes/s per file body")
    args = parser.parse_args(argv)
    grants: dict[str, set[str]] = {}
    for grant in args.grant:
        repo_id, _, token = grant.partition("=")
        grants.setdefault(repo_id, set()).add(token)
    repos = []
    for spec in args.repo:
        repo_id, _, directory = spec.partition("=")
        repos.append(
            HubRepo(
                repo_id,
                Path(directory),
                gated=repo_id in args.gated,
                allowed_tokens=frozenset(grants.get(repo_id, ())),
            )
        )
    hub = HubStandin(
        repos,
        tokens=frozenset(args.token),
        rate_bytes_per_s=args.rate,
        host=args.host,
        port=args.port,
    )
    print(f"listening on {hub.url}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        hub.server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
