"""
Pure parser of Kestrel's memcache command lines into request objects.

No I/O and no Twisted here: C{parse_line(line)} takes one request line (the
bytes before C{\\n}, with any C{\\r} already stripped) and returns a request
object, or raises L{MemcacheParseError} carrying the reason for the
C{CLIENT_ERROR} reply and whether the connection must then be closed.

Rules (Kestrel 2.4's memcache protocol, with the changes listed in
docs/differences.md):
  - the command word is matched in any case; queue names keep their case;
  - runs of spaces separate tokens, so C{get  q} is C{get q} and a trailing
    space after C{set}'s byte count is accepted; a tab is not a separator;
  - C{gets} is C{get}; only the first key of a C{get} is used;
  - C{noreply} as the last token of C{set}, C{delete}, C{flush} or
    C{flush_all} asks for no reply;
  - C{get} options (C{t=<ms>}, C{open}, C{close}, C{abort}, C{peek}) come in
    any order and may repeat; unknown options are ignored;
  - an error closes the connection only where the byte stream cannot be
    resynchronised: a storage command (C{set}, and the refused C{add},
    C{replace}, C{append}, C{prepend}, C{cas}) whose byte count is missing,
    not a number or negative. Every other bad line is answered and the
    connection kept: empty lines with C{ERROR} (L{Refusal}), memcache
    commands a queue cannot serve with a C{CLIENT_ERROR} naming the command
    (a storage command's data block is read first, then dropped). An unknown
    command word is answered with C{ERROR} and closes the connection
    (L{Unframable}): its line may announce a data block of a size the server
    cannot know, and those bytes must never run as requests.
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
    "Refusal",
    "SetRequest",
    "Unframable",
    "parse_int",
    "split_tokens",
    "parse_line",
    "encode_text",
]

def encode_text(text: str) -> bytes:
    """Reply text encoded the way names are decoded (ISO-8859-1), escaping the rest."""
    return text.encode("latin-1", "backslashreplace")


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

    C{key} is the key exactly as sent, options included (bytes, echoed in the
    C{VALUE} line so that clients match the reply to their request), and
    C{name} the queue name before the first C{/}, decoded as ISO-8859-1.
    C{timeout_ms} is None without C{t=}.
    """

    __slots__ = ("aborting", "closing", "key", "name", "open_read", "peeking", "timeout_ms")

    def __init__(self, key: bytes, timeout_ms: int | None = None, open_read: bool = False,
                 closing: bool = False, aborting: bool = False, peeking: bool = False,
                 name: bytes | None = None) -> None:
        self.key = key
        self.name = (key if name is None else name).decode("latin-1")
        self.timeout_ms = timeout_ms
        self.open_read = open_read
        self.closing = closing
        self.aborting = aborting
        self.peeking = peeking

    def __repr__(self) -> str:
        return (f"GetRequest({self.key!r}, timeout_ms={self.timeout_ms}, open={self.open_read}, "
                f"close={self.closing}, abort={self.aborting}, peek={self.peeking})")


class SetRequest:
    """
    A storage command's header; C{length} payload bytes and C{\\r\\n} follow it.

    C{error} is set when the payload must be read and dropped, then answered
    with C{CLIENT_ERROR <error>} (connection kept): flags or exptime that are
    not numbers, or a storage command other than C{set} (C{add},
    C{replace}, C{append}, C{prepend}, C{cas}), which a queue cannot serve.
    """

    __slots__ = ("error", "exptime", "key", "length", "name", "noreply")

    def __init__(self, key: bytes, exptime: int, length: int, noreply: bool = False,
                 error: str | None = None) -> None:
        self.key = key
        self.name = key.decode("latin-1")
        self.exptime = exptime
        self.length = length
        self.noreply = noreply
        self.error = error

    def __repr__(self) -> str:
        return (f"SetRequest({self.key!r}, exptime={self.exptime}, length={self.length}, "
                f"noreply={self.noreply}, error={self.error!r})")


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


class Refusal:
    """
    A request read whole that is answered with C{reply} and changes nothing.

    Empty lines get C{ERROR} (memcache's reply);
    C{incr}, C{decr}, C{touch}, C{gat} and C{gats} get a C{CLIENT_ERROR}
    naming the command (nothing at all with C{noreply}). The connection stays
    open.
    """

    __slots__ = ("reply",)

    def __init__(self, reply: bytes) -> None:
        self.reply = reply

    def __repr__(self) -> str:
        return f"Refusal({self.reply!r})"


class Unframable:
    """
    A request line whose end cannot be found: an unknown command word, which
    may be followed by a data block of unknown size. It is answered with
    C{reply} (C{ERROR}) and the connection is closed, so that no byte of its
    data is ever read as a request.
    """

    __slots__ = ("reply",)

    def __init__(self, reply: bytes) -> None:
        self.reply = reply

    def __repr__(self) -> str:
        return f"Unframable({self.reply!r})"


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


Request = (GetRequest | SetRequest | MonitorRequest | ConfirmRequest | QueueCommand | Refusal
           | Unframable | Command)

_PLAIN_COMMANDS = frozenset({
    "stats", "dump_stats", "dump_config", "version", "status", "reload", "shutdown", "quit",
    "flush_all", "flush_all_expired",
})
_QUEUE_COMMANDS = frozenset({"delete", "flush", "flush_expired"})
_NOREPLY_COMMANDS = frozenset({"delete", "flush", "flush_all"})
#: memcache storage commands a queue cannot serve: their data block is read and dropped.
_REFUSED_STORAGE = frozenset({b"add", b"replace", b"append", b"prepend", b"cas"})
#: Other memcache commands a queue cannot serve (no data block follows them).
_REFUSED_COMMANDS = frozenset({b"incr", b"decr", b"touch", b"gat", b"gats"})
_ERROR = Refusal(b"ERROR\r\n")
_UNKNOWN = Unframable(b"ERROR\r\n")


def split_tokens(line: bytes) -> list[bytes]:
    """
    The tokens of a request line: runs of spaces separate them, as in
    memcached. Tabs and other control bytes are not separators: they stay in
    their token (so C{get a\tb} names the queue C{a\tb}, which is refused).
    """
    tokens = line.split(b" ")
    if b"" in tokens:
        tokens = [t for t in tokens if t]
    return tokens


def not_supported(command: str) -> str:
    """The C{CLIENT_ERROR} reason for a memcache command that a queue cannot serve."""
    hint = " (use set)" if command.encode() in _REFUSED_STORAGE else ""
    return f"{command} is not supported by a queue server{hint}"


def parse_int(token: bytes, what: str, minimum: int = MIN_INT, disconnect: bool = False) -> int:
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
    open_read = closing = aborting = peeking = False
    for opt in parts[1:]:
        if opt.startswith(b"t="):
            timeout_ms = parse_int(opt[2:], "timeout")
        elif opt == b"open":
            open_read = True
        elif opt == b"close":
            closing = True
        elif opt == b"abort":
            aborting = True
        elif opt == b"peek":
            peeking = True
    key = parts[0]
    if not key:
        raise MemcacheParseError("empty queue name", False)
    if (peeking or aborting) and (open_read or closing):
        raise MemcacheParseError("peek and abort cannot be combined with open or close", False)
    if peeking and aborting:
        raise MemcacheParseError("peek and abort cannot be combined", False)
    return GetRequest(token, timeout_ms, open_read, closing, aborting, peeking, key)


def parse_set(tokens: list[bytes]) -> SetRequest:
    """
    Parse the tokens of a storage line: C{set <q> <flags> <exptime> <bytes> [noreply]}
    (C{cas} has its unique value before C{noreply}).

    A short line or a bad byte count is an error that closes the connection
    (the payload cannot be skipped); bad flags or exptime are reported after
    the payload is read, as is any storage command other than C{set}.
    """
    command = tokens[0].lower().decode("latin-1")
    if len(tokens) < 5:
        raise MemcacheParseError(
            f"malformed {command}: expected {command} <queue> <flags> <exptime> <bytes>", True)
    length = parse_int(tokens[4], "byte count", minimum=0, disconnect=True)
    error = None
    exptime = 0
    if command != "set":
        error = not_supported(command)
    else:
        try:
            exptime = parse_int(tokens[3], "exptime")
            int(tokens[2])
        except MemcacheParseError as e:
            error = e.reason
        except ValueError:
            error = "bad flags"
    noreply = len(tokens) > 5 and tokens[-1] == b"noreply"
    return SetRequest(tokens[1], exptime, length, noreply, error)


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
    if ((parsed.__class__ is GetRequest or parsed.__class__ is SetRequest)
            and len(line) <= RECENT_LINE_LIMIT):
        if len(_recent) >= RECENT_LIMIT:
            _recent.clear()
        _recent[line] = parsed
    return parsed


def _parse_line(line: bytes) -> Request:
    """Parse one request line, with no memory of earlier ones (see L{parse_line})."""
    tokens = split_tokens(line)
    if not tokens:
        return _ERROR
    word = tokens[0].lower()
    if word == b"get" or word == b"gets":
        if len(tokens) < 2:
            raise MemcacheParseError("missing queue name", False)
        return parse_get(tokens[1])
    if word == b"set" or word in _REFUSED_STORAGE:
        return parse_set(tokens)
    if word in _REFUSED_COMMANDS:
        if tokens[-1] == b"noreply" and word not in (b"gat", b"gats"):
            return Refusal(b"")
        return Refusal(b"CLIENT_ERROR %s\r\n" % not_supported(word.decode("latin-1")).encode())
    command = word.decode("latin-1")
    if command in _QUEUE_COMMANDS:
        if len(tokens) < 2:
            raise MemcacheParseError("missing queue name", False)
        noreply = command in _NOREPLY_COMMANDS and len(tokens) > 2 and tokens[-1] == b"noreply"
        return QueueCommand(command, tokens[1].decode("latin-1"), noreply)
    if command == "monitor":
        if len(tokens) < 3:
            raise MemcacheParseError("malformed monitor: expected monitor <queue> <seconds>",
                                     False)
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
    return _UNKNOWN
