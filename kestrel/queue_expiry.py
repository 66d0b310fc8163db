"""
QueueExpiry: how a queue discards its expired items.

L{kestrel.queue.PersistentQueue} derives from it. An item is expired when
its expiry, capped by the I{current} C{max_age} from its add time, is
before now; expired items leave from the head only (Kestrel's rule), each
journaled as a REMOVE and handed to the queue's C{expire_to}.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from twisted.logger import Logger

from kestrel.config import QueueConfig
from kestrel.item import QItem
from kestrel.journal.interface import IJournal
from kestrel.queue_health import Unsettled
from kestrel.read_behind import ReadBehind


class QueueExpiry:
    """
    The expiry half of a queue: an added item's expiry (L{_expiry_for}),
    L{discard_expired}, and the sweep that adds and reads run first.

    Promises: no expired item is left at the head after a sweep without a
    limit, and every item discarded was expired, journaled and counted.
    """

    _log = Logger()

    # The queue's parts a sweep works on (set by the queue).
    name: str
    journal: IJournal
    expired_items: int
    expire_to: Callable[[QItem], object] | None
    _config: QueueConfig
    _items: deque[QItem]
    _records: Unsettled
    _read_behind: ReadBehind
    _replaying: bool

    def _now_ms(self) -> int:
        raise NotImplementedError

    def _pop_head(self) -> QItem | None:
        raise NotImplementedError

    def _expiry_for(self, expiry_ms: int, now_ms: int) -> int:
        """The expiry of an item added now: C{expiry_ms} capped by C{max_age}."""
        max_age = self._config.max_age
        cap = None if max_age is None else now_ms + int(max_age * 1000)
        return cap if cap is not None and (not expiry_ms or cap < expiry_ms) else expiry_ms

    def discard_expired(self, limit: int | None = None) -> int:
        """
        Discard expired items from the head (at most C{limit}, default
        C{max_expire_sweep}, C{None} there: all); return how many. An item is
        expired when its expiry, capped by the I{current} C{max_age} from its
        add time, is before now. Each is journaled as a REMOVE, counted in
        C{expired_items} and handed to C{expire_to}.
        """
        if limit is None:
            limit = self._config.max_expire_sweep
        return self._sweep(limit)

    def _sweep(self, limit: int | None) -> int:
        """Discard at most C{limit} (C{None}: every) expired head item; return how many."""
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
            self._records.write(self.journal.remove)
            expired.append(head)
            if not items and keep_journal:
                self._read_behind.fill()
        if not expired:
            return 0
        if keep_journal:
            self._read_behind.fill()
        expire_to = self.expire_to
        if expire_to is not None:
            for item in expired:
                try:
                    expire_to(item)
                except Exception:
                    self._log.failure("expire_to failed for {queue}", queue=self.name)
        return len(expired)
