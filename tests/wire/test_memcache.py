"""
Memcache protocol against a real server process, with real clients.

python-memcached drives the reliable-read options, pymemcache the plain
memcache commands (noreply included), raw sockets everything else. One
server serves the whole module; each test uses its own queue names. Bad
input is covered in test_memcache_bad_input.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from pymemcache.client.base import Client as PyMemcacheClient

from tests.clients.shadowed import python_memcached as memcache
from tests.wire.conftest import KestrelProcess, LineClient


@pytest.fixture(scope="module")
def server(kestrel_factory: Callable[..., KestrelProcess]) -> KestrelProcess:
    """One server for the module: memcache only, 10 open reads, an alias."""
    return kestrel_factory(config={
        "max_open_transactions": 10,
        "aliases": {"both": ["dest_a", "dest_b"]},
    })


@pytest.fixture
def raw(server: KestrelProcess) -> Iterator[LineClient]:
    """A raw-socket client of the memcache port."""
    client = LineClient(server.connect())
    yield client
    client.close()


def new_raw(server: KestrelProcess) -> LineClient:
    """A raw-socket client of the memcache port (closed by the caller)."""
    return LineClient(server.connect())


def get_value(client: LineClient, request: bytes) -> bytes | None:
    """Send a get, return the item's data or None for END."""
    client.send(request)
    line = client.line()
    if line == b"END\r\n":
        return None
    assert line.startswith(b"VALUE "), line
    length = int(line.split()[3])
    data = client.exactly(length + 2)[:-2]
    assert client.line() == b"END\r\n"
    return data


# -- real clients ------------------------------------------------------------

def test_python_memcached_reliable_reads(server: KestrelProcess) -> None:
    """python-memcached: /open, /close, /abort, /peek and /t= behave as Kestrel's."""
    mc = memcache.Client([server.address()])
    try:
        assert mc.set("pm_q", "one")
        assert mc.set("pm_q", "two")
        assert mc.get("pm_q/peek") == b"one"
        assert mc.get("pm_q/open") == b"one"
        assert mc.get("pm_q/abort") is None
        assert mc.get("pm_q/open") == b"one"
        assert mc.get("pm_q/close/open") == b"two"
        assert mc.get("pm_q/close") is None
        started = time.monotonic()
        assert mc.get("pm_q/t=300") is None
        assert time.monotonic() - started >= 0.25
    finally:
        mc.disconnect_all()


def test_pymemcache_plain_commands(server: KestrelProcess) -> None:
    """pymemcache: set (noreply by default), get, delete and stats."""
    client = PyMemcacheClient(("127.0.0.1", server.memcache_port), default_noreply=True)
    try:
        client.set("py_q", b"hello")
        client.set("py_q", b"world", noreply=False)
        assert client.get("py_q") == b"hello"
        assert client.get("py_q") == b"world"
        assert client.get("py_q") is None
        stats = client.stats()
        # pymemcache keys its stats dict by the bytes on the wire; the value is converted to int.
        assert stats[b"queue_py_q_total_items"] == 2
        client.delete("py_q", noreply=False)
        client.set("py_q", b"again")
        assert client.get("py_q") == b"again"
    finally:
        client.close()


# -- raw sockets ---------------------------------------------------------------

def test_reliable_read_survives_disconnect(server: KestrelProcess) -> None:
    """An open read of a connection that drops goes back to the head of the queue."""
    a = new_raw(server)
    a.send(b"set rr 0 0 1\r\nx\r\nset rr 0 0 1\r\ny\r\n")
    assert a.line() == a.line() == b"STORED\r\n"
    assert get_value(a, b"get rr/open\r\n") == b"x"
    a.close()
    b = new_raw(server)
    deadline = time.monotonic() + 15
    value = None
    while value is None and time.monotonic() < deadline:
        value = get_value(b, b"get rr/t=200\r\n")
    assert value == b"x"
    assert get_value(b, b"get rr\r\n") == b"y"
    b.close()


def test_fanout(raw: LineClient) -> None:
    """Once `fo+child` exists, every set to `fo` reaches it too."""
    assert get_value(raw, b"get fo+child\r\n") is None
    raw.send(b"set fo 0 0 3\r\nabc\r\n")
    assert raw.line() == b"STORED\r\n"
    assert get_value(raw, b"get fo\r\n") == b"abc"
    assert get_value(raw, b"get fo+child\r\n") == b"abc"


def test_alias(raw: LineClient) -> None:
    """A set on an alias reaches every destination; a get on it reads as empty."""
    raw.send(b"set both 0 0 2\r\nhi\r\n")
    assert raw.line() == b"STORED\r\n"
    assert get_value(raw, b"get both\r\n") is None
    assert get_value(raw, b"get dest_a\r\n") == b"hi"
    assert get_value(raw, b"get dest_b\r\n") == b"hi"


def test_expiry(raw: LineClient) -> None:
    """An item set with exptime 1 is not delivered after a second."""
    raw.send(b"set exp 0 1 1\r\na\r\nset exp 0 0 1\r\nb\r\n")
    assert raw.line() == raw.line() == b"STORED\r\n"
    time.sleep(1.2)
    assert get_value(raw, b"get exp\r\n") == b"b"


def test_monitor_and_confirm(raw: LineClient) -> None:
    """monitor streams open items and END; confirm closes them; too many is ERROR."""
    for word in (b"state shirt", b"homunculus", b"automaton"):
        raw.send(b"set mon 0 0 %d\r\n%s\r\n" % (len(word), word))
        assert raw.line() == b"STORED\r\n"
    raw.send(b"monitor mon 1 3\r\n")
    expected = (b"VALUE mon 0 11\r\nstate shirt\r\nEND\r\nVALUE mon 0 10\r\nhomunculus\r\n"
                b"END\r\nVALUE mon 0 9\r\nautomaton\r\nEND\r\nEND\r\n")
    assert raw.exactly(len(expected)) == expected
    raw.send(b"confirm mon 4\r\nconfirm mon 3\r\nget mon\r\n")
    assert raw.line() == b"ERROR\r\n"
    assert raw.line() == b"END\r\n"
    assert raw.line() == b"END\r\n"


def test_status_changes(server: KestrelProcess) -> None:
    """readonly blocks writes with SERVER_ERROR; quiescent blocks reads; up restores; kept open."""
    a = new_raw(server)
    a.send(b"status readonly\r\nstatus\r\n")
    assert a.line() == b"END\r\n"
    assert a.line() == b"READONLY\r\n"
    a.send(b"set st 0 0 1\r\nx\r\nversion\r\n")
    assert a.line() == b"SERVER_ERROR Server not available for operation setItem\r\n"
    assert a.line().startswith(b"VERSION ")
    b = new_raw(server)
    b.send(b"status quiescent\r\nget st\r\nversion\r\n")
    assert b.line() == b"END\r\n"
    assert b.line() == b"SERVER_ERROR Server not available for operation getItem\r\n"
    assert b.line().startswith(b"VERSION ")
    c = new_raw(server)
    c.send(b"status up\r\nstatus\r\nset st 0 0 1\r\nx\r\n")
    assert c.line() == b"END\r\n"
    assert c.line() == b"UP\r\n"
    assert c.line() == b"STORED\r\n"
    for client in (a, b, c):
        client.close()


def test_stats_and_dump_stats(raw: LineClient) -> None:
    """STATS starts with uptime and ends with END; DUMP_STATS prints a queue block."""
    raw.send(b"set sq 0 0 2\r\nab\r\nstats\r\n")
    assert raw.line() == b"STORED\r\n"
    stats = raw.until(b"END\r\n")
    assert stats.startswith(b"STAT uptime ")
    assert b"\r\nSTAT queue_sq_items 1\r\n" in stats
    raw.send(b"dump_stats sq\r\n")
    dump = raw.until(b"END\r\n")
    assert dump.startswith(b"queue 'sq' {\r\n  items=1\r\n  bytes=2\r\n")
    assert dump.endswith(b"\r\n}\r\nEND\r\n")


def test_version_and_pipelining(raw: LineClient) -> None:
    """Pipelined requests are answered in order; the version's major number is at least 1."""
    raw.send(b"version\r\nset pl 0 0 1\r\na\r\nget pl\r\nget pl\r\n")
    version = raw.line()
    assert version.startswith(b"VERSION ") and version.endswith(b"\r\n")
    major, minor, patch = version[8:-2].split(b".")
    assert int(major) >= 1 and minor.isdigit() and patch.isdigit()
    assert raw.line() == b"STORED\r\n"
    assert raw.until(b"END\r\n") == b"VALUE pl 0 1\r\na\r\nEND\r\n"
    assert raw.line() == b"END\r\n"


def test_value_line_echoes_the_key_and_flush_all_is_ok(raw: LineClient) -> None:
    """VALUE names the key exactly as sent, options included; gets too; flush_all is OK."""
    raw.send(b"set ek 0 0 1\r\na\r\nset ek 0 0 1\r\nb\r\nset ek 0 0 1\r\nc\r\n"
             b"get ek/t=500/open\r\ngets ek/close/open\r\nget ek/abort\r\nget ek/peek\r\n"
             b"get ek\r\nflush_all\r\nget ek\r\n")
    assert raw.line() == raw.line() == raw.line() == b"STORED\r\n"
    assert raw.until(b"END\r\n") == b"VALUE ek/t=500/open 0 1\r\na\r\nEND\r\n"
    assert raw.until(b"END\r\n") == b"VALUE ek/close/open 0 1\r\nb\r\nEND\r\n"
    assert raw.line() == b"END\r\n"
    assert raw.until(b"END\r\n") == b"VALUE ek/peek 0 1\r\nb\r\nEND\r\n"
    assert raw.until(b"END\r\n") == b"VALUE ek 0 1\r\nb\r\nEND\r\n"
    assert raw.line() == b"OK\r\n"
    assert raw.line() == b"END\r\n"


def test_half_close_gets_replies(server: KestrelProcess) -> None:
    """Requests followed by EOF (as `nc` sends them) are all answered before the close."""
    import socket

    sock = server.connect()
    sock.sendall(b"set hc 0 0 5\r\nhello\r\nget hc\r\nget hc\r\nversion\r\n")
    sock.shutdown(socket.SHUT_WR)
    client = LineClient(sock)
    assert client.until(b"VERSION ").startswith(
        b"STORED\r\nVALUE hc 0 5\r\nhello\r\nEND\r\nEND\r\nVERSION ")
    client.line()
    assert client.closed()
    client.close()
