"""
memcache's binary protocol with Kestrel's queue meaning: packets and handlers.

The codec half is sans-IO (L{parse_header}, L{response}, L{status_reply});
L{BinaryHandler} serves one framed L{BinaryRequest} over a connection's
session, as the text handlers do:

  - Get, GetQ, GetK, GetKQ take the next item of the queue named by the key
    (the key takes the options of C{get}: C{/open}, C{/close}, C{/abort},
    C{/peek}, C{/t=<ms>}); an empty queue is status 0x0001 (key not found),
    silent for the quiet forms;
  - Set, SetQ enqueue the value (expiry from the extras, memcache's rule);
    a refused item is status 0x0005 (not stored); SetQ is silent on success;
  - Delete deletes the queue; Flush flushes every queue (a control command);
    Noop, Version, Stat (every statistic, then an empty terminator) and Quit
    (answered, then the connection closes);
  - every other opcode is status 0x0081 (unknown command): its body was read
    whole by the framer and the connection is kept.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from kestrel.errors import (
    AvailabilityError,
    ControlRefused,
    InvalidQueueName,
    JournalUnavailable,
    ShuttingDown,
    TooManyOpenReads,
)
from kestrel.item import QItem
from kestrel.protocols.memcache_parser import MemcacheParseError, parse_get
from kestrel.settled import in_deferred, settled

if TYPE_CHECKING:
    from twisted.internet.defer import Deferred

    from kestrel.protocols.fetching import DialectHost

__all__ = [
    "BINARY_HEADER_SIZE",
    "BINARY_REQUEST_MAGIC",
    "BinaryHandler",
    "BinaryRequest",
    "CloseAfterReply",
    "error_status",
    "parse_header",
    "response",
    "status_reply",
]

#: The first byte of every binary request, and of every binary response.
BINARY_REQUEST_MAGIC = 0x80
BINARY_RESPONSE_MAGIC = 0x81
BINARY_HEADER_SIZE = 24
_HEADER = struct.Struct(">BBHBBHIIQ")
_SET_EXTRAS = struct.Struct(">II")
_GET_EXTRAS = b"\0\0\0\0"

STATUS_OK = 0x0000
STATUS_NOT_FOUND = 0x0001
STATUS_TOO_LARGE = 0x0003
STATUS_INVALID_ARGUMENTS = 0x0004
STATUS_NOT_STORED = 0x0005
STATUS_UNKNOWN_COMMAND = 0x0081
STATUS_NOT_SUPPORTED = 0x0083
STATUS_INTERNAL_ERROR = 0x0084
STATUS_BUSY = 0x0085
STATUS_TEMPORARY_FAILURE = 0x0086

GET, SET, DELETE, QUIT, FLUSH, GETQ, NOOP, VERSION, GETK, GETKQ, STAT, SETQ = (
    0x00, 0x01, 0x04, 0x07, 0x08, 0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x10, 0x11)
_GETS = frozenset({GET, GETQ, GETK, GETKQ})
_QUIET_GETS = frozenset({GETQ, GETKQ})
_KEYED_GETS = frozenset({GETK, GETKQ})
_OTHERS = frozenset({DELETE, QUIT, FLUSH, NOOP, VERSION, STAT})


class CloseAfterReply(Exception):
    """Raised inside a handler to send C{reply} and then close the connection."""

    def __init__(self, reply: bytes) -> None:
        super().__init__(reply)
        self.reply = reply


class BinaryRequest:
    """One framed binary request: its opcode, opaque, CAS, extras and key (the value aside)."""

    __slots__ = ("cas", "extras", "key", "opaque", "opcode")

    def __init__(self, opcode: int, opaque: int, cas: int, extras: bytes, key: bytes) -> None:
        self.opcode = opcode
        self.opaque = opaque
        self.cas = cas
        self.extras = extras
        self.key = key

    def __repr__(self) -> str:
        return f"BinaryRequest(opcode={self.opcode:#04x}, key={self.key!r})"


def parse_header(header: bytes) -> tuple[int, int, int, int, int, int, int]:
    """
    The fields of a 24-byte request header: magic, opcode, key length, extras
    length, total body length, opaque and CAS.
    """
    magic, opcode, key_length, extras_length, _, _, body, opaque, cas = _HEADER.unpack(header)
    return magic, opcode, key_length, extras_length, body, opaque, cas


def response(opcode: int, opaque: int, status: int = STATUS_OK, value: bytes = b"",
             key: bytes = b"", extras: bytes = b"") -> bytes:
    """One binary response packet (magic 0x81, CAS 0)."""
    body = len(extras) + len(key) + len(value)
    return _HEADER.pack(BINARY_RESPONSE_MAGIC, opcode, len(key), len(extras), 0, status,
                        body, opaque, 0) + extras + key + value


def status_reply(opcode: int, opaque: int, status: int, message: bytes) -> bytes:
    """An error response: C{status} with C{message} as its value."""
    return response(opcode, opaque, status, message)


def error_status(exc: BaseException | None) -> tuple[int, str] | None:
    """
    The status and message a refusal is answered with, connection kept; None
    for a failure that is not a refusal (answered 0x0084, then closed).
    """
    if isinstance(exc, (InvalidQueueName, MemcacheParseError)):
        return STATUS_INVALID_ARGUMENTS, str(exc)
    if isinstance(exc, TooManyOpenReads):
        return STATUS_BUSY, "too many open reads"
    if isinstance(exc, ControlRefused):
        return STATUS_NOT_SUPPORTED, str(exc)
    if isinstance(exc, ShuttingDown):
        return STATUS_TEMPORARY_FAILURE, "server is shutting down"
    if isinstance(exc, (AvailabilityError, JournalUnavailable)):
        return STATUS_TEMPORARY_FAILURE, str(exc)
    return None


class BinaryHandler:
    """Serves binary requests over one L{MemcacheProtocol}'s session."""

    def __init__(self, protocol: DialectHost) -> None:
        self.protocol = protocol

    def serve(self, req: BinaryRequest, value: bytes) -> bytes | Deferred[bytes]:
        """The reply to C{req} (b"" for none), or a Deferred of it."""
        opcode = req.opcode
        if opcode in _GETS:
            return self._get(req, value)
        if opcode == SET or opcode == SETQ:
            return self._set(req, value)
        if opcode not in _OTHERS:
            return status_reply(opcode, req.opaque, STATUS_UNKNOWN_COMMAND, b"Unknown command")
        if value or req.extras and opcode != FLUSH:
            return self._invalid(req, "unexpected extras or value")
        protocol = self.protocol
        session = protocol.session
        assert session is not None
        if opcode == NOOP:
            return response(opcode, req.opaque)
        if opcode == VERSION:
            return response(opcode, req.opaque, value=protocol.server.version.encode())
        if opcode == DELETE:
            if not req.key:
                return self._invalid(req, "missing key")
            session.delete(req.key.decode("latin-1"))
            return response(opcode, req.opaque)
        if opcode == FLUSH:
            session.check_control("flush_all")
            session.flush_all()
            return response(opcode, req.opaque)
        if opcode == STAT:
            return self._stat(req)
        raise CloseAfterReply(response(opcode, req.opaque))  # QUIT

    def _invalid(self, req: BinaryRequest, message: str) -> bytes:
        return status_reply(req.opcode, req.opaque, STATUS_INVALID_ARGUMENTS, message.encode())

    def _get(self, req: BinaryRequest, value: bytes) -> bytes | Deferred[bytes]:
        if req.extras or value or not req.key:
            return self._invalid(req, "a get takes a key and nothing else")
        try:
            get = parse_get(req.key)
        except MemcacheParseError as e:
            return self._invalid(req, e.reason)
        result = self.protocol.fetch(get)
        if isinstance(result, bytes):
            return self._invalid(req, "a read is open on this queue: use /close, /open or /abort")
        if isinstance(result, QItem) or result is None:
            return self._get_reply(result, req)
        return result.addCallback(self._get_reply, req)

    @staticmethod
    def _get_reply(item: QItem | None, req: BinaryRequest) -> bytes:
        opcode = req.opcode
        key = req.key if opcode in _KEYED_GETS else b""
        if item is None:
            if opcode in _QUIET_GETS:
                return b""
            return response(opcode, req.opaque, STATUS_NOT_FOUND, b"Not found", key)
        return response(opcode, req.opaque, value=item.data, key=key, extras=_GET_EXTRAS)

    def _set(self, req: BinaryRequest, value: bytes) -> bytes | Deferred[bytes]:
        if len(req.extras) != 8 or not req.key:
            return self._invalid(req, "a set takes 8 bytes of extras and a key")
        _, exptime = _SET_EXTRAS.unpack(req.extras)
        d: Deferred[bool] = in_deferred(
            self.protocol.enqueue(req.key.decode("latin-1"), value, exptime))
        stored = settled(d)
        if stored.__class__ is bool:
            return self._set_reply(stored, req)
        return d.addCallback(self._set_reply, req)

    @staticmethod
    def _set_reply(stored: bool, req: BinaryRequest) -> bytes:
        if not stored:
            return status_reply(req.opcode, req.opaque, STATUS_NOT_STORED, b"Not stored")
        return b"" if req.opcode == SETQ else response(req.opcode, req.opaque)

    def _stat(self, req: BinaryRequest) -> bytes:
        if req.key:
            return status_reply(req.opcode, req.opaque, STATUS_NOT_FOUND, b"Not found")
        session = self.protocol.session
        if session is not None:  # (the items this pass replied to count as taken)
            session.held_reads.open_peeked()
        out = []
        for line in self.protocol.server.stats_text().splitlines():
            parts = line.split(" ", 2)
            if len(parts) == 3 and parts[0] == "STAT":
                out.append(response(req.opcode, req.opaque, value=parts[2].encode("latin-1",
                                    "backslashreplace"), key=parts[1].encode("latin-1",
                                    "backslashreplace")))
        out.append(response(req.opcode, req.opaque))
        return b"".join(out)
