"""
Text protocol (port 2222) over StringTransport, byte for byte, with a fake clock.

The server context is the real one (collection, sessions, status) with its
journals in a temporary folder; only the socket is replaced by a StringTransport.
"""

from __future__ import annotations

from functools import partial

import pytest
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.testing import StringTransportWithDisconnection

from kestrel.protocols.text import MAX_PUT_BUFFER, TextFactory, parse_int
from kestrel.server import KestrelServer
from tests import support
from tests.support import ManualThread, StringClient, replies_to

#: Servers here allow 100 open reads per queue per connection, as the shipped
#: config does: the shared C{server} fixture (tests/unit/conftest.py) passes
#: these options to L{tests.support.make_server}, and so does C{make_server}.
SERVER_OPTIONS = {"max_open_transactions": 100}
make_server = partial(support.make_server, **SERVER_OPTIONS)


class Client(StringClient):
    """One text connection over a StringTransport."""

    def __init__(self, server: KestrelServer) -> None:
        super().__init__(TextFactory(server))


@pytest.fixture
def client(server: KestrelServer) -> Client:
    """One text connection to C{server}."""
    return Client(server)


def test_put_then_get_returns_items_in_order(client) -> None:
    """C{put q:} stores each data line as one item and C{get} returns them FIFO."""
    assert client.send(b"put q:\nabc\ndef\n\n") == b"+2\n"
    assert client.send(b"get q\n") == b":abc\n"
    assert client.send(b"get q\n") == b":def\n"
    assert client.send(b"get q\n") == b"*\n"


def test_crlf_line_endings_are_accepted(client) -> None:
    """A C{\\r} before the C{\\n} is not part of the line."""
    assert client.send(b"put q:\r\nabc\r\n\r\n") == b"+1\n"
    assert client.send(b"get q\r\n") == b":abc\n"


def test_data_bytes_are_kept_as_sent(client) -> None:
    """Bytes 0x80-0xFF are stored as sent (Kestrel re-encoded them as UTF-8)."""
    assert client.send(b"put q:\n\xe9t\xe9\xff\x00\n\n") == b"+1\n"
    assert client.send(b"get q\n") == b":\xe9t\xe9\xff\x00\n"


def test_put_without_colon_stores_nothing(client) -> None:
    """C{put q} without the trailing colon carries no items: C{+0}."""
    assert client.send(b"put q\n") == b"+0\n"
    assert client.send(b"get q\n") == b"*\n"


def test_put_errors(client) -> None:
    """A put without a queue, or with a bad expiry, gets an error line and stores nothing."""
    assert client.send(b"put:\nx\n\n") == b"-Queue name required.\n"
    assert client.send(b"put q soon:\nx\n\n") == b"-Error parsing expiration time.\n"
    assert client.send(b"put q 99999999999:\nx\n\n") == b"-Error parsing expiration time.\n"
    assert client.send(b"get q\n") == b"*\n"


def test_put_expiry_zero_never_expires(client, clock) -> None:
    """C{put q 0:} stores items that never expire (Kestrel: expired at once)."""
    assert client.send(b"put q 0:\nx\n\n") == b"+1\n"
    clock.advance(10 * 365 * 86400)
    assert client.send(b"get q\n") == b":x\n"


def test_put_over_1024_items_is_refused_whole(client) -> None:
    """
    A put body of more than 1024 items is read to its empty line and refused:
    nothing is stored and none of its lines runs as a command.
    """
    assert client.send(b"put victim:\nkeep\n\n") == b"+1\n"
    lines = b"".join(b"i%d\n" % n for n in range(MAX_PUT_BUFFER + 1))
    reply = client.send(b"put q:\n" + lines + b"flush victim\ni\n\n")
    assert reply == b"-Too many items in one put (limit 1024); none stored.\n"
    assert client.send(b"get q\n") == b"*\n"
    assert client.send(b"get victim\n") == b":keep\n"
    full = b"".join(b"i%d\n" % n for n in range(MAX_PUT_BUFFER))
    assert client.send(b"put q:\n" + full + b"\n") == b"+1024\n"


def test_put_over_max_request_size_bytes_is_refused_whole(clock, tmp_path) -> None:
    """A put body whose lines total more than max_request_size bytes stores nothing."""
    server = make_server(clock, tmp_path, max_request_size=100)
    client = Client(server)
    body = b"".join([b"x" * 40 + b"\n"] * 3)
    assert client.send(b"put q:\n" + body + b"flush_all\n\n") == (
        b"-Put body too large (limit 100 bytes); none stored.\n")
    assert client.send(b"put q:\n" + body[:82] + b"\n") == b"+2\n"


@pytest.mark.parametrize("first", [b"GET / HTTP/1.1", b"POST /x HTTP/1.0",
                                   b"OPTIONS * HTTP/1.1", b"GET /"])
def test_http_request_is_refused_and_closed(server, first: bytes) -> None:
    """An HTTP request line first: one error line, the connection closes, nothing runs."""
    client = Client(server)
    reply = client.send(first + b"\r\nContent-Type: text/plain\r\n\r\nput csrf:\nx\n\n")
    assert reply == b"-HTTP requests are not served on this port.\n"
    assert not client.connected
    assert Client(server).send(b"get csrf\n") == b"*\n"


def test_http_like_line_later_is_a_command(client) -> None:
    """Only the first line is checked: a later C{POST /} is an unknown command."""
    assert client.send(b"version\n").startswith(b":")
    assert client.send(b"POST / HTTP/1.1\n") == b"-Unknown command: post\n"


def test_get_confirms_previous_reads_of_the_queue(server) -> None:
    """Each get confirms the connection's previous read on the queue; only the last is aborted."""
    a = Client(server)
    assert a.send(b"put q:\none\ntwo\n\n") == b"+2\n"
    assert a.send(b"get q\n") == b":one\n"
    assert a.send(b"get q\n") == b":two\n"
    a.close()
    b = Client(server)
    assert b.send(b"get q\n") == b":two\n"
    assert b.send(b"get q\n") == b"*\n"


def test_disconnect_aborts_the_open_read(server) -> None:
    """The item from a get that was never confirmed goes back to the queue on disconnect."""
    a = Client(server)
    assert a.send(b"put q:\none\ntwo\n\n") == b"+2\n"
    assert a.send(b"get q\n") == b":one\n"
    a.close()
    b = Client(server)
    assert b.send(b"get q\n") == b":one\n"


def test_get_with_timeout_waits_and_holds_later_lines(server, clock) -> None:
    """A waiting get delays the replies to the lines after it until it has its item."""
    a, b = Client(server), Client(server)
    assert a.send(b"get q 1000\nversion\n") == b""
    clock.advance(0.5)
    assert b.send(b"put q:\nlate\n\n") == b"+1\n"
    assert a.take() == b":late\n:" + server.version.encode() + b"\n"


def test_get_timeout_expires_with_no_item(client, clock) -> None:
    """C{get q 500} on an empty queue answers C{*} after 0.5 s."""
    assert client.send(b"get q 500\n") == b""
    clock.advance(0.499)
    assert client.take() == b""
    clock.advance(0.001)
    assert client.take() == b"*\n"


def test_get_errors(client) -> None:
    """get/peek without a queue or with a bad timeout get error lines; nothing waits."""
    assert client.send(b"get\n") == b"-Queue name required.\n"
    assert client.send(b"peek\n") == b"-Queue name required.\n"
    assert client.send(b"get q 1s\n") == b"-Error parsing timeout.\n"
    assert client.send(b"peek q -\n") == b"-Error parsing timeout.\n"


def test_peek_does_not_remove(client) -> None:
    """peek returns the head item and leaves it in the queue."""
    assert client.send(b"put q:\na\nb\n\n") == b"+2\n"
    assert client.send(b"peek q\n") == b":a\n"
    assert client.send(b"peek q\n") == b":a\n"
    assert client.send(b"get q\n") == b":a\n"
    assert client.send(b"peek q\n") == b":b\n"


def test_monitor_streams_open_reads_then_star(server, clock) -> None:
    """monitor streams every available item, waits until its deadline, ends with C{*}."""
    a = Client(server)
    assert a.send(b"put q:\na\nb\nc\n\n") == b"+3\n"
    assert a.send(b"monitor q 1000\n") == b":a\n:b\n:c\n"
    clock.advance(1.0)
    assert a.take() == b"*\n"
    assert a.send(b"confirm q 3\n") == b"+3\n"
    a.close()
    assert Client(server).send(b"get q\n") == b"*\n"


def test_monitor_items_are_aborted_on_disconnect(server, clock) -> None:
    """Items streamed by monitor and never confirmed return to the queue on disconnect."""
    a = Client(server)
    assert a.send(b"put q:\na\nb\n\n") == b"+2\n"
    assert a.send(b"monitor q 1000\n") == b":a\n:b\n"
    a.close()
    b = Client(server)
    assert b.send(b"get q\n") == b":a\n"


def test_monitor_errors(client) -> None:
    """monitor needs a queue and a numeric timeout."""
    assert client.send(b"monitor q\n") == b"-Queue name & timeout required.\n"
    assert client.send(b"monitor\n") == b"-Queue name & timeout required.\n"
    assert client.send(b"monitor q soon\n") == b"-Error parsing timeout.\n"


def test_confirm(client, clock) -> None:
    """confirm needs a queue and a count, and that many open reads."""
    assert client.send(b"confirm q\n") == b"-Queue name & count required.\n"
    assert client.send(b"confirm q x\n") == b"-Error parsing count.\n"
    assert client.send(b"confirm q 1\n") == b"-Not that many transactions open.\n"
    assert client.send(b"put q:\na\n\n") == b"+1\n"
    assert client.send(b"get q\n") == b":a\n"
    assert client.send(b"confirm q 2\n") == b"-Not that many transactions open.\n"
    assert client.send(b"confirm q 0\n") == b"-Not that many transactions open.\n"
    assert client.send(b"confirm q 1\n") == b"+1\n"
    assert client.send(b"confirm q 1\n") == b"-Not that many transactions open.\n"


def test_flush_delete_flush_all(client) -> None:
    """flush, delete and flush_all answer C{+0} and empty the queues."""
    assert client.send(b"put q:\na\n\nput r:\nb\n\nput s:\nc\n\n") == b"+1\n+1\n+1\n"
    assert client.send(b"flush q\n") == b"+0\n"
    assert client.send(b"delete r\n") == b"+0\n"
    assert client.send(b"get q\nget r\nget s\n") == b"*\n*\n:c\n"
    assert client.send(b"put q:\na\n\n") == b"+1\n"
    assert client.send(b"flush_all\n") == b"+0\n"
    assert client.send(b"peek q\n") == b"*\n"
    assert client.send(b"flush\n") == b"-Queue name required.\n"
    assert client.send(b"delete\n") == b"-Queue name required.\n"


def test_status_and_blocked_operations(client) -> None:
    """status reads and sets the server status; blocked operations get an error line."""
    assert client.send(b"status\n") == b":UP\n"
    assert client.send(b"status readonly\n") == b"+0\n"
    assert client.send(b"status\n") == b":READONLY\n"
    assert client.send(b"put q:\na\n\n") == b"-Server not available for operation setItem\n"
    assert client.send(b"flush q\n") == b"-Server not available for operation flush\n"
    assert client.send(b"delete q\n") == b"-Server not available for operation delete\n"
    assert client.send(b"flush_all\n") == b"-Server not available for operation flushAll\n"
    assert client.send(b"get q\n") == b"*\n"
    assert client.send(b"status quiescent\n") == b"+0\n"
    assert client.send(b"get q\n") == b"-Server not available for operation getItem\n"
    assert client.send(b"monitor q 10\n") == b"-Server not available for operation monitorUntil\n"
    assert client.send(b"status bogus\n") == b"-Unknown status.\n"
    assert client.send(b"status down\n") == b"-Status forbidden.\n"
    assert client.send(b"status up\n") == b"+0\n"
    assert client.send(b"status\n") == b":UP\n"
    assert client.connected


def test_version(client, server) -> None:
    """version answers C{:<version>}."""
    assert client.send(b"version\n") == b":" + server.version.encode() + b"\n"


def test_unknown_commands(client) -> None:
    """Anything else, including an empty line, gets C{-Unknown command: <cmd>} (lower-cased)."""
    assert client.send(b"FOO bar\n") == b"-Unknown command: foo\n"
    assert client.send(b"\n") == b"-Unknown command: \n"
    assert client.send(b"set q 0 0 1\n") == b"-Unknown command: set\n"
    assert client.connected


def test_runs_of_spaces_separate_tokens(client) -> None:
    """C{put  q  :} and C{get   q} name the queue C{q}."""
    assert client.send(b"put  q :\na\n\n") == b"+1\n"
    assert client.send(b"GET   q  \n") == b":a\n"


def test_quit_closes_without_reply(client) -> None:
    """quit closes the connection and writes nothing."""
    assert client.send(b"quit\nversion\n") == b""
    assert not client.connected


def test_line_too_long_is_refused_and_closes(clock, tmp_path) -> None:
    """A line longer than C{max_request_size} gets an error line, then the connection closes."""
    client = Client(make_server(clock, tmp_path, max_request_size=16))
    assert client.send(b"get " + b"q" * 12 + b"\n") == b"*\n"
    assert client.send(b"get " + b"q" * 13 + b"\n") == b"-Line too long (limit 16 bytes).\n"
    assert not client.connected


def test_unterminated_line_too_long_is_refused(clock, tmp_path) -> None:
    """A partial line already over the limit is refused without waiting for its end."""
    client = Client(make_server(clock, tmp_path, max_request_size=16))
    assert client.send(b"x" * 40) == b"-Line too long (limit 16 bytes).\n"
    assert not client.connected


def test_parse_int_is_java_like() -> None:
    """parse_int takes optional signs and 32-bit range only."""
    assert parse_int(b"+12", "x") == 12
    assert parse_int(b"-2147483648", "x") == -(2**31)
    for bad in (b"", b"1_000", b" 1", b"2147483648", b"1.5", b"0x10"):
        with pytest.raises(Exception, match="Error parsing x."):
            parse_int(bad, "x")


_words = st.binary(min_size=1, max_size=6).filter(lambda b: b"\n" not in b and b"\r" not in b)
_command_lines = st.one_of(
    st.builds(lambda q, items: b"put %s:\n" % q + b"".join(i + b"\n" for i in items) + b"\n",
              st.sampled_from([b"a", b"b"]), st.lists(_words, max_size=4)),
    st.sampled_from([b"get a\n", b"get b\n", b"peek a\n", b"version\n", b"status\n",
                     b"confirm a 1\n", b"flush b\n", b"bogus\n", b"\n", b"get a x\r\n"]),
)


def _replies(chunks: list[bytes]) -> bytes:
    """Everything a fresh server answers to C{chunks} sent one after the other."""
    return replies_to(TextFactory, chunks)


@given(st.lists(_command_lines, max_size=12), st.data())
def test_chunking_is_invisible(lines, data) -> None:
    """The replies do not depend on how the request bytes are split into chunks."""
    stream = b"".join(lines)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    assert _replies(chunks) == _replies([stream])


# Fsyncs in the (here manual) thread pool: the test decides when they end.
DURABLE = "journal_fsync: thread\ndefault: {sync_journal: always, durable_acks: true}\n"


def test_put_expiry_is_relative_ms(client, clock) -> None:
    """C{put q 100:} items vanish 100 ms later."""
    assert client.send(b"put q 100:\nx\n\nput q 1000:\ny\n\n") == b"+1\n+1\n"
    clock.advance(0.2)
    assert client.send(b"get q\n") == b":y\n"


def test_put_continues_after_a_refused_item(clock, tmp_path) -> None:
    """A refused item is skipped and the items after it are still stored."""
    client = Client(make_server(clock, tmp_path, "queues: {small: {max_item_size: 3}}\n"))
    assert client.send(b"put small:\nabc\nabcd\nxyz\n\n") == b"+2\n"
    assert client.send(b"get small\nget small\nget small\n") == b":abc\n:xyz\n*\n"


def test_put_reply_waits_for_the_fsync_with_durable_acks(clock, tmp_path) -> None:
    """With durable_acks the C{+n} reply (and later lines) wait for the covering fsync."""
    thread = ManualThread()
    client = Client(make_server(clock, tmp_path, DURABLE, run_in_thread=thread))
    assert client.send(b"put q:\na\nb\n\nversion\n") == b""
    assert thread.jobs
    thread.run_all()
    assert client.take().startswith(b"+2\n:")


def test_put_reply_waits_for_the_end_of_the_reactor_turn(clock, tmp_path) -> None:
    """With the reactor-turn fsync the C{+n} reply waits for the turn's end, then comes."""
    thread = ManualThread()
    yaml = "default: {sync_journal: always, durable_acks: true}\n"
    client = Client(make_server(clock, tmp_path, yaml, run_in_thread=thread))
    assert client.send(b"put q:\na\nb\n\nversion\n") == b""
    clock.advance(0)
    assert not thread.jobs
    assert client.take().startswith(b"+2\n:")


def test_bad_queue_names_get_an_error_line(client) -> None:
    """An illegal queue name gets a C{-} line and the connection stays usable."""
    reply = client.send(b"put a/b:\nx\n\n")
    assert reply.startswith(b"-Queue name contains illegal characters")
    assert client.send(b"get ../x\n").startswith(b"-Queue name contains illegal characters")
    assert client.send(b"version\n").startswith(b":")


def test_reload_replies_plus_zero_or_the_problem(clock, tmp_path) -> None:
    """reload rereads the config file: C{+0}, or C{-<problem>} when the file is broken."""
    config_file = tmp_path / "kestrel.yaml"
    config_file.write_text("max_open_transactions: 100\n")
    client = Client(make_server(clock, tmp_path, config_path=config_file))
    assert client.send(b"reload\n") == b"+0\n"
    config_file.write_text("no_such_key: 1\n")
    reply = client.send(b"reload\n")
    assert reply.startswith(b"-") and b"no_such_key" in reply and reply.count(b"\n") == 1
    assert client.connected


def test_shutdown_replies_then_asks_the_server_to_stop(server, client) -> None:
    """shutdown answers C{+0} and asks the server to stop."""
    calls: list[int] = []
    server.shutdown_callback = lambda: calls.append(1)
    assert client.send(b"shutdown\n") == b"+0\n"
    assert calls == [1]


def test_byte_counters(server, client) -> None:
    """bytes_read and bytes_written count the text connection's traffic."""
    before = (server.stats.bytes_read, server.stats.bytes_written)
    client.send(b"get q\n")
    assert (server.stats.bytes_read - before[0], server.stats.bytes_written - before[1]) == (6, 2)


def test_disconnect_all_aborts_open_reads(server) -> None:
    """The factory's disconnect_all ends every session, returning open reads to the queue."""
    factory = TextFactory(server)
    a = Client.__new__(Client)
    a.protocol = factory.buildProtocol(None)
    a.transport = StringTransportWithDisconnection()
    a.transport.protocol = a.protocol
    a.protocol.makeConnection(a.transport)
    assert a.send(b"put q:\nx\n\nget q\n") == b"+1\n:x\n"
    factory.disconnect_all()
    assert factory.connections == set()
    assert Client(server).send(b"get q\n") == b":x\n"


def test_status_writeavoid_and_grace_period_rejection(clock, tmp_path) -> None:
    """writeavoid reads back as C{:WRITEAVOID}; a change refused during a grace period says why."""
    client = Client(make_server(clock, tmp_path, status_change_grace_period=10.0))
    assert client.send(b"status readonly\n") == b"+0\n"
    reply = client.send(b"status quiescent\n")
    assert reply.startswith(b"-Status change to Quiescent rejected")
    clock.advance(10)
    assert client.send(b"status writeavoid\nstatus\n") == b"+0\n:WRITEAVOID\n"
    assert client.send(b"status up\nstatus\n") == b"+0\n:UP\n"


def test_too_many_open_transactions(clock, tmp_path) -> None:
    """With max_open_transactions 0, get answers the limit error."""
    client = Client(make_server(clock, tmp_path, max_open_transactions=0))
    assert client.send(b"put q:\nx\n\nget q\n") == (
        b"+1\n-Too many open transactions; limit=0\n")


def test_half_close_ends_pending_get_then_closes(client, clock) -> None:
    """After the client half-closes, a waiting get ends at once with C{*}, then the close."""
    assert client.send(b"version\nget q 300\n").startswith(b":")
    client.protocol.readConnectionLost()
    assert client.take() == b"*\n"
    assert not client.connected
    assert client.protocol.server.collection.queue("q").waiter_count == 0


def test_half_close_when_idle_closes_at_once(client) -> None:
    """A half-close with nothing pending closes the connection."""
    client.protocol.readConnectionLost()
    assert not client.connected


def test_monitor_stops_at_the_open_read_limit(clock, tmp_path) -> None:
    """monitor ends with C{*} as soon as the connection holds max_open_transactions reads."""
    client = Client(make_server(clock, tmp_path, max_open_transactions=2))
    assert client.send(b"put q:\na\nb\nc\n\n") == b"+3\n"
    assert client.send(b"monitor q 60000\n") == b":a\n:b\n*\n"
    assert client.send(b"get q\n") == b":c\n"


def test_put_of_a_line_ending_in_colon_inside_data(client) -> None:
    """Inside a put, a data line ending in C{:} is an item like any other."""
    assert client.send(b"put q:\nkey:\n\n") == b"+1\n"
    assert client.send(b"get q\n") == b":key:\n"


def test_put_does_not_count_items_whose_fsync_failed(clock, tmp_path) -> None:
    """With durable_acks, items whose fsync failed are not acknowledged: C{+0}."""
    thread = ManualThread()
    client = Client(make_server(clock, tmp_path, DURABLE, run_in_thread=thread))
    assert client.send(b"put q:\na\n\n") == b""
    thread.fail_all(OSError(5, "Input/output error"))
    assert client.take() == b"+0\n"
    assert client.connected


def test_waiting_get_keeps_reading_and_a_reset_ends_it(client, clock) -> None:
    """While a get waits the transport keeps reading (a close is seen); a reset drops the waiter."""
    client.send(b"get q 60000\n")
    assert client.transport.producerState != "paused"
    queue = client.protocol.server.collection.queue("q")
    assert queue.waiter_count == 1
    client.protocol.connectionLost(None)
    assert queue.waiter_count == 0
    assert queue.add(b"x").result is True and queue.length == 1
