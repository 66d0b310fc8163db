"""
The fleet client over thrift (real servers' thrift protocol, in-memory transports,
a Clock): puts, reliable reads with ids and auto-abort, and the waiter race,
where a losing waiter is left to answer and its item aborted on arrival.
"""

from __future__ import annotations

import random

import pytest
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransportWithDisconnection

from kestrel.client import KestrelClient
from kestrel.client.errors import HandleClosed, ServerRefused
from kestrel.client.thrift import ThriftConnection
from kestrel.status import Status
from tests.client.conftest import Net, resolved

A, B = "a:2229", "b:2229"


def thrift_fleet(net: Net, *names: str) -> KestrelClient:
    net.protocol = "thrift"
    for name in names:
        net.add(name)
    return KestrelClient(list(names), reactor=net.clock, connector=net.connector(),
                         rand=random.Random(3), protocol="thrift")


def settle(net: Net, d):  # type: ignore[no-untyped-def]
    net.pump()
    return resolved(d)


def test_put_read_confirm_over_thrift(net: Net) -> None:
    client = thrift_fleet(net, A, B)
    servers = settle(net, client.put("q", [b"1", b"2", b"3"]))
    assert len(servers) == 3
    handle = settle(net, client.read("q"))
    assert handle.xid > 0 and handle.data in (b"1", b"2", b"3")
    assert net.queue(handle.server, "q").open_read_count == 1
    settle(net, handle.confirm())
    assert net.queue(handle.server, "q").open_read_count == 0
    assert settle(net, client.get("q")) is not None


def test_unconfirmed_thrift_read_auto_aborts_and_confirm_says_so(net: Net) -> None:
    client = thrift_fleet(net, A)
    net.servers[A].collection.add("q", b"x")
    handle = settle(net, client.read("q"))
    net.run(10.1)  # the connector's auto-abort is 10 s
    assert net.queue(A, "q").memory_length == 1
    with pytest.raises(HandleClosed, match="auto-aborted"):
        settle(net, handle.confirm())


def test_thrift_race_loser_is_aborted_on_arrival(net: Net) -> None:
    client = thrift_fleet(net, A, B)
    d = client.read("q", timeout=5.0)
    net.run(0.1)
    net.servers[A].collection.add("q", b"from A")
    net.pump()
    handle = resolved(d)
    assert handle.server == A
    # B's waiter is still there (closing would not return an item on thrift) ...
    assert net.queue(B, "q").waiter_count == 1
    net.servers[B].collection.add("q", b"from B")
    net.pump()
    # ... and the item it caught is given back at once.
    assert net.queue(B, "q").open_read_count == 0
    assert net.queue(B, "q").memory_length == 1
    settle(net, handle.confirm())


def test_thrift_refusal_moves_the_put_on(net: Net) -> None:
    client = thrift_fleet(net, A, B)
    net.servers[A].status.set_status(Status.READ_ONLY)
    for i in range(10):
        assert settle(net, client.put("q", b"%d" % i)) == [B]
    assert client.health.failures(A) == 1


def test_thrift_connection_reports_application_errors() -> None:
    conn = ThriftConnection("s:1", Clock())
    transport = StringTransportWithDisconnection()
    transport.protocol = conn
    conn.makeConnection(transport)
    d = conn.put_item("q", b"x")
    from thriftpy2.protocol.binary import TBinaryProtocol
    from thriftpy2.thrift import TApplicationException, TMessageType
    from thriftpy2.transport.memory import TMemoryBuffer
    buf = TMemoryBuffer()
    proto = TBinaryProtocol(buf)
    proto.write_message_begin("put", TMessageType.EXCEPTION, 1)
    TApplicationException(6, "Server not available for operation setItem").write(proto)
    proto.write_message_end()
    body = buf.getvalue()
    conn.dataReceived(len(body).to_bytes(4, "big") + body)
    with pytest.raises(ServerRefused, match="not available"):
        resolved(d)
    assert not transport.connected
