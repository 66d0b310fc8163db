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

L{write_now} is how replies are sent: on a plain TCP connection with
nothing already queued it sends at once, without Twisted's register-for-writing
round trip (see its docstring), and it tells whether every byte is in the
kernel. Protocols send replies with L{SessionProtocol.write_reply}, which
confirms the session's plain reads once their reply is in the kernel
(docs/reliability.md).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, ClassVar

from twisted.internet import abstract, tcp
from twisted.internet.interfaces import (
    IConsumer,
    IHalfCloseableProtocol,
    IPushProducer,
    ITransport,
)
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from kestrel.budget import TRIM_AFTER

if TYPE_CHECKING:
    from kestrel.server import KestrelServer
    from kestrel.session import ClientSession

__all__ = [
    "HTTP_REFUSED", "IConnectionTransport", "SessionFactory", "SessionProtocol",
    "looks_like_http", "write_now",
]

#: An HTTP/1.x request line: a known method and a path, or any word, target and version.
_HTTP_REQUEST_LINE = re.compile(
    rb"(?:GET|POST|PUT|HEAD|DELETE|OPTIONS|PATCH|CONNECT|TRACE|PRI) (?:/|\*|https?://)"
    rb"|[A-Z]+ \S+ HTTP/[0-9]")

#: The reason given, in each protocol's error form, when an HTTP request is refused.
HTTP_REFUSED = "HTTP requests are not served on this port"


def looks_like_http(line: bytes) -> bool:
    """
    Whether C{line} (a request line without its line end) is an HTTP request
    line: C{GET /}, C{POST /x HTTP/1.1}, C{CONNECT host:443 HTTP/1.1}, ...

    No Kestrel command starts with an upper-case HTTP method followed by a
    path, so a real client's first line is never taken for one.
    """
    return _HTTP_REQUEST_LINE.match(line) is not None


class IConnectionTransport(ITransport, IConsumer, IPushProducer):
    """
    What a L{SessionProtocol} uses of its transport: Twisted's TCP, UNIX and
    TLS connections provide it. Besides L{ITransport}, it takes this protocol
    as the producer of its replies (L{IConsumer}), lets reading pause and
    resume (L{IPushProducer}), and can be closed at once.
    """

    def abortConnection() -> None:  # noqa: N802 - Twisted's name
        """Close the connection now, dropping whatever is not sent yet."""


@implementer(IHalfCloseableProtocol, IPushProducer)
class SessionProtocol(Protocol):
    """
    A connection served through its own L{ClientSession}.

    Memory bounds (see docs/reliability.md): the protocol counts the input it
    holds through L{hold_input} against the server's
    L{kestrel.budget.ClientMemory}, and is registered as the push producer of
    its own transport, so that once more replies wait to be sent than the
    transport buffers (Twisted's C{bufferSize}, 64 KiB), the transport pauses
    it: L{output_blocked} is set, the connection is not read, and protocols
    stop serving buffered requests until the client has read
    (L{output_resumed}). A protocol that batches replies sends them once they
    pass C{max_client_output}, so that the pause can take effect.

    Subclasses set L{protocol_name}, serve requests, and override the hooks
    L{session_started} (after the session opens), L{stop_answering} (the
    connection is ending: drop buffered input, cancel timers) and
    L{is_answering} (whether a request is still waiting for its reply).
    """

    _log = Logger()

    #: The wire protocol's name, given to the session (for its log lines).
    protocol_name: ClassVar[str] = "unnamed"

    #: Set by L{SessionFactory.buildProtocol} (Twisted's Factory typing requires
    #: it; a protocol made without a factory, in unit tests, has None).
    factory: SessionFactory

    #: Set by Twisted when the connection is made (C{makeConnection}).
    transport: IConnectionTransport | None = None

    #: True until the connection's first request line has been seen (L{first_line_is_http}).
    awaiting_first_line: bool = True

    #: True while the client does not read fast enough (set by the transport).
    output_blocked: bool = False

    def __init__(self, server: KestrelServer) -> None:
        self.server = server
        self.session: ClientSession | None = None
        # Whether the session's written plain reads wait for the transport to drain.
        self._awaiting_drain = False
        self._read_closed = False
        self._session_ended = False
        # Input accounting: bytes counted now, the most ever counted.
        self._input_held = 0
        self._input_peak = 0
        # Why reading is paused: the protocol's own reason, the client's unread replies.
        self._input_paused = False
        self._reading_paused = False
        self._output_was_blocked = False
        # (set on the instance, as every attribute read per request: CPython 3.11
        # specializes no read of a class attribute through an instance)
        self.output_blocked = False

    # -- connection life ---------------------------------------------------

    def connectionMade(self) -> None:
        """Track this connection and open its session."""
        if self.factory is not None:
            self.factory.connections.add(self)
        self._register_as_producer()
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

    @property
    def live_session(self) -> ClientSession:
        """The connection's session, which serves its requests (open from connectionMade on)."""
        session = self.session
        assert session is not None, "the connection is not made yet"
        return session

    def close_connection(self) -> None:
        """Close the connection once the replies already written are sent."""
        if self.transport is not None:
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
        self.release_input()
        if self.factory is not None:
            self.factory.connections.discard(self)
        if self.session is not None:
            try:
                self.session.finish()
            except Exception:
                self._log.failure("Finishing a {protocol} session failed",
                                  protocol=self.protocol_name)

    # -- memory bounds: input ------------------------------------------------

    def hold_input(self, size: int) -> bool:
        """
        This connection now holds C{size} bytes of input (buffered lines, a
        declared item, a put body): return whether the server-wide
        C{max_client_memory} allows it. When it does not, nothing is counted
        and the protocol must refuse the request (and close) without reading it.
        """
        held = self._input_held
        if size == held:
            return True
        if not self.server.client_memory.grow(held, size):
            return False
        self._input_held = size
        if size > self._input_peak:
            self._input_peak = size
        return True

    def release_input(self) -> None:
        """Stop counting this connection's input (it is closing); idempotent."""
        held, self._input_held = self._input_held, 0
        peak, self._input_peak = self._input_peak, 0
        memory = self.server.client_memory
        if held:
            memory.released(held)
        if peak >= TRIM_AFTER or self._output_was_blocked:
            memory.schedule_trim()

    # -- memory bounds: output (IPushProducer, driven by the transport) ------

    def _register_as_producer(self) -> None:
        transport = self.transport
        if transport is None or getattr(transport, "producer", None) is not None:
            return
        transport.registerProducer(self, True)

    def pauseProducing(self) -> None:  # noqa: N802 - Twisted interface
        """The client reads slower than we answer: stop reading and serving."""
        self.output_blocked = True
        self._output_was_blocked = True
        self._update_reading()

    def resumeProducing(self) -> None:  # noqa: N802 - Twisted interface
        """
        The transport's buffer is empty: the plain reads written wait no more
        (L{write_reply}); if the client had fallen behind, read again and
        serve what is buffered.
        """
        if self._awaiting_drain:
            self._awaiting_drain = False
            if self.session is not None:
                self.session.held_reads.drained()
            transport = self.transport
            if (not self.output_blocked and transport is not None
                    and getattr(transport, "disconnecting", False)):
                # (Twisted called us instead of closing: let the close go on.)
                transport.unregisterProducer()
        if not self.output_blocked:
            return
        self.output_blocked = False
        transport = self.transport
        if transport is not None and getattr(transport, "disconnecting", False):
            # Closing: a registered producer would hold the close back forever.
            transport.unregisterProducer()
            return
        self._update_reading()
        if not self._session_ended:
            self.output_resumed()

    def stopProducing(self) -> None:  # noqa: N802 - Twisted interface
        """The connection is gone; L{connectionLost} ends the session."""

    def pause_input(self) -> None:
        """Stop reading for the protocol's own reason (a request is waiting)."""
        self._input_paused = True
        self._update_reading()

    def resume_input(self) -> None:
        """Read again, unless the client's unread replies still hold reading back."""
        self._input_paused = False
        self._update_reading()

    def _update_reading(self) -> None:
        want = self._input_paused or self.output_blocked
        if want == self._reading_paused or self.transport is None:
            return
        self._reading_paused = want
        if want:
            self.transport.pauseProducing()
        else:
            self.transport.resumeProducing()

    # -- replies ---------------------------------------------------------------

    def write_reply(self, data: bytes) -> None:
        """
        Send C{data} (L{write_now}), then settle the session's plain reads
        whose replies it ends: each is confirmed once every byte written so
        far is in the kernel, at once when the socket took it all (the usual
        case), else when the transport's buffer drains. If the connection is
        lost first, the session puts them back at the head of their queues.
        """
        transport = self.transport
        assert transport is not None
        in_kernel = write_now(transport, data)
        session = self.session
        if session is not None and session.held_reads.pending:
            if session.held_reads.written(in_kernel):
                self._await_drain()

    def settle_replies(self) -> None:
        """
        The session's pending plain reads are in replies written already:
        confirm them now if the transport holds nothing back, else once it
        has drained (see L{write_reply}).
        """
        session = self.session
        if session is not None and session.held_reads.pending:
            if session.held_reads.written(not _buffered(self.transport)):
                self._await_drain()

    def _await_drain(self) -> None:
        """
        Be called (L{resumeProducing}) when the transport's buffer is next
        empty: Twisted's transports call their registered streaming producer
        then when it is marked paused. A lost connection is left alone (its
        session puts the reads back); a transport with another producer
        cannot tell, and what was written counts as delivered.
        """
        transport: Any = self.transport
        if not getattr(transport, "connected", True):
            return  # (lost: the session puts the reads back as it ends)
        if getattr(transport, "producer", None) is self:
            self._awaiting_drain = True
            transport.producerPaused = True
        elif self.session is not None:
            self._log.debug("{protocol}: no drain notice from {transport}; replies count as sent",
                            protocol=self.protocol_name, transport=type(transport).__name__)
            self.session.held_reads.drained()

    # -- HTTP on a Kestrel port ----------------------------------------------

    def first_line_is_http(self, line: bytes) -> bool:
        """
        Note that the first request line has come; return whether it is an
        HTTP request line (the protocol then answers one error line naming
        L{HTTP_REFUSED} and closes, so that a browser's request headers and
        body are never run as commands).

        Protocols call it as C{self.awaiting_first_line and self.first_line_is_http(line)}.
        """
        self.awaiting_first_line = False
        if looks_like_http(line):
            peer = self.transport.getPeer() if self.transport is not None else None
            self._log.warn("{protocol} connection from {peer} sent an HTTP request; closing",
                           protocol=self.protocol_name, peer=getattr(peer, "host", peer))
            return True
        return False

    # -- hooks ---------------------------------------------------------------

    # -- write batches -------------------------------------------------------

    def begin_write_batch(self) -> None:
        """
        Open a write batch for the rest of one pass over the connection's
        buffered input: the journal writes of the requests served from now on
        are held back and reach each file in one C{os.write}.

        A protocol opens one only when more input follows the request it is
        about to serve (so a lone request writes through at once and costs
        no batch), and closes it with L{end_write_batch} at the end of the pass.
        Inside it, the protocol calls C{session.flush_writes()} before it
        sends replies, and drops them if that returns false (a held-back write
        of this batch failed). These two methods are the only place a batch
        is opened and closed; nothing below the session opens batches. A
        batch holds this connection's records only: what would serve another
        connection from inside it (waking a blocked reader) waits for the
        batch's flush and runs outside it (C{IJournal.after_written}).
        """
        session = self.session
        assert session is not None
        session.hold_writes()

    def end_write_batch(self) -> None:
        """Close the batch L{begin_write_batch} opened (its held writes reach the OS)."""
        session = self.session
        assert session is not None
        session.release_writes()

    def session_started(self) -> None:
        """Called once the session is open; the default does nothing."""

    def stop_answering(self) -> None:
        """Called once when the session ends, before it finishes; the default does nothing."""

    def is_answering(self) -> bool:
        """Whether a request is still waiting for its reply (the default: never)."""
        return False

    def output_resumed(self) -> None:
        """The client read its replies: serve buffered requests again (default: nothing)."""


class SessionFactory(Factory[SessionProtocol]):
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


def _buffered(transport: Any) -> bool:
    """
    Whether C{transport} holds back bytes not yet handed to the kernel (or
    could not take them: it is disconnected). Only Twisted's file-descriptor
    transports (TCP, UNIX) can tell; any other counts as holding nothing.
    """
    if isinstance(transport, abstract.FileDescriptor) and not getattr(transport, "TLS", False):
        return bool(not transport.connected or transport._tempDataLen
                    or len(transport.dataBuffer) > transport.offset)
    return False


def write_now(transport: ITransport, data: bytes) -> bool:
    """
    Write C{data} to C{transport}: the same promise as C{transport.write}
    (every byte is sent, in order, after everything written before), but sent
    at once when possible. Returns whether every byte written to the
    transport so far is in the kernel now (see L{_buffered}).

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
                return True
            if sent:
                data = data[sent:]
    transport.write(data)
    return not _buffered(transport)
