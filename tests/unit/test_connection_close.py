"""`llmop_engine.connection_close`: the ASGI middleware adds `Connection: close` once the drain
flag file exists, and leaves responses alone before (driven in-process with real ASGI messages;
uvicorn closing the socket is tested with real servers in tests/engine/test_keepalive_drain.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from llmop_engine.connection_close import CloseOnDrain, DrainFlag
from llmop_engine.contract import CLOSE_ON_DRAIN_MIDDLEWARE, Env


async def _app(scope: Any, receive: Any, send: Any) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/plain"), (b"Connection", b"keep-alive")],
        }
    )
    await send({"type": "http.response.body", "body": b"ok"})


def _call(mw: CloseOnDrain, kind: str = "http") -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        sent.append(dict(message))

    asyncio.run(mw({"type": kind}, receive, send))
    return sent


def test_connection_close_only_once_the_flag_exists(tmp_path: Path) -> None:
    flag = tmp_path / "drain"
    mw = CloseOnDrain(_app, DrainFlag(str(flag)))
    before = _call(mw)[0]["headers"]
    assert before == [(b"content-type", b"text/plain"), (b"Connection", b"keep-alive")]
    flag.touch()
    start, body = _call(mw)
    assert start["headers"] == [(b"content-type", b"text/plain"), (b"connection", b"close")]
    assert body == {"type": "http.response.body", "body": b"ok"}
    # Sticky: a drain is never undone, and the flag is not stat'ed again.
    flag.unlink()
    assert (b"connection", b"close") in _call(mw)[0]["headers"]


def test_no_flag_configured_or_not_http_passes_through(tmp_path: Path) -> None:
    (tmp_path / "drain").touch()
    assert (b"connection", b"close") not in _call(CloseOnDrain(_app, DrainFlag(None)))[0]["headers"]
    lifespan = _call(CloseOnDrain(_app, DrainFlag(str(tmp_path / "drain"))), kind="lifespan")
    assert (b"connection", b"close") not in lifespan[0]["headers"]


def test_flag_path_from_the_engine_environment(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv(Env.DRAIN_FLAG, str(tmp_path / "d"))
    assert CloseOnDrain(_app).flag.path == str(tmp_path / "d")
    monkeypatch.delenv(Env.DRAIN_FLAG)
    assert CloseOnDrain(_app).flag.path is None


def test_contract_names_this_class() -> None:
    module, name = CLOSE_ON_DRAIN_MIDDLEWARE.rsplit(".", 1)
    assert module == CloseOnDrain.__module__
    assert name == CloseOnDrain.__name__
