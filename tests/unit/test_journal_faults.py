"""
A journal whose writes or fsyncs fail (a full or failing disk): the queue and
its journal must agree afterwards. A refused add is not in the queue, a
refused remove is not removed, the queue refuses adds (with the reason) until
the journal can be written again, and nothing acknowledged is lost.

Faults are injected where the OS is called (the journal's C{write} and
C{fsync}); time is a L{Clock}.
"""

from __future__ import annotations

import errno
import os

import pytest
from twisted.internet.task import Clock

from kestrel.config import QueueConfig
from kestrel.errors import JournalUnavailable
from kestrel.journal.batch import WriteCoalescer
from kestrel.journal.journal import FileJournal
from kestrel.queue import JOURNAL_RETRY_SECONDS, PersistentQueue
from kestrel.stats import ServerStats
from tests.unit.test_queue import PENDING, datas, value


class Disk:
    """The OS calls of one journal, failing on demand."""

    def __init__(self) -> None:
        self.write_fails = False
        self.fsync_fails = False
        self.temp_fsync_fails = False
        #: With write_fails: how many writes still work before they fail.
        self.writes_left = 0

    def write(self, fd: int, data: bytes) -> int:
        if self.write_fails and not self.writes_left:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if self.write_fails:
            self.writes_left -= 1
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        if self.fsync_fails:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        if self.temp_fsync_fails and "~~" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        os.fsync(fd)


def open_queue(path, clock: Clock, disk: Disk, *, sync_policy=None,
               coalescer: WriteCoalescer | None = None, **config) -> PersistentQueue:
    journal = FileJournal(str(path), "q", clock, sync_policy, fsync=disk.fsync,
                          write=disk.write, coalescer=coalescer)
    q = PersistentQueue("q", QueueConfig(**config), journal, clock)
    q.setup()
    return q


def reopen(q: PersistentQueue, path, clock: Clock) -> PersistentQueue:
    value(q.close())
    return open_queue(path, clock, Disk())


def heal(q: PersistentQueue, disk: Disk, clock: Clock) -> None:
    """Let the disk work again and the queue find out (recovery, then the probe)."""
    disk.write_fails = disk.fsync_fails = False
    clock.advance(JOURNAL_RETRY_SECONDS)
    clock.advance(JOURNAL_RETRY_SECONDS)
    assert q.journal_state == "ok"


def test_failed_batch_rebuilds_memory_from_the_journal(tmp_path, clock: Clock) -> None:
    """A held-back add and remove whose write fails are undone: the journal is the truth."""
    disk = Disk()
    batch = WriteCoalescer()
    q = open_queue(tmp_path, clock, disk, coalescer=batch)
    assert value(q.add(b"a")) is True and value(q.add(b"b")) is True
    batch.begin()
    assert value(q.add(b"c")) is True  # (held back: the reply waits for the flush)
    assert q.remove().data == b"a"
    disk.write_fails = True
    assert batch.end() is False
    assert q.journal_state == "failed"
    with pytest.raises(JournalUnavailable, match="No space left on device"):
        value(q.add(b"x"))
    with pytest.raises(JournalUnavailable):
        q.remove()
    clock.advance(0)
    assert q.journal_state == "read-only"
    assert [i.data for i in q._items] == [b"a", b"b"]
    with pytest.raises(JournalUnavailable, match="read-only"):
        value(q.add(b"x"))
    heal(q, disk, clock)
    assert value(q.add(b"d")) is True
    q = reopen(q, tmp_path, clock)
    assert datas(q) == [b"a", b"b", b"d"]


def test_remove_whose_write_fails_is_not_removed(tmp_path, clock: Clock) -> None:
    """Without a batch the failure is known at once: the reader gets an error, not the item."""
    disk = Disk()
    q = open_queue(tmp_path, clock, disk)
    value(q.add(b"a"))
    disk.write_fails = True
    with pytest.raises(JournalUnavailable):
        q.remove(open_read=True)
    clock.advance(0)
    assert q.length == 1 and q.open_read_count == 0
    heal(q, disk, clock)
    q = reopen(q, tmp_path, clock)
    assert datas(q) == [b"a"]


def test_open_reads_survive_the_reload_and_confirms_wait_for_it(tmp_path, clock: Clock) -> None:
    """An open read journaled before the failure stays open; a confirm asked meanwhile applies."""
    disk = Disk()
    q = open_queue(tmp_path, clock, disk)
    value(q.add(b"a"))
    value(q.add(b"b"))
    item = q.remove(open_read=True)
    disk.write_fails = True
    with pytest.raises(JournalUnavailable):
        value(q.add(b"c"))
    q.confirm_remove(item.xid)
    disk.write_fails = False
    clock.advance(0)
    assert q.open_read_count == 0 and q.length == 1
    clock.advance(JOURNAL_RETRY_SECONDS)
    assert q.journal_state == "ok"
    q = reopen(q, tmp_path, clock)
    assert datas(q) == [b"b"]


def test_fsync_failure_cuts_what_it_covered_and_never_reuses_an_xid(tmp_path,
                                                                    clock: Clock) -> None:
    """
    Records of a failed fsync are cut; an open read among them, whose item its
    reader holds, is opened again under its xid (never delivered twice), and
    no xid is handed out twice.
    """
    disk = Disk()
    q = open_queue(tmp_path, clock, disk, sync_policy=0.5, durable_acks=True)
    d = q.add(b"a")
    clock.advance(0.5)
    assert value(d) is True
    first = q.remove(open_read=True)
    disk.fsync_fails = True
    d = q.add(b"b")
    clock.advance(0.5)
    with pytest.raises(JournalUnavailable, match="Input/output error"):
        value(d)
    heal(q, disk, clock)
    assert q.length == 0 and [i.xid for i in q.open_items()] == [first.xid]
    assert value(q.add(b"c")) is PENDING
    clock.advance(0.5)
    again = q.remove(open_read=True)
    assert again.data == b"c" and again.xid > first.xid
    q.confirm_remove(first.xid)
    q.confirm_remove(again.xid)
    clock.advance(0.5)
    q = reopen(q, tmp_path, clock)
    assert datas(q) == []


def test_waiter_keeps_its_place_and_is_served_after_recovery(tmp_path, clock: Clock) -> None:
    """A blocked reader is not answered by the failure; the next stored item goes to it."""
    disk = Disk()
    q = open_queue(tmp_path, clock, disk)
    waiting = q.wait_remove(clock.seconds() + 60)
    disk.write_fails = True
    with pytest.raises(JournalUnavailable):
        value(q.add(b"lost"))
    clock.advance(0)
    assert value(waiting) is PENDING and q.waiter_count == 1
    heal(q, disk, clock)
    value(q.add(b"a"))
    assert value(waiting).data == b"a"


def test_rewrite_on_a_full_disk_leaves_the_journal_as_it_was(tmp_path, clock: Clock) -> None:
    """
    A compaction that cannot write its new file (the pack a rewrite goes
    through) is given up: no error reaches the client, its ~~ file goes, and
    the files replay as before.
    """
    disk = Disk()
    q = open_queue(tmp_path, clock, disk, default_journal_size=1 << 20, max_memory_size=1024,
                   max_journal_size=256)
    disk.temp_fsync_fails = True
    for i in range(10):
        value(q.add(b"%020d" % i))
    for _ in range(9):
        q.remove()
    assert value(q.add(b"next")) is True
    assert q.journal_rewrites >= 1
    assert not [n for n in os.listdir(tmp_path) if "~~" in n]
    assert q.journal_state == "ok"
    q = reopen(q, tmp_path, clock)
    assert datas(q) == [b"%020d" % 9, b"next"]


def test_acknowledged_confirm_whose_record_is_cut_is_applied_again(tmp_path,
                                                                  clock: Clock) -> None:
    """
    A confirm made (and answered) while the disk is full, whose record then
    fails, is confirmed again after the reload: the item never comes back.
    """
    disk = Disk()
    q = open_queue(tmp_path, clock, disk)
    value(q.add(b"a"))
    value(q.add(b"b"))
    item = q.remove(open_read=True)
    disk.write_fails = True
    q.confirm_remove(item.xid)  # the client is told: confirmed
    clock.advance(0)
    assert q.journal_state == "failed"
    heal(q, disk, clock)
    assert q.open_read_count == 0 and q.length == 1
    q = reopen(q, tmp_path, clock)
    assert datas(q) == [b"b"]


# -- what clients are told --------------------------------------------------------------


def failing_disk_server(clock: Clock, tmp_path):
    """A server whose queue C{q} exists and whose journal writes now fail with ENOSPC."""
    from tests.support import make_server

    server = make_server(clock, tmp_path)
    assert value(server.collection.add("q", b"before")) is True
    journal = server.collection.queue("q").journal
    disk = Disk()
    disk.write_fails = True
    journal._os_write = disk.write
    journal._writer._os_write = disk.write
    return server, disk


def test_memcache_client_is_told_why_and_reads_work_once_reloaded(tmp_path,
                                                                   clock: Clock) -> None:
    """A refused set gets a SERVER_ERROR naming the queue and the OS error; no traceback."""
    from twisted.logger import LogLevel, capturedLogs

    from kestrel.protocols.memcache import MemcacheFactory
    from tests.support import StringClient

    server, disk = failing_disk_server(clock, tmp_path)
    with capturedLogs() as events:
        refused = (b"SERVER_ERROR queue q is read-only: its journal cannot be written "
                   b"(No space left on device (errno 28)); try again later\r\n")
        # A lone set writes through: its own refusal, and the connection lives on.
        client = StringClient(MemcacheFactory(server))
        assert client.send(b"set q 0 0 1\r\nx\r\n") == refused
        clock.advance(0)
        assert client.send(b"set q 0 0 1\r\nx\r\n") == refused
        assert client.connected
        # (A set held back in a batch: test_refused_journal_write_drops_the_replies.)
        disk.write_fails = False
        client = StringClient(MemcacheFactory(server))
        assert client.send(b"get q\r\n") == b"VALUE q 0 6\r\nbefore\r\nEND\r\n"
    assert not [e for e in events if e.get("log_level") == LogLevel.critical]
    server.collection.stopService()


def test_a_lone_get_whose_remove_fails_keeps_the_item_and_the_connection(
        tmp_path, clock: Clock) -> None:
    """
    A lone plain get's reply left, then its REMOVE failed: the connection
    lives on, and the item is still queued once the journal is reloaded
    (a plain read's item is gone only once its REMOVE is journaled).
    """
    from kestrel.protocols.memcache import MemcacheFactory
    from tests.support import StringClient

    server, disk = failing_disk_server(clock, tmp_path)
    client = StringClient(MemcacheFactory(server))
    assert client.send(b"get q\r\n") == b"VALUE q 0 6\r\nbefore\r\nEND\r\n"
    assert client.connected
    assert server.collection.queue("q").journal_state != "ok"
    disk.write_fails = False
    clock.advance(JOURNAL_RETRY_SECONDS)
    clock.advance(JOURNAL_RETRY_SECONDS)
    assert client.send(b"get q\r\n") == b"VALUE q 0 6\r\nbefore\r\nEND\r\n"
    assert client.send(b"get q\r\n") == b"END\r\n"
    server.collection.stopService()


def test_thrift_client_is_told_why(tmp_path, clock: Clock) -> None:
    """A refused thrift put gets an exception whose message is the reason, not 'OSError'."""
    from kestrel.protocols.thrift import ThriftFactory
    from tests.support import StringClient
    from tests.unit.test_thrift_protocol import call_frame, decode_replies

    server, _disk = failing_disk_server(clock, tmp_path)
    client = StringClient(ThriftFactory(server))
    [(_, _, _, exc)] = decode_replies(client.send(call_frame("put", queue_name="q",
                                                             items=[b"x"])))
    assert "queue q is read-only" in exc.message and "No space left" in exc.message
    assert "OSError" not in exc.message
    server.collection.stopService()


def test_failed_fsyncs_are_reported_and_failed_writes_are_not(tmp_path, clock: Clock) -> None:
    """A queue tells its fsync_failed hook (the server's fsync_error_<class>) of a
    failed fsync of its journal; a refused write is not an fsync error."""
    stats = ServerStats(clock.seconds())
    disk = Disk()
    journal = FileJournal(str(tmp_path), "q", clock, 0.5, fsync=disk.fsync, write=disk.write)
    q = PersistentQueue("q", QueueConfig(durable_acks=True), journal, clock,
                        fsync_failed=stats.record_fsync_error)
    q.setup()
    disk.write_fails = True
    with pytest.raises(JournalUnavailable):
        value(q.add(b"lost"))
    assert stats.fsync_errors == {}
    heal(q, disk, clock)
    disk.fsync_fails = True
    d = q.add(b"b")
    clock.advance(0.5)
    with pytest.raises(JournalUnavailable):
        value(d)
    assert stats.counters()["fsync_error_OSError"] == 1



def test_a_reader_woken_by_the_reload_whose_record_fails_leaves_the_queue_recovering(
        tmp_path, clock: Clock) -> None:
    """
    The reload puts an aborted item back and wakes a blocked reader; its
    record fails too (the disk is still full). That second failure starts
    another recovery: once the disk works the queue takes adds again, and
    the item the reader was refused is still there.
    """
    disk = Disk()
    q = open_queue(tmp_path, clock, disk)
    value(q.add(b"a"))
    opened = q.remove(open_read=True)
    assert opened is not None
    waiting = q.wait_remove(clock.seconds() + 60)
    disk.write_fails = True
    with pytest.raises(JournalUnavailable):
        value(q.add(b"lost"))
    assert q.journal_state == "failed"
    q.unremove(opened.xid)  # (kept: the reload applies it)
    disk.writes_left = 1  # the abort the reload journals fits; the woken reader's remove not
    clock.advance(0)  # cut back, reloaded, "a" back, the reader woken: its remove fails,
    # and that failure is recovered from in turn (on the same turn)
    assert q.journal_state == "read-only"
    with pytest.raises(JournalUnavailable):
        value(waiting)
    for _ in range(3):
        clock.advance(JOURNAL_RETRY_SECONDS)  # (still full: recovered again, probes fail)
    assert q.journal_state in ("failed", "read-only")
    heal(q, disk, clock)
    assert value(q.add(b"b")) is True
    q = reopen(q, tmp_path, clock)
    assert datas(q) == [b"a", b"b"]
