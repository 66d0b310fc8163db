"""
Tests for the C{on_fsync} observer of L{kestrel.journal.syncfile.PeriodicSyncFile},
L{kestrel.journal.journal.FileJournal} and L{kestrel.collection.QueueCollection}:
it hears of every successful fsync with the fsync's duration and, per covered
write, the time from the write until it was durable. Time is a L{Clock}; the
fsync is injected.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
from twisted.internet.task import Clock
from twisted.logger import capturedLogs

from kestrel.collection import QueueCollection
from kestrel.config import parse_config
from kestrel.item import QItem
from kestrel.journal.batch import WriteCoalescer
from kestrel.journal.journal import FileJournal
from kestrel.journal.syncfile import PeriodicSyncFile
from tests.support import ManualThread
from tests.unit.test_syncfile import CountingFsync, fired


class Observed:
    """An fsync observer that keeps what it was told, rounded to microseconds."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, list[float]]] = []

    def __call__(self, seconds: float, write_delays: Sequence[float]) -> None:
        self.calls.append((round(seconds, 6), [round(d, 6) for d in write_delays]))


def test_thread_fsync_reports_duration_and_per_write_delay(tmp_path: Path,
                                                           clock: Clock) -> None:
    """
    Under C{always}, the first fsync covers one write; the two writes made
    while it runs share the next fsync, and each reports its own wait.
    """
    thread = ManualThread()
    seen = Observed()
    f = PeriodicSyncFile(str(tmp_path / "q"), clock, 0.0, fsync=CountingFsync(),
                         run_in_thread=thread, on_fsync=seen)
    f.write(b"a")
    clock.advance(0.5)
    f.write(b"b")
    clock.advance(0.1)
    f.write(b"c")
    clock.advance(0.15)
    thread.run_next()
    assert seen.calls == [(0.75, [0.75])]
    clock.advance(0.1)
    thread.run_next()
    assert seen.calls == [(0.75, [0.75]), (0.1, [0.35, 0.25])]
    f.close()


def test_periodic_fsync_reports_every_write_it_covers(tmp_path: Path, clock: Clock) -> None:
    """A periodic fsync reports how long each write it covered waited for it."""
    seen = Observed()
    f = PeriodicSyncFile(str(tmp_path / "q"), clock, 1.0, fsync=CountingFsync(),
                         on_fsync=seen)
    f.write(b"a")
    clock.advance(0.4)
    f.write(b"b")
    assert seen.calls == []
    clock.advance(0.6)
    assert seen.calls == [(0.0, [1.0, 0.6])]
    f.close()
    assert seen.calls == [(0.0, [1.0, 0.6])] + [(0.0, [])]


def test_close_reports_the_writes_its_fsync_covers(tmp_path: Path, clock: Clock) -> None:
    """The inline fsync at close is reported with the writes still waiting."""
    seen = Observed()
    f = PeriodicSyncFile(str(tmp_path / "q"), clock, 5.0, fsync=CountingFsync(),
                         on_fsync=seen)
    d = f.write(b"a")
    clock.advance(2)
    f.close()
    assert fired(d)
    assert seen.calls == [(0.0, [2.0])]


def test_coalesced_batch_gets_one_fsync_and_one_report(tmp_path: Path, clock: Clock) -> None:
    """Under C{always}, the writes of one batch share one fsync, reported once."""
    coalescer = WriteCoalescer()
    fsync = CountingFsync()
    seen = Observed()
    f = PeriodicSyncFile(str(tmp_path / "q"), clock, 0.0, fsync=fsync,
                         coalescer=coalescer, on_fsync=seen)
    coalescer.begin()
    for data in (b"a", b"b", b"c"):
        f.write(data)
        clock.advance(0.01)
    coalescer.end()
    assert fsync.calls == 1
    assert seen.calls == [(0.0, [0.03, 0.02, 0.01])]
    f.close()


def test_failed_fsync_is_not_reported(tmp_path: Path, clock: Clock) -> None:
    """An fsync that fails is not a latency: the observer hears nothing."""
    fsync = CountingFsync()
    fsync.failing = OSError(5, "I/O error")
    seen = Observed()
    f = PeriodicSyncFile(str(tmp_path / "q"), clock, 0.0, fsync=fsync, on_fsync=seen)
    with capturedLogs():
        d = f.write(b"a")
        d.addErrback(lambda _: None)
        fsync.failing = None
        f.write(b"b")
    assert seen.calls == [(0.0, [0.0])]
    f.close()


def test_failing_observer_is_logged_and_acknowledgements_go_on(tmp_path: Path,
                                                              clock: Clock) -> None:
    """An observer that raises is logged; the write it was told of is still durable."""
    def broken(seconds: float, write_delays: Sequence[float]) -> None:
        raise ValueError("observer bug")

    f = PeriodicSyncFile(str(tmp_path / "q"), clock, 0.0, fsync=CountingFsync(),
                         on_fsync=broken)
    with capturedLogs() as events:
        d = f.write(b"a")
    assert fired(d)
    assert any(e.get("log_failure") is not None for e in events)
    with capturedLogs():
        f.close()


def test_file_journal_passes_the_observer_to_its_file(tmp_path: Path, clock: Clock) -> None:
    """A journal write under C{always} reaches the journal's observer."""
    seen = Observed()
    j = FileJournal(str(tmp_path), "q", clock, 0.0, on_fsync=seen)
    j.replay(lambda record: None)
    d = j.add(QItem(b"x", 1000))
    assert fired(d)
    assert seen.calls == [(0.0, [0.0])]
    j.close()


@pytest.mark.parametrize("sync_journal, reported", [("always", 1), ("never", 0)])
def test_collection_passes_the_observer_to_every_journal(tmp_path: Path, clock: Clock,
                                                         sync_journal: str,
                                                         reported: int) -> None:
    """
    The collection hands its observer to the journals it opens: each add
    under C{always} is one reported fsync of one write; C{never} fsyncs none.
    """
    config = parse_config(f"queue_path: {json.dumps(str(tmp_path / 'queues'))}\n"
                          f"status_file: {json.dumps(str(tmp_path / 'status'))}\n"
                          "expiration_timer_frequency: null\n"
                          f"default:\n  sync_journal: {sync_journal}\n")
    seen = Observed()
    c = QueueCollection(config, clock, on_fsync=seen)
    c.startService()
    c.add("a", b"1")
    c.add("b", b"2")
    clock.advance(0)  # the end of the reactor turn: the fsyncs of "always" run
    assert seen.calls == [(0.0, [0.0])] * (2 * reported)
    c.stopService()
