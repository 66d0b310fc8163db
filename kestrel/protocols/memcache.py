"""
Kestrel's memcache protocol: bytes in, L{ClientSession} calls, reply bytes out.

One connection speaks the text protocol (classic and meta commands,
L{kestrel.protocols.meta}) or the binary one (L{kestrel.protocols.binary}),
chosen by its first byte. L{kestrel.protocols.framing} cuts the buffer into
requests (no per-line callbacks): pipelined requests that arrive in one TCP
read are parsed and answered in one pass, and their replies leave in one
C{write}. Requests on a connection are answered strictly in order: while one
waits (a C{get q/t=...}, a C{monitor} stream, a durable C{set}), later
requests stay in the buffer, and reading is paused if that backlog grows past
L{MemcacheProtocol.BACKLOG_LIMIT}.

Replies follow Kestrel 2.4 except where real memcache clients need
memcache's own bytes (docs/differences.md): the C{VALUE} line echoes the key
exactly as sent, C{flush_all} answers C{OK}, and an error closes the
connection only where the byte stream cannot be resynchronised (a bad
storage byte count, a data block not followed by C{\\r\\n}, a line over
C{max_request_size}, an unknown command word, a binary packet that cannot be
framed). Every other error is answered and the connection kept. Nothing
raised while serving a request escapes C{dataReceived}: unexpected failures
are logged and answered with C{SERVER_ERROR} before the connection is
closed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from kestrel.errors import (
    KestrelError,
)
from kestrel.item import QItem, memcache_expiry_ms
from kestrel.protocols.base import (
    HTTP_REFUSED,
    SessionFactory,
    SessionProtocol,
    write_now,
)
from kestrel.protocols.binary import (
    BINARY_REQUEST_MAGIC,
    STATUS_INTERNAL_ERROR,
    BinaryHandler,
    BinaryRequest,
    CloseAfterReply,
    error_status,
    status_reply,
)
from kestrel.protocols.fetching import Fetched
from kestrel.protocols.framing import NEED, REFUSE, SERVE, Frame, RequestFramer
from kestrel.protocols.memcache_commands import CommandHandler
from kestrel.protocols.memcache_parser import (
    Command,
    ConfirmRequest,
    GetRequest,
    MonitorRequest,
    QueueCommand,
    SetRequest,
    encode_text,
)
from kestrel.protocols.memcache_replies import (
    DELETED,
    END,
    NOT_STORED,
    STORED,
    refusal_reply,
    value_reply,
)
from kestrel.protocols.meta import MetaDelete, MetaGet, MetaHandler, MetaNoop, MetaSet
from kestrel.settled import settled

if TYPE_CHECKING:
    from kestrel.server import KestrelServer

__all__ = ["MemcacheFactory", "MemcacheProtocol"]

_READ_IS_OPEN = b"a read is open on this queue: use /close, /open or /abort"

_OUT_OF_MEMORY = b"SERVER_ERROR out of memory for client requests (max_client_memory); retry\r\n"
#: A read this small, on a connection holding no input, is not counted against
#: max_client_memory before it is served (see dataReceived).
_UNCOUNTED_READ = 16 * 1024

#: What a request handler returns: reply bytes (b"" for none) or a Deferred of them
#: (a handler that wires its own callback instead sets _waiting and returns b"": _set).
Reply = bytes | Deferred[bytes]

#: A C{noreply} set, as L{MemcacheProtocol._error} reads it: its failure is not answered.
_QUIET_SET = SetRequest(b"", 0, 0, noreply=True)


class MemcacheProtocol(SessionProtocol):
    """
    One memcache connection over one L{kestrel.session.ClientSession}.

    The session is created in C{connectionMade} and finished (open reads
    aborted, waits cancelled) in C{connectionLost} (L{SessionProtocol}). A
    client that half-closes (sends its requests, then EOF, as C{nc} does)
    still gets every reply: the connection closes once the buffered requests
    are answered.
    """

    _log = Logger()
    protocol_name = "memcache"

    #: Unanswered input (bytes) kept while a request waits before reading pauses.
    BACKLOG_LIMIT = 1024 * 1024

    def __init__(self, server: KestrelServer) -> None:
        super().__init__(server)
        self.clock = server.clock
        self.stats = server.stats
        self.max_request_size: int = server.config.max_request_size
        self._output_limit: int = server.config.max_client_output
        self._buf = b""
        self._parts: list[bytes] = []
        self._have = 0
        self._need = 0
        self._need_newline = False
        self._out: list[bytes] = []
        self._framer = RequestFramer(self.max_request_size)
        #: The dialect's framing function, once the first request was framed.
        self._frame: Frame | None = None
        self._binary = BinaryHandler(self)
        meta = MetaHandler(self)
        self._waiting = False
        self._in_process = False
        # Whether this pass over the input opened a write batch (more input followed a request).
        self._batch_open = False
        self._closing = False
        self._paused = False
        self._idle_call: IDelayedCall | None = None
        self._last_active = 0.0
        self._dispatch: dict[type, Callable[[Any], Reply]] = {
            GetRequest: self._get,
            QueueCommand: self._queue_command,
            ConfirmRequest: self._confirm,
            MonitorRequest: self._monitor,
            Command: CommandHandler(self).serve,
            MetaGet: meta.get,
            MetaDelete: meta.delete,
            MetaNoop: meta.noop,
        }
        # (what answers a set later, by its noreply: made once, not per set)
        self._set_answers = (self._stored_later, self._stored_quietly)
        self._data_dispatch: dict[type, Callable[[Any, bytes], Reply]] = {
            SetRequest: self._set,
            MetaSet: meta.set,
            BinaryRequest: self._binary.serve,
        }

    # -- connection life -------------------------------------------------

    def session_started(self) -> None:
        """Start the idle timer when C{client_timeout} is set."""
        assert self.session is not None
        timeout = self.server.config.client_timeout
        if timeout:
            self._last_active = self.clock.seconds()
            self._idle_call = self.clock.callLater(timeout, self._idle_check)

    def is_answering(self) -> bool:
        """Whether a request waits for its reply, or the connection is closing already."""
        return self._waiting or self._closing

    def close_connection(self) -> None:
        """Stop serving requests and close once the replies written are sent."""
        self._closing = True
        if self.transport is not None:
            self.transport.loseConnection()

    def stop_answering(self) -> None:
        """Serve nothing more; stop the idle timer; drop buffered input at once."""
        self._closing = True
        self._buf, self._parts, self._have = b"", [], 0
        if self._idle_call is not None and self._idle_call.active():
            self._idle_call.cancel()
        self._idle_call = None

    def _idle_check(self) -> None:
        """Close the connection if it was idle (and not waiting) for C{client_timeout}."""
        self._idle_call = None
        timeout = self.server.config.client_timeout
        if self._closing or not timeout:
            return
        now = self.clock.seconds()
        if self._waiting:
            # Blocked in a get/monitor is not idle: count from the end of the wait.
            self._last_active = now
        idle = now - self._last_active
        if idle >= timeout:
            self._log.info("Closing memcache connection idle for {idle:.1f}s", idle=idle)
            self.close_connection()
            return
        self._idle_call = self.clock.callLater(max(timeout - idle, 0.001), self._idle_check)

    # -- input -----------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        """Buffer C{data} and serve every complete request it holds, in order."""
        size = len(data)
        self.stats.bytes_read += size
        if self._idle_call is not None:
            self._last_active = self.clock.seconds()
        if self._closing:
            return
        # Pieces of an incomplete request are joined once, when it can complete,
        # so that a large payload arriving in many reads is not copied per read.
        if self._buf or self._parts:
            self._parts.append(data)
            self._have += size
        else:
            frame = self._frame
            if (frame is not None and size <= _UNCOUNTED_READ and not self._waiting
                    and not self._need and not self._input_held and not self._out
                    and not self.output_blocked and not self._paused and not self._read_closed
                    and self._serve_lone(frame, data, size)):
                return
            self._buf = data
            self._have = size
        # A small read with nothing held before is served before this call
        # returns, so it is not counted; what it leaves buffered is counted
        # after serving (below, in _process), and a request that
        # declares more data is counted when its line is parsed.
        if ((self._input_held or self._have > _UNCOUNTED_READ) and self._have > self._input_held
                and not self.hold_input(max(self._have, self._need))):
            self._fail(_OUT_OF_MEMORY)
            return
        if self._waiting:
            if not self._paused and self._have > self.BACKLOG_LIMIT:
                self._paused = True
                self.pause_input()
            return
        if self._have < self._need:
            return
        if self._need_newline and b"\n" not in data:
            if self._have > self.max_request_size + 2:
                self._fail(b"CLIENT_ERROR request line too long\r\n")
            return
        self._process()

    def _serve_lone(self, frame: Frame, data: bytes, size: int) -> bool:
        """
        Serve C{data}, a read with nothing buffered before it, if it is one
        whole request (the usual read), as a pass of L{_process} would, but
        with nothing left buffered to account for. Whether it was served; if
        not, nothing was done, and L{_process} frames C{data} again. The
        caller checks that no pass would do more (see C{dataReceived}).
        """
        try:
            kind, request, block, end = frame(data, 0)
            if kind != SERVE or end != size:
                return False
            # (_serve and _flush for one request, inlined: no write batch opens; a
            # helper shared with _serve measured 1.6% more instructions per pair)
            self._in_process = True
            try:
                if block is not None:
                    reply = self._data_dispatch[request.__class__](request, block)
                else:
                    reply = self._dispatch[request.__class__](request)
            except Exception as exc:  # noqa: BLE001 - mapped to a reply, never raised
                self._error(Failure(exc), request)
                reply = b""
            if not isinstance(reply, bytes):
                self._waiting = True
                reply.addCallbacks(self._async_reply, self._error, errbackArgs=(request,))
                reply = b""
            self._in_process = False
            out = self._out
            if out:  # (a refusal's reply, or a wait answered at once)
                if reply:
                    out.append(reply)
                self._flush()
            elif reply:
                self.stats.bytes_written += len(reply)
                # (write_reply, inlined)
                in_kernel = write_now(self.transport, reply)  # type: ignore[arg-type]
                session = self.session
                if (session is not None and session.held_reads.pending
                        and session.held_reads.written(in_kernel)):
                    self._await_drain()
        except Exception:
            self._in_process = False
            self._internal_error()
        return True

    def _internal_error(self) -> None:
        """
        A bug met serving the input (bad input is answered, never raised):
        log it, tell the client, close the connection.
        """
        self._log.failure("Memcache connection failed")
        if not self._closing:
            self._fail(b"SERVER_ERROR internal error\r\n")

    def _process(self) -> None:
        """
        Serve buffered requests until the buffer runs dry or one must wait.

        The framer (L{kestrel.protocols.framing.RequestFramer}) says where each
        request ends; this loop serves them. A lone request's journal writes
        reach the OS at once. When more input follows the request about to be
        served, a write batch opens for the rest of the pass: its journal
        writes are held back and reach the OS (one write per journal file)
        before the replies are written. Only a held-back write of this batch
        failing drops this batch's replies.

        A bug here (bad input is answered, never raised) is logged, the client
        is told, and the server lives on.
        """
        try:
            self._in_process = True
            if self._parts:
                self._buf = b"".join([self._buf, *self._parts])
                self._parts = []
            buf = self._buf
            size = len(buf)
            pos = 0
            need = 0
            need_newline = False
            out = self._out
            queued = 0
            # (the loop frames only when there is input: frame is then its dialect's,
            # which the connection's first byte chose)
            frame = self._frame
            if frame is None:
                frame = self._framer.framer_for(buf[0]) if size else self._framer.frame
            try:
                while (pos < size and not self._waiting and not self._closing
                       and not self.output_blocked):
                    if out:
                        # A client that does not read stops being served (and read)
                        # once max_client_output bytes of replies wait for it.
                        queued += len(out[-1])
                        if queued > self._output_limit:
                            self._flush()
                            queued = 0
                            continue
                    if self.awaiting_first_line and self._http_first_line(buf, pos):
                        break
                    kind, request, data, end = frame(buf, pos)
                    if kind == SERVE:
                        pos = end
                        self._serve(request, data, pos < size)
                    elif kind == REFUSE:
                        pos = end
                        out.append(request)
                    elif kind == NEED:
                        need = request
                        need_newline = not need
                        # Held input counts from the start of buf: reserve a declared
                        # data block before it is read.
                        reserve = pos + data
                        if (data and reserve > size and reserve > self._input_held
                                and not self.hold_input(reserve)):
                            self._fail(_OUT_OF_MEMORY)
                        break
                    else:
                        self._fail(request)
                        break
            finally:
                if pos and self._frame is None and not self.awaiting_first_line:
                    self._frame = frame  # (the dialect is chosen, the first line seen)
                self._buf = buf[pos:] if pos else buf
                self._have = size - pos
                self._need = need
                self._need_newline = need_newline and bool(self._buf)
                self._in_process = False
                try:
                    self._flush()
                finally:
                    if self._batch_open:
                        self._batch_open = False
                        self.end_write_batch()
                if not self._closing and (self._input_held or self._have or need):
                    self.hold_input(max(self._have, need))
            if self._read_closed and not self._waiting and not self._closing:
                self.close_connection()
            if self._paused and not self._waiting and not self._closing:
                self._paused = False
                self.resume_input()
        except Exception:
            self._internal_error()

    def _http_first_line(self, buf: bytes, pos: int) -> bool:
        """
        On the first request line: whether it is HTTP (then answered and the
        connection closed). A binary connection has no request line.
        """
        if buf[pos] == BINARY_REQUEST_MAGIC:
            self.awaiting_first_line = False
            return False
        nl = buf.find(b"\n", pos)
        if nl < 0:
            return False
        line = buf[pos:nl - 1 if nl > pos and buf[nl - 1] == 13 else nl]
        if self.first_line_is_http(line):
            self._fail(b"CLIENT_ERROR %s\r\n" % HTTP_REFUSED.encode())
            return True
        return False

    def output_resumed(self) -> None:
        """The client read its replies: serve the requests that waited meanwhile."""
        if self._in_process or self._waiting or self._closing:
            return
        if self._buf or self._parts or self._read_closed:
            self._process()

    def _serve(self, request: Any, data: bytes | None, more: bool) -> None:
        """
        Run one request's handler, queueing its reply or waiting for it. With
        C{more} input after it, the pass's write batch opens first (if not yet).
        """
        if more and not self._batch_open:
            # More input follows: hold this pass's writes from here on.
            self._batch_open = True
            self.begin_write_batch()
        try:
            if data is not None:
                reply = self._data_dispatch[request.__class__](request, data)
            else:
                reply = self._dispatch[request.__class__](request)
        except Exception as exc:  # noqa: BLE001 - mapped to a reply, never raised
            self._error(Failure(exc), request)
            return
        if isinstance(reply, bytes):
            if reply:
                self._out.append(reply)
            return
        self._waiting = True
        reply.addCallbacks(self._async_reply, self._error, errbackArgs=(request,))

    def _async_reply(self, reply: bytes) -> None:
        """A waiting request finished: queue its reply and carry on with the buffer."""
        if self._closing:
            return
        self._waiting = False
        if self._idle_call is not None:
            self._last_active = self.clock.seconds()
        out = self._out
        if self._in_process:
            if reply:
                out.append(reply)  # (written at the end of the pass)
        else:
            if out:
                if reply:
                    out.append(reply)
                self._flush()
            elif reply:
                # (as _flush does, with no join: outside a pass no write batch is open)
                self.stats.bytes_written += len(reply)
                self.write_reply(reply)
            if self._buf or self._parts or self._read_closed:
                self._process()
            elif self._paused:
                self._paused = False
                self.resume_input()

    def _flush(self) -> None:
        """
        Write every queued reply in one C{write}, once the journal writes they
        depend on are in the OS.

        If a held-back journal write of this connection's open batch failed,
        the queued replies may acknowledge what is not journaled: they are
        dropped, and the connection ends with C{SERVER_ERROR}.
        """
        out = self._out
        if out:
            session = self.session
            if self._batch_open and session is not None and not session.flush_writes():
                out.clear()
                self._closing = True
                self._log.error("Replies dropped: a journal write failed")
                if self.transport is not None:
                    self.transport.write(b"SERVER_ERROR journal write failed\r\n")
                self.close_connection()
                return
            data = out[0] if len(out) == 1 else b"".join(out)
            out.clear()
            self.stats.bytes_written += len(data)
            self.write_reply(data)

    def _fail(self, reply: bytes) -> None:
        """Send C{reply} after every reply queued before it, then close the connection."""
        if reply:
            self._out.append(reply)
        self._closing = True
        self._flush()
        self.close_connection()

    def _error(self, failure: Failure, request: object = None) -> None:
        """
        Map a failed request to its reply. A refusal (server status,
        connection limit, bad queue name, too many open reads, a status that
        may not be set) is answered and the connection kept; with C{noreply}
        it is not answered at all, as memcache does, so that a client reading
        no reply is not thrown off by one. A cancelled request or a bug is
        answered with C{SERVER_ERROR}, then the connection closes.
        """
        self._waiting = False
        if self._closing:
            if not failure.check(CancelledError, KestrelError):
                self._log.failure("Memcache request failed after close", failure)
            return
        exc = failure.value
        if isinstance(exc, CloseAfterReply):
            self._fail(exc.reply)
            return
        if request.__class__ is BinaryRequest:
            self._binary_error(failure, request)
            return
        reply = refusal_reply(exc)
        if reply is None:
            if isinstance(exc, CancelledError):
                self._fail(b"SERVER_ERROR request cancelled\r\n")
            else:
                self._log.failure("Memcache request failed", failure)
                self._fail(b"SERVER_ERROR internal error\r\n")
            return
        if getattr(request, "noreply", False):
            reply = b""
        self._async_reply(reply)

    def _binary_error(self, failure: Failure, request: BinaryRequest) -> None:
        """A binary refusal gets its status (connection kept); a bug 0x0084, then a close."""
        mapped = error_status(failure.value)
        if mapped is None:
            if not failure.check(CancelledError):
                self._log.failure("Memcache binary request failed", failure)
            self._fail(status_reply(request.opcode, request.opaque, STATUS_INTERNAL_ERROR,
                                    b"internal error"))
            return
        status, message = mapped
        self._async_reply(
            status_reply(request.opcode, request.opaque, status, encode_text(message)))

    # -- requests --------------------------------------------------------

    def fetch(self, req: GetRequest) -> Fetched:
        """
        Run the queue side of a fetch (C{get}, C{mg}, binary Get): the item
        (or None) when it is known at once, a Deferred of it when the fetch
        waits, or reply bytes naming why a read that is open refuses it.
        """
        session = self.session
        assert session is not None
        name = req.name
        if req.aborting:
            session.abort_read(name)
            return None
        timeout_ms = req.timeout_ms
        deadline = None if timeout_ms is None else self.clock.seconds() + timeout_ms / 1000.0
        if req.closing:
            closed = session.close_read(name)
            if closed.__class__ is not bool:  # (durable: the next open waits for the close)
                return closed.addCallback(  # type: ignore[union-attr]
                    self._closed_read, req, deadline)
            if not req.open_read:
                return None
        elif not req.open_read and not req.peeking and session.count_open_reads(name) > 0:
            return _READ_IS_OPEN
        # (Its reply is written at the end of this pass, before another connection runs.)
        return session.read_item(name, deadline, req.open_read, req.peeking, True)

    def _closed_read(self, _: bool, req: GetRequest,
                     deadline: float | None) -> QItem | None | Deferred:
        """A durable close of C{req} is durable: its open (if any) runs now, until C{deadline}."""
        if not req.open_read or self.session is None:
            return None
        return self.session.read_item(req.name, deadline, True, req.peeking)

    def _get(self, req: GetRequest) -> Reply:
        result = self.fetch(req)
        if result is None:  # (answered at once, here and below: the usual case)
            return END
        if result.__class__ is QItem:
            return value_reply(result, req.key)
        if isinstance(result, bytes):
            return b"ERROR %s\r\n" % result
        return result.addCallback(value_reply, req.key)  # type: ignore[union-attr]

    def enqueue(self, name: str, data: bytes, exptime: int) -> bool | Deferred[bool]:
        """
        Add C{data} to queue C{name}; C{exptime} as memcache's (0: none), in
        any dialect: whether it was stored, or a Deferred of it.
        """
        session = self.session
        assert session is not None
        return session.offer_item(name, data, self._expiry_ms(exptime))

    def _expiry_ms(self, exptime: int) -> int:
        """The absolute expiry (epoch ms, 0: none) of memcache's C{exptime}."""
        return memcache_expiry_ms(exptime, int(self.clock.seconds() * 1000)) if exptime else 0

    def _set(self, req: SetRequest, data: bytes) -> Reply:
        if req.error is not None:
            return b"" if req.noreply else b"CLIENT_ERROR %s\r\n" % encode_text(req.error)
        # (acknowledged durably, the queue calls answer: no reply Deferred for _serve)
        session = self.session
        assert session is not None
        exptime = req.exptime
        answer = self._set_answers[req.noreply]
        # (_expiry_ms is 0 for no exptime too: the test here saves its call per set)
        stored = session.offer_item(req.name, data, self._expiry_ms(exptime) if exptime else 0,
                                    answer)
        if stored is None:  # (a durable add: answer is called once it is durable)
            self._waiting = True
            return b""
        # (not isinstance(stored, Deferred): Deferred is an ABC, whose check
        # costs a Python call; a bool is the usual answer)
        if stored is not True and stored is not False:
            outcome = settled(stored)
            if outcome is not True and outcome is not False:
                self._waiting = True
                if stored.called:  # (refused at once: answered now, as a refusal found later is)
                    stored.addBoth(answer)
                return b""
            stored = outcome
        return b"" if req.noreply else STORED if stored else NOT_STORED

    def _stored_later(self, outcome: object) -> None:
        """A set answered later (durable acknowledgement): reply, and carry on."""
        if outcome is True:
            self._async_reply(STORED)
        elif outcome.__class__ is Failure:
            self._error(outcome)
        else:
            self._async_reply(NOT_STORED)

    def _stored_quietly(self, outcome: object) -> None:
        """A C{noreply} set answered later: carry on, replying nothing (not even an error)."""
        if outcome.__class__ is Failure:
            self._error(outcome, _QUIET_SET)
        else:
            self._async_reply(b"")

    def _queue_command(self, req: QueueCommand) -> Reply:
        session = self.session
        assert session is not None
        session.held_reads.open_peeked()  # (items this pass replied to are out of the queue)
        word = req.word
        if word == "delete":
            reply = DELETED
            session.delete(req.name)
        elif word == "flush":
            reply = END
            session.flush(req.name)
        else:
            return b"%d\r\n" % session.flush_expired(req.name)
        return b"" if req.noreply else reply

    def _confirm(self, req: ConfirmRequest) -> Reply:
        session = self.session
        assert session is not None
        closed = session.close_reads(req.name, req.count)
        if not closed:
            return b"ERROR\r\n"
        return END if closed is True else closed.addCallback(lambda _: END)

    def _monitor(self, req: MonitorRequest) -> Reply:
        session = self.session
        assert session is not None
        max_items = req.max_items
        if max_items is None:
            max_items = self.server.config.max_open_transactions
        key = req.key

        def got_item(item: QItem) -> None:
            if not self._closing:
                self._out.append(value_reply(item, key))
                if not self._in_process:
                    self._flush()

        deadline = self.clock.seconds() + req.seconds
        done = session.monitor_until(req.name, deadline, max_items, True, got_item)
        return done.addCallback(lambda _: END)


class MemcacheFactory(SessionFactory):
    """
    Builds a L{MemcacheProtocol} per connection over one L{KestrelServer}.

    It tracks live connections so a stopping server can close them all
    (L{SessionFactory.disconnect_all}) before the journals close.
    """

    protocol = MemcacheProtocol
