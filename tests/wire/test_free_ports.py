"""
The ports the test servers listen on: L{free_port} draws them from below the
kernel's ephemeral range, never twice, and a server whose chosen port another
process took before it listened is started again on new ports.
"""

from __future__ import annotations

import socket
from pathlib import Path

from benchmarks.servers import KNOWN_PORTS, PORT_SPAN, _ephemeral_low
from tests.support import free_port
from tests.wire.conftest import KestrelProcess, LineClient, start_on_free_ports


def test_ports_come_from_below_the_ephemeral_range_and_never_twice() -> None:
    high = _ephemeral_low()
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert all(high - PORT_SPAN <= port < high for port in ports)
    assert not KNOWN_PORTS & set(ports)
    for port in ports[:20]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_server_whose_port_was_taken_starts_on_new_ports(tmp_path: Path) -> None:
    server = KestrelProcess(tmp_path, ("memcache", "text"))
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        server.ports["memcache"] = taken
        server.write_config()
        try:
            start_on_free_ports(server)
            assert server.memcache_port != taken
            assert "Address already in use" in server.log()
            client = LineClient(server.connect())
            client.send(b"set q 0 0 1\r\nx\r\nget q\r\n")
            assert client.line() == b"STORED\r\n"
            assert client.line() == b"VALUE q 0 1\r\n"
            client.close()
        finally:
            server.stop()
