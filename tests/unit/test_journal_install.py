"""
Putting a finished pack in place off the reactor thread.

With a C{run_in_thread}, a pack is written, fsynced, renamed C{<checkpoint>.pack}
and put in place by the pack rule (its files disposed of, the directory fsynced
after each step) in a thread, never on the calling (reactor) thread; listings
there (read-behind moving on, sizes) read the files as the pack rule would leave
them and change nothing. These tests check where each fsync runs (on real
threads, by thread identity), that a crash at every step of an install replays
to the same queue, and that read-behind reads every item once, in order, while
an install is in flight.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.logger import capturedLogs
from twisted.python.failure import Failure

from kestrel.config import QueueConfig
from kestrel.item import QItem
from kestrel.journal import records as rec
from kestrel.journal.journal import Checkpoint, FileJournal
from kestrel.queue import PersistentQueue
from tests import support
from tests.compat.model import queue_state
from tests.support import ManualThread
from tests.unit.test_queue import PENDING, datas, value
from tests.unit.test_queue_stateful import PACKING, QueueModel


class Crash(BaseException):
    """Raised by a failing fsync to stop a job dead, as a power cut would."""


class RealThreads:
    """
    A C{run_in_thread} that runs every job at once on a new real thread, and
    fires its Deferred on the calling thread when the test calls L{settle}
    (as a thread pool hands results back to the reactor thread).
    """

    def __init__(self) -> None:
        self.pending: list[tuple[threading.Thread, list[Any], Deferred[Any]]] = []

    def __call__(self, job: Callable[[], Any]) -> Deferred[Any]:
        box: list[Any] = []

        def run() -> None:
            try:
                box.append(job())
            except BaseException:  # noqa: BLE001 (handed back to the Deferred)
                box.append(Failure())

        thread = threading.Thread(target=run, daemon=True)
        d: Deferred[Any] = Deferred()
        self.pending.append((thread, box, d))
        thread.start()
        return d

    def settle(self) -> None:
        """Hand back every result, in order, including those of jobs started meanwhile."""
        while self.pending:
            thread, box, d = self.pending.pop(0)
            thread.join(30)
            assert box, "a job did not end"
            if isinstance(box[0], Failure):
                d.errback(box[0])
            else:
                d.callback(box[0])


class ThreadRecorder:
    """An fsync that records the thread and the kind of file of every call, and fsyncs."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, str]] = []
        self.lock = threading.Lock()

    def __call__(self, fd: int) -> None:
        kind = "dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
        with self.lock:
            self.calls.append((threading.get_ident(), kind))
        os.fsync(fd)

    def on(self, ident: int) -> list[str]:
        with self.lock:
            return [kind for who, kind in self.calls if who == ident]


def churn(q: PersistentQueue, threads: RealThreads, rounds: int) -> list[bytes]:
    """Fill a queue deep into read-behind, then drain it most of the way; return what is left."""
    live: list[bytes] = []
    count = 0
    for _ in range(rounds):
        for _ in range(60):
            data = b"%06d:" % count + b"x" * 20
            count += 1
            assert value(q.add(data)) in (True, PENDING)
            live.append(data)
            if count % 7 == 0:
                threads.settle()
        for _ in range(55):
            item = q.remove()
            assert item is not None and item.data == live.pop(0)
            if len(live) % 5 == 0:
                threads.settle()
    threads.settle()
    return live


@pytest.mark.parametrize("archive", [False, True])
def test_no_fsync_on_the_calling_thread_while_serving(tmp_path: Path, clock: Clock,
                                                      archive: bool) -> None:
    """
    Rotations, read-behind checkpoints packed and put in place, rewrites
    through a pack, files disposed of (deleted or archived): on real threads,
    no fsync of a file or directory runs on the calling thread once the
    queue is set up; the queue then replays to what it holds.
    """
    threads = RealThreads()
    fsync = ThreadRecorder()
    archive_path = str(tmp_path / "archive") if archive else None
    journal = FileJournal(str(tmp_path / "q"), "q", clock, 0.0, fsync=fsync,
                          run_in_thread=threads, archive_path=archive_path)
    config = QueueConfig(max_memory_size=300, default_journal_size=1 << 20,
                         max_journal_size=900, min_journal_compact_delay=None)
    q = PersistentQueue("q", config, journal, clock)
    q.setup()
    me = threading.get_ident()
    fsync.calls.clear()
    with capturedLogs() as events:
        live = churn(q, threads, 4)
    assert fsync.on(me) == []
    assert len(fsync.calls) > 50
    formats = [e.get("log_format", "") for e in events]
    assert sum("packed files up to" in f for f in formats) >= 3
    assert q.journal_rotations > 5 and q.journal_rewrites >= 1
    disposed = "archived {file}" if archive else "deleted {file}"
    assert sum(disposed in f for f in formats) >= 3
    if archive:
        assert os.listdir(tmp_path / "archive")
    closed = q.close()
    threads.settle()
    assert value(closed) is None
    again = PersistentQueue("q", config, FileJournal(str(tmp_path / "q"), "q", clock, None),
                            clock)
    again.setup()
    assert datas(again) == live
    value(again.close())


# -- a crash at every step of an install ---------------------------------------

def item(n: int) -> QItem:
    return QItem(b"item%d" % n, 1000 + n)


OPEN = QItem(item(0).data, item(0).add_time_ms, 0, 9)


class Snapshots:
    """
    An fsync that, while armed, copies the queue folder before each call (the
    files as a crash just before that fsync would leave them, every earlier
    step done), or raises L{Crash} at call C{crash_at}.
    """

    def __init__(self, folder: Path, copies: Path) -> None:
        self.folder = folder
        self.copies = copies
        self.armed = False
        self.taken: list[Path] = []
        self.calls = 0
        self.crash_at: int | None = None
        self.probe: Callable[[], None] | None = None

    def __call__(self, fd: int) -> None:
        if self.armed:
            self.calls += 1
            copy = self.copies / f"step{len(self.taken)}"
            shutil.copytree(self.folder, copy)
            self.taken.append(copy)
            if self.probe is not None:
                self.probe()
            if self.calls == self.crash_at:
                raise Crash()
        os.fsync(fd)


def scenario(folder: Path, clock: Clock, fsync: Any, thread: ManualThread,
             archive: Path | None) -> tuple[FileJournal, Checkpoint]:
    """
    Three rotated files before the checkpoint (the first with an open read,
    xid 9), the checkpoint file, one file after it, then two removes; the
    pack of the checkpoint is written and waits, behind the current file's
    fsync, to be put in place. The queue is then L{EXPECTED}.
    """
    j = FileJournal(str(folder), "q", clock, None, fsync=thread.counted(fsync),
                    run_in_thread=thread,
                    archive_path=None if archive is None else str(archive))
    j.replay(lambda record: None)
    n = 0
    for _ in range(3):
        for _ in range(2):
            j.add(item(n))
            n += 1
        if n == 2:
            j.remove_tentative(9)
        clock.advance(0.01)
        j.rotate([], False)
        thread.run_all()
    j.add(item(n))
    n += 1
    j.rotate([OPEN], True)
    thread.run_all()
    checkpoint = j.checkpoint
    assert checkpoint is not None
    clock.advance(0.01)
    j.add(item(n))
    j.rotate([], False)
    j.remove()
    j.remove()
    thread.run_all()
    # The two removes took items 1 and 2; memory holds what is left up to the checkpoint.
    j.start_pack(checkpoint, [OPEN], [item(3), item(4), item(5), item(6)], 9)
    thread.run_next()  # the pack is written; the current file's fsync is next
    return j, checkpoint


EXPECTED = ([item(n).data for n in range(3, 8)], {9: item(0).data})


def replay_state(folder: Path, clock: Clock) -> tuple[list[bytes], dict[int, bytes]]:
    """What a restart finds in C{folder} (replayed from a copy: replay tidies the files)."""
    got: list[rec.Record] = []
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "q"
        shutil.copytree(folder, copy)
        j = FileJournal(str(copy), "q", clock, None)
        j.replay(got.append)
        value(j.close())
    return queue_state(got)


@pytest.mark.parametrize("archive", [False, True])
def test_every_step_of_an_install_replays_to_the_same_queue(tmp_path: Path, clock: Clock,
                                                            archive: bool) -> None:
    """
    The folder as it is before each fsync of the install (the rename to
    C{.pack}, each disposal, the rename into place), and after it, replays
    to the same queue; every fsync runs in the thread job. Meanwhile the
    file after every file newer than the checkpoint stays the same.
    """
    folder = tmp_path / "q"
    snaps = Snapshots(folder, tmp_path / "copies")
    thread = ThreadFlag()
    j, checkpoint = scenario(folder, clock, snaps, thread,
                             tmp_path / "archive" if archive else None)
    assert replay_state(folder, clock) == EXPECTED
    newer = [n for n in sorted(os.listdir(folder))
             if n.startswith("q.") and n > checkpoint.filename and "~~" not in n]
    assert len(newer) == 1
    follows = {name: j.files.file_after(name) for name in newer}
    assert follows == {newer[0]: "q"}
    seen: list[dict[str, str | None]] = []
    snaps.probe = lambda: seen.append({name: j.files.file_after(name) for name in newer})
    snaps.armed = True
    thread.run_all()
    assert thread.inline_fsyncs == 0
    # the current file, then: .pack renamed in, disposal, pack renamed into place.
    assert snaps.calls >= (8 if archive else 4), snaps.calls
    assert all(s == follows for s in seen)
    assert j.checkpoint is None
    assert sorted(os.listdir(folder)) == sorted(["q", checkpoint.filename, *newer])
    for copy in snaps.taken:
        assert replay_state(copy, clock) == EXPECTED, copy
    assert replay_state(folder, clock) == EXPECTED
    value(j.close())


@pytest.mark.parametrize("archive", [False, True])
def test_a_crash_at_any_fsync_of_an_install_replays_to_the_same_queue(
        tmp_path: Path, clock: Clock, archive: bool) -> None:
    """The install stopped dead at its n-th fsync, for every n: the folder replays the same."""
    n = 1
    while True:
        base = tmp_path / f"crash{n}"
        snaps = Snapshots(base / "q", base / "copies")
        thread = ThreadFlag()
        j, _ = scenario(base / "q", clock, snaps, thread,
                        base / "archive" if archive else None)
        snaps.armed = True
        snaps.crash_at = n
        try:
            thread.run_all()
        except Crash:
            assert replay_state(base / "q", clock) == EXPECTED, (n, os.listdir(base / "q"))
            n += 1
            continue
        break
    assert n > 4


@settings(max_examples=60, deadline=None)
@given(gone=st.lists(st.booleans(), min_size=4, max_size=4), renamed=st.booleans())
def test_any_part_of_the_disposal_done_replays_the_same(gone: list[bool],
                                                        renamed: bool) -> None:
    """
    Between the fsyncs of an install the unlinks may reach the disk in any
    order: a pack with any subset of the files it replaces (and, once they
    are all gone, under its final name) replays to the same queue.
    """
    clock = Clock()
    clock.advance(1_767_225_600.0)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "q"
        thread = ThreadFlag()
        j, checkpoint = scenario(folder, clock, os.fsync, thread, None)
        # The files as the pack's install finds them, the pack in its ~~ file.
        state = Path(tmp) / "state"
        shutil.copytree(folder, state)
        thread.run_all()
        value(j.close())
        (temp,) = [n for n in os.listdir(state) if "~~" in n]
        pack = (state / temp).read_bytes()
        os.unlink(state / temp)
        limit = int(checkpoint.filename.split(".")[1])
        olds = sorted((n for n in os.listdir(state)
                       if n.startswith("q.") and int(n.split(".")[1]) <= limit),
                      key=lambda n: int(n.split(".")[1]))
        assert len(olds) == 4 and olds[-1] == checkpoint.filename
        for name, drop in zip(olds, gone, strict=True):
            if drop:
                os.unlink(state / name)
        if renamed and all(gone):
            (state / checkpoint.filename).write_bytes(pack)
        else:
            (state / (checkpoint.filename + ".pack")).write_bytes(pack)
        assert replay_state(state, clock) == EXPECTED


# -- read-behind while an install is in flight ------------------------------------

def is_install(job: Callable[[], object]) -> bool:
    """Whether a thread job is a pack's install (its rename and disposal)."""
    return "_finish_pack" in getattr(job, "__qualname__", "")


class ThreadFlag(support.ThreadFlag):
    """A ThreadFlag that counts the fsyncs made outside its jobs (see L{counted})."""

    def __init__(self) -> None:
        super().__init__()
        self.inline_fsyncs = 0

    def run_all_but_installs(self) -> None:
        """Run every job (and those they queue) except a pack's install, which stays queued."""
        while True:
            ready = [i for i, (job, _) in enumerate(self.jobs) if not is_install(job)]
            if not ready:
                return
            self.jobs.insert(0, self.jobs.pop(ready[0]))
            self.run_next()

    def counted(self, fsync: Callable[[int], None]) -> Callable[[int], None]:
        def count(fd: int) -> None:
            if not self.running:
                self.inline_fsyncs += 1
            fsync(fd)
        return count


def test_read_behind_across_an_install_in_flight_reads_every_item_once(
        tmp_path: Path, clock: Clock) -> None:
    """
    A queue deep in read-behind leaves its checkpoint file: the pack is
    written and its install waits in the thread while the reader moves on
    through later rotated files and rotations go on; every item comes out
    once, in order, whether the install runs early, late or in between.
    """
    for hold in range(0, 30, 3):
        folder = tmp_path / f"hold{hold}"
        thread = ThreadFlag()
        journal = FileJournal(str(folder), "q", clock, None,
                              fsync=thread.counted(os.fsync), run_in_thread=thread)
        config = QueueConfig(max_memory_size=40, default_journal_size=1 << 20,
                             max_journal_size=120, min_journal_compact_delay=None)
        q = PersistentQueue("q", config, journal, clock)
        q.setup()
        expected: list[bytes] = []
        for i in range(30):
            data = b"%04d" % i + b"-" * 8
            assert value(q.add(data)) is True
            expected.append(data)
        thread.run_all()
        got: list[bytes] = []
        held = 0
        extra = 30
        while expected:
            if held < hold:
                thread.run_all_but_installs()
            else:
                thread.run_all()
            if any(is_install(job) for job, _ in thread.jobs):
                held += 1  # this remove runs with the install in flight
            item_ = q.remove()
            assert item_ is not None
            got.append(item_.data)
            assert item_.data == expected.pop(0)
            if extra < 45:
                data = b"%04d" % extra + b"-" * 8
                extra += 1
                assert value(q.add(data)) is True
                expected.append(data)
        if hold:
            assert held >= 1
        thread.run_all()
        assert q.remove() is None
        assert len(got) == len(set(got)) == 45
        assert thread.inline_fsyncs == 0
        closed = q.close()
        thread.run_all()
        value(closed)
        assert replay_state(folder, clock) == ([], {})


class ThreadedPackingModel(QueueModel):
    """
    The packing model (deep read-behind, checkpoints, packs) with every fsync
    and pack job held in a manual thread, run a few at a time when the model
    says; a process crash (a copy of the folder, jobs never run) at any point
    replays to the live items, and no fsync runs outside the thread jobs.
    """

    config = PACKING

    def open_queue(self) -> PersistentQueue:
        self.thread = ThreadFlag()
        self.journal = FileJournal(self.folder, "model", self.clock, None,
                                   fsync=self.thread.counted(os.fsync),
                                   run_in_thread=self.thread)
        q = PersistentQueue("model", self.config, self.journal, self.clock)
        q.setup()
        self.thread.inline_fsyncs = 0
        return q

    @rule(jobs=st.integers(1, 4))
    def run_jobs(self, jobs: int) -> None:
        for _ in range(min(jobs, len(self.thread.jobs))):
            self.thread.run_next()

    @rule()
    def crash(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp) / "copy"
            shutil.copytree(self.folder, copy)
            journal = FileJournal(str(copy), "model", self.clock, None)
            q = PersistentQueue("model", self.config, journal, self.clock)
            q.setup()
            live = [self.opened[xid] for xid in sorted(self.opened)] + self.items
            assert datas(q) == live
            value(q.close())

    @rule()
    def restart(self) -> None:
        closed = self.queue.close()
        self.thread.run_all()
        value(closed)
        self.queue = self.open_queue()
        self.items[:0] = [self.opened[xid] for xid in sorted(self.opened)]
        self.opened.clear()

    @invariant()
    def no_fsync_outside_the_thread(self) -> None:
        assert self.thread.inline_fsyncs == 0

    def teardown(self) -> None:
        closed = self.queue.close()
        self.thread.run_all()
        value(closed)
        shutil.rmtree(self.folder, ignore_errors=True)


TestThreadedPackingModel = ThreadedPackingModel.TestCase
TestThreadedPackingModel.settings = settings(stateful_step_count=80, max_examples=60,
                                             deadline=None)


# -- rewrites with a checkpoint pending, erase during an install --------------------

def test_a_rewrite_with_a_checkpoint_pending_goes_through_a_pack(tmp_path: Path,
                                                                 clock: Clock) -> None:
    """
    A checkpoint set by a rotation that read-behind never got past is given
    up by a rewrite, which goes through a pack of its own: nothing is
    fsynced on the calling thread, and the files replay to the rewritten queue.
    """
    thread = ThreadFlag()
    j = FileJournal(str(tmp_path), "q", clock, None, fsync=thread.counted(os.fsync),
                    run_in_thread=thread)
    j.replay(lambda record: None)
    for n in range(4):
        j.add(item(n))
    j.rotate([], True)
    thread.run_all()
    assert j.checkpoint is not None and not j.packing
    j.add(item(4))
    j.remove()
    j.rewrite([OPEN], [item(2), item(3), item(4)], 9)
    assert j.packing
    thread.run_all()
    assert thread.inline_fsyncs == 0
    assert j.checkpoint is None and not j.packing
    assert len(os.listdir(tmp_path)) == 2
    assert replay_state(tmp_path, clock) == ([item(n).data for n in (2, 3, 4)],
                                             {9: item(0).data})
    value(j.close())


class Gate:
    """An fsync that stops the first thread fsyncing while a C{.pack} is in C{folder}."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.reached = threading.Event()
        self.release = threading.Event()

    def __call__(self, fd: int) -> None:
        if (not self.reached.is_set() and threading.current_thread() is not threading.main_thread()
                and any(n.endswith(".pack") for n in os.listdir(self.folder))):
            self.reached.set()
            assert self.release.wait(30)
        os.fsync(fd)


def test_an_erase_while_a_pack_is_put_in_place_leaves_no_file(tmp_path: Path,
                                                               clock: Clock) -> None:
    """
    An erase (a queue deleted) while a thread is putting a pack in place
    waits for it, then deletes every file: the renamed pack does not outlive
    the erase.
    """
    threads = RealThreads()
    gate = Gate(tmp_path)
    j = FileJournal(str(tmp_path), "q", clock, None, fsync=gate, run_in_thread=threads)
    j.replay(lambda record: None)
    for n in range(4):
        j.add(item(n))
    j.rotate([], True)
    threads.settle()
    j.add(item(4))
    j.rewrite([], [item(n) for n in range(5)], 0)
    # Hand results back until the install stops at its first fsync (the pack
    # renamed .pack already, the directory not yet fsynced).
    while not gate.reached.is_set():
        thread, box, d = threads.pending[0]
        thread.join(0.01)
        if not thread.is_alive():
            threads.pending.pop(0)
            d.callback(box[0])
    assert j.packing
    eraser = threading.Thread(target=j.erase)
    eraser.start()
    eraser.join(0.2)
    assert eraser.is_alive()  # waiting for the install
    gate.release.set()
    eraser.join(30)
    threads.settle()
    assert os.listdir(tmp_path) == []


def test_an_install_that_fails_leaves_a_pack_the_next_one_puts_in_place(
        tmp_path: Path, clock: Clock) -> None:
    """
    An I/O error in the middle of an install (the directory fsync after the
    rename to C{.pack}): the pack is given up with one error line, the files
    replay as before, nothing is tidied up on the calling thread, and the
    next pack's install puts both in place, in the thread.
    """
    folder = tmp_path / "q"
    snaps = Snapshots(folder, tmp_path / "copies")
    thread = ThreadFlag()
    j, _ = scenario(folder, clock, snaps, thread, None)
    snaps.armed = True
    error = OSError(5, "Input/output error")

    def fail() -> None:
        raise error

    snaps.probe = lambda: fail() if snaps.calls == 2 else None
    with capturedLogs() as events:
        thread.run_all()
    snaps.armed = False
    assert [e for e in events if "packing up to" in e.get("log_format", "")]
    assert any(n.endswith(".pack") for n in os.listdir(folder))
    assert j.checkpoint is None and not j.packing
    assert replay_state(folder, clock) == EXPECTED
    assert j.archived_size > 0
    j.add(item(8))
    j.rewrite([OPEN], [item(n) for n in range(3, 9)], 9)
    thread.run_all()
    assert thread.inline_fsyncs == 0
    assert not any(n.endswith(".pack") for n in os.listdir(folder))
    assert len(os.listdir(folder)) == 2
    assert replay_state(folder, clock) == ([item(n).data for n in range(3, 9)],
                                           {9: item(0).data})
    value(j.close())


@settings(max_examples=80, deadline=None)
@given(files=st.dictionaries(st.integers(1, 40), st.sampled_from(["file", "pack", "both"]),
                             max_size=10))
def test_the_listing_without_the_rule_is_what_the_rule_leaves(files: dict[int, str]) -> None:
    """
    The listing used while serving (the pack rule not applied) names, in
    order, the files that applying the rule leaves, a pack under its
    C{.pack} name where the rule renames it.
    """
    clock = Clock()
    with tempfile.TemporaryDirectory() as tmp:
        for ts, kind in files.items():
            if kind in ("file", "both"):
                Path(tmp, f"q.{ts}").write_bytes(b"")
            if kind in ("pack", "both"):
                Path(tmp, f"q.{ts}.pack").write_bytes(b"")
        j = FileJournal(tmp, "q", clock, None)
        listed = j.files.listed()
        assert sorted(os.listdir(tmp)) == sorted(
            [f"q.{t}" for t, k in files.items() if k != "pack"]
            + [f"q.{t}.pack" for t, k in files.items() if k != "file"])
        applied = j.archived_files()
        assert [n.removesuffix(".pack") for n in listed] == applied


def test_a_pack_that_fails_removes_its_own_temp_file_only(tmp_path: Path, clock: Clock) -> None:
    """
    A pack whose write fails (a full disk at its fsync) removes its own
    C{~~} file and leaves another C{~~} file (another pack's, still being
    written) alone; the files replay as before and the checkpoint is given up.
    """
    folder = tmp_path / "q"
    other = folder / "q~~1"

    def full_disk_for_temp_files(fd: int) -> None:
        if "~~" in os.readlink(f"/proc/self/fd/{fd}"):
            other.write_bytes(b"another pack, still being written")
            raise OSError(28, "No space left on device")
        os.fsync(fd)

    thread = ThreadFlag()
    with capturedLogs() as events:
        j, _ = scenario(folder, clock, full_disk_for_temp_files, thread, None)
        thread.run_all()
    assert [e for e in events if "packing up to" in e.get("log_format", "")]
    assert sorted(n for n in os.listdir(folder) if "~~" in n) == ["q~~1"]
    assert j.checkpoint is None and not j.packing
    assert thread.inline_fsyncs == 0
    other.unlink()
    assert replay_state(folder, clock) == EXPECTED
    value(j.close())
