"""
OpenReads: the reads a queue handed out tentatively, by xid, and their timeout.

An open read is an item removed for a reader but still owed to the queue
until the reader confirms it (gone for good) or aborts it (back to the
head). This table keeps the items by xid in the order they were opened,
when each was opened, the xid counter, and the timer of
C{open_transaction_timeout}. The queue journals every change; this knows
nothing of the journal. Time comes from the injected clock.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.interfaces import IDelayedCall, IReactorTime

from kestrel.item import QItem
from kestrel.journal.records import next_xid


class OpenReads:
    """
    The open reads of one queue.

    Promises: an xid is never handed out twice while open, and the counter
    never goes down (L{saw_xid}); with a C{timeout} (seconds), C{expired}
    is called (on the clock) once the oldest read is older than it, until
    L{stop}.
    """

    __slots__ = ("_clock", "_expired", "by_xid", "_seconds", "_since", "xid_counter", "_timeout",
                 "_timer")

    def __init__(self, clock: IReactorTime, expired: Callable[[], None]) -> None:
        self._clock = clock
        self._seconds = clock.seconds
        self._expired = expired
        #: The open items by xid, in the order opened (read it; change it only here).
        self.by_xid: dict[int, QItem] = {}
        # xid -> clock seconds when it was opened, in the order they were opened
        self._since: dict[int, float] = {}
        #: The last xid handed out (or replayed).
        self.xid_counter = 0
        self._timeout: float | None = None
        self._timer: IDelayedCall | None = None

    def __len__(self) -> int:
        """How many reads are open."""
        return len(self.by_xid)

    def __contains__(self, xid: object) -> bool:
        """Whether read C{xid} is open."""
        return xid in self.by_xid

    def newest_first(self) -> list[QItem]:
        """The open items, most recently opened xid first (descending xid)."""
        items = self.by_xid
        return [items[x] for x in sorted(items, reverse=True)]

    def items(self) -> list[QItem]:
        """The open items, in the order they were opened."""
        return list(self.by_xid.values())

    def open(self, item: QItem, xid: int | None = None, since: float | None = None) -> int:
        """
        Open C{item} under C{xid} (default: the next free xid), opened at
        C{since} (default: now); return the xid, also set on C{item.xid}.
        """
        if xid is None:  # (self.next_xid(), inlined: run per open read)
            self.xid_counter = xid = next_xid(self.xid_counter, self.by_xid)
        item.xid = xid
        self.by_xid[xid] = item
        if since is None:
            seconds = self._seconds  # (called as a local: see kestrel.session)
            since = seconds()
        self._since[xid] = since
        if self._timer is None and self._timeout is not None:
            self._schedule()
        return xid

    def pop(self, xid: int) -> QItem | None:
        """Close read C{xid}: return its item, or C{None} if it is not open."""
        self._since.pop(xid, None)
        return self.by_xid.pop(xid, None)

    def next_xid(self) -> int:
        """Take the next xid not open (the counter wraps, see L{next_xid})."""
        self.xid_counter = xid = next_xid(self.xid_counter, self.by_xid)
        return xid

    def saw_xid(self, xid: int) -> None:
        """A replayed record opened C{xid}: never lower the counter below it."""
        if xid > self.xid_counter:
            self.xid_counter = xid

    def clear(self) -> dict[int, float]:
        """Forget every open read (a replay starts over); return when each was opened."""
        since = self._since
        self.by_xid.clear()
        self._since = {}
        return since

    def stale(self) -> list[int]:
        """The xids open longer than the timeout, oldest first."""
        if self._timeout is None:
            return []
        limit = self._clock.seconds() - self._timeout
        stale = []
        for xid, since in self._since.items():
            if since > limit:
                break
            stale.append(xid)
        return stale

    @property
    def timeout(self) -> float | None:
        """C{open_transaction_timeout}: seconds an open read may last, or C{None}."""
        return self._timeout

    @timeout.setter
    def timeout(self, timeout: float | None) -> None:
        self._timeout = timeout
        self.stop()
        self._schedule()

    def stop(self) -> None:
        """Stop the timer (the queue closes, or the timeout changes)."""
        timer, self._timer = self._timer, None
        if timer is not None and timer.active():
            timer.cancel()

    def _schedule(self) -> None:
        if self._timeout is None or not self._since:
            return
        oldest = next(iter(self._since.values()))
        delay = oldest + self._timeout - self._clock.seconds()
        self._timer = self._clock.callLater(max(0.0, delay), self._fired)

    def _fired(self) -> None:
        self._timer = None
        self._expired()
        if self._timer is None:
            self._schedule()
