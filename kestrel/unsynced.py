"""
Unsynced: the items of durable adds that no reader may see yet.

Under a durable policy (C{sync_journal: always}, or C{durable_acks}) an add
is acknowledged only once the fsync covering its record succeeded; if that
fsync fails the producer is refused, so the item must never have been
served. Until then the queue keeps the item here, after every item readers
may see; the add's callback shows it (and every older one, since an fsync
covers a prefix of the file) in record order: appended to what readers
see, one blocked reader woken per item. A failed fsync leaves the
items here until the journal-failure reload L{drop}s them with the rest of
memory (see docs/journal.md, "Visibility under a durable policy").

L{DurableAdd} answers one such add's producer without a Deferred: it is the
waiter the journal file tells when the record is durable, and it records
the add's C{set_latency_usec} on the way.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from twisted.logger import Logger
from twisted.python.failure import Failure

from kestrel.item import QItem
from kestrel.queue_health import unavailable_failure

__all__ = ["Answer", "DurableAdd", "DurableAdds", "LatencyRecorder", "Unsynced"]

#: What answers a durable add's producer, told C{True} or the L{Failure}
#: (L{DurableAdd}; C{then} of L{kestrel.queue.PersistentQueue.offer}).
Answer = Callable[[bool | Failure], object]

#: What records one add's latency, in microseconds (a histogram's C{add}).
LatencyRecorder = Callable[[float], object]


class Unsynced:
    """
    The not-yet-durable items of one queue, oldest first.

    Promises: items are appended to C{visible} in the order they were
    held, each at most once, and only by L{show_through} of the number
    L{hold} returned for that item or a later one, each append followed by
    one C{wake}; after L{drop}, no number returned before it shows anything.
    """

    __slots__ = ("_items", "_held", "_shown", "_visible", "_wake", "_all_shown")

    def __init__(self, visible: deque[QItem], wake: Callable[[], object],
                 all_shown: Callable[[], None]) -> None:
        """
        @param visible: what readers see: each item is appended to it, oldest
            first, once the fsync covering its record succeeded.
        @param wake: called once per item appended (the queue wakes a reader).
        @param all_shown: called after a callback showed the last item held.
        """
        self._items: deque[QItem] = deque()
        self._held = 0  # (numbers handed out, the last item's)
        self._shown = 0  # (the number of the last item shown or dropped)
        self._visible = visible
        self._wake = wake
        self._all_shown = all_shown

    def __len__(self) -> int:
        return len(self._items)

    def hold(self, item: QItem) -> int:
        """
        Keep C{item} unseen; return its number (from 1 up), which
        L{show_through} is told once the fsync covering its record succeeded.
        """
        self._items.append(item)
        self._held += 1
        return self._held

    def show_through(self, number: int, _: object = None) -> bool:
        """
        The fsync covering held item C{number} succeeded: show it and every
        older one; return C{True} (so that, given the number first with
        C{functools.partial}, it is a durable Deferred's callback).
        """
        shown = self._shown
        if shown >= number:
            return True  # (shown through a later number, or dropped)
        items = self._items
        append = self._visible.append
        wake = self._wake
        while shown < number and items:
            shown += 1
            self._shown = shown  # (before wake, which runs readers)
            append(items.popleft())
            wake()
        if not items:
            self._all_shown()
        return True

    def drop(self) -> None:
        """
        Forget every held item (memory is being rebuilt from the journal,
        which holds them only if they became durable).
        """
        self._items.clear()
        self._shown = self._held


class DurableAdds:
    """
    What every durable add of one queue shares, made once with the queue:
    the queue's name (for a failure and the log), what records an add's
    C{set_latency_usec} (the queue observer's histogram, or C{None}), and
    the clock that times it. A queue's observer is its own for life, and so
    is a histogram's C{add} (L{kestrel.metrics.Histogram}), so neither is
    looked up again per add.
    """

    __slots__ = ("queue", "record", "seconds")

    def __init__(self, queue: str, seconds: Callable[[], float],
                 record: LatencyRecorder | None = None) -> None:
        """
        @param queue: the queue's name.
        @param seconds: the queue's clock.
        @param record: given, called with the microseconds from an add's
            start to its answer, read from C{seconds}.
        """
        self.queue = queue
        self.record = record
        self.seconds = seconds


class DurableAdd:
    """
    The waiter (L{kestrel.journal.syncfile.Waiter}) of one durable add's
    record, which answers the add's producer by calling C{then} instead of
    firing a Deferred: a durable add is the one request that always waits,
    and this is its whole answer path, from the journal file to the
    producer.

    Promises: C{then} is called at most once, and never before the queue
    set L{shown}. Once the fsync covering the record succeeded,
    C{shown(number)} runs (the queue shows the item: see
    L{Unsynced.show_through}), the add's
    latency is recorded, then C{then(True)}; if that fsync or the write
    failed, the latency is recorded, then C{then(failure)} with a
    L{JournalUnavailable}. Told before the queue set L{shown} (a write
    refused at once, or nothing to wait for), it keeps the outcome in
    L{told}, records and calls nothing: the queue answers at once instead.
    Nothing raises into the journal: a failure of C{shown} answers C{then}
    with it; one of recording (then C{then} is called all the same) or of
    C{then} is logged.

    @ivar shown: what shows the item once durable, told L{number} (set by
        the queue once it holds the item), or C{None} before.
    @ivar number: the item's number in the queue's L{Unsynced} (0 for an
        item kept on disk only), set by the queue with L{shown}.
    @ivar told: C{None} until told; C{True}, or the write's own L{Failure},
        if told before L{shown} was set.
    """

    __slots__ = ("_shared", "_then", "_started", "shown", "number", "told")

    _log = Logger()

    def __init__(self, shared: DurableAdds, then: Answer, started: float = 0.0) -> None:
        """
        @param shared: what the queue's durable adds share (its name, and
            what records their latency, timed from C{started}).
        @param then: the producer's answer.
        """
        self._shared = shared
        self._then = then
        self._started = started
        self.shown: Callable[[int], object] | None = None
        self.number = 0
        self.told: bool | Failure | None = None

    def callback(self, result: Failure | None) -> None:
        """
        Told by the journal file: C{None} once the record is durable (show
        the item, answer C{True}); the L{Failure} of its write or fsync
        (answer a L{JournalUnavailable}: the journal's recovery drops the
        item). It is also L{errback}.
        """
        shown = self.shown
        if shown is None:
            self.told = True if result is None else result
            return
        shared = self._shared
        outcome: bool | Failure
        if result is None:
            try:
                shown(self.number)
                outcome = True
            except Exception:
                self._log.failure("Showing a durable add to {queue} failed", queue=shared.queue)
                outcome = Failure()
        else:
            outcome = unavailable_failure(shared.queue, result)
        record = shared.record
        if record is not None:
            try:
                record((shared.seconds() - self._started) * 1e6)
            except Exception:
                self._log.failure("Recording a durable add to {queue} failed",
                                  queue=shared.queue)
        try:
            self._then(outcome)
        except Exception:
            self._log.failure("Answering a durable add to {queue} failed", queue=shared.queue)

    errback = callback
