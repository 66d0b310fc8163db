"""
A hypothesis state machine: PersistentQueue against a plain list model.

Adds, removes, peeks, open reads, confirms, aborts, waits and restarts (close,
then a new queue replaying the same FileJournal folder) are applied to both;
contents and order must always agree.
"""

from __future__ import annotations

import shutil
import tempfile

import attrs
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import Clock

from kestrel.config import QueueConfig
from kestrel.item import QItem
from kestrel.journal.journal import FileJournal
from kestrel.journal.memory import MemoryJournal
from kestrel.queue import PersistentQueue
from tests.unit.test_queue import PENDING, value

#: Plain settings: everything in memory, one journal file.
PLAIN = QueueConfig()
#: Tiny limits: read-behind, a rotation on almost every add, rewrites when empty.
SMALL = QueueConfig(max_memory_size=32, default_journal_size=256, max_journal_size=1 << 30,
                    min_journal_compact_delay=5.0)
#: Deep read-behind with a small max_journal_size: checkpoints and packs.
PACKING = QueueConfig(max_memory_size=16, default_journal_size=1 << 20, max_journal_size=96,
                      min_journal_compact_delay=1000.0)


class QueueModel(RuleBasedStateMachine):
    """Drive a queue and a list model side by side."""

    config = PLAIN

    def __init__(self) -> None:
        super().__init__()
        self.folder = tempfile.mkdtemp(prefix="kestrel-model-")
        self.clock = Clock()
        self.clock.advance(1_767_225_600.0)
        self.queue = self.open_queue()
        self.items: list[bytes] = []
        self.opened: dict[int, bytes] = {}
        self.count = 0

    def open_queue(self) -> PersistentQueue:
        journal = FileJournal(self.folder, "model", self.clock, None)
        q = PersistentQueue("model", self.config, journal, self.clock)
        q.setup()
        return q

    def teardown(self) -> None:
        value(self.queue.close())
        shutil.rmtree(self.folder, ignore_errors=True)

    @rule(size=st.integers(0, 24))
    def add(self, size: int) -> None:
        data = b"%d:" % self.count + b"x" * size
        self.count += 1
        assert value(self.queue.add(data)) is True
        self.items.append(data)
        self.clock.advance(0.001)

    @rule()
    def remove(self) -> None:
        item = self.queue.remove()
        if self.items:
            assert item is not None and item.data == self.items.pop(0)
        else:
            assert item is None

    @rule()
    def peek(self) -> None:
        item = self.queue.peek()
        assert (item.data if item else None) == (self.items[0] if self.items else None)

    @rule()
    def open_read(self) -> None:
        item = self.queue.remove(open_read=True)
        if self.items:
            assert item is not None and item.data == self.items.pop(0)
            assert item.xid not in self.opened and item.xid != 0
            self.opened[item.xid] = item.data
        else:
            assert item is None

    @precondition(lambda self: self.opened)
    @rule(data=st.data())
    def confirm(self, data: st.DataObject) -> None:
        xid = data.draw(st.sampled_from(sorted(self.opened)))
        self.queue.confirm_remove(xid)
        del self.opened[xid]

    @precondition(lambda self: self.opened)
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        xid = data.draw(st.sampled_from(sorted(self.opened)))
        self.queue.unremove(xid)
        self.items.insert(0, self.opened.pop(xid))

    @rule(open_read=st.booleans())
    def wait_then_add(self, open_read: bool) -> None:
        """A blocked read is served by the next add (or at once when items are queued)."""
        d = self.queue.wait_remove(self.clock.seconds() + 1.0, open_read)
        if not self.items:
            assert value(d) is PENDING
            self.add(3)
        item = value(d)
        assert item.data == self.items.pop(0)
        if open_read:
            self.opened[item.xid] = item.data

    @rule()
    def wait_times_out(self) -> None:
        d = self.queue.wait_remove(self.clock.seconds() + 0.5)
        if self.items:
            assert value(d).data == self.items.pop(0)
        else:
            self.clock.advance(0.5)
            assert value(d) is None

    @rule()
    def flush(self) -> None:
        self.queue.flush()
        self.items.clear()

    @rule(seconds=st.sampled_from([0.5, 5.0]))
    def time_passes(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule()
    def restart(self) -> None:
        value(self.queue.close())
        self.queue = self.open_queue()
        self.items[:0] = [self.opened[xid] for xid in sorted(self.opened)]
        self.opened.clear()

    @invariant()
    def counters_agree(self) -> None:
        q = self.queue
        assert q.length == len(self.items)
        assert q.bytes == sum(map(len, self.items))
        assert q.open_read_count == len(self.opened)
        assert q.memory_length <= q.length
        assert q.waiter_count == 0


class SmallQueueModel(QueueModel):
    """The same model with tiny memory and journal limits."""

    config = SMALL


class PackingQueueModel(QueueModel):
    """The same model deep in read-behind, where checkpoints get packed."""

    config = PACKING


class DurableQueueModel(QueueModel):
    """
    The same model acknowledging durably (C{durable_acks}, an fsync every
    0.5 s): an added item is in C{length} at once but seen by no reader
    (remove, peek, a blocked read) until its fsync has run; then in order.
    """

    config = QueueConfig(durable_acks=True)

    def __init__(self) -> None:
        self.unsynced: list[tuple[bytes, Deferred[bool]]] = []
        super().__init__()

    def open_queue(self) -> PersistentQueue:
        journal = FileJournal(self.folder, "model", self.clock, 0.5)
        q = PersistentQueue("model", self.config, journal, self.clock)
        q.setup()
        return q

    def synced(self) -> None:
        """Move the acknowledged adds (a prefix: fsyncs cover one) to the seen items."""
        while self.unsynced and value(self.unsynced[0][1]) is True:
            self.items.append(self.unsynced.pop(0)[0])
        assert all(value(d) is PENDING for _, d in self.unsynced)

    @rule(size=st.integers(0, 24))
    def add(self, size: int) -> None:
        data = b"%d:" % self.count + b"x" * size
        self.count += 1
        d = self.queue.add(data)
        self.unsynced.append((data, d))
        self.synced()

    @rule(open_read=st.booleans())
    def wait_then_add(self, open_read: bool) -> None:
        """A blocked read is served only once an add's fsync ran (or at once if items are seen)."""
        d = self.queue.wait_remove(self.clock.seconds() + 1.0, open_read)
        if not self.items:
            assert value(d) is PENDING
            self.add(3)  # (an fsync it sets off, starting read-behind, shows the items)
            if not self.items:
                assert value(d) is PENDING  # (not before the fsync)
                self.clock.advance(0.5)
                self.synced()
        item = value(d)
        assert item.data == self.items.pop(0)
        if open_read:
            self.opened[item.xid] = item.data

    @rule()
    def wait_times_out(self) -> None:
        d = self.queue.wait_remove(self.clock.seconds() + 0.5)
        if not self.items:
            self.clock.advance(0.5)
            self.synced()
        got = value(d)
        if got is not None:
            assert got.data == self.items.pop(0)

    @rule(seconds=st.sampled_from([0.5, 5.0]))
    def time_passes(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.synced()

    @rule()
    def restart(self) -> None:
        value(self.queue.close())  # (its last fsync acknowledges every add)
        self.synced()
        assert not self.unsynced
        self.queue = self.open_queue()
        self.items[:0] = [self.opened[xid] for xid in sorted(self.opened)]
        self.opened.clear()

    @rule()
    def flush(self) -> None:
        self.queue.flush()  # (an fsync its removes set off shows items it then removes)
        self.synced()
        self.items.clear()

    @invariant()
    def counters_agree(self) -> None:
        # (any operation may set off an fsync: a rotation, read-behind starting)
        self.synced()
        q = self.queue
        unseen = [data for data, _ in self.unsynced]
        assert q.length == len(self.items) + len(unseen)
        assert q.bytes == sum(map(len, self.items + unseen))
        assert [item.data for item in q.memory_items()] == self.items[:q.memory_length]
        assert q.open_read_count == len(self.opened)
        assert q.waiter_count == 0


class SmallDurableQueueModel(DurableQueueModel):
    """The durable model in read-behind, with rotations and rewrites."""

    config = attrs.evolve(SMALL, durable_acks=True)


class PackingDurableQueueModel(DurableQueueModel):
    """The durable model deep in read-behind, where checkpoints get packed."""

    config = attrs.evolve(PACKING, durable_acks=True)


TestQueueModel = QueueModel.TestCase
TestSmallQueueModel = SmallQueueModel.TestCase
TestPackingQueueModel = PackingQueueModel.TestCase
TestPackingQueueModel.settings = settings(stateful_step_count=80)
TestDurableQueueModel = DurableQueueModel.TestCase
TestSmallDurableQueueModel = SmallDurableQueueModel.TestCase
TestPackingDurableQueueModel = PackingDurableQueueModel.TestCase
TestPackingDurableQueueModel.settings = settings(stateful_step_count=80)


class WaiterRaces(RuleBasedStateMachine):
    """
    Blocked readers that time out, are cancelled, or hand their item back,
    racing adds and aborts: no item is ever lost or delivered twice, and no
    item sits in the queue while a reader waits.
    """

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.clock.advance(1_767_225_600.0)
        self.queue = PersistentQueue("races", QueueConfig(), MemoryJournal(), self.clock)
        self.queue.setup()
        self.count = 0
        self.added: list[bytes] = []
        self.consumed: list[bytes] = []
        self.opened: dict[int, bytes] = {}
        self.pending: list[Deferred] = []
        self.handed_back = 0

    def _got(self, item: QItem | None, open_read: bool, hand_back: bool) -> None:
        if item is None:
            return
        if not open_read:
            self.consumed.append(item.data)
        elif hand_back:
            self.handed_back += 1
            self.queue.unremove(item.xid)  # its client went away: back to the head
        else:
            assert item.xid not in self.opened
            self.opened[item.xid] = item.data

    @rule(timeout=st.sampled_from([0.1, 0.5, 2.0]), open_read=st.booleans(),
          hand_back=st.booleans())
    def wait(self, timeout: float, open_read: bool, hand_back: bool) -> None:
        d = self.queue.wait_remove(self.clock.seconds() + timeout, open_read)
        d.addCallback(self._got, open_read, hand_back and open_read)
        d.addErrback(lambda f: f.trap(CancelledError))
        self.pending.append(d)

    @rule()
    def add(self) -> None:
        data = b"%d" % self.count
        self.count += 1
        assert value(self.queue.add(data)) is True
        self.added.append(data)

    @precondition(lambda self: self.pending)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        data.draw(st.sampled_from(self.pending)).cancel()

    @precondition(lambda self: self.opened)
    @rule(data=st.data(), confirm=st.booleans())
    def finish_read(self, data: st.DataObject, confirm: bool) -> None:
        xid = data.draw(st.sampled_from(sorted(self.opened)))
        if confirm:
            self.queue.confirm_remove(xid)
            self.consumed.append(self.opened.pop(xid))
        else:
            self.queue.unremove(xid)
            del self.opened[xid]

    @rule(seconds=st.sampled_from([0.05, 0.3, 1.0]))
    def time_passes(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @invariant()
    def nothing_lost_or_doubled(self) -> None:
        self.pending = [d for d in self.pending if not d.called]
        queued = [item.data for item in self.queue._items]
        everywhere = self.consumed + list(self.opened.values()) + queued
        assert sorted(everywhere) == sorted(self.added)
        assert self.queue.waiter_count == len(self.pending)
        if self.pending:
            assert self.queue.length == 0


TestWaiterRaces = WaiterRaces.TestCase
TestWaiterRaces.settings = settings(max_examples=200, stateful_step_count=30)
