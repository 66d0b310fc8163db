"""ReadWaiters: FIFO wake-ups, deadlines on the injected clock, cancellation."""

from __future__ import annotations

import pytest
from twisted.internet.defer import CancelledError
from twisted.internet.task import Clock

from kestrel.waiters import ReadWaiters


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
