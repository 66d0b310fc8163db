"""
Sans-IO framing of memcache requests: where one request ends and the next begins.

L{RequestFramer.frame} looks at a buffer from a position and says one of three
things: here is a whole request (its parsed header, its data block if it has
one, and where it ends); more bytes are needed (how many, counted from the
position); or the bytes cannot be framed, so the connection must close after
one last reply. No I/O, no Twisted, no session: the protocol feeds bytes in
and serves the requests that come out.

The promise that matters: no byte of a request is ever read as another
request. A request line whose data block the server cannot size (a storage
command with a bad byte count, an unknown command word, which may carry a
data block of unknown size) is not framed; the connection ends instead.

A connection speaks one of two dialects, chosen by its first byte: C{0x80}
(the binary request magic) is the binary protocol for the whole connection,
anything else the text protocol, whose lines may be classic commands
(C{get}, C{set}, ...) or meta commands (C{mg}, C{ms}, C{md}, C{mn}, ...).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kestrel.protocols.binary import (
    BINARY_HEADER_SIZE,
    BINARY_REQUEST_MAGIC,
    STATUS_INVALID_ARGUMENTS,
    STATUS_TOO_LARGE,
    BinaryRequest,
    parse_header,
    status_reply,
)
from kestrel.protocols.memcache_parser import (
    GetRequest,
    MemcacheParseError,
    Refusal,
    Request,
    SetRequest,
    Unframable,
    encode_text,
    parse_line,
    recent_request,
)
from kestrel.protocols.meta import MetaRequest, MetaSet, is_meta_word, parse_meta

__all__ = ["NEED", "REFUSE", "SERVE", "UNFRAMABLE", "Frame", "RequestFramer"]

#: The first byte of every meta command word (as ints: what indexing bytes gives).
_META_FIRST = frozenset(b"mM")

#: Outcomes of L{RequestFramer.frame}, the first item of its tuple.
SERVE = 0
NEED = 1
REFUSE = 2
UNFRAMABLE = 3

_BAD_CHUNK = b"CLIENT_ERROR bad data chunk\r\n"

#: A dialect's framing function: C{frame(buf, pos)}, answered as L{RequestFramer.frame}.
Frame = Callable[[bytes, int], tuple[int, Any, Any, int]]


def _with_block(buf: bytes, pos: int, after: int,
                request: SetRequest | MetaSet) -> tuple[int, Any, Any, int]:
    """
    Frame C{request} (at C{pos}, its line ending at C{after}), whose data
    block of C{request.length} bytes and C{\\r\\n} follow the line: served
    whole, more bytes needed, or unframable if the block does not end there.
    """
    data_end = after + request.length
    if len(buf) < data_end + 2:
        return NEED, data_end + 2 - pos, data_end + 2 - pos, 0
    if buf[data_end] != 13 or buf[data_end + 1] != 10:
        return UNFRAMABLE, _BAD_CHUNK, None, 0
    return SERVE, request, buf[after:data_end], data_end + 2


class RequestFramer:
    """
    Frames the requests of one connection (sans-IO).

    C{frame(buf, pos)} returns a tuple whose first item says what follows:
      - C{(SERVE, request, data, end)}: a whole request; C{data} is its data
        block (without the trailing C{\\r\\n}) or C{None}; the next request
        starts at C{end};
      - C{(NEED, need, reserve, 0)}: the request starting at C{pos} is not
        whole; C{need} bytes from C{pos} are needed before framing is worth
        trying again (0: a line end is needed), and C{reserve} of them were
        declared by the request (its data block), for memory accounting;
      - C{(REFUSE, reply, None, end)}: a request framed whole that is answered
        with C{reply} alone (a bad line that can be skipped);
      - C{(UNFRAMABLE, reply, None, 0)}: the bytes at C{pos} cannot be framed:
        send C{reply}, then close the connection.
    """

    __slots__ = ("binary", "max_request_size")

    def __init__(self, max_request_size: int) -> None:
        self.max_request_size = max_request_size
        #: None until the first byte is seen; then whether the connection is binary.
        self.binary: bool | None = None

    def frame(self, buf: bytes, pos: int) -> tuple[int, Any, Any, int]:
        """Frame the request at C{buf[pos:]} (see the class docstring)."""
        return self.framer_for(buf[pos])(buf, pos)

    def framer_for(self, first_byte: int) -> Frame:
        """
        The framing function of this connection's dialect, which C{first_byte}
        (the connection's first byte) chooses if it is not chosen yet; a
        caller framing many requests calls it once and the function it
        returns for each.
        """
        if self.binary is None:
            self.binary = first_byte == BINARY_REQUEST_MAGIC
        return self.frame_binary if self.binary else self.frame_text

    def frame_text(self, buf: bytes, pos: int) -> tuple[int, Any, Any, int]:
        """
        Frame a text or meta request at C{buf[pos:]} (as L{frame}).

        Clients repeat the same few lines (C{get q}, C{set q 0 0 1024}): a
        C{get} or C{set} line ending in C{\\r\\n} that the parser met
        recently (L{recent_request}) is framed from its request without
        being parsed again, making again only the checks that depend on
        this framer's C{max_request_size}. Any other line takes the full
        path, with the same outcome.
        """
        nl = buf.find(b"\n", pos)
        if nl > pos and buf[nl - 1] == 13:
            request = recent_request(buf[pos:nl - 1])
            limit = self.max_request_size
            if request is not None and nl - 1 - pos <= limit:
                if isinstance(request, GetRequest):
                    return SERVE, request, None, nl + 1
                if request.length <= limit:
                    return _with_block(buf, pos, nl + 1, request)
        return self._frame_line(buf, pos, nl)

    def _frame_line(self, buf: bytes, pos: int, nl: int) -> tuple[int, Any, Any, int]:
        """Frame the request at C{buf[pos:]}, whose line ends at C{nl} (-1: not yet)."""
        size = len(buf)
        limit = self.max_request_size
        if nl < 0:
            # (one more byte may be the "\r" of a line of the largest size)
            if size - pos > limit + 1:
                return UNFRAMABLE, b"CLIENT_ERROR request line too long\r\n", None, 0
            return NEED, 0, 0, 0
        end = nl - 1 if nl > pos and buf[nl - 1] == 13 else nl
        if end - pos > limit:
            return UNFRAMABLE, b"CLIENT_ERROR request line too long\r\n", None, 0
        line = buf[pos:end]
        after = nl + 1
        request: Request | MetaRequest
        try:
            if buf[pos] in _META_FIRST and is_meta_word(line):
                request = parse_meta(line)
            else:
                request = parse_line(line)
        except MemcacheParseError as err:
            reply = b"CLIENT_ERROR %s\r\n" % encode_text(err.reason)
            if err.disconnect:
                return UNFRAMABLE, reply, None, 0
            return REFUSE, reply, None, after
        if request.__class__ is SetRequest or request.__class__ is MetaSet:
            length = request.length
            if length > limit:
                return (UNFRAMABLE, b"CLIENT_ERROR item of %d bytes is larger than "
                        b"max_request_size (%d)\r\n" % (length, limit), None, 0)
            return _with_block(buf, pos, after, request)
        if request.__class__ is Unframable:
            return UNFRAMABLE, request.reply, None, 0
        if request.__class__ is Refusal:
            return REFUSE, request.reply, None, after
        return SERVE, request, None, after

    def frame_binary(self, buf: bytes, pos: int) -> tuple[int, Any, Any, int]:
        """Frame a binary request at C{buf[pos:]} (as L{frame})."""
        size = len(buf)
        if size - pos < BINARY_HEADER_SIZE:
            return NEED, BINARY_HEADER_SIZE, 0, 0
        header = buf[pos:pos + BINARY_HEADER_SIZE]
        magic, opcode, key_length, extras_length, body_length, opaque, cas = parse_header(header)
        if magic != BINARY_REQUEST_MAGIC:
            return (UNFRAMABLE, status_reply(opcode, opaque, STATUS_INVALID_ARGUMENTS,
                                             b"bad request magic"), None, 0)
        if key_length + extras_length > body_length:
            return (UNFRAMABLE, status_reply(opcode, opaque, STATUS_INVALID_ARGUMENTS,
                                             b"key and extras longer than the body"), None, 0)
        if body_length > self.max_request_size + key_length + extras_length:
            return (UNFRAMABLE, status_reply(opcode, opaque, STATUS_TOO_LARGE,
                                             b"larger than max_request_size"), None, 0)
        start = pos + BINARY_HEADER_SIZE
        end = start + body_length
        if size < end:
            total = end - pos
            return NEED, total, total, 0
        key_start = start + extras_length
        value_start = key_start + key_length
        request = BinaryRequest(opcode, opaque, cas, buf[start:key_start],
                                buf[key_start:value_start])
        return SERVE, request, buf[value_start:end], end
