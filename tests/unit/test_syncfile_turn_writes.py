"""
Records nobody may see before they are durable (durable adds) wait for the
end of the reactor turn: under C{sync_journal: always} with a L{SyncTurn},
L{PeriodicSyncFile.write_unseen} holds their bytes, and the turn writes them
all in one C{os.write}, right before its fsync (docs/journal.md, "One write
per turn"). Everything else that touches the file writes them first.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any
from unittest import mock

from twisted.internet.task import Clock
from twisted.logger import capturedLogs
from twisted.python.failure import Failure

from kestrel.item import QItem
from kestrel.journal import records as rec
from kestrel.journal.batch import WriteCoalescer
from kestrel.journal.journal import FileJournal
from kestrel.journal.runner import SyncTurn
from kestrel.journal.syncfile import PeriodicSyncFile
from kestrel.protocols.memcache import MemcacheFactory
from kestrel.queue import JOURNAL_RETRY_SECONDS
from tests.support import StringClient, make_server
from tests.unit.test_queue import value
from tests.unit.test_syncfile import CountingFsync
from tests.unit.test_syncfile_turn import outcome


class Writes:
    """An C{os.write} that logs what each call wrote, and fails (ENOSPC) on demand."""

    def __init__(self) -> None:
        self.calls: list[bytes] = []
        #: Fail the next write after writing this many of its bytes (None: never fail).
        self.fail_after: int | None = None
        #: Fail only that one write (the disk has room again right after).
        self.once = False

    def __call__(self, fd: int, data: bytes) -> int:
        if self.fail_after is not None:
            if self.fail_after:
                os.write(fd, data[:self.fail_after])  # (a partial write, then the error)
            if self.once:
                self.fail_after = None
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.calls.append(bytes(data))
        return os.write(fd, data)


def make(tmp_path: Path, clock: Clock, policy: float | None = 0.0, *, turn: bool = True,
         coalescer: WriteCoalescer | None = None, **kwargs: Any,
         ) -> tuple[PeriodicSyncFile, Writes, CountingFsync]:
    writes, fsync = Writes(), CountingFsync()
    f = PeriodicSyncFile(str(tmp_path / "q"), clock, policy, fsync=fsync, write=writes,
                         turn=SyncTurn(clock) if turn else None, coalescer=coalescer,
                         **kwargs)
    return f, writes, fsync


def on_disk(tmp_path: Path) -> bytes:
    return (tmp_path / "q").read_bytes()


def test_the_turns_unseen_records_reach_the_file_in_one_write(tmp_path: Path,
                                                              clock: Clock) -> None:
    """Nothing reaches the OS before the turn ends; then one write and one fsync cover all."""
    f, writes, fsync = make(tmp_path, clock)
    ds = [f.write_unseen(b"%d" % i) for i in range(50)]
    assert writes.calls == [] and on_disk(tmp_path) == b""
    assert f.position == 90 and f.durable_position == 0
    assert all(outcome(d) == "pending" for d in ds)
    assert len(clock.getDelayedCalls()) == 1
    clock.advance(0)
    assert writes.calls == [b"".join(b"%d" % i for i in range(50))]
    assert fsync.calls == 1
    assert all(outcome(d) is None for d in ds)
    assert f.durable_position == f.position == 90
    f.close()


def test_other_records_write_the_held_ones_first(tmp_path: Path, clock: Clock) -> None:
    """A remove goes out at once, after what was held before it; order in the file is kept."""
    f, writes, fsync = make(tmp_path, clock)
    adds = [f.write_unseen(b"a"), f.write_unseen(b"b")]
    remove = f.write(b"R")
    assert writes.calls == [b"ab", b"R"] and on_disk(tmp_path) == b"abR"
    adds += [f.write_unseen(b"c"), f.write_unseen(b"d")]
    assert on_disk(tmp_path) == b"abR"
    clock.advance(0)
    assert writes.calls == [b"ab", b"R", b"cd"] and on_disk(tmp_path) == b"abRcd"
    assert fsync.calls == 1
    assert [outcome(d) for d in [*adds, remove]] == [None] * 5
    f.close()


def test_a_failed_turn_write_fails_exactly_its_records(tmp_path: Path, clock: Clock) -> None:
    """
    The OS refuses the turn's write after part of it: the file is cut back
    to before the held records, exactly their Deferreds fail, the error is
    reported once; a remove written before them is still made durable.
    """
    errors: list[tuple[str, OSError]] = []
    f, writes, fsync = make(tmp_path, clock, on_error=lambda k, e: errors.append((k, e)))
    before = f.write(b"R")
    held = [f.write_unseen(b"aaaa"), f.write_unseen(b"bbbb")]
    writes.fail_after = 3
    with capturedLogs() as events:
        clock.advance(0)
    assert [type(outcome(d)) for d in held] == [OSError, OSError]
    assert outcome(before) is None and fsync.calls == 1
    assert on_disk(tmp_path) == b"R" and f.position == f.durable_position == 1
    assert [(k, e.errno) for k, e in errors] == [("write", errno.ENOSPC)]
    assert any("held-back" in e.get("log_format", "") for e in events)
    writes.fail_after = None
    later = f.write_unseen(b"c")
    clock.advance(0)
    assert outcome(later) is None and on_disk(tmp_path) == b"Rc"
    f.close()


def test_a_record_written_after_held_records_that_fail_is_refused_too(
        tmp_path: Path, clock: Clock) -> None:
    """
    A remove needs the file while durable adds are held; writing them fails,
    though the remove alone would fit: the remove is refused too and never
    reaches the file, so the cut-back that follows cannot keep it (a read
    opened by it would be replayed open, with no reader told of it).
    """
    errors: list[tuple[str, OSError]] = []
    f, writes, fsync = make(tmp_path, clock, on_error=lambda k, e: errors.append((k, e)))
    held = f.write_unseen(b"aaaa")
    writes.fail_after, writes.once = 2, True
    remove = f.write(b"R")
    refusals = [outcome(d) for d in (held, remove)]
    assert [(type(e), e.errno) for e in refusals] == [(OSError, errno.ENOSPC)] * 2
    assert on_disk(tmp_path) == b"" and f.position == 0
    assert [(k, e.errno) for k, e in errors] == [("write", errno.ENOSPC)]
    later = f.write(b"S")
    clock.advance(0)
    assert outcome(later) is None and on_disk(tmp_path) == b"S"
    f.close()


def test_close_writes_held_records_and_makes_them_durable(tmp_path: Path,
                                                          clock: Clock) -> None:
    """Closed before the turn ends: one write, the close's fsync; the turn does nothing."""
    f, writes, fsync = make(tmp_path, clock)
    ds = [f.write_unseen(b"x"), f.write_unseen(b"y")]
    assert f.hand_over() is None  # (bytes are held: the file cannot be handed over)
    f.close()
    assert writes.calls == [b"xy"] and fsync.calls == 1
    assert [outcome(d) for d in ds] == [None, None]
    clock.advance(0)
    assert writes.calls == [b"xy"] and fsync.calls == 1
    assert on_disk(tmp_path) == b"xy"


def test_abandon_fails_held_records_and_writes_nothing(tmp_path: Path, clock: Clock) -> None:
    """Given up after a failure: held records fail and never reach the file."""
    f, writes, _ = make(tmp_path, clock)
    d = f.write_unseen(b"x")
    error = OSError(errno.EIO, "Input/output error")
    f.abandon(error)
    assert outcome(d) is error and f.position == 0
    clock.advance(0)
    assert writes.calls == [] and on_disk(tmp_path) == b""


def test_sync_and_flush_write_held_records(tmp_path: Path, clock: Clock) -> None:
    """An explicit sync (read-behind, a pack) and a flush see the held bytes in the file."""
    f, writes, fsync = make(tmp_path, clock)
    first = f.write_unseen(b"a")
    synced = f.sync()
    assert writes.calls == [b"a"] and outcome(first) is None and outcome(synced) is None
    second = f.write_unseen(b"b")
    assert f.flush() is True
    assert on_disk(tmp_path) == b"ab" and outcome(second) == "pending"
    clock.advance(0)
    assert outcome(second) is None and writes.calls == [b"a", b"b"]
    f.close()


def test_under_a_period_the_turn_writes_and_the_timer_fsyncs(tmp_path: Path,
                                                             clock: Clock) -> None:
    """durable_acks with a period: one write at the turn's end, the fsync within the period."""
    f, writes, fsync = make(tmp_path, clock, 0.5)
    ds = [f.write_unseen(b"a"), f.write_unseen(b"b")]
    assert writes.calls == []
    clock.advance(0)
    assert writes.calls == [b"ab"] and fsync.calls == 0
    assert [outcome(d) for d in ds] == ["pending"] * 2
    ds.append(f.write_unseen(b"c"))
    clock.advance(0.25)
    assert writes.calls == [b"ab", b"c"] and fsync.calls == 0
    clock.advance(0.25)
    assert fsync.calls == 1 and [outcome(d) for d in ds] == [None] * 3
    clock.advance(1)
    assert fsync.calls == 1
    f.close()


def test_a_period_timer_before_the_turns_end_writes_the_held_records(tmp_path: Path,
                                                                     clock: Clock) -> None:
    """The period's timer firing first writes what is held, and its fsync covers it."""
    writes, fsync = Writes(), CountingFsync()
    turn_clock = Clock()  # (the turn ends when it advances: not before the timer here)
    f = PeriodicSyncFile(str(tmp_path / "q"), clock, 0.5, fsync=fsync, write=writes,
                         turn=SyncTurn(turn_clock))
    first = f.write(b"R")  # (starts the period)
    clock.advance(0.4)
    held = f.write_unseen(b"a")
    clock.advance(0.1)
    assert writes.calls == [b"R", b"a"] and fsync.calls == 1
    assert outcome(first) is None and outcome(held) is None
    turn_clock.advance(0)
    assert writes.calls == [b"R", b"a"] and fsync.calls == 1
    clock.advance(1)
    assert fsync.calls == 1
    f.close()


def test_without_a_turn_or_under_never_unseen_writes_go_through(
        tmp_path: Path, clock: Clock) -> None:
    """No turn (journal_fsync: thread), or never: the bytes are in the OS at once."""
    for policy, turn in ((0.0, False), (0.5, False), (None, True)):
        f, writes, _ = make(tmp_path, clock, policy, turn=turn)
        f.write_unseen(b"z")
        assert writes.calls == [b"z"]
        f.close()
        os.unlink(tmp_path / "q")


def test_a_batch_writes_held_records_before_its_own(tmp_path: Path, clock: Clock) -> None:
    """
    A batch whose remove is held back after an unseen add of the turn
    flushes both, in order, at its end; a batch of unseen adds only leaves
    them to the turn.
    """
    batch = WriteCoalescer()
    f, writes, fsync = make(tmp_path, clock, coalescer=batch)
    f.write_unseen(b"a")
    batch.begin()
    f.write(b"R")
    f.write_unseen(b"b")
    assert writes.calls == []
    assert batch.end() is True
    assert writes.calls == [b"aRb"]
    batch.begin()
    f.write_unseen(b"c")
    assert batch.end() is True
    assert writes.calls == [b"aRb"]
    clock.advance(0)
    assert writes.calls == [b"aRb", b"c"] and fsync.calls == 1
    f.close()


def test_the_fsync_observer_times_held_records(tmp_path: Path, clock: Clock) -> None:
    """Each held record's delay runs from its write_unseen to the turn's fsync."""
    seen: list[tuple[float, list[float]]] = []
    f, _, _ = make(tmp_path, clock, on_fsync=lambda s, delays: seen.append((s, list(delays))))
    f.write_unseen(b"a")
    clock.advance(0.25)  # (under task.Clock the turn's call runs at this advance)
    assert seen == [(0.0, [0.25])]
    f.close()


def test_a_journal_rotation_writes_held_adds_to_the_rotated_file(tmp_path: Path,
                                                                 clock: Clock) -> None:
    """add_unseen then a rotation: the add is in the rotated file, acknowledged after its fsync."""
    journal = FileJournal(str(tmp_path), "q", clock, 0.0, sync_turn=SyncTurn(clock))
    journal.replay(lambda r: None)
    held = journal.add_unseen(QItem(b"a", 1))
    journal.rotate([], False)
    after = journal.add_unseen(QItem(b"b", 2))
    clock.advance(0)
    assert outcome(held) is None and outcome(after) is None
    rotated = [n for n in os.listdir(tmp_path) if n.startswith("q.")]
    assert len(rotated) == 1
    assert rec.decode_prefix((tmp_path / rotated[0]).read_bytes()).records == [
        rec.Add(b"a", 1, 0)]
    assert rec.decode_prefix((tmp_path / "q").read_bytes()).records == [rec.Add(b"b", 2, 0)]
    journal.close()


# ----- through the server: memcache sets of many connections in one turn


def durable_server(tmp_path: Path, clock: Clock,
                   policy: str = "{sync_journal: always}") -> tuple[Any, Any, Writes]:
    """
    A server under C{sync_journal: always} (the reactor-turn fsync), or
    the C{default} C{policy}, queue C{q} created and holding C{"old"}, its
    journal writing through a L{Writes}.
    """
    server = make_server(clock, tmp_path, f"default: {policy}\n")
    factory = MemcacheFactory(server)
    assert StringClient(factory).send(b"set q 0 0 3\r\nold\r\n") == b""
    clock.advance(1)
    writes = Writes()
    journal = server.collection.queue("q").journal
    journal._os_write = writes  # (the files a recovery opens write through it too)
    journal.writer._os_write = writes
    return server, factory, writes


def test_fifty_connections_setting_in_one_turn_cost_one_write(tmp_path: Path,
                                                              clock: Clock) -> None:
    """50 producers' sets of one turn: one os.write and one fsync, then 50 STORED."""
    server, factory, writes = durable_server(tmp_path, clock)
    producers = [StringClient(factory) for _ in range(50)]
    for i, p in enumerate(producers):
        assert p.send(b"set q 0 0 2\r\n%02d\r\n" % i) == b""
    assert writes.calls == []
    clock.advance(0)
    assert len(writes.calls) == 1
    assert [p.take() for p in producers] == [b"STORED\r\n"] * 50
    reader = StringClient(factory)
    got = [reader.send(b"get q\r\n") for _ in range(51)]
    assert got[0] == b"VALUE q 0 3\r\nold\r\nEND\r\n"
    assert got[1:] == [b"VALUE q 0 2\r\n%02d\r\nEND\r\n" % i for i in range(50)]
    server.collection.stopService()


def test_a_get_in_the_turn_writes_the_held_sets_before_its_remove(tmp_path: Path,
                                                                  clock: Clock) -> None:
    """A get between held sets is answered at once; its REMOVE follows them in the file."""
    server, factory, writes = durable_server(tmp_path, clock)
    a, reader, b = StringClient(factory), StringClient(factory), StringClient(factory)
    assert a.send(b"set q 0 0 1\r\na\r\n") == b""
    assert reader.send(b"get q\r\n") == b"VALUE q 0 3\r\nold\r\nEND\r\n"
    assert b.send(b"set q 0 0 1\r\nb\r\n") == b""
    clock.advance(0)
    assert (a.take(), b.take()) == (b"STORED\r\n", b"STORED\r\n")
    assert len(writes.calls) == 3  # the held set, the remove, then the turn's write
    assert [r for data in writes.calls for r in rec.decode_prefix(data).records] == [
        rec.Add(b"a", mock.ANY, 0), rec.REMOVE, rec.Add(b"b", mock.ANY, 0)]
    server.collection.stopService()
    again = make_server(clock, tmp_path)
    assert [value(again.collection.remove("q")).data for _ in range(2)] == [b"a", b"b"]
    again.collection.stopService()


def test_a_refused_turn_write_refuses_its_sets_and_the_queue_recovers(tmp_path: Path,
                                                                      clock: Clock) -> None:
    """
    The disk is full at the turn's end: each producer of the turn gets
    SERVER_ERROR, a blocked reader never sees their items, the queue
    recovers, and memory and journal agree (a restart finds the same items).
    """
    server, factory, writes = durable_server(tmp_path, clock)
    q = server.collection.queue("q")
    first = StringClient(factory)
    assert first.send(b"get q\r\n") == b"VALUE q 0 3\r\nold\r\nEND\r\n"
    reader = StringClient(factory)
    assert reader.send(b"get q/t=10000\r\n") == b""
    producers = [StringClient(factory) for _ in range(3)]
    for p in producers:
        assert p.send(b"set q 0 0 4\r\nlost\r\n") == b""
    writes.fail_after = 5
    with capturedLogs():
        clock.advance(0)
    assert all(p.take().startswith(b"SERVER_ERROR") for p in producers)
    writes.fail_after = None
    with capturedLogs():
        for _ in range(3):
            clock.advance(JOURNAL_RETRY_SECONDS)
    assert q.journal_state == "ok"
    assert reader.take() == b"" and q.length == 0 and q.unsynced_count == 0
    later = StringClient(factory)
    assert later.send(b"set q 0 0 4\r\nkept\r\n") == b""
    clock.advance(0)
    assert later.take() == b"STORED\r\n"
    assert reader.take() == b"VALUE q/t=10000 0 4\r\nkept\r\nEND\r\n"
    assert later.send(b"set q 0 0 5\r\nagain\r\n") == b""
    clock.advance(0)
    server.collection.stopService()
    again = make_server(clock, tmp_path)
    assert value(again.collection.remove("q")).data == b"again"
    assert value(again.collection.remove("q")) is None
    again.collection.stopService()


def test_an_open_refused_with_the_held_sets_leaves_no_read_open(tmp_path: Path,
                                                                clock: Clock) -> None:
    """
    A reader's /open needs the file while a set is held; writing the set
    fails (the disk is full), though the reader's OPEN alone would fit: both
    get SERVER_ERROR, and after the recovery the item is queued, not open
    with nobody holding it, in memory and in the journal.
    """
    server, factory, writes = durable_server(tmp_path, clock)
    q = server.collection.queue("q")
    producer, reader = StringClient(factory), StringClient(factory)
    assert producer.send(b"set q 0 0 4\r\nheld\r\n") == b""
    writes.fail_after, writes.once = 2, True
    with capturedLogs():
        assert reader.send(b"get q/open\r\n").startswith(b"SERVER_ERROR")
        clock.advance(0)
    assert producer.take().startswith(b"SERVER_ERROR")
    with capturedLogs():
        for _ in range(3):
            clock.advance(JOURNAL_RETRY_SECONDS)
    assert q.journal_state == "ok"
    assert (q.open_read_count, q.length) == (0, 1)
    assert StringClient(factory).send(b"get q\r\n") == b"VALUE q 0 3\r\nold\r\nEND\r\n"
    server.collection.stopService()
    again = make_server(clock, tmp_path)
    assert value(again.collection.remove("q")) is None
    assert again.collection.queue("q").open_read_count == 0
    again.collection.stopService()


def test_durable_acks_with_a_period_write_once_per_turn(tmp_path: Path, clock: Clock) -> None:
    """durable_acks under a period: a turn's sets cost one write; STORED after the fsync."""
    server, factory, writes = durable_server(
        tmp_path, clock, "{sync_journal: 500ms, durable_acks: true}")
    producers = [StringClient(factory) for _ in range(5)]
    for i, p in enumerate(producers):
        assert p.send(b"set q 0 0 1\r\n%d\r\n" % i) == b""
    clock.advance(0)
    assert len(writes.calls) == 1
    assert [p.take() for p in producers] == [b""] * 5
    clock.advance(0.5)
    assert [p.take() for p in producers] == [b"STORED\r\n"] * 5
    server.collection.stopService()
    again = make_server(clock, tmp_path)
    assert [value(again.collection.remove("q")).data for _ in range(6)] == [
        b"old", b"0", b"1", b"2", b"3", b"4"]
    again.collection.stopService()


class Told:
    """A L{kestrel.journal.syncfile.Waiter} that notes what it is told, in order."""

    def __init__(self, log: list[tuple[str, object]], name: str) -> None:
        self.log = log
        self.name = name

    def callback(self, result: None) -> None:
        self.log.append((self.name, result))

    def errback(self, fail: Failure) -> None:
        self.log.append((self.name, fail.value))


def test_a_waiter_is_told_after_the_turns_fsync_instead_of_a_deferred(tmp_path: Path,
                                                                     clock: Clock) -> None:
    """write_unseen with a waiter returns nothing; the turn's fsync tells each waiter, in order."""
    f, writes, fsync = make(tmp_path, clock)
    log: list[tuple[str, object]] = []
    assert [f.write_unseen(b"%d" % i, Told(log, str(i))) for i in range(3)] == [None] * 3
    assert log == [] and writes.calls == []
    clock.advance(0)
    assert writes.calls == [b"012"] and fsync.calls == 1
    assert log == [("0", None), ("1", None), ("2", None)]
    clock.advance(0)
    assert len(log) == 3  # (each is told once)
    f.close()


def test_a_waiter_is_told_the_failure_of_the_turns_write_or_fsync(tmp_path: Path,
                                                                  clock: Clock) -> None:
    """The turn's refused write fails its waiters; so does a failed fsync, and nothing else."""
    f, writes, fsync = make(tmp_path, clock)
    log: list[tuple[str, object]] = []
    f.write_unseen(b"a", Told(log, "a"))
    writes.fail_after, writes.once = 0, True
    with capturedLogs():
        clock.advance(0)
    assert [(name, getattr(error, "errno", None)) for name, error in log] == [("a", errno.ENOSPC)]
    (tmp_path / "2").mkdir()
    f, writes, fsync = make(tmp_path / "2", clock)
    f.write_unseen(b"b", Told(log, "b"))
    fsync.failing = OSError(errno.EIO, "Input/output error")
    with capturedLogs():
        clock.advance(0)
    assert [(name, getattr(error, "errno", None)) for name, error in log[1:]] == [("b", errno.EIO)]


def test_a_waiter_without_a_turn_is_told_as_the_write_settles(tmp_path: Path,
                                                              clock: Clock) -> None:
    """
    Without a turn write_unseen is write, and the waiter hears what its
    Deferred would: under C{never} at once (nothing to wait for); under
    0.0 with an inline fsync before write_unseen returns; a refused write
    before it returns too.
    """
    log: list[tuple[str, object]] = []
    never, writes, fsync = make(tmp_path, clock, None, turn=False)
    assert never.write_unseen(b"n", Told(log, "never")) is None
    assert log == [("never", None)] and fsync.calls == 0
    never.close()
    (tmp_path / "always").mkdir()
    always, writes, fsync = make(tmp_path / "always", clock, 0.0, turn=False)
    always.write_unseen(b"a", Told(log, "always"))
    assert log[1:] == [("always", None)] and fsync.calls == 1
    writes.fail_after = 0
    with capturedLogs():
        always.write_unseen(b"r", Told(log, "refused"))
    assert [name for name, _ in log[2:]] == ["refused"] and isinstance(log[2][1], OSError)
    always.close()
