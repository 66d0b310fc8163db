"""
Tests for write coalescing in L{kestrel.journal.syncfile}: a L{WriteCoalescer}
batch holds journal writes back and hands each file's bytes to the OS in one
write, in order, before anything that depends on them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.logger import capturedLogs

from kestrel.journal.batch import WriteCoalescer
from kestrel.journal.syncfile import PeriodicSyncFile


class CountingFsync:
    """An fsync that really syncs and counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, fd: int) -> None:
        self.calls += 1
        os.fsync(fd)


def outcome(d: Deferred[Any]) -> list[object]:
    """What C{d} fired with so far (empty while pending); failures are consumed."""
    results: list[object] = []
    d.addBoth(results.append)
    return results


def test_outside_a_batch_writes_go_through(tmp_path: Path, clock: Clock) -> None:
    """A file with a coalescer writes at once when no batch is open."""
    coalescer = WriteCoalescer()
    f = PeriodicSyncFile(str(tmp_path / "j"), clock, None, coalescer=coalescer)
    f.write(b"abc")
    assert (tmp_path / "j").read_bytes() == b"abc"
    assert not coalescer.holding
    f.close()


def test_batch_holds_writes_until_the_outermost_end(tmp_path: Path, clock: Clock) -> None:
    """
    Inside a batch the bytes stay in memory (position counts them); the end
    of the outermost batch writes every file, each in order.
    """
    coalescer = WriteCoalescer()
    a = PeriodicSyncFile(str(tmp_path / "a"), clock, None, coalescer=coalescer)
    b = PeriodicSyncFile(str(tmp_path / "b"), clock, None, coalescer=coalescer)
    coalescer.begin()
    assert a.write(b"1") is None  # (no sync policy: nothing to wait for)
    b.write(b"x")
    coalescer.begin()
    a.write(b"22")
    assert coalescer.end() is True
    assert (tmp_path / "a").read_bytes() == b"" and (tmp_path / "b").read_bytes() == b""
    assert (a.position, b.position) == (3, 1)
    assert coalescer.holding
    assert coalescer.end() is True
    assert (tmp_path / "a").read_bytes() == b"122"
    assert (tmp_path / "b").read_bytes() == b"x"
    assert not coalescer.holding and not coalescer.active
    a.close()
    b.close()


def test_anything_else_flushes_first(tmp_path: Path, clock: Clock) -> None:
    """sync, close and a write outside the batch hand the held bytes over first, in order."""
    coalescer = WriteCoalescer()
    path = tmp_path / "j"
    f = PeriodicSyncFile(str(path), clock, None, coalescer=coalescer)
    coalescer.begin()
    f.write(b"held")
    f.sync()
    assert path.read_bytes() == b"held"
    f.write(b"-again")
    coalescer.depth = 0  # as if the batch ended without flushing (it never does)
    f.write(b"-direct")
    assert path.read_bytes() == b"held-again-direct"
    coalescer.begin()
    f.write(b"-last")
    f.close()
    assert path.read_bytes() == b"held-again-direct-last"


def test_always_sync_batch_gets_one_fsync(tmp_path: Path, clock: Clock) -> None:
    """Under sync_policy 0.0, a batch of writes is covered by one fsync, started at the flush."""
    fsync = CountingFsync()
    coalescer = WriteCoalescer()
    f = PeriodicSyncFile(str(tmp_path / "j"), clock, 0.0, fsync=fsync, coalescer=coalescer)
    coalescer.begin()
    results = [outcome(f.write(b"r%d" % i)) for i in range(10)]
    assert fsync.calls == 0 and results == [[]] * 10
    coalescer.end()
    assert fsync.calls == 1
    assert results == [[None]] * 10
    f.close()


def test_periodic_sync_after_flush(tmp_path: Path, clock: Clock) -> None:
    """Under a period, flushed writes are fsynced when the period has passed."""
    fsync = CountingFsync()
    coalescer = WriteCoalescer()
    f = PeriodicSyncFile(str(tmp_path / "j"), clock, 0.5, fsync=fsync, coalescer=coalescer)
    coalescer.begin()
    d = outcome(f.write(b"r"))
    coalescer.end()
    assert d == [] and fsync.calls == 0
    clock.advance(0.5)
    assert d == [None] and fsync.calls == 1
    f.close()


def test_refused_flush_fails_its_batch(clock: Clock) -> None:
    """
    When the OS refuses held bytes (a full device), the flush reports it,
    the open batch is marked failed, and durability Deferreds fail; the
    next batch starts clean.
    """
    coalescer = WriteCoalescer()
    f = PeriodicSyncFile("/dev/full", clock, 0.0, fsync=lambda fd: None, coalescer=coalescer)
    coalescer.begin()
    d = outcome(f.write(b"lost"))
    assert not coalescer.batch_failed
    with capturedLogs() as events:
        assert coalescer.flush_batch() is False
    assert coalescer.batch_failed
    assert coalescer.flush_batch() is False  # still this batch's failure
    assert len(d) == 1 and d[0].check(OSError)
    assert f.position == 0
    assert any("held-back" in e.get("log_format", "") for e in events)
    assert coalescer.end() is True  # nothing left held
    assert not coalescer.batch_failed  # no batch open
    coalescer.begin()
    assert not coalescer.batch_failed
    coalescer.end()
    f.close()


def test_failure_in_a_batch_set_aside_is_not_the_outer_batchs(clock: Clock) -> None:
    """
    A batch opened by a call waiting for the flush (another connection
    served after it) whose write fails does not mark the outer batch failed,
    and the outer batch's own failure survives the inner one.
    """
    coalescer = WriteCoalescer()
    full = PeriodicSyncFile("/dev/full", clock, None, fsync=lambda fd: None,
                            coalescer=coalescer)
    seen: list[bool] = []

    def other_connection() -> None:
        coalescer.begin()
        full.write(b"x")
        with capturedLogs():
            coalescer.flush()
        seen.append(coalescer.batch_failed)
        coalescer.end()

    coalescer.begin()
    coalescer.after_flush(other_connection)
    assert coalescer.flush_batch() is True
    assert seen == [True] and not coalescer.batch_failed
    full.write(b"y")
    with capturedLogs():
        coalescer.flush()
    assert coalescer.batch_failed
    coalescer.after_flush(other_connection)
    with capturedLogs():
        coalescer.flush()
    assert seen == [True, True] and coalescer.batch_failed
    coalescer.end()
    full.close()
