"""quorumlog.testing.servers.free_port: never the same port twice within a test process."""

from __future__ import annotations

import socket

from quorumlog.testing.servers import free_port


def test_ports_handed_out_are_distinct() -> None:
    # The OS offers the same free port to consecutive probes now and then, and among a few thousand picks
    # from its ephemeral range duplicates are near certain: a test cluster whose bookies got one port
    # failed to start ("its cookie exists in metadata but is missing").
    ports = [free_port() for _ in range(3000)]
    assert len(set(ports)) == len(ports)


def test_a_port_handed_out_is_free() -> None:
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))
