"""
Rotation, rewrite and pack with writes and open reads in flight.

An acknowledgement fired while the journal swaps its files can set off more
writes at once (a pipelined request served in the same call chain): they
must land in the new current file, and a second rotation or rewrite must not
start inside the first. Time is a L{Clock}; fsync runs inline; a "crash" is
a new queue replaying the same folder while the old one is left as it was.
"""

from __future__ import annotations

import os

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from kestrel.config import QueueConfig
from kestrel.journal.journal import FileJournal
from kestrel.journal.runner import run_inline
from kestrel.queue import PersistentQueue
from tests.support import ManualThread
from tests.unit.test_queue import datas, value


def open_queue(path, clock: Clock, *, sync_policy=0.2, run_in_thread=run_inline,
               **config) -> PersistentQueue:
    journal = FileJournal(str(path), "q", clock, sync_policy, run_in_thread=run_in_thread)
    q = PersistentQueue("q", QueueConfig(**config), journal, clock)
    q.setup()
    return q


def after_crash(path, clock: Clock) -> list[bytes]:
    """What a restarted server finds: replay the folder as it is now."""
    return datas(open_queue(path, clock, sync_policy=None))


def test_add_set_off_by_an_acknowledgement_during_a_rewrite_survives(tmp_path,
                                                                      clock: Clock) -> None:
    """
    Set Y1 (durable, waiting for its fsync: no reader sees it, and no
    rewrite holds it); its fsync
    acknowledges it and the pipelined set of Y2 runs from that
    acknowledgement. Y1, opened, and Y2, acknowledged, must both be replayed.
    """
    q = open_queue(tmp_path, clock, durable_acks=True, default_journal_size=1)
    acks: list[Deferred[bool]] = []
    d1 = q.add(b"Y1")
    d1.addCallback(lambda ok: acks.append(q.add(b"Y2")) or ok)
    assert q.remove(open_read=True) is None
    clock.advance(0.2)
    assert value(d1) is True and len(acks) == 1
    opened = q.remove(open_read=True)
    assert opened.data == b"Y1"
    clock.advance(0.2)
    assert value(acks[0]) is True
    assert after_crash(tmp_path, clock) == [b"Y1", b"Y2"]


def test_add_set_off_by_an_acknowledgement_during_a_rotation_survives(tmp_path,
                                                                       clock: Clock) -> None:
    """The same during a rotation: the write set off goes to the new file, after the swap."""
    q = open_queue(tmp_path, clock, durable_acks=True, max_memory_size=40,
                   default_journal_size=1 << 20, max_journal_size=1 << 30)
    acks: list[Deferred[bool]] = []
    d1 = q.add(b"a" * 30)
    d1.addCallback(lambda ok: acks.append(q.add(b"set off")) or ok)
    d2 = q.add(b"b" * 30)  # the journal is now past max_memory_size: this add rotates
    assert value(d1) is True and len(acks) == 1
    clock.advance(0.2)
    assert value(d2) is True and value(acks[0]) is True
    assert len([n for n in os.listdir(tmp_path) if n.startswith("q.")]) == 1
    assert sorted(after_crash(tmp_path, clock)) == sorted([b"a" * 30, b"b" * 30, b"set off"])


def test_rewrite_is_not_started_inside_another(tmp_path, clock: Clock) -> None:
    """An acknowledgement fired by a rewrite cannot start a second one inside it."""
    q = open_queue(tmp_path, clock, durable_acks=True, default_journal_size=1)
    started: list[int] = []
    deepest: list[int] = [0]
    original = q.journal.rewrite

    def rewrite(*args, **kwargs):
        started.append(1)
        deepest[0] = max(deepest[0], len(started))
        try:
            return original(*args, **kwargs)
        finally:
            started.pop()

    q.journal.rewrite = rewrite
    d1 = q.add(b"Y1")
    d1.addCallback(lambda ok: (q.remove(), q.add(b"Y2")) and ok)
    q.remove(open_read=True)
    clock.advance(0.2)
    assert q.journal_rewrites >= 1
    assert deepest[0] == 1, "a rewrite started inside a rewrite"


def test_pack_in_a_thread_with_writes_and_open_reads_in_flight(tmp_path, clock: Clock) -> None:
    """
    Read-behind, a checkpoint and a pack written in a thread while adds, opens
    and confirms go on: the replay after a crash holds exactly the live items.
    """
    thread = ManualThread()
    q = open_queue(tmp_path, clock, sync_policy=None, run_in_thread=thread,
                   max_memory_size=64, max_journal_size=256, default_journal_size=1 << 20)
    live: list[bytes] = []
    for i in range(40):
        data = b"%08d" % i
        assert value(q.add(data)) is True
        live.append(data)
        if i % 3 == 0:
            item = q.remove(open_read=True)
            if i % 2:
                q.confirm_remove(item.xid)
                live.remove(item.data)
            else:
                q.unremove(item.xid)
        if i % 7 == 0:
            thread.run_all()
    thread.run_all()
    assert sorted(after_crash(tmp_path, clock)) == sorted(live)
