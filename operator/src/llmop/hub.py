"""The operator's only conversation with the model hub (`huggingface_hub`, honouring the endpoint
the operator is configured with): resolve a revision, size the files, check that the token may
read them. Returns `preflight.HubAnswer` values; the verdict is `preflight.verdict`'s.

Two requests per check: model info with file sizes (`/api/models/{repo}/revision/{rev}?blobs`),
then a HEAD of one file at the resolved commit — the Hub serves a gated model's metadata to
anyone, so only a file request proves access (401 without a token, 403 with one lacking access).
"""

from __future__ import annotations

import httpx2
from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_url
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from llmop.preflight import HubAnswer, HubFacts, HubFailure

INVALID_CREDENTIALS = "Invalid credentials in Authorization header"


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
    except GatedRepoError as error:
        return HubFailure("access_denied" if token else "no_token", _first_line(error))
    except RevisionNotFoundError as error:
        return HubFailure("revision_not_found", _first_line(error))
    except RepositoryNotFoundError as error:
        # The Hub answers 401/404 alike for private and missing repos without a token.
        return HubFailure("repo_not_found", _first_line(error))
    except HfHubHTTPError as error:
        status = error.response.status_code if error.response is not None else None
        message = (
            error.response.headers.get("X-Error-Message", "") if error.response is not None else ""
        )
        if status == 401 and token and message == INVALID_CREDENTIALS:
            return HubFailure("invalid_token", message)
        if status in (401, 403):
            return HubFailure("access_denied" if token else "no_token", _first_line(error))
        return HubFailure("unreachable", _first_line(error))
    except (httpx2.HTTPError, OSError) as error:
        return HubFailure("unreachable", f"{type(error).__name__}: {error}")


def _first_line(error: Exception) -> str:
    lines = [line for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__
