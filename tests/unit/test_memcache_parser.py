"""Tests for kestrel.protocols.memcache_parser: command lines into request objects."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kestrel.protocols import memcache_parser
from kestrel.protocols.memcache_parser import (
    Command,
    ConfirmRequest,
    GetRequest,
    MemcacheParseError,
    MonitorRequest,
    QueueCommand,
    Refusal,
    SetRequest,
    Unframable,
    parse_line,
)

names = st.binary(min_size=1, max_size=30).filter(
    lambda b: not any(c in b for c in b" \t\n\r\x0b\x0c/")
)
blanks = st.sampled_from([b" ", b"  ", b"   "])
options = st.sampled_from([b"open", b"close", b"abort", b"peek", b"t=0", b"t=250", b"xyz", b""])


def test_get_key_is_the_token_as_sent() -> None:
    """The key echoed in VALUE is the whole token, options included; the name is before `/`."""
    req = parse_line(b"get jobs/t=500/open other")
    assert isinstance(req, GetRequest)
    assert (req.key, req.name) == (b"jobs/t=500/open", "jobs")


def test_plain_get() -> None:
    """`get q` parses to a non-transactional get without a timeout."""
    req = parse_line(b"get q")
    assert isinstance(req, GetRequest)
    assert (req.key, req.name, req.timeout_ms) == (b"q", "q", None)
    assert not (req.open_read or req.closing or req.aborting or req.peeking)


def test_gets_any_case_and_extra_spaces() -> None:
    """`GETS  Q` is a get of queue `Q`: command word in any case, names keep case."""
    req = parse_line(b"GETS   Queue  other")
    assert isinstance(req, GetRequest)
    assert req.name == "Queue"


def test_get_options_any_order() -> None:
    """Options come in any order, repeat, and unknown ones are ignored."""
    req = parse_line(b"get work/open/t=500/bogus/close/t=20")
    assert isinstance(req, GetRequest)
    assert req.name == "work"
    assert req.open_read and req.closing and not req.peeking and not req.aborting
    assert req.timeout_ms == 20


@pytest.mark.parametrize("line", [
    b"get /open", b"get q/peek/open", b"get q/abort/close", b"get q/peek/abort",
    b"get q/abort/open", b"get q/t=abc", b"get q/t=99999999999",
])
def test_get_validation_keeps_connection(line: bytes) -> None:
    """Invalid get option combinations and bad timeouts are CLIENT_ERROR, connection kept."""
    with pytest.raises(MemcacheParseError) as err:
        parse_line(line)
    assert not err.value.disconnect


def test_get_without_key_keeps_connection() -> None:
    """A `get` without a key is CLIENT_ERROR but the connection stays (as Kestrel)."""
    with pytest.raises(MemcacheParseError) as err:
        parse_line(b"get")
    assert not err.value.disconnect


def test_set_header() -> None:
    """`set` takes name, any flags, exptime and the byte count; a trailing blank is fine."""
    req = parse_line(b"SET q 4294967295 60 5 ")
    assert isinstance(req, SetRequest)
    assert (req.name, req.exptime, req.length, req.noreply, req.error) == (
        "q", 60, 5, False, None)


def test_set_noreply() -> None:
    """`noreply` as the last token of set is honoured."""
    req = parse_line(b"set q 0 0 5 noreply")
    assert isinstance(req, SetRequest) and req.noreply


@pytest.mark.parametrize("line, error", [
    (b"set q x 0 5", "bad flags"),
    (b"set q 0 zz 5", "bad exptime"),
    (b"set q 0 2147483648 5", "bad exptime"),
])
def test_set_bad_numbers_read_payload(line: bytes, error: str) -> None:
    """Non-numeric flags or exptime are reported after the payload, connection kept."""
    req = parse_line(line)
    assert isinstance(req, SetRequest)
    assert req.error == error and req.length == 5


@pytest.mark.parametrize("line", [
    b"set q 0 0", b"set q 0 0 -1", b"set q 0 0 abc", b"set q 0 0 1_0", b"set q 0 0 2147483648",
    b"add q 0 0", b"cas q 0 0 x 1",
])
def test_set_bad_byte_count_closes(line: bytes) -> None:
    """Without a usable byte count the payload cannot be skipped: CLIENT_ERROR + close."""
    with pytest.raises(MemcacheParseError) as err:
        parse_line(line)
    assert err.value.disconnect


@pytest.mark.parametrize("line, word", [
    (b"add q 0 0 1", "add"), (b"REPLACE q 0 0 1", "replace"), (b"append q 0 0 1", "append"),
    (b"prepend q 0 0 1 noreply", "prepend"), (b"cas q 0 0 1 99", "cas"),
])
def test_refused_storage_commands_read_payload(line: bytes, word: str) -> None:
    """add/replace/append/prepend/cas: the payload is read, then CLIENT_ERROR names the command."""
    req = parse_line(line)
    assert isinstance(req, SetRequest)
    assert req.length == 1
    assert req.error == f"{word} is not supported by a queue server (use set)"
    assert req.noreply is line.endswith(b"noreply")


@pytest.mark.parametrize("line, reply", [
    (b"incr q 1", b"CLIENT_ERROR incr is not supported by a queue server\r\n"),
    (b"decr q 1", b"CLIENT_ERROR decr is not supported by a queue server\r\n"),
    (b"touch q 10", b"CLIENT_ERROR touch is not supported by a queue server\r\n"),
    (b"gat 10 q", b"CLIENT_ERROR gat is not supported by a queue server\r\n"),
    (b"GATS 10 q", b"CLIENT_ERROR gats is not supported by a queue server\r\n"),
    (b"incr q 1 noreply", b""),
    (b"touch q 10 noreply", b""),
])
def test_refused_commands(line: bytes, reply: bytes) -> None:
    """incr/decr/touch/gat/gats: CLIENT_ERROR naming the command (none with noreply)."""
    req = parse_line(line)
    assert isinstance(req, Refusal)
    assert req.reply == reply


@pytest.mark.parametrize("line", [b"", b"   "])
def test_empty_lines_are_error(line: bytes) -> None:
    """Empty lines are memcache's ERROR, and the connection is kept."""
    req = parse_line(line)
    assert isinstance(req, Refusal)
    assert req.reply == b"ERROR\r\n"


@pytest.mark.parametrize("line", [b"roll", b"verbosity 1", b"xs q 9 T0", b"\tget q"])
def test_unknown_commands_cannot_be_framed(line: bytes) -> None:
    """
    An unknown command word is ERROR and cannot be framed: it may announce a
    data block of unknown size, so the connection closes after the reply.
    """
    req = parse_line(line)
    assert isinstance(req, Unframable)
    assert req.reply == b"ERROR\r\n"


def test_a_tab_is_not_a_separator() -> None:
    """Only spaces separate tokens: C{get a\\tb} names the queue C{a\\tb} (refused later)."""
    req = parse_line(b"get a\tb")
    assert isinstance(req, GetRequest)
    assert req.name == "a\tb"
    assert parse_line(b"get  q ").name == "q"


def test_queue_commands() -> None:
    """delete/flush/flush_expired take one queue name; noreply honoured on delete."""
    req = parse_line(b"delete q noreply")
    assert isinstance(req, QueueCommand)
    assert (req.word, req.name, req.noreply) == ("delete", "q", True)
    req = parse_line(b"Flush_Expired q")
    assert isinstance(req, QueueCommand)
    assert (req.word, req.name, req.noreply) == ("flush_expired", "q", False)


@pytest.mark.parametrize("line", [b"delete", b"flush", b"flush_expired"])
def test_queue_command_missing_name(line: bytes) -> None:
    """A queue command without a name is CLIENT_ERROR, connection kept."""
    with pytest.raises(MemcacheParseError) as err:
        parse_line(line)
    assert err.value.reason == "missing queue name"
    assert not err.value.disconnect


def test_monitor_and_confirm() -> None:
    """monitor takes seconds and optional max items; confirm takes a count."""
    req = parse_line(b"monitor q 10 3")
    assert isinstance(req, MonitorRequest)
    assert (req.name, req.seconds, req.max_items) == ("q", 10, 3)
    req = parse_line(b"monitor q 10")
    assert isinstance(req, MonitorRequest) and req.max_items is None
    req = parse_line(b"confirm q 2")
    assert isinstance(req, ConfirmRequest) and (req.name, req.count) == ("q", 2)


def test_monitor_confirm_errors() -> None:
    """Bad monitor and confirm arguments are CLIENT_ERROR, connection kept."""
    for line in (b"monitor q", b"monitor q x", b"confirm q", b"confirm q x"):
        with pytest.raises(MemcacheParseError) as err:
            parse_line(line)
        assert not err.value.disconnect, line


def test_plain_commands() -> None:
    """Other known commands keep their arguments."""
    req = parse_line(b"dump_stats a b")
    assert isinstance(req, Command) and (req.word, req.args) == ("dump_stats", ("a", "b"))
    req = parse_line(b"flush_all noreply")
    assert isinstance(req, Command) and req.noreply and req.args == ()
    req = parse_line(b"STATUS readonly")
    assert isinstance(req, Command) and req.args == ("readonly",)


@given(names, st.lists(options, max_size=5), blanks, blanks)
def test_get_roundtrip(name: bytes, opts: list[bytes], sep1: bytes, trail: bytes) -> None:
    """Any get line parses to its name and the options it carries, or is refused as invalid."""
    token = b"/".join([name, *opts])
    line = b"get" + sep1 + token + trail
    peek, abort = b"peek" in opts, b"abort" in opts
    open_read, closing = b"open" in opts, b"close" in opts
    invalid = (peek or abort) and (open_read or closing) or (peek and abort)
    if invalid:
        with pytest.raises(MemcacheParseError):
            parse_line(line)
        return
    req = parse_line(line)
    assert isinstance(req, GetRequest)
    assert req.key == token
    assert req.name == name.decode("latin-1")
    assert (req.peeking, req.aborting, req.open_read, req.closing) == (
        peek, abort, open_read, closing)
    timeouts = [int(o[2:]) for o in opts if o.startswith(b"t=")]
    assert req.timeout_ms == (timeouts[-1] if timeouts else None)


@given(names, st.integers(0, 2**32), st.integers(-(2**31), 2**31 - 1),
       st.integers(0, 2**31 - 1), blanks, st.booleans())
def test_set_roundtrip(name: bytes, flags: int, exptime: int, length: int, sep: bytes,
                       noreply: bool) -> None:
    """Every well-formed set header parses back to its fields."""
    parts = [b"set", name, str(flags).encode(), str(exptime).encode(), str(length).encode()]
    if noreply:
        parts.append(b"noreply")
    req = parse_line(sep.join(parts) + sep)
    assert isinstance(req, SetRequest)
    assert (req.key, req.exptime, req.length, req.noreply, req.error) == (
        name, exptime, length, noreply, None)


@given(st.binary(max_size=60))
def test_never_crashes(line: bytes) -> None:
    """
    Arbitrary bytes either parse or raise MemcacheParseError, never anything
    else; only a storage line without a usable byte count closes the connection.
    """
    try:
        parse_line(line)
    except MemcacheParseError as err:
        assert err.reason
        if err.disconnect:
            assert line.split()[0].lower() in (b"set", b"add", b"replace", b"append",
                                               b"prepend", b"cas")


def _fields(request: object) -> tuple[object, ...]:
    return (request.__class__, *(getattr(request, slot) for slot in request.__slots__))


@given(st.lists(st.one_of(
    st.builds(lambda n, o: b"get " + n + b"".join(b"/" + x for x in o), names,
              st.lists(options, max_size=3)),
    st.builds(lambda n, e, b: b"set %s 0 %d %d" % (n, e, b), names,
              st.integers(-5, 5), st.integers(0, 9)),
    st.binary(max_size=30)), max_size=20))
def test_remembered_lines_parse_as_fresh_ones(lines: list[bytes]) -> None:
    """A line parsed again gives the same request (or error) as a parser that remembers nothing."""
    for line in lines + lines:
        try:
            fresh = _fields(memcache_parser._parse_line(line))
        except MemcacheParseError as e:
            with pytest.raises(MemcacheParseError) as again:
                parse_line(line)
            assert (again.value.reason, again.value.disconnect) == (e.reason, e.disconnect)
        else:
            assert _fields(parse_line(line)) == fresh


def test_remembered_lines_are_bounded() -> None:
    """The parser remembers at most RECENT_LIMIT lines, and never a long one or a command."""
    long_line = b"get " + b"q" * memcache_parser.RECENT_LINE_LIMIT
    parse_line(long_line)
    parse_line(b"version")
    assert long_line not in memcache_parser._recent
    assert b"version" not in memcache_parser._recent
    for i in range(memcache_parser.RECENT_LIMIT * 2 + 3):
        assert parse_line(b"get q%d" % i).name == f"q{i}"
        assert len(memcache_parser._recent) <= memcache_parser.RECENT_LIMIT
    assert parse_line(b"get q7") is parse_line(b"get q7")
