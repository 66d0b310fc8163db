"""
L{DurableAdd}: the waiter that answers a durable add's producer without a
Deferred. What it promises on its own (the queue's use of it is in
C{test_queue_visibility.py}, which adds through it and through a Deferred).
"""

from __future__ import annotations

import errno

import pytest
from twisted.internet.task import Clock
from twisted.logger import capturedLogs
from twisted.python.failure import Failure

from kestrel.errors import JournalUnavailable
from kestrel.unsynced import DurableAdd, DurableAdds


def unrecorded() -> DurableAdds:
    """What the durable adds of a queue "q" with no observer share."""
    return DurableAdds("q", Clock().seconds)


def recorder() -> tuple[list[object], DurableAdd]:
    answers: list[object] = []
    return answers, DurableAdd(unrecorded(), answers.append)


def test_told_before_it_is_shown_it_keeps_the_outcome_and_answers_nothing() -> None:
    """Told at once (nothing to wait for, or a refused write): the queue answers instead."""
    answers, add = recorder()
    add.callback(None)
    assert add.told is True and answers == []
    answers, add = recorder()
    error = OSError(errno.ENOSPC, "No space left on device")
    add.errback(Failure(error))
    assert isinstance(add.told, Failure) and add.told.value is error and answers == []


def test_once_durable_it_shows_the_item_then_answers_true() -> None:
    """C{shown} is told the item's number, then the producer is answered."""
    order: list[object] = []
    add = DurableAdd(unrecorded(), lambda outcome: order.append(("answer", outcome)))
    add.number = 7
    add.shown = lambda number: order.append(("shown", number))
    add.callback(None)
    assert order == [("shown", 7), ("answer", True)]


@pytest.mark.parametrize("error", [OSError(errno.EIO, "Input/output error"),
                                   JournalUnavailable("q", "disk gone")])
def test_a_failed_write_or_fsync_answers_journal_unavailable(error: Exception) -> None:
    """The producer is answered a JournalUnavailable naming the queue; nothing is shown."""
    answers, add = recorder()
    shown: list[object] = []
    add.shown = shown.append
    add.errback(Failure(error))
    assert shown == [] and len(answers) == 1
    failure = answers[0]
    assert isinstance(failure, Failure) and failure.check(JournalUnavailable)
    assert failure.value.queue == "q"  # type: ignore[attr-defined]
    if isinstance(error, JournalUnavailable):
        assert failure.value is error


def test_nothing_it_calls_raises_into_the_journal() -> None:
    """
    A failure to show the item answers the producer with it; a failing answer
    is logged. Neither reaches the journal file telling the waiters.
    """
    answers, add = recorder()
    add.shown = lambda _: 1 / 0
    with capturedLogs() as events:
        add.callback(None)
    assert len(answers) == 1 and answers[0].check(ZeroDivisionError)  # type: ignore[union-attr]
    assert any(e.get("log_failure") is not None for e in events)

    def broken(outcome: object) -> None:
        raise RuntimeError("producer gone wrong")

    durable, failed = DurableAdd(unrecorded(), broken), DurableAdd(unrecorded(), broken)
    durable.shown = failed.shown = lambda _: None
    with capturedLogs() as events:
        durable.callback(None)
        failed.errback(Failure(OSError(errno.EIO, "Input/output error")))
    assert sum(e.get("log_failure") is not None for e in events) == 2


def test_it_records_the_latency_of_its_answer_then_answers() -> None:
    """
    Given what records, the microseconds from C{started} to the answer, on
    the queue's clock, are recorded before the producer is answered: once
    durable, and once failed.
    """
    clock = Clock()
    clock.advance(10)
    order: list[object] = []
    shared = DurableAdds("q", clock.seconds, lambda usec: order.append(("latency", usec)))
    durable = DurableAdd(shared, lambda outcome: order.append(("answer", outcome)), 10.0)
    failed = DurableAdd(shared, lambda outcome: order.append(("answer", type(outcome))), 10.25)
    durable.shown = failed.shown = lambda _: None
    clock.advance(0.5)
    durable.callback(None)
    failed.errback(Failure(OSError(errno.EIO, "Input/output error")))
    assert order == [("latency", 500_000.0), ("answer", True),
                     ("latency", 250_000.0), ("answer", Failure)]


def test_told_before_it_is_shown_it_records_nothing() -> None:
    """A refusal at once, or nothing to wait for: the caller of offer records and answers."""
    recorded: list[float] = []
    for tell in ("callback", "errback"):
        add = DurableAdd(DurableAdds("q", Clock().seconds, recorded.append), recorded.append)
        getattr(add, tell)(None if tell == "callback" else Failure(OSError(errno.EIO, "EIO")))
        assert add.told is not None
    assert recorded == []


def test_a_failure_to_record_is_logged_and_the_producer_answered_all_the_same() -> None:
    """Recording raises into nothing: it is logged, and the producer is answered."""
    answers: list[object] = []

    def broken(usec: float) -> None:
        raise RuntimeError("histogram gone wrong")

    add = DurableAdd(DurableAdds("q", Clock().seconds, broken), answers.append)
    add.shown = lambda _: None
    with capturedLogs() as events:
        add.callback(None)
    assert answers == [True]
    assert sum(e.get("log_failure") is not None for e in events) == 1
