"""
Tests for L{kestrel.journal.journal.FileJournal}: file naming, replay and
corruption handling, rotation, rewrite and pack (including every crash window),
read-behind, archiving, erase and queue discovery.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.logger import LogLevel, capturedLogs

from kestrel.item import QItem
from kestrel.journal import journal as journal_module
from kestrel.journal import naming
from kestrel.journal import records as rec
from kestrel.journal.journal import Checkpoint, FileJournal, JournalNotOpenError
from tests.compat.model import queue_state
from tests.support import ManualThread


class Crash(BaseException):
    """Raised by a failing fsync to stop an operation dead, as a power cut would."""


class Fsync:
    """
    A real fsync that logs whether each call was on a directory, and on call
    C{crash_at} raises C{error} (a L{Crash} unless told otherwise), first
    calling C{on_crash} (which may copy the folder as the crash leaves it:
    a Crash raised in a Deferred's callback does not stop the process).
    """

    def __init__(self, crash_at: int | None = None) -> None:
        self.calls: list[str] = []
        self.crash_at = crash_at
        self.error: BaseException = Crash()
        self.on_crash: Callable[[], object] | None = None

    def __call__(self, fd: int) -> None:
        kind = "dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
        self.calls.append(kind)
        if self.crash_at is not None and len(self.calls) == self.crash_at:
            if self.on_crash is not None:
                self.on_crash()
            raise self.error
        os.fsync(fd)


def crash_at_every_fsync(tmp_path: Path, build: Callable[[Path, Fsync], Callable[[], object]],
                         check: Callable[[Path], None]) -> int:
    """
    For n = 1, 2, ...: C{build} a fresh journal history in a new folder and
    return its operation; run it with the n-th fsync after the build
    crashing, and C{check} a copy of the folder taken at that moment (the
    files a power cut there leaves). Stop at the first n the operation never
    reaches; return how many crash points were checked.
    """
    n = 1
    while True:
        folder = tmp_path / f"crash{n}"
        fsync = Fsync()
        operation = build(folder, fsync)
        fsync.crash_at = len(fsync.calls) + n
        after = tmp_path / f"after{n}"
        fsync.on_crash = lambda folder=folder, after=after: shutil.copytree(folder, after)
        with contextlib.suppress(Crash), capturedLogs():
            operation()
        if len(fsync.calls) < fsync.crash_at:
            return n - 1
        check(after)
        assert not any("~~" in f or f.endswith(".pack") for f in files(after)), (n, files(after))
        n += 1


def open_journal(path: Path, clock: Clock, policy: float | None = None,
                 **kwargs: Any) -> tuple[FileJournal, list[rec.Record]]:
    j = FileJournal(str(path), "q", clock, policy, **kwargs)
    got: list[rec.Record] = []
    j.replay(got.append)
    return j, got


def replayed(path: Path, clock: Clock) -> list[rec.Record]:
    j, got = open_journal(path, clock)
    j.close()
    return got


def files(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


def item(n: int, size: int = 3) -> QItem:
    return QItem(bytes([65 + n % 26]) * size, 1000 + n)


def warnings_of(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("log_level") is not None
            and e["log_level"].name == "warn"]


SMALL = [rec.Add(b"one", 1, 0), rec.RemoveTentativeXid(1), rec.Add(b"", 2, 5),
         rec.Continue(1, b"two", 3, 0), rec.RemoveTentativeXid(4), rec.Unremove(4),
         rec.RemoveTentativeXid(4), rec.ConfirmRemove(4), rec.Remove(),
         rec.SaveXid(9), rec.AddXid(2, b"three", 4, 0)]


# -- replay and corruption ---------------------------------------------------

def test_replay_truncated_at_every_byte_offset(tmp_path: Path, clock: Clock) -> None:
    """
    A journal cut at any byte replays exactly its complete records, the file
    is truncated to them with a warning naming queue, file, offset and bytes
    dropped, and nothing raises; new writes then replay after them.
    """
    encoded = [r.encode() for r in SMALL]
    raw = b"".join(encoded)
    bounds = [0]
    for e in encoded:
        bounds.append(bounds[-1] + len(e))
    for cut in range(len(raw) + 1):
        d = tmp_path / f"cut{cut}"
        d.mkdir()
        (d / "q").write_bytes(raw[:cut])
        whole = max(i for i, b in enumerate(bounds) if b <= cut)
        with capturedLogs() as events:
            j, got = open_journal(d, clock)
        assert got == SMALL[:whole], cut
        assert (d / "q").stat().st_size == bounds[whole]
        assert j.size == bounds[whole]
        warns = warnings_of(events)
        if cut == bounds[whole]:
            assert warns == []
        else:
            assert len(warns) == 1
            w = warns[0]
            assert (w["queue"], w["file"], w["offset"], w["dropped"]) == (
                "q", "q", bounds[whole], cut - bounds[whole])
        j.add(QItem(b"after", 7))
        j.close()
        assert replayed(d, clock) == [*SMALL[:whole], rec.Add(b"after", 7, 0)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(SMALL), max_size=8), st.binary(min_size=1, max_size=12),
       st.data())
def test_replay_of_damaged_bytes_never_raises(good: list[rec.Record], garbage: bytes,
                                              data: st.DataObject) -> None:
    """
    Whatever bytes overwrite part of a journal, replay does not raise: it
    yields exactly the records that decode before the damage, and cuts the
    file there.
    """
    raw = bytearray(b"".join(r.encode() for r in good))
    at = data.draw(st.integers(0, len(raw)))
    raw[at:at + len(garbage)] = garbage
    expected = rec.decode_prefix(bytes(raw))
    clock = Clock()
    with tempfile.TemporaryDirectory() as d, capturedLogs():
        (Path(d) / "q").write_bytes(bytes(raw))
        j, got = open_journal(Path(d), clock)
        j.close()
        assert got == [r if not isinstance(r, rec.LegacyAdd) else rec.Add(r.data, 0,
                                                                           r.expiry_s * 1000)
                       for r in expected.records]
        assert (Path(d) / "q").stat().st_size == expected.end


@pytest.mark.parametrize("size", [0, 15])
def test_addx_block_shorter_than_its_times_cuts_the_file(tmp_path: Path, clock: Clock,
                                                         size: int) -> None:
    """
    An ADDX whose block is shorter than its add time and expiry (16 bytes)
    is damage, as the record decoder says: replay keeps the records before
    it, cuts the file there with a warning, and applies nothing after it.
    """
    kept = rec.encode_add(b"kept", 5)
    damaged = struct.pack("<Biqq", 2, size, 1, 2) + rec.encode_add(b"after", 6)
    (tmp_path / "q").write_bytes(kept + damaged)
    with capturedLogs() as events:
        j, got = open_journal(tmp_path, clock)
    j.close()
    assert got == [rec.Add(b"kept", 5, 0)]
    assert (tmp_path / "q").stat().st_size == len(kept)
    assert len(warnings_of(events)) == 1


def test_invalid_opcode_cuts_rest_of_file(tmp_path: Path, clock: Clock) -> None:
    """An unknown opcode mid-file drops it and everything after it in that file."""
    good = rec.Add(b"ok", 1, 0).encode()
    (tmp_path / "q").write_bytes(good + b"\x42" + good)
    with capturedLogs() as events:
        j, got = open_journal(tmp_path, clock)
    assert got == [rec.Add(b"ok", 1, 0)]
    assert (tmp_path / "q").read_bytes() == good
    (w,) = warnings_of(events)
    assert w["offset"] == len(good) and w["dropped"] == len(good) + 1
    j.close()


def test_corruption_in_rotated_file_truncates_that_file(tmp_path: Path, clock: Clock) -> None:
    """
    A broken record in a rotated file truncates that file, not the current
    one, and replay goes on with the next file.
    """
    a = rec.Add(b"a", 1, 0).encode()
    b = rec.Add(b"b", 2, 0).encode()
    c = rec.Add(b"c", 3, 0).encode()
    (tmp_path / "q.100").write_bytes(a + b[:-1])
    (tmp_path / "q.200").write_bytes(b)
    (tmp_path / "q").write_bytes(c)
    with capturedLogs() as events:
        j, got = open_journal(tmp_path, clock)
    assert got == [rec.Add(b"a", 1, 0), rec.Add(b"b", 2, 0), rec.Add(b"c", 3, 0)]
    assert (tmp_path / "q.100").read_bytes() == a
    assert (tmp_path / "q.200").read_bytes() == b
    assert (tmp_path / "q").read_bytes() == c
    (w,) = warnings_of(events)
    assert (w["file"], w["offset"], w["dropped"]) == ("q.100", len(a), len(b) - 1)
    assert j.archived_size == len(a) + len(b)
    assert j.size == len(c)
    j.close()


def test_replay_order_and_temp_files(tmp_path: Path, clock: Clock) -> None:
    """Rotated files replay by numeric timestamp, then <q>; ~~ files are deleted unread."""
    for ts, data in [(1000, b"2"), (20, b"1"), (30000, b"3")]:
        (tmp_path / f"q.{ts}").write_bytes(rec.Add(data, 0, 0).encode())
    (tmp_path / "q").write_bytes(rec.Add(b"4", 0, 0).encode())
    (tmp_path / "q~~5").write_bytes(rec.Add(b"junk", 0, 0).encode())
    (tmp_path / "qq.1").write_bytes(rec.Add(b"other queue", 0, 0).encode())
    got = replayed(tmp_path, clock)
    assert [r.data for r in got] == [b"1", b"2", b"3", b"4"]  # type: ignore[union-attr]
    assert "q~~5" not in files(tmp_path)


def test_missing_files_replay_empty_and_create_current(tmp_path: Path, clock: Clock) -> None:
    """A queue with no files replays nothing and then has an empty <q> to append to."""
    d = tmp_path / "new"
    j, got = open_journal(d, clock)
    assert got == []
    assert files(d) == ["q"]
    j.close()


def test_legacy_add_gets_replay_time(tmp_path: Path, clock: Clock) -> None:
    """A legacy ADD replays as an add stamped with the replay time, expiry in ms."""
    (tmp_path / "q").write_bytes(rec.LegacyAdd(b"old", 1234).encode())
    got = replayed(tmp_path, clock)
    assert got == [rec.Add(b"old", int(clock.seconds() * 1000), 1_234_000)]


def test_write_before_replay_fails_clearly(tmp_path: Path, clock: Clock) -> None:
    """A write before replay() opened the journal fails its Deferred and writes nothing."""
    j = FileJournal(str(tmp_path), "q", clock, None)
    errors: list[Any] = []
    j.add(QItem(b"x", 1)).addErrback(errors.append)
    assert errors[0].type is JournalNotOpenError
    assert files(tmp_path) == []


def test_sync_policy_applies_to_writes(tmp_path: Path, clock: Clock) -> None:
    """With sync_policy 0 every write is fsynced before its Deferred fires."""
    fsync = Fsync()
    j, _ = open_journal(tmp_path, clock, 0.0, fsync=fsync)
    fired: list[object] = []
    j.add(QItem(b"x", 1)).addCallback(fired.append)
    assert fired == [None]
    assert fsync.calls == ["file"]
    j.close()


# -- rotation and names ---------------------------------------------------------

def test_rotate_names_are_unique_and_ascending(tmp_path: Path, clock: Clock) -> None:
    """Rotations at the same clock time, or after the clock went back, sort in order."""
    j, _ = open_journal(tmp_path, clock)
    now_ms = int(clock.seconds() * 1000)
    for n in range(3):
        j.add(item(n))
        j.rotate([], False)
    clock.advance(-60)
    j.add(item(3))
    j.rotate([], False)
    assert files(tmp_path) == ["q", *(f"q.{now_ms + i}" for i in range(4))]
    j.add(item(4))
    j.close()
    assert [r.data for r in replayed(tmp_path, clock)] == [  # type: ignore[union-attr]
        item(n).data for n in range(5)]


def test_rotate_sizes_and_directory_fsync(tmp_path: Path, clock: Clock) -> None:
    """Rotation resets size, adds the old size to archived_size and fsyncs file then dir."""
    fsync = Fsync()
    j, _ = open_journal(tmp_path, clock, fsync=fsync)
    j.add(QItem(b"hello kitty", 1))
    assert j.size == 32
    j.rotate([], False)
    assert (j.size, j.archived_size) == (0, 32)
    assert fsync.calls == ["file", "dir"]
    j.close()


def test_rotate_sets_checkpoint_once(tmp_path: Path, clock: Clock) -> None:
    """A checkpoint names the rotated file and its open reads; a pending one is kept."""
    j, _ = open_journal(tmp_path, clock)
    j.rotate([], False)
    assert j.checkpoint is None
    open_read = QItem(b"r", 1, 0, 5)
    j.rotate([open_read], True)
    first = j.checkpoint
    assert first is not None and first.reserved_items == (open_read,)
    assert os.path.exists(tmp_path / first.filename)
    j.rotate([], True)
    assert j.checkpoint is first
    j.close()


# -- rewrite -----------------------------------------------------------------------

def build_history(path: Path, clock: Clock, rotations: int, **kwargs: Any) -> FileJournal:
    """Journal six adds, an open read (xid 3) and a remove, rotating along the way."""
    j, _ = open_journal(path, clock, **kwargs)
    for n in range(6):
        j.add(item(n))
        if n < rotations:
            j.rotate([], False)
    j.remove_tentative(3)
    j.remove()
    return j


EXPECTED = ([item(n).data for n in range(2, 6)], {3: item(0).data})


def rewrite_args() -> tuple[list[QItem], list[QItem]]:
    return [QItem(item(0).data, 1000, 0, 3)], [item(n) for n in range(2, 6)]


@pytest.mark.parametrize("rotations", [0, 3])
def test_rewrite_writes_compact_journal(tmp_path: Path, clock: Clock, rotations: int) -> None:
    """
    A rewrite leaves one <q>: SAVE_XID, ADDX + REMOVE_TENTATIVE_XID per open
    read, ADDX per item; rotated files are gone and writes go on after it.
    """
    j = build_history(tmp_path, clock, rotations)
    assert queue_state(replayed(tmp_path, clock)) == EXPECTED
    reserved, items = rewrite_args()
    j.rewrite(reserved, items, 3)
    # The rewrite goes through a pack: the compact file is the pack, in place
    # as the only rotated file, and <q> is the fresh current file.
    left = files(tmp_path)
    assert len(left) == 2 and left[0] == "q" and naming.timed_files("q", left[1:])
    assert (tmp_path / "q").stat().st_size == 0
    assert replayed(tmp_path, clock) == [
        rec.SaveXid(3), rec.Add(item(0).data, 1000, 0), rec.RemoveTentativeXid(3),
        *(rec.Add(i.data, i.add_time_ms, 0) for i in items)]
    assert j.size == 0 and j.archived_size == (tmp_path / left[1]).stat().st_size
    j.confirm_remove(3)
    j.close()
    assert queue_state(replayed(tmp_path, clock)) == (EXPECTED[0], {})


def test_rewrite_fsyncs_new_file_before_rename(tmp_path: Path, clock: Clock) -> None:
    """
    A rewrite through a pack: the rotation fsyncs the old file then the
    directory; the pack's ~~ file and the current file are fsynced before
    the pack is renamed into place, and the directory after every rename.
    """
    fsync = Fsync()
    j = build_history(tmp_path, clock, 0, fsync=fsync)
    j.rewrite(*rewrite_args())
    # rotation: old <q>, dir; pack: ~~ file, current <q>, dir (.pack name),
    # dir (the rotated file disposed of), dir (the pack under its final name)
    assert fsync.calls == ["file", "dir", "file", "file", "dir", "dir", "dir"]
    j.close()


@pytest.mark.parametrize("rotations", [0, 3])
@pytest.mark.parametrize("archive", [False, True])
def test_rewrite_crash_at_every_fsync_recovers(tmp_path: Path, clock: Clock, rotations: int,
                                               archive: bool) -> None:
    """
    A crash at any fsync of a rewrite (before the data or a rename is durable)
    leaves files that replay to the same queue, with no ~~ or .pack left after.
    """
    def build(folder: Path, fsync: Fsync) -> Callable[[], object]:
        kwargs: dict[str, Any] = {"archive_path": str(folder) + ".archive"} if archive else {}
        j = build_history(folder, clock, rotations, fsync=fsync, **kwargs)
        return lambda: j.rewrite(*rewrite_args())

    def check(after: Path) -> None:
        assert queue_state(replayed(after, clock)) == EXPECTED, files(after)

    assert crash_at_every_fsync(tmp_path, build, check) >= 5


@pytest.mark.parametrize("rotations", [0, 3])
def test_rewrite_io_error_leaves_journal_usable(tmp_path: Path, clock: Clock,
                                                rotations: int) -> None:
    """
    An I/O error at any step of a rewrite is reported (logged as an error; a
    failed fsync of a journal file also told to on_failure), yet the journal
    stays writable and its files replay to the queue plus the writes made after.
    """
    clean = Fsync()
    j = build_history(tmp_path / "clean", clock, rotations, fsync=clean)
    before = len(clean.calls)
    j.rewrite(*rewrite_args())
    steps = len(clean.calls) - before
    assert steps >= 5
    for n in range(1, steps + 1):
        d = tmp_path / f"error{n}"
        fsync = Fsync()
        j = build_history(d, clock, rotations, fsync=fsync)
        fsync.crash_at = len(fsync.calls) + n
        fsync.error = OSError(errno.EIO, "I/O error")
        told: list[str] = []
        j.on_failure = lambda kind, error, told=told: told.append(kind)
        with capturedLogs() as events:
            j.rewrite(*rewrite_args())
        assert [e for e in events if e["log_level"] == LogLevel.error], n
        # (written; never fsyncing on write, there is nothing to wait for)
        assert j.add(QItem(b"later", 9)) is None
        j.close()
        assert queue_state(replayed(d, clock)) == ([*EXPECTED[0], b"later"], EXPECTED[1]), n
        assert told in ([], ["fsync"]), n


@pytest.mark.parametrize("leftover", [
    "temp",                # crash while writing ~~
    "pack_with_all",       # .pack renamed, nothing disposed yet
    "pack_with_some",      # crash while disposing of the packed files
    "pack_alone",          # every packed file gone, pack not renamed yet
    "packed_not_current",  # pack rule done, not yet renamed to <q>
])
def test_rewrite_leftover_files_recover(tmp_path: Path, clock: Clock, leftover: str) -> None:
    """
    Each set of files a rewrite can leave behind (built by hand) replays to
    the queue the journal held.
    """
    j = build_history(tmp_path, clock, 3)
    j.close()
    rotated = [f for f in files(tmp_path) if f != "q"]
    compact = b"".join(r.encode() for r in [
        rec.SaveXid(3), rec.Add(item(0).data, 1000, 0), rec.RemoveTentativeXid(3),
        *(rec.Add(i.data, i.add_time_ms, 0) for i in rewrite_args()[1])])
    last_ts = max(int(f.split(".")[1]) for f in rotated)
    if leftover == "temp":
        (tmp_path / f"q~~{last_ts + 5}").write_bytes(compact[:-3])
    else:
        os.rename(tmp_path / "q", tmp_path / f"q.{last_ts + 1}")
        rotated.append(f"q.{last_ts + 1}")
        pack = tmp_path / f"q.{last_ts + 2}.pack"
        pack.write_bytes(compact)
        if leftover == "pack_with_some":
            os.unlink(tmp_path / rotated[0])
            os.unlink(tmp_path / rotated[2])
        elif leftover in ("pack_alone", "packed_not_current"):
            for f in rotated:
                os.unlink(tmp_path / f)
        if leftover == "packed_not_current":
            os.rename(pack, tmp_path / f"q.{last_ts + 2}")
    assert queue_state(replayed(tmp_path, clock)) == EXPECTED
    assert not any("~~" in f or f.endswith(".pack") for f in files(tmp_path))


# -- read-behind and packing ------------------------------------------------------

class Queue:
    """The least of a queue that drives read-behind the way PersistentQueue does."""

    def __init__(self, journal: FileJournal) -> None:
        self.journal = journal
        self.memory: list[QItem] = []
        self.checkpoints: list[Checkpoint] = []

    def got_item(self, i: QItem) -> None:
        self.memory.append(i)

    def got_checkpoint(self, checkpoint: Checkpoint) -> None:
        self.checkpoints.append(checkpoint)
        self.journal.start_pack(checkpoint, [], list(self.memory), 0)

    def remove(self) -> bytes:
        head = self.memory.pop(0)
        self.journal.remove()
        while self.journal.in_read_behind and len(self.memory) < 2:
            self.journal.fill_read_behind(self.got_item, self.got_checkpoint)
        return head.data


def test_read_behind_across_rotation_and_pack(tmp_path: Path, clock: Clock) -> None:
    """
    Read-behind follows a rotated file into the next one, reports the
    checkpoint, the pack replaces the checkpointed file, replay still gives
    the queue's contents, and read-behind ends when the reader meets the writer.
    """
    j, _ = open_journal(tmp_path, clock)
    q = Queue(j)
    for n in range(2):
        j.add(item(n))
        q.memory.append(item(n))
    j.start_read_behind()
    assert j.in_read_behind
    j.add(item(2))
    j.add(item(3))
    j.rotate([], True)
    checkpoint = j.checkpoint
    assert checkpoint is not None
    j.add(item(4))
    assert q.remove() == item(0).data
    assert q.remove() == item(1).data
    assert [i.data for i in q.memory] == [item(2).data, item(3).data]
    assert q.remove() == item(2).data  # reader leaves the rotated file: pack
    assert q.checkpoints == [checkpoint]
    assert j.checkpoint is None
    assert f"{checkpoint.filename}.pack" not in files(tmp_path)
    assert files(tmp_path) == sorted(["q", checkpoint.filename])
    assert queue_state(replayed(tmp_path, clock))[0] == [item(3).data, item(4).data]
    assert q.remove() == item(3).data
    assert q.remove() == item(4).data
    j.fill_read_behind(q.got_item, q.got_checkpoint)
    assert not j.in_read_behind
    j.close()
    assert queue_state(replayed(tmp_path, clock))[0] == []


def pack_scenario(path: Path, clock: Clock, fsync: Fsync, **kwargs: Any,
                  ) -> tuple[FileJournal, Checkpoint, list[QItem]]:
    """
    Open a read (xid 9) on item 0, enter read-behind, rotate with a
    checkpoint, then journal an add and two removes; return what start_pack
    needs (the queue then holds item 3 in memory).
    """
    j, _ = open_journal(path, clock, fsync=fsync, **kwargs)
    for n in range(2):
        j.add(item(n))
    j.remove_tentative(9)
    j.start_read_behind()
    for n in range(2, 4):
        j.add(item(n))
    j.rotate([OPEN], True)
    j.add(item(4))
    for _ in range(2):
        j.remove()
    checkpoint = j.checkpoint
    assert checkpoint is not None
    return j, checkpoint, [item(3)]


OPEN = QItem(item(0).data, item(0).add_time_ms, 0, 9)
PACK_EXPECTED = ([item(3).data, item(4).data], {9: item(0).data})


def test_pack_layout(tmp_path: Path, clock: Clock) -> None:
    """
    The pack holds SAVE_XID, the checkpoint's open reads, one empty ADDX per
    item the later files remove for good, and the items in memory; it takes
    the checkpoint's name and replaces the files up to it.
    """
    j, checkpoint, memory = pack_scenario(tmp_path, clock, Fsync())
    assert queue_state(replayed(tmp_path, clock)) == PACK_EXPECTED
    j.start_pack(checkpoint, [OPEN], memory, 9)
    assert j.checkpoint is None
    assert files(tmp_path) == sorted(["q", checkpoint.filename])
    now_ms = int(clock.seconds() * 1000)
    assert rec.decode_prefix((tmp_path / checkpoint.filename).read_bytes()).records == [
        rec.SaveXid(9), rec.Add(OPEN.data, OPEN.add_time_ms, 0), rec.RemoveTentativeXid(9),
        rec.Add(b"", now_ms, 0), rec.Add(b"", now_ms, 0),
        rec.Add(item(3).data, item(3).add_time_ms, 0)]
    assert queue_state(replayed(tmp_path, clock)) == PACK_EXPECTED
    assert j.archived_size == (tmp_path / checkpoint.filename).stat().st_size
    j.close()


def test_pack_crash_at_every_fsync_recovers(tmp_path: Path, clock: Clock) -> None:
    """A crash at any fsync of a pack leaves files that replay to the same queue."""
    def build(folder: Path, fsync: Fsync) -> Callable[[], object]:
        j, checkpoint, memory = pack_scenario(folder, clock, fsync)
        return lambda: j.start_pack(checkpoint, [OPEN], memory, 9)

    def check(after: Path) -> None:
        assert queue_state(replayed(after, clock)) == PACK_EXPECTED, files(after)

    assert crash_at_every_fsync(tmp_path, build, check) >= 4


def test_pack_in_thread_lets_writes_go_on(tmp_path: Path, clock: Clock) -> None:
    """
    With a thread runner the pack is written off the reactor thread; writes go
    on meanwhile, and the pack is put in place only after the current file's
    fsync, giving the same queue.
    """
    thread = ManualThread()
    j, checkpoint, memory = pack_scenario(tmp_path, clock, Fsync(), run_in_thread=thread)
    thread.run_all()  # the fsync of start_read_behind
    j.start_pack(checkpoint, [OPEN], memory, 9)
    assert len(thread.jobs) == 1
    before = files(tmp_path)
    assert checkpoint.filename in before and j.checkpoint is checkpoint
    j.add(item(5))
    j.remove()
    thread.run_next()  # pack written; now the current file's fsync is queued
    temps = [name for name in files(tmp_path) if "~~" in name]
    assert len(temps) == 1 and files(tmp_path) == sorted([*before, *temps])
    assert len(thread.jobs) == 1
    thread.run_all()
    assert j.checkpoint is None
    assert files(tmp_path) == sorted(["q", checkpoint.filename])
    assert queue_state(replayed(tmp_path, clock)) == ([item(4).data, item(5).data],
                                                      {9: item(0).data})
    j.close()


def test_rewrite_waits_while_a_pack_is_written(tmp_path: Path, clock: Clock) -> None:
    """
    A rewrite asked while a pack is being written is skipped (the queue asks
    again later): the pack is put in place; a rewrite after it goes through
    a pack of its own, and the files replay to the same queue.
    """
    thread = ManualThread()
    j, checkpoint, memory = pack_scenario(tmp_path, clock, Fsync(), run_in_thread=thread)
    thread.run_all()
    j.start_pack(checkpoint, [OPEN], memory, 9)
    before = files(tmp_path)
    j.rewrite([OPEN], [item(3), item(4)], 9)
    assert files(tmp_path) == before
    thread.run_all()
    assert files(tmp_path) == sorted(["q", checkpoint.filename])
    assert queue_state(replayed(tmp_path, clock)) == PACK_EXPECTED
    j.rewrite([OPEN], [item(3), item(4)], 9)
    thread.run_all()
    assert len(files(tmp_path)) == 2
    assert queue_state(replayed(tmp_path, clock)) == PACK_EXPECTED
    j.close()


def test_close_waits_for_pack(tmp_path: Path, clock: Clock) -> None:
    """close() fires only once a running pack is in place, and the pack survives it."""
    thread = ManualThread()
    j, checkpoint, memory = pack_scenario(tmp_path, clock, Fsync(), run_in_thread=thread)
    thread.run_all()
    j.start_pack(checkpoint, [OPEN], memory, 9)
    closed: list[object] = []
    j.close().addCallback(closed.append)
    assert closed == []
    thread.run_all()
    assert closed == [None]
    assert files(tmp_path) == sorted(["q", checkpoint.filename])
    assert queue_state(replayed(tmp_path, clock)) == PACK_EXPECTED


def test_pack_leftover_with_and_without_originals(tmp_path: Path, clock: Clock) -> None:
    """A .pack left with all, some or none of the files it packs replays the same."""
    for case in ("all", "none"):
        d = tmp_path / case
        j, checkpoint, memory = pack_scenario(d, clock, Fsync())
        now_ms = int(clock.seconds() * 1000)
        pack_bytes = b"".join(r.encode() for r in [
            rec.SaveXid(9), rec.Add(OPEN.data, OPEN.add_time_ms, 0), rec.RemoveTentativeXid(9),
            rec.Add(b"", now_ms, 0), rec.Add(b"", now_ms, 0),
            rec.Add(item(3).data, item(3).add_time_ms, 0)])
        j.close()
        (d / f"{checkpoint.filename}.pack").write_bytes(pack_bytes)
        if case == "none":
            os.unlink(d / checkpoint.filename)
        assert queue_state(replayed(d, clock)) == PACK_EXPECTED
        assert files(d) == sorted(["q", checkpoint.filename])


def test_read_behind_started_during_replay(tmp_path: Path, clock: Clock) -> None:
    """
    start_read_behind() during replay starts at the replayer's position: items
    after it are read back by fill_read_behind once replay is over.
    """
    (tmp_path / "q.5").write_bytes(b"".join(rec.Add(b"%d" % n, n, 0).encode()
                                           for n in range(3)))
    (tmp_path / "q").write_bytes(rec.Add(b"3", 3, 0).encode())
    j = FileJournal(str(tmp_path), "q", clock, None)
    seen: list[bytes] = []

    def apply(r: rec.Record) -> None:
        assert j.is_replaying
        if not j.in_read_behind:
            seen.append(r.data)  # type: ignore[union-attr]
            if len(seen) == 2:
                j.start_read_behind()

    j.replay(apply)
    assert not j.is_replaying and j.in_read_behind
    got: list[QItem] = []
    while j.in_read_behind:
        j.fill_read_behind(got.append, lambda c: None)
    assert seen + [i.data for i in got] == [b"0", b"1", b"2", b"3"]
    j.close()


def test_read_behind_eof_of_current_file_syncs_retries_then_leaves(tmp_path: Path,
                                                                   clock: Clock) -> None:
    """
    At the end of the current file short of the writer (bytes lost under it),
    read-behind fsyncs and retries once, then leaves with a warning, never raising.
    """
    fsync = Fsync()
    j, _ = open_journal(tmp_path, clock, fsync=fsync)
    j.add(item(0))
    j.start_read_behind()
    j.add(item(1))
    j.add(item(2))
    with open(tmp_path / "q", "r+b") as f:
        f.truncate(j.size - len(rec.encode_add(item(2).data, 0)))
    got: list[QItem] = []
    j.fill_read_behind(got.append, lambda c: None)
    assert [i.data for i in got] == [item(1).data]
    calls = len(fsync.calls)
    with capturedLogs() as events:
        j.fill_read_behind(got.append, lambda c: None)
    assert len(fsync.calls) == calls + 1
    assert not j.in_read_behind
    assert len(warnings_of(events)) == 1
    j.close()


# -- archive, erase, discovery ----------------------------------------------------

def test_archive_path_receives_rewritten_files(tmp_path: Path, clock: Clock) -> None:
    """With archive_path, the files a rewrite makes dead move there, whole."""
    qdir, adir = tmp_path / "queues", tmp_path / "archive"
    j = build_history(qdir, clock, 2, archive_path=str(adir))
    before = {f: (qdir / f).read_bytes() for f in files(qdir)}
    j.rewrite(*rewrite_args())
    left = files(qdir)
    assert len(left) == 2 and left[0] == "q" and naming.timed_files("q", left[1:])
    archived = {f: (adir / f).read_bytes() for f in files(adir)}
    assert len(archived) == 3
    assert sorted(archived.values()) == sorted(before.values())
    assert all(f.startswith("q.") for f in archived)
    j.close()


def test_erase_archives_everything_in_order(tmp_path: Path, clock: Clock) -> None:
    """erase() with an archive moves every file there; <q> becomes the newest q.<ms>."""
    qdir, adir = tmp_path / "queues", tmp_path / "archive"
    j = build_history(qdir, clock, 2, archive_path=str(adir))
    (adir).mkdir()
    taken = f"q.{int(clock.seconds() * 1000)}"
    (adir / taken).write_bytes(b"")  # an older archived file with the same name
    j.erase()
    assert files(qdir) == []
    archived = files(adir)
    assert len(archived) == 4
    assert (adir / taken).read_bytes() == b""
    got: list[rec.Record] = []
    for f in sorted((a for a in archived if a != taken), key=lambda a: int(a.split(".")[1])):
        got.extend(rec.decode_prefix((adir / f).read_bytes()).records)
    assert queue_state(got) == EXPECTED


def test_archive_across_filesystems_copies(tmp_path: Path, clock: Clock,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """
    When rename into the archive fails with EXDEV (another filesystem), the file
    is copied, fsynced, renamed into place, then deleted from the queue dir.
    """
    qdir, adir = tmp_path / "queues", tmp_path / "archive"
    j = build_history(qdir, clock, 1, archive_path=str(adir))
    real_rename = os.rename

    def rename(src: Any, dst: Any) -> None:
        if str(dst).startswith(str(adir)) and not str(src).startswith(str(adir)):
            raise OSError(errno.EXDEV, "cross-device link")
        real_rename(src, dst)

    monkeypatch.setattr(journal_module.os, "rename", rename)
    contents = sorted((qdir / f).read_bytes() for f in files(qdir))
    j.erase()
    assert files(qdir) == []
    assert sorted((adir / f).read_bytes() for f in files(adir)) == contents
    assert not any("~~" in f for f in files(adir))


def test_erase_deletes_every_file(tmp_path: Path, clock: Clock) -> None:
    """erase() without an archive removes <q>, rotated, ~~ and .pack files of the queue only."""
    j = build_history(tmp_path, clock, 2)
    (tmp_path / "q~~1").write_bytes(b"")
    (tmp_path / "q.1.pack").write_bytes(b"")
    (tmp_path / "other").write_bytes(b"")
    j.erase()
    assert files(tmp_path) == ["other"]
    assert replayed(tmp_path, clock) == []


def test_queue_names_in(tmp_path: Path) -> None:
    """Queue discovery: regular files without ~~, named by the text before the first dot."""
    for name in ["a", "a.123", "b~~5", "c.5.pack", "d+fan.77", ".hidden"]:
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "e").mkdir()
    assert FileJournal.queue_names_in(str(tmp_path)) == {"a", "c", "d+fan"}
    assert FileJournal.queue_names_in(str(tmp_path / "missing")) == set()


def test_queue_names_in_ignores_foreign_files_with_a_warning(tmp_path: Path) -> None:
    """
    Only <q>, <q>.<digits> and <q>.<digits>.pack name a queue; every other
    file (a pid file, a backup) is named in one warning each and left as it is.
    """
    journal_names = ["q", "q.17", "r.5.pack", "s.0"]
    foreign = ["twistd.pid", "q.txt", "q.5.pack.bak", "q.5.", "q..5", "q.pack",
               ".hidden", "q.\u0661"]
    for name in journal_names + foreign:
        (tmp_path / name).write_bytes(b"keep me")
    (tmp_path / "q~~9").write_bytes(b"")
    with capturedLogs() as events:
        assert FileJournal.queue_names_in(str(tmp_path)) == {"q", "r", "s"}
    warned = sorted(e["file"] for e in events if e["log_level"].name == "warn")
    assert warned == sorted(foreign)
    assert all(e["path"] == str(tmp_path) for e in events)
    for name in foreign:
        assert (tmp_path / name).read_bytes() == b"keep me"


@given(st.text(st.characters(blacklist_characters="/~.\0", codec="utf-8"), min_size=1,
               max_size=20),
       st.integers(0, 2**63), st.booleans())
def test_journal_queue_name_matches_replay(queue: str, ms: int, pack: bool) -> None:
    """A name is a journal file of <q> exactly when replay would read it as one."""
    rotated = f"{queue}.{ms}" + (".pack" if pack else "")
    assert journal_module.journal_queue_name(queue) == queue
    assert journal_module.journal_queue_name(rotated) == queue
    assert journal_module.journal_queue_name(f"{queue}.x{ms}") is None
    assert journal_module.journal_queue_name(rotated + ".old") is None


def test_close_stops_writes(tmp_path: Path, clock: Clock) -> None:
    """After close(), writes fail their Deferred and reach no file (closing twice: the
    contract suite)."""
    j, _ = open_journal(tmp_path, clock)
    j.add(item(1))
    j.close()
    errors: list[Any] = []
    j.add(item(2)).addErrback(errors.append)
    assert len(errors) == 1
    assert len(replayed(tmp_path, clock)) == 1


def test_group_commit_through_journal(tmp_path: Path, clock: Clock) -> None:
    """With a thread runner, adds made during an fsync share the next one."""
    thread = ManualThread()
    fsync = Fsync()
    j, _ = open_journal(tmp_path, clock, 0.0, fsync=fsync, run_in_thread=thread)
    fired: list[int] = []
    for n in range(5):
        j.add(item(n)).addCallback(lambda _, n=n: fired.append(n))
    assert len(thread.jobs) == 1
    thread.run_next()
    assert fired == [0]
    thread.run_next()
    assert fired == [0, 1, 2, 3, 4]
    assert fsync.calls == ["file", "file"]
    j.close()


def test_damage_in_a_rotated_file_sets_it_and_those_before_aside(tmp_path: Path,
                                                                 clock: Clock) -> None:
    """
    With a reset callback (the queue's replay), damage in a rotated file moves
    it and every earlier file into a C{q.damaged.<ms>} folder, untouched, and
    replay starts again from the next file: nothing consumed can come back.
    """
    a = rec.Add(b"a", 1, 0).encode()
    b = rec.Add(b"b", 2, 0).encode()
    c = rec.Add(b"c", 3, 0).encode()
    (tmp_path / "q.50").write_bytes(a)
    (tmp_path / "q.100").write_bytes(b + b"\xff")
    (tmp_path / "q.200").write_bytes(rec.REMOVE_BYTES + c)
    (tmp_path / "q").write_bytes(c)
    j = FileJournal(str(tmp_path), "q", clock, None)
    got: list[object] = []
    with capturedLogs() as events:
        j.replay(got.append, lambda: got.append("reset"))
    assert got == [rec.Add(b"a", 1, 0), rec.Add(b"b", 2, 0), "reset", rec.REMOVE,
                   rec.Add(b"c", 3, 0), rec.Add(b"c", 3, 0)]
    [folder] = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert folder.name.startswith("q.damaged.")
    assert sorted(p.name for p in folder.iterdir()) == ["q.100", "q.50"]
    assert (folder / "q.100").read_bytes() == b + b"\xff"
    assert j.damaged_replays == 1
    assert any("ITEMS ADDED BEFORE THE DAMAGE" in e.get("log_format", "") for e in events)
    assert FileJournal.queue_names_in(str(tmp_path)) == {"q"}
    j.close()
