"""
Kestrel's thrift protocol (port 2229): framed transport, binary protocol.

The IDL is Kestrel's own C{kestrel.thrift}, shipped beside this module and
loaded with thriftpy2. Each connection gets one
L{kestrel.session.ClientSession}; this module only turns frames into calls on
it and results into frames. Requests on one connection are answered in
order: the next frame is decoded only once the reply to the previous one has
been written (Finagle's serial dispatcher).

Errors:
  - an unknown method gets C{TApplicationException(UNKNOWN_METHOD)};
  - a missing argument gets C{TApplicationException(PROTOCOL_ERROR)};
  - a server-side refusal (server status, bad queue name, bad status, ...)
    gets C{TApplicationException(INTERNAL_ERROR)} whose message says why;
  - a frame that cannot be decoded, or one longer than C{max_request_size},
    closes the connection.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import thriftpy2
from thriftpy2.thrift import TApplicationException, TMessageType, TType
from twisted.internet.defer import CancelledError, Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from kestrel.errors import KestrelError, UnknownStatus
from kestrel.item import relative_expiry_ms
from kestrel.protocols.base import SessionFactory, SessionProtocol

if TYPE_CHECKING:
    from kestrel.server import KestrelServer
    from kestrel.session import ClientSession

try:
    # (thriftpy2 re-exports its compiled protocol with a star import from an
    # extension module it ships no types for, so mypy cannot see the name.)
    from thriftpy2.protocol.cybin import TCyBinaryProtocol as _BinaryProtocol  # type: ignore[attr-defined]
    from thriftpy2.transport.memory import TCyMemoryBuffer as _MemoryBuffer
except ImportError:  # pragma: no cover - thriftpy2 built without its C extensions
    from thriftpy2.protocol.binary import TBinaryProtocol as _BinaryProtocol
    from thriftpy2.transport.memory import TMemoryBuffer as _MemoryBuffer

#: Path of the IDL inside the installed package.
IDL_PATH = Path(__file__).with_name("kestrel.thrift")

#: The module thriftpy2 builds from Kestrel's IDL (structs, enum, service).
kestrel_thrift: Any = thriftpy2.load(str(IDL_PATH), module_name="kestrel_thrift")

_SERVICE = kestrel_thrift.Kestrel
_FRAME_HEADER = struct.Struct(">i")

#: Server status name (lower-cased) to the IDL's C{Status} values.
_STATUS_TO_THRIFT = {
    "up": kestrel_thrift.Status.UP,
    "readonly": kestrel_thrift.Status.READ_ONLY,
    "quiescent": kestrel_thrift.Status.QUIESCENT,
}

#: IDL C{Status} values to the names C{ClientSession.set_status} accepts.
_THRIFT_TO_STATUS = {
    kestrel_thrift.Status.UP: "up",
    kestrel_thrift.Status.READ_ONLY: "readonly",
    kestrel_thrift.Status.QUIESCENT: "quiescent",
}


class FrameError(ValueError):
    """A request frame that is not a well-formed binary-protocol message."""


class MissingArgumentError(Exception):
    """A request frame that leaves out an argument the IDL gives no default for."""


_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_DOUBLE = struct.Struct(">d")
_FIXED_WIDTH = {TType.BOOL: _I8, TType.BYTE: _I8, TType.I16: _I16, TType.I32: _I32,
                TType.I64: _I64, TType.DOUBLE: _DOUBLE}
_MAX_DEPTH = 16
_VERSION_1 = -2147418112  # 0x80010000 as a signed int


class FrameReader:
    """
    A strict reader of one binary-protocol message held in memory.

    Every read is bounds-checked and every container size is checked against
    the bytes left, so a hostile frame costs at most its own length: it
    raises L{FrameError}. (thriftpy2's C reader does not check short reads,
    and its Python reader loops on huge container sizes; neither is used to
    decode requests.) Field specs come from the thriftpy2 module of the IDL.
    """

    __slots__ = ("_data", "_pos", "_end")

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0
        self._end = len(data)

    def _fixed(self, codec: struct.Struct) -> Any:
        pos = self._pos
        if self._end - pos < codec.size:
            raise FrameError("frame ends inside a value")
        self._pos = pos + codec.size
        return codec.unpack_from(self._data, pos)[0]

    def _bytes(self) -> bytes:
        size = self._fixed(_I32)
        pos = self._pos
        if size < 0 or size > self._end - pos:
            raise FrameError(f"string of {size} bytes in a frame with {self._end - pos} left")
        self._pos = pos + size
        return self._data[pos:pos + size]

    def read_message_begin(self) -> tuple[str, int, int]:
        """The message's method name, message type and sequence id (strict or not)."""
        first = self._fixed(_I32)
        if first < 0:
            if first & -0x10000 != _VERSION_1:
                raise FrameError(f"bad protocol version {first & 0xFFFF0000:#x}")
            message_type = first & 0xFF
            name = self._bytes()
        else:
            self._pos -= 4
            name = self._bytes()
            message_type = self._fixed(_I8)
        seqid = self._fixed(_I32)
        try:
            return name.decode("utf-8"), message_type, seqid
        except UnicodeDecodeError:
            raise FrameError("method name is not UTF-8") from None

    def read_struct(self, obj: Any, depth: int = 0) -> Any:
        """Fill the thriftpy2 struct C{obj} from the wire, skipping unknown or mistyped fields."""
        if depth > _MAX_DEPTH:
            raise FrameError("structures nested too deeply")
        spec = obj.thrift_spec
        while True:
            wire_type = self._fixed(_I8)
            if wire_type == TType.STOP:
                return obj
            field_id = self._fixed(_I16)
            field = spec.get(field_id)
            if field is None or _wire_type(field[0]) != wire_type:
                self._skip(wire_type, depth)
                continue
            element = field[2] if len(field) == 4 else None
            setattr(obj, field[1], self._value(field[0], element, depth))

    def _value(self, spec_type: int, element: Any, depth: int) -> Any:
        codec = _FIXED_WIDTH.get(spec_type)
        if codec is not None:
            value = self._fixed(codec)
            return bool(value) if spec_type == TType.BOOL else value
        if spec_type == TType.BINARY:
            return self._bytes()
        if spec_type == TType.STRING:
            raw = self._bytes()
            try:
                return raw.decode("utf-8")
            except UnicodeDecodeError:
                return raw
        if spec_type == TType.STRUCT:
            return self.read_struct(element(), depth + 1)
        if spec_type in (TType.LIST, TType.SET):
            element_type, element_spec = (element if isinstance(element, tuple)
                                          else (element, None))
            wire_type = self._fixed(_I8)
            size = self._container_size()
            if wire_type != _wire_type(element_type):
                for _ in range(size):
                    self._skip(wire_type, depth + 1)
                return None
            values = [self._value(element_type, element_spec, depth + 1) for _ in range(size)]
            return set(values) if spec_type == TType.SET else values
        raise FrameError(f"type {spec_type} is not used by the IDL")

    def _container_size(self) -> int:
        size = self._fixed(_I32)
        if size < 0 or size > self._end - self._pos:
            raise FrameError(f"container of {size} elements in a frame with "
                             f"{self._end - self._pos} bytes left")
        return size

    def _skip(self, wire_type: int, depth: int) -> None:
        if depth > _MAX_DEPTH:
            raise FrameError("structures nested too deeply")
        codec = _FIXED_WIDTH.get(wire_type)
        if codec is not None:
            self._fixed(codec)
        elif wire_type == TType.STRING:
            self._bytes()
        elif wire_type == TType.STRUCT:
            while (field_type := self._fixed(_I8)) != TType.STOP:
                self._fixed(_I16)
                self._skip(field_type, depth + 1)
        elif wire_type in (TType.LIST, TType.SET):
            element_type = self._fixed(_I8)
            for _ in range(self._container_size()):
                self._skip(element_type, depth + 1)
        elif wire_type == TType.MAP:
            key_type, value_type = self._fixed(_I8), self._fixed(_I8)
            for _ in range(self._container_size()):
                self._skip(key_type, depth + 1)
                self._skip(value_type, depth + 1)
        else:
            raise FrameError(f"unknown wire type {wire_type}")


def _wire_type(spec_type: int) -> int:
    """The type code on the wire for a thriftpy2 spec type (binary travels as string)."""
    return TType.STRING if spec_type == TType.BINARY else spec_type


def _required_args(api: str) -> list[str]:
    """Names of the arguments of C{api} that have no default in the IDL."""
    args_class = getattr(_SERVICE, api + "_args")
    defaults = args_class.default_spec
    names = [spec[1] for spec in args_class.thrift_spec.values()]
    return [name for name, (_, default) in zip(names, defaults, strict=True) if default is None]


_REQUIRED_ARGS = {api: _required_args(api) for api in _SERVICE.thrift_services}


class ThriftCalls:
    """
    The eleven calls of Kestrel's IDL, over one connection's session.

    Each method takes the IDL's arguments and returns the IDL's result, or a
    L{Deferred} firing with it; it raises (or fails with) a
    L{kestrel.errors.KestrelError} when the server refuses.
    """

    _log = Logger()

    def __init__(self, server: KestrelServer, session: ClientSession) -> None:
        self._server = server
        self._session = session
        self._clock = server.clock

    def put(self, queue_name: str, items: list[bytes], expiration_msec: int) -> Any:
        """
        Add C{items} in order; the result is how many were stored before the
        first refusal. C{expiration_msec == 0} means the items never expire.

        When the queue acknowledges durably, the result fires after the fsync
        covering the stored items. A refusal is known at once, so the items
        following it are never offered.
        """
        now_ms = int(self._clock.seconds() * 1000)
        expiry_ms = relative_expiry_ms(expiration_msec, now_ms)
        return self._session.set_items(queue_name, items, expiry_ms,
                                       stop_at_refusal=True).addCallback(
            self._count_stored, queue_name)

    def _count_stored(self, outcomes: list[object], queue_name: str) -> int:
        """How many items were stored before the first refusal or failure."""
        count = 0
        for outcome in outcomes:
            if outcome is True:
                count += 1
                continue
            if isinstance(outcome, Failure):
                if count == 0:
                    outcome.raiseException()
                self._log.warn("put to {queue} stopped after {count} items: {error}",
                               queue=queue_name, count=count, error=outcome.getErrorMessage())
            break
        return count

    def get(self, queue_name: str, max_items: int, timeout_msec: int,
            auto_abort_msec: int) -> Deferred[list[Any]]:
        """
        Fetch up to C{max_items} items, waiting up to C{timeout_msec} (0: only
        what is there now). With C{auto_abort_msec > 0} the items are open
        reads with process-wide ids, aborted after that many ms unless
        confirmed.
        """
        deadline = None if timeout_msec == 0 else self._clock.seconds() + timeout_msec / 1000.0
        d = self._session.get_items(queue_name, max_items, deadline, auto_abort_msec)
        item_class = kestrel_thrift.Item
        return d.addCallback(
            lambda pairs: [item_class(data=item.data, id=xid) for xid, item in pairs])

    def confirm(self, queue_name: str, ids: Iterable[int]) -> int | Deferred[int]:
        """Confirm the open reads C{ids} (from any connection); the result counts those found."""
        return self._session.confirm_ids(queue_name, set(ids))

    def abort(self, queue_name: str, ids: Iterable[int]) -> int:
        """Return the open reads C{ids} to their queue; the result counts those found."""
        return self._session.abort_ids(queue_name, set(ids))

    def peek(self, queue_name: str) -> Deferred[Any]:
        """The queue's head item (unset when empty) and its counters, removing nothing."""
        d = self._session.get_item(queue_name, None, False, True)
        return d.addCallback(self._queue_info, queue_name)

    def _queue_info(self, item: Any, queue_name: str) -> Any:
        """Build the IDL's C{QueueInfo} from a peeked item and the session's queue counters."""
        info = self._session.queue_info(queue_name)
        if info is None:
            raise KestrelError(f"No queue statistics for {queue_name!r}")
        return kestrel_thrift.QueueInfo(
            head_item=None if item is None else item.data,
            items=info.items,
            bytes=info.bytes,
            journal_bytes=info.journal_bytes,
            age=info.age,
            waiters=info.waiters,
            open_transactions=info.open_transactions,
        )

    def flush_queue(self, queue_name: str) -> Any:
        """Remove every item of the queue (open reads are kept)."""
        return self._session.flush(queue_name)

    def flush_all_queues(self) -> Any:
        """Flush every queue."""
        return self._session.flush_all()

    def delete_queue(self, queue_name: str) -> Any:
        """Delete the queue and its journal files."""
        return self._session.delete(queue_name)

    def current_status(self) -> int:
        """The server's reported status as the IDL's enum (C{NOT_CONFIGURED} for others)."""
        try:
            name = self._session.current_status()
        except KestrelError:
            return kestrel_thrift.Status.NOT_CONFIGURED
        return _STATUS_TO_THRIFT.get(str(name).lower(), kestrel_thrift.Status.NOT_CONFIGURED)

    def set_status(self, status: int) -> Any:
        """Change the server's status; C{NOT_CONFIGURED} and unknown values are refused."""
        name = _THRIFT_TO_STATUS.get(status)
        if name is None:
            raise UnknownStatus(f"Unknown status: {status}")
        return self._session.set_status(name)

    def get_version(self) -> str:
        """The server's version string."""
        return self._server.version


class ThriftProtocol(SessionProtocol):
    """
    One thrift connection: 4-byte big-endian length frames, binary protocol,
    strict or non-strict message headers in, strict headers out.

    Frames are decoded one at a time: while a call is running, later frames
    wait in order (reading goes on, so that a close ends a waiting call at
    once; it pauses only past C{max_request_size} bytes of waiting input). A client that half-closes
    still gets the replies to the frames it sent (L{SessionProtocol}). Its
    open reads stay open after the connection ends, until confirmed,
    aborted or auto-aborted.
    """

    _log = Logger()
    protocol_name = "thrift"

    #: Largest frame accepted; set from the server's C{max_request_size}.
    MAX_LENGTH = 64 * 1024 * 1024

    def __init__(self, server: KestrelServer) -> None:
        super().__init__(server)
        self.MAX_LENGTH = server.config.max_request_size
        self._buffer = bytearray()
        self._frames: deque[bytes] = deque()
        self._busy = False
        self._paused = False
        self._closed = False
        self._queued_bytes = 0
        self._calls: ThriftCalls | None = None

    def session_started(self) -> None:
        """Bind the IDL's calls to the new session."""
        assert self.session is not None
        self._calls = ThriftCalls(self.server, self.session)

    def is_answering(self) -> bool:
        """Whether a call is running (later frames wait behind it)."""
        return self._busy

    def stop_answering(self) -> None:
        """Answer nothing more; drop the frames not yet run."""
        self._closed = True
        self._frames.clear()
        self._queued_bytes = 0

    def dataReceived(self, data: bytes) -> None:
        """Cut the stream into frames and run them in order."""
        buf = self._buffer
        buf += data
        header_size = _FRAME_HEADER.size
        pos = 0
        end = len(buf)
        while end - pos >= header_size:
            (length,) = _FRAME_HEADER.unpack_from(buf, pos)
            if length < 0 or length > self.MAX_LENGTH:
                del buf[:]
                self.lengthLimitExceeded(length)
                return
            start = pos + header_size
            if end - start < length:
                break
            self._frames.append(bytes(buf[start:start + length]))
            self._queued_bytes += length
            pos = start + length
        if pos:
            del buf[:pos]
        if not self._count_input():
            self._out_of_memory()
            return
        if not self._busy:
            self._run_frames()
        elif not self._paused and self._queued_bytes + len(buf) > self.MAX_LENGTH + 4:
            # Reading goes on while a call waits, so that a close (FIN or RST)
            # ends the wait at once; it pauses past one frame of the largest size.
            self._paused = True
            self.pause_input()

    def _count_input(self) -> bool:
        """
        Count what this connection holds against C{max_client_memory}: the
        frames waiting to run, and the frame being read at its declared size
        (so that memory is refused before a large frame is read). Return
        whether the server allows it.
        """
        buf = self._buffer
        held = self._queued_bytes + len(buf)
        if len(buf) >= _FRAME_HEADER.size:
            held = self._queued_bytes + _FRAME_HEADER.size + _FRAME_HEADER.unpack_from(buf, 0)[0]
        return self.hold_input(held)

    def _out_of_memory(self) -> None:
        """Close a connection whose input the server-wide C{max_client_memory} cannot hold."""
        self._log.info("Closing thrift connection: out of memory for client requests "
                       "(max_client_memory)")
        del self._buffer[:]
        self._frames.clear()
        self._queued_bytes = 0
        self._closed = True
        self.close_connection()

    def lengthLimitExceeded(self, length: int) -> None:
        """Drop a connection announcing a frame over C{max_request_size} (or negative)."""
        self._log.info("Closing thrift connection: frame of {length} bytes (limit {limit})",
                       length=length, limit=self.MAX_LENGTH)
        self._frames.clear()
        self._queued_bytes = 0
        self._closed = True
        self.close_connection()

    def _run_frames(self) -> None:
        """Answer queued frames in order until one has to wait."""
        frames = self._frames
        while frames and not self._closed and not self.output_blocked:
            frame = frames.popleft()
            self._queued_bytes -= len(frame)
            d = self._dispatch(frame)
            if d is not None:
                self._busy = True
                d.addBoth(self._call_finished)
                return
        if self._closed:
            return
        self._count_input()  # frames ran: count less (shrinking is always allowed)
        if self._paused:
            self._paused = False
            self.resume_input()
        if self._read_closed:
            self.close_connection()

    def output_resumed(self) -> None:
        """The client read its replies: answer the frames that waited meanwhile."""
        if not self._busy and not self._closed:
            self._run_frames()

    def _call_finished(self, _: object) -> None:
        """A waiting call has replied: go on with the next frame."""
        self._busy = False
        self._run_frames()

    def _dispatch(self, frame: bytes) -> Deferred[None] | None:
        """
        Decode one frame and run its call; returns None when the reply has
        been written already, or a Deferred firing once it is.
        """
        reader = FrameReader(frame)
        try:
            api, message_type, seqid = reader.read_message_begin()
            if message_type != TMessageType.CALL:
                self._send_exception(
                    api, seqid, TApplicationException.INVALID_MESSAGE_TYPE,
                    f"Expected a call, got message type {message_type}")
                return None
            if api not in _REQUIRED_ARGS:
                self._send_exception(api, seqid, TApplicationException.UNKNOWN_METHOD,
                                     f"Invalid method name: '{api}'")
                return None
            args = reader.read_struct(getattr(_SERVICE, api + "_args")())
        except FrameError as e:
            self._log.info("Closing thrift connection: undecodable frame ({error})", error=str(e))
            self._frames.clear()
            self._queued_bytes = 0
            self._closed = True
            self.close_connection()
            return None
        try:
            for name in _REQUIRED_ARGS[api]:
                if getattr(args, name) is None:
                    raise MissingArgumentError(f"{api}: missing argument '{name}'")
            if isinstance(getattr(args, "queue_name", ""), bytes):
                raise KestrelError("Queue name is not valid UTF-8")
            method: Callable[..., Any] = getattr(self._calls, api)
            names = [spec[1] for spec in args.thrift_spec.values()]
            outcome = method(*[getattr(args, name) for name in names])
        except Exception as e:
            self._send_failure(api, seqid, Failure(e))
            return None
        if isinstance(outcome, Deferred):
            box: list[Any] = []
            outcome.addBoth(box.append)
            if not box:
                return outcome.addCallback(lambda _: self._send_outcome(api, seqid, box[0]))
            outcome = box[0]
        self._send_outcome(api, seqid, outcome)
        return None

    def _send_outcome(self, api: str, seqid: int, outcome: Any) -> None:
        """Write the reply to a finished call: its result, or its failure as an exception."""
        if isinstance(outcome, Failure):
            self._send_failure(api, seqid, outcome)
            return
        result = getattr(_SERVICE, api + "_result")()
        if outcome is not None:
            result.success = outcome
        try:
            self._send_message(api, TMessageType.REPLY, seqid, result)
        except Exception:
            failure = Failure()
            if self.session is not None:
                self.session.held_reads.put_back_pending()  # (no reply carries them)
            self._send_failure(api, seqid, failure)

    def _send_failure(self, api: str, seqid: int, failure: Failure) -> None:
        """Turn a failed call into the C{TApplicationException} the client sees."""
        error = failure.value
        if isinstance(error, MissingArgumentError):
            self._send_exception(api, seqid, TApplicationException.PROTOCOL_ERROR, str(error))
        elif isinstance(error, KestrelError):
            self._send_exception(api, seqid, TApplicationException.INTERNAL_ERROR, str(error))
        elif isinstance(error, CancelledError) and self._closed:
            return
        else:
            self._log.failure("Thrift call {api} failed", failure, api=api)
            self._send_exception(api, seqid, TApplicationException.INTERNAL_ERROR,
                                 f"Internal error: {type(error).__name__}: {error}")

    def _send_exception(self, api: str, seqid: int, kind: int, message: str) -> None:
        """Write a C{TApplicationException} reply."""
        self._send_message(api, TMessageType.EXCEPTION, seqid,
                           TApplicationException(kind, message))

    def _send_message(self, api: str, message_type: int, seqid: int, body: Any) -> None:
        """Serialize one message (strict header) and write it as a frame."""
        if self._closed:
            return
        out = _MemoryBuffer()
        oprot = _BinaryProtocol(out, strict_read=False, strict_write=True)
        oprot.write_message_begin(api, message_type, seqid)
        oprot.write_struct(body)
        oprot.write_message_end()
        payload = out.getvalue()
        self.write_reply(_FRAME_HEADER.pack(len(payload)) + payload)


class ThriftFactory(SessionFactory):
    """
    Builds a L{ThriftProtocol} per connection over one C{KestrelServer}, and
    tracks the live ones so a stopping server can end them
    (L{SessionFactory.disconnect_all}).
    """

    protocol = ThriftProtocol
