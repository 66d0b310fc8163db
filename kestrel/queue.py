"""
PersistentQueue: one durable FIFO queue, mirroring Kestrel 2.4's C{PersistentQueue}.

The queue holds its items in memory (up to C{max_memory_size} payload bytes;
the rest stays in the journal and is read back, "read-behind"), tracks open
reads (tentative removes) by xid, applies the limits and expiry rules of its
L{QueueConfig}, journals every change, and wakes blocked readers. It knows
nothing of sockets: time comes from the injected clock, and the journal is
an L{kestrel.journal.interface.IJournal} (C{FileJournal} or C{MemoryJournal}).

Where this deliberately differs from Kestrel (C{docs/differences.md}):
expired items are discarded before the fullness check and are never handed
to a client, C{open_transaction_timeout} is enforced by a timer, and C{age}
is how long the last fetched item waited.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Protocol

from twisted.internet.defer import CancelledError, Deferred, fail, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from kestrel import names
from kestrel.config import QueueConfig
from kestrel.errors import JournalUnavailable
from kestrel.item import QItem
from kestrel.journal.events import QueueEvents, event_applier
from kestrel.journal.interface import IJournal
from kestrel.journal.records import next_xid
from kestrel.waiters import ReadWaiters

if TYPE_CHECKING:
    from kestrel.journal.pack import Checkpoint

#: Seconds between attempts to write a failed journal again (see docs/journal.md).
JOURNAL_RETRY_SECONDS = 1.0

#: How many recent confirms and aborts a queue remembers, to apply them again
#: when a journal failure cut their records.
RECENT_CLOSES = 65536

_OK = "ok"
_FAILED = "failed"
_READ_ONLY = "read-only"


def _reason(error: BaseException) -> str:
    """A short reason for an I/O error: C{No space left on device (errno 28)}."""
    if isinstance(error, OSError) and error.strerror:
        return f"{error.strerror} (errno {error.errno})"
    return str(error) or type(error).__name__


class QueueObserver(Protocol):
    """
    What a queue reports about itself when observed (Kestrel's per-queue metrics).

    Every method is called synchronously from the queue's own operation and
    must be cheap and must not raise. A queue built without an observer
    reads no clock and calls nothing for them. Durations are clock seconds.
    """

    def journal_rewritten(self, seconds: float) -> None:
        """A journal rewrite (compaction) took C{seconds}."""

    def journal_rotated(self, seconds: float) -> None:
        """A journal rotation took C{seconds}."""

    def read_behind_filled(self, seconds: float) -> None:
        """A read-behind refill (reading items back from the journal) took C{seconds}."""

    def item_added(self, size: int, queue_size: int) -> None:
        """A client add of C{size} payload bytes was stored; C{queue_size} items are in memory."""

    def item_removed(self, queue_size: int) -> None:
        """An item was removed for a reader; C{queue_size} items remain in memory."""

    def open_reads_changed(self, open_reads: int, expiring: int) -> None:
        """
        The table of open reads changed (opened, confirmed, aborted, continued):
        it holds C{open_reads}, C{expiring} of them under C{open_transaction_timeout}.
        """


class PersistentQueue:
    """
    A named queue with journaled adds, removes and open reads.

    Promises: an item whose add was acknowledged stays in the queue (or the
    journal) until it is removed, confirmed, expired, discarded by
    C{discard_old_when_full} or flushed; each item is handed to at most one
    reader at a time; aborted reads go back to the head.

    Stats are plain attributes, read without cost: C{length}, C{bytes},
    C{memory_bytes}, C{total_items}, C{expired_items}, C{discarded},
    C{transactions}, C{canceled_transactions}, C{total_flushes},
    C{journal_rewrites}, C{journal_rotations}, C{put_items}, C{put_bytes},
    C{get_items_hit}, C{get_items_miss}, C{create_time} (clock seconds);
    C{memory_length}, C{waiter_count}, C{open_read_count} and C{age}
    are cheap properties.

    @ivar expire_to: called with every item that expires, when the
        collection wires C{expire_to_queue}; C{None} drops expired items.
    @ivar is_fanout_master: whether C{fanout_only} makes this queue store
        nothing (Kestrel: every queue whose name has no C{+}). The collection
        may set it.
    @ivar observer: the L{QueueObserver} told of journal maintenance
        durations, request and queue sizes, or C{None} (nothing is measured).

    C{fsync_failed}, when given, is told of every failed fsync of the
    journal (the server counts them as C{fsync_error_<class>}).
    """

    _log = Logger()

    def __init__(self, name: str, config: QueueConfig, journal: IJournal,
                 clock: IReactorTime, *, observer: QueueObserver | None = None,
                 fsync_failed: Callable[[OSError], None] | None = None) -> None:
        self.name = name
        self.observer = observer
        self._fsync_failed = fsync_failed
        self.journal = journal
        self._clock = clock
        self._config = config
        self._items: deque[QItem] = deque()
        self._open_reads: dict[int, QItem] = {}
        #: open xid -> clock seconds when it was opened, in the order they were opened
        self._open_since: dict[int, float] = {}
        self._xid_counter = 0
        self._waiters = ReadWaiters(clock)
        self._closed = False
        self._replaying = False
        self._allow_rewrites = True
        self._maintaining = False
        self._rewrite_timer: IDelayedCall | None = None
        self._open_read_timer: IDelayedCall | None = None
        self._last_wait_ms = 0
        # After a failed journal write or fsync: _FAILED until memory is
        # rebuilt from the journal, then _READ_ONLY until a probe succeeds.
        self._journal_state = _OK
        self._journal_reason = ""
        self._failure_kind = "write"
        self._recovery_call: IDelayedCall | None = None
        self._recovering = False
        # Confirms (True) and aborts (False) of open reads asked for while _FAILED.
        self._closes_while_failed: list[tuple[int, bool]] = []
        # The latest closes of open reads (xid -> confirmed): after a failure
        # cut their records, a reload applies them again as they were.
        self._recent_closes: OrderedDict[int, bool] = OrderedDict()
        #: How many times the journal failed and the queue went read-only.
        self.journal_failures = 0
        # What each replayed record does to memory (kestrel.journal.events).
        self._replay_apply = event_applier(_Replay(self), self._now_ms)
        journal.on_failure = self._journal_failed
        journal.on_skipped_adds = self._count_replayed
        #: Calls a function outside any open write batch (see L{IJournal.call_unbatched}).
        self.call_unbatched = journal.call_unbatched
        self.expire_to: Callable[[QItem], object] | None = None
        self.is_fanout_master = names.FANOUT_SEPARATOR not in name
        self.create_time = clock.seconds()

        self.length = 0
        self.bytes = 0
        self.memory_bytes = 0
        self.total_items = 0
        self.put_items = 0
        self.put_bytes = 0
        self.get_items_hit = 0
        self.get_items_miss = 0
        self.expired_items = 0
        self.discarded = 0
        self.transactions = 0
        self.canceled_transactions = 0
        self.total_flushes = 0
        self.journal_rewrites = 0
        self.journal_rotations = 0

    # ----- configuration and derived stats

    @property
    def config(self) -> QueueConfig:
        """The queue's settings; assigning a new one takes effect at once."""
        return self._config

    @config.setter
    def config(self, config: QueueConfig) -> None:
        self._config = config
        self._schedule_open_read_timer(reschedule=True)

    @property
    def memory_length(self) -> int:
        """How many items are held in memory (the rest are read-behind on disk)."""
        return len(self._items)

    @property
    def waiter_count(self) -> int:
        """How many blocked reads wait on this queue."""
        return len(self._waiters)

    @property
    def open_read_count(self) -> int:
        """How many reads are open (removed tentatively, not yet confirmed or aborted)."""
        return len(self._open_reads)

    @property
    def age(self) -> int:
        """Milliseconds the last fetched item waited in the queue; 0 when the queue is empty."""
        return self._last_wait_ms if self.length else 0

    @property
    def journal_state(self) -> str:
        """C{"ok"}, C{"failed"} (a journal write or fsync failed; memory is being
        rebuilt from the journal) or C{"read-only"} (adds refused until the
        journal can be written again)."""
        return self._journal_state

    @property
    def is_closed(self) -> bool:
        """Whether L{close} ran: the queue refuses adds and returns no items."""
        return self._closed

    @property
    def in_read_behind(self) -> bool:
        """Whether some of the queue's items are only on disk."""
        return self.journal.in_read_behind

    @property
    def journal_bytes(self) -> int:
        """Bytes in every journal file of the queue (current and rotated)."""
        journal = self.journal
        return journal.size + journal.archived_size

    @property
    def logsize(self) -> int:
        """Bytes in the current journal file (Kestrel's C{logsize} stat)."""
        return self.journal.size

    @property
    def xid_counter(self) -> int:
        """The last xid handed out (or replayed)."""
        return self._xid_counter

    def open_items(self) -> list[QItem]:
        """Return the open reads' items, most recently opened xid first (descending xid)."""
        return [self._open_reads[x] for x in sorted(self._open_reads, reverse=True)]

    def dump_stats(self) -> list[tuple[str, str]]:
        """Return the per-queue stats in the order of Kestrel's C{STATS} (without C{children})."""
        return [
            ("items", str(self.length)),
            ("bytes", str(self.bytes)),
            ("total_items", str(self.total_items)),
            ("logsize", str(self.logsize)),
            ("expired_items", str(self.expired_items)),
            ("mem_items", str(len(self._items))),
            ("mem_bytes", str(self.memory_bytes)),
            ("age", str(self.age)),
            ("discarded", str(self.discarded)),
            ("waiters", str(len(self._waiters))),
            ("open_transactions", str(len(self._open_reads))),
            ("transactions", str(self.transactions)),
            ("canceled_transactions", str(self.canceled_transactions)),
            ("total_flushes", str(self.total_flushes)),
            ("journal_rewrites", str(self.journal_rewrites)),
            ("journal_rotations", str(self.journal_rotations)),
        ]

    def is_ready_for_expiration(self) -> bool:
        """Whether C{max_queue_age} says the sweep may delete this queue (empty and old enough)."""
        max_queue_age = self._config.max_queue_age
        return (max_queue_age is not None and not self._items
                and self._clock.seconds() > self.create_time + max_queue_age)

    def _now_ms(self) -> int:
        return int(self._clock.seconds() * 1000)

    # ----- setup / replay

    def setup(self) -> None:
        """
        Load the queue from its journal.

        Every record is applied in order; afterwards every read still open is
        aborted (UNREMOVE journaled, descending xid) so that the open items
        stand at the head in ascending-xid order. With C{keep_journal: false}
        the journal is erased instead.
        """
        for _ in self.setup_steps():
            pass

    def setup_steps(self, slice_bytes: int | None = None) -> Generator[int, None, None]:
        """
        L{setup} in steps: a generator pausing after about every C{slice_bytes}
        bytes of journal read (see C{FileJournal.replay_steps}). Closed before
        its end, it leaves the journal files as they were; the queue must then
        be closed (not graceful), never served.
        """
        self.length = 0
        self.bytes = 0
        if not self._config.keep_journal:
            self.journal.erase()
            return
        self._log.info("Replaying transaction journal for {queue}", queue=self.name)
        self._xid_counter = 0
        self._replaying = True
        # (Sliced replay is FileJournal's; setup() replays through replay() as always.)
        replay_steps = getattr(self.journal, "replay_steps", None)
        try:
            if replay_steps is None or slice_bytes is None:
                self.journal.replay(self._replay_apply, self._forget_replayed)
            else:
                yield from replay_steps(self._replay_apply, self._forget_replayed, slice_bytes)
        finally:
            self._replaying = False
        for xid in sorted(self._open_reads, reverse=True):
            self._journal_write(self.journal.unremove, xid)
            self._return_to_head(xid)
        self._log.info(
            "Replayed {queue}: {items} items, {bytes} bytes, xid={xid}",
            queue=self.name, items=self.length, bytes=self.bytes, xid=self._xid_counter)

    def _forget_replayed(self) -> None:
        """Replay found a damaged rotated file: forget what came before (see FileJournal.replay)."""
        self._items = deque()
        self._open_reads = {}
        self.length = self.bytes = self.memory_bytes = 0

    def _count_replayed(self, items: int, data_bytes: int) -> None:
        """Count C{items} adds beyond memory that replay skipped (read-behind reads them)."""
        self.total_items += items
        self.put_items += items
        self.put_bytes += data_bytes
        self.bytes += data_bytes
        self.length += items

    def _replay_add(self, item: QItem) -> None:
        self._store(item)
        if not self.journal.in_read_behind and self.bytes >= self._config.max_memory_size:
            self._log.info("Dropping to read-behind for {queue} ({bytes} bytes)",
                           queue=self.name, bytes=self.bytes)
            self.journal.start_read_behind()

    def _replay_open(self, xid: int) -> None:
        item = self._pop_head()
        if item is None:
            self._log.warn("Journal of {queue} opens xid {xid} on an empty queue; ignored",
                           queue=self.name, xid=xid)
            return
        item.xid = xid
        self._open_reads[xid] = item

    # ----- adding

    def add(self, data: bytes, expiry_ms: int = 0, xid: int | None = None,
            add_time_ms: int | None = None) -> Deferred[bool]:
        """
        Append an item; the Deferred fires C{True} if it was stored, C{False} if refused.

        Refused: the queue is closed, the item is larger than
        C{max_item_size}, or the queue is full (C{max_items}/C{max_size},
        counted after the expired head items are discarded) and
        C{discard_old_when_full} is off. A C{fanout_only} master reports
        success and stores nothing. With C{xid}, open read C{xid} is
        confirmed in the same journal record (CONTINUE).

        The Deferred fires at once, except when the queue acknowledges
        durably (C{sync_journal: always}, or C{durable_acks} with a sync
        period), where it fires after the fsync covering the journal write
        (and fails if that fsync fails). A journal write that fails at once stores nothing and
        fails the Deferred.

        @param expiry_ms: absolute epoch ms, 0 for never; capped by C{max_age}.
        @param add_time_ms: the item's add time (default: now).
        """
        cfg = self._config
        size = len(data)
        if self._closed or (cfg.max_item_size is not None and size > cfg.max_item_size):
            return succeed(False)
        if cfg.fanout_only and self.is_fanout_master:
            return succeed(True)
        if self._journal_state is not _OK:
            return fail(JournalUnavailable(self.name, self._journal_reason))
        items = self._items
        # (_sweep's own first test, inlined: on this path the call costs more than the test)
        if items and (items[0].expiry_ms or cfg.max_age is not None):
            self._sweep(None)
        max_items = cfg.max_items
        max_size = cfg.max_size
        while ((max_items is not None and self.length >= max_items)
               or (max_size is not None and self.bytes >= max_size)):
            if not cfg.discard_old_when_full or not self._items:
                return succeed(False)
            self._pop_head()
            self.discarded += 1
            self._journal_write(self.journal.remove)
            self._fill_read_behind()
            self._sweep(None)
        now_ms = int(self._clock.seconds() * 1000)
        if cfg.max_age is not None:
            cap = now_ms + int(cfg.max_age * 1000)
            if not expiry_ms or cap < expiry_ms:
                expiry_ms = cap
        item = QItem(data, now_ms if add_time_ms is None else add_time_ms, expiry_ms)
        journal = self.journal
        if cfg.keep_journal:
            self._check_rotate_journal()
            # Never with an empty memory: the head must stay readable (max_memory_size 0).
            if (not journal.in_read_behind and self.bytes >= cfg.max_memory_size
                    and self._items):
                self._log.info("Dropping to read-behind for {queue} ({bytes} bytes)",
                               queue=self.name, bytes=self.bytes)
                journal.start_read_behind()
        if self._journal_state is not _OK:
            # Journal maintenance above (a sweep, a rotation) failed.
            return fail(JournalUnavailable(self.name, self._journal_reason))
        try:
            d = journal.add(item) if xid is None else journal.continue_(xid, item)
        except Exception as e:
            self._log.failure("Journal write failed for {queue}; item refused", queue=self.name)
            return fail(JournalUnavailable(self.name, _reason(e)))
        if d.called and isinstance(d.result, Failure):
            # The OS refused the write (the file is cut back): the item is not in the journal.
            failure = d.result
            d.addErrback(lambda _: None)
            self._log.warn("Journal write failed for {queue}; item refused: {error}",
                           error=failure.value, queue=self.name)
            return fail(JournalUnavailable(self.name, _reason(failure.value)))
        if xid is not None and self._open_reads.pop(xid, None) is not None:
            self._open_since.pop(xid, None)
            self._open_reads_changed()
        self._store(item)
        observer = self.observer
        if observer is not None:
            observer.item_added(size, len(items))
        self._waiters.trigger()
        if cfg.durable_acks or cfg.sync_journal == 0.0:
            # The journal's Deferred is this write's own: chain on it directly.
            return d.addCallbacks(_stored, self._durable_add_failed)
        if not d.called:
            d.addErrback(self._write_failed)
        return succeed(True)

    def _durable_add_failed(self, failure: Failure) -> None:
        """A durable add's write or fsync failed: the recovery drops it; say why."""
        if failure.check(JournalUnavailable):
            failure.raiseException()
        raise JournalUnavailable(self.name, _reason(failure.value))

    def _store(self, item: QItem) -> None:
        size = len(item.data)
        if not self.journal.in_read_behind:
            self._items.append(item)
            self.memory_bytes += size
        self.total_items += 1
        self.put_items += 1
        self.put_bytes += size
        self.bytes += size
        self.length += 1

    # ----- reading

    def peek(self) -> QItem | None:
        """Return the head item without removing it (expired items are discarded first)."""
        if self._closed or not self.length:
            return None
        if self._journal_state is _FAILED:
            raise JournalUnavailable(self.name, self._journal_reason)
        self._sweep(None)
        return self._items[0] if self._items else None

    def remove(self, open_read: bool = False) -> QItem | None:
        """
        Remove and return the head item, or C{None} when there is none.

        Expired head items are discarded first, so the item returned is
        live. With C{open_read}, the item is opened under a fresh xid
        (C{item.xid}) and stays owed to the queue until L{confirm_remove} or
        L{unremove}. Open reads older than C{open_transaction_timeout} are
        aborted before the item is chosen.
        """
        if self._closed or not self.length:
            return None
        if self._journal_state is _FAILED:
            raise JournalUnavailable(self.name, self._journal_reason)
        if open_read:
            self.transactions += 1
        if self._open_since and self._config.open_transaction_timeout is not None:
            self._time_out_open_reads()
        items = self._items
        if items and (items[0].expiry_ms or self._config.max_age is not None):  # (as in add)
            self._sweep(None)
        item = self._pop_head()
        if item is None:
            return None
        wait_ms = int(self._clock.seconds() * 1000) - item.add_time_ms
        self._last_wait_ms = wait_ms if wait_ms > 0 else 0
        journal = self.journal
        if open_read:
            xid = self._next_xid()
            item.xid = xid
            self._open_reads[xid] = item
            self._open_since[xid] = self._clock.seconds()
            if self._open_read_timer is None and self._config.open_transaction_timeout is not None:
                self._schedule_open_read_timer()
            self._journal_write(journal.remove_tentative, xid)
        else:
            self._journal_write(journal.remove)
        if self._journal_state is _FAILED:
            # The remove is not journaled: the item is not handed out (memory
            # is rebuilt from the journal, where it is still queued).
            raise JournalUnavailable(self.name, self._journal_reason)
        if self._config.keep_journal:
            if journal.in_read_behind:
                self._fill_read_behind()
            self._check_rotate_journal()
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
            self._fill_read_behind()
        return item

    def _next_xid(self) -> int:
        self._xid_counter = xid = next_xid(self._xid_counter, self._open_reads)
        return xid

    def wait_remove(self, deadline: float | None,
                    open_read: bool = False) -> Deferred[QItem | None]:
        """
        Remove the head item, waiting for one until C{deadline} if the queue is empty.

        @param deadline: absolute clock seconds, or C{None} not to wait.
        @return: a Deferred firing with the item, or C{None} at the deadline
            (or when the queue closes or evicts its waiters). Waiters are
            served first come, first served, one item each. Cancelling the
            Deferred leaves the line; no item is taken for it.
        """
        item = self.remove(open_read)
        if item is not None:
            # The usual case: no closure, no pending read.
            self.get_items_hit += 1
            return succeed(item)
        return self._wait(lambda: self.remove(open_read), deadline, False, item)

    def wait_peek(self, deadline: float | None) -> Deferred[QItem | None]:
        """
        Peek at the head item, waiting for one until C{deadline} if the queue is empty.

        A woken peeker leaves the item in place and passes the wake-up on, so
        a reader behind it is woken for the same item.
        """
        return self._wait(self.peek, deadline, True, self.peek())

    def _wait(self, op: Callable[[], QItem | None], deadline: float | None,
              passes_wake: bool, item: QItem | None) -> Deferred[QItem | None]:
        """Answer with C{item} (the result of a first C{op()}), or wait to retry C{op}."""
        if (item is not None or deadline is None or self._closed
                or deadline <= self._clock.seconds()):
            if item is None:
                self.get_items_miss += 1
            else:
                self.get_items_hit += 1
            return succeed(item)
        return _PendingRead(self, op, deadline, passes_wake).result

    def evict_waiters(self) -> None:
        """Answer every blocked read with "no item" now."""
        self._waiters.evict_all()

    # ----- open reads

    def unremove(self, xid: int) -> None:
        """
        Abort open read C{xid}: its item goes back to the head and one waiter is woken.

        An unknown xid is logged and ignored.
        """
        if self._closed:
            return
        if self._journal_state is _FAILED:
            self._closes_while_failed.append((xid, False))
            return
        if xid in self._open_reads:
            self._return_to_head(xid)
            self._open_since.pop(xid, None)
            self._remember_close(xid, False)
            self._journal_write(self.journal.unremove, xid)
            self.canceled_transactions += 1
            self._open_reads_changed()
        else:
            self._log.warn("{queue}: abort of xid {xid}, which is not open",
                           queue=self.name, xid=xid)
        self._waiters.trigger()

    def _remember_close(self, xid: int, confirmed: bool) -> None:
        closes = self._recent_closes
        closes[xid] = confirmed
        if len(closes) > RECENT_CLOSES:
            closes.popitem(last=False)

    def _return_to_head(self, xid: int) -> None:
        opened = self._open_reads.pop(xid, None)
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
        """Confirm open read C{xid}: its item is gone for good. An unknown xid is logged."""
        if self._closed:
            return
        if self._journal_state is _FAILED:
            self._closes_while_failed.append((xid, True))
            return
        if self._open_reads.pop(xid, None) is not None:
            self._open_since.pop(xid, None)
            self._remember_close(xid, True)
            self._journal_write(self.journal.confirm_remove, xid)
            self._open_reads_changed()
        else:
            self._log.warn("{queue}: confirm of xid {xid}, which is not open",
                           queue=self.name, xid=xid)

    def _open_reads_changed(self) -> None:
        """Tell the observer (if any) the size of the open-read table and of its timed part."""
        observer = self.observer
        if observer is not None:
            count = len(self._open_reads)
            timed = count if self._config.open_transaction_timeout is not None else 0
            observer.open_reads_changed(count, timed)

    def _time_out_open_reads(self) -> None:
        """Abort every open read older than the timeout; the oldest ends up at the head."""
        timeout = self._config.open_transaction_timeout
        if timeout is None:
            return
        limit = self._clock.seconds() - timeout
        stale = []
        for xid, since in self._open_since.items():
            if since > limit:
                break
            stale.append(xid)
        for xid in reversed(stale):
            self._log.info("{queue}: open read {xid} timed out; returned to the head",
                           queue=self.name, xid=xid)
            self.unremove(xid)

    def _schedule_open_read_timer(self, reschedule: bool = False) -> None:
        if self._open_read_timer is not None:
            if not reschedule:
                return
            if self._open_read_timer.active():
                self._open_read_timer.cancel()
            self._open_read_timer = None
        timeout = self._config.open_transaction_timeout
        if timeout is None or not self._open_since or self._closed:
            return
        oldest = next(iter(self._open_since.values()))
        delay = oldest + timeout - self._clock.seconds()
        self._open_read_timer = self._clock.callLater(max(0.0, delay), self._open_read_timer_fired)

    def _open_read_timer_fired(self) -> None:
        self._open_read_timer = None
        if self._closed:
            return
        self._time_out_open_reads()
        self._schedule_open_read_timer()

    # ----- expiry

    def discard_expired(self, limit: int | None = None) -> int:
        """
        Discard expired items from the head; return how many.

        At most C{limit} items (default C{max_expire_sweep}; C{None} there
        means no limit). An item is expired when its expiry, capped by the
        I{current} C{max_age} from its add time, is strictly before now.
        Each expired item is journaled as a REMOVE, counted in
        C{expired_items} and handed to C{expire_to}.
        """
        if limit is None:
            limit = self._config.max_expire_sweep
        return self._sweep(limit)

    def _sweep(self, limit: int | None) -> int:
        items = self._items
        if self._replaying or not items:
            return 0
        max_age = self._config.max_age
        head = items[0]
        if not head.expiry_ms and max_age is None:
            return 0
        now_ms = self._now_ms()
        max_age_ms = None if max_age is None else int(max_age * 1000)
        expired: list[QItem] = []
        keep_journal = self._config.keep_journal
        while items and (limit is None or len(expired) < limit):
            head = items[0]
            expiry = head.expiry_ms
            if max_age_ms is not None:
                cap = head.add_time_ms + max_age_ms
                if not expiry or cap < expiry:
                    expiry = cap
            if not expiry or expiry >= now_ms:
                break
            self._pop_head()
            self.expired_items += 1
            self._journal_write(self.journal.remove)
            expired.append(head)
            if not items and keep_journal:
                self._fill_read_behind()
        if not expired:
            return 0
        if keep_journal:
            self._fill_read_behind()
        expire_to = self.expire_to
        if expire_to is not None:
            for item in expired:
                try:
                    expire_to(item)
                except Exception:
                    self._log.failure("expire_to failed for {queue}", queue=self.name)
        return len(expired)

    # ----- whole-queue operations

    def flush(self) -> None:
        """Remove every item (also those read-behind on disk); open reads are untouched."""
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
                and self._journal_state is _OK):
            self._log.info("Rewriting journal of {queue} at graceful shutdown", queue=self.name)
            self._rewrite_journal()
        self._closed = True
        for timer in (self._rewrite_timer, self._open_read_timer, self._recovery_call):
            if timer is not None and timer.active():
                timer.cancel()
        self._rewrite_timer = self._open_read_timer = self._recovery_call = None
        self._waiters.trigger_all()
        return self.journal.close()

    def destroy_journal(self) -> None:
        """Erase (or archive) every journal file of this queue."""
        self.journal.erase()

    # ----- a journal that fails

    def _journal_failed(self, kind: str, error: OSError) -> None:
        """
        A write or fsync of the journal failed: refuse work until memory is
        rebuilt from the journal (at once, on the next reactor turn).

        The journal is the truth: an add whose record did not make it is not
        in the queue afterwards, a remove whose record did not make it is
        not removed. Until the journal is written again the queue refuses
        adds (L{JournalUnavailable}); reads go on.
        """
        if kind == "fsync" and self._fsync_failed is not None:
            self._fsync_failed(error)
        if self._closed:
            return
        self._journal_reason = _reason(error)
        if self._journal_state is _FAILED:
            self._failure_kind = "fsync" if kind == "fsync" else self._failure_kind
            return
        self.journal_failures += 1
        self._journal_state = _FAILED
        self._failure_kind = kind
        self._log.error(
            "Journal {kind} failed for {queue}: {error}; the queue is read-only until its "
            "journal can be written again", kind=kind, queue=self.name, error=self._journal_reason)
        if not self._recovering:
            self._schedule_recovery(0.0)

    def _schedule_recovery(self, delay: float) -> None:
        call = self._recovery_call
        if call is not None and call.active():
            call.cancel()
        self._recovery_call = self._clock.callLater(delay, self._recover)

    def _recover(self) -> None:
        """Cut the journal back to what it surely holds and rebuild memory from it."""
        self._recovery_call = None
        if self._closed:
            return
        self._recovering = True
        kind = self._failure_kind
        error = OSError(self._journal_reason)
        try:
            d = self.journal.recover(kind, error)
        except Exception as e:
            d = fail(e)
        d.addCallbacks(self._recovered_journal, self._recovery_failed)

    def _recovery_failed(self, failure: Failure) -> None:
        self._recovering = False
        self._journal_reason = _reason(failure.value)
        self._journal_state = _FAILED
        self._log.error("Journal of {queue} still cannot be written ({error}); retrying in "
                        "{delay}s", queue=self.name, error=self._journal_reason,
                        delay=JOURNAL_RETRY_SECONDS)
        if not self._closed:
            self._schedule_recovery(JOURNAL_RETRY_SECONDS)

    def _recovered_journal(self, kept: int) -> None:
        if self._closed:
            self._recovering = False
            return
        try:
            self._reload()
        except Exception:
            self._recovery_failed(Failure())
            return
        self._recovering = False
        if self._journal_state is _FAILED:
            # (the reload's own writes failed again)
            self._schedule_recovery(JOURNAL_RETRY_SECONDS)
            return
        self._journal_state = _READ_ONLY
        self._log.warn("Journal of {queue} reloaded after a failure: {items} items, {open} open "
                       "reads; adds are refused until the journal can be written",
                       queue=self.name, items=self.length, open=len(self._open_reads))
        self._waiters.trigger()
        self._recovery_call = self._clock.callLater(JOURNAL_RETRY_SECONDS, self._probe)

    def _reload(self) -> None:
        """Rebuild the items and open reads from the journal, keeping counters and waiters."""
        before_open = self._open_reads
        before_since = self._open_since
        xid_before = self._xid_counter
        counters = (self.total_items, self.put_items, self.put_bytes)
        self._items = deque()
        self._open_reads = {}
        self.length = self.bytes = self.memory_bytes = 0
        self._xid_counter = 0
        self._replaying = True
        try:
            self.journal.replay(self._replay_apply, self._forget_replayed)
        finally:
            self._replaying = False
            self.total_items, self.put_items, self.put_bytes = counters
        # Never hand out an xid twice: a client may hold one the journal lost.
        self._xid_counter = max(self._xid_counter, xid_before)
        now = self._clock.seconds()
        self._open_since = {x: before_since.get(x, now) for x in self._open_reads}
        # Open in the journal, closed in memory since (the close was cut off
        # with the failed records): closed again as it was (a confirm may have
        # been acknowledged); put back when unknown, never lost.
        gone = sorted((x for x in self._open_reads if x not in before_open), reverse=True)
        closes, self._closes_while_failed = self._closes_while_failed, []
        self._journal_state = _READ_ONLY
        for xid in gone:
            self._open_since.pop(xid, None)
            if self._recent_closes.get(xid, False):
                self._open_reads.pop(xid, None)
                self._journal_write(self.journal.confirm_remove, xid)
            else:
                self._journal_write(self.journal.unremove, xid)
                self._return_to_head(xid)
        for xid, confirm in closes:
            if confirm:
                self.confirm_remove(xid)
            else:
                self.unremove(xid)
        self._open_reads_changed()
        self._schedule_open_read_timer(reschedule=True)

    def _probe(self) -> None:
        """While read-only, try a harmless journal write; on success the queue is writable."""
        self._recovery_call = None
        if self._closed or self._journal_state is not _READ_ONLY:
            return
        try:
            d = self.journal.probe(self._xid_counter)
        except Exception as e:
            d = fail(e)
        d.addCallbacks(self._probe_succeeded, self._probe_failed)

    def _probe_succeeded(self, _: object) -> None:
        if self._closed or self._journal_state is not _READ_ONLY:
            return
        self._journal_state = _OK
        self._journal_reason = ""
        self._log.info("Journal of {queue} can be written again; the queue takes adds",
                       queue=self.name)

    def _probe_failed(self, failure: Failure) -> None:
        if self._closed or self._journal_state is not _READ_ONLY:
            return
        # A failure reported by the file itself already switched the state.
        self._journal_reason = _reason(failure.value)
        self._recovery_call = self._clock.callLater(JOURNAL_RETRY_SECONDS, self._probe)

    # ----- journal maintenance

    def _journal_write(self, write: Callable[..., Deferred[None]], *args: object) -> None:
        """Write a record whose durability nobody waits for; log any failure."""
        try:
            d = write(*args)
        except Exception:
            self._log.failure("Journal write failed for {queue}", queue=self.name)
            return
        if not d.called or isinstance(d.result, Failure):
            d.addErrback(self._write_failed)

    def _write_failed(self, failure: Failure) -> None:
        if failure.check(CancelledError) is not None:
            return
        if failure.check(OSError, JournalUnavailable) is not None:
            # An I/O error, not a bug: no traceback (a file journal also
            # reported it through on_failure, and the queue recovers from it).
            self._log.error("Journal write failed for {queue}: {error}", queue=self.name,
                            error=failure.value)
            return
        self._log.failure("Journal write failed for {queue}", failure=failure,
                          queue=self.name)

    def _fill_read_behind(self) -> None:
        """
        Read items back from the journal until memory is full or the reader catches up.

        Memory always gets at least one item (the head), even when
        C{max_memory_size} is 0 or smaller than the head item: a queue in
        read-behind with an empty memory could not hand anything out.
        """
        journal = self.journal
        limit = self._config.max_memory_size
        items = self._items
        if not journal.in_read_behind or (self.memory_bytes >= limit and items):
            return
        observer = self.observer
        started = self._clock.seconds() if observer is not None else 0.0
        while journal.in_read_behind and (self.memory_bytes < limit or not items):
            journal.fill_read_behind(self._got_item, self._got_checkpoint)
            if not journal.in_read_behind:
                self._log.info("Coming out of read-behind for {queue}", queue=self.name)
        if observer is not None:
            observer.read_behind_filled(self._clock.seconds() - started)

    def _got_item(self, item: QItem) -> None:
        self._items.append(item)
        self.memory_bytes += len(item.data)

    def _got_checkpoint(self, checkpoint: Checkpoint) -> None:
        self._log.info("Packing journal of {queue} from checkpoint", queue=self.name)
        self.journal.start_pack(checkpoint, list(self._open_reads.values()), list(self._items),
                                xid_counter=self._xid_counter)

    def _rewrite_journal(self) -> None:
        if len(self._items) != self.length:
            # Some items are only on disk (read-behind): a rewrite from memory would lose them.
            self._log.warn("Not rewriting journal of {queue}: {missing} items are not in memory",
                           queue=self.name, missing=self.length - len(self._items))
            return
        observer = self.observer
        started = self._clock.seconds() if observer is not None else 0.0
        self.journal.rewrite(self.open_items(), list(self._items),
                             xid_counter=self._xid_counter)
        self.journal_rewrites += 1
        if observer is not None:
            observer.journal_rewritten(self._clock.seconds() - started)

    def _rotate_journal(self, set_checkpoint: bool) -> None:
        observer = self.observer
        started = self._clock.seconds() if observer is not None else 0.0
        self.journal.rotate(self.open_items(), set_checkpoint)
        self.journal_rotations += 1
        if observer is not None:
            observer.journal_rotated(self._clock.seconds() - started)

    def _disallow_rewrites_for_delay(self) -> None:
        delay = self._config.min_journal_compact_delay
        if delay is None:
            return
        self._allow_rewrites = False
        if self._rewrite_timer is not None and self._rewrite_timer.active():
            self._rewrite_timer.cancel()
        self._rewrite_timer = self._clock.callLater(delay, self._allow_rewrites_again)

    def _allow_rewrites_again(self) -> None:
        self._rewrite_timer = None
        self._allow_rewrites = True

    def _check_rotate_journal(self) -> None:
        """
        Rewrite or rotate the journal when it has grown (Kestrel's checkRotateJournal).

        A rewrite or rotation that fails (a full disk, say) leaves the
        journal files as they were; it is logged and tried again later.
        """
        journal = self.journal
        cfg = self._config
        size = journal.size
        if (size < cfg.default_journal_size and size <= cfg.max_memory_size
                and size + journal.archived_size <= cfg.max_journal_size):
            return  # nothing to do (the common case, checked first: it runs per operation)
        if (self._journal_state is not _OK or self._maintaining
                or journal.maintaining):
            # (an acknowledgement fired by a rotation or rewrite in progress
            # led here, or a rotation's fsyncs still run in a thread: that
            # one finishes first; the next operation checks again)
            return
        self._maintaining = True
        try:
            self._check_rotate_journal_now()
        except OSError as e:
            self._log.error("Journal maintenance of {queue} failed: {error}; the journal "
                            "stays as it was", queue=self.name, error=_reason(e))
        finally:
            self._maintaining = False

    def _check_rotate_journal_now(self) -> None:
        """The journal has outgrown a limit (L{_check_rotate_journal} checked): act on it."""
        cfg = self._config
        journal = self.journal
        size = journal.size
        # Kestrel has two policies: the aggressive one (the default) and the
        # one of disable_aggressive_rewrites, which takes a break after
        # rewriting an empty queue that stays large (KEST-366) and rewrites
        # an empty queue before rotating. Their middle step is the same.
        aggressive = not cfg.disable_aggressive_rewrites
        # While a pack is being written a rewrite would wait for it: ask again later.
        rewrites = not journal.packing
        if (rewrites and (aggressive or self._allow_rewrites)
                and size >= cfg.default_journal_size and self.length == 0):
            self._rewrite_journal()
            if not aggressive and journal.size >= cfg.default_journal_size // 2:
                self._disallow_rewrites_for_delay()
        elif (rewrites and self._allow_rewrites
              and size + journal.archived_size > cfg.max_journal_size
              and self.bytes < cfg.max_memory_size):
            self._log.info("Rewriting journal of {queue} ({bytes} bytes queued)",
                           queue=self.name, bytes=self.bytes)
            self._rewrite_journal()
            self._disallow_rewrites_for_delay()
        elif size > cfg.max_memory_size:
            if rewrites and not aggressive and self.length == 0:
                self._rewrite_journal()
            if journal.size > cfg.max_memory_size:
                self._log.info("Rotating journal of {queue}", queue=self.name)
                self._rotate_journal(
                    journal.size + journal.archived_size > cfg.max_journal_size)


class _PendingRead:
    """
    One blocked read: retries C{op} each time it is woken, until the deadline.

    The result Deferred fires once, with the item or C{None}. Cancelling it
    leaves the line. A woken read whose result already fired passes the
    wake-up on; a woken peek that saw an item passes it on too, as the item
    is still there for the next reader.
    """

    __slots__ = ("_queue", "_op", "_deadline", "_passes_wake", "_inner", "result")

    def __init__(self, queue: PersistentQueue, op: Callable[[], QItem | None],
                 deadline: float, passes_wake: bool) -> None:
        self._queue = queue
        self._op = op
        self._deadline = deadline
        self._passes_wake = passes_wake
        self._inner: Deferred[bool] | None = None
        self.result: Deferred[QItem | None] = Deferred(self._cancel)
        self._join(front=False)

    def _join(self, front: bool) -> None:
        inner = self._queue._waiters.wait(self._deadline, front)
        self._inner = inner
        inner.addCallbacks(self._woken, _ignore_cancel)

    def _cancel(self, _: Deferred[QItem | None]) -> None:
        inner, self._inner = self._inner, None
        if inner is not None:
            inner.cancel()

    def _woken(self, woken: bool) -> None:
        self._inner = None
        queue = self._queue
        if self.result.called:
            if woken:
                queue._waiters.trigger()
            return
        if not woken:
            self._finish(None)
            return
        try:
            item = self._op()
        except JournalUnavailable:
            # Memory is being rebuilt from the journal: keep the place in line.
            item = None
        if item is None and not queue.is_closed and self._deadline > queue._clock.seconds():
            self._join(front=True)
            return
        self._finish(item)
        if item is not None and self._passes_wake:
            queue._waiters.trigger()

    def _finish(self, item: QItem | None) -> None:
        queue = self._queue
        if item is None:
            queue.get_items_miss += 1
        else:
            queue.get_items_hit += 1
        # The reader's connection may reply (and serve more requests) at once,
        # perhaps inside another connection's write batch: the journal records
        # behind this result must reach the OS first, and its own must not be held.
        queue.call_unbatched(self.result.callback, item)


def _stored(_: object) -> bool:
    return True


class _Replay(QueueEvents):
    """What replayed journal records do to a queue's memory (its items, open reads, xids)."""

    __slots__ = ("_queue",)

    def __init__(self, queue: PersistentQueue) -> None:
        self._queue = queue

    def added(self, item: QItem, xid: int) -> None:
        """Store the item at the tail (an ADD_XID's xid means nothing now)."""
        self._queue._replay_add(item)

    def removed(self) -> None:
        """Drop the head item."""
        self._queue._pop_head()

    def opened(self, xid: int | None) -> None:
        """Open the head item under C{xid} (a Kestrel 1.x open: the next xid of the counter)."""
        queue = self._queue
        if xid is None:
            queue._replay_open(queue._next_xid())
            return
        queue._replay_open(xid)
        # Never lower the counter: a rewritten journal's SAVE_XID may be
        # above the xids of the opens that follow it.
        if xid > queue._xid_counter:
            queue._xid_counter = xid

    def unremoved(self, xid: int) -> None:
        """Put open read C{xid}'s item back at the head."""
        self._queue._return_to_head(xid)

    def confirmed(self, xid: int) -> None:
        """Forget open read C{xid}."""
        self._queue._open_reads.pop(xid, None)

    def xid_saved(self, xid: int) -> None:
        """Set the xid counter."""
        self._queue._xid_counter = xid


def _ignore_cancel(failure: Failure) -> None:
    failure.trap(CancelledError)
