"""
PersistentQueue: one durable FIFO queue, mirroring Kestrel 2.4's C{PersistentQueue}.

The queue holds its items in memory (up to C{max_memory_size} payload bytes;
the rest stays in the journal and is read back, "read-behind"), tracks open
reads (tentative removes) by xid, applies the limits and expiry rules of its
L{QueueConfig}, journals every change, and wakes blocked readers. It knows
nothing of sockets: time comes from the injected clock, and the journal is
an L{kestrel.journal.interface.IJournal} (C{FileJournal} or C{MemoryJournal}).

Its parts each hold one idea: L{kestrel.queue_health} (the journal cannot
be written), L{kestrel.queue_policy} (compaction), L{kestrel.open_reads},
L{kestrel.read_behind}, L{kestrel.waiters} (blocked reads), L{kestrel.queue_stats},
L{kestrel.queue_replay} (loading from the journal, and reloading after a failure),
L{kestrel.queue_expiry}.

Where this deliberately differs from Kestrel (C{docs/differences.md}):
expired items are discarded before the fullness check and are never handed
to a client, C{open_transaction_timeout} is enforced by a timer, and C{age}
is how long the last fetched item waited.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import overload

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from kestrel import names
from kestrel.config import QueueConfig
from kestrel.errors import JournalUnavailable
from kestrel.item import QItem
from kestrel.journal.events import event_applier
from kestrel.journal.interface import IJournal
from kestrel.open_reads import OpenReads
from kestrel.queue_expiry import QueueExpiry
from kestrel.queue_health import (
    ABORT,
    CONFIRM,
    JOURNAL_RETRY_SECONDS,
    OPEN,
    REMOVE,
    JournalHealth,
    Unsettled,
    reason_of,
    unavailable_failure,
)
from kestrel.queue_observer import QueueObserver
from kestrel.queue_policy import RECORD_MARGIN, Compactor, upkeep_from
from kestrel.queue_replay import QueueReplay
from kestrel.queue_stats import QueueStats
from kestrel.read_behind import ReadBehind
from kestrel.settled import in_deferred
from kestrel.unsynced import Answer, DurableAdd, DurableAdds, Unsynced
from kestrel.waiters import BlockingReads

__all__ = ["JOURNAL_RETRY_SECONDS", "PersistentQueue", "QueueObserver"]


class PersistentQueue(QueueStats, QueueReplay, QueueExpiry):
    """
    A named queue with journaled adds, removes and open reads.

    Promises: an item whose add was acknowledged stays in the queue (or the
    journal) until it is removed, confirmed, expired, discarded by
    C{discard_old_when_full} or flushed; each item is handed to at most one
    reader at a time; aborted reads go back to the head; a reader is handed
    an item only once the records that make it the reader's are in the OS.

    Its stats are L{QueueStats}'; loading from its journal (C{setup}, the
    events its records replay into) is L{QueueReplay}'s; discarding expired
    items is L{QueueExpiry}'s.

    @ivar expire_to: called with every item that expires (the collection
        wires C{expire_to_queue}); C{None} drops expired items.
    @ivar is_fanout_master: whether C{fanout_only} makes this queue store
        nothing (Kestrel: a name without C{+}); the collection may set it.
    @ivar observer: the L{QueueObserver} told of maintenance durations and
        sizes, or C{None}. C{fsync_failed} is told of every failed fsync of
        the journal (the server counts them as C{fsync_error_<class>}).
    """

    # (its attributes in slots: CPython 3.11 does not specialize calls of the
    # methods of an instance whose __dict__ is as large as a queue's would be,
    # and a queue's methods run per request; the mixins declare none, so
    # what they set is here too)
    __slots__ = (
        "_add_upkeep_from", "_blocked", "_bounded", "_clock", "_closed", "_compactor",
        "_config", "_durable_adds", "_health", "_items", "_last_wait_ms", "_open_by_xid",
        "_read_behind", "_reads", "_records", "_reopening", "_replay_apply", "_replaying",
        "_seconds", "_unsynced", "_upkeep_from", "_waiting", "acks_durably", "bytes",
        "canceled_transactions", "create_time", "discarded", "expire_to", "expired_items",
        "get_items_hit", "get_items_miss", "is_fanout_master", "journal", "length",
        "memory_bytes", "name", "observer", "put_bytes", "put_items", "total_flushes",
        "total_items", "transactions")

    _log = Logger()

    def __init__(self, name: str, config: QueueConfig, journal: IJournal,
                 clock: IReactorTime, *, observer: QueueObserver | None = None,
                 fsync_failed: Callable[[OSError], None] | None = None) -> None:
        self.name = name
        self.observer = observer
        self.journal = journal
        self._clock = clock
        # (called as a local per add and remove: see kestrel.session)
        self._seconds = clock.seconds
        # (what readers see; never replaced, only changed in place: Unsynced
        # appends to it)
        self._items: deque[QItem] = deque()
        self._reads = OpenReads(clock, self._time_out_open_reads)
        self.config = config  # (and what derives from it: see the setter)
        self._blocked = BlockingReads(clock, journal.after_written, lambda: self._closed,
                                      self.count_get)
        # (durable adds' items, after _items, seen by no reader until their fsync)
        self._unsynced = Unsynced(self._items, self._blocked.wake, self._all_shown)
        # (what every durable add shares: the name, and what times and records
        # its set_latency_usec, from offer until its producer is answered)
        self._durable_adds = DurableAdds(
            name, clock.seconds, None if observer is None else observer.set_latency_usec.add)
        # (the containers behind _reads and _blocked, tested per plain read)
        self._open_by_xid = self._reads.by_xid
        self._waiting = self._blocked.waiting
        self._closed = False
        # (xids of durable confirms that failed, open again once memory is reloaded)
        self._reopening: set[int] = set()
        self._replaying = False
        self._last_wait_ms = 0
        # What happens when the journal cannot be written, and what the
        # journal may not hold yet of what clients were told.
        self._health = JournalHealth(name, journal, clock, self, fsync_failed=fsync_failed)
        self._records = Unsettled(name, self._health, journal)
        self._compactor = Compactor(self, clock)
        self._read_behind = ReadBehind(self, clock)
        # What each replayed record does to memory (the event methods below).
        self._replay_apply = event_applier(self, self._now_ms)
        journal.on_skipped_adds = self.count_skipped_adds
        self.expire_to: Callable[[QItem], object] | None = None
        self.is_fanout_master = names.FANOUT_SEPARATOR not in name
        self.create_time = clock.seconds()
        self._reset_counters()

    # ----- configuration and derived stats

    @property
    def config(self) -> QueueConfig:
        """The queue's settings; assigning a new one takes effect at once."""
        return self._config

    @config.setter
    def config(self, config: QueueConfig) -> None:
        self._config = config
        #: Whether an add is acknowledged only once its fsync succeeded (and
        #: seen by readers only then): C{durable_acks}, or C{sync_journal: always}.
        self.acks_durably = config.durable_acks or config.sync_journal == 0.0
        # (whether an add may have to make room first: see offer)
        self._bounded = (config.max_items is not None or config.max_size is not None
                         or config.max_age is not None)
        self._upkeep_from = upkeep_from(config)
        self._add_upkeep_from = upkeep_from(config, adding=True)
        self._reads.timeout = config.open_transaction_timeout

    @property
    def compacts(self) -> bool:
        """Whether the journal may be compacted now: open, and its writes work."""
        return self._health.takes_adds and not self._closed

    def memory_items(self) -> Sequence[QItem]:
        """The queued items readers may see in memory, head first (not a copy: do not change it)."""
        return self._items

    @property
    def unsynced_count(self) -> int:
        """How many items memory holds unseen until their fsync (see L{add})."""
        return len(self._unsynced)

    def _now_ms(self) -> int:
        return int(self._clock.seconds() * 1000)

    # ----- adding

    def add(self, data: bytes, expiry_ms: int = 0, xid: int | None = None,
            add_time_ms: int | None = None) -> Deferred[bool]:
        """L{offer}, its answer always in a Deferred."""
        return in_deferred(self.offer(data, expiry_ms, xid=xid, add_time_ms=add_time_ms))

    # (then is third, so that the hot path passes it by position: a call with
    # keywords is not specialized, and costs a few hundred instructions more)
    @overload
    def offer(self, data: bytes, expiry_ms: int = ..., then: None = ...,
              xid: int | None = ..., add_time_ms: int | None = ...,
              ) -> bool | Deferred[bool]: ...

    @overload
    def offer(self, data: bytes, expiry_ms: int, then: Answer | None,
              xid: int | None = ..., add_time_ms: int | None = ...,
              ) -> bool | Deferred[bool] | None: ...

    def offer(self, data: bytes, expiry_ms: int = 0, then: Answer | None = None,
              xid: int | None = None, add_time_ms: int | None = None,
              ) -> bool | Deferred[bool] | None:
        """
        Append an item: C{True} if it was stored, C{False} if refused, when
        that is known at once (the usual case); else a Deferred of it, or,
        given C{then}, C{None} for a durable add that waits for its fsync:
        C{then} is called with its outcome instead (L{DurableAdd}), never
        before this returns and never when anything else is returned.

        Refused: the queue is closed, the item is larger than
        C{max_item_size}, or the queue is full (C{max_items}/C{max_size},
        counted after the expired head items are discarded) and
        C{discard_old_when_full} is off. A C{fanout_only} master reports
        success and stores nothing. With C{xid}, open read C{xid} is
        confirmed in the same journal record (CONTINUE).

        Acknowledging durably (C{sync_journal: always}, or C{durable_acks}
        with a period), the answer is a Deferred that fires after the fsync
        covering the record (failing if it or its write fails). A write
        refused at once, or an add while the journal cannot be written,
        stores nothing and answers a failed Deferred (L{JournalUnavailable}).
        A blocked reader is woken once the record is in the OS (after the
        batch holding it flushed);
        acknowledging durably, only once that fsync succeeded: until then no
        reader sees the item (it counts in C{length} and C{bytes}), and if
        it fails none ever does.

        @param expiry_ms: absolute epoch ms, 0 for never; capped by C{max_age}.
        @param add_time_ms: the item's add time (default: now).
        """
        cfg = self._config
        size = len(data)
        if self._closed or (cfg.max_item_size is not None and size > cfg.max_item_size):
            return False
        if cfg.fanout_only and self.is_fanout_master:
            return True
        health = self._health
        if not health.takes_adds:
            return fail(health.unavailable())
        items = self._items
        # (_make_room's own first tests, inlined: a queue with no limits, and no
        # expiring head, has nothing to make room for, and the call costs more)
        if (self._bounded or (items and items[0].expiry_ms)) and not self._make_room():
            return False
        seconds = self._seconds
        now = seconds()
        now_ms = int(now * 1000)
        item = QItem(data, now_ms if add_time_ms is None else add_time_ms,
                     expiry_ms if cfg.max_age is None else self._expiry_for(expiry_ms, now_ms))
        journal = self.journal
        if cfg.keep_journal and (
                journal.size + journal.archived_size + size + RECORD_MARGIN
                >= (self._add_upkeep_from if self.length else self._upkeep_from)
                or self.bytes + size >= cfg.max_memory_size):
            # (in a write batch, once it is flushed: maintenance flushes files,
            # and a batch reaches the OS whole or not at all)
            journal.after_written(self._upkeep)
            if not health.takes_adds:  # (maintenance above failed)
                return fail(health.unavailable())
        add: DurableAdd | None = None
        try:
            if xid is not None:
                d = journal.continue_(xid, item)  # (durable: held unseen below too)
            elif not self.acks_durably:
                d = journal.add(item)
            elif then is None:
                d = journal.add_unseen(item)
            else:
                # (its latency, from now until the producer is answered, is
                # recorded by the add itself: the session records at-once answers)
                add = DurableAdd(self._durable_adds, then, now)
                d = journal.add_unseen(item, add)  # (None: add is told)
        except Exception as e:
            self._log.failure("Journal write failed for {queue}; item refused", queue=self.name)
            return fail(JournalUnavailable(self.name, reason_of(e)))
        if add is not None:
            told = add.told
            if told is None:  # (the usual case: told once the turn's fsync is done)
                number = add.number = self._store(item, True)  # (unseen)
                add.shown = self._unsynced.show_through if number else self._synced_on_disk
                return None
            if told.__class__ is Failure:
                d = fail(told)  # (refused at once)
        # (settled(d), inlined: a Failure if the OS refused the write, the file
        # cut back; no Deferred: nothing to wait for)
        if d is not None and d.called and d.result.__class__ is Failure:
            failure: Failure = d.result
            d.addErrback(lambda _: None)
            self._log.warn("Journal write failed for {queue}; item refused: {error}",
                           error=failure.value, queue=self.name)
            return fail(JournalUnavailable(self.name, reason_of(failure.value)))
        if xid is not None and self._reads.pop(xid) is not None:
            self._records.note(CONFIRM, xid, None, d)
            self._open_reads_changed()
        if self.acks_durably and d is not None:
            # Seen by no reader before the fsync covering its record: the
            # journal's Deferred is this write's own, chain on it directly.
            # (None: durable once written, as in a memory journal: seen now.)
            number = self._store(item, unseen=True)
            shown = (partial(self._unsynced.show_through, number) if number
                     else self._synced_on_disk)
            return d.addCallbacks(shown, self._durable_add_failed)
        self._store(item)
        self._blocked.wake()
        if d is not None and not d.called:
            d.addErrback(self._records.write_failed)
        return True

    def _make_room(self) -> bool:
        """
        Discard the expired head items, then (C{discard_old_when_full}) the
        oldest ones while the queue is full; return whether an add fits.
        """
        cfg = self._config
        items = self._items
        # (_sweep's own first test, inlined: on this path the call costs more than the test)
        if items and (items[0].expiry_ms or cfg.max_age is not None):
            self._sweep(None)
        max_items = cfg.max_items
        max_size = cfg.max_size
        while ((max_items is not None and self.length >= max_items)
               or (max_size is not None and self.bytes >= max_size)):
            if not cfg.discard_old_when_full or not self._items:
                return False
            self._pop_head()
            self.discarded += 1
            self._records.write(self.journal.remove)
            self._read_behind.fill()
            self._sweep(None)
        return True

    def _upkeep(self) -> None:
        """Compact the journal if it outgrew a limit; keep new adds on disk if memory is full."""
        self._compactor.check()
        if not self._closed:
            self._read_behind.start_if_full()

    def _durable_add_failed(self, failure: Failure) -> Failure:
        """A durable add's write or fsync failed: the recovery drops it; say why."""
        return unavailable_failure(self.name, failure)

    def _synced_on_disk(self, _: object) -> bool:
        """A durable add kept on disk only is durable: the fill may read it back now."""
        self._all_shown()
        self._blocked.wake()
        return True

    def _all_shown(self) -> None:
        """
        Unseen items became durable: read on from disk (nothing is read while
        some wait in memory), and run a rewrite that was put off for them.
        """
        try:
            if self.journal.in_read_behind and not self._closed:
                self._read_behind.fill()
            compactor = self._compactor
            if compactor.rewrite_owed:
                compactor.rewrite_owed = False
                self.journal.after_written(self._upkeep)
        except Exception:
            # (never into the add's Deferred: the add was acknowledged and is visible)
            self._log.failure("Reading back or compacting {queue} failed", queue=self.name)

    def _store(self, item: QItem, unseen: bool = False, observed: bool = True) -> int:
        """
        Count an added item and keep it in memory (unless read-behind); tell
        the observer (unless not C{observed}: a replayed item). Readers see it
        at once, or, C{unseen} (a durable add), once the fsync covering its
        record succeeded: then return its number in L{Unsynced}, for
        L{Unsynced.show_through} to show it then; 0 for an item seen at once,
        and for one in read-behind, on disk only (the fill reads no record not
        yet durable: L{_synced_on_disk} lets it read on).
        """
        size = len(item.data)
        self.total_items += 1
        self.put_items += 1
        self.put_bytes += size
        self.bytes += size
        self.length += 1
        in_memory = not self.journal.in_read_behind
        if in_memory:
            self.memory_bytes += size
            if not unseen:
                self._items.append(item)
        if observed:
            observer = self.observer
            if observer is not None:
                observer.item_added(size, len(self._items))
        return self._unsynced.hold(item) if unseen and in_memory else 0

    # ----- reading

    def peek(self) -> QItem | None:
        """Return the head item without removing it (expired items are discarded first)."""
        if self._closed or not self.length:
            return None
        if not self._health.readable:
            raise self._health.unavailable()
        self._sweep(None)
        return self._items[0] if self._items else None

    def plain_head(self, index: int = 0) -> QItem | None:
        """Item C{index}, if a plain read may hold it in place: no open read, waiter or expiry."""
        items = self._items
        if (self._closed or len(items) <= index or self._open_by_xid or self._waiting
                or not self._health.readable or self._config.max_age is not None
                or items[index].expiry_ms):
            return None
        return items[index]

    def remove(self, open_read: bool = False, head: QItem | None = None) -> QItem | None:
        """
        Remove and return the live head item (expired ones are discarded
        first), or C{None}. With C{open_read}, it is opened under a fresh xid
        (C{item.xid}), owed to the queue until L{confirm_remove} or
        L{unremove}; open reads past C{open_transaction_timeout} are aborted
        first. With C{head} (a plain remove), only that item is removed, if
        a plain read may still take it in place (L{plain_head}); otherwise
        nothing is. Raises L{JournalUnavailable} while memory is rebuilt after a
        journal failure, or if the remove's own record cannot be written.
        """
        if self._closed or not self.length:
            return None
        health = self._health
        if not health.readable:
            raise health.unavailable()
        items = self._items
        if head is not None:  # (plain_head's test, inlined: no open read, expiry or sweep)
            if (not items or items[0] is not head or self._open_by_xid or self._waiting
                    or self._config.max_age is not None or head.expiry_ms):
                return None
        else:
            if open_read:
                self.transactions += 1
            if self._config.open_transaction_timeout is not None and self._open_by_xid:
                self._time_out_open_reads()
            if items and (items[0].expiry_ms or self._config.max_age is not None):  # (as add)
                self._sweep(None)
        item = self._pop_head()
        if item is None:
            return None
        seconds = self._seconds
        wait_ms = int(seconds() * 1000) - item.add_time_ms
        self._last_wait_ms = wait_ms if wait_ms > 0 else 0
        journal = self.journal
        xid = self._reads.open(item) if open_read else 0
        try:  # (_records.write's own steps, inlined: run per read)
            d = journal.remove_tentative(xid) if open_read else journal.remove()
        except Exception as e:
            d = self._records.refused(e)
        if d is not None:
            self._records.written(d, (OPEN if open_read else REMOVE, xid, item))
        if not health.readable:
            # Not journaled (the journal reported it): not handed out; the
            # reload finds the item queued.
            raise health.unavailable()
        if self._config.keep_journal:
            if journal.in_read_behind:
                self._read_behind.fill()
            if journal.size + journal.archived_size + RECORD_MARGIN >= self._upkeep_from:
                journal.after_written(self._compactor.check)
        observer = self.observer
        if observer is not None:
            observer.item_removed(len(self._items))
            if open_read:
                self._open_reads_changed()
        return item

    def _pop_head(self) -> QItem | None:
        items = self._items
        if not items:
            return None
        item = items.popleft()
        size = len(item.data)
        self.bytes -= size
        self.memory_bytes -= size
        self.length -= 1
        if self._replaying:
            self._read_behind.fill()
        return item

    def wait_remove(self, deadline: float | None,
                    open_read: bool = False) -> Deferred[QItem | None]:
        """
        Remove the head item, waiting for one until C{deadline} if the queue is empty.

        @param deadline: absolute clock seconds, or C{None} not to wait.
        @return: a Deferred firing with the item, or C{None} at the deadline
            (or when the queue closes or evicts its waiters). Waiters are
            served first come, first served, one item each. Cancelling the
            Deferred leaves the line; no item is taken for it. A waiter whose
            own remove cannot be journaled fails with L{JournalUnavailable}.
        """
        return in_deferred(self.take(deadline, open_read))

    def take(self, deadline: float | None,
             open_read: bool = False) -> QItem | Deferred[QItem | None]:
        """
        As L{wait_remove}, but an item taken at once (the usual read) is
        returned as it is, without a Deferred.
        """
        item = self.remove(open_read)
        if item is not None:
            # The usual case: no closure, no pending read.
            self.get_items_hit += 1
            return item
        return self._blocked.answer(lambda: self._retry_remove(open_read), deadline, None)

    def _retry_remove(self, open_read: bool) -> QItem | None:
        """A woken reader's remove; C{None} while memory is being rebuilt (it waits on)."""
        return self.remove(open_read) if self._health.readable else None

    def wait_peek(self, deadline: float | None) -> Deferred[QItem | None]:
        """
        Peek at the head item, waiting for one until C{deadline} if the queue is empty.

        A woken peeker leaves the item in place and passes the wake-up on, so
        a reader behind it is woken for the same item.
        """
        return self._blocked.answer(self._retry_peek, deadline, self.peek(), passes_wake=True)

    def _retry_peek(self) -> QItem | None:  # (as _retry_remove)
        return self.peek() if self._health.readable else None

    def evict_waiters(self) -> None:
        """Answer every blocked read with "no item" (outside any write batch)."""
        self._blocked.evict()

    # ----- open reads

    def unremove(self, xid: int) -> None:
        """
        Abort open read C{xid}: its item goes back to the head and one waiter is woken.

        An unknown xid is logged and ignored. While memory is being rebuilt
        after a journal failure, the abort is kept and applied by the reload.
        """
        if self._closed:
            return
        if not self._health.readable:
            self._records.keep(ABORT, xid, None)
            return
        if xid in self._reads:
            self._return_to_head(xid)
            self._records.write(self.journal.unremove, xid, note=(ABORT, xid, None))
            self.canceled_transactions += 1
            self._open_reads_changed()
        elif xid in self._reopening:  # (a confirm that failed: the reload reopens it)
            self._records.keep(ABORT, xid, None)
        else:
            self._log.warn("{queue}: abort of xid {xid}, which is not open",
                           queue=self.name, xid=xid)
        self._blocked.wake()

    def _return_to_head(self, xid: int) -> None:
        opened = self._reads.pop(xid)
        if opened is None:
            return
        # A fresh object: whoever held the aborted read keeps a stale copy, never a live one.
        item = QItem(opened.data, opened.add_time_ms, opened.expiry_ms)
        size = len(item.data)
        self._items.appendleft(item)
        self.memory_bytes += size
        self.bytes += size
        self.length += 1

    def confirm_remove(self, xid: int) -> None:
        """
        Confirm open read C{xid}: its item is gone for good. An unknown xid is
        logged. While memory is being rebuilt after a journal failure, the
        confirm is kept and applied by the reload. (A client's own confirm
        on a queue that L{acks_durably} is L{confirm_durably}.)
        """
        if self._closed:
            return
        if not self._health.readable:
            self._records.keep(CONFIRM, xid, None)
            return
        if self._reads.pop(xid) is not None:
            try:  # (_records.write's own steps, inlined: run per close)
                d = self.journal.confirm_remove(xid)
            except Exception as e:
                d = self._records.refused(e)
            self._records.written(d, (CONFIRM, xid, None))
            self._open_reads_changed()
        else:
            self._log.warn("{queue}: confirm of xid {xid}, which is not open",
                           queue=self.name, xid=xid)

    def confirm_durably(self, xid: int) -> Deferred[None]:
        """
        A client's confirm of open read C{xid} on a queue that L{acks_durably},
        acknowledged like a durable add: refused
        (failing with L{JournalUnavailable}, the read left open) unless the
        journal takes writes; otherwise the read is closed and its record
        written, and the Deferred fires once that record is durable. If its
        write or fsync fails, the Deferred fails with L{JournalUnavailable}
        and the reload rebuilds the read as open under C{xid} (an abort of it
        made meanwhile is kept for that reload).
        """
        health = self._health
        if self._closed:
            return succeed(None)
        if not health.takes_adds:
            return fail(health.unavailable())
        if self._reads.pop(xid) is None:
            self._log.warn("{queue}: confirm of xid {xid}, which is not open",
                           queue=self.name, xid=xid)
            return succeed(None)
        self._open_reads_changed()
        try:
            d = self.journal.confirm_remove(xid)
        except Exception as e:
            self._log.failure("Journal write failed for {queue}", queue=self.name)
            d = fail(e)
        if d is None:  # (no fsync to wait for)
            return succeed(None)
        return d.addErrback(self._confirm_failed, xid)

    def _confirm_failed(self, failure: Failure, xid: int) -> Failure:
        """A durable confirm's record was lost: the reload opens C{xid} again; say why."""
        self._reopening.add(xid)
        return unavailable_failure(self.name, failure)

    def _open_reads_changed(self) -> None:
        """Tell the observer (if any) the size of the open-read table and of its timed part."""
        observer = self.observer
        if observer is not None:
            count = len(self._open_by_xid)
            timed = count if self._config.open_transaction_timeout is not None else 0
            observer.open_reads_changed(count, timed)

    def _time_out_open_reads(self) -> None:
        """Abort every open read older than the timeout; the oldest ends up at the head."""
        if self._closed:
            return
        for xid in reversed(self._reads.stale()):
            self._log.info("{queue}: open read {xid} timed out; returned to the head",
                           queue=self.name, xid=xid)
            self.unremove(xid)

    # ----- whole-queue operations

    def flush(self) -> None:
        """
        Remove every item readers may see (also those read-behind on disk);
        open reads, and items waiting unseen for their fsync, are untouched.
        """
        while self.remove(False) is not None:
            pass
        self.total_flushes += 1

    def close(self, graceful: bool = False) -> Deferred[None]:
        """
        Close the queue: refuse further work, answer every waiter, close the journal.

        With C{graceful}, an empty queue's journal is first rewritten (only
        open reads remain in it). The Deferred fires when the journal is closed.
        """
        if self._closed:
            return succeed(None)
        if (graceful and self.length == 0 and self._config.keep_journal
                and self._health.takes_adds):
            self._log.info("Rewriting journal of {queue} at graceful shutdown", queue=self.name)
            self._compactor.rewrite()
        self._closed = True
        self._health.close()
        self._compactor.close()
        self._reads.stop()
        self._blocked.close()
        return self.journal.close()

    def destroy_journal(self) -> None:
        """Erase (or archive) every journal file of this queue."""
        self.journal.erase()

    # ----- after a journal failure (what JournalHealth asks)

    def readable_again(self) -> None:
        """Memory agrees with the journal again: wake the next blocked reader."""
        self._reopening.clear()  # (the reload opened them again)
        self._blocked.wake()

    # ----- journal maintenance

    def read_back(self, item: QItem) -> None:
        """Append C{item}, read back from the journal, to memory (read-behind)."""
        self._items.append(item)
        self.memory_bytes += len(item.data)
