"""
A client that goes away while its read waits, for every protocol and kind of
blocking read: the wait ends at once (FIN: half-close; RST: the connection is
lost), the queue forgets the waiter, and the next item stored stays in the
queue for a live reader. Time is a L{Clock}; transports are in memory.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from twisted.internet.task import Clock

from kestrel.protocols.memcache import MemcacheFactory
from kestrel.protocols.text import TextFactory
from kestrel.protocols.thrift import ThriftFactory
from kestrel.server import KestrelServer
from tests.support import StringClient
from tests.unit.test_queue import value
from tests.unit.test_thrift_protocol import call_frame

READS = {
    "memcache get": (MemcacheFactory, b"get q/t=60000\r\n"),
    "memcache open": (MemcacheFactory, b"get q/open/t=60000\r\n"),
    "memcache monitor": (MemcacheFactory, b"monitor q 60\r\n"),
    "text get": (TextFactory, b"get q 60000\n"),
    "text monitor": (TextFactory, b"monitor q 60000\n"),
    "thrift get": (ThriftFactory, call_frame("get", queue_name="q", max_items=2,
                                              timeout_msec=60000)),
    "thrift get auto-abort": (ThriftFactory, call_frame("get", queue_name="q", max_items=2,
                                                         timeout_msec=60000,
                                                         auto_abort_msec=1000)),
}


@pytest.mark.parametrize("how", ["fin", "rst"])
@pytest.mark.parametrize("read", sorted(READS))
def test_gone_reader_takes_no_item(server: KestrelServer, clock: Clock, tmp_path: Path,
                                   read: str, how: str) -> None:
    factory, request = READS[read]
    queue = server.collection.queue("q")
    client = StringClient(factory(server))
    client.send(request)
    assert queue.waiter_count == 1
    if how == "fin":
        client.protocol.readConnectionLost()
    else:
        client.protocol.connectionLost(None)
    assert queue.waiter_count == 0
    assert value(server.collection.add("q", b"x")) is True
    clock.advance(61)
    assert queue.length == 1 and queue.open_read_count == 0
