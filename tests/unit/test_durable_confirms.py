"""
Confirms under durable policies (C{sync_journal: always}, or C{durable_acks}):
a client's confirm is acknowledged only once its CONFIRM record is durable;
refused while the journal cannot be written, the read staying the client's;
a lost record gives an error and the read comes back open, the client's again.
Queues that do not ack durably answer at once, as before.

The real journal and session, faults injected where the OS is called, time a
L{Clock}.
"""

from __future__ import annotations

import pytest
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.logger import capturedLogs

from kestrel.errors import JournalUnavailable
from kestrel.queue import JOURNAL_RETRY_SECONDS
from kestrel.session import ClientSession
from tests.support import StringClient, make_server
from tests.unit.test_journal_faults import Disk, open_queue, reopen
from tests.unit.test_queue import datas, value

ALWAYS = "default: {sync_journal: always}\n"


def failed_with(d: object) -> BaseException:
    """The error a fired Deferred failed with."""
    assert isinstance(d, Deferred) and d.called
    box: list = []
    d.addErrback(lambda f: box.append(f.value))
    assert box, "the Deferred did not fail"
    return box[0]


def server_with_disk(clock: Clock, tmp_path, yaml: str = ALWAYS):
    """A server whose queue C{q} holds C{a}, C{b}; its journal's OS calls go through a Disk."""
    server = make_server(clock, tmp_path, yaml, max_open_transactions=4)
    for data in (b"a", b"b"):
        d = server.collection.add("q", data)
        clock.advance(0)
        assert value(d) is True
    journal = server.collection.queue("q").journal
    disk = Disk()
    journal._os_write = disk.write
    journal._writer._os_write = disk.write
    journal._writer._fsync = disk.fsync
    return server, disk


def fail_writes(server, disk: Disk, clock: Clock) -> None:
    """From now on the journal's writes fail; an add of C{x} finds it and fails the queue."""
    disk.write_fails = True
    with capturedLogs():
        failed = server.collection.add("q", b"x")
        clock.advance(0)
        assert isinstance(failed_with(failed), JournalUnavailable)


def heal(server, disk: Disk, clock: Clock) -> None:
    disk.write_fails = disk.fsync_fails = False
    with capturedLogs():
        clock.advance(JOURNAL_RETRY_SECONDS)
        clock.advance(JOURNAL_RETRY_SECONDS)
    assert server.collection.queue("q").journal_state == "ok"


# -- the queue -------------------------------------------------------------------------


def durable_queue_with_an_open_read(tmp_path, clock: Clock):
    """A queue under a 0.5 s period with durable_acks, C{a} added and open: (queue, disk, read)."""
    disk = Disk()
    q = open_queue(tmp_path, clock, disk, sync_policy=0.5, durable_acks=True)
    d = q.add(b"a")
    clock.advance(0.5)
    assert value(d) is True
    return q, disk, q.remove(open_read=True)


def test_durable_confirm_waits_for_its_fsync(tmp_path, clock: Clock) -> None:
    """Under a period with durable_acks the confirm fires at the period's fsync."""
    q, disk, item = durable_queue_with_an_open_read(tmp_path, clock)
    done = q.confirm_durably(item.xid)
    assert not done.called
    clock.advance(0.5)
    assert done.called and value(done) is None
    q = reopen(q, tmp_path, clock)
    assert datas(q) == []


def test_durable_confirm_refused_while_the_journal_cannot_be_written(tmp_path,
                                                                    clock: Clock) -> None:
    """Nothing is kept: the read stays open, and a restart on the full disk still has it."""
    q, disk, item = durable_queue_with_an_open_read(tmp_path, clock)
    clock.advance(0.5)
    disk.write_fails = True
    with capturedLogs():
        failed = q.add(b"x")
        clock.advance(0.5)
        assert isinstance(failed_with(failed), JournalUnavailable)
        for _ in range(3):  # failed, then read-only, then probing: all refuse
            assert isinstance(failed_with(q.confirm_durably(item.xid)), JournalUnavailable)
            clock.advance(JOURNAL_RETRY_SECONDS / 2)
    assert [i.xid for i in q.open_items()] == [item.xid]
    assert len(q._records) == 0
    q = reopen(q, tmp_path, clock)
    assert datas(q) == [b"a"]  # (the open read aborted at startup: not confirmed)


def test_non_durable_queue_confirms_at_once(tmp_path, clock: Clock) -> None:
    """A queue that does not ack durably answers the session's confirm with no Deferred."""
    server = make_server(clock, tmp_path)
    assert value(server.collection.add("q", b"a")) is True
    session = ClientSession(server)
    assert session.read_item("q", None, True, False).data == b"a"
    assert session.close_read("q") is True
    assert session.count_open_reads("q") == 0
    assert server.collection.queue("q").open_read_count == 0
    assert session.close_read("q") is False
    server.collection.stopService()


# -- the session -----------------------------------------------------------------------


def test_session_close_waits_for_the_fsync(tmp_path, clock: Clock) -> None:
    """Under always the close fires True once the CONFIRM record is synced."""
    server, _disk = server_with_disk(clock, tmp_path)
    session = ClientSession(server)
    assert session.read_item("q", None, True, False).data == b"a"
    done = session.close_read("q")
    assert isinstance(done, Deferred)
    clock.advance(0)
    assert value(done) is True
    assert session.count_open_reads("q") == 0
    server.collection.stopService()


def test_session_close_refused_keeps_the_read_at_the_front(tmp_path, clock: Clock) -> None:
    """Refused: an error, the reads stay the session's in order; later the close works."""
    server, disk = server_with_disk(clock, tmp_path)
    session = ClientSession(server)
    first = session.read_item("q", None, True, False)
    second = session.read_item("q", None, True, False)
    clock.advance(0)
    fail_writes(server, disk, clock)
    assert isinstance(failed_with(session.close_reads("q", 2)), JournalUnavailable)
    assert list(session._open_reads["q"]) == [first.xid, second.xid]
    assert isinstance(failed_with(session.close_read("q")), JournalUnavailable)
    assert list(session._open_reads["q"]) == [first.xid, second.xid]
    heal(server, disk, clock)
    done = session.close_read("q")
    clock.advance(0)
    assert value(done) is True
    assert list(session._open_reads["q"]) == [second.xid]
    server.collection.stopService()


def lose_a_confirm(tmp_path, clock: Clock, finish: bool):
    """A session opens C{a} and closes it while fsyncs fail (ending first if C{finish})."""
    server, disk = server_with_disk(clock, tmp_path)
    session = ClientSession(server)
    item = session.read_item("q", None, True, False)
    clock.advance(0)
    disk.fsync_fails = True
    done = session.close_read("q")
    if finish:
        session.finish()
    with capturedLogs():
        clock.advance(0)
    assert isinstance(failed_with(done), JournalUnavailable)
    return server, disk, session, item


def test_lost_confirm_is_open_again_and_the_sessions(tmp_path, clock: Clock) -> None:
    """A failed fsync: the error, the read open after the reload and the session's again."""
    server, disk, session, item = lose_a_confirm(tmp_path, clock, finish=False)
    assert list(session._open_reads["q"]) == [item.xid]
    heal(server, disk, clock)
    q = server.collection.queue("q")
    assert [i.xid for i in q.open_items()] == [item.xid]
    done = session.close_read("q")
    clock.advance(0)
    assert value(done) is True and q.open_read_count == 0 and q.length == 1
    server.collection.stopService()


def test_lost_confirm_of_a_finished_session_is_aborted(tmp_path, clock: Clock) -> None:
    """The session ended while its confirm was in flight: the read goes back to the queue."""
    server, disk, _, item = lose_a_confirm(tmp_path, clock, finish=True)
    heal(server, disk, clock)
    q = server.collection.queue("q")
    assert q.open_read_count == 0 and [i.data for i in q._items] == [b"a", b"b"]
    assert q.peek().data == item.data
    server.collection.stopService()


# -- thrift's external reads ----------------------------------------------------------


def test_thrift_confirm_refused_keeps_the_id_open(tmp_path, clock: Clock) -> None:
    """A refused thrift confirm fails; the id is still open and a later confirm counts it."""
    server, disk = server_with_disk(clock, tmp_path)
    session = ClientSession(server, "thrift")
    [(external, item)] = value(session.get_items("q", 1, None, 60_000))
    clock.advance(0)
    fail_writes(server, disk, clock)
    assert isinstance(failed_with(session.confirm_ids("q", [external])), JournalUnavailable)
    assert external in server.external_reads and session.count_open_reads("q") == 1
    heal(server, disk, clock)
    done = session.confirm_ids("q", [external])
    clock.advance(0)
    assert value(done) == 1 and external not in server.external_reads
    assert session.count_open_reads("q") == 0
    server.collection.stopService()


# -- over the protocols (in process) ----------------------------------------------------


@pytest.mark.parametrize("dialect", ["text", "meta"])
def test_memcache_close_refused_gets_server_error(tmp_path, clock: Clock, dialect) -> None:
    """get q/close refused: SERVER_ERROR, no open made; the read is closed after healing."""
    from kestrel.protocols.memcache import MemcacheFactory

    server, disk = server_with_disk(clock, tmp_path)
    client = StringClient(MemcacheFactory(server))
    if dialect == "text":
        assert client.send(b"get q/open\r\n") == b"VALUE q/open 0 1\r\na\r\nEND\r\n"
    else:
        assert client.send(b"mg q/open v\r\n") == b"VA 1\r\na\r\n"
    clock.advance(0)
    fail_writes(server, disk, clock)
    request = b"get q/close/open\r\n" if dialect == "text" else b"mg q/close/open v\r\n"
    with capturedLogs():
        reply = client.send(request)
    assert reply.startswith(b"SERVER_ERROR queue q is ") and reply.endswith(b"\r\n")
    assert client.connected
    heal(server, disk, clock)
    request = b"get q/close/open\r\n" if dialect == "text" else b"mg q/close/open v\r\n"
    client.send(request)
    clock.advance(0)
    reply = client.take()
    assert reply in (b"VALUE q/close/open 0 1\r\nb\r\nEND\r\n", b"VA 1\r\nb\r\n")
    assert server.collection.queue("q").open_read_count == 1
    server.collection.stopService()


def test_binary_close_refused_gets_its_status(tmp_path, clock: Clock) -> None:
    """
    A binary Get of C{q/close/open} refused: status 0x0086 with the reason, no
    open made, the connection kept; after healing the same request closes
    the read and opens the next item.
    """
    from kestrel.protocols.memcache import MemcacheFactory
    from tests.unit.test_memcache_binary import GET, request, split

    server, disk = server_with_disk(clock, tmp_path)
    client = StringClient(MemcacheFactory(server))
    [(_, status, _, data)] = split(client.send(request(GET, b"q/open")))
    assert (status, data[-1:]) == (0, b"a")
    clock.advance(0)
    fail_writes(server, disk, clock)
    with capturedLogs():
        [(_, status, _, data)] = split(client.send(request(GET, b"q/close/open")))
    assert status == 0x0086 and data.startswith(b"queue q is ")
    assert client.connected
    assert server.collection.queue("q").open_read_count == 1
    heal(server, disk, clock)
    client.send(request(GET, b"q/close/open"))
    clock.advance(0)
    [(_, status, _, data)] = split(client.take())
    assert (status, data[-1:]) == (0, b"b")
    assert server.collection.queue("q").open_read_count == 1
    server.collection.stopService()
