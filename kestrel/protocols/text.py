"""
Kestrel's text protocol (port 2222): one command per line, usable by hand.

Requests are lines ending in C{\\n} (a C{\\r} before it is dropped); tokens
are separated by spaces. A line ending in C{:} is followed by data lines, one
item each, up to an empty line (at most 1024 items: the line arriving when
1024 are buffered is consumed and discarded, and the request runs). Replies
are single lines: C{+<n>} a count, C{-<message>} an error, C{:<data>} an item
or a string, C{*} no item.

Each connection gets one L{kestrel.session.ClientSession}. Requests run one at
a time, in order: while a C{get} waits or a C{monitor} streams, later lines
stay buffered (reading goes on, so a close ends the wait at once; it pauses
only once more than C{max_request_size} bytes are buffered). Every bad
line gets a C{-} error and the connection stays open; only a line longer
than C{max_request_size} closes it (after an error line).
See docs/protocols.md for every command and reply.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import CancelledError, Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from kestrel.errors import (
    ForbiddenStatus,
    KestrelError,
    TooManyOpenReads,
    UnknownStatus,
)
from kestrel.item import relative_expiry_ms
from kestrel.protocols.base import (
    HTTP_REFUSED,
    SessionFactory,
    SessionProtocol,
)

if TYPE_CHECKING:
    from kestrel.server import KestrelServer

#: Most data lines one request may carry (Kestrel's C{MAX_PUT_BUFFER}).
MAX_PUT_BUFFER = 1024

_NO_ITEM = b"*\n"
_INT = re.compile(rb"[+-]?[0-9]{1,10}\Z")
_INT_MIN = -(2**31)
_INT_MAX = 2**31 - 1


class BadRequest(Exception):  # noqa: N818 - a reply, not a failure
    """A request line the protocol answers with C{-<message>}."""


def parse_int(token: bytes, what: str) -> int:
    """
    Parse a decimal 32-bit int as Java's C{Integer.parseInt} would.

    @raise BadRequest: C{-Error parsing <what>.} for anything else.
    """
    if _INT.match(token):
        value = int(token)
        if _INT_MIN <= value <= _INT_MAX:
            return value
    raise BadRequest(f"Error parsing {what}.")


def split_tokens(line: bytes) -> list[bytes]:
    """Split a request line on spaces; runs of spaces count as one separator."""
    return [token for token in line.split(b" ") if token]


def item_reply(data: bytes | None) -> bytes:
    """C{:<data>} for an item, C{*} for none."""
    if data is None:
        return _NO_ITEM
    return b":" + data + b"\n"


def count_reply(count: int) -> bytes:
    """C{+<count>}."""
    return b"+%d\n" % count


def error_reply(message: str) -> bytes:
    """C{-<message>} on one line."""
    one_line = " ".join(message.splitlines())
    return b"-" + one_line.encode("latin-1", "replace") + b"\n"


def string_reply(text: str) -> bytes:
    """C{:<text>}."""
    return b":" + text.encode("latin-1", "replace") + b"\n"


class TextProtocol(SessionProtocol):
    """
    One text-protocol connection over its own session.

    A client that half-closes (C{printf 'get q\\n' | nc -N host 2222}) still
    gets the replies to every complete line it sent; then the connection
    closes (L{SessionProtocol}).
    """

    _log = Logger()
    protocol_name = "text"

    #: Longest line (command or data) accepted; set from C{max_request_size}.
    MAX_LENGTH = 64 * 1024 * 1024

    def __init__(self, server: KestrelServer) -> None:
        super().__init__(server)
        self._clock = server.clock
        self._stats = server.stats
        self.MAX_LENGTH = server.config.max_request_size
        self._buffer = bytearray()
        self._scan_from = 0
        self._put_header: list[bytes] | None = None
        self._put_items: list[bytes] = []
        self._put_bytes = 0
        self._put_refused: str | None = None
        self._waiting = False
        self._processing = False
        self._closed = False
        self._commands: dict[bytes, Callable[[list[bytes], list[bytes]], Any]] = {
            b"put": self._put,
            b"get": self._get,
            b"peek": self._peek,
            b"monitor": self._monitor,
            b"confirm": self._confirm,
            b"flush": self._flush,
            b"flush_all": self._flush_all,
            b"delete": self._delete,
            b"status": self._status,
            b"version": self._version,
            b"reload": self._reload,
            b"shutdown": self._shutdown,
            b"quit": self._quit,
        }

    # -- connection -------------------------------------------------------

    def is_answering(self) -> bool:
        """Whether a request waits for its reply (later lines wait behind it)."""
        return self._waiting

    def stop_answering(self) -> None:
        """Answer nothing more; drop the buffered input (and a put body being read)."""
        self._closed = True
        self._buffer.clear()
        self._put_items = []

    def dataReceived(self, data: bytes) -> None:
        """Buffer bytes and run the complete lines, in order."""
        self._stats.bytes_read += len(data)
        if self._closed:
            return
        self._buffer += data
        if not self.hold_input(len(self._buffer) + self._put_bytes):
            self._out_of_memory()
            return
        if self._waiting:
            # Keep reading while a request waits, so that a close (FIN or RST)
            # is seen at once and ends the wait; pause only past one full line.
            if len(self._buffer) > self.MAX_LENGTH + 2:
                self.pause_input()
            return
        if not self._processing:
            self._process_lines()

    def _out_of_memory(self) -> None:
        """Refuse the request being read: the server's max_client_memory is reached."""
        self._write(error_reply("Out of memory for client requests (max_client_memory); "
                                "retry later."))
        self._buffer.clear()
        self._scan_from = 0
        self._put_items = []
        self.close_connection()
        self._closed = True

    def output_resumed(self) -> None:
        """The client read its replies: run the lines that waited meanwhile."""
        if not self._waiting and not self._processing and not self._closed:
            self._process_lines()

    def _process_lines(self) -> None:
        """Run buffered lines until one has to wait or the buffer holds no full line."""
        self._processing = True
        buf = self._buffer
        pos = 0
        limit = self.MAX_LENGTH
        try:
            while not self._waiting and not self._closed and not self.output_blocked:
                newline = buf.find(b"\n", max(pos, self._scan_from))
                if newline < 0:
                    if len(buf) - pos > limit + 1:
                        self.lineLengthExceeded(len(buf) - pos)
                        return
                    self._scan_from = len(buf)
                    break
                self._scan_from = 0
                end = newline
                if end > pos and buf[end - 1] == 13:  # "\r"
                    end -= 1
                if end - pos > limit:
                    self.lineLengthExceeded(end - pos)
                    return
                line = bytes(buf[pos:end])
                pos = newline + 1
                self._line_received(line)
        finally:
            if pos and not self._closed:
                del buf[:pos]
                self._scan_from = max(0, self._scan_from - pos)
            self._processing = False
            if not self._closed:
                self.hold_input(len(buf) + self._put_bytes)

    def lineLengthExceeded(self, length: int) -> None:
        """Answer a line over C{max_request_size} with an error, then close."""
        self._write(error_reply(f"Line too long (limit {self.MAX_LENGTH} bytes)."))
        self._buffer.clear()
        self._scan_from = 0
        self.close_connection()
        self._closed = True

    def _line_received(self, line: bytes) -> None:
        """One line: a data line of a pending C{put}, a C{:}-header, or a command."""
        if self._put_header is not None:
            if line:
                self._put_line(line)
                return
            header, items, refused = self._put_header, self._put_items, self._put_refused
            self._put_header, self._put_items, self._put_refused = None, [], None
            self._put_bytes = 0
            if refused is not None:
                self._write(error_reply(refused))
            else:
                self._run(header, items)
        elif self.awaiting_first_line and self.first_line_is_http(line):
            self._write(error_reply(HTTP_REFUSED + "."))
            self.close_connection()
            self._closed = True
        elif line.endswith(b":"):
            self._put_header = split_tokens(line[:-1])
            self._put_items = []
        else:
            self._run(split_tokens(line), [])

    def _put_line(self, line: bytes) -> None:
        """
        One data line of a C{put} body. A body of more than L{MAX_PUT_BUFFER}
        items or more than C{max_request_size} bytes is refused whole: its
        lines are read to the blank line that ends it and dropped (none is
        run as a command), and the put stores nothing.
        """
        if self._put_refused is not None:
            return
        self._put_bytes += len(line)
        if len(self._put_items) >= MAX_PUT_BUFFER:
            self._put_refused = f"Too many items in one put (limit {MAX_PUT_BUFFER}); none stored."
        elif self._put_bytes > self.MAX_LENGTH:
            self._put_refused = (f"Put body too large (limit {self.MAX_LENGTH} bytes); "
                                 "none stored.")
        else:
            self._put_items.append(line)
            return
        self._put_items = []
        self._put_bytes = 0

    # -- dispatch ---------------------------------------------------------

    def _run(self, tokens: list[bytes], items: list[bytes]) -> None:
        """Run one request; if it has to wait, hold further lines until it replies."""
        command = tokens[0].lower() if tokens else b""
        handler = self._commands.get(command)
        if handler is None:
            self._write(error_reply(f"Unknown command: {command.decode('latin-1')}"))
            return
        try:
            outcome = handler(tokens[1:], items)
        except Exception as e:
            self._write(self._error_for(Failure(e)))
            return
        if isinstance(outcome, Deferred):
            box: list[Any] = []
            outcome.addBoth(box.append)
            if not box:
                self._waiting = True
                outcome.addCallback(lambda _: self._finish_waiting(box[0]))
                return
            outcome = box[0]
        self._reply(outcome)

    def _finish_waiting(self, outcome: Any) -> None:
        """A waiting request has its outcome: reply, then go on with the next lines."""
        self._reply(outcome)
        self._waiting = False
        if self._closed:
            return
        self.resume_input()
        if not self._processing:
            self._process_lines()
        if self._read_closed and not self._waiting:
            self.close_connection()

    def _reply(self, outcome: Any) -> None:
        """Write a request's reply bytes, or the error line for its failure."""
        if isinstance(outcome, Failure):
            if self._closed and outcome.check(CancelledError):
                return
            outcome = self._error_for(outcome)
        if outcome:
            self._write(outcome)

    def _error_for(self, failure: Failure) -> bytes:
        """The C{-} line answering a failed request."""
        error = failure.value
        if isinstance(error, BadRequest):
            return error_reply(str(error))
        if isinstance(error, TooManyOpenReads):
            limit = self.server.max_open_transactions
            return error_reply(f"Too many open transactions; limit={limit}")
        if isinstance(error, UnknownStatus):
            return error_reply("Unknown status.")
        if isinstance(error, ForbiddenStatus):
            return error_reply("Status forbidden.")
        if isinstance(error, KestrelError):
            return error_reply(str(error) or type(error).__name__)
        self._log.failure("Text request failed", failure)
        return error_reply(f"Internal error: {type(error).__name__}: {error}")

    def _write(self, data: bytes) -> None:
        """Send bytes unless the connection is gone."""
        if not self._closed:
            self._stats.bytes_written += len(data)
            self.write_reply(data)

    # -- commands ---------------------------------------------------------

    @staticmethod
    def _queue_name(args: list[bytes]) -> str:
        """The queue-name argument, or C{-Queue name required.}."""
        if not args:
            raise BadRequest("Queue name required.")
        return args[0].decode("latin-1")

    def _deadline(self, args: list[bytes], index: int) -> float | None:
        """The optional timeout (ms) at C{args[index]} as a clock deadline, None if absent."""
        if len(args) <= index:
            return None
        timeout_ms = parse_int(args[index], "timeout")
        return self._clock.seconds() + timeout_ms / 1000.0

    def _put(self, args: list[bytes], items: list[bytes]) -> Any:
        """C{put <q> [expiry_ms]:} + items: C{+<n>} items stored (refused ones are skipped)."""
        name = self._queue_name(args)
        expiry_msec = parse_int(args[1], "expiration time") if len(args) > 1 else 0
        expiry_ms = relative_expiry_ms(expiry_msec, int(self._clock.seconds() * 1000))
        return self.live_session.set_items(name, items, expiry_ms).addCallback(self._stored, name)

    def _stored(self, outcomes: list[object], name: str) -> bytes:
        """C{+<n>}, n counting the items the queue accepted."""
        count = 0
        for outcome in outcomes:
            if outcome is True:
                count += 1
            elif isinstance(outcome, Failure):
                self._log.warn("put to {queue}: an item failed: {error}",
                               queue=name, error=outcome.getErrorMessage())
        return count_reply(count)

    def _get(self, args: list[bytes], items: list[bytes]) -> Any:
        """C{get <q> [timeout_ms]}: confirm this connection's reads on q, then open the next."""
        name = self._queue_name(args)
        deadline = self._deadline(args, 1)
        self._confirm_all_reads(name)
        return self.live_session.get_item(name, deadline, True, False).addCallback(_item_data)

    def _confirm_all_reads(self, name: str) -> None:
        """
        Confirm this connection's open reads on C{name} (the next request on
        it says they arrived), each once its reply is in the kernel.
        """
        if self.live_session.close_all_reads(name, after_replies=True):
            self.settle_replies()

    def _peek(self, args: list[bytes], items: list[bytes]) -> Any:
        """C{peek <q> [timeout_ms]}: confirm this connection's reads on q, then peek."""
        name = self._queue_name(args)
        deadline = self._deadline(args, 1)
        self._confirm_all_reads(name)
        return self.live_session.get_item(name, deadline, False, True).addCallback(_item_data)

    def _monitor(self, args: list[bytes], items: list[bytes]) -> Any:
        """
        C{monitor <q> <timeout_ms>}: confirm this connection's reads on q, then
        stream C{:<data>} per item (each an open read) and C{*} at the end.
        """
        if len(args) < 2:
            raise BadRequest("Queue name & timeout required.")
        name = args[0].decode("latin-1")
        deadline = self._deadline(args, 1)
        self._confirm_all_reads(name)

        def got_item(item: Any) -> None:
            self._write(item_reply(item.data))

        done = self.live_session.monitor_until(
            name, deadline, self.server.max_open_transactions, True, got_item)
        return done.addCallback(lambda _: _NO_ITEM)

    def _confirm(self, args: list[bytes], items: list[bytes]) -> bytes | Deferred[bytes]:
        """
        C{confirm <q> <count>}: confirm the C{count} oldest open reads on q; if
        fewer are open (or count < 1) nothing is confirmed.
        """
        if len(args) < 2:
            raise BadRequest("Queue name & count required.")
        name = args[0].decode("latin-1")
        count = parse_int(args[1], "count")
        closed = self.live_session.close_reads(name, count)
        if not closed:
            raise BadRequest("Not that many transactions open.")
        if closed is True:
            return count_reply(count)
        # (a queue acking durably: the count once the confirms are durable)
        return closed.addCallback(lambda _: count_reply(count))

    def _flush(self, args: list[bytes], items: list[bytes]) -> bytes:
        """C{flush <q>}: C{+0}."""
        self.live_session.flush(self._queue_name(args))
        return b"+0\n"

    def _flush_all(self, args: list[bytes], items: list[bytes]) -> bytes:
        """C{flush_all}: flush every queue, C{+0}."""
        self.live_session.flush_all()
        return b"+0\n"

    def _delete(self, args: list[bytes], items: list[bytes]) -> bytes:
        """C{delete <q>}: C{+0}."""
        self.live_session.delete(self._queue_name(args))
        return b"+0\n"

    def _status(self, args: list[bytes], items: list[bytes]) -> bytes:
        """C{status}: C{:UP} etc.; C{status <name>}: C{+0} once changed."""
        if not args:
            return string_reply(str(self.live_session.current_status()).upper())
        self.live_session.set_status(args[0].decode("latin-1"))
        return b"+0\n"

    def _version(self, args: list[bytes], items: list[bytes]) -> bytes:
        """C{version}: C{:<version>}."""
        return string_reply(self.server.version)

    def _reload(self, args: list[bytes], items: list[bytes]) -> bytes:
        """C{reload}: reread the config file; C{+0}, or C{-<problem>} keeping the old config."""
        self.live_session.check_control("reload")
        self.server.reload()
        return b"+0\n"

    def _shutdown(self, args: list[bytes], items: list[bytes]) -> bytes:
        """C{shutdown}: C{+0}, then the server stops cleanly."""
        self.live_session.check_control("shutdown")
        self._write(b"+0\n")
        self.server.request_shutdown()
        return b""

    def _quit(self, args: list[bytes], items: list[bytes]) -> bytes:
        """C{quit}: close the connection, no reply."""
        self.close_connection()
        self._closed = True
        return b""


def _item_data(item: Any) -> bytes:
    """The reply to a get/peek outcome."""
    return item_reply(None if item is None else item.data)


class TextFactory(SessionFactory):
    """
    Builds a L{TextProtocol} per connection over one C{KestrelServer}, and
    tracks the live ones so a stopping server can end them
    (L{SessionFactory.disconnect_all}).
    """

    protocol = TextProtocol
