"""
ReadWaiters: the clients blocked on an empty queue, woken one at a time;
PendingRead: one blocked read, retried each time it is woken; BlockingReads:
a queue's blocked reads, woken outside any write batch.

L{ReadWaiters} is Kestrel's C{DeadlineWaitQueue} expressed with Deferreds:
every waiter is a L{Deferred} that fires C{True} when it is woken and
C{False} when its deadline passes first, never both. Cancelling the Deferred
drops the waiter, so a later wake-up goes to the next one in line. Time
comes from the injected clock only.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

from twisted.internet.defer import CancelledError, Deferred, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.python.failure import Failure

_T = TypeVar("_T")


class ReadWaiters:
    """
    A FIFO of waiters, each with a deadline on C{clock}.

    Promises: L{trigger} wakes exactly the oldest live waiter; each waiter's
    Deferred fires exactly once (C{True} woken, C{False} timed out or
    evicted) unless it is cancelled, in which case it is forgotten and fires
    with L{twisted.internet.defer.CancelledError}.
    """

    __slots__ = ("_clock", "_waiters", "_waking", "_owed")

    def __init__(self, clock: IReactorTime) -> None:
        self._clock = clock
        self._waiters: OrderedDict[Deferred[bool], IDelayedCall] = OrderedDict()
        self._waking = False
        self._owed = 0

    def __len__(self) -> int:
        """Return how many waiters are waiting."""
        return len(self._waiters)

    def wait(self, deadline: float, front: bool = False) -> Deferred[bool]:
        """
        Join the line until C{deadline} (absolute clock seconds).

        @param front: join at the head of the line instead of the tail (a
            woken waiter that found nothing keeps its place this way).
        @return: a Deferred firing C{True} when woken, C{False} at the
            deadline; cancelling it leaves the line.
        """
        d: Deferred[bool] = Deferred(self._cancel)
        delay = deadline - self._clock.seconds()
        call = self._clock.callLater(delay if delay > 0.0 else 0.0, self._expire, d)
        self._waiters[d] = call
        if front:
            self._waiters.move_to_end(d, last=False)
        return d

    def trigger(self) -> bool:
        """
        Wake the oldest waiter, if any.

        A waiter whose Deferred already fired (it can no longer take the
        wake-up) is skipped and the wake-up passes to the next one. A trigger
        made by a woken waiter's own callbacks (passing a wake-up on) is
        served as soon as those callbacks return, so long hand-off chains
        never nest.

        @return: whether a waiter was (or, from inside a wake-up, will be) woken.
        """
        if self._waking:
            self._owed += 1
            return bool(self._waiters)
        if not self._waiters:
            # Nobody waits (the usual case on add): nothing to do.
            return False
        self._waking = True
        try:
            woke = self._wake_one()
            while self._owed:
                self._owed -= 1
                self._wake_one()
        finally:
            self._waking = False
            self._owed = 0
        return woke

    def _wake_one(self) -> bool:
        waiters = self._waiters
        while waiters:
            d, call = waiters.popitem(last=False)
            if call.active():
                call.cancel()
            if not d.called:
                d.callback(True)
                return True
        return False

    def trigger_all(self) -> None:
        """Wake every waiter now (used when the queue closes)."""
        self._fire_all(True)

    def evict_all(self) -> None:
        """Time out every waiter now: each one fires C{False}."""
        self._fire_all(False)

    def _fire_all(self, woken: bool) -> None:
        waiting = list(self._waiters.items())
        self._waiters.clear()
        for _d, call in waiting:
            if call.active():
                call.cancel()
        for d, _call in waiting:
            if not d.called:
                d.callback(woken)

    def _expire(self, d: Deferred[bool]) -> None:
        if self._waiters.pop(d, None) is not None and not d.called:
            d.callback(False)

    def _cancel(self, d: Deferred[bool]) -> None:
        call = self._waiters.pop(d, None)
        if call is not None and call.active():
            call.cancel()


class PendingRead(Generic[_T]):
    """
    One blocked read: calls C{attempt} each time it is woken, until the deadline.

    C{attempt()} returns what the read gets, C{None} for "nothing yet" (the
    read keeps its place at the head of the line and waits on), or raises:
    the read then fails with that error (its own record could not be
    written, say). C{closed()} true ends the wait with C{None}. C{settled}
    is told of every result (C{None} for a miss or an error).

    The result Deferred fires once. Cancelling it leaves the line; a woken
    read whose result already fired passes the wake-up on, and so does a
    woken read built with C{passes_wake} that got something (a peek: the
    item is still there for the next reader). Whoever wakes the line must
    do so outside any write batch (see L{kestrel.journal.batch}): the
    attempt's records and the reply it sets off are the reader's own.
    """

    __slots__ = ("_waiters", "_clock", "_attempt", "_closed", "_settled", "_deadline",
                 "_passes_wake", "_inner", "result")

    def __init__(self, waiters: ReadWaiters, clock: IReactorTime,
                 attempt: Callable[[], _T | None], deadline: float, *,
                 closed: Callable[[], bool], settled: Callable[[_T | None], None],
                 passes_wake: bool = False) -> None:
        self._waiters = waiters
        self._clock = clock
        self._attempt = attempt
        self._closed = closed
        self._settled = settled
        self._deadline = deadline
        self._passes_wake = passes_wake
        self._inner: Deferred[bool] | None = None
        self.result: Deferred[_T | None] = Deferred(self._cancel)
        self._join(front=False)

    def _join(self, front: bool) -> None:
        inner = self._waiters.wait(self._deadline, front)
        self._inner = inner
        inner.addCallbacks(self._woken, _ignore_cancel)

    def _cancel(self, _: Deferred[_T | None]) -> None:
        inner, self._inner = self._inner, None
        if inner is not None:
            inner.cancel()

    def _woken(self, woken: bool) -> None:
        self._inner = None
        if self.result.called:
            if woken:
                self._waiters.trigger()
            return
        if not woken:
            self._finish(None)
            return
        try:
            got = self._attempt()
        except Exception:
            failure = Failure()
            self._settled(None)
            self.result.errback(failure)
            return
        if got is None and not self._closed() and self._deadline > self._clock.seconds():
            self._join(front=True)
            return
        self._finish(got)
        if got is not None and self._passes_wake:
            self._waiters.trigger()

    def _finish(self, got: _T | None) -> None:
        self._settled(got)
        self.result.callback(got)


def _ignore_cancel(failure: Failure) -> None:
    failure.trap(CancelledError)


class BlockingReads:
    """
    The blocked reads of one queue: their line, and the wake-ups that reach it.

    Promises: every wake-up reaches the line outside any write batch (through
    C{after_written}, the journal's L{kestrel.journal.interface.IJournal.after_written}),
    so that a woken reader's records and reply are its own; every result is
    counted once through C{counted} (C{None}: a miss).
    """

    __slots__ = ("line", "waiting", "_clock", "_after_written", "_closed", "_counted")

    def __init__(self, clock: IReactorTime,
                 after_written: Callable[[Callable[[], object]], None],
                 closed: Callable[[], bool], counted: Callable[[object], None]) -> None:
        #: The waiters, oldest first.
        self.line = ReadWaiters(clock)
        #: The line's waiters (empty: no read waits); read it, never change it.
        self.waiting = self.line._waiters
        self._clock = clock
        self._after_written = after_written
        self._closed = closed
        self._counted = counted

    def __len__(self) -> int:
        """How many reads wait."""
        return len(self.waiting)

    def answer(self, attempt: Callable[[], _T | None], deadline: float | None,
               got: _T | None, passes_wake: bool = False) -> Deferred[_T | None]:
        """
        Answer with C{got} (what a first try got), or, when it is C{None}
        and C{deadline} (absolute clock seconds) is still ahead, wait in line
        and retry C{attempt} each time the read is woken (see L{PendingRead}).
        """
        if (got is not None or deadline is None or self._closed()
                or deadline <= self._clock.seconds()):
            self._counted(got)
            return succeed(got)
        return PendingRead(self.line, self._clock, attempt, deadline, closed=self._closed,
                           settled=self._counted, passes_wake=passes_wake).result

    def wake(self) -> None:
        """Wake the next read in line, once what was just written is in the OS."""
        if self.waiting:  # (ReadWaiters.__len__, inlined: run per add)
            self._after_written(self.line.trigger)

    def evict(self) -> None:
        """Answer every read in line with "nothing"."""
        self._after_written(self.line.evict_all)

    def close(self) -> None:
        """The queue closed: wake every read in line (each finds nothing)."""
        self._after_written(self.line.trigger_all)
