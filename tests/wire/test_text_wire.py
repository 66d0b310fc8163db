"""
The text protocol (port 2222) against a real server process, over raw sockets.

Covers every command and every error line of docs/protocols.md.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.wire.conftest import KestrelProcess, LineClient

CONFIG = {
    "max_open_transactions": 100,
    "queues": {"small": {"max_item_size": 3}},
    "aliases": {"both": ["alias_a", "alias_b"]},
}


@pytest.fixture(scope="module")
def server(kestrel_factory: Callable[..., KestrelProcess]) -> KestrelProcess:
    """One real server process (text port only) shared by this module's tests."""
    return kestrel_factory(protocols=("text",), config=CONFIG)


@pytest.fixture
def connect(server: KestrelProcess) -> Iterator[Callable[[], LineClient]]:
    """Make text connections to the server; all are closed after the test."""
    clients: list[LineClient] = []

    def make() -> LineClient:
        client = LineClient(server.connect("text"))
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def client(connect: Callable[[], LineClient]) -> LineClient:
    """One text connection."""
    return connect()


def ask(client: LineClient, request: bytes, lines: int = 1) -> bytes:
    """Send C{request}; return the next C{lines} reply lines."""
    client.send(request)
    return b"".join(client.line() for _ in range(lines))


def test_put_get_round_trip(client: LineClient) -> None:
    """put stores each data line; get returns them in order, then C{*}."""
    assert ask(client, b"put rt:\nfirst\nsecond\n\n") == b"+2\n"
    assert ask(client, b"get rt\n") == b":first\n"
    assert ask(client, b"get rt\n") == b":second\n"
    assert ask(client, b"get rt\n") == b"*\n"


def test_binary_bytes_and_crlf(client: LineClient) -> None:
    """Bytes 0x80-0xFF travel unchanged; CRLF line ends are accepted."""
    assert ask(client, b"put bin:\r\n\xe9\xff\x80\r\n\r\n") == b"+1\n"
    assert ask(client, b"get bin\r\n") == b":\xe9\xff\x80\n"


def test_put_refused_item_is_skipped(client: LineClient) -> None:
    """An item over the queue's max_item_size is refused; the others are stored."""
    assert ask(client, b"put small:\nabc\ntoolong\nxyz\n\n") == b"+2\n"
    assert ask(client, b"get small\nget small\nget small\n", 3) == b":abc\n:xyz\n*\n"


def test_put_to_alias_reaches_every_destination(client: LineClient) -> None:
    """A put to an alias stores the item in each destination queue."""
    assert ask(client, b"put both:\nx\n\n") == b"+1\n"
    assert ask(client, b"get alias_a\nget alias_b\nget both\n", 3) == b":x\n:x\n*\n"


def test_get_waits_for_an_item(connect: Callable[[], LineClient]) -> None:
    """get with a timeout answers as soon as another connection puts an item."""
    waiting, writer = connect(), connect()
    waiting.send(b"get wait 5000\n")
    time.sleep(0.2)
    assert ask(writer, b"put wait:\nhere\n\n") == b"+1\n"
    assert waiting.line() == b":here\n"


def test_get_timeout_expires(client: LineClient) -> None:
    """get with a timeout on an empty queue answers C{*} after about that long."""
    start = time.monotonic()
    assert ask(client, b"get empty 300\n") == b"*\n"
    assert 0.25 <= time.monotonic() - start < 3


def test_open_read_is_aborted_on_disconnect(connect: Callable[[], LineClient]) -> None:
    """The item of an unconfirmed get returns to the queue when the connection drops."""
    first = connect()
    assert ask(first, b"put tx:\nkeep\n\nget tx\n", 2) == b"+1\n:keep\n"
    first.close()
    second = connect()
    for _ in range(50):
        reply = ask(second, b"peek tx\n")
        if reply != b"*\n":
            break
        time.sleep(0.05)
    assert reply == b":keep\n"
    assert ask(second, b"get tx\nget tx\n", 2) == b":keep\n*\n"


def test_peek_monitor_confirm(client: LineClient) -> None:
    """peek leaves the item; monitor streams open reads and ends with C{*}; confirm acks them."""
    assert ask(client, b"put mon:\na\nb\n\n") == b"+2\n"
    assert ask(client, b"peek mon\n") == b":a\n"
    assert ask(client, b"monitor mon 200\n", 3) == b":a\n:b\n*\n"
    assert ask(client, b"confirm mon 3\n") == b"-Not that many transactions open.\n"
    assert ask(client, b"confirm mon 2\n") == b"+2\n"
    assert ask(client, b"peek mon\n") == b"*\n"


def test_flush_delete_flush_all(client: LineClient) -> None:
    """flush, delete and flush_all answer C{+0}."""
    assert ask(client, b"put f1:\nx\n\nput f2:\ny\n\n", 2) == b"+1\n+1\n"
    assert ask(client, b"flush f1\ndelete f2\n", 2) == b"+0\n+0\n"
    assert ask(client, b"get f1\nget f2\n", 2) == b"*\n*\n"
    assert ask(client, b"put f3:\nz\n\nflush_all\nget f3\n", 3) == b"+1\n+0\n*\n"


def test_version(client: LineClient) -> None:
    """version answers C{:<version>}."""
    reply = ask(client, b"version\n")
    assert reply.startswith(b":") and reply.endswith(b"\n") and len(reply) > 3


def test_every_error_line(client: LineClient) -> None:
    """Each malformed request gets its own error line and the connection stays usable."""
    cases = [
        (b"put:\nx\n\n", b"-Queue name required.\n"),
        (b"put q nope:\nx\n\n", b"-Error parsing expiration time.\n"),
        (b"get\n", b"-Queue name required.\n"),
        (b"get q soon\n", b"-Error parsing timeout.\n"),
        (b"peek\n", b"-Queue name required.\n"),
        (b"peek q 1.5\n", b"-Error parsing timeout.\n"),
        (b"monitor q\n", b"-Queue name & timeout required.\n"),
        (b"monitor q x\n", b"-Error parsing timeout.\n"),
        (b"confirm q\n", b"-Queue name & count required.\n"),
        (b"confirm q many\n", b"-Error parsing count.\n"),
        (b"confirm q 1\n", b"-Not that many transactions open.\n"),
        (b"flush\n", b"-Queue name required.\n"),
        (b"delete\n", b"-Queue name required.\n"),
        (b"status sideways\n", b"-Unknown status.\n"),
        (b"status down\n", b"-Status forbidden.\n"),
        (b"FROB q\n", b"-Unknown command: frob\n"),
        (b"\n", b"-Unknown command: \n"),
    ]
    for request, reply in cases:
        assert ask(client, request) == reply, request
    bad_name = ask(client, b"put a/b:\nx\n\n")
    assert bad_name.startswith(b"-Queue name contains illegal characters")
    assert ask(client, b"get ok\n") == b"*\n"


def test_status_blocks_writes_then_reads(client: LineClient) -> None:
    """readonly refuses writes, quiescent refuses reads too; up restores both."""
    try:
        assert ask(client, b"status\n") == b":UP\n"
        assert ask(client, b"status readonly\nstatus\n", 2) == b"+0\n:READONLY\n"
        assert ask(client, b"put st:\nx\n\n") == b"-Server not available for operation setItem\n"
        assert ask(client, b"flush st\n") == b"-Server not available for operation flush\n"
        assert ask(client, b"delete st\n") == b"-Server not available for operation delete\n"
        assert ask(client, b"flush_all\n") == b"-Server not available for operation flushAll\n"
        assert ask(client, b"status quiescent\n") == b"+0\n"
        assert ask(client, b"get st\n") == b"-Server not available for operation getItem\n"
        assert ask(client, b"peek st\n") == b"-Server not available for operation getItem\n"
        assert (ask(client, b"monitor st 10\n")
                == b"-Server not available for operation monitorUntil\n")
    finally:
        assert ask(client, b"status up\n") == b"+0\n"


def test_reload(server: KestrelProcess, client: LineClient) -> None:
    """reload answers C{+0}; with a broken config file, C{-<problem>} and the old config stays."""
    assert ask(client, b"reload\n") == b"+0\n"
    try:
        server.write_config({**CONFIG, "no_such_setting": 1})
        reply = ask(client, b"reload\n")
        assert reply.startswith(b"-") and b"no_such_setting" in reply
    finally:
        server.write_config(CONFIG)
    assert ask(client, b"reload\n") == b"+0\n"
    assert ask(client, b"put small:\ntoolong\n\n") == b"+0\n"


def test_half_closed_client_gets_its_replies(server: KestrelProcess) -> None:
    """A client that shuts down its sending side (nc -N) still gets every reply."""
    sock = server.connect("text")
    sock.sendall(b"put hc:\nx\n\nget hc\nget hc 200\n")
    sock.shutdown(socket.SHUT_WR)
    client = LineClient(sock)
    assert client.until(b"*\n") == b"+1\n:x\n*\n"
    assert client.closed()
    client.close()


def test_quit_closes(client: LineClient) -> None:
    """quit closes the connection without a reply."""
    client.send(b"quit\n")
    assert client.closed()


def test_line_over_max_request_size(kestrel_factory: Callable[..., KestrelProcess]) -> None:
    """A line over max_request_size gets an error line, then the connection closes."""
    small = kestrel_factory(protocols=("text",), config={"max_request_size": 1024})
    client = LineClient(small.connect("text"))
    assert ask(client, b"put big:\n" + b"x" * 1000 + b"\n\n") == b"+1\n"
    assert ask(client, b"put big:\n" + b"x" * 1025 + b"\n\n") == (
        b"-Line too long (limit 1024 bytes).\n")
    assert client.closed()
    other = LineClient(small.connect("text"))
    assert ask(other, b"get big\n") == b":" + b"x" * 1000 + b"\n"
    client.close()
    other.close()


def test_shutdown(kestrel_factory: Callable[..., KestrelProcess]) -> None:
    """shutdown answers C{+0} and the server exits cleanly (status 0), keeping its items."""
    doomed: Any = kestrel_factory(protocols=("text",))
    client = LineClient(doomed.connect("text"))
    assert ask(client, b"put keep:\nsafe\n\n") == b"+1\n"
    assert ask(client, b"shutdown\n") == b"+0\n"
    assert doomed.wait_exit() == 0
    client.close()
    doomed.start()
    client = LineClient(doomed.connect("text"))
    assert ask(client, b"get keep\n") == b":safe\n"
    client.close()
