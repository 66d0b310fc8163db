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
    RECENT_LINE_LIMIT,
    GetRequest,
    MemcacheParseError,
    Refusal,
    Request,
    SetRequest,
    Unframable,
    encode_text,
    parse_line,
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

#: How many request lines one framer remembers with their requests (L{RequestFramer.frame_text}).
KNOWN_LINES = 8

_BAD_CHUNK = b"CLIENT_ERROR bad data chunk\r\n"

#: What L{RequestFramer._frame_line} answers for a request that announces a
#: data block (C{(_BLOCK, request, None, 0)}): C{frame_text} frames the block.
_BLOCK = 4

#: A dialect's framing function: C{frame(buf, pos)}, answered as L{RequestFramer.frame}.
Frame = Callable[[bytes, int], tuple[int, Any, Any, int]]


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

    __slots__ = ("binary", "max_request_size", "_known", "_set_line", "_set_request")

    def __init__(self, max_request_size: int) -> None:
        self.max_request_size = max_request_size
        #: None until the first byte is seen; then whether the connection is binary.
        self.binary: bool | None = None
        # (get and set lines this framer parsed, with their line endings, and
        # their requests: lines that passed its checks)
        self._known: dict[bytes, GetRequest | SetRequest] = {}
        # (the last set line met, known, and its request: tried first, by comparison)
        self._set_line = b""
        self._set_request: SetRequest | None = None

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

        Clients repeat the same few lines (C{get q}, C{set q 0 0 1024}): the
        last L{KNOWN_LINES} C{get} and C{set} lines this framer parsed are
        kept with their line endings, and a line met again is framed from
        its request without being checked or parsed again. Everything those
        checks decide is in the line or fixed for the framer (its
        C{max_request_size}), so the outcome is the same. (The parser's own
        memory, L{parse_line}'s, spares the parse only: it is keyed by the
        line without its ending and shared by every connection, so the
        line's checks would run again.)
        """
        request: Any  # (a GetRequest, SetRequest or MetaSet, by the branch)
        if not pos and len(buf) <= RECENT_LINE_LIMIT:
            # (a read that is one known get line, the usual get: framed from
            # the read itself, without the find and slice below, which cost more)
            request = self._known.get(buf)
            if request.__class__ is GetRequest:
                return SERVE, request, None, len(buf)
        set_line = self._set_line
        after = pos + len(set_line)
        if set_line and buf[pos:after] == set_line:
            # (a producer's next set, the usual one: its line compared, not found)
            request = self._set_request
        else:
            nl = buf.find(b"\n", pos)
            request = self._known.get(buf[pos:nl + 1]) if nl >= 0 else None
            if request is None:
                framed = self._frame_line(buf, pos, nl)
                if framed[0] != _BLOCK:
                    return framed
                request = framed[1]
            elif request.__class__ is GetRequest:
                return SERVE, request, None, nl + 1
            after = nl + 1
        # (a set or a meta set, within max_request_size: its data block and
        # "\r\n" follow the line)
        data_end = after + request.length
        if len(buf) < data_end + 2:
            return NEED, data_end + 2 - pos, data_end + 2 - pos, 0
        if buf[data_end] != 13 or buf[data_end + 1] != 10:
            return UNFRAMABLE, _BAD_CHUNK, None, 0
        return SERVE, request, buf[after:data_end], data_end + 2

    def _frame_line(self, buf: bytes, pos: int, nl: int) -> tuple[int, Any, Any, int]:
        """
        Frame the request at C{buf[pos:]}, whose line ends at C{nl} (-1: not
        yet), parsing its line; one that announces a data block within
        C{max_request_size} is answered C{(_BLOCK, request, None, 0)}, for
        L{frame_text} to frame the block.
        """
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
            if request.__class__ is SetRequest:
                self._remember(buf, pos, after, request)
            return _BLOCK, request, None, 0
        if request.__class__ is GetRequest:
            self._remember(buf, pos, after, request)
        elif request.__class__ is Unframable:
            return UNFRAMABLE, request.reply, None, 0
        elif request.__class__ is Refusal:
            return REFUSE, request.reply, None, after
        return SERVE, request, None, after

    def _remember(self, buf: bytes, pos: int, after: int,
                  request: GetRequest | SetRequest) -> None:
        """Keep the line at C{buf[pos:after]} (a short one) and its C{request}."""
        if after - pos <= RECENT_LINE_LIMIT:
            known = self._known
            if len(known) >= KNOWN_LINES:
                known.clear()
            line = buf[pos:after]
            known[line] = request
            if request.__class__ is SetRequest:
                self._set_line = line
                self._set_request = request

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
