"""
QueueStats: what a queue tells of itself, Kestrel's per-queue stats.

L{kestrel.queue.PersistentQueue} derives from it: the counters are plain
attributes the queue bumps as it works (read without cost), and the
properties here derive the rest from the queue's parts. Nothing here
changes the queue.
"""

from __future__ import annotations

from collections import deque

from twisted.internet.interfaces import IReactorTime

from kestrel.config import QueueConfig
from kestrel.item import QItem
from kestrel.journal.interface import IJournal
from kestrel.open_reads import OpenReads
from kestrel.queue_health import JournalHealth
from kestrel.queue_policy import Compactor
from kestrel.waiters import BlockingReads


class QueueStats:
    """
    The stats of one queue.

    Counters, bumped by the queue: C{length}, C{bytes}, C{memory_bytes},
    C{total_items}, C{put_items}, C{put_bytes}, C{get_items_hit},
    C{get_items_miss}, C{expired_items}, C{discarded}, C{transactions},
    C{canceled_transactions}, C{total_flushes}; C{create_time} (clock
    seconds). Derived, cheap properties: C{memory_length}, C{waiter_count},
    C{open_read_count}, C{age}, C{journal_rewrites}, C{journal_rotations},
    C{journal_state} and the journal's sizes.
    """

    # The queue's parts the stats are read from (set by the queue).
    name: str
    journal: IJournal
    create_time: float
    _config: QueueConfig
    _clock: IReactorTime
    _items: deque[QItem]
    _reads: OpenReads
    _blocked: BlockingReads
    _health: JournalHealth
    _compactor: Compactor
    _closed: bool
    _last_wait_ms: int

    def _reset_counters(self) -> None:
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

    def count_get(self, item: object) -> None:
        """Count a read's result: a hit, or (C{None}) a miss."""
        if item is None:
            self.get_items_miss += 1
        else:
            self.get_items_hit += 1

    def count_skipped_adds(self, items: int, data_bytes: int) -> None:
        """Count C{items} adds beyond memory that replay skipped (read-behind reads them)."""
        self.total_items += items
        self.put_items += items
        self.put_bytes += data_bytes
        self.bytes += data_bytes
        self.length += items

    @property
    def memory_length(self) -> int:
        """How many items are held in memory (the rest are read-behind on disk)."""
        return len(self._items)

    @property
    def waiter_count(self) -> int:
        """How many blocked reads wait on this queue."""
        return len(self._blocked)

    @property
    def open_read_count(self) -> int:
        """How many reads are open (removed tentatively, not yet confirmed or aborted)."""
        return len(self._reads)

    @property
    def age(self) -> int:
        """Milliseconds the last fetched item waited in the queue; 0 when the queue is empty."""
        return self._last_wait_ms if self.length else 0

    @property
    def journal_rewrites(self) -> int:
        """How many times the journal was rewritten (compacted)."""
        return self._compactor.rewrites

    @property
    def journal_rotations(self) -> int:
        """How many times the journal was rotated."""
        return self._compactor.rotations

    @property
    def journal_state(self) -> str:
        """C{"ok"}, C{"failed"} (a journal write or fsync failed; memory is being
        rebuilt from the journal), C{"read-only"} (adds refused until the
        journal can be written again) or C{"probing"} (a probe record is being
        written): see L{kestrel.queue_health}."""
        return self._health.state

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
        return self._reads.xid_counter

    def open_items(self) -> list[QItem]:
        """Return the open reads' items, most recently opened xid first (descending xid)."""
        return self._reads.newest_first()

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
            ("waiters", str(len(self._blocked))),
            ("open_transactions", str(len(self._reads))),
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
