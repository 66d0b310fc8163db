"""
The connection life every protocol shares (kestrel.protocols.base), checked
on the memcache, text and thrift factories alike over StringTransports.
"""

from __future__ import annotations

import pytest

from kestrel.protocols.base import SessionFactory
from kestrel.protocols.memcache import MemcacheFactory
from kestrel.protocols.text import TextFactory
from kestrel.protocols.thrift import ThriftFactory
from kestrel.server import KestrelServer
from tests.support import StringClient

FACTORIES = [MemcacheFactory, TextFactory, ThriftFactory]


@pytest.mark.parametrize("factory_class", FACTORIES)
def test_connections_are_tracked_until_lost(server: KestrelServer,
                                            factory_class: type[SessionFactory]) -> None:
    """A made connection is tracked with an open session; once lost, neither remains."""
    factory = factory_class(server)
    client = StringClient(factory)
    assert factory.connections == {client.protocol}
    assert client.protocol.session.protocol_name == factory_class.protocol.protocol_name
    assert server.stats.curr_connections == 1
    client.close()
    assert factory.connections == set()
    assert client.protocol.session.finished
    assert server.stats.curr_connections == 0


@pytest.mark.parametrize("factory_class", FACTORIES)
def test_disconnect_all_finishes_each_session_once(server: KestrelServer,
                                                   factory_class: type[SessionFactory]) -> None:
    """disconnect_all ends every session; the connection loss that follows counts nothing twice."""
    factory = factory_class(server)
    clients = [StringClient(factory), StringClient(factory)]
    assert server.stats.curr_connections == 2
    factory.disconnect_all()
    assert factory.connections == set()
    assert all(c.protocol.session.finished for c in clients)
    assert all(c.transport.disconnected and not c.connected for c in clients)
    assert server.stats.curr_connections == 0
    for c in clients:
        c.protocol.connectionLost(None)
    assert server.stats.curr_connections == 0


@pytest.mark.parametrize("factory_class", FACTORIES)
def test_half_close_with_nothing_waiting_closes(server: KestrelServer,
                                               factory_class: type[SessionFactory]) -> None:
    """EOF from a client with no request waiting closes the connection."""
    client = StringClient(factory_class(server))
    client.protocol.readConnectionLost()
    assert not client.connected
