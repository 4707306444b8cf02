"""`llmop-router serve` as a process keeps its admin routes off the port clients use: the public
port answers the OpenAI routes and health, and 404 for `/metrics`, `/routes` and
`/llmop/activity`; the admin port serves those three (the table names every engine pod's
address) and none of the OpenAI routes. One port for both is refused at the start, naming the
flag."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from support.harness.replicas import free_port

ADMIN_ROUTES = ("/metrics", "/routes", "/llmop/activity")


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def _serve(table: Path, *args: str, output: int = subprocess.DEVNULL) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "llmop_router", "serve", "--static", str(table), *args],
        stdout=output,
        stderr=subprocess.STDOUT,
    )


def test_admin_routes_are_on_the_admin_port_only(tmp_path: Path) -> None:
    table = tmp_path / "table.json"
    entry = {"namespace": "team", "name": "llama", "endpoints": ["10.244.0.9:8000"]}
    table.write_text(json.dumps({"models": {"llama": entry}}))
    port, admin_port = free_port(), free_port()
    public, admin = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}"
    process = _serve(
        table,
        *("--host", "127.0.0.1", "--port", str(port), "--admin-port", str(admin_port)),
        *("--shutdown-delay", "0"),
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if _get(f"{public}/readyz")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the router never became ready"
            time.sleep(0.05)

        for route in ADMIN_ROUTES:
            assert _get(f"{public}{route}")[0] == 404, route
        status, models = _get(f"{public}/v1/models")
        assert (status, [m["id"] for m in json.loads(models)["data"]]) == (200, ["llama"])

        status, metrics = _get(f"{admin}/metrics")
        assert status == 200
        assert b"llmop_router_in_flight_requests 0.0" in metrics
        status, routes = _get(f"{admin}/routes")
        assert status == 200
        assert json.loads(routes)["models"]["llama"]["endpoints"] == {"10.244.0.9:8000": 0}
        status, activity = _get(f"{admin}/llmop/activity")
        assert (status, json.loads(activity)) == (200, {"models": []})
        for route in ("/v1/models", "/readyz"):
            assert _get(f"{admin}{route}")[0] == 404, route
    finally:
        process.terminate()
        process.wait(timeout=15)


def test_one_port_for_both_is_refused_naming_the_flag(tmp_path: Path) -> None:
    table = tmp_path / "table.json"
    table.write_text(json.dumps({"models": {}}))
    port = str(free_port())
    process = _serve(table, "--port", port, "--admin-port", port, output=subprocess.PIPE)
    output, _ = process.communicate(timeout=30)
    assert process.returncode == 2
    assert f"--admin-port {port} is --port too" in output.decode()
