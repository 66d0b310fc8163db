"""
What every wire protocol shares: one session per connection, half-close
handling, and a factory that tracks its live connections.

L{SessionProtocol} opens a L{kestrel.session.ClientSession} when the
connection is made and finishes it (once) when the connection ends or the
server stops. A client that half-closes (sends its requests, then EOF, as
C{nc -N} does) still gets the reply to everything it sent: the connection
closes once no request is waiting. L{SessionFactory} builds one protocol per
connection over a L{kestrel.server.KestrelServer} and can end them all
(L{SessionFactory.disconnect_all}) before the journals close.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from twisted.internet.interfaces import IHalfCloseableProtocol
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

if TYPE_CHECKING:
    from kestrel.server import KestrelServer
    from kestrel.session import ClientSession

__all__ = ["SessionFactory", "SessionProtocol"]


@implementer(IHalfCloseableProtocol)
class SessionProtocol(Protocol):
    """
    A connection served through its own L{ClientSession}.

    Subclasses set L{protocol_name}, serve requests, and override the hooks
    L{session_started} (after the session opens), L{stop_answering} (the
    connection is ending: drop buffered input, cancel timers) and
    L{is_answering} (whether a request is still waiting for its reply).
    """

    _log = Logger()

    #: The wire protocol's name, given to the session (for its log lines).
    protocol_name: ClassVar[str] = "unnamed"

    factory: SessionFactory | None = None

    def __init__(self, server: KestrelServer) -> None:
        self.server = server
        self.session: ClientSession | None = None
        self._read_closed = False
        self._session_ended = False

    # -- connection life ---------------------------------------------------

    def connectionMade(self) -> None:
        """Track this connection and open its session."""
        if self.factory is not None:
            self.factory.connections.add(self)
        self.session = self.server.new_session(self.protocol_name)
        self.session_started()

    def connectionLost(self, reason: Failure | None = None) -> None:
        """End the session: memcache/text open reads go back to their queues."""
        self.end_session()

    def readConnectionLost(self) -> None:  # noqa: N802 - Twisted hook
        """The client will send nothing more: answer what it sent, then close."""
        self._read_closed = True
        if self.session is not None:
            # Waiting reads end now with no item: the client may be gone (docs/reliability.md).
            self.session.end_waits()
        if not self.is_answering():
            self.close_connection()

    def writeConnectionLost(self) -> None:  # noqa: N802 - Twisted hook
        """The client no longer reads: close."""
        self.close_connection()

    def close_connection(self) -> None:
        """Close the connection once the replies already written are sent."""
        self.transport.loseConnection()

    def end_session(self) -> None:
        """
        Stop answering and finish the session; safe to call twice.

        Used when the connection ends and by a stopping server
        (L{SessionFactory.disconnect_all}).
        """
        if self._session_ended:
            return
        self._session_ended = True
        self.stop_answering()
        if self.factory is not None:
            self.factory.connections.discard(self)
        if self.session is not None:
            try:
                self.session.finish()
            except Exception:
                self._log.failure("Finishing a {protocol} session failed",
                                  protocol=self.protocol_name)

    # -- hooks ---------------------------------------------------------------

    def session_started(self) -> None:
        """Called once the session is open; the default does nothing."""

    def stop_answering(self) -> None:
        """Called once when the session ends, before it finishes; the default does nothing."""

    def is_answering(self) -> bool:
        """Whether a request is still waiting for its reply (the default: never)."""
        return False


class SessionFactory(Factory):
    """
    Builds a L{protocol} per connection over one L{KestrelServer}, and tracks
    the live ones so that a stopping server can end them (L{disconnect_all}).
    """

    protocol: type[SessionProtocol] = SessionProtocol

    def __init__(self, server: KestrelServer) -> None:
        self.server = server
        self.connections: set[SessionProtocol] = set()

    def buildProtocol(self, addr: Any) -> SessionProtocol:
        """Return the protocol of a new connection, tracked once it is made."""
        protocol = self.protocol(self.server)
        protocol.factory = self
        return protocol

    def disconnect_all(self) -> None:
        """End every live session now (open reads return to their queues) and drop them."""
        for protocol in list(self.connections):
            protocol.end_session()
            if protocol.transport is not None:
                protocol.transport.abortConnection()
        self.connections.clear()
