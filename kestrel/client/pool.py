"""
Connections pooled per server.

A connection is lent to one operation at a time: a put or get gives it back
when its reply arrives; a reliable read keeps it until its handle is
confirmed or aborted (open reads belong to a connection on memcache). A
connection that failed in any way is never given back; the pool forgets it
when it closes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Union, cast

from twisted.internet.defer import Deferred
from twisted.internet.protocol import Factory

from kestrel.client.memcache import MemcacheConnection

if TYPE_CHECKING:
    from kestrel.client.thrift import ThriftConnection

#: A connection of either protocol (the same operations).
Connection = Union[MemcacheConnection, "ThriftConnection"]

#: Builds a connected connection to a server named C{host:port}.
Connector = Callable[[str], Deferred[Connection]]


def split_address(server: str) -> tuple[str, int]:
    """C{host:port} (or C{[v6]:port}) as C{(host, port)}."""
    host, _, port = server.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"expected host:port, got {server!r}")
    return host.strip("[]"), int(port)


def tcp_connector(reactor: Any, connect_timeout: float = 3.0, reply_timeout: float = 5.0,
                  protocol: str = "memcache", auto_abort: float = 30.0) -> Connector:
    """
    A L{Connector} opening TCP connections with C{reactor}, each wait bounded,
    speaking C{protocol} (C{memcache} or C{thrift}; C{auto_abort} seconds is
    the auto-abort of thrift reliable reads).
    """
    from twisted.internet.endpoints import HostnameEndpoint

    def build(server: str) -> Connection:
        if protocol == "thrift":
            from kestrel.client.thrift import ThriftConnection

            return ThriftConnection(server, reactor, reply_timeout, int(auto_abort * 1000))
        return MemcacheConnection(server, reactor, reply_timeout)

    def connect(server: str) -> Deferred[Connection]:
        host, port = split_address(server)
        endpoint = HostnameEndpoint(reactor, host, port, timeout=connect_timeout)
        # The factory builds only Connections, so the protocol it fires with is one.
        return cast("Deferred[Connection]",
                    endpoint.connect(Factory.forProtocol(lambda: build(server))))

    return connect


class Pool:
    """
    Idle connections per server, at most C{max_idle} kept for each.

    C{acquire} lends an idle live connection or opens a new one;
    C{release} takes back a connection that is live and has nothing pending;
    C{discard} closes one.
    """

    def __init__(self, connector: Connector, max_idle: int = 8) -> None:
        self.connector = connector
        self.max_idle = max_idle
        self._idle: dict[str, list[Connection]] = {}

    def acquire(self, server: str) -> Deferred[Connection]:
        """Lend a connection to C{server} (fails like the connect does)."""
        idle = self._idle.get(server)
        while idle:
            conn = idle.pop()
            if conn.alive and conn.idle:
                d: Deferred[Connection] = Deferred()
                d.callback(conn)
                return d
        return self.connector(server)

    def release(self, conn: Connection) -> None:
        """Take back C{conn} for reuse, or close it when it cannot be reused."""
        idle = self._idle.setdefault(conn.server, [])
        idle[:] = [c for c in idle if c.alive]
        if conn.alive and conn.idle and len(idle) < self.max_idle and conn not in idle:
            idle.append(conn)
        else:
            self.discard(conn)

    def discard(self, conn: Connection) -> None:
        """Close C{conn} (anything it held open is returned by the server)."""
        conn.close()

    def forget_server(self, server: str) -> None:
        """Close every idle connection to C{server} (it left the fleet)."""
        for conn in self._idle.pop(server, []):
            conn.close()

    def idle_count(self, server: str) -> int:
        """How many idle connections to C{server} are kept."""
        return len(self._idle.get(server, []))

    def close(self) -> None:
        """Close every idle connection."""
        for server in list(self._idle):
            self.forget_server(server)
