"""
A plain read holds its item until the reply carrying it is in the kernel: a
connection lost before then returns the item to the head of its queue.

The connection is a Twisted file-descriptor transport whose "kernel" takes
only C{room} bytes until the test makes room (L{SlowSocket}): what it does
not take stays in Twisted's buffer, as on a real socket whose peer does not
read. Time is a L{Clock}.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from twisted.internet import abstract
from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.internet.protocol import Factory
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactor
from twisted.python.failure import Failure

from kestrel.protocols.memcache import MemcacheFactory
from kestrel.protocols.text import TextFactory
from kestrel.protocols.thrift import ThriftFactory
from kestrel.server import KestrelServer
from tests.unit.test_queue import value
from tests.unit.test_thrift_protocol import call_frame, decode_replies

BIG = b"x" * 100_000


class SlowSocket(abstract.FileDescriptor):
    """A connected transport whose kernel takes C{room} bytes, then nothing until L{drain}."""

    def __init__(self, room: int) -> None:
        super().__init__(reactor=MemoryReactor())
        self.connected = 1
        self.room = room
        self.received = b""

    def writeSomeData(self, data: Any) -> int:  # noqa: N802 - Twisted interface
        taken = min(len(data), self.room)
        self.room -= taken
        self.received += bytes(data[:taken])
        return taken

    def write(self, data: bytes) -> None:
        """Buffer C{data}, and let the kernel take what it has room for now (as a send does)."""
        super().write(data)
        if self.connected and self.room:
            self.doWrite()

    def drain(self, room: int = 1 << 30) -> object:
        """The peer reads: the kernel takes up to C{room} more bytes (one doWrite)."""
        self.room += room
        return self.doWrite()

    def getPeer(self) -> IPv4Address:  # noqa: N802 - Twisted interface
        return IPv4Address("TCP", "127.0.0.1", 40000)

    def getHost(self) -> IPv4Address:  # noqa: N802 - Twisted interface
        return IPv4Address("TCP", "127.0.0.1", 22133)


class Client:
    """A protocol of C{factory} over a L{SlowSocket}."""

    def __init__(self, factory: Factory, room: int = 1 << 30) -> None:
        self.protocol: Any = factory.buildProtocol(None)
        self.transport = SlowSocket(room)
        self.protocol.makeConnection(self.transport)

    def send(self, data: bytes) -> None:
        self.protocol.dataReceived(data)

    def reset(self) -> None:
        """The peer resets the connection."""
        self.transport.connected = 0
        self.protocol.connectionLost(Failure(ConnectionLost()))


def contents(server: KestrelServer, name: str) -> list[bytes]:
    out = []
    while (item := value(server.collection.remove(name))) is not None:
        out.append(item.data)
    return out


@pytest.fixture
def big_queue(server: KestrelServer) -> Any:
    assert value(server.collection.add("big", BIG)) is True
    assert value(server.collection.add("big", b"second")) is True
    return server.collection.queue("big")


def test_reply_in_the_kernel_at_once_confirms_at_once(server: KestrelServer, big_queue) -> None:
    """The usual case: the socket takes the whole reply; the item is gone, nothing stays open."""
    client = Client(MemcacheFactory(server))
    client.send(b"get big\r\n")
    assert client.transport.received.startswith(b"VALUE big 0 100000\r\n")
    assert big_queue.open_read_count == 0 and big_queue.length == 1
    client.reset()
    assert contents(server, "big") == [b"second"]


def test_reset_before_the_reply_left_returns_the_item(server: KestrelServer, big_queue) -> None:
    """2 KiB of a 100 KB reply reach the kernel, then an RST: the item is back at the head."""
    client = Client(MemcacheFactory(server), room=2048)
    client.send(b"get big\r\n")
    assert len(client.transport.received) == 2048
    assert big_queue.open_read_count == 1 and big_queue.length == 1
    client.reset()
    assert big_queue.open_read_count == 0
    assert contents(server, "big") == [BIG, b"second"]


def test_drained_reply_confirms_the_item(server: KestrelServer, big_queue) -> None:
    """Once the peer has read, the transport's buffer empties and the read is confirmed."""
    client = Client(MemcacheFactory(server), room=2048)
    client.send(b"get big\r\n")
    client.transport.drain(50_000)
    assert big_queue.open_read_count == 1
    client.transport.drain()
    assert client.transport.received == b"VALUE big 0 100000\r\n" + BIG + b"\r\nEND\r\n"
    assert big_queue.open_read_count == 0
    client.reset()
    assert contents(server, "big") == [b"second"]


def test_pipelined_gets_go_back_in_order(server: KestrelServer, big_queue) -> None:
    """Two plain gets whose replies did not leave: both return, the first at the head."""
    client = Client(MemcacheFactory(server), room=10)
    client.send(b"get big\r\nget big\r\n")
    assert big_queue.open_read_count == 2 and big_queue.length == 0
    client.reset()
    assert contents(server, "big") == [BIG, b"second"]


def test_waiting_reader_whose_reply_cannot_leave(server: KestrelServer, clock: Clock) -> None:
    """A blocked get woken by a set, on a socket that takes nothing: the reset returns it."""
    client = Client(MemcacheFactory(server), room=0)
    client.send(b"get race/t=5000\r\n")
    assert value(server.collection.add("race", b"item")) is True
    queue = server.collection.queue("race")
    assert queue.open_read_count == 1
    client.reset()
    assert contents(server, "race") == [b"item"]


def test_close_waits_for_the_drain_then_closes(server: KestrelServer, big_queue) -> None:
    """A connection closing with a held reply confirms it as it drains, then closes."""
    client = Client(MemcacheFactory(server), room=2048)
    client.send(b"get big\r\n")
    client.protocol.readConnectionLost()  # (the client sent FIN: close once answered)
    assert client.transport.disconnecting
    assert client.transport.drain() is None
    assert big_queue.open_read_count == 0 and big_queue.length == 1
    assert isinstance(client.transport.doWrite(), ConnectionDone)


def test_thrift_get_without_auto_abort(server: KestrelServer, big_queue) -> None:
    """A thrift get (no auto-abort) whose reply stays buffered: a reset returns its items."""
    client = Client(ThriftFactory(server), room=100)
    client.send(call_frame("get", queue_name="big", max_items=2, timeout_msec=0))
    assert big_queue.open_read_count == 2
    client.reset()
    assert contents(server, "big") == [BIG, b"second"]


def test_thrift_get_drained_is_removed_for_good(server: KestrelServer, big_queue) -> None:
    """The same get whose reply the peer reads: the items are gone."""
    client = Client(ThriftFactory(server), room=100)
    client.send(call_frame("get", queue_name="big", max_items=2, timeout_msec=0))
    client.transport.drain()
    [(api, _mtype, _seqid, items)] = decode_replies(client.transport.received)
    assert api == "get" and [i.data for i in items] == [BIG, b"second"]
    assert big_queue.open_read_count == 0 and big_queue.length == 0


def test_text_implicit_confirm_waits_for_the_reply(server: KestrelServer) -> None:
    """
    Text: the next get confirms the open read before it, but only once that
    read's reply is in the kernel; a reset before returns both items.
    """
    for data in (b"a" * 10_000, b"b" * 10_000):
        assert value(server.collection.add("mid", data)) is True
    queue = server.collection.queue("mid")
    client = Client(TextFactory(server), room=100)
    client.send(b"get mid\nget mid\n")
    assert client.protocol.session.count_open_reads("mid") == 1
    assert queue.open_read_count == 2
    client.reset()
    assert contents(server, "mid") == [b"a" * 10_000, b"b" * 10_000]


def test_text_implicit_confirm_after_the_reply_left(server: KestrelServer, big_queue) -> None:
    """Text: a get after the earlier reply was read confirms the earlier item at once."""
    client = Client(TextFactory(server))
    client.send(b"get big\n")
    client.send(b"get big\n")
    assert big_queue.open_read_count == 1
    client.reset()
    assert contents(server, "big") == [b"second"]


def test_held_reads_of_a_lost_connection_are_not_confirmed_later(
        server: KestrelServer, big_queue, tmp_path: Path) -> None:
    """After a reset, a late drain notice confirms nothing (the items were put back)."""
    client = Client(MemcacheFactory(server), room=10)
    client.send(b"get big\r\n")
    client.reset()
    client.protocol.resumeProducing()
    assert big_queue.open_read_count == 0 and big_queue.length == 2


def test_lone_get_with_other_open_reads_holds_an_open_read(server: KestrelServer,
                                                            big_queue) -> None:
    """
    Another connection's open read on the queue: the lone get cannot leave its
    item at the head (a time-out could move it), so it holds an open read.
    """
    other = Client(MemcacheFactory(server))
    other.send(b"get big/open\r\n")
    assert value(server.collection.add("big", b"third")) is True
    client = Client(MemcacheFactory(server), room=10)
    client.send(b"get big\r\n")
    assert big_queue.open_read_count == 2 and big_queue.length == 1
    client.reset()
    assert big_queue.open_read_count == 1
    other.reset()
    assert contents(server, "big") == [BIG, b"second", b"third"]


def test_lone_get_of_an_expiring_item(server: KestrelServer, clock: Clock) -> None:
    """An item with an expiry (a sweep could drop it) is held as an open read, then confirmed."""
    client = Client(MemcacheFactory(server))
    client.send(b"set e 0 3600 1\r\nx\r\n")
    client.send(b"get e\r\n")
    assert client.transport.received.endswith(b"VALUE e 0 1\r\nx\r\nEND\r\n")
    queue = server.collection.queue("e")
    assert queue.open_read_count == 0 and queue.length == 0
    assert queue.transactions == 0


def test_plain_gets_count_no_transactions(server: KestrelServer, big_queue) -> None:
    """Held or not, a plain get is no client transaction; it is one hit."""
    client = Client(MemcacheFactory(server), room=10)
    client.send(b"get big\r\nget big\r\n")  # (pipelined: held as open reads)
    client.transport.drain()
    assert big_queue.transactions == 0 and big_queue.open_read_count == 0
    assert server.stats.get_hits == 2 and big_queue.length == 0


def test_item_no_longer_at_the_head_is_not_taken(server: KestrelServer, big_queue) -> None:
    """A peeked item another reader took before the reply was written: nothing more is taken."""
    session = server.new_session("memcache")
    held = session.held_reads
    item = held.peek_for_reply("big")
    assert item is not None and item.data == BIG
    assert value(server.collection.remove("big")).data == BIG
    assert held.written(in_kernel=True) is False
    assert contents(server, "big") == [b"second"]
    session.finish()


def test_peeked_item_of_a_lost_connection_stays_queued(server: KestrelServer,
                                                       big_queue) -> None:
    """A peeked item whose reply was never written is still at the head when the session ends."""
    session = server.new_session("memcache")
    assert session.held_reads.peek_for_reply("big") is not None
    session.finish()
    assert big_queue.open_read_count == 0
    assert contents(server, "big") == [BIG, b"second"]


def test_write_now_tells_whether_the_kernel_has_everything() -> None:
    """write_now: True once every byte written is in the kernel, False while some wait."""
    from twisted.internet.testing import StringTransport

    from kestrel.protocols.base import write_now

    sock = SlowSocket(room=4)
    assert write_now(sock, b"abcdefgh") is False
    sock.drain()
    assert write_now(sock, b"ij") is True
    assert sock.received == b"abcdefghij"
    sock.connected = 0
    assert write_now(sock, b"lost") is False
    assert write_now(StringTransport(), b"x") is True
