"""
PersistentQueue on a real FileJournal in a temporary folder: restarts,
read-behind, rotation, rewrites, packing and durable acknowledgements.
"""

from __future__ import annotations

import os

import attrs
import pytest
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from kestrel.config import QueueConfig
from kestrel.errors import JournalUnavailable
from kestrel.journal import naming
from kestrel.journal import records as rec
from kestrel.journal.journal import FileJournal
from kestrel.queue import JOURNAL_RETRY_SECONDS, PersistentQueue
from tests.support import ManualThread
from tests.unit.test_queue import PENDING, datas, value


def open_queue(path, clock: Clock, name: str = "q", *, sync_policy=None, fsync=os.fsync,
               **config) -> PersistentQueue:
    """Open (and replay) queue C{name} journaled in folder C{path}."""
    journal = FileJournal(str(path), name, clock, sync_policy, fsync=fsync)
    q = PersistentQueue(name, QueueConfig(**config), journal, clock)
    q.setup()
    return q


def restart(q: PersistentQueue, path, clock: Clock, **config) -> PersistentQueue:
    """Close C{q} and open its journal again in a new queue."""
    value(q.close())
    return open_queue(path, clock, q.name, **config)


def journal_records(path, name: str = "q") -> list[rec.Record]:
    """Decode every journal file of queue C{name}, in replay order (rotated files, then <q>)."""
    out: list[rec.Record] = []
    for file in [*naming.packed_order(naming.timed_files(name, os.listdir(str(path)))), name]:
        with open(os.path.join(str(path), file), "rb") as f:
            decoded = rec.decode_prefix(f.read())
        assert decoded.problem is None
        out.extend(decoded.records)
    return out


def files(path) -> list[str]:
    return sorted(os.listdir(str(path)))


def test_items_survive_restart(tmp_path, clock: Clock) -> None:
    """Every acknowledged item, removed or not, is where it was after a restart."""
    q = open_queue(tmp_path, clock)
    for i in range(5):
        assert value(q.add(b"item%d" % i)) is True
    assert q.remove().data == b"item0"
    q = restart(q, tmp_path, clock)
    assert (q.length, q.bytes, q.total_items) == (4, 20, 5)
    assert datas(q) == [b"item1", b"item2", b"item3", b"item4"]


def test_open_reads_return_to_head_after_restart(tmp_path, clock: Clock) -> None:
    """Reads open at a crash come back first, oldest xid first; xids continue from the journal."""
    q = open_queue(tmp_path, clock)
    for data in (b"a", b"b", b"c", b"d"):
        value(q.add(data))
    a = q.remove(open_read=True)
    b = q.remove(open_read=True)
    q.confirm_remove(q.remove(open_read=True).xid)  # c is gone for good
    assert (a.xid, b.xid) == (1, 2)
    q = restart(q, tmp_path, clock)
    assert q.open_read_count == 0
    assert journal_records(tmp_path)[-2:] == [rec.Unremove(2), rec.Unremove(1)]
    assert q.remove(open_read=True).xid == 4
    assert datas(q) == [b"b", b"d"]
    q = restart(q, tmp_path, clock)
    assert datas(q) == [b"a"]


def test_read_behind_keeps_memory_bounded(tmp_path, clock: Clock) -> None:
    """Past max_memory_size new items stay on disk and are read back in order."""
    q = open_queue(tmp_path, clock, max_memory_size=40)
    for i in range(20):
        value(q.add(b"%09d" % i))  # 9 bytes each
    assert q.in_read_behind
    assert (q.length, q.bytes) == (20, 180)
    assert q.memory_bytes <= 45 and q.memory_length == 5
    out = []
    while (item := q.remove()) is not None:
        assert q.memory_bytes <= 45
        out.append(item.data)
    assert out == [b"%09d" % i for i in range(20)]
    assert not q.in_read_behind
    assert (q.length, q.bytes, q.memory_bytes) == (0, 0, 0)


def test_read_behind_across_restart(tmp_path, clock: Clock) -> None:
    """A queue larger than max_memory_size replays into read-behind and loses nothing."""
    q = open_queue(tmp_path, clock, max_memory_size=40)
    for i in range(30):
        value(q.add(b"%09d" % i))
    for _ in range(3):
        q.remove()
    opened = q.remove(open_read=True)
    q = restart(q, tmp_path, clock, max_memory_size=40)
    assert q.in_read_behind
    # memory holds max_memory_size plus one item, plus the open read returned to the head
    assert q.length == 27 and q.memory_bytes <= 40 + 9 + 9
    assert q.peek().data == opened.data
    for i in range(30, 35):
        value(q.add(b"%09d" % i))
    assert datas(q) == [b"%09d" % i for i in range(3, 35)]


def test_rotations_and_rewrites_keep_order(tmp_path, clock: Clock) -> None:
    """A journal past max_memory_size rotates, past max_journal_size it is rewritten: in order."""
    config = dict(max_memory_size=64, max_journal_size=256, default_journal_size=10_000,
                  min_journal_compact_delay=None)
    q = open_queue(tmp_path, clock, **config)
    expected = []
    n = 0
    for _ in range(6):
        for _ in range(8):
            value(q.add(b"%07d" % n))
            expected.append(b"%07d" % n)
            n += 1
            clock.advance(0.01)
        for _ in range(3):
            assert q.remove().data == expected.pop(0)
    assert q.journal_rotations > 0 and q.journal_rewrites > 0
    q = restart(q, tmp_path, clock, **config)
    assert datas(q) == expected


def test_rewrite_when_empty(tmp_path, clock: Clock) -> None:
    """A journal past default_journal_size is rewritten as soon as the queue is empty."""
    q = open_queue(tmp_path, clock, default_journal_size=200)
    for i in range(10):
        value(q.add(b"%019d" % i))  # 41-byte records
    opened = q.remove(open_read=True)
    assert q.journal_rewrites == 0
    q.flush()  # the last remove leaves the queue empty: rewrite
    assert q.journal_rewrites == 1
    value(q.add(b"fresh"))
    assert journal_records(tmp_path) == [
        rec.SaveXid(opened.xid),
        rec.Add(opened.data, opened.add_time_ms, 0), rec.RemoveTentativeXid(opened.xid),
        rec.Add(b"fresh", int(clock.seconds() * 1000), 0),
    ]
    q = restart(q, tmp_path, clock)
    assert datas(q) == [opened.data, b"fresh"]


def test_size_rewrite_waits_for_compact_delay(tmp_path, clock: Clock) -> None:
    """After a size-triggered rewrite, the next waits for min_journal_compact_delay."""
    config = dict(max_journal_size=300, min_journal_compact_delay=60.0)
    q = open_queue(tmp_path, clock, **config)
    expected = []
    for i in range(40):
        value(q.add(b"%015d" % i))
        expected.append(b"%015d" % i)
        if i % 2:
            assert q.remove().data == expected.pop(0)
    assert q.journal_rewrites == 1
    assert q.journal.size > 300
    clock.advance(59)
    value(q.add(b"y"))
    assert q.journal_rewrites == 1
    clock.advance(1)
    value(q.add(b"z"))
    assert q.journal_rewrites == 2
    q = restart(q, tmp_path, clock, **config)
    assert datas(q) == expected + [b"y", b"z"]


def test_non_aggressive_policy_rotates_when_not_empty(tmp_path, clock: Clock) -> None:
    """With disable_aggressive_rewrites an empty queue is rewritten, a busy one rotated."""
    config = dict(disable_aggressive_rewrites=True, default_journal_size=1000,
                  max_memory_size=150, max_journal_size=1 << 20)
    q = open_queue(tmp_path, clock, **config)
    for i in range(4):
        value(q.add(b"%019d" % i))  # 40-byte records
        q.remove()
    # the last remove left the journal past max_memory_size with the queue empty: rewrite
    assert (q.journal_rewrites, q.journal_rotations, q.journal.size) == (1, 0, 5)
    for i in range(4, 9):
        value(q.add(b"%019d" % i))
    # past max_memory_size again, but items are queued: rotate
    assert (q.journal_rewrites, q.journal_rotations) == (1, 1)
    q = restart(q, tmp_path, clock, **config)
    assert datas(q) == [b"%019d" % i for i in range(4, 9)]


def test_graceful_close_rewrites_empty_queue(tmp_path, clock: Clock) -> None:
    """A graceful close of an empty queue leaves only its open reads in the journal."""
    q = open_queue(tmp_path, clock)
    for data in (b"a", b"b"):
        value(q.add(data))
    opened = q.remove(open_read=True)
    q.remove()
    value(q.close(graceful=True))
    assert journal_records(tmp_path) == [
        rec.SaveXid(1), rec.Add(b"a", opened.add_time_ms, 0), rec.RemoveTentativeXid(1)]
    q = open_queue(tmp_path, clock)
    assert datas(q) == [b"a"]


def test_destroy_journal_removes_files(tmp_path, clock: Clock) -> None:
    """destroy_journal deletes the queue's journal files."""
    q = open_queue(tmp_path, clock)
    value(q.add(b"a"))
    q.destroy_journal()
    assert files(tmp_path) == []


def test_durable_ack_waits_for_fsync(tmp_path, clock: Clock) -> None:
    """With durable_acks and a periodic fsync, the add fires only after the fsync ran."""
    syncs: list[int] = []
    q = open_queue(tmp_path, clock, sync_policy=0.5, fsync=syncs.append, durable_acks=True)
    d1 = q.add(b"a")
    d2 = q.add(b"b")
    assert value(d1) is PENDING and value(d2) is PENDING
    assert q.length == 2 and q.remove() is None  # stored at once, seen and acknowledged later
    clock.advance(0.5)
    assert value(d1) is True and value(d2) is True
    assert len(syncs) == 1


def test_always_sync_acknowledges_only_after_its_fsync(tmp_path, clock: Clock) -> None:
    """
    With sync_journal: always (and no durable_acks) an add fires only once the
    fsync covering it, running off the reactor thread, has finished; adds made
    meanwhile share the next fsync.
    """
    thread = ManualThread()
    journal = FileJournal(str(tmp_path), "q", clock, 0.0, fsync=lambda fd: None,
                          run_in_thread=thread)
    q = PersistentQueue("q", QueueConfig(sync_journal=0.0), journal, clock)
    q.setup()
    first = q.add(b"a")
    assert value(first) is PENDING and len(thread.jobs) == 1
    later = [q.add(b"b"), q.add(b"c")]
    assert all(value(d) is PENDING for d in later) and len(thread.jobs) == 1
    thread.run_next()
    assert value(first) is True
    assert all(value(d) is PENDING for d in later) and len(thread.jobs) == 1
    thread.run_next()
    assert all(value(d) is True for d in later)


def test_non_durable_ack_does_not_wait(tmp_path, clock: Clock) -> None:
    """Without durable_acks the add fires at once even with a pending periodic fsync."""
    q = open_queue(tmp_path, clock, sync_policy=0.5, fsync=lambda fd: None)
    assert value(q.add(b"a")) is True
    assert q.offer(b"b") is True  # (and offer answers without a Deferred)


def test_offer_of_a_durable_add_is_a_deferred(tmp_path, clock: Clock) -> None:
    """Acknowledging durably, offer's answer waits for the fsync: a Deferred."""
    syncs: list[int] = []
    q = open_queue(tmp_path, clock, sync_policy=0.5, fsync=syncs.append, durable_acks=True)
    answer = q.offer(b"a")
    assert isinstance(answer, Deferred) and value(answer) is PENDING
    clock.advance(0.5)
    assert value(answer) is True and len(syncs) == 1


def test_durable_ack_fsync_failure_errbacks(tmp_path, clock: Clock) -> None:
    """
    An fsync failure fails the add with a clear reason and drops the item (it is
    cut from the journal and from memory); once fsync works, adds go on.
    """
    state = {"fail": True}

    def fsync(fd: int) -> None:
        if state["fail"]:
            raise OSError(5, "Input/output error")

    q = open_queue(tmp_path, clock, sync_policy=0.5, fsync=fsync, durable_acks=True)
    d = q.add(b"a")
    clock.advance(0.5)
    with pytest.raises(JournalUnavailable, match="Input/output error"):
        value(d)
    assert q.journal_state == "failed"  # (cutting the file back needs an fsync too)
    with pytest.raises(JournalUnavailable):
        value(q.add(b"refused"))
    state["fail"] = False
    clock.advance(JOURNAL_RETRY_SECONDS)
    assert q.length == 0 and q.journal_state == "read-only"
    clock.advance(JOURNAL_RETRY_SECONDS)
    assert q.journal_state == "ok"
    d = q.add(b"b")
    clock.advance(0.5)
    assert value(d) is True
    q = restart(q, tmp_path, clock)
    assert datas(q) == [b"b"]


def test_config_reload_changes_read_behind_threshold(tmp_path, clock: Clock) -> None:
    """A lowered max_memory_size applies to the next add."""
    q = open_queue(tmp_path, clock)
    for i in range(4):
        value(q.add(b"%09d" % i))
    assert not q.in_read_behind
    q.config = attrs.evolve(q.config, max_memory_size=20)
    value(q.add(b"%09d" % 4))
    assert q.in_read_behind
    value(q.add(b"%09d" % 5))
    assert q.memory_length == 4
    assert datas(q) == [b"%09d" % i for i in range(6)]


def churn_in_read_behind(q: PersistentQueue, clock: Clock, cycles: int) -> tuple[list, list]:
    """
    Keep C{q} deep in read-behind while items flow through it, opening a read now and then.

    @return: (the data of the reads left open, the data still queued), in order.
    """
    queued: list[bytes] = []
    opened: list[bytes] = []
    n = 0
    for _ in range(30):
        value(q.add(b"%07d" % n))
        queued.append(b"%07d" % n)
        n += 1
        clock.advance(0.01)
    for cycle in range(cycles):
        for _ in range(8):
            value(q.add(b"%07d" % n))
            queued.append(b"%07d" % n)
            n += 1
            clock.advance(0.01)
        for k in range(8):
            if k == 0 and cycle % 3 == 0:
                item = q.remove(open_read=True)
                opened.append(item.data)
            else:
                item = q.remove()
            assert item.data == queued.pop(0)
    return opened, queued


def test_read_behind_with_rotations_survives_restart(tmp_path, clock: Clock) -> None:
    """Rotating while deep in read-behind, with open reads, loses and reorders nothing."""
    config = dict(max_memory_size=64, max_journal_size=1 << 30)
    q = open_queue(tmp_path, clock, **config)
    opened, queued = churn_in_read_behind(q, clock, 10)
    assert q.journal_rotations > 10 and q.in_read_behind
    q = restart(q, tmp_path, clock, **config)
    assert datas(q) == opened + queued


def test_checkpoint_pack_survives_restart(tmp_path, clock: Clock) -> None:
    """Packing at a checkpoint while reads are open loses and reorders nothing."""
    config = dict(max_memory_size=64, max_journal_size=256, min_journal_compact_delay=1000.0)
    q = open_queue(tmp_path, clock, **config)
    packs = []
    start_pack = q.journal.start_pack
    q.journal.start_pack = lambda *a, **kw: packs.append(a[0]) or start_pack(*a, **kw)
    opened, queued = churn_in_read_behind(q, clock, 10)
    assert packs, "the scenario must pack at least once"
    q = restart(q, tmp_path, clock, **config)
    assert datas(q) == opened + queued


def test_discard_old_when_full_in_read_behind(tmp_path, clock: Clock) -> None:
    """Dropping old items while in read-behind refills memory from disk and keeps order."""
    config = dict(max_memory_size=30, max_items=6, discard_old_when_full=True)
    q = open_queue(tmp_path, clock, **config)
    for i in range(10):
        assert value(q.add(b"%09d" % i)) is True
    assert q.in_read_behind and q.discarded == 4 and q.length == 6
    q = restart(q, tmp_path, clock, **config)
    assert datas(q) == [b"%09d" % i for i in range(4, 10)]


def test_expired_items_in_read_behind_are_swept(tmp_path, clock: Clock) -> None:
    """Expired items read back from disk are discarded like any other."""
    q = open_queue(tmp_path, clock, max_memory_size=30)
    now = int(clock.seconds() * 1000)
    for i in range(8):
        value(q.add(b"%09d" % i, expiry_ms=now + 1000 if i < 6 else 0))
    clock.advance(2)
    assert q.remove().data == b"%09d" % 6
    assert q.expired_items == 6
    assert datas(q) == [b"%09d" % 7]


def test_continue_survives_restart(tmp_path, clock: Clock) -> None:
    """An add with an xid (CONTINUE) confirms the open read and adds the item, after restart too."""
    q = open_queue(tmp_path, clock)
    value(q.add(b"a"))
    value(q.add(b"b"))
    opened = q.remove(open_read=True)
    value(q.add(b"c", xid=opened.xid))
    assert journal_records(tmp_path)[-1] == rec.Continue(opened.xid, b"c", opened.add_time_ms, 0)
    q = restart(q, tmp_path, clock)
    assert q.open_read_count == 0
    assert datas(q) == [b"b", b"c"]


def test_graceful_close_keeps_busy_journal(tmp_path, clock: Clock) -> None:
    """A graceful close of a queue with items does not rewrite its journal."""
    q = open_queue(tmp_path, clock)
    value(q.add(b"a"))
    value(q.add(b"b"))
    q.remove()
    value(q.close(graceful=True))
    assert q.journal_rewrites == 0
    assert len(journal_records(tmp_path)) == 3


def test_non_aggressive_rewrite_backs_off_when_open_reads_keep_journal_large(
        tmp_path, clock: Clock) -> None:
    """Without aggressive rewrites, a rewrite still half full of open reads pauses rewrites."""
    config = dict(disable_aggressive_rewrites=True, default_journal_size=200,
                  min_journal_compact_delay=10.0)
    q = open_queue(tmp_path, clock, **config)
    for i in range(5):
        value(q.add(b"%019d" % i))  # 40-byte records
    for _ in range(5):
        q.remove(open_read=True)  # the queue is empty, the journal 225 bytes
    value(q.add(b"x"))
    assert q.journal_rewrites == 1
    # the rewrite went through a pack, which holds SAVE_XID + five open reads (5 + 5 * 45)
    assert q.journal.archived_size == 230
    assert q.journal.size == 22  # ADDX "x", written after the rewrite
    q.remove()
    value(q.add(b"y"))
    q.remove()
    assert q.journal_rewrites == 1
    clock.advance(10)
    value(q.add(b"z"))
    assert q.journal_rewrites == 2
    q = restart(q, tmp_path, clock, **config)
    assert datas(q) == [b"%019d" % i for i in range(5)] + [b"z"]


def test_non_aggressive_rewrites_resume_shrinking_once_open_reads_are_confirmed(
        tmp_path, clock: Clock) -> None:
    """
    Without aggressive rewrites, open reads confirmed while rewrites pause are
    compacted away by the first rewrite after the delay, which pauses
    nothing: the next one comes as soon as the journal reaches
    default_journal_size again.
    """
    config = dict(disable_aggressive_rewrites=True, default_journal_size=200,
                  min_journal_compact_delay=10.0)
    q = open_queue(tmp_path, clock, **config)
    for i in range(5):
        value(q.add(b"%019d" % i))  # 40-byte records
    xids = [q.remove(open_read=True).xid for _ in range(5)]
    value(q.add(b"x"))
    q.remove()
    assert q.journal_rewrites == 1  # paused: the pack holds the five open reads
    for xid in xids:
        q.confirm_remove(xid)
    value(q.add(b"y"))
    q.remove()
    assert q.journal_rewrites == 1  # still paused, though nothing is left to keep
    clock.advance(10)
    value(q.add(b"z"))
    assert q.journal_rewrites == 2
    assert q.journal.size + q.journal.archived_size < 100  # SAVE_XID, then ADDX "z"
    q.remove()
    for _ in range(10):  # 23 bytes each: the journal reaches 200 bytes at the 8th
        value(q.add(b"w"))
        q.remove()
    assert q.journal_rewrites == 3  # no clock advance: rewrites did not pause
    value(q.add(b"v"))
    q = restart(q, tmp_path, clock, **config)
    assert datas(q) == [b"v"]


def test_non_aggressive_back_off_counts_what_a_rewrite_keeps_before_its_pack_is_written(
        tmp_path, clock: Clock) -> None:
    """
    A rewrite through a pack whose thread jobs have not run yet leaves the old
    journal on disk (C{archived_size}) until the pack is in place; whether
    rewrites pause is decided by what the rewrite keeps (one open read, not
    half of default_journal_size), so they do not pause.
    """
    config = dict(disable_aggressive_rewrites=True, default_journal_size=200,
                  min_journal_compact_delay=10.0)
    thread = ManualThread()
    journal = FileJournal(str(tmp_path), "q", clock, None, run_in_thread=thread)
    q = PersistentQueue("q", QueueConfig(**config), journal, clock)
    q.setup()
    for i in range(5):
        value(q.add(b"%019d" % i))  # 40-byte records
    for _ in range(4):
        q.remove()
    q.remove(open_read=True)  # the queue is empty, the journal 209 bytes
    value(q.add(b"x"))
    assert q.journal_rewrites == 1
    assert journal.packing and journal.archived_size == 209
    thread.run_all()
    assert not journal.packing and journal.archived_size == 50  # SAVE_XID + the open read
    q.remove()
    for _ in range(8):  # 23 bytes each: the journal reaches 200 bytes at the 7th
        value(q.add(b"w"))
        q.remove()
        thread.run_all()
    assert q.journal_rewrites == 2  # no clock advance: rewrites did not pause
    value(q.add(b"v"))
    thread.run_all()
    value(q.close())
    thread.run_all()
    q = open_queue(tmp_path, clock, **config)
    assert datas(q) == [b"%019d" % 4, b"v"]
