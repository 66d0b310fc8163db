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

L{write_now} is how protocols send replies: on a plain TCP connection with
nothing already queued it sends at once, without Twisted's register-for-writing
round trip (see its docstring).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from twisted.internet import tcp
from twisted.internet.interfaces import IHalfCloseableProtocol, ITransport
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

if TYPE_CHECKING:
    from kestrel.server import KestrelServer
    from kestrel.session import ClientSession

__all__ = ["SessionFactory", "SessionProtocol", "write_now"]


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


# -- replies -----------------------------------------------------------------

#: Transports whose socket L{write_now} may send on directly: exactly Twisted's
#: plain TCP connections (subclasses may change how bytes reach the socket).
_DIRECT_SEND_TYPES = frozenset({tcp.Server, tcp.Client})


def write_now(transport: ITransport, data: bytes) -> None:
    """
    Write C{data} to C{transport}: the same promise as C{transport.write}
    (every byte is sent, in order, after everything written before), but sent
    at once when possible.

    Twisted's TCP transport (C{abstract.FileDescriptor.write}) only appends to
    its buffer and registers the socket for writing; a later reactor turn
    calls C{doWrite}, which sends and unregisters it. For a reply to one
    request that costs two C{epoll_ctl} calls and one C{epoll_wait} more than
    the C{send} itself. Here, when the transport is a plain TCP connection
    (not TLS), still connected and neither closing nor aborted, and nothing is
    buffered in it (C{dataBuffer} and C{_tempDataBuffer} are empty), C{data}
    is sent with one C{socket.send}. Whatever the kernel does not take (a partial send, or any
    error: C{EAGAIN}, a reset connection) is handed to C{transport.write}, so
    Twisted buffers it, or finds the error and loses the connection, exactly
    as it would have. Any other transport (TLS, UNIX sockets, test
    transports such as C{StringTransport}) just gets C{transport.write}.
    """
    if transport.__class__ in _DIRECT_SEND_TYPES:
        t: Any = transport
        if (t.connected and not t.TLS and not t.disconnecting and not t._aborting
                and not t.dataBuffer and not t._tempDataLen and not t._writeDisconnecting
                and not t._writeDisconnected and data):
            try:
                sent = t.socket.send(data)
            except OSError:
                sent = 0
            if sent == len(data):
                return
            if sent:
                data = data[sent:]
    transport.write(data)
