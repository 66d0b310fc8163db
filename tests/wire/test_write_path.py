"""
Replies sent at once (kestrel.protocols.base.write_now) over a real socket.

The fast path sends a reply with one C{send} when nothing is queued in the
transport; what the kernel does not take, and every reply written while
something is still queued, goes through Twisted's buffer. These tests make the
kernel refuse most of a large reply (the client reads slowly through a small
receive buffer) and check that every byte arrives, in request order.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest

from tests.wire.conftest import KestrelProcess, LineClient

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def server(kestrel_factory: Callable[..., KestrelProcess]) -> KestrelProcess:
    """One memcache server for the module."""
    return kestrel_factory()


def slow_reader(server: KestrelProcess) -> socket.socket:
    """A client socket with a small receive buffer, so the server's sends come up short."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(30)
    sock.connect(("127.0.0.1", server.memcache_port))
    return sock


def item(n: int) -> bytes:
    """A 1 MiB payload that differs from item C{m != n} in every 64-byte line."""
    return (b"%063d\n" % n) * (MIB // 64)


def stored(client: LineClient, queue: bytes, data: bytes) -> None:
    client.send(b"set %s 0 0 %d\r\n%s\r\n" % (queue, len(data), data))
    assert client.line() == b"STORED\r\n"


def test_large_replies_partly_sent_arrive_whole_and_in_order(server: KestrelProcess) -> None:
    """A reply the kernel takes only part of, and replies queued behind it, arrive in order."""
    writer = LineClient(server.connect())
    for n in range(3):
        stored(writer, b"partial", item(n))
    writer.close()

    sock = slow_reader(server)
    client = LineClient(sock)
    try:
        client.send(b"get partial\r\nget partial\r\n")
        # The first reply has started to arrive: the rest of the 2 MiB is
        # still queued in the server when the next requests come in.
        assert sock.recv(1, socket.MSG_PEEK) == b"V"
        client.send(b"get partial\r\nget partial\r\nversion\r\n")
        for n in range(3):
            assert client.line() == b"VALUE partial 0 %d\r\n" % MIB
            assert client.exactly(MIB + 2) == item(n) + b"\r\n"
            assert client.line() == b"END\r\n"
        assert client.line() == b"END\r\n"
        assert client.line().startswith(b"VERSION ")
    finally:
        client.close()


def test_many_small_replies_one_request_at_a_time(server: KestrelProcess) -> None:
    """One request at a time (the path that sends at once): every reply is whole."""
    client = LineClient(server.connect())
    try:
        for n in range(500):
            stored(client, b"small", b"%d" % n)
            client.send(b"get small\r\n")
            data = b"%d" % n
            assert client.line() == b"VALUE small 0 %d\r\n" % len(data)
            assert client.exactly(len(data) + 2) == data + b"\r\n"
            assert client.line() == b"END\r\n"
    finally:
        client.close()
