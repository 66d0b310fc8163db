"""ReadWaiters: FIFO wake-ups, deadlines on the injected clock, cancellation."""

from __future__ import annotations

import pytest
from twisted.internet.defer import CancelledError
from twisted.internet.task import Clock

from kestrel.waiters import BlockingReads, ReadWaiters


def results(ds):
    """Return the current result of each Deferred, or "pending"."""
    out = []
    for d in ds:
        got = []
        d.addBoth(lambda r, got=got: got.append(r) or r)
        out.append(got[0] if got else "pending")
    return out


def test_trigger_wakes_oldest_first(clock: Clock) -> None:
    """Each trigger wakes exactly one waiter, in the order they joined."""
    w = ReadWaiters(clock)
    ds = [w.wait(clock.seconds() + 10) for _ in range(3)]
    assert len(w) == 3
    assert w.trigger() is True
    assert results(ds) == [True, "pending", "pending"]
    assert w.trigger() is True
    assert results(ds) == [True, True, "pending"]
    assert len(w) == 1


def test_trigger_with_no_waiter_reports_false(clock: Clock) -> None:
    """A trigger with nobody waiting wakes nothing and says so."""
    assert ReadWaiters(clock).trigger() is False


def test_deadline_fires_false_exactly_once(clock: Clock) -> None:
    """At its deadline a waiter fires False and leaves the line; a later trigger skips it."""
    w = ReadWaiters(clock)
    d = w.wait(clock.seconds() + 0.5)
    clock.advance(0.49)
    assert results([d]) == ["pending"]
    clock.advance(0.01)
    assert results([d]) == [False]
    assert len(w) == 0
    assert w.trigger() is False
    assert clock.getDelayedCalls() == []


def test_woken_waiter_timer_is_cancelled(clock: Clock) -> None:
    """Waking a waiter cancels its deadline timer, so it never fires twice."""
    w = ReadWaiters(clock)
    d = w.wait(clock.seconds() + 1)
    w.trigger()
    assert clock.getDelayedCalls() == []
    clock.advance(5)
    assert results([d]) == [True]


def test_cancel_leaves_the_line_and_wake_goes_to_next(clock: Clock) -> None:
    """A cancelled waiter fails with CancelledError and the next waiter gets the wake-up."""
    w = ReadWaiters(clock)
    first = w.wait(clock.seconds() + 10)
    second = w.wait(clock.seconds() + 10)
    first.cancel()
    with pytest.raises(CancelledError):
        first.result.raiseException()
    first.addErrback(lambda f: None)
    assert len(w) == 1
    assert w.trigger() is True
    assert results([second]) == [True]
    assert clock.getDelayedCalls() == []


def test_fired_waiter_is_skipped_by_trigger(clock: Clock) -> None:
    """A waiter whose Deferred already fired passes the wake-up on (handoff)."""
    w = ReadWaiters(clock)
    gone = w.wait(clock.seconds() + 10)
    live = w.wait(clock.seconds() + 10)
    gone.callback(True)  # answered elsewhere: it can no longer take a wake-up
    assert w.trigger() is True
    assert results([live]) == [True]


def test_front_joins_at_the_head(clock: Clock) -> None:
    """A waiter joining with front=True is woken before older waiters."""
    w = ReadWaiters(clock)
    old = w.wait(clock.seconds() + 10)
    again = w.wait(clock.seconds() + 10, front=True)
    w.trigger()
    assert results([again, old]) == [True, "pending"]


def test_past_deadline_fires_on_next_tick(clock: Clock) -> None:
    """A deadline already passed times the waiter out at the next clock step."""
    w = ReadWaiters(clock)
    d = w.wait(clock.seconds() - 1)
    clock.advance(0)
    assert results([d]) == [False]


def test_trigger_all_and_evict_all(clock: Clock) -> None:
    """trigger_all wakes every waiter (True); evict_all times every waiter out (False)."""
    w = ReadWaiters(clock)
    woken = [w.wait(clock.seconds() + 10) for _ in range(2)]
    w.trigger_all()
    evicted = [w.wait(clock.seconds() + 10) for _ in range(2)]
    w.evict_all()
    assert results(woken) == [True, True]
    assert results(evicted) == [False, False]
    assert len(w) == 0
    assert clock.getDelayedCalls() == []


def test_trigger_from_wake_up_is_served_after_it(clock: Clock) -> None:
    """A waiter passing its wake-up on from its callback wakes the next one, without nesting."""
    w = ReadWaiters(clock)
    order = []

    def pass_on(woken: bool, n: int) -> None:
        order.append(n)
        w.trigger()

    ds = [w.wait(clock.seconds() + 10) for _ in range(3000)]
    for n, d in enumerate(ds):
        d.addCallback(pass_on, n)
    assert w.trigger() is True
    assert order == list(range(3000))
    assert len(w) == 0


# -- PendingRead and BlockingReads


def blocking(clock: Clock, held: list | None = None):
    """BlockingReads whose wake-ups wait in C{held} (a write batch) when it is a list."""
    counted: list[object] = []
    closed = [False]

    def after_written(f, *args):
        if held is None:
            f(*args)
        else:
            held.append((f, args))

    reads = BlockingReads(clock, after_written, lambda: closed[0], counted.append)
    return reads, counted, closed


def test_a_blocked_read_retries_on_each_wake_and_keeps_its_place(clock: Clock) -> None:
    """A woken read that finds nothing waits on at the head of the line; results are counted."""
    reads, counted, _ = blocking(clock)
    stock: list[str] = []
    first = reads.answer(lambda: stock.pop(0) if stock else None, clock.seconds() + 10, None)
    second = reads.answer(lambda: stock.pop(0) if stock else None, clock.seconds() + 10, None)
    reads.wake()  # nothing there yet: the first keeps its place
    stock.append("a")
    reads.wake()
    assert results([first, second]) == ["a", "pending"]
    clock.advance(10)
    assert results([second]) == [None] and counted == ["a", None]


def test_a_read_whose_attempt_raises_gets_the_error(clock: Clock) -> None:
    """An attempt that raises (its own record failed) fails that read, and only it."""
    reads, counted, _ = blocking(clock)

    def refused() -> None:
        raise OSError("no space")

    failing = reads.answer(refused, clock.seconds() + 10, None)
    reads.wake()
    got = []
    failing.addErrback(lambda f: got.append(f.value))
    assert [str(e) for e in got] == ["no space"] and counted == [None]


def test_wake_ups_wait_for_the_batch_flush(clock: Clock) -> None:
    """Wake-ups, evictions and the close reach the line only when the batch flushes."""
    held: list = []
    reads, _, closed = blocking(clock, held)
    waiting = reads.answer(lambda: "x", clock.seconds() + 10, None)
    reads.wake()
    assert results([waiting]) == ["pending"]
    for f, args in held:
        f(*args)
    assert results([waiting]) == ["x"]
    held.clear()
    peeks = [reads.answer(lambda: None, clock.seconds() + 10, None) for _ in range(2)]
    closed[0] = True
    reads.close()
    assert results(peeks) == ["pending", "pending"]
    for f, args in held:
        f(*args)
    assert results(peeks) == [None, None]


def test_a_woken_peek_passes_the_wake_up_on(clock: Clock) -> None:
    """A peek that saw an item leaves it for the reader behind, who is woken too."""
    reads, _, _ = blocking(clock)
    stock: list[str] = []
    peek = reads.answer(lambda: stock[0] if stock else None, clock.seconds() + 10, None,
                        passes_wake=True)
    take = reads.answer(lambda: stock.pop(0) if stock else None, clock.seconds() + 10, None)
    stock.append("a")
    reads.wake()
    assert results([peek, take]) == ["a", "a"]


def test_a_cancelled_read_passes_its_wake_up_on(clock: Clock) -> None:
    """Cancelling a blocked read leaves the line; the next wake-up goes to the one behind."""
    reads, _, _ = blocking(clock)
    gone = reads.answer(lambda: "x", clock.seconds() + 10, None)
    kept = reads.answer(lambda: "y", clock.seconds() + 10, None)
    gone.cancel()
    gone.addErrback(lambda f: f.trap(CancelledError))
    reads.wake()
    assert results([kept]) == ["y"] and len(reads) == 0
