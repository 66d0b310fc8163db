"""
Kestrel's memcache protocol: bytes in, L{ClientSession} calls, reply bytes out.

L{MemcacheProtocol} frames requests itself from one buffer (no per-line
callbacks): pipelined requests that arrive in one TCP read are parsed and
answered in one pass, and their replies leave in one C{write}. Requests on a
connection are answered strictly in order: while one waits (a C{get q/t=...},
a C{monitor} stream, a durable C{set}), later requests stay in the buffer, and
reading is paused if that backlog grows past L{MemcacheProtocol.BACKLOG_LIMIT}.

Replies follow Kestrel 2.4 byte for byte (reference §1), with the deviations
of C{../shared/spec/decisions.md}: where Kestrel closed a connection silently
we first send C{CLIENT_ERROR <reason>}. Nothing raised while serving a request
escapes C{dataReceived}: unexpected failures are logged and answered with
C{SERVER_ERROR} before the connection is closed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import CancelledError, Deferred, maybeDeferred
from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from kestrel.errors import (
    AvailabilityError,
    ConfigError,
    ForbiddenStatus,
    InvalidQueueName,
    JournalUnavailable,
    KestrelError,
    ShuttingDown,
    TooManyOpenReads,
    UnknownStatus,
)
from kestrel.item import memcache_expiry_ms
from kestrel.protocols.base import SessionFactory, SessionProtocol
from kestrel.protocols.memcache_parser import (
    Command,
    ConfirmRequest,
    GetRequest,
    MemcacheParseError,
    MonitorRequest,
    QueueCommand,
    SetRequest,
    parse_line,
)
from kestrel.stats import format_stat_blocks, format_stats

if TYPE_CHECKING:
    from kestrel.item import QItem
    from kestrel.server import KestrelServer

__all__ = ["MemcacheFactory", "MemcacheProtocol"]

_END = b"END\r\n"
_STORED = b"STORED\r\n"
_NOT_STORED = b"NOT_STORED\r\n"
_DELETED = b"DELETED\r\n"

#: What a request handler returns: reply bytes (b"" for none) or a Deferred of them.
Reply = bytes | Deferred[bytes]


_PENDING = object()


def _fired(d: Deferred[Any]) -> Any:
    """
    The successful result of C{d} if it has fired already, else C{_PENDING}.

    The hot path uses this to skip chaining callbacks on Deferreds that fired
    synchronously; a failure stays in C{d} for the caller's errback.
    """
    if d.called and not d.paused:
        result = d.result
        if not isinstance(result, Failure):
            return result
    return _PENDING


def _encode(text: str) -> bytes:
    """Encode reply text the way names were decoded (ISO-8859-1), escaping the rest."""
    return text.encode("latin-1", "backslashreplace")


def value_reply(item: QItem | None, key: bytes) -> bytes:
    """The reply to a fetch: C{VALUE <key> 0 <len>} block with C{END}, or C{END} alone."""
    if item is None:
        return _END
    data = item.data
    return b"VALUE %s 0 %d\r\n%s\r\nEND\r\n" % (key, len(data), data)


class _CloseAfterReplyError(Exception):
    """Raised inside a handler to send C{reply} and then close the connection."""

    def __init__(self, reply: bytes) -> None:
        super().__init__(reply)
        self.reply = reply


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
        self._buf = b""
        self._parts: list[bytes] = []
        self._have = 0
        self._need = 0
        self._need_newline = False
        self._out: list[bytes] = []
        self._pending_set: SetRequest | None = None
        self._waiting = False
        self._in_process = False
        self._closing = False
        self._paused = False
        self._idle_call: IDelayedCall | None = None
        self._last_active = 0.0
        # Held-back journal write failures already seen when replies were last sent.
        self._write_failures = 0
        self._dispatch: dict[type, Callable[[Any], Reply]] = {
            GetRequest: self._get,
            SetRequest: self._set,
            QueueCommand: self._queue_command,
            ConfirmRequest: self._confirm,
            MonitorRequest: self._monitor,
            Command: self._command,
        }

    # -- connection life -------------------------------------------------

    def session_started(self) -> None:
        """Start the idle timer when C{client_timeout} is set."""
        assert self.session is not None
        self._write_failures = self.session.write_failures()
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
        self.transport.loseConnection()

    def stop_answering(self) -> None:
        """Serve nothing more; stop the idle timer."""
        self._closing = True
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
        self.stats.bytes_read += len(data)
        if self._idle_call is not None:
            self._last_active = self.clock.seconds()
        if self._closing:
            return
        # Pieces of an incomplete request are joined once, when it can complete,
        # so that a large payload arriving in many reads is not copied per read.
        if self._buf or self._parts:
            self._parts.append(data)
            self._have += len(data)
        else:
            self._buf = data
            self._have = len(data)
        if self._waiting:
            if not self._paused and self._have > self.BACKLOG_LIMIT:
                self._paused = True
                self.transport.pauseProducing()
            return
        if self._have < self._need:
            return
        if self._need_newline and b"\n" not in data:
            if self._have > self.max_request_size + 2:
                self._fail(b"CLIENT_ERROR request line too long\r\n")
            return
        try:
            self._process()
        except Exception:
            # A bug, not bad input (that is answered above): log it, tell the
            # client, and keep the server alive.
            self._log.failure("Memcache connection failed")
            if not self._closing:
                self._fail(b"SERVER_ERROR internal error\r\n")

    def _process(self) -> None:
        """
        Serve buffered requests until the buffer runs dry or one must wait.

        Their journal writes are held back in one write batch, and reach the
        OS (one write per journal file) before their replies are written.
        """
        session = self.session
        assert session is not None
        # Only a write of this batch failing drops this batch's replies.
        self._write_failures = session.write_failures()
        session.hold_writes()
        try:
            self._process_batch()
        finally:
            session.release_writes()

    def _process_batch(self) -> None:
        self._in_process = True
        if self._parts:
            self._buf = b"".join([self._buf, *self._parts])
            self._parts = []
        buf = self._buf
        pos = 0
        need = 0
        need_newline = False
        try:
            while not self._waiting and not self._closing:
                pending = self._pending_set
                if pending is not None:
                    end = pos + pending.length
                    if len(buf) < end + 2:
                        need = end + 2 - pos
                        break
                    data = buf[pos:end]
                    pos = end + 2
                    self._pending_set = None
                    self._serve(pending, data)
                    continue
                nl = buf.find(b"\n", pos)
                if nl < 0:
                    # (one more byte may be the "\r" of a line of the largest size)
                    if len(buf) - pos > self.max_request_size + 1:
                        self._fail(b"CLIENT_ERROR request line too long\r\n")
                    need_newline = True
                    break
                end = nl - 1 if nl > pos and buf[nl - 1] == 13 else nl
                if end - pos > self.max_request_size:
                    self._fail(b"CLIENT_ERROR request line too long\r\n")
                    break
                line = buf[pos:end]
                pos = nl + 1
                try:
                    request = parse_line(line)
                except MemcacheParseError as err:
                    if err.disconnect:
                        self._fail(b"CLIENT_ERROR %s\r\n" % _encode(err.reason))
                    else:
                        self._out.append(b"CLIENT_ERROR %s\r\n" % _encode(err.reason))
                    continue
                if request.__class__ is SetRequest:
                    if request.length > self.max_request_size:
                        self._fail(b"CLIENT_ERROR item of %d bytes is larger than "
                                   b"max_request_size (%d)\r\n"
                                   % (request.length, self.max_request_size))
                        break
                    self._pending_set = request
                    continue
                self._serve(request, None)
        finally:
            self._buf = buf[pos:] if pos else buf
            self._have = len(self._buf)
            self._need = need
            self._need_newline = need_newline and bool(self._buf)
            self._in_process = False
            self._flush()
        if self._read_closed and not self._waiting and not self._closing:
            self.close_connection()
        if self._paused and not self._waiting and not self._closing:
            self._paused = False
            self.transport.resumeProducing()

    def _serve(self, request: Any, data: bytes | None) -> None:
        """Run one request's handler, queueing its reply or waiting for it."""
        try:
            if data is not None:
                reply = self._set(request, data)
            else:
                reply = self._dispatch[request.__class__](request)
        except Exception as exc:  # noqa: BLE001 - mapped to a reply, never raised
            self._error(Failure(exc))
            return
        if reply.__class__ is bytes:
            if reply:
                self._out.append(reply)
            return
        self._waiting = True
        reply.addCallbacks(self._async_reply, self._error)  # type: ignore[union-attr]

    def _async_reply(self, reply: bytes) -> None:
        """A waiting request finished: queue its reply and carry on with the buffer."""
        if self._closing:
            return
        self._waiting = False
        if self._idle_call is not None:
            self._last_active = self.clock.seconds()
        if not self._in_process and self.session is not None:
            # No batch of this connection is open: earlier failures were not its own.
            self._write_failures = self.session.write_failures()
        if reply:
            self._out.append(reply)
        if not self._in_process:
            self._flush()
            if (self._buf or self._parts or self._pending_set is not None
                    or self._read_closed):
                self._process()
            elif self._paused:
                self._paused = False
                self.transport.resumeProducing()

    def _flush(self) -> None:
        """
        Write every queued reply in one C{write}, once the journal writes they
        depend on are in the OS.

        If a held-back journal write failed since replies were last sent, the
        queued replies may acknowledge what is not journaled: they are
        dropped, and the connection ends with C{SERVER_ERROR}.
        """
        out = self._out
        if out:
            session = self.session
            if session is not None and not session.flush_writes(self._write_failures):
                out.clear()
                self._closing = True
                self._log.error("Replies dropped: a journal write failed")
                self.transport.write(b"SERVER_ERROR journal write failed\r\n")
                self.transport.loseConnection()
                return
            data = out[0] if len(out) == 1 else b"".join(out)
            out.clear()
            self.stats.bytes_written += len(data)
            self.transport.write(data)

    def _fail(self, reply: bytes) -> None:
        """Send C{reply} after every reply queued before it, then close the connection."""
        if reply:
            self._out.append(reply)
        self._closing = True
        self._flush()
        self.transport.loseConnection()

    def _error(self, failure: Failure) -> None:
        """Map a failed request to its reply (and a close, where Kestrel closes)."""
        self._waiting = False
        if self._closing:
            if not failure.check(CancelledError, KestrelError):
                self._log.failure("Memcache request failed after close", failure)
            return
        exc = failure.value
        if isinstance(exc, _CloseAfterReplyError):
            self._fail(exc.reply)
        elif isinstance(exc, AvailabilityError):
            self._fail(b"SERVER_ERROR %s\r\n" % _encode(str(exc)))
        elif isinstance(exc, ShuttingDown):
            self._fail(b"SERVER_ERROR server is shutting down\r\n")
        elif isinstance(exc, TooManyOpenReads):
            self._fail(b"ERROR too many open reads\r\n")
        elif isinstance(exc, InvalidQueueName):
            self._fail(b"CLIENT_ERROR bad queue name: %s\r\n" % _encode(str(exc)))
        elif isinstance(exc, (UnknownStatus, ForbiddenStatus)):
            self._fail(b"CLIENT_ERROR %s\r\n" % _encode(str(exc)))
        elif isinstance(exc, CancelledError):
            self._fail(b"SERVER_ERROR request cancelled\r\n")
        elif isinstance(exc, JournalUnavailable):
            self._fail(b"SERVER_ERROR %s\r\n" % _encode(str(exc)))
        else:
            self._log.failure("Memcache request failed", failure)
            self._fail(b"SERVER_ERROR internal error\r\n")

    # -- requests --------------------------------------------------------

    def _get(self, req: GetRequest) -> Reply:
        session = self.session
        assert session is not None
        name = req.name
        if req.aborting:
            session.abort_read(name)
            return _END
        if req.closing:
            session.close_read(name)
            if not req.opening:
                return _END
        elif not req.opening and not req.peeking and session.count_pending_reads(name) > 0:
            raise _CloseAfterReplyError(
                b"ERROR a read is open on this queue: use /close, /open or /abort\r\n")
        timeout_ms = req.timeout_ms
        deadline = None if timeout_ms is None else self.clock.seconds() + timeout_ms / 1000.0
        d = session.get_item(name, deadline, req.opening, req.peeking)
        item = _fired(d)
        if item is not _PENDING:
            return value_reply(item, req.key)
        return d.addCallback(value_reply, req.key)

    def _set(self, req: SetRequest, data: bytes) -> Reply:
        if req.flags_error is not None:
            return b"" if req.noreply else b"CLIENT_ERROR %s\r\n" % _encode(req.flags_error)
        session = self.session
        assert session is not None
        expiry_ms = 0
        if req.exptime:
            expiry_ms = memcache_expiry_ms(req.exptime, int(self.clock.seconds() * 1000))
        d = session.set_item(req.name, data, expiry_ms)
        stored = _fired(d)
        if stored is not _PENDING:
            return b"" if req.noreply else _STORED if stored else _NOT_STORED
        if req.noreply:
            return d.addCallback(lambda _: b"")
        return d.addCallback(lambda ok: _STORED if ok else _NOT_STORED)

    def _queue_command(self, req: QueueCommand) -> Reply:
        session = self.session
        assert session is not None
        word = req.word
        if word == "delete":
            reply = _DELETED
            result = session.delete(req.name)
        elif word == "flush":
            reply = _END
            result = session.flush(req.name)
        else:
            result = session.flush_expired(req.name)
            return self._after(result, lambda n: b"%d\r\n" % n)
        if req.noreply:
            reply = b""
        return self._after(result, lambda _: reply)

    @staticmethod
    def _after(result: object, render: Callable[[Any], bytes]) -> Reply:
        """Render C{result} now, or when it fires if it is a Deferred."""
        if isinstance(result, Deferred):
            return result.addCallback(render)
        return render(result)

    def _confirm(self, req: ConfirmRequest) -> Reply:
        session = self.session
        assert session is not None
        if req.count <= 0 or not session.close_reads(req.name, req.count):
            return b"ERROR\r\n"
        return _END

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
        return done.addCallback(lambda _: _END)

    def _command(self, req: Command) -> Reply:
        word = req.word
        session = self.session
        assert session is not None
        if word == "stats":
            return _encode(format_stats(self.server.stats_entries()))
        if word == "dump_stats":
            return _encode(format_stat_blocks(self.server.dump_stats(req.args)))
        if word == "version":
            return b"VERSION %s\r\n" % _encode(self.server.version)
        if word == "flush_all":
            result = session.flush_all()
            reply = b"" if req.noreply else b"Flushed all queues.\r\n"
            return self._after(result, lambda _: reply)
        if word == "flush_all_expired":
            return self._after(session.flush_all_expired(), lambda n: b"%d\r\n" % n)
        if word == "status":
            return self._status(req.args)
        if word == "reload":
            return maybeDeferred(self.server.reload).addCallbacks(
                lambda _: b"Reloaded config.\r\n", self._reload_failed)
        if word == "dump_config":
            return self._dump_config(req.args)
        if word == "shutdown":
            self._log.info("Shutdown requested over memcache")
            self.server.request_shutdown()
            raise _CloseAfterReplyError(b"")
        # quit
        raise _CloseAfterReplyError(b"")

    def _reload_failed(self, failure: Failure) -> bytes:
        """A reload that failed keeps the old config; the reply names the problem."""
        exc = failure.value
        if isinstance(exc, (ConfigError, OSError, KestrelError)):
            return b"ERROR reload failed: %s\r\n" % _encode(str(exc).replace("\n", " "))
        self._log.failure("Reload failed", failure)
        return b"ERROR reload failed: internal error\r\n"

    def _status(self, args: tuple[str, ...]) -> bytes:
        session = self.session
        assert session is not None
        if not args:
            return _encode(str(session.current_status()).upper()) + b"\r\n"
        try:
            session.set_status(args[0])
        except (UnknownStatus, ForbiddenStatus):
            raise
        except KestrelError as exc:
            # A stricter change still in its grace period: refused, connection kept.
            return b"ERROR %s\r\n" % _encode(str(exc))
        return _END

    def _dump_config(self, names: tuple[str, ...]) -> bytes:
        """Each queue's resolved settings as C{dump_queue_config} renders them (docs/config.md)."""
        lines: list[str] = []
        for name, settings in self.server.dump_config(names):
            lines.append(f"queue '{name}' {{")
            lines.extend(f"  {line}" for line in settings)
            lines.append("}")
        return _encode("\r\n".join(lines) + "\r\nEND\r\n")


class MemcacheFactory(SessionFactory):
    """
    Builds a L{MemcacheProtocol} per connection over one L{KestrelServer}.

    It tracks live connections so a stopping server can close them all
    (L{SessionFactory.disconnect_all}) before the journals close.
    """

    protocol = MemcacheProtocol
