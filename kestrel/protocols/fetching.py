"""
What the meta and binary dialects need of the memcache connection they serve.

L{kestrel.protocols.meta.MetaHandler} and L{kestrel.protocols.binary.BinaryHandler}
translate their requests into the same session calls as the classic text
dialect; they reach the connection only through L{DialectHost}, so neither
imports L{kestrel.protocols.memcache.MemcacheProtocol}, which imports them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime

from kestrel.item import QItem
from kestrel.protocols.memcache_parser import GetRequest

if TYPE_CHECKING:
    from kestrel.server import KestrelServer
    from kestrel.session import ClientSession

__all__ = ["DialectHost", "Fetched"]

#: What L{DialectHost.fetch} returns: an item, None, a refusal's reply, or a Deferred.
Fetched = QItem | None | bytes | Deferred[QItem | None]


class DialectHost(Protocol):
    """The memcache connection a dialect handler serves: its clock, session, server and fetch."""

    clock: IReactorTime
    session: ClientSession | None
    server: KestrelServer

    def fetch(self, req: GetRequest) -> Fetched:
        """Run the queue side of a fetch, as a classic C{get} of C{req} would."""

    def enqueue(self, name: str, data: bytes, exptime: int) -> bool | Deferred[bool]:
        """
        Add C{data} to queue C{name}, as a classic C{set} with C{exptime}
        would: whether it was stored, or a Deferred of it.
        """
