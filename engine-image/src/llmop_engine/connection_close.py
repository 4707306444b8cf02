"""`Connection: close` on every response once the pod drains: the engine's side of a drain with
keep-alive clients.

A client that reuses a pooled connection keeps reaching the pod that connection was opened to,
also after the pod left the Service (kube-proxy picks the backend per connection, not per
request). While such clients keep sending, the engine never runs out of in-flight work and the
agent's drain runs into its budget. Once the agent marks the drain (`contract.Env.DRAIN_FLAG`
names a file it creates), every response the engine starts says `Connection: close` and the HTTP
server closes the connection after it: the request is still served in full, and the client's next
request opens a new connection, which kube-proxy sends to a pod still in the Service.

Why a file: the agent and the engine are separate processes (vLLM may run several API-server
processes), and the flag must be readable by all of them without a port on the pod network.
Checking it costs one `stat` per response on the pod's memory volume until it is seen, nothing
after (a drain is never undone).

`CloseOnDrain` is a plain ASGI middleware for `vllm serve --middleware` (uvicorn with httptools or
h11 both close the connection after a response carrying `Connection: close`); the simulator uses
`DrainFlag` directly. Standard library only: vLLM's interpreter imports it.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from llmop_engine.contract import Env

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class DrainFlag:
    """Whether the drain file exists; sticky once seen."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._seen = False

    @classmethod
    def from_env(cls) -> DrainFlag:
        return cls(os.environ.get(Env.DRAIN_FLAG) or None)

    def draining(self) -> bool:
        if not self._seen and self.path is not None:
            self._seen = os.path.exists(self.path)
        return self._seen


def with_connection_close(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """`headers` with any `Connection` header replaced by `Connection: close`."""
    return [(k, v) for k, v in headers if k.lower() != b"connection"] + [(b"connection", b"close")]


class CloseOnDrain:
    """ASGI middleware: `Connection: close` on each HTTP response started while draining."""

    def __init__(self, app: ASGIApp, flag: DrainFlag | None = None) -> None:
        self.app = app
        self.flag = flag if flag is not None else DrainFlag.from_env()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.flag.path is None:
            await self.app(scope, receive, send)
            return

        async def send_closing(message: Message) -> None:
            # Decided when the response starts: a response already under way keeps its
            # connection, and the request after it on that connection gets the close.
            if message["type"] == "http.response.start" and self.flag.draining():
                headers = with_connection_close(list(message.get("headers", ())))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_closing)
