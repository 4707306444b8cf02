"""A signal while the simulator loads ends it at once, as vLLM's start does.

vLLM 0.33 installs a start-up handler for SIGTERM and SIGINT (`setup_interrupt_handler`) that
raises `KeyboardInterrupt("terminated")`; nothing catches it, so the process ends by SIGINT
(exit status 130, -2 to `Popen`) without ever listening. The simulator used to ignore SIGTERM
while loading and serve afterwards: a pod deleted during its load waited for the SIGKILL at the
end of its grace period. Through the agent: tests/engine/test_drain_budget.py.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from support.harness.replicas import Replica, port_open

pytestmark = pytest.mark.engine

LOAD_SECONDS = 8.0
SIGNAL_AFTER = 1.0
EXIT_BOUND = 2.0


def wait_for_log(replica: Replica, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in replica.log_tail(100_000):
        assert replica.proc.poll() is None, replica.log_tail()
        assert time.monotonic() < deadline, f"no {text!r} in: {replica.log_tail()}"
        time.sleep(0.05)


@pytest.mark.timeout(60)
def test_sigterm_or_sigint_while_loading_ends_the_simulator_at_once(tmp_path: Path) -> None:
    # Both at once: the two processes' start-ups overlap, so the test costs one.
    signals = (signal.SIGTERM, signal.SIGINT)
    replicas = [
        Replica.start(
            tmp_path,
            with_agent=False,
            engine_args=["--sim-load-seconds", f"{LOAD_SECONDS:g}"],
        )
        for _ in signals
    ]
    try:
        for r in replicas:
            # Its handlers are installed before this line: the signal meets the load itself.
            wait_for_log(r, "loading model", 30)
        time.sleep(SIGNAL_AFTER)
        took: dict[str, float] = {}
        for r, sig in zip(replicas, signals, strict=True):
            sent = time.monotonic()
            r.proc.send_signal(sig)
            while r.proc.poll() is None and time.monotonic() - sent < LOAD_SECONDS + 5:
                assert not port_open(r.api_port), r.log_tail()
                time.sleep(0.02)
            took[sig.name] = time.monotonic() - sent
        print(f"\nsignal while loading: exited after {took}")
        for r, sig in zip(replicas, signals, strict=True):
            log = r.log_tail(100_000)
            assert took[sig.name] < EXIT_BOUND, log
            # Ended by SIGINT as an uncaught KeyboardInterrupt ends Python (vLLM's exit).
            assert r.proc.returncode == -signal.SIGINT, log
            assert "KeyboardInterrupt: terminated" in log
            assert "Starting vLLM server" not in log  # never served
            assert not port_open(r.api_port)
    finally:
        for r in replicas:
            r.stop()
