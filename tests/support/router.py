"""`llmop-router serve` as a test's process, watching a cluster through its kubeconfig: its
public port (the OpenAI routes and health) and its admin port (`/metrics`, `/routes`,
`/llmop/activity`), each on a free local port."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support.harness.replicas import free_port


@dataclass(frozen=True)
class RouterUrls:
    """Where a test's router answers."""

    url: str
    """The public port: the OpenAI routes, `/healthz`, `/readyz`."""
    admin: str
    """The admin port: `/metrics`, `/routes`, `/llmop/activity`."""


@contextlib.contextmanager
def router_process(
    kubeconfig: Path, log_path: Path, extra_args: Sequence[str] = ()
) -> Iterator[RouterUrls]:
    """The router on free local ports, its output in `log_path`; yields its base URLs."""
    port, admin_port = free_port(), free_port()
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "llmop_router", "serve"),
                *("--host", "127.0.0.1", "--port", str(port)),
                *("--admin-port", str(admin_port)),
                *("--kubeconfig", str(kubeconfig), *extra_args),
                # Nothing routes by a Service to a test's router: it may stop at once.
                *("--shutdown-delay", "0"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            yield RouterUrls(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}")
        finally:
            process.terminate()
            process.wait(timeout=15)


def get_json(url: str) -> tuple[int, Any]:
    """GET `url`: (status, decoded JSON body); (0, None) when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)
    except OSError:
        return 0, None


ROUTER_NAME = "llmop-router"


def router_deployment(namespace: str, replicas: int = 1) -> dict[str, Any]:
    """The router's Deployment as the operator reads it (its replicas Ready on kwok's nodes);
    the router that routes, where a test needs one, is a `llmop-router serve` process."""
    labels = {"app.kubernetes.io/name": "llmop-router"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": ROUTER_NAME, "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "router", "image": "localhost/pause:3.10"}]},
            },
        },
    }
