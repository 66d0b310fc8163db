"""
JournalHealth and Unsettled on their own: the failure state machine driven
by a scripted journal and host, on a L{Clock}.
"""

from __future__ import annotations

import errno
import os

import pytest
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.task import Clock
from twisted.logger import capturedLogs

from kestrel.errors import JournalUnavailable
from kestrel.queue_health import (
    ABORT,
    CONFIRM,
    FAILED,
    JOURNAL_RETRY_SECONDS,
    OK,
    OPEN,
    PROBING,
    READ_ONLY,
    REMOVE,
    JournalHealth,
    Unsettled,
    reason_of,
)

ENOSPC = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
EIO = OSError(errno.EIO, os.strerror(errno.EIO))


class ScriptedJournal:
    """The failure part of an IJournal: recover and probe answer as told."""

    def __init__(self) -> None:
        self.on_failure = None
        self.recover_outcomes: list[object] = []
        self.probes: list[Deferred[None]] = []
        self.recovered: list[str] = []
        self.probed_xids: list[int] = []
        self.held: list[tuple] = []  # calls waiting for a write batch's flush
        self.batch_open = False

    def recover(self, kind: str, error: Exception) -> Deferred[int]:
        self.recovered.append(kind)
        outcome = self.recover_outcomes.pop(0) if self.recover_outcomes else 0
        if isinstance(outcome, Deferred):
            return outcome
        return fail(outcome) if isinstance(outcome, Exception) else succeed(outcome)

    def probe(self, xid_counter: int) -> Deferred[None]:
        self.probed_xids.append(xid_counter)
        d: Deferred[None] = Deferred()
        self.probes.append(d)
        return d

    def writes_now(self) -> bool:
        return not self.batch_open

    def after_written(self, f, *args) -> None:
        if self.batch_open:
            self.held.append((f, args))
        else:
            f(*args)

    def flush(self) -> None:
        self.batch_open = False
        held, self.held = self.held, []
        for f, args in held:
            f(*args)


class Host:
    """A queue as the machine sees it: counts reloads and wake-ups."""

    def __init__(self) -> None:
        self.xid_counter = 7
        self.reloads = 0
        self.woken = 0
        self.reload_does = None

    def reload(self) -> None:
        self.reloads += 1
        if self.reload_does is not None:
            self.reload_does()

    def readable_again(self) -> None:
        self.woken += 1


@pytest.fixture
def machine(clock: Clock):
    journal = ScriptedJournal()
    host = Host()
    fsync_errors: list[OSError] = []
    health = JournalHealth("q", journal, clock, host, fsync_failed=fsync_errors.append)
    return health, journal, host, fsync_errors


def test_a_failure_walks_failed_read_only_probing_ok(clock: Clock, machine) -> None:
    """ok -> failed -> (recover, reload) read-only -> probing -> ok; adds and reads follow."""
    health, journal, host, _ = machine
    assert journal.on_failure == health.failed
    assert (health.state, health.takes_adds, health.readable) == (OK, True, True)
    with capturedLogs():
        journal.on_failure("write", ENOSPC)
    assert (health.state, health.takes_adds, health.readable) == (FAILED, False, False)
    with pytest.raises(JournalUnavailable, match=r"No space left on device \(errno 28\)"):
        raise health.unavailable()
    assert journal.recovered == [] and host.reloads == 0  # on the next reactor turn
    with capturedLogs():
        clock.advance(0)
    assert journal.recovered == ["write"] and host.reloads == 1 and host.woken == 1
    assert (health.state, health.takes_adds, health.readable) == (READ_ONLY, False, True)
    clock.advance(JOURNAL_RETRY_SECONDS)
    assert health.state == PROBING and journal.probed_xids == [7]
    with capturedLogs():
        journal.probes[0].callback(None)
    assert (health.state, health.reason) == (OK, "")


def test_a_failed_probe_tries_again_every_period(clock: Clock, machine) -> None:
    """A probe that fails leaves the queue read-only and is tried again later."""
    health, journal, _, _ = machine
    with capturedLogs():
        health.failed("write", ENOSPC)
        clock.advance(0)
    clock.advance(JOURNAL_RETRY_SECONDS)
    journal.probes[0].errback(ENOSPC)
    assert health.state == READ_ONLY
    clock.advance(JOURNAL_RETRY_SECONDS)
    assert len(journal.probes) == 2 and health.state == PROBING


def test_a_failure_while_probing_goes_back_to_failed(clock: Clock, machine) -> None:
    """The probe's own write failing (reported by the journal) is a new failure: reload again."""
    health, journal, host, _ = machine
    with capturedLogs():
        health.failed("write", ENOSPC)
        clock.advance(0)
        clock.advance(JOURNAL_RETRY_SECONDS)
        health.failed("write", ENOSPC)
        journal.probes[0].errback(ENOSPC)  # (the probe's Deferred fails too: ignored)
    assert health.state == FAILED
    with capturedLogs():
        clock.advance(0)
    assert host.reloads == 2 and health.state == READ_ONLY


def test_recovery_and_reload_failures_are_retried(clock: Clock, machine) -> None:
    """A cut-back that fails, or a reload whose own writes fail, is retried each period."""
    health, journal, host, _ = machine
    journal.recover_outcomes = [EIO, 0, 0]
    with capturedLogs():
        health.failed("fsync", EIO)
        clock.advance(0)
    assert health.state == FAILED and host.reloads == 0 and health.reason.startswith("Input")
    host.reload_does = lambda: health.failed("write", ENOSPC)  # the reload's records fail
    with capturedLogs():
        clock.advance(JOURNAL_RETRY_SECONDS)
    assert health.state == FAILED and host.reloads == 1 and host.woken == 0
    host.reload_does = None
    with capturedLogs():
        clock.advance(JOURNAL_RETRY_SECONDS)
    assert health.state == READ_ONLY and host.reloads == 2 and host.woken == 1
    assert journal.recovered == ["fsync", "fsync", "write"]


def test_an_fsync_failing_while_the_journal_is_cut_back_is_recovered_as_one(
        clock: Clock, machine) -> None:
    """
    An fsync failure reported while a cut-back runs (it ends later) is not
    forgotten: memory is not reloaded from that cut-back, and the next
    recovery cuts back to the last good fsync, not only to the last whole
    record.
    """
    health, journal, host, _ = machine
    cutting: Deferred[int] = Deferred()
    journal.recover_outcomes = [cutting]
    with capturedLogs():
        health.failed("write", ENOSPC)
        clock.advance(0)
        health.failed("fsync", EIO)
        cutting.callback(0)
    assert health.state == FAILED and host.reloads == 0 and not health.readable
    with capturedLogs():
        clock.advance(JOURNAL_RETRY_SECONDS)
    assert journal.recovered == ["write", "fsync"] and host.reloads == 1
    assert health.state == READ_ONLY


def test_a_reload_that_raises_is_retried(clock: Clock, machine) -> None:
    """A reload that raises (replay failed) leaves the queue failed; it is tried again."""
    health, _, host, _ = machine

    def broken() -> None:
        raise OSError(errno.EIO, "replay failed")

    host.reload_does = broken
    with capturedLogs():
        health.failed("write", ENOSPC)
        clock.advance(0)
    assert health.state == FAILED and health.reason == "replay failed (errno 5)"
    host.reload_does = None
    with capturedLogs():
        clock.advance(JOURNAL_RETRY_SECONDS)
    assert health.state == READ_ONLY


def test_a_failure_while_waking_readers_is_recovered_from(clock: Clock, machine) -> None:
    """
    A reader woken after the reload whose record fails starts another
    recovery; the probe due after the first one does not cancel it.
    """
    health, journal, host, _ = machine
    woken = host.readable_again

    def wake_then_fail() -> None:
        woken()
        if host.woken == 1:
            health.failed("write", ENOSPC)

    host.readable_again = wake_then_fail
    with capturedLogs():
        health.failed("write", ENOSPC)
        clock.advance(0)
    assert journal.recovered == ["write", "write"] and host.reloads == 2
    assert health.state == READ_ONLY
    clock.advance(JOURNAL_RETRY_SECONDS)
    assert health.state == PROBING and len(journal.probes) == 1


def test_more_failures_while_failed_start_one_recovery(clock: Clock, machine) -> None:
    """Failures reported while failed change nothing but the reason (and an fsync kind)."""
    health, journal, host, fsync_errors = machine
    with capturedLogs():
        health.failed("write", ENOSPC)
        health.failed("fsync", EIO)
        health.failed("write", ENOSPC)
        clock.advance(0)
    assert journal.recovered == ["fsync"] and host.reloads == 1
    assert fsync_errors == [EIO] and health.failures == 3


def test_nothing_runs_after_close(clock: Clock, machine) -> None:
    """Closed, the machine schedules nothing and reloads nothing."""
    health, journal, host, _ = machine
    with capturedLogs():
        health.failed("write", ENOSPC)
    health.close()
    clock.advance(10 * JOURNAL_RETRY_SECONDS)
    assert journal.recovered == [] and host.reloads == 0 and not clock.getDelayedCalls()


def test_reason_of_names_the_os_error() -> None:
    """An OSError reads as its strerror and errno; anything else as its text or type."""
    assert reason_of(ENOSPC) == "No space left on device (errno 28)"
    assert reason_of(ValueError("bad")) == "bad"
    assert reason_of(ValueError()) == "ValueError"


# -- Unsettled


def test_closes_stay_until_durable_and_written_cleanly(clock: Clock, machine) -> None:
    """
    A close is forgotten once its record is durable and no failure came
    between its write and the flush that put it in the OS; else a reload gets it.
    """
    health, journal, _, _ = machine
    unsettled = Unsettled("q", health, journal)
    durable: Deferred[None] = Deferred()
    unsettled.note(CONFIRM, 1, None, durable)
    unsettled.note(ABORT, 2, None, succeed(None))  # written and durable at once
    unsettled.note(ABORT, 5, None, None)  # written, nothing to wait for
    assert len(unsettled) == 1
    durable.callback(None)
    assert len(unsettled) == 0
    journal.batch_open = True
    unsettled.note(CONFIRM, 3, None, succeed(None))  # held in a batch ...
    with capturedLogs():
        health.failed("write", ENOSPC)  # ... whose flush fails
    journal.flush()
    unsettled.keep(ABORT, 4, None)  # asked while failed: no record
    assert unsettled.take() == [(CONFIRM, 3, None, False), (ABORT, 4, None, False)]
    assert len(unsettled) == 0


def test_an_open_is_handed_out_only_once_its_record_is_in_the_os(clock: Clock,
                                                                 machine) -> None:
    """An open refused at once, or held in a batch that failed, was never handed out."""
    health, journal, _, _ = machine
    unsettled = Unsettled("q", health, journal)
    pending: Deferred[None] = Deferred()
    unsettled.note(OPEN, 1, "a", pending)  # in the OS, not yet durable
    with capturedLogs():
        refused = fail(ENOSPC)
        unsettled.note(OPEN, 2, "b", refused)
        refused.addErrback(lambda _: None)
    journal.batch_open = True
    unsettled.note(OPEN, 3, "c", Deferred())
    with capturedLogs():
        health.failed("write", ENOSPC)
    journal.flush()
    assert unsettled.take() == [(OPEN, 1, "a", True), (OPEN, 2, "b", False),
                                (OPEN, 3, "c", False)]


def test_an_fsync_failing_after_the_flush_leaves_the_record_handed_out(clock: Clock,
                                                                      machine) -> None:
    """A record whose bytes reached the OS was handed out even if its fsync then failed."""
    health, journal, _, _ = machine
    unsettled = Unsettled("q", health, journal)
    journal.batch_open = True
    durable: Deferred[None] = Deferred()
    unsettled.note(OPEN, 1, "a", durable)
    with capturedLogs():
        health.failed("fsync", EIO)  # (the flush wrote it; its inline fsync failed)
    durable.errback(EIO)
    durable.addErrback(lambda _: None)
    journal.flush()
    assert unsettled.take() == [(OPEN, 1, "a", True)]


@pytest.mark.parametrize("fired", [False, True])
def test_a_record_durable_when_written_is_kept_only_while_a_batch_holds_it(
        clock: Clock, machine, fired: bool) -> None:
    """
    A write durable at once (no sync period: it returns nothing to wait for,
    or a fired Deferred) leaves nothing to keep when no batch is open; in a
    batch a close, or a remove or open already handed out, is kept until the
    flush puts it in the OS. A remove or open not handed out yet is not kept:
    a reload would not take it again.
    """
    health, journal, _, _ = machine
    unsettled = Unsettled("q", health, journal)
    written: list[int] = []

    def write(xid: int) -> Deferred[None] | None:
        written.append(xid)
        return succeed(None) if fired else None
    assert unsettled.write(write, 1, note=(REMOVE, 0, "a")) is True
    unsettled.note(OPEN, 2, "b", succeed(None))
    assert written == [1] and len(unsettled) == 0
    journal.batch_open = True
    assert unsettled.write(write, 3, note=(REMOVE, 0, "c")) is True
    assert written == [1, 3] and len(unsettled) == 0
    assert unsettled.write(write, 4, note=(REMOVE, 0, "d"), handed=True) is True
    assert unsettled.write(write, 5, note=(CONFIRM, 5, None)) is True
    unsettled.note(OPEN, 6, "e", succeed(None))
    assert written == [1, 3, 4, 5] and len(unsettled) == 3
    journal.flush()
    assert len(unsettled) == 0
    assert unsettled.take() == []


def test_restore_puts_taken_entries_back_before_newer_ones(clock: Clock, machine) -> None:
    """A reload that failed puts back what it took, oldest first, then what came since."""
    health, journal, _, _ = machine
    unsettled = Unsettled("q", health, journal)
    unsettled.keep(ABORT, 1, None)
    taken = unsettled.take()
    unsettled.keep(CONFIRM, 2, None)
    unsettled.restore(taken)
    assert [xid for _, xid, _, _ in unsettled.take()] == [1, 2]


def test_write_logs_an_io_error_without_traceback(clock: Clock, machine) -> None:
    """A refused record is logged once, as an error naming the queue; it reports false."""
    health, journal, _, _ = machine
    unsettled = Unsettled("q", health, journal)
    with capturedLogs() as events:
        assert unsettled.write(lambda: fail(ENOSPC)) is False
        assert unsettled.write(lambda: succeed(None)) is True
    [event] = events
    assert event["queue"] == "q" and "log_failure" not in event
