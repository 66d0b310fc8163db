"""Rotation and rewrites run no fsync of a journal file on the calling (reactor) thread."""

from __future__ import annotations

import errno
import os
import stat
from typing import Any

from twisted.internet.task import Clock
from twisted.logger import LogLevel, capturedLogs

from kestrel.config import QueueConfig
from kestrel.item import QItem
from kestrel.journal import records as rec
from kestrel.journal.journal import FileJournal
from kestrel.journal.runner import SyncTurn
from kestrel.queue import PersistentQueue
from tests.support import ThreadFlag
from tests.unit.test_queue import PENDING, datas, value


class Fsyncs:
    """An fsync that counts the calls made outside a thread job, and fsyncs for real."""

    def __init__(self, thread: ThreadFlag) -> None:
        self.thread = thread
        self.inline = 0
        self.in_thread = 0

    def __call__(self, fd: int) -> None:
        if self.thread.running:
            self.in_thread += 1
        else:
            self.inline += 1
        os.fsync(fd)


def open_journal(path, clock: Clock) -> tuple[FileJournal, ThreadFlag, Fsyncs]:
    thread = ThreadFlag()
    fsyncs = Fsyncs(thread)
    journal = FileJournal(str(path), "q", clock, 0.0, fsync=fsyncs, run_in_thread=thread)
    journal.replay(lambda record: None)
    return journal, thread, fsyncs


def replayed(path, clock: Clock) -> list[rec.Record]:
    out: list[rec.Record] = []
    journal = FileJournal(str(path), "q", clock, None)
    journal.replay(out.append)
    value(journal.close())
    return out


def item(data: bytes) -> QItem:
    return QItem(data, 1_767_225_600_000, 0)


def test_rotation_fsyncs_in_the_thread_and_holds_back_new_acknowledgements(tmp_path,
                                                                           clock: Clock) -> None:
    journal, thread, fsyncs = open_journal(tmp_path, clock)
    first = journal.add(item(b"one"))
    thread.run_all()
    assert value(first) is None
    old = journal.add(item(b"two"))
    journal.rotate([], set_checkpoint=False)
    assert fsyncs.inline == 0
    new = journal.add(item(b"three"))
    # The old file's write and the new file's write wait for the thread.
    assert value(old) is PENDING and value(new) is PENDING
    # Jobs: the fsync "two" started before the rotation, then the rotation's
    # fsyncs (old file and directory); the new file's fsync waits for them.
    thread.run_next()
    assert value(new) is PENDING
    thread.run_next()
    assert value(old) is None
    assert value(new) is PENDING
    thread.run_all()
    assert value(new) is None
    assert fsyncs.inline == 0 and fsyncs.in_thread >= 4
    rotated = [n for n in os.listdir(tmp_path) if n.startswith("q.")]
    assert len(rotated) == 1
    value(journal.close())
    assert [r.data for r in replayed(tmp_path, clock) if isinstance(r, rec.Add)] == [
        b"one", b"two", b"three"]


def test_close_during_a_rotation_waits_for_its_fsyncs(tmp_path, clock: Clock) -> None:
    journal, thread, _ = open_journal(tmp_path, clock)
    old = journal.add(item(b"one"))
    journal.rotate([], set_checkpoint=False)
    new = journal.add(item(b"two"))
    closed = journal.close()
    assert value(closed) is PENDING and value(new) is PENDING
    thread.run_all()
    assert value(old) is None and value(new) is None and value(closed) is None


_real_listdir = os.listdir


def count_listings(monkeypatch: Any) -> list[str]:
    """Note every folder C{os.listdir} reads from now on in the list returned."""
    listings: list[str] = []

    def listdir(path: Any = ".") -> list[str]:
        listings.append(str(path))
        return _real_listdir(path)

    monkeypatch.setattr(os, "listdir", listdir)
    return listings


def test_rotations_read_the_folder_once(tmp_path, clock: Clock, monkeypatch: Any) -> None:
    """
    Rotated names come from the folder the first time, then from what the
    journal made: later rotations list nothing, and names stay unique and
    rising when the clock stands still or goes back.
    """
    (tmp_path / "q.1767225700000").write_bytes(b"")  # a file from the future
    journal, thread, _ = open_journal(tmp_path, clock)
    listings = count_listings(monkeypatch)
    names = []
    for step in range(4):
        journal.add(item(b"x"))
        before = set(_real_listdir(tmp_path))
        journal.rotate([], set_checkpoint=False)
        thread.run_all()
        (made,) = set(_real_listdir(tmp_path)) - before
        names.append(made)
        if step == 0:
            assert listings
            listings.clear()
        clock.advance(-1)
    assert listings == []
    stamps = [int(name.split(".")[1]) for name in names]
    assert stamps == sorted(set(stamps)) and stamps[0] > 1_767_225_700_000
    value(journal.close())


def test_empty_rewrites_list_the_folder_until_they_know_it(tmp_path, clock: Clock,
                                                           monkeypatch: Any) -> None:
    """
    The first empty rewrite lists the folder for rotated files; later ones
    do not, until a rotation names one: then the next lists again (and,
    finding the rotated file, rewrites through a pack instead).
    """
    journal, thread, _ = open_journal(tmp_path, clock)
    listings = count_listings(monkeypatch)

    def empty_rewrite() -> None:
        journal.add(item(b"x"))
        journal.remove()
        journal.rewrite([], [], xid_counter=1)
        thread.run_all()

    empty_rewrite()
    assert listings
    listings.clear()
    empty_rewrite()
    empty_rewrite()
    assert listings == []
    journal.add(item(b"x"))
    journal.remove()
    journal.rotate([], set_checkpoint=False)
    thread.run_all()
    listings.clear()
    journal.rewrite([], [], xid_counter=1)
    assert listings  # it looked, found the rotated file, and packs instead
    assert journal.packing
    thread.run_all()
    value(journal.close())
    assert [r for r in replayed(tmp_path, clock) if isinstance(r, rec.Add)] == []


def test_empty_rewrite_fsyncs_in_the_thread(tmp_path, clock: Clock) -> None:
    journal, thread, fsyncs = open_journal(tmp_path, clock)
    added = journal.add(item(b"one"))
    removed = journal.remove()
    journal.rewrite([], [], xid_counter=7)
    assert fsyncs.inline == 0
    assert value(added) is PENDING and value(removed) is PENDING
    assert os.path.getsize(tmp_path / "q") == len(rec.SaveXid(7).encode())
    after = journal.add(item(b"two"))
    thread.run_all()
    assert value(added) is None and value(removed) is None and value(after) is None
    assert fsyncs.inline == 0
    # The job left the next rewrite's empty file; closing deletes it.
    assert sorted(os.listdir(tmp_path)) == ["q", spare_name(tmp_path)]
    value(journal.close())
    assert sorted(os.listdir(tmp_path)) == ["q"]
    assert replayed(tmp_path, clock) == [rec.SaveXid(7), rec.Add(b"two", 1_767_225_600_000, 0)]


def spare_name(folder: Any) -> str:
    """The one spare C{q~~<ms>} file in C{folder}, which must be empty."""
    (name,) = [n for n in os.listdir(folder) if n.startswith("q~~")]
    assert os.path.getsize(os.path.join(folder, name)) == 0
    return name


def test_the_next_empty_rewrite_renames_the_spare(tmp_path, clock: Clock) -> None:
    """
    The thread job of an empty rewrite makes the empty file the next one
    renames over C{q}: the calling thread creates no file after the first.
    """
    journal, thread, fsyncs = open_journal(tmp_path, clock)
    journal.add(item(b"one"))
    journal.remove()
    journal.rewrite([], [], xid_counter=1)
    assert not [n for n in os.listdir(tmp_path) if "~~" in n]  # made in the job, not here
    thread.run_all()
    spare = spare_name(tmp_path)
    spare_inode = os.stat(tmp_path / spare).st_ino
    journal.add(item(b"two"))
    journal.remove()
    clock.advance(1)
    journal.rewrite([], [], xid_counter=2)
    assert os.stat(tmp_path / "q").st_ino == spare_inode
    assert sorted(os.listdir(tmp_path)) == ["q"]
    last = journal.add(item(b"three"))
    thread.run_all()
    assert value(last) is None
    assert spare_name(tmp_path) != spare
    assert fsyncs.inline == 0
    value(journal.close())
    assert replayed(tmp_path, clock) == [rec.SaveXid(2),
                                         rec.Add(b"three", 1_767_225_600_000, 0)]


def test_a_spare_deleted_by_replay_is_made_again(tmp_path, clock: Clock) -> None:
    """A spare that is gone (a replay deletes C{~~} files) is replaced by one made inline."""
    journal, thread, _ = open_journal(tmp_path, clock)
    journal.add(item(b"one"))
    journal.remove()
    journal.rewrite([], [], xid_counter=1)
    thread.run_all()
    os.unlink(tmp_path / spare_name(tmp_path))
    journal.add(item(b"two"))
    journal.remove()
    journal.rewrite([], [], xid_counter=2)
    thread.run_all()
    spare_name(tmp_path)
    value(journal.close())
    assert replayed(tmp_path, clock) == [rec.SaveXid(2)]


def test_no_spare_outlives_an_erase_or_a_failed_creation(tmp_path, clock: Clock,
                                                         monkeypatch: Any) -> None:
    """
    An erase while the rewrite's job is pending leaves no spare behind; a
    spare that cannot be made is logged, and the next rewrite makes its own.
    """
    journal, thread, _ = open_journal(tmp_path, clock)
    journal.add(item(b"one"))
    journal.remove()
    journal.rewrite([], [], xid_counter=1)
    journal.erase()
    thread.run_all()
    assert os.listdir(tmp_path) == []

    journal, thread, _ = open_journal(tmp_path, clock)
    journal.add(item(b"one"))
    journal.remove()
    journal.rewrite([], [], xid_counter=1)

    def no_space(flags: int = 0) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patch, capturedLogs() as events:
        patch.setattr(journal.files, "create_temp", no_space)
        thread.run_all()
    assert any("no spare file" in e.get("log_format", "") for e in events)
    assert sorted(os.listdir(tmp_path)) == ["q"]
    journal.add(item(b"two"))
    journal.remove()
    journal.rewrite([], [], xid_counter=2)
    thread.run_all()
    value(journal.close())
    assert sorted(os.listdir(tmp_path)) == ["q"]
    assert replayed(tmp_path, clock) == [rec.SaveXid(2)]


def deleted_but_open(folder: Any) -> list[str]:
    """The files of C{folder} deleted but still open in this process (their blocks not freed)."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(f"{folder}/") and target.endswith(" (deleted)"):
            out.append(target)
    return out


def test_empty_rewrite_frees_the_old_file_in_the_thread(tmp_path, clock: Clock) -> None:
    """
    The old file of an empty rewrite is replaced, not cut in place: its last
    descriptor is closed, and its blocks freed, by the rewrite's one thread
    job, after the directory fsync; the writes to it are acknowledged once
    that job has made the replacement durable, and new writes wait for it too.
    """
    journal, thread, fsyncs = open_journal(tmp_path, clock)
    for _ in range(50):
        journal.add(item(b"x" * 1000))
        journal.remove()
    last = journal.remove()
    old_inode = os.stat(tmp_path / "q").st_ino
    thread.run_all()
    journal.rewrite([], [], xid_counter=3)
    assert os.stat(tmp_path / "q").st_ino != old_inode
    # Only the thread's duplicate holds the old file.
    assert deleted_but_open(tmp_path) == [f"{tmp_path / 'q'} (deleted)"]
    after = journal.add(item(b"after"))
    assert len(thread.jobs) == 1
    thread.run_next()  # the directory fsync, then the old file's last close
    assert deleted_but_open(tmp_path) == []
    assert value(after) is PENDING  # its fsync waited for the job
    thread.run_all()
    assert value(last) is None
    assert deleted_but_open(tmp_path) == []
    assert value(after) is None
    assert fsyncs.inline == 0
    assert sorted(os.listdir(tmp_path)) == ["q", spare_name(tmp_path)]
    value(journal.close())
    assert replayed(tmp_path, clock) == [rec.SaveXid(3),
                                         rec.Add(b"after", 1_767_225_600_000, 0)]


def test_empty_rewrite_under_never_fsyncs_nothing(tmp_path, clock: Clock) -> None:
    """
    Under C{sync_journal: never} an empty rewrite fsyncs nothing, in the
    thread or out of it; the thread still frees the old file and makes the spare.
    """
    thread = ThreadFlag()
    fsyncs = Fsyncs(thread)
    journal = FileJournal(str(tmp_path), "q", clock, None, fsync=fsyncs, run_in_thread=thread)
    journal.replay(lambda record: None)
    for _ in range(20):
        journal.add(item(b"x" * 1000))
        journal.remove()
    journal.rewrite([], [], xid_counter=4)
    assert deleted_but_open(tmp_path) == [f"{tmp_path / 'q'} (deleted)"]
    after = journal.add(item(b"after"))
    assert after is None  # (never: a write is done once in the OS, nothing to wait for)
    thread.run_all()
    assert deleted_but_open(tmp_path) == []
    assert sorted(os.listdir(tmp_path)) == ["q", spare_name(tmp_path)]
    assert fsyncs.inline == 0 and fsyncs.in_thread == 0
    value(journal.close())
    assert replayed(tmp_path, clock) == [rec.SaveXid(4),
                                         rec.Add(b"after", 1_767_225_600_000, 0)]


def test_empty_rewrite_whose_directory_fsync_fails(tmp_path, clock: Clock) -> None:
    """
    If the directory fsync after the replacement fails, the failure is
    reported (the queue then recovers its journal, as after any failed
    fsync), and the old file is still freed in a thread.
    """
    thread = ThreadFlag()
    failing: list[bool] = []

    def fsync(fd: int) -> None:
        if failing and stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EIO, "Input/output error")
        os.fsync(fd)

    journal = FileJournal(str(tmp_path), "q", clock, 0.0, fsync=fsync, run_in_thread=thread)
    journal.replay(lambda record: None)
    reported: list[tuple[str, OSError]] = []
    journal.on_failure = lambda kind, error: reported.append((kind, error))
    journal.add(item(b"one"))
    journal.remove()
    thread.run_all()
    failing.append(True)
    with capturedLogs() as events:
        journal.rewrite([], [], xid_counter=3)
        thread.run_next()
    assert [kind for kind, _ in reported] == ["fsync"]
    assert any("empty rewrite failed" in e.get("log_format", "") for e in events)
    assert deleted_but_open(tmp_path) == []
    failing.clear()
    thread.run_all()


def open_queue(path, clock: Clock) -> tuple[PersistentQueue, ThreadFlag, Fsyncs]:
    thread = ThreadFlag()
    fsyncs = Fsyncs(thread)
    journal = FileJournal(str(path), "q", clock, 0.0, fsync=fsyncs, run_in_thread=thread)
    config = QueueConfig(max_memory_size=200, default_journal_size=150,
                         max_journal_size=1 << 30, durable_acks=True)
    q = PersistentQueue("q", config, journal, clock)
    q.setup()
    fsyncs.inline = 0
    return q, thread, fsyncs


def test_a_queue_rewriting_its_empty_journal_runs_no_fsync_inline(tmp_path,
                                                                   clock: Clock) -> None:
    """
    Sets and gets through a queue that is empty after every get: rewrites.
    (Under durable_acks an item is seen only once its fsync ran.)
    """
    q, thread, fsyncs = open_queue(tmp_path, clock)
    acks: list[Any] = []
    for i in range(300):
        data = b"%06d" % i
        acks.append(q.add(data))
        assert q.remove() is None
        thread.run_all()
        assert q.remove().data == data
    thread.run_all()
    assert fsyncs.inline == 0
    assert q.journal_rewrites > 10
    assert all(value(a) is True for a in acks)
    value(q.close())
    assert [r for r in replayed(tmp_path, clock) if not isinstance(r, rec.SaveXid)] == []


def test_a_queue_rotating_its_journal_runs_no_fsync_inline(tmp_path, clock: Clock) -> None:
    """Sets past max_memory_size: read-behind and rotations, every fsync in the thread."""
    q, thread, fsyncs = open_queue(tmp_path, clock)
    acks: list[Any] = []
    expected: list[bytes] = []
    for i in range(300):
        data = b"%06d" % i
        acks.append(q.add(data))
        expected.append(data)
        if i % 3 == 0:
            thread.run_all()
        if i % 10 == 9:
            # some gets, the queue stays past max_memory_size
            assert q.remove().data == expected.pop(0)
    thread.run_all()
    assert fsyncs.inline == 0
    assert q.journal_rotations > 10
    assert all(value(a) is True for a in acks)
    assert datas(q) == expected
    thread.run_all()
    value(q.close())


class FileFsyncs(Fsyncs):
    """Also counts, apart, the fsyncs of regular files made outside a thread job."""

    def __init__(self, thread: ThreadFlag) -> None:
        super().__init__(thread)
        self.inline_files = 0

    def __call__(self, fd: int) -> None:
        if not self.thread.running and stat.S_ISREG(os.fstat(fd).st_mode):
            self.inline_files += 1
        super().__call__(fd)


def test_rewrite_of_a_queue_with_items_writes_and_fsyncs_it_in_the_thread(
        tmp_path, clock: Clock) -> None:
    """
    A rewrite of a queue holding items goes through a rotation and a pack:
    no journal file is written and nothing (file or directory) is fsynced
    on the calling thread, not even when the pack is put in place; a crash
    before the pack is in place replays the old files, and afterwards two
    files replay to the rewritten queue and what was written since.
    """
    thread = ThreadFlag()
    fsyncs = FileFsyncs(thread)
    journal = FileJournal(str(tmp_path), "q", clock, 0.0, fsync=fsyncs, run_in_thread=thread)
    journal.replay(lambda record: None)
    adds = [journal.add(item(b"%d" % n)) for n in range(4)]
    removed = journal.remove()
    thread.run_all()
    old_records = replayed(tmp_path, clock)
    fsyncs.inline_files = fsyncs.inline = 0
    journal.rewrite([], [item(b"1"), item(b"2"), item(b"3")], xid_counter=7)
    after = journal.add(item(b"4"))
    assert fsyncs.inline_files == fsyncs.inline == 0
    assert value(after) is PENDING
    # Before the pack is in place, the files still replay to the old contents (and the add).
    assert replayed(tmp_path, clock) == [*old_records, rec.Add(b"4", 1_767_225_600_000, 0)]
    thread.run_all()
    assert fsyncs.inline_files == fsyncs.inline == 0
    assert value(after) is None and all(value(a) is None for a in adds)
    assert value(removed) is None
    assert len(os.listdir(tmp_path)) == 2
    value(journal.close())
    assert replayed(tmp_path, clock) == [
        rec.SaveXid(7), *(rec.Add(b"%d" % n, 1_767_225_600_000, 0) for n in range(1, 5))]


def test_a_queue_rewriting_its_journal_with_items_writes_no_file_inline(
        tmp_path, clock: Clock) -> None:
    """Churn through a queue that keeps items: rewrites past max_journal_size, all off-thread."""
    thread = ThreadFlag()
    fsyncs = FileFsyncs(thread)
    journal = FileJournal(str(tmp_path), "q", clock, 0.0, fsync=fsyncs, run_in_thread=thread)
    config = QueueConfig(max_memory_size=100_000, default_journal_size=1 << 20,
                         max_journal_size=2_000, min_journal_compact_delay=None,
                         durable_acks=True)
    q = PersistentQueue("q", config, journal, clock)
    q.setup()
    fsyncs.inline_files = fsyncs.inline = 0
    acks: list[Any] = []
    expected: list[bytes] = []
    for i in range(600):
        data = b"%06d" % i
        acks.append(q.add(data))
        expected.append(data)
        if len(expected) > 20:
            assert q.remove().data == expected.pop(0)
        if i % 5 == 0:
            thread.run_all()
    thread.run_all()
    assert q.journal_rewrites > 5
    assert fsyncs.inline_files == fsyncs.inline == 0
    assert all(value(a) is True for a in acks)
    assert q.length == len(expected)
    closed = q.close()
    thread.run_all()
    assert value(closed) is None
    again = PersistentQueue("q", config, FileJournal(str(tmp_path), "q", clock, None), clock)
    again.setup()
    assert datas(again) == expected
    value(again.close())


def test_a_queue_asks_for_no_rewrite_while_its_pack_is_written(tmp_path, clock: Clock) -> None:
    """
    While the pack of a rewrite is being written, the queue's later operations
    start no other rewrite (nor count one); once it is in place they do again.
    """
    thread = ThreadFlag()
    journal = FileJournal(str(tmp_path), "q", clock, None, run_in_thread=thread)
    config = QueueConfig(max_memory_size=100_000, default_journal_size=1 << 20,
                         max_journal_size=500, min_journal_compact_delay=None)
    q = PersistentQueue("q", config, journal, clock)
    q.setup()
    for i in range(10):
        q.add(b"%06d" % i)
    while q.journal_rewrites == 0:
        q.add(b"x" * 40)
        assert q.remove() is not None
    thread.run_next()  # the rotation's fsyncs; the pack is still to be written
    assert journal.packing and not journal.maintaining
    for _ in range(50):
        q.add(b"y" * 40)
        assert q.remove() is not None
    assert q.journal_rewrites == 1
    thread.run_all()
    assert not journal.packing
    while q.journal_rewrites == 1:
        q.add(b"z" * 40)
        assert q.remove() is not None
        thread.run_all()
    thread.run_all()
    value(q.close())


def test_a_rewrite_whose_pack_cannot_be_written_leaves_the_files(tmp_path,
                                                                 clock: Clock) -> None:
    """
    A full disk while the pack of a rewrite is written: one error line (no
    traceback), the files replay as before, the checkpoint is given up, and
    the next rewrite goes through a pack again.
    """
    thread = ThreadFlag()
    journal = FileJournal(str(tmp_path), "q", clock, None, run_in_thread=thread)
    journal.replay(lambda record: None)
    for n in range(3):
        journal.add(item(b"%d" % n))
    before = replayed(tmp_path, clock)
    journal.rewrite([], [item(b"1"), item(b"2")], xid_counter=7)
    thread.run_next()  # the rotation's fsyncs
    assert journal.packing
    with capturedLogs() as events:
        _, pack = thread.jobs.pop(0)
        pack.errback(OSError(errno.ENOSPC, "No space left on device"))
    assert not journal.packing and journal.checkpoint is None
    assert not [e for e in events if e["log_level"] == LogLevel.critical]
    assert [e for e in events if "packing up to" in e.get("log_format", "")]
    assert replayed(tmp_path, clock) == before
    journal.rewrite([], [item(b"1"), item(b"2")], xid_counter=7)
    thread.run_all()
    assert replayed(tmp_path, clock) == [rec.SaveXid(7), rec.Add(b"1", 1_767_225_600_000, 0),
                                         rec.Add(b"2", 1_767_225_600_000, 0)]
    value(journal.close())


class Chores:
    """The journal's C{chores}: kept until L{run_all}, run as if on the chores thread."""

    def __init__(self, thread: ThreadFlag) -> None:
        self.thread = thread
        self.pending: list[Any] = []

    def __call__(self, chore: Any) -> None:
        self.pending.append(chore)

    def run_all(self) -> None:
        pending, self.pending = self.pending, []
        self.thread.running = True
        try:
            for chore in pending:
                chore()
        finally:
            self.thread.running = False


def open_never_journal(path, clock: Clock) -> tuple[FileJournal, ThreadFlag, Chores, Fsyncs]:
    thread = ThreadFlag()
    chores = Chores(thread)
    fsyncs = Fsyncs(thread)
    journal = FileJournal(str(path), "q", clock, None, fsync=fsyncs, run_in_thread=thread,
                          chores=chores)
    journal.replay(lambda record: None)
    return journal, thread, chores, fsyncs


def test_empty_rewrite_under_never_hands_the_old_file_to_the_chores(tmp_path, clock: Clock,
                                                                    monkeypatch: Any) -> None:
    """
    Under C{never}, with chores, an empty rewrite runs no thread-pool job and
    waits for nothing: the old file's descriptor goes to a chore, which
    closes it (its blocks are freed there) and makes and opens the next
    spare; the next rewrite renames that spare over C{q} and writes to it
    through the chore's descriptor, opening no file on the calling thread.
    """
    journal, thread, chores, fsyncs = open_never_journal(tmp_path, clock)
    for _ in range(20):
        journal.add(item(b"x" * 1000))
        journal.remove()
    journal.rewrite([], [], xid_counter=4)
    assert thread.jobs == [] and not journal.maintaining and len(chores.pending) == 1
    # The handed descriptor still holds the old file: it was not closed here.
    assert deleted_but_open(tmp_path) == [f"{tmp_path / 'q'} (deleted)"]
    chores.run_all()
    assert deleted_but_open(tmp_path) == []
    spare = spare_name(tmp_path)
    spare_inode = os.stat(tmp_path / spare).st_ino
    journal.add(item(b"one"))
    journal.remove()
    opened: list[str] = []
    real_open = os.open

    def counting_open(path: Any, *args: Any, **kwargs: Any) -> int:
        opened.append(str(path))
        return real_open(path, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(os, "open", counting_open)
        journal.rewrite([], [], xid_counter=5)
        after = journal.add(item(b"after"))
    assert opened == []
    assert os.stat(tmp_path / "q").st_ino == spare_inode
    assert after is None  # (written, nothing to wait for)
    chores.run_all()
    assert thread.jobs == [] and fsyncs.inline == 0 and fsyncs.in_thread == 0
    assert sorted(os.listdir(tmp_path)) == ["q", spare_name(tmp_path)]
    value(journal.close())
    assert sorted(os.listdir(tmp_path)) == ["q"]
    assert replayed(tmp_path, clock) == [rec.SaveXid(5),
                                         rec.Add(b"after", 1_767_225_600_000, 0)]


def test_chores_overtaken_by_a_rewrite_close_or_erase_leave_no_spare(tmp_path,
                                                                      clock: Clock) -> None:
    """
    A rewrite made before the last one's chore ran makes its own empty file;
    a chore overtaken by a later rewrite, a close or an erase still frees its
    old file but makes no spare, so no spare outlives the journal.
    """
    journal, _, chores, _ = open_never_journal(tmp_path, clock)
    journal.add(item(b"one"))
    journal.remove()
    journal.rewrite([], [], xid_counter=1)
    journal.add(item(b"two"))
    journal.remove()
    journal.rewrite([], [], xid_counter=2)  # the first chore has not run
    assert len(chores.pending) == 2
    chores.run_all()
    assert deleted_but_open(tmp_path) == []
    spare_name(tmp_path)  # exactly one: the second chore's
    journal.add(item(b"three"))
    journal.remove()
    journal.rewrite([], [], xid_counter=3)
    value(journal.close())
    chores.run_all()
    assert deleted_but_open(tmp_path) == []
    assert sorted(os.listdir(tmp_path)) == ["q"]
    assert replayed(tmp_path, clock) == [rec.SaveXid(3)]

    journal, _, chores, _ = open_never_journal(tmp_path, clock)
    journal.add(item(b"four"))
    journal.remove()
    journal.rewrite([], [], xid_counter=4)
    journal.erase()
    chores.run_all()
    assert os.listdir(tmp_path) == [] and deleted_but_open(tmp_path) == []


def test_empty_rewrite_during_an_fsync_under_never_takes_the_thread_job(tmp_path,
                                                                        clock: Clock) -> None:
    """
    An fsync asked for under C{never} (read-behind starts with one) still runs
    on the old descriptor: the rewrite then closes it as under the other
    policies, through a thread job, and the fsync's Deferred fires.
    """
    journal, thread, chores, _ = open_never_journal(tmp_path, clock)
    journal.add(item(b"one"))
    journal.remove()
    synced = journal._writer.sync()
    assert value(synced) is PENDING
    journal.rewrite([], [], xid_counter=6)
    assert chores.pending == [] and journal.maintaining
    thread.run_all()
    assert value(synced) is None and not journal.maintaining
    assert deleted_but_open(tmp_path) == []
    value(journal.close())
    assert replayed(tmp_path, clock) == [rec.SaveXid(6)]


def test_reactor_turn_fsync_of_a_new_file_waits_for_the_rotation(tmp_path, clock: Clock) -> None:
    """
    With the reactor-turn fsync, the rotation's fsyncs still run in the thread,
    and a write to the new file is acknowledged only after them (its own fsync
    then runs inline, at the end of a turn).
    """
    thread = ThreadFlag()
    fsyncs = Fsyncs(thread)
    journal = FileJournal(str(tmp_path), "q", clock, 0.0, fsync=fsyncs, run_in_thread=thread,
                          sync_turn=SyncTurn(clock))
    journal.replay(lambda record: None)
    first = journal.add(item(b"one"))
    clock.advance(0)
    assert value(first) is None and fsyncs.inline == 1 and not thread.jobs
    old = journal.add(item(b"two"))
    journal.rotate([], set_checkpoint=False)
    new = journal.add(item(b"three"))
    clock.advance(0)
    assert value(old) is PENDING and value(new) is PENDING
    assert fsyncs.inline == 1  # the new file's fsync waits for the rotation's
    thread.run_all()
    assert value(old) is None and value(new) is None
    assert fsyncs.inline > 1 and fsyncs.in_thread >= 2  # (then the gated ones, inline)
    value(journal.close())
    assert [r.data for r in replayed(tmp_path, clock) if isinstance(r, rec.Add)] == [
        b"one", b"two", b"three"]
