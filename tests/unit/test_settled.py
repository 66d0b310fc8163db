"""kestrel.settled: the outcome a Deferred already holds, read without consuming it."""

from __future__ import annotations

from twisted.internet.defer import Deferred, fail, succeed
from twisted.python.failure import Failure

from kestrel.settled import PENDING, in_deferred, settled


def test_a_fired_deferred_gives_its_value() -> None:
    """A Deferred that has fired gives the value it holds, None and False included."""
    assert settled(succeed(7)) == 7
    assert settled(succeed(None)) is None
    assert settled(succeed(False)) is False


def test_an_unfired_deferred_is_pending() -> None:
    """Before it fires there is no outcome: PENDING, and it fires normally later."""
    d: Deferred[int] = Deferred()
    assert settled(d) is PENDING
    d.callback(3)
    assert settled(d) == 3


def test_a_deferred_waiting_on_another_is_pending() -> None:
    """A callback returned another, unfired Deferred: d is paused, its outcome is not known."""
    inner: Deferred[int] = Deferred()
    d = succeed(1).addCallback(lambda _: inner)
    assert settled(d) is PENDING
    inner.callback(5)
    assert settled(d) == 5


def test_a_failure_is_given_and_left_in_place() -> None:
    """A failed Deferred gives its Failure; its errbacks still get it afterwards."""
    d: Deferred[int] = fail(ValueError("boom"))
    outcome = settled(d)
    assert isinstance(outcome, Failure) and outcome.check(ValueError)
    seen: list[Failure] = []
    d.addErrback(seen.append)
    assert seen == [outcome]


def test_reading_does_not_consume_the_value() -> None:
    """Callbacks added after a read get the same value."""
    d = succeed(b"item")
    assert settled(d) == b"item"
    seen: list[bytes] = []
    d.addCallback(seen.append)
    assert seen == [b"item"]


def test_in_deferred_puts_an_answer_in_a_fired_deferred_and_keeps_a_deferred() -> None:
    """An answer given at once comes back in a Deferred fired with it; a Deferred as it is."""
    assert settled(in_deferred(False)) is False
    assert settled(in_deferred(None)) is None
    d: Deferred[bool] = Deferred()
    assert in_deferred(d) is d
