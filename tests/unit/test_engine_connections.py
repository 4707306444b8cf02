"""The engine's open client connections from the pod's TCP tables (llmop_engine.connections)."""

from __future__ import annotations

from llmop_engine import connections

HEADER = (
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout "
    "inode\n"
)


def row(index: int, local: str, remote: str, state: str, inode: int) -> str:
    return (
        f"   {index}: {local} {remote} {state} 00000000:00000000 00:00000000 00000000"
        f"     0        0 {inode} 1 0000000000000000 20 4 30 10 -1\n"
    )


# Port 8000 is 1F40. 127.0.0.1 is 0100007F, 10.0.0.5 is 0500000A, 10.0.0.7 is 0700000A.
TCP = HEADER + "".join(
    [
        row(0, "00000000:1F40", "00000000:0000", "0A", 100),  # the engine listening
        row(1, "0100007F:1F40", "0100007F:A1B2", "01", 101),  # the agent's /load, server side
        row(2, "0100007F:A1B2", "0100007F:1F40", "01", 202),  # ... and the agent's own end
        row(3, "0500000A:1F40", "0700000A:C350", "01", 103),  # a client through the Service
        row(4, "0500000A:1F40", "0700000A:C351", "06", 104),  # closed: TIME_WAIT
        row(5, "0500000A:1F90", "0700000A:C352", "01", 105),  # another port (the probes)
    ]
)
# ::ffff:10.0.0.9 → each 32-bit word printed little-endian.
TCP6 = HEADER + row(
    0, "0000000000000000FFFF00000500000A:1F40", "0000000000000000FFFF00000900000A:D431", "01", 106
)


def test_rows_parse_to_addresses_ports_state_and_inode() -> None:
    sockets = connections.parse_table(TCP)
    assert sockets[3] == connections.Socket(("10.0.0.5", 8000), ("10.0.0.7", 50000), "01", 103)
    (mapped,) = connections.parse_table(TCP6)
    assert mapped.local == ("10.0.0.5", 8000)
    assert mapped.remote == ("10.0.0.9", 54321)


def test_only_other_processes_established_connections_to_the_port_count() -> None:
    # The agent's own socket (inode 202) is the other end of row 1: not a client.
    assert connections.client_connections(8000, [TCP, TCP6], {202}) == 2
    assert connections.client_connections(8000, [TCP], {202}) == 1
    # Unknown own sockets: the agent's connection counts too (the drain only waits longer).
    assert connections.client_connections(8000, [TCP], set()) == 2


def test_no_client_left_reads_zero() -> None:
    idle = HEADER + row(0, "00000000:1F40", "00000000:0000", "0A", 100)
    assert connections.client_connections(8000, [idle, "garbage\n  1: nonsense"], set()) == 0
