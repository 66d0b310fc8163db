"""
A client for one Kestrel server or a fleet of them, on Twisted (see docs/fleet.md).

    from kestrel.client import KestrelClient

    client = KestrelClient(["10.0.0.1:22133", "10.0.0.2:22133"])
    servers = yield client.put("jobs", [b"one", b"two"])
    handle = yield client.read("jobs", timeout=1.0)
    if handle is not None:
        yield handle.confirm()

L{kestrel.client.blocking} wraps it for code that does not run a reactor.
"""

from kestrel.client.discovery import (
    ServerSet,
    StaticServers,
    ZooKeeperServers,
    parse_servers,
    parse_zookeeper,
)
from kestrel.client.errors import (
    AllServersFailed,
    ClientError,
    ConnectionGone,
    HandleClosed,
    NoServers,
    ProtocolError,
    RequestTimeout,
    ServerRefused,
)
from kestrel.client.fleet import KestrelClient, ReadHandle
from kestrel.client.health import Backoff, Health
from kestrel.client.stream import ReadStream

__all__ = [
    "AllServersFailed", "Backoff", "ClientError", "ConnectionGone", "HandleClosed", "Health",
    "KestrelClient", "NoServers", "ProtocolError", "ReadHandle", "ReadStream", "RequestTimeout",
    "ServerRefused", "ServerSet", "StaticServers", "ZooKeeperServers", "parse_servers",
    "parse_zookeeper",
]
