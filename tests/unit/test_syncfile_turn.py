"""
The reactor-turn fsync: under C{sync_journal: always} with a L{SyncTurn}, a
L{PeriodicSyncFile} starts one fsync at the end of the reactor turn for every
write made in it (under C{task.Clock}, the turn ends at the next C{advance}).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.logger import capturedLogs

from kestrel.config.parse import parse_config
from kestrel.errors import ConfigError
from kestrel.journal.runner import RunInThread, SyncTurn, run_inline
from kestrel.journal.syncfile import PeriodicSyncFile
from tests.support import ManualThread
from tests.unit.test_syncfile import CountingFsync


def outcome(d: Deferred[Any]) -> object:
    """C{None} if C{d} succeeded, the exception if it failed, C{"pending"} if it has not fired."""
    box: list[object] = []
    d.addCallbacks(box.append, lambda f: box.append(f.value))
    return box[0] if box else "pending"


def make(tmp_path: Path, clock: Clock, turn: SyncTurn, name: str = "q",
         run_in_thread: RunInThread = run_inline) -> tuple[PeriodicSyncFile, CountingFsync]:
    fsync = CountingFsync()
    f = PeriodicSyncFile(str(tmp_path / name), clock, 0.0, fsync=fsync,
                         run_in_thread=run_in_thread, turn=turn)
    return f, fsync


def test_one_fsync_covers_every_write_of_the_turn(tmp_path: Path, clock: Clock) -> None:
    """Nothing is durable before the turn ends; then one fsync makes every write of it so."""
    f, fsync = make(tmp_path, clock, SyncTurn(clock))
    ds = [f.write(b"%d" % i) for i in range(5)]
    assert (tmp_path / "q").read_bytes() == b"01234"
    assert fsync.calls == 0
    assert [outcome(d) for d in ds] == ["pending"] * 5
    clock.advance(0)
    assert fsync.calls == 1
    assert [outcome(d) for d in ds] == [None] * 5
    assert f.durable_position == 5
    f.close()


def test_writes_made_by_the_acknowledgements_wait_for_the_next_turn(tmp_path: Path,
                                                                      clock: Clock) -> None:
    """A write made when an ack fires is covered by a later turn's fsync, not a nested one."""
    f, fsync = make(tmp_path, clock, SyncTurn(clock))
    later: list[tuple[Deferred[None], int]] = []

    def ack(_: object) -> None:
        d = f.write(b"b")
        later.append((d, fsync.calls))
        assert outcome(d) == "pending"

    f.write(b"a").addCallback(ack)
    # (task.Clock runs a call scheduled during advance() in that same advance; a
    # reactor runs it in its next turn.)
    clock.advance(0)
    [(d, calls_then)] = later
    assert calls_then == 1  # nothing started from inside the first fsync's callbacks
    assert fsync.calls == 2
    assert outcome(d) is None
    f.close()


def test_a_failed_fsync_fails_exactly_the_writes_of_its_turn(tmp_path: Path,
                                                             clock: Clock) -> None:
    """The turn's fsync fails: its writes fail; the next turn's writes are not touched."""
    f, fsync = make(tmp_path, clock, SyncTurn(clock))
    first = [f.write(b"1"), f.write(b"2")]
    fsync.failing = OSError(5, "Input/output error")
    with capturedLogs():
        clock.advance(0)
    assert [type(outcome(d)) for d in first] == [OSError, OSError]
    fsync.failing = None
    second = f.write(b"3")
    assert outcome(second) == "pending"
    clock.advance(0)
    assert outcome(second) is None
    f.close()


def test_files_sharing_a_turn_get_one_call_and_one_fsync_each(tmp_path: Path,
                                                              clock: Clock) -> None:
    """Two files written in one turn: one delayed call for the turn, one fsync per file."""
    turn = SyncTurn(clock)
    a, fsync_a = make(tmp_path, clock, turn, "a")
    b, fsync_b = make(tmp_path, clock, turn, "b")
    ds = [a.write(b"1"), b.write(b"2"), a.write(b"3"), b.write(b"4")]
    assert len(clock.getDelayedCalls()) == 1
    clock.advance(0)
    assert (fsync_a.calls, fsync_b.calls) == (1, 1)
    assert [outcome(d) for d in ds] == [None] * 4
    a.close()
    b.close()


def test_close_before_the_turn_ends_fsyncs_once(tmp_path: Path, clock: Clock) -> None:
    """Closed before the turn's end: the close's fsync covers the writes; the turn does nothing."""
    f, fsync = make(tmp_path, clock, SyncTurn(clock))
    d = f.write(b"x")
    assert f.hand_over() is None  # a write waits: the file cannot be handed over
    f.close()
    assert outcome(d) is None and fsync.calls == 1
    clock.advance(0)
    assert fsync.calls == 1


def test_with_a_thread_the_turn_starts_one_fsync(tmp_path: Path, clock: Clock) -> None:
    """With a thread runner the turn starts the fsync there; writes meanwhile wait for the next."""
    thread = ManualThread()
    f, fsync = make(tmp_path, clock, SyncTurn(clock), run_in_thread=thread)
    d1, d2 = f.write(b"1"), f.write(b"2")
    assert not thread.jobs
    clock.advance(0)
    assert len(thread.jobs) == 1
    d3 = f.write(b"3")
    clock.advance(0)
    assert len(thread.jobs) == 1  # one fsync at a time
    thread.run_next()
    assert [outcome(d) for d in (d1, d2, d3)] == [None, None, "pending"]
    clock.advance(0)
    thread.run_next()
    assert outcome(d3) is None and fsync.calls == 2
    f.close()


def test_a_call_that_raises_does_not_stop_the_others(clock: Clock) -> None:
    """SyncTurn logs a failing call and runs the rest of the turn's calls."""
    turn = SyncTurn(clock)
    ran: list[str] = []

    def boom() -> None:
        raise RuntimeError("boom")

    turn.call(boom)
    turn.call(lambda: ran.append("second"))
    with capturedLogs() as events:
        clock.advance(0)
    assert ran == ["second"]
    assert any(e.get("log_failure") is not None for e in events)


def test_journal_fsync_is_reactor_or_thread(tmp_path: Path) -> None:
    """The key takes reactor (the default) or thread; anything else is a config error."""
    assert parse_config("").journal_fsync == "reactor"
    assert parse_config("journal_fsync: thread\n").journal_fsync == "thread"
    with pytest.raises(ConfigError, match="journal_fsync"):
        parse_config("journal_fsync: sideways\n")
