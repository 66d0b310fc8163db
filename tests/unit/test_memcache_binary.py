"""
Byte-exact tests of memcache's binary protocol over StringTransport and a
Clock, on a real server (queues and journals in a temporary folder).
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock

from kestrel.protocols.memcache import MemcacheFactory
from kestrel.server import KestrelServer
from tests.support import StringClient as Conn
from tests.support import make_server, replies_to

_HEADER = struct.Struct(">BBHBBHIIQ")
GET, SET, DELETE, QUIT, FLUSH, GETQ, NOOP, VERSION, GETK, GETKQ, STAT, SETQ = (
    0x00, 0x01, 0x04, 0x07, 0x08, 0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x10, 0x11)


def request(opcode: int, key: bytes = b"", value: bytes = b"", extras: bytes = b"",
            opaque: int = 0) -> bytes:
    """One binary request packet."""
    body = len(extras) + len(key) + len(value)
    return _HEADER.pack(0x80, opcode, len(key), len(extras), 0, 0, body, opaque, 0) + (
        extras + key + value)


def set_request(key: bytes, value: bytes, exptime: int = 0, opcode: int = SET,
                opaque: int = 0) -> bytes:
    """A Set (or SetQ) with flags 0 and C{exptime}."""
    return request(opcode, key, value, struct.pack(">II", 0, exptime), opaque)


def response(opcode: int, status: int = 0, value: bytes = b"", key: bytes = b"",
             extras: bytes = b"", opaque: int = 0) -> bytes:
    """The response packet the server should send."""
    body = len(extras) + len(key) + len(value)
    return _HEADER.pack(0x81, opcode, len(key), len(extras), 0, status, body, opaque, 0) + (
        extras + key + value)


def split(stream: bytes) -> list[tuple[int, int, bytes, bytes]]:
    """Response packets as (opcode, status, key, value)."""
    out = []
    pos = 0
    while pos < len(stream):
        _, opcode, klen, elen, _, status, body, _, _ = _HEADER.unpack(stream[pos:pos + 24])
        payload = stream[pos + 24:pos + 24 + body]
        out.append((opcode, status, payload[elen:elen + klen], payload[elen + klen:]))
        pos += 24 + body
    return out


FLAGS = b"\0\0\0\0"


def test_set_then_get(conn: Conn) -> None:
    """Set enqueues; Get dequeues (flags 0 in the extras); an empty queue is 0x0001."""
    assert conn.send(set_request(b"q", b"hello", opaque=7)) == response(SET, opaque=7)
    assert conn.send(request(GET, b"q", opaque=8)) == response(GET, value=b"hello",
                                                               extras=FLAGS, opaque=8)
    assert conn.send(request(GET, b"q")) == response(GET, 0x0001, b"Not found")
    assert conn.connected


def test_quiet_and_keyed_forms(conn: Conn) -> None:
    """SetQ is silent on success, GetQ/GetKQ on a miss; GetK returns the key; Noop ends it."""
    stream = (set_request(b"q", b"a", opcode=SETQ) + set_request(b"q", b"b", opcode=SETQ)
              + request(GETQ, b"q") + request(GETKQ, b"q") + request(GETKQ, b"q")
              + request(GETK, b"q") + request(NOOP, opaque=3))
    assert conn.send(stream) == (
        response(GETQ, value=b"a", extras=FLAGS) + response(GETKQ, value=b"b", key=b"q",
                                                            extras=FLAGS)
        + response(GETK, 0x0001, b"Not found", key=b"q") + response(NOOP, opaque=3))


def test_key_options(conn: Conn, factory: MemcacheFactory, clock: Clock) -> None:
    """Key options work as in get: /open, /close, /abort, /peek, /t=."""
    conn.send(set_request(b"q", b"a") + set_request(b"q", b"b"))
    assert split(conn.send(request(GET, b"q/open")))[0][3] == b"a"
    assert split(conn.send(request(GET, b"q")))[0][:2] == (GET, 0x0004)
    assert split(conn.send(request(GET, b"q/close/open")))[0][3] == b"b"
    assert split(conn.send(request(GET, b"q/abort"))) == [(GET, 1, b"", b"Not found")]
    assert split(conn.send(request(GET, b"q/peek")))[0][3] == b"b"
    assert split(conn.send(request(GET, b"q/peek/open")))[0][1] == 0x0004
    assert split(conn.send(request(GET, b"q/close/open")))[0][3] == b"b"
    assert conn.send(request(GET, b"q/close/open/t=500")) == b""
    clock.advance(0.1)
    Conn(factory).send(b"set q 0 0 1\r\nc\r\n")
    assert split(conn.take()) == [(GET, 0, b"", b"c")]


def test_delete_flush_version_stat(conn: Conn, server: KestrelServer) -> None:
    """Delete drops the queue, Flush empties every queue, Version and Stat answer."""
    conn.send(set_request(b"q", b"a") + set_request(b"r", b"b"))
    assert conn.send(request(DELETE, b"q")) == response(DELETE)
    assert server.collection.queue("q", create=False) is None
    assert conn.send(request(FLUSH)) == response(FLUSH)
    assert conn.send(request(GET, b"r")) == response(GET, 1, b"Not found")
    assert conn.send(request(VERSION)) == response(VERSION, value=b"1.1.0")
    stats = split(conn.send(request(STAT)))
    assert stats[-1] == (STAT, 0, b"", b"")
    assert (STAT, 0, b"version", b"1.1.0") in stats
    assert split(conn.send(request(STAT, b"items"))) == [(STAT, 1, b"", b"Not found")]


def test_unknown_opcode_keeps_the_connection(conn: Conn) -> None:
    """Another opcode (Add, with its body) is 0x0081; the next request is served."""
    add = request(0x02, b"q", b"flush_all", struct.pack(">II", 0, 0), opaque=5)
    assert conn.send(add + request(NOOP)) == (
        response(0x02, 0x0081, b"Unknown command", opaque=5) + response(NOOP))
    assert conn.connected


def test_bad_arguments_keep_the_connection(conn: Conn) -> None:
    """A Set without extras, a Get without key or a bad name: 0x0004, connection kept."""
    stream = (request(SET, b"q", b"v") + request(GET) + request(GET, b"a.b")
              + request(GET, b"a\tb") + request(NOOP))
    replies = split(conn.send(stream))
    assert [r[:2] for r in replies] == [(SET, 4), (GET, 4), (GET, 4), (GET, 4), (NOOP, 0)]
    assert b"illegal characters" in replies[2][3]
    assert b"control character" in replies[3][3]


def test_quit_answers_then_closes(conn: Conn) -> None:
    """Quit is answered, then the connection closes; nothing after it is served."""
    assert conn.send(request(QUIT) + request(NOOP)) == response(QUIT)
    assert not conn.connected


@pytest.mark.parametrize("packet, status", [
    (b"\x81" + bytes(23), 0x0004),  # a response magic in a request
    (_HEADER.pack(0x80, GET, 10, 0, 0, 0, 4, 0, 0) + b"abcd", 0x0004),  # key past the body
    (_HEADER.pack(0x80, SET, 1, 8, 0, 0, 2**31, 0, 0), 0x0003),  # over max_request_size
])
def test_unframable_packets_close(conn: Conn, packet: bytes, status: int) -> None:
    """A packet that cannot be framed gets one error response, then the connection closes."""
    first = request(NOOP)
    replies = split(conn.send(first + packet + request(NOOP)))
    assert [r[:2] for r in replies] == [(NOOP, 0), (packet[1], status)]
    assert not conn.connected


def test_text_after_binary_closes(conn: Conn) -> None:
    """The first byte chose binary: a text line later cannot be framed."""
    reply = conn.send(request(NOOP) + b"flush_all\r\n" + bytes(13))
    assert split(reply)[0] == (NOOP, 0, b"", b"")
    assert split(reply)[1][1] == 0x0004
    assert not conn.connected


def test_value_is_never_a_request(conn: Conn) -> None:
    """A Set whose value is a whole binary Flush stores it; nothing is flushed."""
    inner = request(FLUSH)
    assert conn.send(set_request(b"x", b"keep") + set_request(b"y", inner)) == (
        response(SET) + response(SET))
    assert split(conn.send(request(GET, b"y") + request(GET, b"x"))) == [
        (GET, 0, b"", inner), (GET, 0, b"", b"keep")]


_PACKETS = [set_request(b"q", b"abc"), request(GET, b"q"), request(GETQ, b"q"),
            request(GETK, b"q/open"), request(GET, b"q/close"), request(NOOP),
            request(VERSION), set_request(b"r", b"", opcode=SETQ), request(DELETE, b"r"),
            request(0x05, b"q", extras=bytes(20))]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(_PACKETS), min_size=1, max_size=10), st.data())
def test_binary_chunking_is_invisible(packets: list[bytes], data: st.DataObject) -> None:
    """However binary packets are split across reads, the replies are the same."""
    stream = b"".join(packets)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    assert replies_to(MemcacheFactory, pieces) == replies_to(MemcacheFactory, [stream])


def test_refusals_keep_the_connection(factory: MemcacheFactory, server: KestrelServer) -> None:
    """A read-only server refuses Set (0x0086); too many open reads is 0x0085."""
    text = Conn(factory)
    assert text.send(b"set q 0 0 1\r\na\r\nset q 0 0 1\r\nb\r\n") == b"STORED\r\nSTORED\r\n"
    conn = Conn(factory)
    assert split(conn.send(request(GET, b"q/open")))[0][3] == b"a"
    replies = split(conn.send(request(GET, b"q/open")))
    assert replies == [(GET, 0x0085, b"", b"too many open reads")]
    assert text.send(b"status readonly\r\n") == b"END\r\n"
    replies = split(conn.send(set_request(b"q", b"c") + request(NOOP)))
    assert replies == [(SET, 0x0086, b"", b"Server not available for operation setItem"),
                       (NOOP, 0, b"", b"")]
    assert conn.connected


def test_flush_is_a_control_command(clock: Clock, tmp_path: Path) -> None:
    """With control kept to the admin port, Flush is 0x0083 and flushes nothing."""
    server = make_server(clock, tmp_path, control_commands="admin_only")
    try:
        conn = Conn(MemcacheFactory(server))
        conn.send(set_request(b"q", b"a"))
        [(opcode, status, _, message)] = split(conn.send(request(FLUSH)))
        assert (opcode, status) == (FLUSH, 0x0083) and b"admin port" in message
        assert split(conn.send(request(GET, b"q")))[0][3] == b"a"
    finally:
        server.collection.stopService()
