"""
Issue 23: a journal fault fails exactly the requests whose records it held.

Each test reproduces one measured fault at the queue's level (a real
L{FileJournal}, writes and fsyncs failing where the OS is called, time a
L{Clock}); memory and journal must agree afterwards and after a restart.
"""

from __future__ import annotations

import pytest
from twisted.internet.task import Clock

from kestrel.errors import JournalUnavailable
from kestrel.journal.batch import WriteCoalescer
from tests.unit.test_journal_faults import Disk, heal, open_queue, reopen
from tests.unit.test_queue import PENDING, datas, value


@pytest.mark.parametrize("open_read", [False, True])
def test_item_of_a_failed_batch_is_not_handed_to_a_blocked_reader(tmp_path, clock: Clock,
                                                                   open_read: bool) -> None:
    """
    Fault (2): a reader blocks on an empty queue; another connection's batch
    adds items whose write fails. The reader gets nothing (its REMOVE never
    travels in that batch) and the queue agrees with its journal.
    """
    disk = Disk()
    batch = WriteCoalescer()
    q = open_queue(tmp_path, clock, disk, coalescer=batch)
    waiting = q.wait_remove(clock.seconds() + 4, open_read=open_read)
    batch.begin()
    disk.write_fails = True  # (what the batch holds is written at its flush)
    for data in (b"a", b"b", b"c"):
        value(q.add(data))
    assert batch.flush_batch() is False
    batch.end()
    assert value(waiting) is PENDING
    clock.advance(0)
    assert q.length == 0 and q.open_read_count == 0
    heal(q, disk, clock)
    assert value(waiting) is PENDING
    value(q.add(b"d"))
    assert value(waiting).data == b"d"
    q = reopen(q, tmp_path, clock)
    assert q.open_read_count == 0 if not open_read else q.length == 1


def test_item_of_a_batch_reaches_the_reader_after_the_flush(tmp_path, clock: Clock) -> None:
    """
    An add held in a batch wakes a blocked reader only once its record is in
    the OS; the reader's REMOVE is then written on its own, outside the batch.
    """
    disk = Disk()
    batch = WriteCoalescer()
    q = open_queue(tmp_path, clock, disk, coalescer=batch)
    waiting = q.wait_remove(clock.seconds() + 4)
    batch.begin()
    value(q.add(b"a"))
    assert value(waiting) is PENDING  # its ADDX is not in the OS yet
    size = q.journal.size
    assert batch.flush_batch() is True
    assert value(waiting).data == b"a"
    batch.end()
    assert q.length == 0
    q = reopen(q, tmp_path, clock)
    assert q.journal.size >= size and datas(q) == []


def test_reader_whose_own_record_fails_gets_the_error(tmp_path, clock: Clock) -> None:
    """A woken reader whose REMOVE cannot be written gets the error, not the item."""
    disk = Disk()
    q = open_queue(tmp_path, clock, disk)
    waiting = q.wait_remove(clock.seconds() + 4, open_read=True)
    journal = q.journal
    real_add = journal.add

    def add_then_fill(item):
        d = real_add(item)
        disk.write_fails = True  # the disk fills between the add and the reader's open
        return d

    journal.add = add_then_fill
    value(q.add(b"a"))
    with pytest.raises(JournalUnavailable):
        value(waiting)
    journal.add = real_add
    clock.advance(0)
    assert q.length == 1 and q.open_read_count == 0
    heal(q, disk, clock)
    q = reopen(q, tmp_path, clock)
    assert datas(q) == [b"a"]


def test_confirmed_item_is_not_delivered_again(tmp_path, clock: Clock) -> None:
    """
    Fault (3): an abort held in another connection's batch wakes a reader,
    whose open travelled in that batch; the batch fails. Before, the reader
    got the item under an xid the journal never saw, its confirm was "not
    open", and the item came back again and again. Now every item handed out
    is confirmed for good, once.
    """
    disk = Disk()
    batch = WriteCoalescer()
    q = open_queue(tmp_path, clock, disk, coalescer=batch)
    value(q.add(b"a"))
    first = q.remove(open_read=True)
    waiting = q.wait_remove(clock.seconds() + 60, open_read=True)
    batch.begin()
    disk.write_fails = True
    q.unremove(first.xid)  # answered: the item goes back
    batch.flush_batch()
    batch.end()
    clock.advance(0)
    disk.write_fails = False
    deliveries = 0
    for _ in range(5):
        clock.advance(1)
        item = value(waiting)
        if item is PENDING or item is None:
            break
        deliveries += 1
        q.confirm_remove(item.xid)
        waiting = q.wait_remove(clock.seconds() + 60, open_read=True)
    assert deliveries == 1
    assert q.length == 0 and q.open_read_count == 0
    q = reopen(q, tmp_path, clock)
    assert datas(q) == []


def test_aborts_answered_while_the_disk_is_full_are_applied(tmp_path, clock: Clock) -> None:
    """
    Fault (4): reads aborted while the journal cannot be written go back to
    the queue once it can; no open read is left without a holder.
    """
    disk = Disk()
    q = open_queue(tmp_path, clock, disk)
    value(q.add(b"a"))
    value(q.add(b"b"))
    one = q.remove(open_read=True)
    two = q.remove(open_read=True)
    disk.write_fails = True
    q.unremove(two.xid)
    q.unremove(one.xid)
    for _ in range(3):
        clock.advance(1)
    heal(q, disk, clock)
    assert value(q.add(b"c")) is True
    assert q.open_read_count == 0 and q.length == 3
    q = reopen(q, tmp_path, clock)
    assert datas(q) == [b"a", b"b", b"c"]


# -- over the protocols (a real server, string transports)


def test_pipelined_sets_refused_never_reach_a_blocked_reader(tmp_path, clock: Clock) -> None:
    """
    Fault (2) as measured: a client waits on C{get bq/t=4000/open}, the journal
    of C{bq} fails, another client pipelines three sets. The producer gets
    SERVER_ERROR; the reader keeps waiting and gets nothing it could lose; once
    the disk is freed, the next set reaches it.
    """
    from twisted.logger import capturedLogs

    from kestrel.protocols.memcache import MemcacheFactory
    from tests.support import StringClient, make_server

    server = make_server(clock, tmp_path)
    assert value(server.collection.add("bq", b"warm")) is True
    assert value(server.collection.remove("bq")).data == b"warm"
    q = server.collection.queue("bq")
    disk = Disk()

    def wire() -> None:  # (every journal file the queue opens writes through the disk)
        q.journal._os_write = disk.write
        writer = q.journal._writer
        if hasattr(writer, "_os_write"):
            writer._os_write = disk.write

    wire()
    reader = StringClient(MemcacheFactory(server))
    assert reader.send(b"get bq/t=4000/open\r\n") == b""
    producer = StringClient(MemcacheFactory(server))
    disk.write_fails = True
    with capturedLogs():
        reply = producer.send(b"set bq 0 0 1\r\na\r\nset bq 0 0 1\r\nb\r\n"
                              b"set bq 0 0 1\r\nc\r\n")
        clock.advance(0)
    assert reply == b"SERVER_ERROR journal write failed\r\n"
    assert reader.take() == b"" and q.length == 0 and q.open_read_count == 0
    disk.write_fails = False
    with capturedLogs():
        clock.advance(1)
        wire()
        clock.advance(1)
    assert q.journal_state == "ok"
    other = StringClient(MemcacheFactory(server))
    assert other.send(b"set bq 0 0 1\r\nd\r\n") == b"STORED\r\n"
    assert reader.take() == b"VALUE bq/t=4000/open 0 1\r\nd\r\nEND\r\n"
    server.collection.stopService()


class _FillingDisk(Disk):
    """A disk with room for C{room} more writes, then full."""

    def __init__(self, room: int) -> None:
        super().__init__()
        self.room = room

    def write(self, fd: int, data: bytes) -> int:
        if self.room <= 0:
            self.write_fails = True
        self.room -= 1
        return super().write(fd, data)


def test_thrift_get_cut_by_a_full_disk_leaves_no_read_open(tmp_path, clock: Clock) -> None:
    """
    Fault (4) as measured: a thrift C{get} of two items with C{auto_abort_msec}
    whose first open record fits on the disk and the second not. The client
    gets the error and no id; the read it never learns of goes back to the
    head once the journal can be written, with no auto-abort needed.
    """
    from twisted.logger import capturedLogs

    from kestrel.session import ClientSession
    from tests.support import make_server

    server = make_server(clock, tmp_path, max_open_transactions=100)
    for data in (b"a", b"b", b"c"):
        assert value(server.collection.add("aq", data)) is True
    q = server.collection.queue("aq")
    disk = _FillingDisk(room=1)
    q.journal._os_write = disk.write
    q.journal._writer._os_write = disk.write
    session = ClientSession(server, "thrift")
    with capturedLogs():
        got = session.get_items("aq", 2, None, 60_000)
        with pytest.raises(JournalUnavailable):
            value(got)
        assert len(server.external_reads) == 0
        clock.advance(0)
        disk.write_fails, disk.room = False, 1 << 30
        clock.advance(1)
        q.journal._os_write = disk.write
        q.journal._writer._os_write = disk.write
        clock.advance(1)
    assert q.journal_state == "ok"
    assert q.open_read_count == 0 and q.length == 3
    session.finish()
    server.collection.stopService()
    again = make_server(clock, tmp_path).collection
    assert [value(again.remove("aq")).data for _ in range(3)] == [b"a", b"b", b"c"]
    again.stopService()
