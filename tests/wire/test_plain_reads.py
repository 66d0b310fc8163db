"""
A plain read whose reply never reaches the client loses nothing, against a
real server process over real sockets (decisions.md: a plain get whose reply
is never written goes back to the head).

- A reader with a 2 KiB receive buffer asks for a 6 MiB item and never
  reads; it resets (SO_LINGER 0) with most of the reply still in the
  server: the item is back at the head. Memcache and thrift (a get without
  auto-abort).
- Readers block in a plain get and reset just before the item they wait
  for is set: every item set is still there for a live reader.
"""

from __future__ import annotations

import signal
import socket
import struct
import time
from collections.abc import Callable

import pytest

from tests.chaos.clients import MemcacheClient, ThriftClient
from tests.chaos.harness import waiters
from tests.wire.conftest import KestrelProcess

BIG = 6 * 1024 * 1024


@pytest.fixture(scope="module")
def server(kestrel_factory: Callable[..., KestrelProcess]) -> KestrelProcess:
    return kestrel_factory(protocols=("memcache", "thrift"))


def stat(server: KestrelProcess, queue: str, name: str) -> int:
    """One counter of C{queue}'s memcache C{dump_stats}."""
    client = MemcacheClient(server.host, server.ports["memcache"])
    try:
        client.sock.sendall(b"dump_stats %s\r\n" % queue.encode())
        value = 0
        while (line := client._line()) != b"END":
            key, _, number = line.strip().partition(b"=")
            if key == name.encode():
                value = int(number)
        return value
    finally:
        client.close()


def wait_until(check: Callable[[], bool], what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def tiny_reader(server: KestrelProcess, protocol: str) -> socket.socket:
    """A connection whose receive buffer is 2 KiB (set before connecting), never read."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    sock.settimeout(10)
    sock.connect((server.host, server.ports[protocol]))
    return sock


def reset(sock: socket.socket) -> None:
    """Vanish with an RST: linger 0, then close."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def payload(tag: bytes) -> bytes:
    return (tag * (BIG // len(tag) + 1))[:BIG]


def test_memcache_reply_stuck_in_the_server_goes_back(server: KestrelProcess) -> None:
    """6 MiB to a reader with a 2 KiB buffer, then an RST: the item is still in the queue."""
    queue = "big_memcache"
    reader = tiny_reader(server, "memcache")
    reader.sendall(b"get %s/t=2000\r\n" % queue.encode())
    wait_until(lambda: waiters(server, queue) == 1, "the reader never waited")
    producer = MemcacheClient(server.host, server.ports["memcache"], timeout=30)
    data = payload(b"big-item")
    assert producer.set(queue, data)
    wait_until(lambda: stat(server, queue, "items") == 0, "the reader never got the item")
    reset(reader)
    wait_until(lambda: stat(server, queue, "open_transactions") == 0
               and stat(server, queue, "items") == 1, "the item did not come back")
    assert producer.get(queue) == data
    assert producer.get(queue) is None
    producer.close()


def test_thrift_reply_stuck_in_the_server_goes_back(server: KestrelProcess) -> None:
    """A thrift get (no auto-abort) of 6 MiB to a 2 KiB reader, then an RST: nothing lost."""
    queue = "big_thrift"
    producer = MemcacheClient(server.host, server.ports["memcache"], timeout=30)
    data = payload(b"thrift-item")
    assert producer.set(queue, data)
    assert producer.set(queue, b"second")
    reader = ThriftClient(server.host, server.ports["thrift"])
    reader.sock.close()
    sock = tiny_reader(server, "thrift")
    reader.sock = sock
    reader.send_call("get", queue_name=queue, max_items=2, timeout_msec=0, auto_abort_msec=0)
    wait_until(lambda: stat(server, queue, "items") == 0, "the get never took the items")
    reset(sock)
    wait_until(lambda: stat(server, queue, "items") == 2, "the items did not come back")
    assert producer.get(queue) == data
    assert producer.get(queue) == b"second"
    producer.close()


def test_waiting_readers_reset_just_before_the_set(server: KestrelProcess) -> None:
    """
    Forty plain readers each wait, then reset just as their item is set:
    the server (stopped meanwhile) finds the set first and the reset second
    in one reactor turn, so it hands the item to a connection already gone.
    Every item must still be there for a live reader.
    """
    producer = MemcacheClient(server.host, server.ports["memcache"])
    rounds = 40
    for i in range(rounds):
        queue = f"race{i:02d}"
        reader = MemcacheClient(server.host, server.ports["memcache"])
        reader.send_get(queue, "/t=5000")
        wait_until(lambda q=queue: waiters(server, q) == 1, "the reader never waited")
        server.signal(signal.SIGSTOP)
        try:
            producer.sock.sendall(b"set %s 0 0 6\r\nitem%02d\r\n" % (queue.encode(), i))
            time.sleep(0.002)
            reader.reset()
            time.sleep(0.002)
        finally:
            server.signal(signal.SIGCONT)
        assert producer._line() == b"STORED"
    got = []
    for i in range(rounds):
        queue = f"race{i:02d}"
        wait_until(lambda q=queue: stat(server, q, "open_transactions") == 0, "a read stayed open")
        got.append(producer.get(queue))
    assert got == [b"item%02d" % i for i in range(rounds)]
    producer.close()
