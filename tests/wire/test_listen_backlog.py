"""
The listeners' backlog (`listen_backlog`): a burst of connections is held by
the kernel until the server accepts it, instead of being dropped.

With Twisted's default backlog of 50, clients connecting at once beyond it
had their handshakes dropped and waited a second or more for the kernel to
send their SYN again. These tests stop the server (SIGSTOP), so that it
accepts nothing, open a burst of connections and count the handshakes the
kernel completed for it.
"""

from __future__ import annotations

import selectors
import signal
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tests.wire.conftest import KestrelProcess

BURST = 200


@contextmanager
def stopped(server: KestrelProcess) -> Iterator[None]:
    """The server process stopped (accepting nothing) for the duration."""
    assert server.proc is not None
    server.proc.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        server.proc.send_signal(signal.SIGCONT)


def handshakes_completed(port: int, count: int, within: float) -> int:
    """Open C{count} connections at once; how many complete their handshake within C{within} s."""
    sockets = []
    selector = selectors.DefaultSelector()
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", port))
            sockets.append(sock)
            selector.register(sock, selectors.EVENT_WRITE)
        connected = 0
        pending = len(sockets)
        while pending:
            ready = selector.select(within)
            if not ready:
                break
            for key, _ in ready:
                selector.unregister(key.fileobj)
                pending -= 1
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                    connected += 1
        return connected
    finally:
        selector.close()
        for sock in sockets:
            sock.close()


def still_serves(server: KestrelProcess) -> None:
    """A new connection gets an answer (the burst left the server working)."""
    with server.connect() as client:
        client.sendall(b"version\r\n")
        assert client.recv(100).startswith(b"VERSION ")


def test_default_backlog_holds_a_burst_of_connections(
        kestrel_factory: Callable[..., KestrelProcess]) -> None:
    """By default (1024) every connection of a burst of 200 completes its handshake at once."""
    server = kestrel_factory()
    with stopped(server):
        assert handshakes_completed(server.memcache_port, BURST, within=0.5) == BURST
    still_serves(server)


def test_configured_backlog_is_the_listen_backlog(
        kestrel_factory: Callable[..., KestrelProcess]) -> None:
    """With listen_backlog: 16, a server that accepts nothing holds about 16 connections."""
    server = kestrel_factory(config={"listen_backlog": 16})
    with stopped(server):
        completed = handshakes_completed(server.memcache_port, BURST, within=0.5)
    # Linux queues backlog + 1 completed connections.
    assert 16 <= completed <= 17
    still_serves(server)
