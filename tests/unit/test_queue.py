"""
PersistentQueue behaviour on a MemoryJournal, with time driven by a Clock.

Read-behind, restarts and durable acknowledgements need files: they are in
test_queue_file.py.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs
import pytest
from twisted.internet.defer import CancelledError, Deferred, fail
from twisted.internet.task import Clock
from twisted.logger import capturedLogs
from twisted.python.failure import Failure

from kestrel.config import QueueConfig
from kestrel.errors import JournalUnavailable
from kestrel.item import QItem, memcache_expiry_ms, relative_expiry_ms
from kestrel.journal import records as rec
from kestrel.journal.memory import MemoryJournal
from kestrel.journal.records import MAX_XID
from kestrel.queue import PersistentQueue

PENDING = object()


def value(d: Deferred):
    """Return what C{d} fired with; raise its failure; PENDING if it has not fired."""
    out: list = []

    def keep(result):
        out.append(result)
        return None if isinstance(result, Failure) else result

    d.addBoth(keep)
    if not out:
        return PENDING
    if isinstance(out[0], Failure):
        out[0].raiseException()
    return out[0]


class ReplayJournal(MemoryJournal):
    """A MemoryJournal that replays the given records, as a journal file would."""

    def __init__(self, replayed: Iterable[rec.Record]) -> None:
        super().__init__(keep_records=True)
        self.replayed = list(replayed)

    def replay(self, apply, reset=None) -> None:
        for record in self.replayed:
            apply(record)


def make(clock: Clock, journal: MemoryJournal | None = None, name: str = "q",
         **config) -> PersistentQueue:
    """A set-up queue on a recording MemoryJournal."""
    q = PersistentQueue(name, QueueConfig(**config), journal or MemoryJournal(keep_records=True),
                        clock)
    q.setup()
    return q


def datas(q: PersistentQueue) -> list[bytes]:
    """Remove everything left and return the payloads in order."""
    out = []
    while (item := q.remove()) is not None:
        out.append(item.data)
    return out


def ms(clock: Clock) -> int:
    return int(clock.seconds() * 1000)


# ----- adding and removing


def test_fifo_and_counters(clock: Clock) -> None:
    """Items come out in the order they went in; length, bytes and totals follow."""
    q = make(clock)
    for data in (b"a", b"bb", b"ccc"):
        assert value(q.add(data)) is True
    assert (q.length, q.bytes, q.total_items, q.put_items, q.put_bytes) == (3, 6, 3, 3, 6)
    assert (q.memory_length, q.memory_bytes) == (3, 6)
    assert q.peek().data == b"a"
    assert datas(q) == [b"a", b"bb", b"ccc"]
    assert (q.length, q.bytes, q.total_items, q.memory_bytes) == (0, 0, 3, 0)
    assert q.remove() is None


def test_a_queue_keeps_every_attribute_in_its_slots(clock: Clock) -> None:
    """
    A queue's attributes are slots (the queue's own, and what its mixins
    set), so its instance dict stays empty through adds, reads, opens,
    expiry and a close: calls of its methods stay specialized.
    """
    q = make(clock, max_age=5.0, open_transaction_timeout=1.0)
    q.expire_to = lambda item: None
    value(q.add(b"a"))
    value(q.add(b"b"))
    item = q.remove(open_read=True)
    assert item is not None
    q.unremove(item.xid)
    clock.advance(10)
    q.discard_expired()
    value(q.add(b"c"))
    assert datas(q) == [b"c"]
    q.close()
    assert vars(q) == {}


def test_add_journals_addx_then_remove(clock: Clock) -> None:
    """An add journals the item with its add time and expiry; a remove journals REMOVE."""
    q = make(clock)
    now = ms(clock)
    value(q.add(b"x", expiry_ms=now + 5000))
    q.remove()
    assert q.journal.records == [rec.Add(b"x", now, now + 5000), rec.REMOVE]


def test_add_time_can_be_given(clock: Clock) -> None:
    """add_time_ms sets the item's add time (used when moving items between queues)."""
    q = make(clock)
    value(q.add(b"x", add_time_ms=1234))
    assert q.peek().add_time_ms == 1234


def test_max_items_refuses(clock: Clock) -> None:
    """A queue at max_items refuses the add and keeps what it had."""
    q = make(clock, max_items=2)
    assert [value(q.add(b"%d" % i)) for i in range(3)] == [True, True, False]
    assert datas(q) == [b"0", b"1"]


def test_max_size_is_checked_before_adding(clock: Clock) -> None:
    """max_size refuses only once the queue holds max_size bytes: it may exceed it by one item."""
    q = make(clock, max_size=5)
    assert value(q.add(b"1234")) is True
    assert value(q.add(b"5678")) is True
    assert q.bytes == 8
    assert value(q.add(b"9")) is False


def test_max_item_size(clock: Clock) -> None:
    """An item of exactly max_item_size bytes is accepted; one byte more is refused."""
    q = make(clock, max_item_size=3)
    assert value(q.add(b"abc")) is True
    assert value(q.add(b"abcd")) is False
    assert q.length == 1


def test_max_item_size_refuses_even_when_discarding(clock: Clock) -> None:
    """discard_old_when_full never makes room for an item over max_item_size."""
    q = make(clock, max_item_size=1, max_items=1, discard_old_when_full=True)
    value(q.add(b"a"))
    assert value(q.add(b"bb")) is False
    assert datas(q) == [b"a"] and q.discarded == 0


def test_discard_old_when_full(clock: Clock) -> None:
    """With discard_old_when_full a full queue drops its oldest items and accepts the new one."""
    q = make(clock, max_items=2, discard_old_when_full=True)
    for data in (b"a", b"b", b"c", b"d"):
        assert value(q.add(data)) is True
    assert q.discarded == 2
    assert q.journal.records.count(rec.REMOVE) == 2
    assert datas(q) == [b"c", b"d"]


def test_config_change_takes_effect_at_once(clock: Clock) -> None:
    """Assigning a new config applies its limits to the very next add."""
    q = make(clock)
    value(q.add(b"a"))
    value(q.add(b"b"))
    q.config = attrs.evolve(q.config, max_items=2)
    assert value(q.add(b"c")) is False
    q.config = attrs.evolve(q.config, max_items=None)
    assert value(q.add(b"c")) is True


@pytest.mark.parametrize("limit", [{"max_size": 2}, {"max_items": 2}])
def test_an_add_meets_the_limits_of_a_config_assigned_since(clock: Clock, limit: dict) -> None:
    """Limits assigned after the queue was made, and taken away again, apply to the next add."""
    q = make(clock)
    value(q.add(b"a"))
    value(q.add(b"b"))
    q.config = attrs.evolve(q.config, **limit)
    assert value(q.add(b"c")) is False
    q.config = attrs.evolve(q.config, discard_old_when_full=True)
    assert value(q.add(b"c")) is True and q.discarded == 1
    q.config = attrs.evolve(q.config, **{name: None for name in limit})
    assert value(q.add(b"d")) is True and q.discarded == 1
    assert datas(q) == [b"b", b"c", b"d"]


@pytest.mark.parametrize("expiring", ["max_age", "expiry"])
def test_an_add_discards_the_expired_head_first(clock: Clock, expiring: str) -> None:
    """With no limit but an expired head (its own expiry, or a max_age since), the add sweeps it."""
    q = make(clock)
    value(q.add(b"old", expiry_ms=ms(clock) + 1000 if expiring == "expiry" else 0))
    clock.advance(5)
    if expiring == "max_age":
        q.config = attrs.evolve(q.config, max_age=3.0)
    assert value(q.add(b"new")) is True
    assert q.expired_items == 1 and q.length == 1 and datas(q) == [b"new"]


def test_fanout_only_master_stores_nothing(clock: Clock) -> None:
    """A fanout_only master reports success and stores and journals nothing; a child stores."""
    master = make(clock, name="m", fanout_only=True)
    child = make(clock, name="m+c", fanout_only=True)
    assert value(master.add(b"x")) is True
    assert (master.length, master.total_items, master.journal.records) == (0, 0, [])
    assert value(child.add(b"x")) is True
    assert child.length == 1


def test_fanout_master_flag_is_settable(clock: Clock) -> None:
    """The collection may tell a queue it is not a fanout master: then fanout_only stores."""
    q = make(clock, fanout_only=True)
    q.is_fanout_master = False
    value(q.add(b"x"))
    assert q.length == 1


def test_closed_queue_refuses_and_gives_nothing(clock: Clock) -> None:
    """After close, adds are refused, reads return nothing, and the journal is closed."""
    q = make(clock)
    value(q.add(b"a"))
    assert value(q.close()) is None
    assert q.journal.closed and q.is_closed
    assert value(q.add(b"b")) is False
    assert q.remove() is None and q.peek() is None
    assert value(q.close()) is None


def test_add_with_xid_continues(clock: Clock) -> None:
    """add with an xid confirms that open read and appends, in one CONTINUE record."""
    q = make(clock)
    value(q.add(b"a"))
    item = q.remove(open_read=True)
    value(q.add(b"b", xid=item.xid))
    assert q.open_read_count == 0
    assert q.journal.records[-1] == rec.Continue(item.xid, b"b", ms(clock), 0)
    assert datas(q) == [b"b"]


def test_journal_write_failing_at_once_stores_nothing(clock: Clock) -> None:
    """If the journal write fails at once, the add fails and the item is not queued."""

    class BrokenJournal(MemoryJournal):
        def add(self, item: QItem) -> Deferred[None]:
            return fail(OSError("disk full"))

    q = make(clock, BrokenJournal())
    with capturedLogs() as events:
        with pytest.raises(JournalUnavailable, match="disk full"):
            value(q.add(b"a"))
    assert q.length == 0 and q.total_items == 0
    assert any("Journal write failed" in e.get("log_format", "") for e in events)


@pytest.mark.parametrize("method", ["remove", "remove_tentative", "confirm_remove"])
def test_a_read_record_whose_write_raises_is_logged_with_its_error(clock: Clock,
                                                                   method: str) -> None:
    """
    A remove, an open or a close whose journal call raises (a bug: an I/O
    error is returned, not raised) is logged with its traceback, as every
    record written through Unsettled.write is; the read goes on.
    """
    q = make(clock)
    value(q.add(b"a"))
    opened = q.remove(open_read=True) if method == "confirm_remove" else None

    def broken(*args: object) -> None:
        raise RuntimeError("journal bug")

    setattr(q.journal, method, broken)
    with capturedLogs() as events:
        if opened is not None:
            q.confirm_remove(opened.xid)
        else:
            assert q.remove(open_read=method == "remove_tentative").data == b"a"
    assert {e["queue"] for e in events if e.get("log_format") == "Journal write failed for {queue}"
            and e["log_failure"].check(RuntimeError)} == {"q"}


# ----- expiry


def test_expiry_is_strictly_before_now(clock: Clock) -> None:
    """An item expiring exactly now is still live; one millisecond later it is gone."""
    q = make(clock)
    value(q.add(b"a", expiry_ms=ms(clock) + 1000))
    clock.advance(1.0)
    assert q.peek().data == b"a"
    clock.advance(0.001)
    assert q.peek() is None
    assert (q.expired_items, q.length) == (1, 0)
    assert q.journal.records[-1] == rec.REMOVE


def test_memcache_relative_and_absolute_expiry(clock: Clock) -> None:
    """Memcache expiries below 1,000,000 s are relative, others absolute epoch seconds."""
    q = make(clock)
    now = ms(clock)
    value(q.add(b"rel", expiry_ms=memcache_expiry_ms(2, now)))
    value(q.add(b"abs", expiry_ms=memcache_expiry_ms(now // 1000 + 3, now)))
    value(q.add(b"never", expiry_ms=memcache_expiry_ms(0, now)))
    value(q.add(b"rel-ms", expiry_ms=relative_expiry_ms(3500, now)))
    clock.advance(2.5)
    assert q.peek().data == b"abs"
    clock.advance(1.0)
    assert q.peek().data == b"never"
    assert q.expired_items == 2
    assert datas(q) == [b"never", b"rel-ms"]


def test_negative_memcache_expiry_is_already_expired(clock: Clock) -> None:
    """A negative memcache exptime stores the item, but it is never handed out."""
    q = make(clock)
    assert value(q.add(b"a", expiry_ms=memcache_expiry_ms(-1, ms(clock)))) is True
    assert q.remove() is None
    assert q.expired_items == 1


def test_expired_items_do_not_count_against_limits(clock: Clock) -> None:
    """Expired head items are discarded before the fullness check (docs/differences.md)."""
    q = make(clock, max_items=2, max_size=100)
    value(q.add(b"a", expiry_ms=ms(clock) + 100))
    value(q.add(b"b", expiry_ms=ms(clock) + 100))
    clock.advance(1)
    assert value(q.add(b"c")) is True
    assert q.expired_items == 2 and q.discarded == 0
    assert datas(q) == [b"c"]


def test_max_age_caps_expiry_at_add(clock: Clock) -> None:
    """max_age caps a later expiry and gives one to an item without expiry."""
    q = make(clock, max_age=10.0)
    now = ms(clock)
    value(q.add(b"a"))
    value(q.add(b"b", expiry_ms=now + 60_000))
    value(q.add(b"c", expiry_ms=now + 5_000))
    assert [i.expiry_ms for i in q._items] == [now + 10_000, now + 10_000, now + 5_000]


def test_max_age_is_reapplied_with_current_config(clock: Clock) -> None:
    """Lowering max_age expires items that were stored without any expiry."""
    q = make(clock)
    value(q.add(b"old"))
    clock.advance(5)
    value(q.add(b"new"))
    q.config = attrs.evolve(q.config, max_age=3.0)
    assert q.remove().data == b"new"
    assert q.expired_items == 1


def test_max_expire_sweep_limits_discard_expired(clock: Clock) -> None:
    """discard_expired removes at most max_expire_sweep items per call, or the given limit."""
    q = make(clock, max_expire_sweep=2)
    for i in range(5):
        value(q.add(b"%d" % i, expiry_ms=ms(clock) + 10))
    value(q.add(b"live"))
    clock.advance(1)
    assert q.discard_expired() == 2
    assert q.discard_expired(limit=1) == 1
    assert q.length == 3
    assert q.discard_expired() == 2
    assert q.discard_expired() == 0
    assert q.peek().data == b"live"


def test_remove_never_hands_out_expired_items(clock: Clock) -> None:
    """Even with more expired items than max_expire_sweep at the head, remove returns a live one."""
    q = make(clock, max_expire_sweep=1)
    for i in range(4):
        value(q.add(b"%d" % i, expiry_ms=ms(clock) + 10))
    value(q.add(b"live"))
    clock.advance(1)
    assert q.remove().data == b"live"
    assert q.expired_items == 4


def test_expire_to_receives_expired_items(clock: Clock) -> None:
    """Every expired item is passed to expire_to, oldest first."""
    q = make(clock)
    target = make(clock, name="dead")
    q.expire_to = lambda item: target.add(item.data)
    value(q.add(b"a", expiry_ms=ms(clock) + 10))
    value(q.add(b"b", expiry_ms=ms(clock) + 10))
    value(q.add(b"c"))
    clock.advance(1)
    assert q.discard_expired() == 2
    assert datas(target) == [b"a", b"b"]
    assert datas(q) == [b"c"]


def test_expire_to_failure_is_logged_and_sweep_goes_on(clock: Clock) -> None:
    """An expire_to hook that raises is logged; the items still count as expired."""
    q = make(clock)

    def broken(item: QItem) -> None:
        raise RuntimeError("target gone")

    q.expire_to = broken
    value(q.add(b"a", expiry_ms=ms(clock) + 10))
    clock.advance(1)
    with capturedLogs() as events:
        assert q.discard_expired() == 1
    assert q.length == 0
    assert any(e.get("log_failure") is not None for e in events)


# ----- open reads


def test_open_confirm(clock: Clock) -> None:
    """An open read takes the item out with an xid; confirming it drops it for good."""
    q = make(clock)
    value(q.add(b"a"))
    item = q.remove(open_read=True)
    assert item.xid == 1
    assert (q.length, q.open_read_count, q.transactions) == (0, 1, 1)
    q.confirm_remove(item.xid)
    assert q.open_read_count == 0
    assert q.journal.records[1:] == [rec.RemoveTentativeXid(1), rec.ConfirmRemove(1)]
    assert q.remove() is None


def test_abort_returns_to_head(clock: Clock) -> None:
    """An aborted read goes back to the head and counts as canceled."""
    q = make(clock)
    value(q.add(b"a"))
    value(q.add(b"b"))
    item = q.remove(open_read=True)
    q.unremove(item.xid)
    assert q.canceled_transactions == 1
    assert q.journal.records[-1] == rec.Unremove(item.xid)
    assert datas(q) == [b"a", b"b"]


def test_aborted_read_holder_keeps_stale_copy(clock: Clock) -> None:
    """An item handed out before an abort is not the object handed out on redelivery."""
    q = make(clock)
    value(q.add(b"a"))
    first = q.remove(open_read=True)
    q.unremove(first.xid)
    second = q.remove(open_read=True)
    assert first is not second
    assert (first.xid, second.xid, second.data) == (1, 2, b"a")


def test_failed_remove_write_is_logged_and_queue_goes_on(clock: Clock) -> None:
    """A journal write failing on remove is logged; the reader still gets its item."""

    class FlakyJournal(MemoryJournal):
        def remove(self) -> Deferred[None]:
            return fail(OSError("I/O error"))

    q = make(clock, FlakyJournal(keep_records=True))
    value(q.add(b"a"))
    value(q.add(b"b"))
    with capturedLogs() as events:
        assert q.remove().data == b"a"
    assert any("Journal write failed" in e.get("log_format", "") and "I/O error" in str(e["error"])
               for e in events if "error" in e)
    assert datas(q) == [b"b"]


def test_unknown_xid_is_logged_and_ignored(clock: Clock) -> None:
    """Confirming or aborting an xid that is not open changes nothing and logs a warning."""
    q = make(clock)
    value(q.add(b"a"))
    with capturedLogs() as events:
        q.confirm_remove(7)
        q.unremove(8)
    assert q.length == 1 and q.canceled_transactions == 0
    assert [e["xid"] for e in events if "xid" in e] == [7, 8]


def test_xids_increase_and_skip_zero(clock: Clock) -> None:
    """Xids count up from the replayed counter and wrap past MAX_XID to 1, never 0."""
    q = make(clock, ReplayJournal([rec.SaveXid(MAX_XID - 1)]))
    for data in (b"a", b"b", b"c"):
        value(q.add(data))
    assert [q.remove(open_read=True).xid for _ in range(3)] == [MAX_XID, 1, 2]


def test_xids_skip_open_ones(clock: Clock) -> None:
    """A wrapped counter never hands out an xid that is still open."""
    q = make(clock)
    for data in (b"a", b"b", b"c"):
        value(q.add(data))
    first = q.remove(open_read=True)
    second = q.remove(open_read=True)
    q._reads.xid_counter = 0  # as after wrapping around
    assert q.remove(open_read=True).xid == 3
    assert (first.xid, second.xid) == (1, 2)


def test_transactions_counts_attempts_on_non_empty_queue(clock: Clock) -> None:
    """The transactions stat counts open-read attempts made while the queue has items."""
    q = make(clock)
    q.remove(open_read=True)
    value(q.add(b"a"))
    q.remove(open_read=True)
    assert q.transactions == 1


def test_open_transaction_timeout_timer(clock: Clock) -> None:
    """An open read older than open_transaction_timeout is aborted by a timer, even when idle."""
    q = make(clock, open_transaction_timeout=5.0)
    value(q.add(b"a"))
    xid = q.remove(open_read=True).xid
    clock.advance(4.9)
    assert q.open_read_count == 1
    clock.advance(0.1)
    assert q.open_read_count == 0
    assert q.canceled_transactions == 1
    assert q.journal.records[-1] == rec.Unremove(xid)
    again = q.remove(open_read=True)
    assert again.data == b"a" and again.xid != xid
    assert clock.getDelayedCalls() != []


def test_open_transaction_timeout_follows_each_read(clock: Clock) -> None:
    """Each open read gets its own timeout; a confirmed one is never aborted."""
    q = make(clock, open_transaction_timeout=5.0)
    for data in (b"a", b"b", b"c"):
        value(q.add(data))
    a = q.remove(open_read=True)
    clock.advance(2)
    q.remove(open_read=True)
    q.confirm_remove(a.xid)
    clock.advance(3)
    assert q.open_read_count == 1
    clock.advance(2)
    assert q.open_read_count == 0
    assert datas(q) == [b"b", b"c"]
    assert clock.getDelayedCalls() == []


def test_timed_out_reads_return_oldest_first(clock: Clock) -> None:
    """Open reads timing out together go back so the first-opened one is at the head."""
    q = make(clock, open_transaction_timeout=1.0)
    for data in (b"a", b"b", b"c"):
        value(q.add(data))
    q.remove(open_read=True)
    q.remove(open_read=True)
    clock.advance(1)
    assert datas(q) == [b"a", b"b", b"c"]


def test_open_transaction_timeout_follows_config(clock: Clock) -> None:
    """Setting open_transaction_timeout on a live queue times out reads already open."""
    q = make(clock)
    value(q.add(b"a"))
    q.remove(open_read=True)
    clock.advance(10)
    assert q.open_read_count == 1
    q.config = attrs.evolve(q.config, open_transaction_timeout=5.0)
    clock.advance(0)
    assert q.open_read_count == 0
    q.config = attrs.evolve(q.config, open_transaction_timeout=None)
    q.remove(open_read=True)
    clock.advance(100)
    assert q.open_read_count == 1


def test_open_transaction_timeout_wakes_waiter(clock: Clock) -> None:
    """A timed-out read wakes a blocked reader, which receives the returned item."""
    q = make(clock, open_transaction_timeout=2.0)
    value(q.add(b"a"))
    q.remove(open_read=True)
    d = q.wait_remove(clock.seconds() + 10)
    assert value(d) is PENDING
    clock.advance(2)
    assert value(d).data == b"a"


# ----- blocking reads


def test_wait_remove_without_deadline_answers_at_once(clock: Clock) -> None:
    """A deadline of None (or in the past) means: answer now, item or None."""
    q = make(clock)
    assert value(q.wait_remove(None)) is None
    assert value(q.wait_remove(clock.seconds() - 1)) is None
    value(q.add(b"a"))
    assert value(q.wait_remove(None)).data == b"a"
    assert (q.get_items_hit, q.get_items_miss) == (1, 2)


def test_waiters_served_fifo_one_item_each(clock: Clock) -> None:
    """Blocked readers get items in arrival order, one each."""
    q = make(clock)
    ds = [q.wait_remove(clock.seconds() + 10) for _ in range(3)]
    assert q.waiter_count == 3
    value(q.add(b"a"))
    value(q.add(b"b"))
    assert [value(d) if value(d) is PENDING else value(d).data for d in ds] == [
        b"a", b"b", PENDING]
    assert q.waiter_count == 1 and q.length == 0


def test_waiter_times_out(clock: Clock) -> None:
    """A blocked reader gets None at its deadline and leaves no timer behind."""
    q = make(clock)
    d = q.wait_remove(clock.seconds() + 0.5)
    clock.advance(0.5)
    assert value(d) is None
    assert q.waiter_count == 0 and q.get_items_miss == 1
    assert clock.getDelayedCalls() == []
    value(q.add(b"a"))
    assert q.length == 1


def test_cancelled_waiter_takes_nothing(clock: Clock) -> None:
    """Cancelling a blocked read removes it; the next item goes to the next reader."""
    q = make(clock)
    first = q.wait_remove(clock.seconds() + 10)
    second = q.wait_remove(clock.seconds() + 10)
    first.cancel()
    with pytest.raises(CancelledError):
        value(first)
    assert q.waiter_count == 1
    value(q.add(b"a"))
    assert value(second).data == b"a"
    value(q.add(b"b"))
    assert datas(q) == [b"b"]
    assert clock.getDelayedCalls() == []


def test_aborted_handoff_reaches_next_waiter(clock: Clock) -> None:
    """A reader that gets an item and aborts it at once passes it on to the next reader."""
    q = make(clock)
    first = q.wait_remove(clock.seconds() + 10, open_read=True)
    second = q.wait_remove(clock.seconds() + 10, open_read=True)
    first.addCallback(lambda item: q.unremove(item.xid))  # its client is gone
    value(q.add(b"a"))
    item = value(second)
    assert item.data == b"a" and q.open_read_count == 1
    q.confirm_remove(item.xid)
    assert q.length == 0 and q.open_read_count == 0


def test_wait_peek_passes_wake_on(clock: Clock) -> None:
    """A woken peeker leaves the item and passes the wake-up to the reader behind it."""
    q = make(clock)
    peeker = q.wait_peek(clock.seconds() + 10)
    reader = q.wait_remove(clock.seconds() + 10)
    value(q.add(b"a"))
    assert value(peeker).data == b"a"
    assert value(reader).data == b"a"
    assert q.length == 0


def test_woken_reader_that_finds_nothing_keeps_waiting(clock: Clock) -> None:
    """A reader woken when the item is already gone waits again until its deadline."""
    q = make(clock, max_age=1.0)
    d = q.wait_remove(clock.seconds() + 10)
    value(q.add(b"a", expiry_ms=ms(clock) - 1))  # expired on arrival: nothing to take
    assert value(d) is PENDING and q.waiter_count == 1
    value(q.add(b"b"))
    assert value(d).data == b"b"


def test_close_answers_waiters(clock: Clock) -> None:
    """Closing the queue answers every blocked reader with None."""
    q = make(clock)
    ds = [q.wait_remove(clock.seconds() + 10), q.wait_peek(clock.seconds() + 10)]
    value(q.close())
    assert [value(d) for d in ds] == [None, None]
    assert clock.getDelayedCalls() == []


def test_evict_waiters(clock: Clock) -> None:
    """evict_waiters answers every blocked reader with None; the queue keeps working."""
    q = make(clock)
    d = q.wait_remove(clock.seconds() + 10)
    q.evict_waiters()
    assert value(d) is None and q.waiter_count == 0
    value(q.add(b"a"))
    assert q.length == 1


# ----- whole queue and stats


def test_flush_leaves_open_reads(clock: Clock) -> None:
    """flush removes every queued item, counts itself, and leaves open reads open."""
    q = make(clock)
    for data in (b"a", b"b", b"c"):
        value(q.add(data))
    opened = q.remove(open_read=True)
    q.flush()
    assert (q.length, q.total_flushes, q.open_read_count) == (0, 1, 1)
    q.unremove(opened.xid)
    assert datas(q) == [b"a"]


def test_age_is_last_wait_and_zero_when_empty(clock: Clock) -> None:
    """age is how long the last fetched item waited (ms), and 0 once the queue is empty."""
    q = make(clock)
    value(q.add(b"a"))
    value(q.add(b"b"))
    assert q.age == 0
    clock.advance(2.5)
    q.remove()
    assert q.age == 2500
    clock.advance(1)
    assert q.age == 2500
    q.remove()
    assert q.age == 0


def test_dump_stats_order_and_values(clock: Clock) -> None:
    """dump_stats lists Kestrel's per-queue stats in Kestrel's order."""
    q = make(clock)
    value(q.add(b"abc"))
    value(q.add(b"de"))
    item = q.remove(open_read=True)
    q.wait_remove(clock.seconds() + 5)  # queue not empty: answered at once
    q.unremove(item.xid)
    assert q.dump_stats() == [
        ("items", "1"), ("bytes", "3"), ("total_items", "2"), ("logsize", "0"),
        ("expired_items", "0"), ("mem_items", "1"), ("mem_bytes", "3"), ("age", "0"),
        ("discarded", "0"), ("waiters", "0"), ("open_transactions", "0"),
        ("transactions", "1"), ("canceled_transactions", "1"), ("total_flushes", "0"),
        ("journal_rewrites", "0"), ("journal_rotations", "0"),
    ]


def test_create_time_and_max_queue_age(clock: Clock) -> None:
    """A queue is ready for expiration once empty and older than max_queue_age."""
    q = make(clock, max_queue_age=60.0)
    assert q.create_time == clock.seconds()
    clock.advance(61)
    assert q.is_ready_for_expiration()
    value(q.add(b"a"))
    assert not q.is_ready_for_expiration()
    assert not make(clock).is_ready_for_expiration()


def test_durable_acks_on_memory_journal_fire_at_once(clock: Clock) -> None:
    """With durable_acks on a journal that is durable at once, the add fires at once."""
    q = make(clock, durable_acks=True)
    assert value(q.add(b"a")) is True
    assert q.offer(b"b") is True


def test_offer_answers_at_once_without_a_deferred(clock: Clock) -> None:
    """
    offer answers a stored or refused add with True or False itself (add puts
    the same answer in a Deferred); the item is stored as add stores it.
    """
    q = make(clock, max_items=2)
    assert q.offer(b"a") is True
    assert value(q.add(b"b")) is True
    assert q.offer(b"c") is False  # (full)
    assert value(q.add(b"c")) is False
    assert datas(q) == [b"a", b"b"]
    q.close()
    assert q.offer(b"d") is False  # (closed)


# ----- replay


def test_replay_rebuilds_state(clock: Clock) -> None:
    """Replayed records rebuild the queue; adds count in total_items; no expiry on replay."""
    t = ms(clock)
    journal = ReplayJournal([
        rec.Add(b"b", t, 0),
        rec.Add(b"a", t - 10_000, t - 5_000),  # already expired: kept until a read
        rec.LegacyAdd(b"c", 0),
        rec.AddXid(9, b"d", t, 0),
        rec.REMOVE,
        rec.Add(b"e", t, 0),
    ])
    q = make(clock, journal)
    assert (q.length, q.total_items, q.expired_items) == (4, 5, 0)
    assert datas(q) == [b"c", b"d", b"e"]
    assert q.expired_items == 1


def test_replay_returns_open_reads_to_head_in_xid_order(clock: Clock) -> None:
    """Reads open at the end of replay are aborted (UNREMOVE, descending xid): ascending at head."""
    t = ms(clock)
    journal = ReplayJournal([
        rec.Add(b"a", t), rec.Add(b"b", t), rec.Add(b"c", t), rec.Add(b"d", t),
        rec.RemoveTentativeXid(5), rec.RemoveTentativeXid(3), rec.RemoveTentativeXid(7),
        rec.ConfirmRemove(3),
    ])
    q = make(clock, journal)
    assert journal.records == [rec.Unremove(7), rec.Unremove(5)]
    assert q.open_read_count == 0 and q.canceled_transactions == 0
    assert q.xid_counter == 7
    value(q.add(b"e"))
    again = q.remove(open_read=True)
    assert (again.data, again.xid) == (b"a", 8)
    assert datas(q) == [b"c", b"d", b"e"]


def test_replayed_open_items_order(clock: Clock) -> None:
    """After replay the formerly open items are delivered first, lowest xid first."""
    t = ms(clock)
    journal = ReplayJournal([
        rec.Add(b"a", t), rec.Add(b"b", t), rec.Add(b"c", t),
        rec.RemoveTentativeXid(2), rec.RemoveTentativeXid(1),
    ])
    q = make(clock, journal)
    assert datas(q) == [b"b", b"a", b"c"]


def test_replay_unremove_continue_save_xid(clock: Clock) -> None:
    """UNREMOVE, CONTINUE and SAVE_XID replay as Kestrel defines them."""
    t = ms(clock)
    journal = ReplayJournal([
        rec.Add(b"a", t), rec.Add(b"b", t),
        rec.RemoveTentativeXid(1), rec.Unremove(1),
        rec.RemoveTentativeXid(2), rec.Continue(2, b"c", t, 0),
        rec.SaveXid(40),
    ])
    q = make(clock, journal)
    assert journal.records == []
    assert q.xid_counter == 40
    assert q.remove(open_read=True).xid == 41
    assert datas(q) == [b"c"]


def test_replayed_open_never_lowers_xid_counter(clock: Clock) -> None:
    """
    A replayed REMOVE_TENTATIVE_XID raises the xid counter to its xid but never
    lowers it: a rewritten journal's SAVE_XID stays the floor for new xids.
    """
    t = ms(clock)
    journal = ReplayJournal([
        rec.SaveXid(50),
        rec.Add(b"a", t), rec.Add(b"b", t), rec.Add(b"c", t), rec.Add(b"d", t),
        rec.RemoveTentativeXid(3), rec.ConfirmRemove(3),
        rec.RemoveTentativeXid(60), rec.ConfirmRemove(60),
        rec.RemoveTentativeXid(4), rec.ConfirmRemove(4),
    ])
    q = make(clock, journal)
    assert q.xid_counter == 60
    assert q.remove(open_read=True).xid == 61


def test_legacy_remove_tentative_gets_counter_xid(clock: Clock) -> None:
    """A legacy xid-less open read takes the next counter value, so its UNREMOVE matches."""
    t = ms(clock)
    journal = ReplayJournal([
        rec.Add(b"a", t), rec.Add(b"b", t),
        rec.SaveXid(4), rec.RemoveTentative(), rec.RemoveTentative(), rec.ConfirmRemove(5),
    ])
    q = make(clock, journal)
    assert journal.records == [rec.Unremove(6)]
    assert datas(q) == [b"b"]


def test_keep_journal_false_erases_on_setup(clock: Clock) -> None:
    """With keep_journal false, setup erases the journal instead of replaying it."""
    journal = ReplayJournal([rec.Add(b"a", ms(clock))])
    journal.records.append(rec.REMOVE)
    q = make(clock, journal, keep_journal=False)
    assert q.length == 0 and journal.records == []


def test_many_peekers_and_handoffs_do_not_nest(clock: Clock) -> None:
    """Thousands of woken peekers pass the wake-up along without deep recursion."""
    q = make(clock)
    peekers = [q.wait_peek(clock.seconds() + 10) for _ in range(3000)]
    reader = q.wait_remove(clock.seconds() + 10)
    value(q.add(b"a"))
    assert all(value(d).data == b"a" for d in peekers)
    assert value(reader).data == b"a"
    assert q.length == 0 and q.waiter_count == 0
