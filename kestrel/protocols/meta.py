"""
memcached's meta commands with Kestrel's queue meaning: parser and replies.

L{parse_meta} turns one request line (without its line end) into a request
object and the reply helpers build the reply bytes, with no I/O;
L{MetaHandler} serves the requests over a connection's session for
L{kestrel.protocols.memcache.MemcacheProtocol}.

  - C{ms <key> <datalen> <flags>*} enqueues the data block: C{HD}, or C{NS}
    when the queue refuses it. C{T<seconds>} sets the expiry (memcache's
    rule: up to 30 days relative, else a Unix time); C{q} (no C{HD}),
    C{O<opaque>}, C{k}, C{b} (base64 key) and C{c} (C{c0}) are honoured; C{F}
    (client flags) and C{I}, C{N}, C{S} are accepted and ignored. A mode
    other than C{MS} and a C{C} compare-and-swap token are refused with a
    C{CLIENT_ERROR} once the data block is read.
  - C{mg <key> <flags>*} takes the next item when C{v} is given: C{VA <len>
    <flags>} and the data, or C{EN} when the queue is empty (nothing with
    C{q}). Without C{v}, no item leaves the queue: the head is looked at
    (C{HD <flags>} or C{EN}). Return flags: C{v k f t s O h l c b}. The key
    takes the options of C{get} (C{/open}, C{/close}, C{/abort}, C{/peek},
    C{/t=<ms>}).
  - C{md <key> <flags>*} deletes the queue: C{HD} (nothing with C{q}).
  - C{mn} answers C{MN}.
  - C{ma} and C{me} have no queue meaning: C{CLIENT_ERROR} naming them.
"""

from __future__ import annotations

import binascii
from math import ceil
from typing import TYPE_CHECKING

from twisted.internet.defer import Deferred

from kestrel.item import QItem
from kestrel.protocols.memcache_parser import (
    GetRequest,
    MemcacheParseError,
    Refusal,
    encode_text,
    parse_get,
    parse_int,
    split_tokens,
)
from kestrel.settled import in_deferred, settled

if TYPE_CHECKING:
    from kestrel.protocols.fetching import DialectHost

__all__ = [
    "MetaDelete",
    "MetaGet",
    "MetaHandler",
    "MetaNoop",
    "MetaSet",
    "is_meta_word",
    "meta_get_reply",
    "meta_set_reply",
    "parse_meta",
]

_META_WORDS = frozenset({b"mg", b"ms", b"md", b"mn", b"ma", b"me"})
_MN = b"MN\r\n"
_EN = b"EN\r\n"


def is_meta_word(line: bytes) -> bool:
    """Whether C{line} starts with a meta command word (C{mg}, C{ms}, C{md}, C{mn}, ...)."""
    return (line[:2].lower() in _META_WORDS
            and (len(line) == 2 or line[2] == 32))


class MetaNoop:
    """C{mn}: answered with C{MN} once every request before it is answered."""

    __slots__ = ()


class _Keyed:
    """
    What every keyed meta request has: its key as sent, whether it is base64,
    quiet mode, its opaque token, and the letters of the flags it sent, in
    order (return flags are answered in that order).
    """

    __slots__ = ("base64", "flags", "key", "opaque", "quiet")

    def __init__(self, key: bytes, flags: dict[int, bytes]) -> None:
        self.key = key
        self.flags = bytes(flags)
        self.base64 = 98 in flags  # b
        self.quiet = 113 in flags  # q
        self.opaque = flags.get(79)  # O

    def echo(self, letter: int) -> bytes:
        """The return flag for C{O}, C{k} or C{b} (with its leading blank), else b""."""
        if letter == 79:
            return b" O" + (self.opaque or b"")
        if letter == 107:
            return b" k" + self.key
        if letter == 98 and 107 in self.flags:
            return b" b"
        return b""


class MetaGet(_Keyed):
    """C{mg}: C{get} is the queue request its key stands for."""

    __slots__ = ("get",)

    def __init__(self, key: bytes, flags: dict[int, bytes], get: GetRequest) -> None:
        super().__init__(key, flags)
        self.get = get


class MetaSet(_Keyed):
    """C{ms}: C{length} data bytes follow; C{error} set when they are read and refused."""

    __slots__ = ("error", "length", "name", "ttl")

    def __init__(self, key: bytes, flags: dict[int, bytes], name: str, length: int, ttl: int,
                 error: str | None) -> None:
        super().__init__(key, flags)
        self.name = name
        self.length = length
        self.ttl = ttl
        self.error = error


class MetaDelete(_Keyed):
    """C{md}: delete the queue C{name}."""

    __slots__ = ("name",)

    def __init__(self, key: bytes, flags: dict[int, bytes], name: str) -> None:
        super().__init__(key, flags)
        self.name = name


MetaRequest = MetaGet | MetaSet | MetaDelete | MetaNoop | Refusal


def _flags(tokens: list[bytes]) -> dict[int, bytes]:
    """The flags of a meta line, by flag letter (the last of repeats wins)."""
    flags: dict[int, bytes] = {}
    for token in tokens:
        letter = token[0]
        if not (65 <= letter <= 90 or 97 <= letter <= 122):
            raise MemcacheParseError("invalid flag", False)
        flags[letter] = token[1:]
    return flags


def _decode_key(key: bytes, base64: bool) -> bytes:
    """The queue key a meta key stands for (base64-decoded with C{b})."""
    if not base64:
        return key
    try:
        return binascii.a2b_base64(key, strict_mode=True)
    except (binascii.Error, ValueError):
        raise MemcacheParseError("error decoding key", False) from None


def parse_meta(line: bytes) -> MetaRequest:
    """
    Parse one meta request line, or raise L{MemcacheParseError}.

    A C{ms} line whose data length is missing or not a number raises with
    C{disconnect} set: its data block cannot be skipped.
    """
    tokens = split_tokens(line)
    word = tokens[0].lower()
    if word == b"mn":
        return MetaNoop()
    if word == b"ma" or word == b"me":
        return Refusal(b"CLIENT_ERROR %s is not supported by a queue server\r\n" % word)
    if word == b"ms":
        return _parse_set(tokens)
    if len(tokens) < 2:
        raise MemcacheParseError("bad command line format", False)
    key = tokens[1]
    flags = _flags(tokens[2:])
    queue_key = _decode_key(key, 98 in flags)
    if word == b"md":
        name = queue_key.split(b"/", 1)[0]
        if not name:
            raise MemcacheParseError("empty queue name", False)
        return MetaDelete(key, flags, name.decode("latin-1"))
    get = parse_get(queue_key)
    if 118 not in flags:  # no v: nothing leaves the queue
        if get.open_read:
            raise MemcacheParseError("mg with /open needs the v flag", False)
        if not (get.closing or get.aborting or get.peeking):
            get = GetRequest(queue_key, get.timeout_ms, peeking=True,
                             name=queue_key.split(b"/", 1)[0])
    return MetaGet(key, flags, get)


def _parse_set(tokens: list[bytes]) -> MetaSet:
    if len(tokens) < 3:
        raise MemcacheParseError("bad data chunk", True)
    length = parse_int(tokens[2], "data length", minimum=0, disconnect=True)
    key = tokens[1]
    error = None
    ttl = 0
    try:
        flags = _flags(tokens[3:])
    except MemcacheParseError as e:
        flags, error = {}, e.reason
    try:
        name = _decode_key(key, 98 in flags)
    except MemcacheParseError as e:
        name, error = b"", error or e.reason
    mode = flags.get(77)  # M
    if error is None and mode is not None and mode.upper() not in (b"", b"S"):
        error = f"ms mode {mode.decode('latin-1')} is not supported by a queue server (use MS)"
    if error is None and 67 in flags:  # C
        error = "ms compare-and-swap (C) is not supported by a queue server"
    if error is None and 84 in flags:  # T
        try:
            ttl = parse_int(flags[84], "ttl")
        except MemcacheParseError as e:
            error = e.reason
    return MetaSet(key, flags, name.decode("latin-1"), length, ttl, error)


def meta_set_reply(req: MetaSet, stored: bool) -> bytes:
    """C{HD} (nothing with C{q}) when C{stored}, else C{NS}, with the return flags."""
    if stored and req.quiet:
        return b""
    out = [b"HD" if stored else b"NS"]
    for letter in req.flags:
        out.append(b" c0" if letter == 99 else req.echo(letter))
    out.append(b"\r\n")
    return b"".join(out)


def meta_get_reply(req: MetaGet, item: QItem | None, now_ms: int) -> bytes:
    """C{VA}/C{HD} with the return flags for C{item}; C{EN} (nothing with C{q}) for none."""
    if item is None:
        return b"" if req.quiet else _EN
    data = item.data
    out = []
    for letter in req.flags:
        if letter == 102:  # f
            out.append(b" f0")
        elif letter == 116:  # t
            expiry = item.expiry_ms
            out.append(b" t-1" if not expiry else b" t%d" % max(0, ceil((expiry - now_ms) / 1000)))
        elif letter == 115:  # s
            out.append(b" s%d" % len(data))
        elif letter == 104:  # h
            out.append(b" h0")
        elif letter == 108:  # l
            out.append(b" l%d" % max(0, (now_ms - item.add_time_ms) // 1000))
        elif letter == 99:  # c
            out.append(b" c0")
        else:
            out.append(req.echo(letter))
    flags = b"".join(out)
    if 118 in req.flags:  # v
        return b"VA %d%s\r\n%s\r\n" % (len(data), flags, data)
    return b"HD%s\r\n" % flags


def meta_delete_reply(req: MetaDelete) -> bytes:
    """C{HD} with the return flags (nothing with C{q})."""
    if req.quiet:
        return b""
    return b"HD" + b"".join(req.echo(letter) for letter in req.flags) + b"\r\n"


class MetaHandler:
    """Serves meta requests over one L{MemcacheProtocol}'s session."""

    def __init__(self, protocol: DialectHost) -> None:
        self.protocol = protocol

    def get(self, req: MetaGet) -> bytes | Deferred[bytes]:
        """C{mg}: the fetch its key stands for, answered C{VA}/C{HD}/C{EN}."""
        result = self.protocol.fetch(req.get)
        if result is None or type(result) is QItem:  # (answered at once: the usual get)
            return self._got(result, req)
        if isinstance(result, bytes):
            return b"CLIENT_ERROR %s\r\n" % result
        # (a Deferred: not isinstance(result, Deferred), an ABC's check, which
        # costs a Python call per get)
        return result.addCallback(self._got, req)

    def _got(self, item: QItem | None, req: MetaGet) -> bytes:
        return meta_get_reply(req, item, int(self.protocol.clock.seconds() * 1000))

    def set(self, req: MetaSet, data: bytes) -> bytes | Deferred[bytes]:
        """C{ms}: enqueue C{data}, answered C{HD}/C{NS}, or the refusal found while parsing."""
        if req.error is not None:
            return b"CLIENT_ERROR %s\r\n" % encode_text(req.error)
        d: Deferred[bool] = in_deferred(self.protocol.enqueue(req.name, data, req.ttl))
        stored = settled(d)
        if stored.__class__ is bool:
            return meta_set_reply(req, stored)
        return d.addCallback(lambda stored: meta_set_reply(req, stored))

    def delete(self, req: MetaDelete) -> bytes:
        """C{md}: delete the queue, answered C{HD}."""
        session = self.protocol.session
        assert session is not None
        session.delete(req.name)
        return meta_delete_reply(req)

    @staticmethod
    def noop(req: MetaNoop) -> bytes:
        """C{mn}: C{MN}."""
        return _MN
