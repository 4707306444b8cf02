"""An API-server outage for one client: a TCP link between that client (its kubeconfig points
at the link) and the API server, which a test can cut and restore. The API server itself and
every other client (the test's own, the controllers) are untouched, so the cluster changes on
while the client is cut off, as it would during a control-plane outage that only the operator
sees (a network partition) or one it outlasts (an API server restarted).

- `cut("refuse")`: every connection through the link is reset and new ones are refused: an API
  server that is down or restarting.
- `cut("blackhole")`: nothing flows any more, in either direction, and new connections are
  accepted but never answered: a hung API server or a dropped network (requests run into their
  timeouts). On `restore()` the held bytes flow again, late.

TLS passes through untouched (the client still verifies the API server's certificate, issued
for 127.0.0.1).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

Mode = Literal["refuse", "blackhole"]
CHUNK = 65536


class CuttableLink:
    """127.0.0.1:`port` → `upstream`, one pair of threads per connection."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._flowing = threading.Event()
        self._flowing.set()
        self._listener: socket.socket | None = None
        self.port = 0
        self.cuts = 0

    def __enter__(self) -> CuttableLink:
        self._listen()
        return self

    def __exit__(self, *_: object) -> None:
        self._flowing.set()
        self._stop_listening()
        self._reset_all()

    def cut(self, mode: Mode = "refuse") -> None:
        self.cuts += 1
        if mode == "blackhole":
            self._flowing.clear()
            return
        self._stop_listening()
        self._reset_all()

    def restore(self) -> None:
        if self._listener is None:
            self._listen()
        self._flowing.set()

    def _listen(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _stop_listening(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
            listener.close()

    def _reset_all(self) -> None:
        with self._lock:
            sockets = list(self._sockets)
            self._sockets.clear()
        for sock in sockets:
            with contextlib.suppress(OSError):
                # Closed with a RST (linger 0), as a dead server's connections are; the
                # shutdown wakes the thread reading it, which closes it.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
                sock.shutdown(socket.SHUT_RDWR)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        with self._lock:
            self._sockets.add(client)
        self._flowing.wait()  # a blackhole holds new connections unanswered
        try:
            server = socket.create_connection(self.upstream, timeout=10)
        except OSError:
            self._drop(client)
            return
        server.settimeout(None)
        with self._lock:
            self._sockets.add(server)
        for source, target in ((client, server), (server, client)):
            threading.Thread(target=self._pump, args=(source, target), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        try:
            while True:
                data = source.recv(CHUNK)
                if not data:
                    break
                self._flowing.wait()
                target.sendall(data)
        except OSError:
            pass
        finally:
            self._drop(source)
            self._drop(target)

    def _drop(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.discard(sock)
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()


def upstream_of(kubeconfig: Path) -> tuple[str, int]:
    """The API server's address in a kubeconfig (JSON, as `operator_kubeconfig_for` writes)."""
    config = json.loads(kubeconfig.read_text())
    server = urllib.parse.urlsplit(config["clusters"][0]["cluster"]["server"])
    host, port = server.hostname, server.port
    if host is None or port is None:
        raise ValueError(f"no host and port in {server.geturl()}")
    return host, port


def through(kubeconfig: Path, link: CuttableLink, path: Path) -> Path:
    """A copy of `kubeconfig` whose server is the link."""
    config = json.loads(kubeconfig.read_text())
    cluster = config["clusters"][0]["cluster"]
    server = urllib.parse.urlsplit(cluster["server"])
    cluster["server"] = server._replace(netloc=f"127.0.0.1:{link.port}").geturl()
    path.write_text(json.dumps(config))
    return path


@contextlib.contextmanager
def cuttable(kubeconfig: Path, path: Path) -> Iterator[tuple[CuttableLink, Path]]:
    """A link to `kubeconfig`'s API server and a kubeconfig (written to `path`) that uses it."""
    with CuttableLink(upstream_of(kubeconfig)) as link:
        yield link, through(kubeconfig, link, path)
