"""
Pure parser of Kestrel's memcache command lines into request objects.

No I/O and no Twisted here: C{parse_line(line)} takes one request line (the
bytes before C{\\n}, with any C{\\r} already stripped) and returns a request
object, or raises L{MemcacheParseError} carrying the reason for the
C{CLIENT_ERROR} reply and whether the connection must then be closed.

Rules (Kestrel 2.4's, plus the fixes in C{docs/differences.md}):
  - the command word is matched in any case; queue names keep their case;
  - runs of blanks separate tokens, so C{get  q} is C{get q} and a trailing
    blank after C{set}'s byte count is accepted;
  - C{gets} is C{get}; only the first key of a C{get} is used;
  - C{noreply} as the last token of C{set}, C{delete}, C{flush} or
    C{flush_all} asks for no reply;
  - C{get} options (C{t=<ms>}, C{open}, C{close}, C{abort}, C{peek}) come in
    any order and may repeat; unknown options are ignored.
"""

from __future__ import annotations

__all__ = [
    "Command",
    "ConfirmRequest",
    "GetRequest",
    "MAX_INT",
    "MemcacheParseError",
    "MonitorRequest",
    "QueueCommand",
    "SetRequest",
    "parse_int",
    "parse_line",
]

#: Kestrel parses numbers as Java ints; we accept the same range.
MAX_INT = 2**31 - 1
MIN_INT = -(2**31)


class MemcacheParseError(Exception):
    """
    A request line that cannot be served.

    The protocol answers C{CLIENT_ERROR <reason>\\r\\n} and, when C{disconnect}
    is true, closes the connection afterwards.
    """

    def __init__(self, reason: str, disconnect: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.disconnect = disconnect


class GetRequest:
    """
    A C{get}/C{gets} of one queue with its options.

    C{key} is the queue name as sent (bytes, for the C{VALUE} line) and C{name}
    the same decoded as ISO-8859-1. C{timeout_ms} is None without C{t=}.
    """

    __slots__ = ("aborting", "closing", "key", "name", "opening", "peeking", "timeout_ms")

    def __init__(self, key: bytes, timeout_ms: int | None = None, opening: bool = False,
                 closing: bool = False, aborting: bool = False, peeking: bool = False) -> None:
        self.key = key
        self.name = key.decode("latin-1")
        self.timeout_ms = timeout_ms
        self.opening = opening
        self.closing = closing
        self.aborting = aborting
        self.peeking = peeking

    def __repr__(self) -> str:
        return (f"GetRequest({self.key!r}, timeout_ms={self.timeout_ms}, open={self.opening}, "
                f"close={self.closing}, abort={self.aborting}, peek={self.peeking})")


class SetRequest:
    """
    A C{set} header; C{length} payload bytes and C{\\r\\n} follow it.

    C{flags_error} is set when the flags are not a number: the payload must
    still be read, then C{CLIENT_ERROR} is replied and the connection kept,
    as Kestrel does.
    """

    __slots__ = ("exptime", "flags_error", "key", "length", "name", "noreply")

    def __init__(self, key: bytes, exptime: int, length: int, noreply: bool = False,
                 flags_error: str | None = None) -> None:
        self.key = key
        self.name = key.decode("latin-1")
        self.exptime = exptime
        self.length = length
        self.noreply = noreply
        self.flags_error = flags_error

    def __repr__(self) -> str:
        return (f"SetRequest({self.key!r}, exptime={self.exptime}, length={self.length}, "
                f"noreply={self.noreply}, flags_error={self.flags_error!r})")


class MonitorRequest:
    """C{monitor <q> <seconds> [max_items]}; C{max_items} None means the server's default."""

    __slots__ = ("key", "max_items", "name", "seconds")

    def __init__(self, key: bytes, seconds: int, max_items: int | None) -> None:
        self.key = key
        self.name = key.decode("latin-1")
        self.seconds = seconds
        self.max_items = max_items


class ConfirmRequest:
    """C{confirm <q> <count>}: confirm the C{count} oldest open reads on the queue."""

    __slots__ = ("count", "name")

    def __init__(self, name: str, count: int) -> None:
        self.name = name
        self.count = count


class QueueCommand:
    """A command on one named queue: C{delete}, C{flush} or C{flush_expired}."""

    __slots__ = ("name", "noreply", "word")

    def __init__(self, word: str, name: str, noreply: bool = False) -> None:
        self.word = word
        self.name = name
        self.noreply = noreply


class Command:
    """
    Any other known command with its remaining arguments (ISO-8859-1 strings).

    C{word} is one of C{stats}, C{dump_stats}, C{dump_config}, C{version},
    C{status}, C{reload}, C{shutdown}, C{quit}, C{flush_all},
    C{flush_all_expired}.
    """

    __slots__ = ("args", "noreply", "word")

    def __init__(self, word: str, args: tuple[str, ...] = (), noreply: bool = False) -> None:
        self.word = word
        self.args = args
        self.noreply = noreply


Request = GetRequest | SetRequest | MonitorRequest | ConfirmRequest | QueueCommand | Command

_PLAIN_COMMANDS = frozenset({
    "stats", "dump_stats", "dump_config", "version", "status", "reload", "shutdown", "quit",
    "flush_all", "flush_all_expired",
})
_QUEUE_COMMANDS = frozenset({"delete", "flush", "flush_expired"})
_NOREPLY_COMMANDS = frozenset({"delete", "flush", "flush_all"})


def parse_int(token: bytes, what: str, minimum: int = MIN_INT, disconnect: bool = True) -> int:
    """
    Parse a decimal Java-int token, or raise L{MemcacheParseError} naming C{what}.

    Values below C{minimum} or outside the 32-bit signed range are refused.
    """
    try:
        value = int(token)
    except ValueError:
        raise MemcacheParseError(f"bad {what}", disconnect) from None
    if not (minimum <= value <= MAX_INT) or not token.lstrip(b"+-").isdigit():
        raise MemcacheParseError(f"bad {what}", disconnect)
    return value


def parse_get(token: bytes) -> GetRequest:
    """Parse the key token of a C{get}: C{name[/option]*}."""
    if b"/" not in token:
        return GetRequest(token)
    parts = token.split(b"/")
    timeout_ms = None
    opening = closing = aborting = peeking = False
    for opt in parts[1:]:
        if opt.startswith(b"t="):
            timeout_ms = parse_int(opt[2:], "timeout")
        elif opt == b"open":
            opening = True
        elif opt == b"close":
            closing = True
        elif opt == b"abort":
            aborting = True
        elif opt == b"peek":
            peeking = True
    key = parts[0]
    if not key:
        raise MemcacheParseError("empty queue name", True)
    if (peeking or aborting) and (opening or closing):
        raise MemcacheParseError("peek and abort cannot be combined with open or close", True)
    if peeking and aborting:
        raise MemcacheParseError("peek and abort cannot be combined", True)
    return GetRequest(key, timeout_ms, opening, closing, aborting, peeking)


def parse_set(tokens: list[bytes]) -> SetRequest:
    """
    Parse the tokens of a C{set} line: C{set <q> <flags> <exptime> <bytes> [noreply]}.

    A short line, a bad exptime or a bad byte count is an error that closes
    the connection; bad flags are reported after the payload is read.
    """
    if len(tokens) < 5:
        raise MemcacheParseError("malformed set: expected set <queue> <flags> <exptime> <bytes>",
                                 True)
    length = parse_int(tokens[4], "byte count", minimum=0)
    exptime = parse_int(tokens[3], "exptime")
    flags_error = None
    try:
        int(tokens[2])
    except ValueError:
        flags_error = "bad flags"
    noreply = len(tokens) > 5 and tokens[-1] == b"noreply"
    return SetRequest(tokens[1], exptime, length, noreply, flags_error)


#: Recently parsed C{get}/C{set} lines and their (immutable) requests.
_recent: dict[bytes, GetRequest | SetRequest] = {}
#: How many lines L{_recent} holds before it starts afresh.
RECENT_LIMIT = 1024
#: Longer lines are never remembered, which bounds the memory L{_recent} holds.
RECENT_LINE_LIMIT = 250


def parse_line(line: bytes) -> Request:
    """
    Parse one request line (without its line ending) into a request object.

    Raises L{MemcacheParseError} for anything that must be answered with
    C{CLIENT_ERROR}. Request objects must be treated as immutable: the
    C{get} and C{set} request of a line seen recently is returned again
    (clients repeat the same few lines, and parsing them is the costliest
    step of a pipelined request).
    """
    request = _recent.get(line)
    if request is not None:
        return request
    parsed = _parse_line(line)
    cls = parsed.__class__
    if (cls is GetRequest or cls is SetRequest) and len(line) <= RECENT_LINE_LIMIT:
        if len(_recent) >= RECENT_LIMIT:
            _recent.clear()
        _recent[line] = parsed  # type: ignore[assignment]
    return parsed


def _parse_line(line: bytes) -> Request:
    """Parse one request line, with no memory of earlier ones (see L{parse_line})."""
    tokens = line.split()
    if not tokens:
        raise MemcacheParseError("empty request", True)
    word = tokens[0].lower()
    if word == b"get" or word == b"gets":
        if len(tokens) < 2:
            raise MemcacheParseError("missing queue name", False)
        return parse_get(tokens[1])
    if word == b"set":
        return parse_set(tokens)
    command = word.decode("latin-1")
    if command in _QUEUE_COMMANDS:
        if len(tokens) < 2:
            # Kestrel keeps the connection for delete/flush, closes for flush_expired.
            raise MemcacheParseError("missing queue name", command == "flush_expired")
        noreply = command in _NOREPLY_COMMANDS and len(tokens) > 2 and tokens[-1] == b"noreply"
        return QueueCommand(command, tokens[1].decode("latin-1"), noreply)
    if command == "monitor":
        if len(tokens) < 3:
            raise MemcacheParseError("malformed monitor: expected monitor <queue> <seconds>", True)
        seconds = parse_int(tokens[2], "seconds")
        max_items = parse_int(tokens[3], "max_items") if len(tokens) > 3 else None
        return MonitorRequest(tokens[1], seconds, max_items)
    if command == "confirm":
        if len(tokens) < 3:
            raise MemcacheParseError("malformed confirm: expected confirm <queue> <count>", False)
        return ConfirmRequest(tokens[1].decode("latin-1"), parse_int(tokens[2], "count"))
    if command in _PLAIN_COMMANDS:
        args = tuple(t.decode("latin-1") for t in tokens[1:])
        noreply = False
        if command in _NOREPLY_COMMANDS and args and args[-1] == "noreply":
            noreply, args = True, args[:-1]
        return Command(command, args, noreply)
    raise MemcacheParseError(f"unknown command: {command[:40]}", True)
