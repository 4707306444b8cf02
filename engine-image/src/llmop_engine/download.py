"""`llmop-engine download`: fill a model cache from the Hugging Face Hub, once, with progress.

The engine image runs this as the operator's download Job. It is the engine package's only module
that talks to the Hub (through `huggingface_hub`, which honours `HF_ENDPOINT`, `HF_TOKEN_PATH`,
revisions and ranged resumes). The cache is laid out as `huggingface_hub` lays out its own
(`$HF_HOME/hub/models--org--name/{blobs,snapshots/<sha>}`), so engine pods started with
`HF_HOME` on the same volume and `HF_HUB_OFFLINE=1` read the weights without any network.

Behaviour (each point answers a failure seen in other operators' trackers):
- **Retries with backoff** on anything transient (connection refused, resets, 5xx, timeouts),
  `download_progress.backoff_seconds` between attempts, up to `--max-attempts`.
- **A deadline** (`--deadline-seconds`): past it the process reports why and exits 3, instead of
  looping silently for ever.
- **No retry on what a retry cannot fix**: gated without access, unknown repo/revision/file, a
  rejected token → exit 2 with the library's message, so the Job fails at once (the operator maps
  the exit code to a Stalled reason).
- **Resume after a kill**: files already complete in the cache are never fetched again
  (`snapshot_download` skips them). `huggingface_hub` 2.x writes each file to a per-process
  `*.incomplete` temporary it never reuses, so a kill loses the files in flight (at most
  `--max-workers` of them) but nothing else; within one process a dropped connection resumes with
  an HTTP Range request. Orphaned temporaries of a killed run are removed at start (they would
  otherwise eat the cache) — safe because the operator runs one downloader per cache.
- **Progress**: bytes on disk sampled every `--interval` seconds → bytes done/total, rate and ETA
  (`download_progress`), written atomically to `--progress-file` and served as JSON on
  `GET /progress` at `--progress-port`; the final message also goes to the termination log.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from huggingface_hub import HfApi, snapshot_download
from huggingface_hub import constants as hub_constants
from huggingface_hub.errors import (
    DisabledRepoError,
    GatedRepoError,
    HfHubHTTPError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils.tqdm import disable_progress_bars

from llmop_engine import contract
from llmop_engine import download_progress as dp

log = logging.getLogger("llmop.download")

EXIT_OK = contract.DownloadExit.OK
EXIT_FATAL = contract.DownloadExit.FATAL
EXIT_DEADLINE = contract.DownloadExit.DEADLINE
EXIT_ATTEMPTS = contract.DownloadExit.ATTEMPTS


class FatalError(Exception):
    """A failure a retry cannot fix."""


def classify(error: BaseException) -> bool:
    """True when `error` is worth a retry."""
    if isinstance(
        error,
        GatedRepoError
        | RepositoryNotFoundError
        | RevisionNotFoundError
        | RemoteEntryNotFoundError
        | DisabledRepoError,
    ):
        return False
    if isinstance(error, HfHubHTTPError):
        status = error.response.status_code if error.response is not None else None
        return status not in (400, 401, 403, 404)
    return True


def repo_folder(hub_cache: Path, repo_id: str) -> Path:
    """Where `huggingface_hub` keeps a model repo in its cache."""
    return hub_cache / ("models--" + repo_id.replace("/", "--"))


def fetch_snapshot(
    repo_id: str,
    revision: str | None,
    hub_cache: Path,
    *,
    token: str | None = None,
    max_workers: int = 8,
    endpoint: str | None = None,
    ignore_offline: bool = False,
    quiet: bool = False,
) -> Path:
    """Fetch one repo at one revision into a `huggingface_hub` cache; returns its snapshot folder.

    The downloader Job and the agent's adapter fetches both come here. Files already complete are
    not fetched again, and several processes may fetch the same repo into one cache at once:
    `huggingface_hub` takes a file lock per blob and writes each to its own temporary first.
    `ignore_offline`: fetch even with `HF_HUB_OFFLINE` set. The renderer sets it on engine pods
    with a model cache so that vLLM never reaches the Hub, and the agent inherits it; its adapter
    fetches are explicit and pinned, so the agent turns the library's (process-wide) flag off.
    `quiet`: no progress bars and no line per HTTP request (process-wide too): the agent's log
    is the pod's, and a few small adapter files need neither.
    """
    if ignore_offline and hub_constants.HF_HUB_OFFLINE:
        hub_constants.HF_HUB_OFFLINE = False
    if quiet:
        disable_progress_bars()
        for client in ("httpx", "httpx2"):  # huggingface_hub's HTTP client (by version)
            logging.getLogger(client).setLevel(logging.WARNING)
    return Path(
        snapshot_download(
            repo_id,
            revision=revision,
            cache_dir=hub_cache,
            token=token,
            max_workers=max_workers,
            endpoint=endpoint,
        )
    )


def bytes_on_disk(folder: Path) -> int:
    """Bytes of the repo's blobs, partial ones included (snapshots hold only symlinks)."""
    blobs = folder / "blobs"
    total = 0
    if blobs.is_dir():
        for entry in os.scandir(blobs):
            try:
                total += entry.stat(follow_symlinks=False).st_size
            except FileNotFoundError:  # renamed from .incomplete to its final name meanwhile
                continue
    return total


def remove_orphans(folder: Path) -> int:
    """Delete `*.incomplete` temporaries a killed run left behind; returns how many."""
    blobs = folder / "blobs"
    if not blobs.is_dir():
        return 0
    orphans = list(blobs.glob("*.incomplete"))
    for orphan in orphans:
        orphan.unlink(missing_ok=True)
    return len(orphans)


class Reporter:
    """Samples the bytes on disk, keeps the latest `Progress`, publishes it."""

    def __init__(self, folder: Path, progress_file: Path | None, interval: float) -> None:
        self.folder = folder
        self.progress_file = progress_file
        self.interval = interval
        self.total: int | None = None
        self.phase: dp.DownloadPhase = "resolving"
        self.attempt = 0
        self.message = ""
        self.samples: tuple[dp.Sample, ...] = ()
        self.latest = dp.progress("resolving", (), None, 0)
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def update(self, **changes: object) -> dp.Progress:
        with self._lock:
            for name, value in changes.items():
                setattr(self, name, value)
            now = dp.Sample(time.monotonic(), bytes_on_disk(self.folder))
            self.samples = dp.window(self.samples, now, dp.RATE_WINDOW_SECONDS)
            self.latest = dp.progress(
                self.phase, self.samples, self.total, self.attempt, self.message
            )
            latest = self.latest
            # Under the lock: the reporter's thread and the download's both publish, through
            # one temporary file (two at once lost it: one's rename found it gone), and the
            # file must end with the newest progress, not whichever rename came last.
            self._publish(latest)
        return latest

    def _publish(self, latest: dp.Progress) -> None:
        if self.progress_file is None:
            return
        self.progress_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.progress_file.with_name(self.progress_file.name + ".tmp")
        tmp.write_text(json.dumps(latest.as_json()))
        tmp.replace(self.progress_file)  # readers never see half a file

    def run(self) -> None:
        while not self._stop.wait(self.interval):
            self.update()

    def stop(self) -> None:
        self._stop.set()


def serve_progress(reporter: Reporter, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != contract.PROGRESS_PATH:
                self.send_error(404)
                return
            body = json.dumps(reporter.latest.as_json()).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _total_bytes(api: HfApi, repo_id: str, revision: str | None) -> tuple[str, int]:
    info = api.model_info(repo_id, revision=revision, files_metadata=True)
    if info.sha is None:
        raise FatalError(f"the Hub returned no commit for {repo_id}@{revision}")
    return info.sha, sum(s.size or 0 for s in info.siblings or [])


def download(  # noqa: C901
    repo_id: str,
    revision: str | None,
    hf_home: Path,
    *,
    token: str | None,
    deadline_seconds: float,
    max_attempts: int,
    max_workers: int,
    reporter: Reporter,
    termination_log: Path | None,
) -> int:
    """Fill the cache; returns the process exit code."""
    started = time.monotonic()
    hub_cache = hf_home / "hub"
    removed = remove_orphans(repo_folder(hub_cache, repo_id))
    if removed:
        log.info("removed %d partial file(s) left by an interrupted run", removed)

    def finish(code: int, phase: dp.DownloadPhase, message: str) -> int:
        reporter.update(phase=phase, message=message)
        (log.info if code == EXIT_OK else log.error)("%s", message)
        if termination_log is not None:
            with contextlib.suppress(OSError):  # best effort: the log line above has it too
                termination_log.write_text(message[:4000])
        return code

    def on_deadline() -> None:
        finish(EXIT_DEADLINE, "failed", f"deadline of {deadline_seconds:.0f}s exceeded")
        os._exit(EXIT_DEADLINE)  # snapshot_download cannot be interrupted from another thread

    watchdog = threading.Timer(deadline_seconds, on_deadline)
    watchdog.daemon = True
    watchdog.start()
    threading.Thread(target=reporter.run, daemon=True).start()
    api = HfApi(token=token)
    try:
        for attempt in range(1, max_attempts + 1):
            phase: dp.DownloadPhase = "resolving" if reporter.total is None else "downloading"
            reporter.update(attempt=attempt, phase=phase)
            try:
                if reporter.total is None:
                    sha, total = _total_bytes(api, repo_id, revision)
                    reporter.update(total=total, phase="downloading", message=f"commit {sha}")
                    revision = sha  # every later attempt fetches the same commit
                path = fetch_snapshot(
                    repo_id, revision, hub_cache, token=token, max_workers=max_workers
                )
            except FatalError as error:
                return finish(EXIT_FATAL, "failed", str(error))
            except Exception as error:
                first_line = (str(error).strip().splitlines() or [""])[0]
                summary = f"{type(error).__name__}: {first_line}"
                if not classify(error):
                    return finish(EXIT_FATAL, "failed", f"{repo_id}@{revision}: {error}")
                delay = dp.backoff_seconds(attempt)
                if attempt == max_attempts:
                    break
                if time.monotonic() - started + delay >= deadline_seconds:
                    delay = max(0.0, deadline_seconds - (time.monotonic() - started))
                reporter.update(phase="retrying", message=f"attempt {attempt}: {summary}")
                log.warning("attempt %d failed (%s); retrying in %.0fs", attempt, summary, delay)
                time.sleep(delay)
                continue
            return finish(EXIT_OK, "complete", f"{repo_id}@{revision} complete in {path}")
        return finish(
            EXIT_ATTEMPTS, "failed", f"gave up after {max_attempts} attempts: {reporter.message}"
        )
    finally:
        watchdog.cancel()
        reporter.stop()


def parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    """The command line of `llmop-engine download` (flags named in `contract.DownloadFlag`)."""
    flag = contract.DownloadFlag
    parser = argparse.ArgumentParser(
        prog=f"{contract.ENTRYPOINT} {contract.DOWNLOAD}",
        description="Fill a model cache from the Hugging Face Hub "
        "(honours HF_ENDPOINT, HF_TOKEN, HF_TOKEN_PATH).",
    )
    parser.add_argument(flag.MODEL, required=True, help="Hugging Face repo id, org/name")
    parser.add_argument(flag.REVISION, default=None, help="commit sha (or branch/tag)")
    parser.add_argument(flag.HF_HOME, default=env.get(contract.Env.HF_HOME, "/models"))
    parser.add_argument(
        flag.DEADLINE_SECONDS, type=float, default=float(contract.DOWNLOAD_DEADLINE_SECONDS)
    )
    parser.add_argument(flag.MAX_ATTEMPTS, type=int, default=10)
    parser.add_argument(flag.MAX_WORKERS, type=int, default=8, help="files fetched in parallel")
    parser.add_argument(flag.INTERVAL, type=float, default=1.0, help="progress sampling seconds")
    parser.add_argument(flag.PROGRESS_FILE, default=None)
    parser.add_argument(flag.PROGRESS_PORT, type=int, default=None)
    parser.add_argument(flag.TERMINATION_LOG, default="/dev/termination-log")
    return parser


def main(argv: Sequence[str]) -> int:
    ns = parser(os.environ).parse_args(argv)
    hf_home = Path(ns.hf_home)
    reporter = Reporter(
        repo_folder(hf_home / "hub", ns.model),
        Path(ns.progress_file) if ns.progress_file else None,
        ns.interval,
    )
    if ns.progress_port is not None:
        serve_progress(reporter, ns.progress_port)
    termination = Path(ns.termination_log)
    return download(
        ns.model,
        ns.revision,
        hf_home,
        token=os.environ.get("HF_TOKEN") or None,
        deadline_seconds=ns.deadline_seconds,
        max_attempts=ns.max_attempts,
        max_workers=ns.max_workers,
        reporter=reporter,
        termination_log=termination if termination.exists() else None,  # kubelet makes it
    )


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    sys.exit(main(sys.argv[1:]))
