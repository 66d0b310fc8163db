"""
Under a durable policy an added item is seen by no reader until the fsync
covering its record has succeeded (docs/journal.md, "Visibility under a
durable policy"); if that fsync fails, no reader ever sees it.

Time is a L{Clock}; fsyncs are held back (C{ManualThread}, or a period of
0.5 s) and made to fail on demand. Every test that adds runs twice: adding
through C{queue.add} (a Deferred) and through C{queue.offer}'s C{then}
(the memcache C{set}'s way, L{kestrel.unsynced.DurableAdd}).
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterator

import pytest
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.logger import capturedLogs
from twisted.python.failure import Failure

from kestrel.config import QueueConfig
from kestrel.errors import JournalUnavailable
from kestrel.journal.journal import FileJournal
from kestrel.journal.memory import MemoryJournal
from kestrel.protocols.memcache import MemcacheFactory
from kestrel.queue import JOURNAL_RETRY_SECONDS, PersistentQueue
from kestrel.settled import in_deferred
from tests.support import ManualThread, StringClient, make_server
from tests.unit.test_queue import PENDING, datas, value
from tests.unit.test_queue_file import open_queue, restart


class Fsync:
    """An fsync that fails while C{failing} is set (EIO), and counts its calls."""

    def __init__(self) -> None:
        self.failing = False
        self.calls = 0

    def __call__(self, fd: int) -> None:
        self.calls += 1
        if self.failing:
            raise OSError(errno.EIO, "Input/output error")


def always_queue(path, clock: Clock, **config) -> tuple[PersistentQueue, ManualThread]:
    """A queue under C{sync_journal: always} whose fsyncs run only when the test says."""
    thread = ManualThread()
    journal = FileJournal(str(path), "q", clock, 0.0, fsync=lambda fd: None,
                          run_in_thread=thread)
    q = PersistentQueue("q", QueueConfig(sync_journal=0.0, **config), journal, clock)
    q.setup()
    return q, thread


Adder = Callable[..., "Deferred[bool]"]


@pytest.fixture(params=["deferred", "then"])
def add(request: pytest.FixtureRequest) -> Iterator[Adder]:
    """
    How a test adds, as a Deferred of the answer: C{queue.add}, or
    C{queue.offer} with C{then}, the way the memcache C{set} adds (no
    Deferred), checking C{then}'s promise: called once, never before
    C{offer} returned, and only when C{offer} returned C{None}.
    """
    if request.param == "deferred":
        yield lambda q, data, **kwargs: q.add(data, **kwargs)
        return
    broken: list[str] = []

    def add_then(q: PersistentQueue, data: bytes, **kwargs: object) -> Deferred[bool]:
        told: Deferred[bool] = Deferred()
        calls: list[object] = []
        returned = False

        def then(outcome: bool | Failure) -> None:
            calls.append(outcome)
            if not returned or answer is not None or len(calls) > 1:
                broken.append(f"then({outcome!r}) for {data!r}")
            if isinstance(outcome, Failure):
                told.errback(outcome)
            else:
                told.callback(outcome)

        answer = q.offer(data, then=then, **kwargs)  # type: ignore[call-overload]
        returned = True
        return told if answer is None else in_deferred(answer)

    yield add_then
    assert broken == []


def seen(q: PersistentQueue) -> list[bytes]:
    """What readers may have now, head first (memory only)."""
    return [item.data for item in q.memory_items()]


def test_a_blocked_reader_is_woken_only_after_the_fsync(add: Adder, tmp_path, clock: Clock) -> None:
    """No reader sees the add before its fsync: not remove, peek, plain_head nor a waiter."""
    q, thread = always_queue(tmp_path, clock)
    peeker = q.wait_peek(clock.seconds() + 10)  # (first in line: it passes the wake-up on)
    waiter = q.wait_remove(clock.seconds() + 10)
    ack = add(q, b"a")
    assert value(ack) is PENDING and value(waiter) is PENDING and value(peeker) is PENDING
    assert q.remove() is None and q.peek() is None and q.plain_head() is None
    assert q.length == 1 and q.bytes == 1 and q.unsynced_count == 1 and seen(q) == []
    thread.run_all()
    assert value(ack) is True
    assert value(peeker).data == b"a" and value(waiter).data == b"a"
    assert q.length == 0 and q.unsynced_count == 0


def test_items_are_seen_in_record_order_once_their_fsyncs_ran(add: Adder, tmp_path,
                                                              clock: Clock) -> None:
    """FIFO across seen and unseen items, group commits and an aborted read."""
    q, thread = always_queue(tmp_path, clock)
    first = add(q, b"1")
    thread.run_all()
    assert value(first) is True
    opened = q.remove(open_read=True)
    assert opened.data == b"1"
    thread.run_all()
    acks = [add(q, b"2")]  # (its fsync starts at once)
    acks.append(add(q, b"3"))  # (waits for the next one)
    q.unremove(opened.xid)  # (an aborted read: back at the head, it was durable)
    assert seen(q) == [b"1"]
    thread.run_next()
    assert [value(d) for d in acks] == [True, PENDING] and seen(q) == [b"1", b"2"]
    acks.append(add(q, b"4"))
    thread.run_all()
    assert [value(d) for d in acks] == [True, True, True]
    assert [q.remove().data for _ in range(4)] == [b"1", b"2", b"3", b"4"]
    assert q.remove() is None


def test_a_failed_fsync_refuses_the_add_and_no_reader_ever_gets_it(add: Adder, tmp_path,
                                                                  clock: Clock) -> None:
    """
    The producer is refused, the waiter is not served, and the recovery
    leaves memory and journal in agreement: the item is in neither.
    """
    fsync = Fsync()
    q = open_queue(tmp_path, clock, sync_policy=0.5, fsync=fsync, durable_acks=True)
    value(add(q, b"kept"))
    clock.advance(0.5)
    assert q.remove().data == b"kept"
    waiter = q.wait_remove(clock.seconds() + 60)
    fsync.failing = True
    ack = add(q, b"refused")
    clock.advance(0.5)
    with pytest.raises(JournalUnavailable, match="Input/output error"):
        value(ack)
    assert value(waiter) is PENDING
    fsync.failing = False
    clock.advance(JOURNAL_RETRY_SECONDS)
    assert value(waiter) is PENDING
    assert q.length == 0 and q.unsynced_count == 0 and seen(q) == []
    clock.advance(JOURNAL_RETRY_SECONDS)
    assert q.journal_state == "ok"
    later = add(q, b"later")
    assert value(waiter) is PENDING
    clock.advance(0.5)
    assert value(later) is True and value(waiter).data == b"later"
    q = restart(q, tmp_path, clock)
    assert datas(q) == []


def test_a_failed_fsync_drops_every_unseen_item_it_covered(add: Adder, tmp_path,
                                                           clock: Clock) -> None:
    """Seen items stay; the unseen ones the failed fsync covered are gone from memory and disk."""
    fsync = Fsync()
    q = open_queue(tmp_path, clock, sync_policy=0.5, fsync=fsync, durable_acks=True)
    value(add(q, b"a"))
    clock.advance(0.5)
    fsync.failing = True
    acks = [add(q, b"b"), add(q, b"c")]
    clock.advance(0.5)
    for ack in acks:
        with pytest.raises(JournalUnavailable):
            value(ack)
    fsync.failing = False
    clock.advance(JOURNAL_RETRY_SECONDS)
    assert seen(q) == [b"a"] and q.length == 1 and q.unsynced_count == 0
    assert q.remove().data == b"a" and q.remove() is None
    clock.advance(JOURNAL_RETRY_SECONDS)
    q = restart(q, tmp_path, clock)
    assert datas(q) == []


def test_continue_confirms_at_once_and_shows_its_item_after_the_fsync(add: Adder, tmp_path,
                                                                      clock: Clock) -> None:
    """A CONTINUE: the open read is confirmed; the new item waits for the fsync like any add."""
    q, thread = always_queue(tmp_path, clock)
    value(add(q, b"job"))
    thread.run_all()
    opened = q.remove(open_read=True)
    ack = add(q, b"next", xid=opened.xid)
    assert q.open_read_count == 0 and q.remove() is None
    thread.run_all()
    assert value(ack) is True and q.remove().data == b"next"


def test_read_behind_reads_back_no_record_before_its_fsync(add: Adder, tmp_path,
                                                           clock: Clock) -> None:
    """
    In read-behind an add is only on disk: the fill stops at what the
    fsyncs made durable, and a waiter gets the item only after its fsync.
    """
    q, thread = always_queue(tmp_path, clock, max_memory_size=4)
    for data in (b"aa", b"bb", b"cc"):
        value(add(q, data))
        thread.run_all()
    assert q.in_read_behind
    assert [q.remove().data for _ in range(3)] == [b"aa", b"bb", b"cc"]
    waiter = q.wait_remove(clock.seconds() + 60)
    ack = add(q, b"dd")
    assert q.in_read_behind and q.length == 1 and q.unsynced_count == 0
    assert value(waiter) is PENDING and q.remove() is None
    thread.run_all()
    assert value(ack) is True and value(waiter).data == b"dd"


def test_read_behind_waits_for_unseen_items_held_in_memory(add: Adder, tmp_path,
                                                           clock: Clock) -> None:
    """
    An item held unseen in memory is older than any read back from disk:
    nothing is read back while it waits, so the order stays the records'.
    """
    q, thread = always_queue(tmp_path, clock, max_memory_size=4)
    value(add(q, b"x"))
    thread.run_all()
    first = add(q, b"aaaa")  # (unseen in memory; memory is now full)
    later = add(q, b"bb")  # (read-behind: on disk only)
    assert q.in_read_behind and q.unsynced_count == 1
    assert q.remove().data == b"x"
    assert q.remove() is None and seen(q) == []
    while thread.jobs:  # (fsyncs and a rotation's, one at a time)
        thread.run_next()
        if value(first) is PENDING:
            assert seen(q) == []
        if value(later) is PENDING:
            assert b"bb" not in seen(q)
    assert value(later) is True
    assert [q.remove().data for _ in range(2)] == [b"aaaa", b"bb"]


def test_read_behind_reads_a_rotated_file_only_as_far_as_it_is_durable(add: Adder, tmp_path,
                                                                      clock: Clock) -> None:
    """
    A rotation renames the file holding an add whose fsync still runs: the
    reader, reaching that file, stops where that file's fsyncs got to.
    """
    q, thread = always_queue(tmp_path, clock, max_memory_size=4,
                             default_journal_size=1 << 20, max_journal_size=1 << 30)
    for data in (b"a1", b"a2", b"a3"):
        value(add(q, data))
        thread.run_all()
    assert q.in_read_behind
    ack = add(q, b"dd")  # (after a rotation: its file's fsync waits for the rotation's)
    thread.run_next()  # (the rotation's fsyncs; dd's fsync now runs)
    assert value(ack) is PENDING
    later = add(q, b"ee")  # (rotates the file holding dd, its fsync still running)
    assert q.journal_rotations == 4
    assert [q.remove().data for _ in range(3)] == [b"a1", b"a2", b"a3"]
    assert q.remove() is None and value(ack) is PENDING
    thread.run_all()
    assert value(ack) is True and value(later) is True
    assert [q.remove().data for _ in range(2)] == [b"dd", b"ee"]


def test_no_read_back_overtakes_an_unseen_item(add: Adder, tmp_path, clock: Clock) -> None:
    """
    One fsync covers two unseen items and a later one on disk only; the
    first shown wakes a reader, whose remove must not read the disk item back
    before the second is shown: readers get them in record order.
    """
    q, thread = always_queue(tmp_path, clock, max_memory_size=8,
                             default_journal_size=1 << 20, max_journal_size=1 << 30)
    value(add(q, b"vv"))
    thread.run_all()
    acks = [add(q, data) for data in (b"gg", b"h1", b"h2")]
    acks.append(add(q, b"bb"))  # (read-behind has started: on disk only)
    assert q.in_read_behind and q.unsynced_count == 3
    assert q.remove().data == b"vv"
    waiters = [q.wait_remove(clock.seconds() + 60) for _ in range(3)]
    thread.run_all()
    assert all(value(ack) is True for ack in acks)
    assert [value(w).data for w in waiters] == [b"gg", b"h1", b"h2"]
    assert q.remove().data == b"bb"


def test_a_rewrite_waits_for_unseen_items_then_runs(add: Adder, tmp_path, clock: Clock) -> None:
    """
    A rewrite from memory cannot hold an item waiting for its fsync: it is
    put off quietly (no rotation instead), and runs once the item is shown.
    """
    q, thread = always_queue(tmp_path, clock, default_journal_size=1 << 20,
                             max_memory_size=1 << 20, max_journal_size=300,
                             disable_aggressive_rewrites=True)
    value(add(q, b"k1"))
    value(add(q, b"k2"))
    n = 0
    while q.journal.size < 280:
        value(add(q, b"item%d" % n))
        thread.run_all()
        q.remove()
        thread.run_all()
        n += 1
    ack = add(q, b"X")
    with capturedLogs() as events:
        q.remove()  # (the journal is past max_journal_size: a rewrite is due)
    assert q.journal_rewrites == 0 and q.journal_rotations == 0
    assert not any("Not rewriting" in e.get("log_format", "") for e in events)
    thread.run_all()
    assert value(ack) is True and q.journal_rewrites == 1
    q = restart(q, tmp_path, clock)
    rest = datas(q)
    assert len(rest) == 2 and rest[-1] == b"X"


def test_a_memory_journal_shows_a_durable_add_at_once(add: Adder, clock: Clock) -> None:
    """A memory journal's writes are "durable" at once: the waiter is served by the add."""
    q = PersistentQueue("q", QueueConfig(durable_acks=True), MemoryJournal(), clock)
    q.setup()
    waiter = q.wait_remove(clock.seconds() + 1)
    assert value(add(q, b"x")) is True
    assert value(waiter).data == b"x" and q.unsynced_count == 0


def test_flush_leaves_unseen_items(add: Adder, tmp_path, clock: Clock) -> None:
    """flush removes what readers may have; an item waiting for its fsync is seen after it."""
    q, thread = always_queue(tmp_path, clock)
    value(add(q, b"old"))
    thread.run_all()
    ack = add(q, b"new")
    q.flush()
    assert q.length == 1
    thread.run_all()
    assert value(ack) is True and q.remove().data == b"new"


def test_close_acknowledges_and_keeps_unseen_items(add: Adder, tmp_path, clock: Clock) -> None:
    """Closing fsyncs the journal: the pending add is acknowledged and replayed."""
    fsync = Fsync()
    q = open_queue(tmp_path, clock, sync_policy=0.5, fsync=fsync, durable_acks=True)
    ack = add(q, b"a")
    value(q.close(graceful=True))
    assert value(ack) is True
    q = restart(q, tmp_path, clock)
    assert datas(q) == [b"a"]


def test_a_full_queue_counts_unseen_items(add: Adder, tmp_path, clock: Clock) -> None:
    """Unseen items hold their room: max_items refuses the next add before their fsync."""
    q, thread = always_queue(tmp_path, clock, max_items=1)
    ack = add(q, b"a")
    assert value(add(q, b"b")) is False
    thread.run_all()
    assert value(ack) is True and q.length == 1


# -- through the memcache protocol (a server on a Clock, fsyncs held back)


def memcache_pair(tmp_path, clock: Clock) -> tuple[object, StringClient, StringClient,
                                                   ManualThread]:
    """
    A server under C{sync_journal: always} whose fsyncs run in C{thread}
    (C{journal_fsync: thread}), a reader and a producer connection.
    """
    thread = ManualThread()
    server = make_server(clock, tmp_path,
                         "journal_fsync: thread\ndefault: {sync_journal: always}\n",
                         run_in_thread=thread)
    factory = MemcacheFactory(server)
    return server, StringClient(factory), StringClient(factory), thread


def test_a_blocked_memcache_get_gets_a_set_only_after_its_fsync(tmp_path,
                                                               clock: Clock) -> None:
    """The producer's STORED and the reader's VALUE both wait for the fsync."""
    server, reader, producer, thread = memcache_pair(tmp_path, clock)
    assert reader.send(b"get q/t=10000\r\n") == b""
    assert producer.send(b"set q 0 0 1\r\na\r\n") == b""
    assert reader.take() == b""
    other = StringClient(MemcacheFactory(server))
    assert other.send(b"get q\r\n") == b"END\r\n"
    assert other.send(b"get q/peek\r\n") == b"END\r\n"
    thread.run_all()
    assert producer.take() == b"STORED\r\n"
    assert reader.take() == b"VALUE q/t=10000 0 1\r\na\r\nEND\r\n"
    server.collection.stopService()


def test_a_blocked_memcache_get_gets_a_set_only_after_the_turns_fsync(tmp_path,
                                                                    clock: Clock) -> None:
    """With the default C{journal_fsync: reactor}, the fsync at the turn's end shows the item."""
    server = make_server(clock, tmp_path, "default: {sync_journal: always}\n")
    factory = MemcacheFactory(server)
    reader, producer, other = StringClient(factory), StringClient(factory), StringClient(factory)
    assert reader.send(b"get q/t=10000\r\n") == b""
    assert producer.send(b"set q 0 0 1\r\na\r\n") == b""
    assert other.send(b"get q\r\n") == b"END\r\n"
    assert (producer.take(), reader.take()) == (b"", b"")
    clock.advance(0)
    assert producer.take() == b"STORED\r\n"
    assert reader.take() == b"VALUE q/t=10000 0 1\r\na\r\nEND\r\n"
    server.collection.stopService()


def test_a_set_whose_fsync_fails_never_reaches_a_blocked_memcache_get(tmp_path,
                                                                     clock: Clock) -> None:
    """SERVER_ERROR for the producer; the reader goes on waiting, then times out empty."""
    server, reader, producer, thread = memcache_pair(tmp_path, clock)
    assert reader.send(b"get q/t=10000\r\n") == b""
    assert producer.send(b"set q 0 0 1\r\na\r\n") == b""
    thread.fail_all(OSError(errno.EIO, "Input/output error"))
    assert producer.take().startswith(b"SERVER_ERROR")
    for _ in range(5):  # (the recovery, its fsyncs run as they come)
        clock.advance(JOURNAL_RETRY_SECONDS)
        thread.run_all()
    assert reader.take() == b""
    clock.advance(10)
    assert reader.take() == b"END\r\n"
    assert server.collection.queue("q").length == 0
    server.collection.stopService()
