"""
Bounded memory under hostile clients, measured on a real server process: RSS
before, during and after 16 x 63 MiB declared memcache sets, 63 MiB text
lines, and clients that pipeline large reads and never read the replies.
The figures of docs/reliability.md come from benchmarks/hostile_memory.py,
which runs the same scenarios.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import pytest

from tests.wire.conftest import KestrelProcess, LineClient
from tests.wire.hostile import (
    MiB,
    close_all,
    declared_set,
    long_line,
    non_readers,
    run_senders,
    settled_rss,
)

#: "Memory is returned": RSS after the clients close is within this factor of before.
RETURNED = 1.10


def pid(server: KestrelProcess) -> int:
    assert server.proc is not None
    return server.proc.pid


def store_item(server: KestrelProcess, name: bytes, size: int) -> None:
    client = LineClient(server.connect())
    client.send(b"set %s 0 0 %d\r\n%s\r\n" % (name, size, b"y" * size))
    assert client.line() == b"STORED\r\n"
    client.close()


def test_declared_sets_are_bounded_and_returned(
        kestrel_factory: Callable[..., KestrelProcess]) -> None:
    """16 x 63 MiB of 64 MiB sets: most refused before being read; RSS comes back."""
    server = kestrel_factory(protocols=("memcache",))
    before = settled_rss(pid(server), 0.5)
    sockets, outcomes = run_senders(lambda: server.connect("memcache", 120),
                                    [declared_set(64 * MiB, 63 * MiB, b"big%d" % i)
                                     for i in range(16)])
    during = settled_rss(pid(server), 0.5)
    # 256 MiB of max_client_memory holds three 64 MiB declared sets.
    assert outcomes.count("refused") == 13, outcomes
    assert during - before < 256 * MiB
    close_all(sockets)
    after = settled_rss(pid(server), 1.0)
    assert after <= before * RETURNED, (before, during, after)
    store_item(server, b"small", 10)


def test_refused_set_gets_its_reason(kestrel_factory: Callable[..., KestrelProcess]) -> None:
    """The set that does not fit is answered SERVER_ERROR (before its data) and closed."""
    server = kestrel_factory(protocols=("memcache",),
                             config={"max_request_size": "8MiB", "max_client_memory": "10MiB"})
    first = server.connect("memcache")
    first.sendall(b"set a 0 0 %d\r\n" % (8 * MiB) + b"x" * MiB)
    time.sleep(0.3)
    client = LineClient(server.connect("memcache"))
    client.send(b"set b 0 0 %d\r\n" % (4 * MiB))
    assert client.line() == (b"SERVER_ERROR out of memory for client requests "
                             b"(max_client_memory); retry\r\n")
    assert client.closed()
    first.close()
    time.sleep(0.3)
    store_item(server, b"b", 4 * MiB)


def test_long_text_lines_are_bounded_and_returned(
        kestrel_factory: Callable[..., KestrelProcess]) -> None:
    """Four 63 MiB text lines with a 100 MiB budget: two are refused; RSS comes back."""
    server = kestrel_factory(protocols=("text",), config={"max_client_memory": "100MiB"})
    before = settled_rss(pid(server), 0.5)
    sockets, outcomes = run_senders(lambda: server.connect("text", 120),
                                    [long_line(63 * MiB) for _ in range(4)])
    during = settled_rss(pid(server), 0.5)
    assert outcomes.count("refused") >= 2, outcomes
    assert during - before < 200 * MiB
    close_all(sockets)
    after = settled_rss(pid(server), 1.0)
    assert after <= before * RETURNED, (before, during, after)


def test_clients_that_do_not_read_stop_being_served(
        kestrel_factory: Callable[..., KestrelProcess]) -> None:
    """
    5 clients per protocol pipeline 60 peeks of a 1 MiB item and never read:
    the server holds about one reply each, serves others meanwhile, and gives
    the memory back when they close.
    """
    server = kestrel_factory(protocols=("memcache", "text"))
    store_item(server, b"one", MiB)
    before = settled_rss(pid(server), 0.5)
    sockets = non_readers(lambda: server.connect("memcache"), b"get one/peek\r\n", 60, 5)
    sockets += non_readers(lambda: server.connect("text"), b"peek one\n", 60, 5)
    time.sleep(2.0)
    during = settled_rss(pid(server), 0.5)
    assert during - before < 60 * MiB, (before, during)
    client = LineClient(server.connect())
    client.send(b"version\r\n")
    assert client.line().startswith(b"VERSION ")
    client.close()
    close_all(sockets)
    after = settled_rss(pid(server), 1.0)
    assert after <= before * RETURNED, (before, during, after)


@pytest.mark.parametrize("protocol", ["memcache", "text"])
def test_a_slow_reader_gets_every_reply(kestrel_factory: Callable[..., KestrelProcess],
                                        protocol: str) -> None:
    """Back-pressure loses nothing: a client that reads late gets all 60 replies, in full."""
    server = kestrel_factory(protocols=("memcache", "text"))
    store_item(server, b"one", MiB)
    sock = server.connect(protocol, timeout=30)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    client = LineClient(sock)
    if protocol == "memcache":
        client.send(b"get one/peek\r\n" * 60 + b"version\r\n")
    else:
        client.send(b"peek one\n" * 60 + b"version\n")
    time.sleep(1.0)
    for _ in range(60):
        if protocol == "memcache":
            assert client.line() == b"VALUE one/peek 0 %d\r\n" % MiB
            assert client.exactly(MiB + 2) == b"y" * MiB + b"\r\n"
            assert client.line() == b"END\r\n"
        else:
            assert client.line() == b":" + b"y" * MiB + b"\n"
    last = client.line()
    if protocol == "memcache":
        assert last.startswith(b"VERSION ")
    else:
        assert last.startswith(b":") and last.endswith(b"\n") and len(last) < 100
    client.close()
