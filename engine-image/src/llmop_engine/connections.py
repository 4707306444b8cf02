"""The engine's open client connections, read from the TCP tables of the pod's network namespace
(`/proc/net/tcp`, `/proc/net/tcp6`: the agent shares it with the engine): ESTABLISHED connections
to the engine's port whose other end is not a socket of the agent itself (its `/load`, metrics
and deep-probe requests).

The drain waits, once nothing is in flight, for the engine's idle keep-alive timeout, so that no
client reuses a pooled connection that the engine's exit would close under its request. When no
client connection is open at all, no client can reuse one: the drain may end at once. A client
that made a request during the drain has its connection closed after the response
(`Connection: close`), so in the usual rollout (new connections, or pinned clients that moved
away) nothing is left open seconds before the keep-alive timeout would pass.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ESTABLISHED = "01"
TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))

Endpoint = tuple[str, int]


@dataclass(frozen=True)
class Socket:
    """One row of a /proc/net/tcp{,6} table."""

    local: Endpoint
    remote: Endpoint
    state: str
    inode: int


def _endpoint(hex_endpoint: str) -> Endpoint:
    """`0100007F:1F40` → ("127.0.0.1", 8000); IPv4-mapped IPv6 addresses become IPv4, so the
    two ends of one connection compare equal whichever table each sits in."""
    address, port = hex_endpoint.split(":")
    raw = bytes.fromhex(address)
    # The kernel prints each 32-bit word of the address in host (little-endian) order.
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address
    if len(words) == 4:
        ip = ipaddress.IPv4Address(words)
    else:
        ip = ipaddress.IPv6Address(words)
        ip = ip.ipv4_mapped or ip
    return str(ip), int(port, 16)


def parse_table(text: str) -> list[Socket]:
    """The sockets of one table (its header line skipped, malformed rows ignored)."""
    sockets = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10:
            continue
        try:
            sockets.append(
                Socket(_endpoint(fields[1]), _endpoint(fields[2]), fields[3], int(fields[9]))
            )
        except ValueError:
            continue
    return sockets


def client_connections(port: int, tables: Iterable[str], own_inodes: set[int]) -> int:
    """ESTABLISHED connections to local `port` whose other end is none of the sockets with an
    inode in `own_inodes` (the agent's own)."""
    sockets = [socket for table in tables for socket in parse_table(table)]
    own = {socket.local for socket in sockets if socket.inode in own_inodes}
    return sum(
        1
        for socket in sockets
        if socket.state == ESTABLISHED and socket.local[1] == port and socket.remote not in own
    )


def _own_socket_inodes() -> set[int]:
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[len("socket:[") : -1]))
    return inodes


def open_client_connections(port: int) -> int | None:
    """Client connections open to the engine's `port` now; None where the tables cannot be read
    (not Linux): the drain then keeps its full quiet period."""
    try:
        own = _own_socket_inodes()
        tables = [path.read_text() for path in TABLES if path.exists()]
    except OSError:
        return None
    if not tables:
        return None
    return client_connections(port, tables, own)
