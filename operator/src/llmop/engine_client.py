"""The operator's only HTTP client of pods it runs (httpx): today the model downloader's
`GET /progress` (bytes done/total, rate, ETA — see `llmop_engine.download`).

Reads are best effort: a pod that is not up yet, restarting or unreachable yields None, and the
status keeps what the Job's own status says."""

from __future__ import annotations

from typing import Any

import httpx

from llmop_engine import contract

PROGRESS_PATH = "/progress"


def read_progress(host: str, port: int = contract.PROBE_PORT, timeout: float = 2.0) -> Any:
    """The downloader's progress JSON, or None when it cannot be read."""
    try:
        response = httpx.get(f"http://{host}:{port}{PROGRESS_PATH}", timeout=timeout)
        if response.status_code != 200:
            return None
        return response.json()
    except (httpx.HTTPError, ValueError):
        return None
