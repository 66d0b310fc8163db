"""
Thrift protocol (port 2229) over StringTransport, with a fake clock.

Requests are built with thriftpy2's client-side serialization from the
project's IDL; replies are decoded the same way, and a few are checked
byte for byte.
"""

from __future__ import annotations

import struct
from functools import partial

import pytest
from hypothesis import given
from hypothesis import strategies as st
from thriftpy2.protocol.binary import TBinaryProtocol
from thriftpy2.thrift import TApplicationException, TMessageType
from thriftpy2.transport.memory import TMemoryBuffer
from twisted.internet.testing import StringTransportWithDisconnection

from kestrel.protocols.thrift import ThriftFactory, kestrel_thrift
from kestrel.server import KestrelServer
from tests import support
from tests.support import ManualThread, StringClient, replies_to

Kestrel = kestrel_thrift.Kestrel
Status = kestrel_thrift.Status


#: Servers here allow 100 open reads per queue per connection, as the shipped
#: config does: the shared C{server} fixture (tests/unit/conftest.py) passes
#: these options to L{tests.support.make_server}, and so does C{make_server}.
SERVER_OPTIONS = {"max_open_transactions": 100}
make_server = partial(support.make_server, **SERVER_OPTIONS)


def call_frame(api: str, seqid: int = 1, strict: bool = True, **kwargs) -> bytes:
    """One framed CALL message of C{api}, as a thriftpy2 client would send it."""
    args = getattr(Kestrel, api + "_args")(**kwargs)
    buf = TMemoryBuffer()
    proto = TBinaryProtocol(buf, strict_write=strict)
    proto.write_message_begin(api, TMessageType.CALL, seqid)
    args.write(proto)
    proto.write_message_end()
    payload = buf.getvalue()
    return struct.pack(">i", len(payload)) + payload


def decode_replies(data: bytes) -> list[tuple[str, int, int, object]]:
    """Split C{data} into frames: (api, message type, seqid, result value or exception)."""
    replies = []
    pos = 0
    while pos < len(data):
        (length,) = struct.unpack_from(">i", data, pos)
        frame = data[pos + 4:pos + 4 + length]
        assert len(frame) == length
        pos += 4 + length
        proto = TBinaryProtocol(TMemoryBuffer(frame), strict_read=True)
        api, mtype, seqid = proto.read_message_begin()
        if mtype == TMessageType.EXCEPTION:
            exc = TApplicationException()
            exc.read(proto)
            replies.append((api, mtype, seqid, exc))
        else:
            result = getattr(Kestrel, api + "_result")()
            result.read(proto)
            replies.append((api, mtype, seqid, getattr(result, "success", None)))
    return replies


class Client(StringClient):
    """One thrift connection over a StringTransport; replies come back decoded."""

    def __init__(self, server: KestrelServer) -> None:
        super().__init__(ThriftFactory(server))
        self.seqid = 0

    def send(self, data: bytes) -> list[tuple[str, int, int, object]]:  # type: ignore[override]
        """Feed C{data}; return the replies written since the last call, decoded."""
        self.protocol.dataReceived(data)
        return self.take()

    def take(self) -> list[tuple[str, int, int, object]]:  # type: ignore[override]
        """The replies written since the last call, decoded."""
        return decode_replies(super().take())

    def call(self, api: str, **kwargs):
        """Send one call; return its result, its exception, or C{PENDING}."""
        self.seqid += 1
        replies = self.send(call_frame(api, self.seqid, **kwargs))
        if not replies:
            return PENDING
        [(name, _, seqid, value)] = replies
        assert (name, seqid) == (api, self.seqid)
        return value


PENDING = object()


@pytest.fixture
def client(server):
    return Client(server)


def data_of(items) -> list[bytes]:
    return [item.data for item in items]


def test_put_and_get(client) -> None:
    """put stores items in order and reports the count; get without auto-abort gives id 0."""
    assert client.call("put", queue_name="q", items=[b"a", b"b", b"c"]) == 3
    items = client.call("get", queue_name="q", max_items=2)
    assert data_of(items) == [b"a", b"b"]
    assert [item.id for item in items] == [0, 0]
    assert data_of(client.call("get", queue_name="q", max_items=10)) == [b"c"]
    assert client.call("get", queue_name="q", max_items=10) == []


def test_reply_bytes_are_strict_binary_frames(client, server) -> None:
    """get_version's reply is a strict (versioned) binary message in a 4-byte length frame."""
    client.protocol.dataReceived(call_frame("get_version", seqid=7))
    version = server.version.encode()
    body = (b"\x80\x01\x00\x02" + struct.pack(">i", 11) + b"get_version" + struct.pack(">i", 7)
            + b"\x0b\x00\x00" + struct.pack(">i", len(version)) + version + b"\x00")
    assert client.transport.value() == struct.pack(">i", len(body)) + body


def test_non_strict_request_header_is_accepted(client) -> None:
    """A request with an old-style (unversioned) header gets a normal, strict reply."""
    frame = call_frame("put", seqid=3, strict=False, queue_name="q", items=[b"x"])
    assert frame[4:8] == struct.pack(">i", 3)  # name length, no version word
    assert client.send(frame) == [("put", TMessageType.REPLY, 3, 1)]


def test_max_items_zero_returns_nothing(client) -> None:
    """get with max_items=0 returns an empty list at once."""
    client.call("put", queue_name="q", items=[b"a"])
    assert client.call("get", queue_name="q", max_items=0) == []
    assert data_of(client.call("get", queue_name="q", max_items=1)) == [b"a"]


def test_get_waits_until_timeout(client, clock) -> None:
    """get with timeout_msec waits for items and answers with what it has at the deadline."""
    assert client.call("get", queue_name="q", max_items=2, timeout_msec=1000) is PENDING
    other = Client(client.protocol.server)
    assert other.call("put", queue_name="q", items=[b"one"]) == 1
    assert client.take() == []
    clock.advance(1.0)
    [(api, _, _, items)] = client.take()
    assert api == "get" and data_of(items) == [b"one"]


def test_requests_are_answered_in_order(client, clock) -> None:
    """Frames after a waiting call are answered only after it, in order."""
    frames = (call_frame("get", 1, queue_name="q", max_items=1, timeout_msec=500)
              + call_frame("get_version", 2) + call_frame("put", 3, queue_name="q", items=[b"x"]))
    assert client.send(frames) == []
    clock.advance(0.5)
    replies = client.take()
    assert [(api, seqid) for api, _, seqid, _ in replies] == [
        ("get", 1), ("get_version", 2), ("put", 3)]
    assert replies[0][3] == []


def test_auto_abort_returns_item_after_timeout(client, clock) -> None:
    """An open read not confirmed within auto_abort_msec goes back to the head of the queue."""
    client.call("put", queue_name="q", items=[b"a", b"b"])
    [item] = client.call("get", queue_name="q", max_items=1, auto_abort_msec=1000)
    assert item.data == b"a" and item.id > 0
    clock.advance(0.999)
    assert data_of(client.call("get", queue_name="q", max_items=1, auto_abort_msec=5000)) == [b"b"]
    clock.advance(0.001)
    assert data_of(client.call("get", queue_name="q", max_items=5)) == [b"a"]


def test_confirm_and_abort_by_id_from_any_connection(server, clock) -> None:
    """Ids are process-wide: another connection may confirm or abort them; unknown ids count 0."""
    a, b = Client(server), Client(server)
    a.call("put", queue_name="q", items=[b"1", b"2", b"3"])
    items = a.call("get", queue_name="q", max_items=3, auto_abort_msec=60_000)
    ids = [item.id for item in items]
    assert len(set(ids)) == 3 and all(i > 0 for i in ids)
    a.close()
    assert b.call("confirm", queue_name="q", ids={ids[0], 999_999}) == 1
    assert b.call("abort", queue_name="q", ids={ids[1]}) == 1
    assert b.call("abort", queue_name="q", ids={ids[1]}) == 0
    clock.advance(60)
    assert data_of(b.call("get", queue_name="q", max_items=5)) == [b"3", b"2"]


def test_open_reads_survive_disconnect(server, clock) -> None:
    """Closing the connection does not abort thrift open reads; only the timer does."""
    a = Client(server)
    a.call("put", queue_name="q", items=[b"x"])
    [item] = a.call("get", queue_name="q", max_items=1, auto_abort_msec=2000)
    a.close()
    b = Client(server)
    assert b.call("get", queue_name="q", max_items=1) == []
    clock.advance(2)
    assert data_of(b.call("get", queue_name="q", max_items=1)) == [b"x"]


def test_peek_reports_head_and_counts(client) -> None:
    """peek returns the head item without removing it, and the queue's counters."""
    info = client.call("peek", queue_name="q")
    assert info.head_item is None and info.items == 0
    client.call("put", queue_name="q", items=[b"head", b"tail"])
    info = client.call("peek", queue_name="q")
    assert (info.head_item, info.items, info.bytes) == (b"head", 2, 8)
    assert data_of(client.call("get", queue_name="q", max_items=1)) == [b"head"]


def test_flush_delete_flush_all(client) -> None:
    """flush_queue, delete_queue and flush_all_queues empty the queues."""
    for name in ("a", "b", "c"):
        client.call("put", queue_name=name, items=[b"x"])
    assert client.call("flush_queue", queue_name="a") is None
    assert client.call("delete_queue", queue_name="b") is None
    assert client.call("get", queue_name="a", max_items=1) == []
    assert client.call("get", queue_name="b", max_items=1) == []
    assert client.call("flush_all_queues") is None
    assert client.call("get", queue_name="c", max_items=1) == []


def test_status_round_trip_and_blocked_put(client) -> None:
    """set_status changes what current_status reports, and READ_ONLY refuses put with a reason."""
    assert client.call("current_status") == Status.UP
    assert client.call("set_status", status=Status.READ_ONLY) is None
    assert client.call("current_status") == Status.READ_ONLY
    refused = client.call("put", queue_name="q", items=[b"x"])
    assert isinstance(refused, TApplicationException)
    assert refused.type == TApplicationException.INTERNAL_ERROR
    assert refused.message == "Server not available for operation setItem"
    assert client.call("set_status", status=Status.QUIESCENT) is None
    refused = client.call("get", queue_name="q", max_items=1)
    assert refused.message == "Server not available for operation monitorUntil"
    refused = client.call("peek", queue_name="q")
    assert refused.message == "Server not available for operation getItem"
    bad = client.call("set_status", status=Status.NOT_CONFIGURED)
    assert bad.type == TApplicationException.INTERNAL_ERROR
    assert client.call("set_status", status=Status.UP) is None
    assert client.connected


def test_get_version(client, server) -> None:
    """get_version returns the server's version string."""
    assert client.call("get_version") == server.version


def test_unknown_method(client) -> None:
    """An unknown method gets UNKNOWN_METHOD naming it, and the connection stays usable."""
    buf = TMemoryBuffer()
    proto = TBinaryProtocol(buf)
    proto.write_message_begin("frobnicate", TMessageType.CALL, 9)
    proto.write_struct(Kestrel.get_version_args())
    payload = buf.getvalue()
    [(api, mtype, seqid, exc)] = client.send(struct.pack(">i", len(payload)) + payload)
    assert (api, mtype, seqid) == ("frobnicate", TMessageType.EXCEPTION, 9)
    assert exc.type == TApplicationException.UNKNOWN_METHOD
    assert exc.message == "Invalid method name: 'frobnicate'"
    assert client.call("get_version")


def test_missing_argument_is_a_protocol_error(client) -> None:
    """A call leaving out an argument without default gets PROTOCOL_ERROR naming it."""
    exc = client.call("get", queue_name="q")
    assert exc.type == TApplicationException.PROTOCOL_ERROR
    assert exc.message == "get: missing argument 'max_items'"


def test_undecodable_frame_closes_connection(client) -> None:
    """A frame that is not a thrift message closes the connection, without a reply."""
    assert client.send(struct.pack(">i", 5) + b"\x80\x01\x00") == []
    assert client.connected
    assert client.send(b"\x01\x02") == []
    assert not client.connected


def test_frame_over_limit_closes_connection(clock, tmp_path) -> None:
    """A frame longer than max_request_size closes the connection before it is read."""
    client = Client(make_server(clock, tmp_path, max_request_size=1000))
    assert client.call("put", queue_name="q", items=[b"x" * 900]) == 1
    assert client.send(call_frame("put", 2, queue_name="q", items=[b"x" * 1000])) == []
    assert not client.connected


def test_negative_frame_length_closes_connection(client) -> None:
    """A negative frame length closes the connection."""
    client.send(struct.pack(">i", -1))
    assert not client.connected


def test_one_mebibyte_item(client) -> None:
    """An item of 1 MiB goes through put and get unchanged."""
    item = bytes(range(256)) * 4096
    assert client.call("put", queue_name="big", items=[item]) == 1
    assert data_of(client.call("get", queue_name="big", max_items=1)) == [item]


def _replies(chunks: list[bytes]) -> bytes:
    """Everything a fresh server answers to C{chunks} sent one after the other."""
    return replies_to(ThriftFactory, chunks)


_calls = st.one_of(
    st.builds(lambda q, items: ("put", {"queue_name": q, "items": items}),
              st.sampled_from(["a", "b"]), st.lists(st.binary(max_size=20), max_size=4)),
    st.builds(lambda q, n: ("get", {"queue_name": q, "max_items": n}),
              st.sampled_from(["a", "b"]), st.integers(0, 3)),
    st.just(("get_version", {})),
    st.just(("peek", {"queue_name": "a"})),
)


@given(st.lists(_calls, max_size=10), st.data())
def test_chunking_is_invisible(calls, data) -> None:
    """The replies do not depend on how the request bytes are split into chunks."""
    stream = b"".join(call_frame(api, n, **kw) for n, (api, kw) in enumerate(calls))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    assert _replies(chunks) == _replies([stream])


# Fsyncs in the (here manual) thread pool: the test decides when they end.
DURABLE = "journal_fsync: thread\ndefault: {sync_journal: always, durable_acks: true}\n"


def test_put_stops_at_the_first_refused_item(clock, tmp_path) -> None:
    """put returns the count stored before the first refusal and offers nothing after it."""
    client = Client(make_server(clock, tmp_path, "queues: {small: {max_item_size: 3}}\n"))
    assert client.call("put", queue_name="small", items=[b"abc", b"abcd", b"xyz"]) == 1
    assert data_of(client.call("get", queue_name="small", max_items=5)) == [b"abc"]


def test_put_expiration(client, clock) -> None:
    """expiration_msec > 0 expires items that long after the put; 0 never expires them."""
    client.call("put", queue_name="q", items=[b"soon"], expiration_msec=100)
    client.call("put", queue_name="q", items=[b"never"], expiration_msec=0)
    clock.advance(3600)
    assert data_of(client.call("get", queue_name="q", max_items=5)) == [b"never"]


def test_put_reply_waits_for_the_fsync_with_durable_acks(clock, tmp_path) -> None:
    """With durable_acks, put is answered only after the fsync covering its items."""
    thread = ManualThread()
    client = Client(make_server(clock, tmp_path, DURABLE, run_in_thread=thread))
    assert client.call("put", queue_name="q", items=[b"a", b"b", b"c"]) is PENDING
    assert thread.jobs
    thread.run_all()
    [(api, _, _, count)] = client.take()
    assert (api, count) == ("put", 3)


def test_bad_queue_name_is_an_internal_error(client) -> None:
    """An illegal queue name gets INTERNAL_ERROR with the reason; the connection stays."""
    exc = client.call("put", queue_name="../x", items=[b"x"])
    assert exc.type == TApplicationException.INTERNAL_ERROR
    assert exc.message.startswith("Queue name contains illegal characters")
    assert client.call("get_version")


def test_peek_on_an_alias_is_an_internal_error(clock, tmp_path) -> None:
    """peek on an alias has no queue statistics: INTERNAL_ERROR (Kestrel failed too)."""
    client = Client(make_server(clock, tmp_path, "aliases: {al: [q1, q2]}\n"))
    assert client.call("put", queue_name="al", items=[b"x"]) == 1
    exc = client.call("peek", queue_name="al")
    assert exc.type == TApplicationException.INTERNAL_ERROR
    assert data_of(client.call("get", queue_name="q2", max_items=1)) == [b"x"]


def test_disconnect_all_keeps_thrift_open_reads(server, clock) -> None:
    """disconnect_all ends the sessions; thrift open reads still wait for their timer."""
    factory = ThriftFactory(server)
    client = Client.__new__(Client)
    client.protocol = factory.buildProtocol(None)
    client.transport = StringTransportWithDisconnection()
    client.transport.protocol = client.protocol
    client.protocol.makeConnection(client.transport)
    client.seqid = 0
    client.call("put", queue_name="q", items=[b"x"])
    assert len(client.call("get", queue_name="q", max_items=1, auto_abort_msec=500)) == 1
    factory.disconnect_all()
    assert factory.connections == set()
    other = Client(server)
    assert other.call("get", queue_name="q", max_items=1) == []
    clock.advance(0.5)
    assert data_of(other.call("get", queue_name="q", max_items=1)) == [b"x"]


def test_messages_other_than_calls_are_refused(client) -> None:
    """A REPLY (or any non-CALL) message gets INVALID_MESSAGE_TYPE."""
    buf = TMemoryBuffer()
    proto = TBinaryProtocol(buf)
    proto.write_message_begin("get_version", TMessageType.REPLY, 4)
    proto.write_struct(Kestrel.get_version_args())
    payload = buf.getvalue()
    [(_, mtype, seqid, exc)] = client.send(struct.pack(">i", len(payload)) + payload)
    assert (mtype, seqid) == (TMessageType.EXCEPTION, 4)
    assert exc.type == TApplicationException.INVALID_MESSAGE_TYPE


def test_queue_name_must_be_utf8(client) -> None:
    """A queue name that is not UTF-8 gets INTERNAL_ERROR saying so."""
    header = struct.pack(">iI", -2147418111, 4) + b"peek" + struct.pack(">i", 1)
    body = struct.pack(">bhi", 11, 1, 2) + b"\xff\xfe" + b"\x00"
    frame = header + body
    [(_, _, _, exc)] = client.send(struct.pack(">i", len(frame)) + frame)
    assert exc.type == TApplicationException.INTERNAL_ERROR
    assert exc.message == "Queue name is not valid UTF-8"


def test_half_close_ends_pending_call_then_closes(client, clock) -> None:
    """After the client half-closes, a waiting get ends at once (no items), then the close."""
    assert client.call("get", queue_name="q", max_items=1, timeout_msec=300) is PENDING
    client.protocol.readConnectionLost()
    [(api, _, _, result)] = client.take()
    assert api == "get" and result == []
    assert not client.connected
    assert client.protocol.server.collection.queue("q").waiter_count == 0


def test_get_stops_at_the_open_read_limit(clock, tmp_path) -> None:
    """A connection holds at most max_open_transactions open reads per queue."""
    client = Client(make_server(clock, tmp_path, max_open_transactions=2))
    client.call("put", queue_name="q", items=[b"a", b"b", b"c"])
    items = client.call("get", queue_name="q", max_items=5, auto_abort_msec=10_000)
    assert data_of(items) == [b"a", b"b"]
    assert client.call("get", queue_name="q", max_items=5, auto_abort_msec=10_000) == []
    assert client.call("confirm", queue_name="q", ids={items[0].id}) == 1
    assert data_of(client.call("get", queue_name="q", max_items=5, auto_abort_msec=10_000)) == [
        b"c"]


def test_put_whose_fsync_failed_is_an_internal_error(clock, tmp_path) -> None:
    """With durable_acks, a put whose fsync failed is not acknowledged: INTERNAL_ERROR."""
    thread = ManualThread()
    client = Client(make_server(clock, tmp_path, DURABLE, run_in_thread=thread))
    assert client.call("put", queue_name="q", items=[b"a", b"b"]) is PENDING
    thread.fail_all(OSError(5, "Input/output error"))
    [(api, _, _, exc)] = client.take()
    assert api == "put" and exc.type == TApplicationException.INTERNAL_ERROR
    assert "Input/output error" in exc.message
    assert client.connected


def test_waiting_get_keeps_reading_and_a_reset_ends_it(client, clock) -> None:
    """While a get waits the transport keeps reading (a close is seen); a reset drops the waiter."""
    assert client.call("get", queue_name="q", max_items=1, timeout_msec=60000) is PENDING
    assert client.transport.producerState != "paused"
    queue = client.protocol.server.collection.queue("q")
    assert queue.waiter_count == 1
    client.protocol.connectionLost(None)
    assert queue.waiter_count == 0
    assert queue.add(b"x").result is True and queue.length == 1


def test_get_cut_by_a_full_disk_is_an_error_and_leaves_no_read_open(clock, tmp_path) -> None:
    """
    A get whose second open record finds the disk full answers INTERNAL_ERROR
    and no id; the read it opened first goes back to the head once the
    journal can be written again (the auto-abort never runs).
    """
    from twisted.logger import capturedLogs

    from tests.unit.test_fault_isolation import _FillingDisk

    server = make_server(clock, tmp_path)
    client = Client(server)
    assert client.call("put", queue_name="q", items=[b"a", b"b", b"c"]) == 3
    journal = server.collection.queue("q").journal
    disk = _FillingDisk(room=1)
    journal._os_write = journal._writer._os_write = disk.write
    with capturedLogs():
        exc = client.call("get", queue_name="q", max_items=2, auto_abort_msec=600_000)
        assert exc.type == TApplicationException.INTERNAL_ERROR
        assert "No space left on device" in exc.message
        clock.advance(0)
        disk.write_fails, disk.room = False, 1 << 30
        clock.advance(1)
        journal._os_write = journal._writer._os_write = disk.write
        clock.advance(1)
    assert client.call("peek", queue_name="q").open_transactions == 0
    assert data_of(client.call("get", queue_name="q", max_items=5)) == [b"a", b"b", b"c"]
