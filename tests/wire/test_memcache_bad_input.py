"""
Bad memcache input against a real server process, over raw sockets.

Every case checks the exact reply bytes (docs/differences.md, "Memcache
protocol"), whether the connection is then closed or kept, that no journal
file appears for a refused queue name, and that the server lives on: after
each bad request a second connection sets and gets an item.

An error keeps the connection whenever the request was read whole; it
closes only where the byte stream cannot be resynchronised (a bad `set`
byte count, a data block not followed by `\r\n`, a line over
`max_request_size`, unknown command words, unframable binary packets).

One server serves most of the module; `client_timeout` needs a second one,
since it is a server-level setting.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.wire.conftest import KestrelProcess, LineClient

#: The module server's limits (small, so that the limits are cheap to reach).
MAX_REQUEST_SIZE = 1024
MAX_OPEN_TRANSACTIONS = 2
SMALL_ITEM_SIZE = 10

#: How long a test waits for a reply or a close before it fails.
REPLY_TIMEOUT = 10.0

_ILLEGAL = b"Queue name contains illegal characters (one of: ~ . /)."
_alive_ids = itertools.count()


@pytest.fixture(scope="module")
def server(kestrel_factory: Callable[..., KestrelProcess]) -> KestrelProcess:
    """The module's server: small request limit, 2 open reads, a queue with small items."""
    return kestrel_factory(config={
        "max_open_transactions": MAX_OPEN_TRANSACTIONS,
        "max_request_size": MAX_REQUEST_SIZE,
        "queues": {"small": {"max_item_size": SMALL_ITEM_SIZE}},
    })


@pytest.fixture
def raw(server: KestrelProcess) -> Iterator[LineClient]:
    """A raw-socket client of the module server's memcache port."""
    client = connect(server)
    yield client
    client.close()


def connect(server: KestrelProcess) -> LineClient:
    """A raw-socket client whose reads fail after L{REPLY_TIMEOUT} instead of hanging."""
    return LineClient(server.connect(timeout=REPLY_TIMEOUT))


def files_under(root: Path) -> set[str]:
    """Every path below C{root}, relative to it (the queue folder and its neighbours)."""
    return {str(path.relative_to(root)) for path in root.rglob("*")}


def assert_alive(server: KestrelProcess) -> None:
    """A fresh connection can set an item on a fresh queue and get it back."""
    queue = b"alive_%d" % next(_alive_ids)
    client = connect(server)
    try:
        client.send(b"set %s 0 0 5\r\nhello\r\nget %s\r\n" % (queue, queue))
        assert client.line() == b"STORED\r\n"
        assert client.until(b"END\r\n") == b"VALUE %s 0 5\r\nhello\r\nEND\r\n" % queue
    finally:
        client.close()


def assert_refused(server: KestrelProcess, request: bytes, reply: bytes) -> None:
    """
    C{request} on a fresh connection gets exactly C{reply}, then the server
    closes the connection; nothing is created on disk; the server lives on.
    """
    before = files_under(server.root)
    client = connect(server)
    try:
        client.send(request)
        assert client.line() == reply
        assert client.closed()
    finally:
        client.close()
    assert files_under(server.root) == before
    assert_alive(server)


def assert_answered(server: KestrelProcess, request: bytes, reply: bytes) -> None:
    """
    C{request} on a fresh connection gets exactly C{reply}, and the same
    connection then serves a set and a get; nothing is created on disk for
    the refused request; the server lives on.
    """
    before = files_under(server.root)
    client = connect(server)
    try:
        client.send(request)
        assert client.line() == reply
        client.send(b"version\r\n")
        assert client.line().startswith(b"VERSION ")
        assert files_under(server.root) == before
    finally:
        client.close()
    assert_alive(server)


def queue_is_empty(server: KestrelProcess, queue: bytes) -> bool:
    """Whether a plain get of C{queue} on a fresh connection answers END."""
    client = connect(server)
    try:
        client.send(b"get %s\r\n" % queue)
        return client.line() == b"END\r\n"
    finally:
        client.close()


# -- queue names ----------------------------------------------------------------------

BAD_NAMES = [
    pytest.param(b"n" * 201,
                 b"Queue name is 201 bytes long; the limit is 200 bytes (UTF-8).", id="201-bytes"),
    pytest.param(b"a\x01b", b"Queue name contains a control character ('\\x01').", id="control"),
    pytest.param(b"a\x7fb", b"Queue name contains a control character ('\\x7f').", id="del"),
    pytest.param(b"a\x00b", b"Queue name contains a NUL character.", id="nul"),
    pytest.param(b"../x", _ILLEGAL, id="dotdot"),
    pytest.param(b"..", _ILLEGAL, id="parent"),
    pytest.param(b"+child", b"Fanout queue name has no master queue before '+'.", id="fanout"),
]


@pytest.mark.parametrize("name, reason", BAD_NAMES)
def test_bad_queue_name_on_get(server: KestrelProcess, name: bytes, reason: bytes) -> None:
    """A get of an illegal name: CLIENT_ERROR bad queue name, kept open, no journal file."""
    assert_answered(server, b"get %s\r\n" % name,
                    b"CLIENT_ERROR bad queue name: %s\r\n" % reason)


@pytest.mark.parametrize("name, reason", [
    *BAD_NAMES,
    pytest.param(b"a/b", _ILLEGAL, id="slash"),
    pytest.param(b"/open", _ILLEGAL, id="leading-slash"),
])
def test_bad_queue_name_on_set(server: KestrelProcess, name: bytes, reason: bytes) -> None:
    """
    A set to an illegal name has its payload read, then gets CLIENT_ERROR bad
    queue name, the connection kept; the item is stored nowhere.
    """
    assert_answered(server, b"set %s 0 0 5\r\nhello\r\n" % name,
                    b"CLIENT_ERROR bad queue name: %s\r\n" % reason)


@pytest.mark.parametrize("option", [b"open", b"peek", b"t=10", b"close", b"abort"])
def test_empty_queue_name_on_get(server: KestrelProcess, option: bytes) -> None:
    """`get /<option>` names no queue: CLIENT_ERROR empty queue name, kept open."""
    assert_answered(server, b"get /%s\r\n" % option, b"CLIENT_ERROR empty queue name\r\n")


def test_longest_name_is_accepted(server: KestrelProcess, raw: LineClient) -> None:
    """A 200-byte name is legal: its item round-trips and its journal file appears."""
    name = b"m" * 200
    raw.send(b"set %s 0 0 2\r\nok\r\nget %s\r\n" % (name, name))
    assert raw.line() == b"STORED\r\n"
    assert raw.until(b"END\r\n") == b"VALUE %s 0 2\r\nok\r\nEND\r\n" % name
    assert (server.queue_path / name.decode()).is_file()


def test_get_slash_is_an_option_not_a_path(server: KestrelProcess, raw: LineClient) -> None:
    """
    `get a/b` reads queue `a` with the unknown option `b` (ignored, as in
    Kestrel): END, connection kept, and nothing named `a/b` exists on disk.
    """
    raw.send(b"get sl/b\r\nversion\r\n")
    assert raw.line() == b"END\r\n"
    assert raw.line().startswith(b"VERSION ")
    assert (server.queue_path / "sl").is_file()
    assert not (server.queue_path / "sl" / "b").exists()
    assert not any(Path(p).name == "b" for p in files_under(server.root))
    assert_alive(server)


def test_queue_commands_on_illegal_name_create_nothing(server: KestrelProcess,
                                                      raw: LineClient) -> None:
    """
    delete, flush, flush_expired and confirm only look a queue up (as in
    Kestrel): on an illegal name they find none, answer as for a missing
    queue, keep the connection, and create nothing on disk.
    """
    before = files_under(server.root)
    raw.send(b"delete ../x\r\nflush ../x\r\nflush_expired ../x\r\nconfirm ../x 1\r\n"
             b"dump_stats ../x\r\nversion\r\n")
    assert raw.line() == b"DELETED\r\n"
    assert raw.line() == b"END\r\n"
    assert raw.line() == b"0\r\n"
    assert raw.line() == b"ERROR\r\n"
    assert raw.until(b"END\r\n") == b"queue '../x' {\r\n  \r\n}\r\nEND\r\n"
    assert raw.line().startswith(b"VERSION ")
    assert files_under(server.root) == before
    assert_alive(server)


def test_monitor_illegal_name(server: KestrelProcess) -> None:
    """monitor of an illegal name: CLIENT_ERROR bad queue name, kept open, no journal file."""
    assert_answered(server, b"monitor ../x 1\r\n",
                    b"CLIENT_ERROR bad queue name: %s\r\n" % _ILLEGAL)


# -- malformed requests -------------------------------------------------------------------

@pytest.mark.parametrize("request_bytes, reply", [
    (b"get q/t=abc\r\n", b"CLIENT_ERROR bad timeout\r\n"),
    (b"get q/t=2147483648\r\n", b"CLIENT_ERROR bad timeout\r\n"),
    (b"get q/peek/open\r\n",
     b"CLIENT_ERROR peek and abort cannot be combined with open or close\r\n"),
    (b"get q/peek/abort\r\n", b"CLIENT_ERROR peek and abort cannot be combined\r\n"),
    (b"get q/abort/open\r\n",
     b"CLIENT_ERROR peek and abort cannot be combined with open or close\r\n"),
    (b"monitor q\r\n", b"CLIENT_ERROR malformed monitor: expected monitor <queue> <seconds>\r\n"),
    (b"monitor q x\r\n", b"CLIENT_ERROR bad seconds\r\n"),
    (b"confirm q x\r\n", b"CLIENT_ERROR bad count\r\n"),
    (b"flush_expired\r\n", b"CLIENT_ERROR missing queue name\r\n"),
    (b"status down\r\n", b"CLIENT_ERROR Status Down may not be set; use Quiescent\r\n"),
    (b"status bogus\r\n", b"CLIENT_ERROR Unknown status 'bogus': expected one of up, readonly, "
                          b"quiescent, writeavoid\r\n"),
])
def test_malformed_request_keeps_connection(server: KestrelProcess, request_bytes: bytes,
                                            reply: bytes) -> None:
    """Where Kestrel closed silently: CLIENT_ERROR with the reason, connection kept."""
    assert_answered(server, request_bytes, reply)


def test_missing_arguments_keep_connection(server: KestrelProcess, raw: LineClient) -> None:
    """get, delete and flush without a queue, and a short confirm: CLIENT_ERROR, kept open."""
    raw.send(b"get\r\ndelete\r\nflush\r\nconfirm q\r\nversion\r\n")
    assert raw.line() == b"CLIENT_ERROR missing queue name\r\n"
    assert raw.line() == b"CLIENT_ERROR missing queue name\r\n"
    assert raw.line() == b"CLIENT_ERROR missing queue name\r\n"
    assert raw.line() == b"CLIENT_ERROR malformed confirm: expected confirm <queue> <count>\r\n"
    assert raw.line().startswith(b"VERSION ")
    assert_alive(server)


# -- malformed set lines ---------------------------------------------------------------------

@pytest.mark.parametrize("header, reply", [
    pytest.param(b"set hdr 0 abc 7\r\n", b"CLIENT_ERROR bad exptime\r\n", id="exptime"),
    pytest.param(b"set hdr 0 2147483648 7\r\n", b"CLIENT_ERROR bad exptime\r\n",
                 id="exptime-over-int"),
    pytest.param(b"set hdr x 0 7\r\n", b"CLIENT_ERROR bad flags\r\n", id="flags"),
])
def test_bad_set_numbers_drop_payload_and_keep_connection(
        server: KestrelProcess, header: bytes, reply: bytes) -> None:
    """
    A bad exptime or flags with a good byte count: the payload (which looks
    like a command) is read and dropped, CLIENT_ERROR, connection kept.
    """
    assert_answered(server, header + b"version\r\n", reply)
    assert queue_is_empty(server, b"hdr")


@pytest.mark.parametrize("header, reply", [
    pytest.param(b"set hdr 0 0 -1\r\n", b"CLIENT_ERROR bad byte count\r\n", id="negative-bytes"),
    pytest.param(b"set hdr 0 0 x\r\n", b"CLIENT_ERROR bad byte count\r\n", id="bad-bytes"),
    pytest.param(b"set hdr 0 0\r\n",
                 b"CLIENT_ERROR malformed set: expected set <queue> <flags> <exptime> <bytes>\r\n",
                 id="short"),
    pytest.param(b"set hdr 0 0 %d\r\n" % (MAX_REQUEST_SIZE + 1),
                 b"CLIENT_ERROR item of %d bytes is larger than max_request_size (%d)\r\n"
                 % (MAX_REQUEST_SIZE + 1, MAX_REQUEST_SIZE), id="over-max-request-size"),
])
def test_bad_set_header_closes_without_reading_payload(
        server: KestrelProcess, header: bytes, reply: bytes) -> None:
    """
    The byte count cannot be trusted, so the stream cannot be resynchronised:
    the reply and the close come right after the header line, and the server
    does not wait for the payload (none is sent). Nothing is stored.
    """
    assert_refused(server, header, reply)
    assert queue_is_empty(server, b"hdr")


@pytest.mark.parametrize("request_bytes", [
    pytest.param(b"set hdr 0 0 2\r\nabc\r\n", id="longer"),
    pytest.param(b"set hdr 0 0 3\r\nab\r\nget hdr\r\n", id="shorter"),
    pytest.param(b"set hdr 0 0 2\r\nab\nversion\r\n", id="bare-newline"),
])
def test_data_block_not_followed_by_crlf_closes(server: KestrelProcess,
                                                request_bytes: bytes) -> None:
    """A data block whose byte count is wrong: CLIENT_ERROR bad data chunk, a close, not stored."""
    assert_refused(server, request_bytes, b"CLIENT_ERROR bad data chunk\r\n")
    assert queue_is_empty(server, b"hdr")


def test_bad_flags_keep_connection(server: KestrelProcess, raw: LineClient) -> None:
    """
    Non-numeric flags: the payload is read and discarded (a payload that looks
    like a command is not run), CLIENT_ERROR bad flags, connection kept.
    """
    raw.send(b"set bf x 0 9\r\nversion\r\n\r\nget bf\r\n")
    assert raw.line() == b"CLIENT_ERROR bad flags\r\n"
    assert raw.line() == b"END\r\n"
    raw.send(b"set bf 0 0 2\r\nok\r\nget bf\r\n")
    assert raw.line() == b"STORED\r\n"
    assert raw.until(b"END\r\n") == b"VALUE bf 0 2\r\nok\r\nEND\r\n"
    assert_alive(server)


def test_item_over_max_item_size(server: KestrelProcess, raw: LineClient) -> None:
    """
    An item over the queue's max_item_size (within max_request_size) is read
    and discarded: NOT_STORED, connection kept; one of exactly the limit is stored.
    """
    over = b"version\r\nab"  # 11 bytes; would answer VERSION if it were taken for a command
    assert len(over) == SMALL_ITEM_SIZE + 1
    raw.send(b"set small 0 0 %d\r\n%s\r\nget small\r\n" % (len(over), over))
    assert raw.line() == b"NOT_STORED\r\n"
    assert raw.line() == b"END\r\n"
    exact = b"0123456789"
    raw.send(b"set small 0 0 10\r\n%s\r\nget small\r\n" % exact)
    assert raw.line() == b"STORED\r\n"
    assert raw.until(b"END\r\n") == b"VALUE small 0 10\r\n%s\r\nEND\r\n" % exact
    assert_alive(server)


def test_large_item_over_max_item_size_in_pieces(server: KestrelProcess,
                                                 raw: LineClient) -> None:
    """A payload near max_request_size, sent in pieces, is discarded whole: NOT_STORED."""
    payload = b"get small\r\n" * 90  # 990 bytes of what looks like requests
    raw.send(b"set small 0 0 %d\r\n" % len(payload))
    for i in range(0, len(payload), 300):
        raw.send(payload[i:i + 300])
        time.sleep(0.01)  # separate TCP segments, so the server reads the payload piecewise
    raw.send(b"\r\nversion\r\n")
    assert raw.line() == b"NOT_STORED\r\n"
    assert raw.line().startswith(b"VERSION ")
    assert_alive(server)


# -- over-long lines -------------------------------------------------------------------------

@pytest.mark.parametrize("line", [
    pytest.param(b"get " + b"x" * (MAX_REQUEST_SIZE + 100), id="no-newline"),
    pytest.param(b"get " + b"x" * (MAX_REQUEST_SIZE + 100) + b"\r\n", id="with-newline"),
    pytest.param(b"bogus" * 300, id="garbage"),
])
def test_overlong_line(server: KestrelProcess, line: bytes) -> None:
    """A request line over max_request_size: CLIENT_ERROR request line too long, close."""
    assert_refused(server, line, b"CLIENT_ERROR request line too long\r\n")


def test_overlong_line_in_pieces(server: KestrelProcess) -> None:
    """A line growing past max_request_size over several reads is refused before its end."""
    client = connect(server)
    try:
        client.send(b"get ")
        for _ in range(3):
            client.send(b"x" * (MAX_REQUEST_SIZE // 3))
            time.sleep(0.01)
        client.send(b"x" * 100)
        assert client.line() == b"CLIENT_ERROR request line too long\r\n"
        assert client.closed()
    finally:
        client.close()
    assert_alive(server)


@pytest.mark.parametrize("ending", [b"\n", b"\r\n"], ids=["lf", "crlf"])
def test_line_of_exactly_max_request_size_is_served(raw: LineClient, ending: bytes) -> None:
    """A request line of exactly max_request_size bytes (its ending not counted) is served."""
    line = b"get bnd" + b"/peek" * ((MAX_REQUEST_SIZE - 7) // 5)
    line += b"/" * (MAX_REQUEST_SIZE - len(line))  # empty options are ignored
    assert len(line) == MAX_REQUEST_SIZE
    raw.send(line + ending + b"version\r\n")
    assert raw.line() == b"END\r\n"
    assert raw.line().startswith(b"VERSION ")


# -- ERROR, connection kept ----------------------------------------------------------------

def test_plain_get_with_open_read(server: KestrelProcess) -> None:
    """
    A plain get of a queue this connection holds an open read on: ERROR with
    the reason, the connection and the open read kept; once the connection
    ends, the open read goes back to the head of the queue.
    """
    client = connect(server)
    try:
        client.send(b"set orq 0 0 1\r\na\r\nset orq 0 0 1\r\nb\r\nget orq/open\r\n")
        assert client.line() == client.line() == b"STORED\r\n"
        assert client.until(b"END\r\n") == b"VALUE orq/open 0 1\r\na\r\nEND\r\n"
        client.send(b"get orq\r\nget orq/peek\r\n")
        assert client.line() == (
            b"ERROR a read is open on this queue: use /close, /open or /abort\r\n")
        assert client.until(b"END\r\n") == b"VALUE orq/peek 0 1\r\nb\r\nEND\r\n"
    finally:
        client.close()
    assert drain(server, b"orq") == [b"a", b"b"]
    assert_alive(server)


def test_open_over_max_open_transactions(server: KestrelProcess) -> None:
    """
    One /open more than max_open_transactions: ERROR too many open reads, the
    connection kept; when it ends every open read goes back, the first opened first.
    """
    items = [b"i%d" % i for i in range(MAX_OPEN_TRANSACTIONS + 1)]
    client = connect(server)
    try:
        client.send(b"".join(b"set mot 0 0 2\r\n%s\r\n" % item for item in items))
        for _ in items:
            assert client.line() == b"STORED\r\n"
        for item in items[:MAX_OPEN_TRANSACTIONS]:
            client.send(b"get mot/open\r\n")
            assert client.until(b"END\r\n") == b"VALUE mot/open 0 2\r\n%s\r\nEND\r\n" % item
        client.send(b"get mot/open\r\nversion\r\n")
        assert client.line() == b"ERROR too many open reads\r\n"
        assert client.line().startswith(b"VERSION ")
    finally:
        client.close()
    assert drain(server, b"mot") == items
    assert_alive(server)


def drain(server: KestrelProcess, queue: bytes) -> list[bytes]:
    """
    Every item of C{queue}, in order, read on a fresh connection. Open reads
    of a closed connection are returned by the server after the close; a short
    wait on the first get covers that.
    """
    client = connect(server)
    items: list[bytes] = []
    try:
        request = b"get %s/t=2000\r\n" % queue
        while True:
            client.send(request)
            line = client.line()
            if line == b"END\r\n":
                return items
            assert line.startswith(b"VALUE %s" % request[4:-2]), line
            items.append(client.exactly(int(line.split()[3]) + 2)[:-2])
            assert client.line() == b"END\r\n"
            request = b"get %s\r\n" % queue
    finally:
        client.close()


# -- unknown commands and commands a queue cannot serve ------------------------------------

@pytest.mark.parametrize("request_bytes", [b"\r\n", b"   \r\n"])
def test_empty_line(server: KestrelProcess, request_bytes: bytes) -> None:
    """An empty line: memcache's ERROR, connection kept."""
    assert_answered(server, request_bytes, b"ERROR\r\n")


@pytest.mark.parametrize("request_bytes", [
    b"bogus\r\n", b"BOGUS q\r\n", b"y" * 100 + b"\r\n", b"verbosity 1\r\n",
    b"xs uc 9 T0\r\nflush_all\r\n", b"\tget uc\r\n",
])
def test_unknown_command(server: KestrelProcess, request_bytes: bytes) -> None:
    """
    An unknown command may announce a data block the server cannot size: ERROR,
    then the connection closes, so none of its bytes run as a request.
    """
    assert_refused(server, request_bytes, b"ERROR\r\n")
    assert queue_is_empty(server, b"uc")


@pytest.mark.parametrize("request_bytes, word", [
    (b"add uc 0 0 9\r\nversion\r\n\r\n", b"add"),
    (b"replace uc 0 0 1\r\nx\r\n", b"replace"),
    (b"append uc 0 0 1\r\nx\r\n", b"append"),
    (b"PREPEND uc 0 0 1\r\nx\r\n", b"prepend"),
    (b"cas uc 0 0 1 1\r\nx\r\n", b"cas"),
])
def test_refused_storage_command(server: KestrelProcess, request_bytes: bytes,
                                 word: bytes) -> None:
    """
    add, replace, append, prepend, cas: the data block (even one that looks
    like a command) is read and dropped, CLIENT_ERROR names the command, the
    connection is kept, and nothing is stored.
    """
    assert_answered(server, request_bytes,
                    b"CLIENT_ERROR %s is not supported by a queue server (use set)\r\n" % word)
    assert queue_is_empty(server, b"uc")


@pytest.mark.parametrize("request_bytes, word", [
    (b"incr uc 1\r\n", b"incr"),
    (b"decr uc 1\r\n", b"decr"),
    (b"touch uc 10\r\n", b"touch"),
    (b"gat 10 uc\r\n", b"gat"),
    (b"gats 10 uc\r\n", b"gats"),
])
def test_refused_command(server: KestrelProcess, request_bytes: bytes, word: bytes) -> None:
    """incr, decr, touch, gat, gats: CLIENT_ERROR naming the command, connection kept."""
    assert_answered(server, request_bytes,
                    b"CLIENT_ERROR %s is not supported by a queue server\r\n" % word)
    assert queue_is_empty(server, b"uc")


def test_refused_commands_with_noreply_send_nothing(server: KestrelProcess,
                                                    raw: LineClient) -> None:
    """With noreply a refused command sends nothing at all, so the next reply stays in step."""
    raw.send(b"add nr 0 0 1 noreply\r\nx\r\nincr nr 1 noreply\r\ntouch nr 1 noreply\r\n"
             b"set nr/x 0 0 1 noreply\r\nx\r\nversion\r\n")
    assert raw.line().startswith(b"VERSION ")
    assert queue_is_empty(server, b"nr")


def test_error_after_good_requests_keeps_their_replies(server: KestrelProcess) -> None:
    """Replies before a bad request are sent, in order, before its error."""
    client = connect(server)
    try:
        client.send(b"set gb 0 0 1\r\nz\r\nversion\r\nget gb/x/open/peek\r\nget gb\r\n")
        assert client.line() == b"STORED\r\n"
        assert client.line().startswith(b"VERSION ")
        assert client.line().startswith(b"CLIENT_ERROR peek and abort")
        assert client.until(b"END\r\n") == b"VALUE gb 0 1\r\nz\r\nEND\r\n"
    finally:
        client.close()
    assert_alive(server)


# -- the binary protocol ------------------------------------------------------------------

def test_unframable_binary_packet_gets_a_binary_error_then_a_close(
        server: KestrelProcess) -> None:
    """
    A binary packet whose key runs past its body cannot be framed: one binary
    response (magic 0x81, its opcode and opaque echoed, status 0x0004) at
    once, then a close.
    """
    # binary GET (opcode 0x00), key length 9 in a body of 1, opaque 0x01020304
    request = (bytes([0x80, 0x00, 0x00, 0x09, 0x00, 0x00, 0x00, 0x00]) + (1).to_bytes(4, "big")
               + bytes([1, 2, 3, 4]) + bytes(8) + b"k")
    client = connect(server)
    try:
        started = time.monotonic()
        client.send(request)
        header = client.exactly(24)
        assert header[:8] == bytes([0x81, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04])
        assert header[12:16] == bytes([1, 2, 3, 4])
        body = client.exactly(int.from_bytes(header[8:12], "big"))
        assert body == b"key and extras longer than the body"
        assert client.closed()
        assert time.monotonic() - started < REPLY_TIMEOUT / 2
    finally:
        client.close()
    assert_alive(server)


# -- server status and connection limits ---------------------------------------------------

def test_status_refusal_keeps_connection(server: KestrelProcess) -> None:
    """A write refused by the server status: SERVER_ERROR, the connection serves on."""
    client = connect(server)
    try:
        client.send(b"status readonly\r\nset ro 0 0 1\r\nx\r\nget ro\r\nstatus up\r\n"
                    b"set ro 0 0 1\r\ny\r\nget ro\r\n")
        assert client.line() == b"END\r\n"
        assert client.line() == b"SERVER_ERROR Server not available for operation setItem\r\n"
        assert client.line() == b"END\r\n"
        assert client.line() == b"END\r\n"
        assert client.line() == b"STORED\r\n"
        assert client.until(b"END\r\n") == b"VALUE ro 0 1\r\ny\r\nEND\r\n"
    finally:
        client.close()
    assert_alive(server)


def test_connection_limit_refusal_keeps_connection(
        kestrel_factory: Callable[..., KestrelProcess]) -> None:
    """A connection over connection_limit_refuse_writes gets SERVER_ERROR per write, kept open."""
    limited = kestrel_factory(config={"connection_limit_refuse_writes": 1})
    first = connect(limited)
    second = connect(limited)
    try:
        first.send(b"version\r\n")
        assert first.line().startswith(b"VERSION ")
        second.send(b"set cl 0 0 1\r\nx\r\nset cl 0 0 1\r\ny\r\nget cl\r\n")
        for _ in range(2):
            assert second.line() == (
                b"SERVER_ERROR Server not available for operation setItem\r\n")
        assert second.line() == b"END\r\n"
        first.send(b"set cl 0 0 1\r\nz\r\n")
        assert first.line() == b"STORED\r\n"
        second.send(b"get cl\r\n")
        assert second.until(b"END\r\n") == b"VALUE cl 0 1\r\nz\r\nEND\r\n"
    finally:
        first.close()
        second.close()


# -- client_timeout ---------------------------------------------------------------------

CLIENT_TIMEOUT = 0.5


@pytest.fixture(scope="module")
def idle_server(kestrel_factory: Callable[..., KestrelProcess]) -> KestrelProcess:
    """A second server, closing connections idle for CLIENT_TIMEOUT seconds."""
    return kestrel_factory(config={"client_timeout": f"{int(CLIENT_TIMEOUT * 1000)}ms"})


def wait_closed(client: LineClient) -> float:
    """Block until the server closes C{client} (at most L{REPLY_TIMEOUT}); return when."""
    assert client.closed()
    return time.monotonic()


def test_idle_connection_closed(idle_server: KestrelProcess) -> None:
    """A connection that sends nothing is closed after client_timeout, not before."""
    started = time.monotonic()
    client = connect(idle_server)
    try:
        closed_at = wait_closed(client)
    finally:
        client.close()
    assert CLIENT_TIMEOUT - 0.05 <= closed_at - started < REPLY_TIMEOUT
    assert_alive(idle_server)


def test_active_connection_kept_then_closed(idle_server: KestrelProcess) -> None:
    """Requests keep a connection alive past client_timeout; once idle it is closed."""
    client = connect(idle_server)
    try:
        started = time.monotonic()
        while True:
            last_sent = time.monotonic()
            client.send(b"version\r\n")
            assert client.line().startswith(b"VERSION ")
            if last_sent - started > 3 * CLIENT_TIMEOUT:
                break
            time.sleep(CLIENT_TIMEOUT / 4)
        closed_at = wait_closed(client)
    finally:
        client.close()
    assert closed_at - last_sent >= CLIENT_TIMEOUT - 0.05
    assert_alive(idle_server)


def test_waiting_get_is_not_idle(idle_server: KestrelProcess) -> None:
    """A get blocked longer than client_timeout is answered; idleness counts from its reply."""
    wait_ms = int(CLIENT_TIMEOUT * 3000)
    client = connect(idle_server)
    try:
        started = time.monotonic()
        client.send(b"get idleq/t=%d\r\n" % wait_ms)
        assert client.line() == b"END\r\n"
        answered_at = time.monotonic()
        closed_at = wait_closed(client)
    finally:
        client.close()
    assert answered_at - started >= wait_ms / 1000 - 0.05
    assert closed_at - answered_at >= CLIENT_TIMEOUT * 0.5
    assert_alive(idle_server)
