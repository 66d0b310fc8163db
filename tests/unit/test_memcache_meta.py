"""
Byte-exact tests of the meta commands (ms, mg, md, mn, ma, me) over
StringTransport and a Clock, on a real server (queues and journals in a
temporary folder).
"""

from __future__ import annotations

import base64

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock

from kestrel.protocols.memcache import MemcacheFactory
from kestrel.protocols.meta import MetaGet, MetaSet, parse_meta
from kestrel.server import KestrelServer
from tests.support import StringClient as Conn
from tests.support import replies_to


def test_ms_then_mg(conn: Conn) -> None:
    """ms enqueues (HD); mg with v dequeues (VA and the data); an empty queue is EN."""
    assert conn.send(b"ms q 5 T0 F7\r\nhello\r\nms q 2\r\nhi\r\n") == b"HD\r\nHD\r\n"
    assert conn.send(b"mg q v\r\n") == b"VA 5\r\nhello\r\n"
    assert conn.send(b"mg q s v\r\n") == b"VA 2 s2\r\nhi\r\n"
    assert conn.send(b"mg q v\r\n") == b"EN\r\n"


def test_return_flags_in_request_order(conn: Conn, clock: Clock) -> None:
    """mg answers v k f t s O h l c in the order asked; ms answers O k c."""
    assert conn.send(b"ms q 3 T100 Oab k c\r\nabc\r\n") == b"HD Oab kq c0\r\n"
    clock.advance(30)
    assert conn.send(b"mg q k t f s v O12 h l c\r\n") == (
        b"VA 3 kq t70 f0 s3 O12 h0 l30 c0\r\nabc\r\n")
    conn.send(b"ms q 1\r\nx\r\n")
    assert conn.send(b"mg q t v\r\n") == b"VA 1 t-1\r\nx\r\n"


def test_quiet_mode(conn: Conn) -> None:
    """q hides HD of ms and md and EN of mg; mn answers MN after everything before it."""
    assert conn.send(b"ms q 1 q\r\na\r\nmg q v q\r\nmg q v q\r\nmd q q\r\nmn\r\n") == (
        b"VA 1\r\na\r\nMN\r\n")


def test_mg_without_v_takes_nothing(conn: Conn) -> None:
    """Without v no item leaves the queue: HD for an item (the head is looked at), EN for none."""
    assert conn.send(b"mg q\r\n") == b"EN\r\n"
    conn.send(b"ms q 1\r\na\r\n")
    assert conn.send(b"mg q s\r\n") == b"HD s1\r\n"
    assert conn.send(b"mg q v\r\n") == b"VA 1\r\na\r\n"


def test_key_options_as_in_get(conn: Conn) -> None:
    """/open, /close, /abort, /peek work as in get; an open read refuses a plain mg."""
    conn.send(b"ms q 1\r\na\r\nms q 1\r\nb\r\n")
    assert conn.send(b"mg q/open v\r\n") == b"VA 1\r\na\r\n"
    assert conn.send(b"mg q v\r\n") == (
        b"CLIENT_ERROR a read is open on this queue: use /close, /open or /abort\r\n")
    assert conn.send(b"mg q/abort v\r\n") == b"EN\r\n"
    assert conn.send(b"mg q/peek v\r\n") == b"VA 1\r\na\r\n"
    assert conn.send(b"mg q/close/open v\r\n") == b"VA 1\r\na\r\n"
    assert conn.send(b"mg q/close v\r\n") == b"EN\r\n"
    assert conn.send(b"mg q/peek v\r\n") == b"VA 1\r\nb\r\n"
    assert conn.send(b"mg q/open\r\n") == b"CLIENT_ERROR mg with /open needs the v flag\r\n"


def test_mg_timeout_waits(conn: Conn, factory: MemcacheFactory, clock: Clock) -> None:
    """mg q/t=<ms> waits for an item; requests behind it are answered after it."""
    assert conn.send(b"mg q/t=500 v\r\nmn\r\n") == b""
    Conn(factory).send(b"ms q 2\r\nok\r\n")
    assert conn.take() == b"VA 2\r\nok\r\nMN\r\n"
    assert conn.send(b"mg q/t=500 v\r\n") == b""
    clock.advance(0.6)
    assert conn.take() == b"EN\r\n"


def test_base64_keys(conn: Conn) -> None:
    """b: the key is base64; k returns it as sent, with b."""
    key = base64.b64encode(b"queue").decode().encode()
    assert conn.send(b"ms %s 1 b\r\nz\r\n" % key) == b"HD\r\n"
    assert conn.send(b"mg %s b k v\r\n" % key) == b"VA 1 b k%s\r\nz\r\n" % key
    assert conn.send(b"mg queue v\r\n") == b"EN\r\n"
    assert conn.send(b"mg !!! b v\r\n") == b"CLIENT_ERROR error decoding key\r\n"


def test_md_deletes_the_queue(conn: Conn, server: KestrelServer) -> None:
    """md deletes the queue (HD with O and k echoed)."""
    conn.send(b"ms q 1\r\na\r\n")
    assert conn.send(b"md q O9 k\r\n") == b"HD O9 kq\r\n"
    assert server.collection.queue("q", create=False) is None


def test_refused_meta_commands_keep_the_connection(conn: Conn) -> None:
    """ma and me are CLIENT_ERROR naming them; ms modes and CAS are refused after the data."""
    assert conn.send(b"ma q\r\nme q\r\nms q 3 MA\r\nabc\r\nms q 1 C5\r\na\r\nms q 1 Tx\r\na\r\n"
                     b"mg q v\r\n") == (
        b"CLIENT_ERROR ma is not supported by a queue server\r\n"
        b"CLIENT_ERROR me is not supported by a queue server\r\n"
        b"CLIENT_ERROR ms mode A is not supported by a queue server (use MS)\r\n"
        b"CLIENT_ERROR ms compare-and-swap (C) is not supported by a queue server\r\n"
        b"CLIENT_ERROR bad ttl\r\n"
        b"EN\r\n")
    assert conn.connected


def test_ms_that_cannot_be_framed_closes(conn: Conn) -> None:
    """A data length that is missing or not a number cannot be skipped: error, close."""
    assert conn.send(b"ms q x\r\nflush_all\r\n") == b"CLIENT_ERROR bad data length\r\n"
    assert not conn.connected


@pytest.mark.parametrize("line, reply", [
    (b"mg\r\n", b"CLIENT_ERROR bad command line format\r\n"),
    (b"mg q v +x\r\n", b"CLIENT_ERROR invalid flag\r\n"),
    (b"mg a.b v\r\n", b"CLIENT_ERROR bad queue name: Queue name contains illegal characters "
                      b"(one of: ~ . /).\r\n"),
    (b"mg a\x01b v\r\n", b"CLIENT_ERROR bad queue name: Queue name contains a control "
                         b"character ('\\x01').\r\n"),
    (b"md /x\r\n", b"CLIENT_ERROR empty queue name\r\n"),
])
def test_bad_meta_lines_are_answered(conn: Conn, line: bytes, reply: bytes) -> None:
    """A bad meta line that can be framed is answered once; the connection is kept."""
    assert conn.send(line + b"mn\r\n") == reply + b"MN\r\n"


def test_ms_data_is_never_a_request(conn: Conn, server: KestrelServer) -> None:
    """The issue's rows: the data block of ms is stored, never run."""
    assert conn.send(b"ms x 9 T0 F0\r\nflush_all\r\nms x 8 T0 F0\r\nshutdown\r\n"
                     b"ms x 10 T0 F0\r\nget victim\r\n") == b"HD\r\nHD\r\nHD\r\n"
    assert [conn.send(b"mg x v\r\n") for _ in range(3)] == [
        b"VA 9\r\nflush_all\r\n", b"VA 8\r\nshutdown\r\n", b"VA 10\r\nget victim\r\n"]


def test_parse_meta_keeps_flag_order() -> None:
    """The parser keeps the flag letters in request order (return flags follow it)."""
    req = parse_meta(b"mg q  v  k  O1")
    assert isinstance(req, MetaGet) and req.flags == b"vkO" and req.opaque == b"1"
    ms = parse_meta(b"ms q 5 T10 q")
    assert isinstance(ms, MetaSet) and (ms.length, ms.ttl, ms.quiet) == (5, 10, True)


_META = [b"ms q 3 T0\r\nabc\r\n", b"mg q v\r\n", b"mg q/open v k\r\n", b"mg q/close\r\n",
         b"mg q s t v O5\r\n", b"md r\r\n", b"mn\r\n", b"ma q\r\n", b"ms r 0 q\r\n\r\n",
         b"mg r v q\r\n", b"get q\r\n", b"set q 0 0 1\r\nz\r\n"]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(_META), min_size=1, max_size=10), st.data())
def test_meta_chunking_is_invisible(commands: list[bytes], data: st.DataObject) -> None:
    """However the bytes of meta (and classic) requests are split, the replies are the same."""
    stream = b"".join(commands)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    assert replies_to(MemcacheFactory, pieces) == replies_to(MemcacheFactory, [stream])
