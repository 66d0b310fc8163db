"""
kestrel.protocols.base.write_now on transports other than plain TCP.

The direct-send path itself is exercised over real sockets in
tests/wire/test_write_path.py; here, every other transport must get exactly
C{transport.write}.
"""

from __future__ import annotations

from twisted.internet.testing import StringTransport

from kestrel.protocols.base import write_now


def test_other_transports_get_transport_write() -> None:
    """A StringTransport (like TLS or UNIX transports) receives the bytes through write()."""
    transport = StringTransport()
    write_now(transport, b"STORED\r\n")
    write_now(transport, b"")
    write_now(transport, b"END\r\n")
    assert transport.value() == b"STORED\r\nEND\r\n"

