"""
An in-memory network of real Kestrel servers for the client unit tests.

Each server is a real L{KestrelServer} (queues, journals in a temporary
folder, memcache protocol) on the test's C{Clock}; each client connection is
a pair of string transports that L{Net.pump} moves bytes across, so the
client's protocol talks to the server's protocol byte for byte, with no
sockets and no real time. A server can refuse connections (C{down}), or
accept them and never answer a connect (C{hang}); a closed side closes the
other once its last bytes are delivered, as TCP would.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.defer import Deferred, fail
from twisted.internet.error import ConnectionDone, ConnectionRefusedError
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransportWithDisconnection
from twisted.python.failure import Failure

from kestrel.client import Backoff, KestrelClient
from kestrel.client.errors import RequestTimeout
from kestrel.client.memcache import MemcacheConnection
from kestrel.client.thrift import ThriftConnection
from kestrel.protocols.memcache import MemcacheFactory
from kestrel.protocols.thrift import ThriftFactory
from kestrel.server import KestrelServer
from tests.support import make_server

EPOCH = 1_767_225_600.0


class PipeEnd(StringTransportWithDisconnection):
    """One end of an in-memory connection; closing it is seen by the peer at the next pump."""

    def __init__(self) -> None:
        super().__init__()
        self.peer: PipeEnd | None = None
        self.closed = False

    def loseConnection(self) -> None:  # noqa: N802 - Twisted API
        """Close this end now (its protocol is told at once)."""
        if self.connected:
            self.closed = True
            self.connected = False
            self.protocol.connectionLost(Failure(ConnectionDone("closed")))


class Link:
    """A client protocol and a server protocol joined by two PipeEnds."""

    def __init__(self, client: Any, server: Any, muted: Any = lambda: False) -> None:
        self.muted = muted
        self.client_end, self.server_end = PipeEnd(), PipeEnd()
        self.client_end.peer, self.server_end.peer = self.server_end, self.client_end
        self.client, self.server = client, server
        self.client_end.protocol, self.server_end.protocol = client, server
        server.makeConnection(self.server_end)
        client.makeConnection(self.client_end)

    def pump(self) -> bool:
        """Move pending bytes both ways and propagate closes; True if anything happened."""
        moved = False
        for src, dst in ((self.client_end, self.server_end), (self.server_end, self.client_end)):
            data = src.value()
            if data:
                src.clear()
                moved = True
                if dst.connected and not (src is self.server_end and self.muted()):
                    dst.protocol.dataReceived(data)
        for src, dst in ((self.client_end, self.server_end), (self.server_end, self.client_end)):
            if src.closed and dst.connected and not src.value():
                dst.loseConnection()
                moved = True
        return moved

    @property
    def open(self) -> bool:
        return self.client_end.connected or self.server_end.connected


class Net:
    """Real servers by name (C{host:port}), and a connector for the client under test."""

    def __init__(self, clock: Clock, base: Path) -> None:
        self.clock = clock
        self.base = base
        self.servers: dict[str, KestrelServer] = {}
        self.factories: dict[str, MemcacheFactory] = {}
        self.links: list[Link] = []
        self.refusing: set[str] = set()
        self.hanging: set[str] = set()
        self.connects: list[str] = []
        self.muted: set[str] = set()
        self.protocol = "memcache"
        self.thrift_factories: dict[str, Any] = {}

    def add(self, name: str, yaml: str = "") -> KestrelServer:
        server = make_server(self.clock, self.base / name.replace(":", "_"), yaml)
        self.servers[name] = server
        self.factories[name] = MemcacheFactory(server)
        self.thrift_factories[name] = ThriftFactory(server)
        return server

    def connector(self, reply_timeout: float = 5.0, connect_timeout: float = 3.0) -> Any:
        def connect(name: str) -> Deferred[MemcacheConnection]:
            self.connects.append(name)
            if name in self.refusing or name not in self.servers:
                return fail(ConnectionRefusedError(name))
            if name in self.hanging:
                d: Deferred[MemcacheConnection] = Deferred()
                self.clock.callLater(connect_timeout, lambda: d.called or d.errback(
                    RequestTimeout(f"{name}: connect timed out")))
                return d
            if self.protocol == "thrift":
                client: Any = ThriftConnection(name, self.clock, reply_timeout, 10_000)
                server = self.thrift_factories[name].buildProtocol(None)
            else:
                client = MemcacheConnection(name, self.clock, reply_timeout)
                server = self.factories[name].buildProtocol(None)
            self.links.append(Link(client, server, lambda: name in self.muted))
            connected: Deferred[Any] = Deferred()
            connected.callback(client)
            return connected

        return connect

    def pump(self) -> None:
        """Deliver bytes until nothing moves (replies of muted servers are lost)."""
        while any([link.pump() for link in self.links]):
            pass
        self.links = [link for link in self.links if link.open]

    def run(self, seconds: float, step: float = 0.01) -> None:
        """Advance the clock by C{seconds} in steps, pumping between them."""
        self.pump()
        end = self.clock.seconds() + seconds
        while self.clock.seconds() < end - 1e-9:
            self.clock.advance(min(step, end - self.clock.seconds()))
            self.pump()

    def down(self, name: str) -> None:
        """Refuse new connections to C{name} and drop the open ones."""
        self.refusing.add(name)
        for link in self.links:
            if link.client.server == name:
                link.server_end.loseConnection()
        self.pump()

    def mute(self, name: str) -> None:
        """C{name} keeps its connections but its replies never arrive."""
        self.muted.add(name)

    def up(self, name: str) -> None:
        self.refusing.discard(name)
        self.hanging.discard(name)

    def queue(self, name: str, queue: str) -> Any:
        q = self.servers[name].collection.queue(queue)
        assert q is not None
        return q

    def items(self, name: str, queue: str) -> int:
        """Items on C{queue} at C{name}, including open (reserved) ones."""
        q = self.queue(name, queue)
        return q.memory_length + q.open_read_count

    def close(self) -> None:
        for server in self.servers.values():
            server.collection.stopService()


def resolved(d: Deferred[Any]) -> Any:
    """The result of a Deferred that has fired (raises its failure)."""
    results: list[Any] = []
    d.addBoth(results.append)
    assert results, "the Deferred has not fired"
    if isinstance(results[0], Failure):
        results[0].raiseException()
    return results[0]


@pytest.fixture
def net(clock: Clock, tmp_path: Path) -> Iterator[Net]:
    n = Net(clock, tmp_path)
    yield n
    n.close()


def make_client(net: Net, names: list[str], seed: int = 7, **options: Any) -> KestrelClient:
    """A client over the named servers of C{net}, on its clock, with a seeded random source."""
    return KestrelClient(names, reactor=net.clock,
                         connector=net.connector(options.pop("reply_timeout", 5.0)),
                         rand=random.Random(seed),
                         backoff=options.pop("backoff", Backoff(base=1.0, cap=8.0, jitter=0.5)),
                         **options)
