"""The operator's only conversation with the model hub (`huggingface_hub`, honouring the endpoint
the operator is configured with): resolve a revision, size the files, check that the token may
read them (`probe`, the model's pre-flight); read a LoRA adapter's `adapter_config.json`
(`adapter_probe`) and a base model's `model_type` (`model_type`) for the adapter pre-flight;
read what the capacity planner needs of a model's files (`model_files`).
Returns `preflight.HubAnswer` / `adapter_preflight.AdapterAnswer` values; the verdicts are
`preflight.verdict`'s and `adapter_preflight.verdict`'s.

Two requests per check: model info with file sizes (`/api/models/{repo}/revision/{rev}?blobs`),
then a HEAD of one file at the resolved commit — the Hub serves a gated model's metadata to
anyone, so only a file request proves access (401 without a token, 403 with one lacking access).
"""

from __future__ import annotations

import json

import httpx2
from huggingface_hub import (
    HfApi,
    get_hf_file_metadata,
    get_session,
    hf_hub_url,
    hf_raise_for_status,
)
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from llmop.adapter_preflight import ADAPTER_CONFIG, AdapterAnswer, AdapterFacts
from llmop.planner.model_config import CONFIG_FILE, INDEX_FILE, MAX_INDEX_PREFIX, ModelFiles
from llmop.preflight import HubAnswer, HubFacts, HubFailure

INVALID_CREDENTIALS = "Invalid credentials in Authorization header"
MAX_SMALL_FILE_BYTES = 1 << 20
"""The most the operator reads of a config file; a real `adapter_config.json` is ~1 KB."""


class HubUnavailableError(Exception):
    """The hub could not answer now (network, 5xx, rate limit): the reconcile retries later with
    backoff, as for a transient API error; nothing is stalled."""


def probe(
    repo_id: str,
    revision: str | None,
    *,
    token: str | None,
    endpoint: str | None,
    timeout: float = 10.0,
) -> HubAnswer:
    """Ask the Hub about `repo_id@revision` with `token` (None: anonymous, never a token the
    operator's own environment happens to hold)."""
    send: str | bool = token if token else False
    try:
        info = HfApi(endpoint=endpoint, token=send).model_info(
            repo_id, revision=revision, files_metadata=True, timeout=timeout
        )
        if info.sha is None:
            return HubFailure("unreachable", "the hub returned no commit sha")
        siblings = info.siblings or []
        names = [s.rfilename for s in siblings]
        if names:
            probe_file = "config.json" if "config.json" in names else names[0]
            get_hf_file_metadata(
                hf_hub_url(repo_id, probe_file, revision=info.sha, endpoint=endpoint),
                token=send,
                timeout=timeout,
                endpoint=endpoint,
            )
        return HubFacts(
            sha=info.sha,
            total_bytes=sum(s.size or 0 for s in siblings),
            gated=bool(info.gated),
        )
    except (HfHubHTTPError, httpx2.HTTPError, OSError) as error:
        return _failure(error, token)


def adapter_probe(
    repo_id: str,
    revision: str | None,
    *,
    token: str | None,
    endpoint: str | None,
    timeout: float = 10.0,
) -> AdapterAnswer:
    """Ask the Hub about the LoRA adapter `repo_id@revision` with `token` (None: anonymous):
    the commit, its files, and the text of its `adapter_config.json`. Two requests: the repo's
    info (no file sizes), then a GET of that one small file at the resolved commit, which also
    proves the token may read a gated repo's files."""
    send: str | bool = token if token else False
    try:
        info = HfApi(endpoint=endpoint, token=send).model_info(
            repo_id, revision=revision, timeout=timeout
        )
        if info.sha is None:
            return HubFailure("unreachable", "the hub returned no commit sha")
        files = tuple(s.rfilename for s in info.siblings or [])
        config = None
        if ADAPTER_CONFIG in files:
            config = _read_text(
                repo_id,
                ADAPTER_CONFIG,
                revision=info.sha,
                token=send,
                endpoint=endpoint,
                timeout=timeout,
            )
        return AdapterFacts(
            sha=info.sha, files=files, gated=bool(info.gated), adapter_config=config
        )
    except (HfHubHTTPError, httpx2.HTTPError, OSError) as error:
        return _failure(error, token)


def model_type(
    repo_id: str,
    revision: str | None,
    *,
    token: str | None,
    endpoint: str | None,
    timeout: float = 10.0,
) -> str | HubFailure | None:
    """The `model_type` in a model's `config.json` at `revision` (None: no such file, not a
    JSON object, or no string `model_type`) — what the adapter pre-flight checks target modules
    against."""
    send: str | bool = token if token else False
    try:
        text = _read_text(
            repo_id,
            "config.json",
            revision=revision or "main",
            token=send,
            endpoint=endpoint,
            timeout=timeout,
        )
    except RemoteEntryNotFoundError:
        return None
    except (HfHubHTTPError, httpx2.HTTPError, OSError) as error:
        return _failure(error, token)
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    value = doc.get("model_type") if isinstance(doc, dict) else None
    return value if isinstance(value, str) else None


def model_files(
    repo_id: str,
    revision: str | None,
    *,
    token: str | None,
    endpoint: str | None,
    timeout: float = 10.0,
) -> ModelFiles | HubFailure:
    """What the planner reads of a model at `revision`: `config.json` and the first
    `MAX_INDEX_PREFIX` bytes of `model.safetensors.index.json` (its `metadata.total_size`), at
    the commit the revision resolves to. Three small requests (info, two files); no weights, and
    nothing written to disk."""
    send: str | bool = token if token else False
    try:
        info = HfApi(endpoint=endpoint, token=send).model_info(
            repo_id, revision=revision, timeout=timeout
        )
        if info.sha is None:
            return HubFailure("unreachable", "the hub returned no commit sha")
        names = {s.rfilename for s in info.siblings or []}
        sha = info.sha

        def read(filename: str, limit: int) -> str | None:
            if filename not in names:
                return None
            return _read_text(
                repo_id,
                filename,
                revision=sha,
                token=send,
                endpoint=endpoint,
                timeout=timeout,
                limit=limit,
            )

        return ModelFiles(
            config_text=read(CONFIG_FILE, MAX_SMALL_FILE_BYTES),
            index_text=read(INDEX_FILE, MAX_INDEX_PREFIX),
            revision=sha,
        )
    except (HfHubHTTPError, httpx2.HTTPError, OSError) as error:
        return _failure(error, token)


def _read_text(
    repo_id: str,
    filename: str,
    *,
    revision: str,
    token: str | bool,
    endpoint: str | None,
    timeout: float,
    limit: int = MAX_SMALL_FILE_BYTES,
) -> str:
    """One small file's text, read in memory (the operator writes nothing to disk): at most
    `MAX_SMALL_FILE_BYTES`, so a file that is no config cuts short and then parses as no
    JSON — a verdict on the file, not a megabyte download in the reconcile."""
    url = hf_hub_url(repo_id, filename, revision=revision, endpoint=endpoint)
    # Only our own token, never one the operator's environment holds (as `token=False` does).
    headers = {"Authorization": f"Bearer {token}"} if isinstance(token, str) else {}
    body = bytearray()
    with get_session().stream("GET", url, headers=headers, timeout=timeout) as response:
        hf_raise_for_status(response)
        for chunk in response.iter_bytes():
            body += chunk
            if len(body) >= limit:
                break
    return body[:limit].decode("utf-8", errors="replace")


def _failure(error: Exception, token: str | None) -> HubFailure:
    """The pre-flight's reading of a failed Hub request (the library's own exceptions, mapped
    from the Hub's `X-Error-Code`)."""
    if isinstance(error, GatedRepoError):
        return HubFailure("access_denied" if token else "no_token", _first_line(error))
    if isinstance(error, RevisionNotFoundError):
        return HubFailure("revision_not_found", _first_line(error))
    if isinstance(error, RepositoryNotFoundError):
        # The Hub answers 401/404 alike for private and missing repos without a token.
        return HubFailure("repo_not_found", _first_line(error))
    if isinstance(error, HfHubHTTPError):
        status = error.response.status_code if error.response is not None else None
        message = (
            error.response.headers.get("X-Error-Message", "") if error.response is not None else ""
        )
        if status == 401 and token and message == INVALID_CREDENTIALS:
            return HubFailure("invalid_token", message)
        if status in (401, 403):
            return HubFailure("access_denied" if token else "no_token", _first_line(error))
        return HubFailure("unreachable", _first_line(error))
    return HubFailure("unreachable", f"{type(error).__name__}: {error}")


def _first_line(error: Exception) -> str:
    lines = [line for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__
