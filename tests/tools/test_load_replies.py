"""The memcache reply reader of kestrel-load, on arbitrary payloads and chunkings."""

from __future__ import annotations

import socket
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kestrel.tools.load.clients import Connection, LoadError, mc_value


def feed(chunks: list[bytes]) -> Connection:
    """A Connection whose peer sends C{chunks} one by one, then closes."""
    ours, theirs = socket.socketpair()

    def send() -> None:
        for chunk in chunks:
            theirs.sendall(chunk)
        theirs.close()

    threading.Thread(target=send, daemon=True).start()
    ours.settimeout(10)
    return Connection.over(ours)


@given(st.lists(st.one_of(st.none(), st.binary(max_size=64)), max_size=8), st.data())
def test_read_get_decodes_any_stream(items: list[bytes | None], data: st.DataObject) -> None:
    """Replies are decoded by length, whatever the payload holds and however it is split."""
    stream = b"".join(b"END\r\n" if i is None else mc_value("q", i) for i in items)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    conn = feed([c for c in chunks if c])
    try:
        assert [conn.read_get("q", i) for i in range(len(items))] == items
    finally:
        conn.close()


@pytest.mark.parametrize("reply", [
    b"VALUE other 0 1\r\nx\r\nEND\r\n",       # another queue
    b"SERVER_ERROR\r\n",                       # an error
    b"VALUE q 0 1\r\nxy\r\nEND\r\n",          # wrong length
    b"VALUE q 0 1\r\nx\r\n",                  # cut short
])
def test_read_get_rejects_anything_else(reply: bytes) -> None:
    """A reply that is not END or a well-formed VALUE block for the queue is an error."""
    conn = feed([reply])
    try:
        with pytest.raises(LoadError):
            conn.read_get("q", 0)
    finally:
        conn.close()


def test_expect_item_checks_the_data() -> None:
    """expect_item: END is a miss, the expected data a hit, other data an error."""
    conn = feed([b"END\r\n", mc_value("q", b"a"), mc_value("q", b"b")])
    try:
        assert conn.expect_item("q", b"a", 0) is False
        assert conn.expect_item("q", b"a", 1) is True
        with pytest.raises(LoadError, match="Unexpected item at 2: expected b'a', got b'b'"):
            conn.expect_item("q", b"a", 2)
    finally:
        conn.close()
