"""The client's memcache connection: reply parsing, both VALUE key forms, errors, timeouts."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransportWithDisconnection

from kestrel.client.errors import ConnectionGone, ProtocolError, RequestTimeout, ServerRefused
from kestrel.client.memcache import MemcacheConnection, get_key
from tests.client.conftest import resolved


def connect(clock: Clock | None = None, reply_timeout: float = 5.0
            ) -> tuple[MemcacheConnection, StringTransportWithDisconnection]:
    conn = MemcacheConnection("s1:1", clock or Clock(), reply_timeout)
    transport = StringTransportWithDisconnection()
    transport.protocol = conn
    conn.makeConnection(transport)
    return conn, transport


def test_get_key_options() -> None:
    assert get_key("q") == b"q"
    assert get_key("q", 500, open=True) == b"q/open/t=500"
    assert get_key("q", close=True) == b"q/close"
    assert get_key("q", abort=True) == b"q/abort"


@pytest.mark.parametrize("echoed", [b"q", b"q/open/t=500"])
def test_value_with_bare_queue_or_key_as_sent(echoed: bytes) -> None:
    """A VALUE line may name the bare queue (today) or the key exactly as sent (soon)."""
    conn, transport = connect()
    d = conn.get("q", 500, open=True)
    assert transport.value() == b"get q/open/t=500\r\n"
    conn.dataReceived(b"VALUE " + echoed + b" 0 5\r\nhello\r\nEND\r\n")
    assert resolved(d) == b"hello"
    assert conn.idle and conn.alive


def test_value_naming_another_key_is_a_protocol_error() -> None:
    conn, transport = connect()
    d = conn.get("q")
    conn.dataReceived(b"VALUE other 0 1\r\nx\r\nEND\r\n")
    with pytest.raises(ProtocolError):
        resolved(d)
    assert not transport.connected


@given(st.lists(st.binary(max_size=40), min_size=1, max_size=5), st.data())
def test_pipelined_replies_in_any_chunks(items: list[bytes], data: st.DataObject) -> None:
    """Pipelined sets and gets are matched in order however the reply bytes are split."""
    conn, _ = connect()
    sets = [conn.set("q", item) for item in items]
    gets = [conn.get("q") for _ in items]
    reply = b"STORED\r\n" * len(items) + b"".join(
        b"VALUE q 0 %d\r\n%s\r\nEND\r\n" % (len(i), i) for i in items)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(reply)), max_size=6)))
    for a, b in zip([0, *cuts], [*cuts, len(reply)], strict=True):
        conn.dataReceived(reply[a:b])
    assert [resolved(d) for d in sets] == [True] * len(items)
    assert [resolved(d) for d in gets] == items


def test_set_request_bytes_and_not_stored() -> None:
    conn, transport = connect()
    d = conn.set("q", b"abc", expiry=30)
    assert transport.value() == b"set q 0 30 3\r\nabc\r\n"
    conn.dataReceived(b"NOT_STORED\r\n")
    assert resolved(d) is False


def test_server_error_refuses_and_drops_the_connection() -> None:
    conn, transport = connect()
    first, second = conn.set("q", b"a"), conn.set("q", b"b")
    conn.dataReceived(b"SERVER_ERROR Server is read only\r\n")
    with pytest.raises(ServerRefused, match="read only"):
        resolved(first)
    with pytest.raises(ServerRefused):
        resolved(second)
    assert not transport.connected and not conn.alive


def test_reply_timeout_fails_everything_and_closes() -> None:
    """A blocking get may take its wait plus the reply timeout, not more."""
    clock = Clock()
    conn, transport = connect(clock, reply_timeout=2.0)
    d = conn.get("q", 1000)
    clock.advance(2.9)
    assert not d.called
    clock.advance(0.2)
    with pytest.raises(RequestTimeout):
        resolved(d)
    assert not transport.connected


def test_connection_lost_fails_pending_and_calls_owners() -> None:
    conn, transport = connect()
    lost: list[MemcacheConnection] = []
    conn.on_lost.append(lost.append)
    d = conn.get("q")
    transport.loseConnection()
    with pytest.raises(ConnectionGone):
        resolved(d)
    assert lost == [conn]
    with pytest.raises(ConnectionGone):
        resolved(conn.get("q"))


def test_cancelling_a_request_drops_the_connection() -> None:
    """A cancelled request can never be matched, so its connection goes (the server aborts)."""
    conn, transport = connect()
    d = conn.get("q", 5000, open=True)
    d.cancel()
    assert not transport.connected
    from twisted.internet.defer import CancelledError
    with pytest.raises(CancelledError):
        resolved(d)


def test_unsolicited_bytes_drop_the_connection() -> None:
    conn, transport = connect()
    conn.dataReceived(b"END\r\n")
    assert not transport.connected
