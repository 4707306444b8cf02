"""`llmop-router serve` as a test's process, watching a cluster through its kubeconfig."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from support.harness.replicas import free_port


@contextlib.contextmanager
def router_process(
    kubeconfig: Path, log_path: Path, extra_args: Sequence[str] = ()
) -> Iterator[str]:
    """The router on a free local port, its output in `log_path`; yields its base URL."""
    port = free_port()
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "llmop_router", "serve"),
                *("--host", "127.0.0.1", "--port", str(port)),
                *("--kubeconfig", str(kubeconfig), *extra_args),
                # Nothing routes by a Service to a test's router: it may stop at once.
                *("--shutdown-delay", "0"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            process.terminate()
            process.wait(timeout=15)
