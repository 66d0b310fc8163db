"""
Tests for L{kestrel.journal.syncfile.PeriodicSyncFile}: write-through, sync
policies, group commit, fsync failures and close, driven by a fake clock and an
injected fsync.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.logger import capturedLogs
from twisted.python.failure import Failure

from kestrel.journal.runner import RunInThread, run_inline
from kestrel.journal.syncfile import PeriodicSyncFile, SyncFileClosedError
from tests.support import ManualThread


class CountingFsync:
    """An fsync that really syncs, counts calls, and fails while C{failing} is set."""

    def __init__(self) -> None:
        self.calls = 0
        self.failing: OSError | None = None

    def __call__(self, fd: int) -> None:
        self.calls += 1
        if self.failing is not None:
            raise self.failing
        os.fsync(fd)


def fired(d: Deferred[Any]) -> bool:
    results: list[object] = []
    d.addBoth(lambda r: results.append(r) or r)
    return bool(results)


def make(tmp_path: Path, clock: Clock, policy: float | None,
         run_in_thread: RunInThread = run_inline) -> tuple[PeriodicSyncFile, CountingFsync]:
    fsync = CountingFsync()
    f = PeriodicSyncFile(str(tmp_path / "q"), clock, policy, fsync=fsync,
                         run_in_thread=run_in_thread)
    return f, fsync


def test_write_reaches_os_before_returning(tmp_path: Path, clock: Clock) -> None:
    """Bytes written are readable from the file as soon as write() returns, whatever the policy."""
    f, _ = make(tmp_path, clock, 10.0)
    f.write(b"abc")
    assert (tmp_path / "q").read_bytes() == b"abc"
    f.write(b"de")
    assert (tmp_path / "q").read_bytes() == b"abcde"
    assert f.position == 5


def test_position_starts_at_existing_size(tmp_path: Path, clock: Clock) -> None:
    """Opening an existing file appends to it, and position is its size."""
    (tmp_path / "q").write_bytes(b"12345")
    f, _ = make(tmp_path, clock, None)
    assert f.position == 5
    f.write(b"6")
    assert (tmp_path / "q").read_bytes() == b"123456"
    assert f.position == 6


def test_never_policy_leaves_nothing_to_wait_for(tmp_path: Path, clock: Clock) -> None:
    """With policy None a write in the OS returns no Deferred (nothing to wait for); no fsync."""
    f, fsync = make(tmp_path, clock, None)
    assert f.write(b"x") is None
    assert f.write_unseen(b"y") is None
    assert (tmp_path / "q").read_bytes() == b"xy"
    clock.advance(100)
    assert fsync.calls == 0


def test_always_policy_fsyncs_every_write_inline(tmp_path: Path, clock: Clock) -> None:
    """With policy 0 and no thread, each write is fsynced before write() returns."""
    f, fsync = make(tmp_path, clock, 0.0)
    assert fired(f.write(b"x"))
    assert fsync.calls == 1
    assert fired(f.write(b"y"))
    assert fsync.calls == 2


def test_period_policy_fsyncs_within_period(tmp_path: Path, clock: Clock) -> None:
    """With a period, writes wait for one fsync that runs when the period has elapsed."""
    f, fsync = make(tmp_path, clock, 0.5)
    d1 = f.write(b"a")
    clock.advance(0.2)
    d2 = f.write(b"b")
    assert not fired(d1) and not fired(d2)
    assert fsync.calls == 0
    clock.advance(0.3)
    assert fired(d1) and fired(d2)
    assert fsync.calls == 1
    # Idle: no timer, no fsync.
    clock.advance(10)
    assert fsync.calls == 1
    assert clock.getDelayedCalls() == []


def test_period_policy_new_write_after_sync_starts_new_period(tmp_path: Path,
                                                              clock: Clock) -> None:
    """A write after a periodic fsync waits for the next period, not longer."""
    f, fsync = make(tmp_path, clock, 1.0)
    f.write(b"a")
    clock.advance(1.0)
    d = f.write(b"b")
    clock.advance(0.99)
    assert not fired(d)
    clock.advance(0.01)
    assert fired(d)
    assert fsync.calls == 2


def test_group_commit_one_fsync_covers_pending_writes(tmp_path: Path, clock: Clock) -> None:
    """
    With policy 0 and a thread, writes made while an fsync runs share the next
    single fsync, and fire only after it.
    """
    thread = ManualThread()
    f, fsync = make(tmp_path, clock, 0.0, thread)
    d1 = f.write(b"1")
    assert len(thread.jobs) == 1
    d2 = f.write(b"2")
    d3 = f.write(b"3")
    assert len(thread.jobs) == 1, "a second fsync must wait for the running one"
    assert not fired(d1)
    thread.run_next()
    assert fired(d1)
    assert not fired(d2) and not fired(d3)
    assert len(thread.jobs) == 1, "the next fsync starts when the first ends"
    thread.run_next()
    assert fired(d2) and fired(d3)
    assert fsync.calls == 2
    assert thread.jobs == []


def test_write_from_callback_never_overlaps_fsyncs(tmp_path: Path, clock: Clock) -> None:
    """
    Writes made by durability callbacks wait for their own fsync; fsyncs never
    overlap, and the next one starts after every callback ran, covering all
    their writes (group commit of writers that write again once acknowledged).
    """
    thread = ManualThread()
    f, fsync = make(tmp_path, clock, 0.0, thread)
    chained: list[Deferred[None]] = []
    d1 = f.write(b"1")
    d1.addCallback(lambda _: chained.extend([f.write(b"2"), f.write(b"3")]))
    d4 = f.write(b"4")
    d4.addCallback(lambda _: chained.append(f.write(b"5")))
    thread.run_next()
    assert fired(d1) and not fired(d4)
    assert len(chained) == 2 and not fired(chained[0]) and not fired(chained[1])
    assert len(thread.jobs) == 1, "one fsync at a time"
    thread.run_next()
    assert fired(d4) and fired(chained[0]) and fired(chained[1])
    assert len(chained) == 3 and not fired(chained[2])
    assert len(thread.jobs) == 1
    thread.run_next()
    assert fired(chained[2])
    assert thread.jobs == []
    assert fsync.calls == 3


def test_acknowledged_writers_share_the_next_fsync(tmp_path: Path, clock: Clock) -> None:
    """
    N writers that each write again when acknowledged need one fsync per
    round, not one for the first writer and another for the rest.
    """
    thread = ManualThread()
    f, fsync = make(tmp_path, clock, 0.0, thread)
    acked = [0]

    def writer(_: object = None) -> None:
        acked[0] += 1
        if acked[0] <= 30:
            f.write(b"x").addCallback(writer)

    first = f.write(b"first")
    for _ in range(10):
        first.addCallback(lambda r: (f.write(b"w").addCallback(writer), r)[1])
    rounds = 0
    while thread.jobs:
        thread.run_next()
        rounds += 1
        assert len(thread.jobs) <= 1
    assert acked[0] == 40
    assert fsync.calls == rounds == 5


def test_group_commit_period_with_thread(tmp_path: Path, clock: Clock) -> None:
    """A period that elapses while an fsync runs triggers another fsync right after it."""
    thread = ManualThread()
    f, fsync = make(tmp_path, clock, 1.0, thread)
    d1 = f.write(b"1")
    clock.advance(1.0)
    assert len(thread.jobs) == 1
    d2 = f.write(b"2")
    clock.advance(1.0)
    assert len(thread.jobs) == 1
    thread.run_next()
    assert fired(d1) and not fired(d2)
    assert len(thread.jobs) == 1
    thread.run_next()
    assert fired(d2)
    assert fsync.calls == 2


def test_fsync_error_fails_every_covered_write_and_logs(tmp_path: Path, clock: Clock) -> None:
    """A failing fsync fails each Deferred it covered, logs, and later fsyncs work again."""
    thread = ManualThread()
    f, fsync = make(tmp_path, clock, 0.0, thread)
    d1 = f.write(b"1")
    fsync.failing = OSError(5, "EIO")
    thread.run_next()  # d1 fails
    errors: list[Any] = []
    d1.addErrback(errors.append)
    assert len(errors) == 1 and isinstance(errors[0].value, OSError)
    d2 = f.write(b"2")  # starts an fsync alone: nothing else is pending
    d3 = f.write(b"3")
    d4 = f.write(b"4")
    thread.run_next()  # d2 fails
    with capturedLogs() as events:
        thread.run_next()  # one fsync covering d3 and d4 fails
    failed: list[Any] = []
    for d in (d2, d3, d4):
        d.addErrback(failed.append)
    assert len(failed) == 3
    assert [e.get("count") for e in events if e.get("path") == f.path] == [2]
    fsync.failing = None
    d5 = f.write(b"5")
    thread.run_next()
    ok: list[object] = []
    d5.addCallback(ok.append)
    assert ok == [None]


def test_inline_fsync_error_fails_write(tmp_path: Path, clock: Clock) -> None:
    """With inline fsync, a failing fsync fails the write's Deferred at once."""
    f, fsync = make(tmp_path, clock, 0.0)
    fsync.failing = OSError(28, "ENOSPC")
    with capturedLogs():
        d = f.write(b"1")
    errors: list[Any] = []
    d.addErrback(errors.append)
    assert len(errors) == 1
    assert (tmp_path / "q").read_bytes() == b"1"


def test_sync_forces_fsync_even_with_never_policy(tmp_path: Path, clock: Clock) -> None:
    """sync() fsyncs now, whatever the policy."""
    f, fsync = make(tmp_path, clock, None)
    f.write(b"1")
    d = f.sync()
    assert fired(d)
    assert fsync.calls == 1


def test_sync_covers_pending_periodic_writes(tmp_path: Path, clock: Clock) -> None:
    """sync() before the period elapses makes pending periodic writes durable now."""
    f, fsync = make(tmp_path, clock, 5.0)
    d = f.write(b"1")
    f.sync()
    assert fired(d)
    assert fsync.calls == 1
    clock.advance(5.0)
    assert fsync.calls == 1, "nothing pending when the timer fires: no fsync"


def test_close_fsyncs_fires_pending_and_closes(tmp_path: Path, clock: Clock) -> None:
    """close() fsyncs, fires pending writes' Deferreds, closes, and cancels the timer."""
    f, fsync = make(tmp_path, clock, 5.0)
    d = f.write(b"1")
    c = f.close()
    assert fired(c) and fired(d)
    assert fsync.calls == 1
    assert clock.getDelayedCalls() == []
    with pytest.raises(OSError):
        os.fstat(f.fileno())
    assert fired(f.close())


def test_write_after_close_fails(tmp_path: Path, clock: Clock) -> None:
    """A write or sync on a closed file fails its Deferred and writes nothing."""
    f, _ = make(tmp_path, clock, None)
    f.close()
    errors: list[Any] = []
    f.write(b"x").addErrback(errors.append)
    f.sync().addErrback(errors.append)
    assert [e.type for e in errors] == [SyncFileClosedError, SyncFileClosedError]
    assert (tmp_path / "q").read_bytes() == b""


def test_close_waits_for_running_thread_fsync(tmp_path: Path, clock: Clock) -> None:
    """close() during a thread fsync keeps the descriptor open until that fsync ends."""
    thread = ManualThread()
    f, fsync = make(tmp_path, clock, 0.0, thread)
    d1 = f.write(b"1")
    d2 = f.write(b"2")
    c = f.close()
    assert fired(d2), "close fsyncs inline and covers writes not yet in an fsync"
    assert not fired(c)
    os.fstat(f.fileno())  # still open
    thread.run_next()
    assert fired(d1) and fired(c)
    with pytest.raises(OSError):
        os.fstat(f.fileno())


def test_failed_os_write_cuts_partial_data(tmp_path: Path, clock: Clock) -> None:
    """If the OS refuses a write, the Deferred fails and position is unchanged."""
    f, _ = make(tmp_path, clock, None)
    f.write(b"ok")
    os.close(f.fileno())
    # Replace the descriptor with a read-only one so os.write fails.
    fd = os.open(f.path, os.O_RDONLY)
    f._fd = fd
    errors: list[Any] = []
    with capturedLogs():
        f.write(b"nope").addErrback(errors.append)
    assert len(errors) == 1 and isinstance(errors[0].value, OSError)
    assert f.position == 2
    os.close(fd)


def test_close_deferring_can_fail_the_writes_it_covered(tmp_path, clock) -> None:
    """
    The function close_deferring returns fails the covered writes when given
    a failure (their durability turned out to be in doubt), instead of
    acknowledging them.
    """
    f = PeriodicSyncFile(str(tmp_path / "q"), clock, 1.0)
    written = f.write(b"one")
    closed, fire = f.close_deferring()
    assert not written.called
    failed: list[Failure] = []
    written.addErrback(failed.append)
    fire(Failure(OSError(5, "Input/output error")))
    assert failed and failed[0].check(OSError)
    assert closed.called
