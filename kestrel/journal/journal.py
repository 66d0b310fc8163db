"""
FileJournal: the journal files of one queue, as Kestrel's C{Journal} keeps them.

Files in the queue directory (see docs/journal.md):

  - C{<q>}: the current file, appended to by a L{PeriodicSyncFile};
  - C{<q>.<ms>}: rotated files, replayed in ascending timestamp order before C{<q>};
  - C{<q>~~<ms>}: a file being written by a rewrite or pack, or the empty
    spare of the next empty rewrite; deleted at replay (the spare at close too);
  - C{<q>.<ms>.pack}: a finished pack; it replaces every rotated file whose
    timestamp is at most its own (the "pack rule", applied when a pack is put
    in place, by replay and by the inline rewrite; listings while the journal
    serves only read the files as the rule would leave them).

Every rename is followed by an fsync of the directory (but the empty
rewrite's under the C{never} sync policy, which fsyncs nothing), and every new
file is fsynced before it is renamed into place, so a crash at any point
leaves files that replay to the same queue. Dead files are deleted, or moved into
C{archive_path} when one is set.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import mmap
import os
import struct
import threading
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

from twisted.internet.defer import Deferred, fail, gatherResults, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from kestrel.item import QItem
from kestrel.journal import naming
from kestrel.journal import records as rec
from kestrel.journal.batch import WriteCoalescer
from kestrel.journal.chores import Chore
from kestrel.journal.events import legacy_item
from kestrel.journal.naming import PACK_SUFFIX, TEMP_INFIX, journal_queue_name
from kestrel.journal.pack import (
    OP_CLOSE,
    OP_OPEN,
    OP_REMOVE,
    OP_UNREMOVE,
    Checkpoint,
    dump_records,
    pack_layout,
)
from kestrel.journal.syncfile import FsyncObserver, PeriodicSyncFile, RunInThread

_T = TypeVar("_T")

#: Log lines (format, fields) of work done on a thread, logged on the reactor thread.
_Notes = list[tuple[str, dict[str, object]]]

__all__ = ["Checkpoint", "FileJournal", "JournalNotOpenError", "journal_queue_name"]

#: Replay logs its progress every time it has read this many more bytes of a file.
PROGRESS_BYTES = 64 * 1024 * 1024

#: A replay slice (see L{FileJournal.replay_steps}) of records only measured
#: (read-behind) is this many times longer than one of records decoded.
SKIP_SLICE_FACTOR = 32

#: A sliced replay gives back the pages of the file it has read every this many bytes.
RELEASE_BYTES = 8 * 1024 * 1024

#: How much the read-behind reader reads from a file at a time.
READ_CHUNK = 256 * 1024

_ADDX_BODY = struct.Struct("<iqq")


class JournalNotOpenError(RuntimeError):
    """A write was asked of a journal that has not been replayed (opened) yet."""


class _NotOpen:
    """The writer of a journal before L{FileJournal.replay} opens the real one."""

    position = 0
    closed = False

    def write(self, data: bytes) -> Deferred[None]:
        return fail(JournalNotOpenError("journal written before replay() opened it"))

    def sync(self) -> Deferred[None]:
        return succeed(None)

    def close(self) -> Deferred[None]:
        return succeed(None)


class _Reader:
    """Reads records one at a time from a journal file that may still be growing."""

    def __init__(self, path: str, position: int) -> None:
        self._fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        self.position = position
        self._buf = b""
        self._off = 0

    def read(self) -> rec.Record | None:
        """
        Return the next complete record, or C{None} at the end of the file.

        @raise rec.CorruptRecord: the next bytes are not a record.
        """
        while True:
            got = rec.read_record(self._buf, self._off)
            if got is not None:
                record, nxt = got
                self.position += nxt - self._off
                self._off = nxt
                return record
            held = len(self._buf) - self._off
            chunk = os.pread(self._fd, max(READ_CHUNK, held), self.position + held)
            if not chunk:
                return None
            self._buf = self._buf[self._off:] + chunk
            self._off = 0

    def close(self) -> None:
        os.close(self._fd)


def _no_op() -> None:
    return None


def _log_failure(failure: Failure) -> None:
    """Swallow a failure that the syncfile has logged already."""
    return None


class FileJournal:
    """
    The journal of one queue: replay, durable writes, rotation, rewrite,
    read-behind and packing, as Kestrel's C{Journal} does them.

    Writes return the L{PeriodicSyncFile}'s Deferred, which fires when the
    record is durable under C{sync_policy}. With a C{coalescer}, records
    written while its batch is open reach the OS when it flushes; every
    other operation on the file (sync, rotate, rewrite, close) flushes first.
    An C{on_fsync} observer is handed to every current file it opens, so it
    hears of each fsync that makes records of this queue durable (see
    L{kestrel.journal.syncfile.FsyncObserver}). With C{run_in_thread}, no
    rotation, rewrite or pack fsyncs on the calling thread; with C{chores}
    too (a L{kestrel.journal.chores.FileChores}), an empty rewrite under the
    C{never} policy hands the file it replaced to them (L{_rewrite_empty}).

    @ivar size: bytes in the current file C{<q>}.
    @ivar archived_size: bytes in the rotated files.
    @ivar checkpoint: the checkpoint set by L{rotate}, until it is packed.
    """

    _log = Logger()

    def __init__(self, queue_path: str, queue_name: str, clock: IReactorTime,
                 sync_policy: float | None, *, archive_path: str | None = None,
                 fsync: Callable[[int], None] = os.fsync,
                 write: Callable[[int, bytes], int] = os.write,
                 run_in_thread: RunInThread | None = None,
                 coalescer: WriteCoalescer | None = None,
                 on_fsync: FsyncObserver | None = None, file_mode: int = 0o600,
                 chores: Callable[[Chore], None] | None = None) -> None:
        self.queue_path = queue_path
        self._file_mode = file_mode
        self.queue_name = queue_name
        self.archive_path = archive_path
        self._clock = clock
        self._policy = sync_policy
        self._fsync = fsync
        self._os_write = write
        self._run_in_thread = run_in_thread
        self._chores = chores
        self._coalescer = coalescer
        self._on_fsync = on_fsync
        self._writer: PeriodicSyncFile | _NotOpen = _NotOpen()
        self._reader: _Reader | None = None
        self._reader_file: str | None = None
        self._replay_file: str | None = None
        self._replay_pos = 0
        self._closing: list[Deferred[None]] = []
        self._packs: list[Deferred[None]] = []
        # Bumped by rewrite and erase: a pack started before is stale.
        self._epoch = 0
        self.size = 0
        self.archived_size = 0
        self.checkpoint: Checkpoint | None = None
        # Operations on the head of the queue since the checkpoint was set.
        self._head_ops: array[int] | None = None
        self.closed = False
        # Where a recovery that failed must still cut the current file back to.
        self._pending_cut: int | None = None
        #: How many replays found a damaged rotated file (and set files aside).
        self.damaged_replays = 0
        #: Called with C{(kind, error)} when a write or fsync of the current
        #: file fails (C{kind} is C{"write"} or C{"fsync"}); the queue sets it.
        self.on_failure: Callable[[str, OSError], None] | None = None
        #: Called during replay with C{(items, data_bytes)} for each run of
        #: ADDX records skipped undecoded in read-behind (see L{replay}).
        self.on_skipped_adds: Callable[[int, int], None] | None = None
        # A rotation whose fsyncs run in a thread (see rotate): while it
        # runs, the fsyncs of the new current file wait in _gated, so that
        # nothing written after the rotation is acknowledged before the
        # rotated file and the directory are durable.
        self._maintenance: Deferred[None] | None = None
        self._gated: list[tuple[Callable[[], object], Deferred[object]]] = []
        # The descriptor whose next fsync, on the thread that set it, is
        # skipped: a file a thread has just fsynced, now being closed.
        self._presynced: tuple[int, int] | None = None
        # Held while the pack rule runs (a pack being put in place in a
        # thread, replay, an inline rewrite, erase): never two at once.
        self._install_lock = threading.Lock()
        # An empty C{<q>~~<ms>} (its name and a descriptor open on it for
        # appending) made off this thread after the last empty rewrite, for
        # the next one to rename over C{<q>} and write to (see
        # _rewrite_empty). Set and taken under _install_lock.
        self._spare: tuple[str, int] | None = None
        # Above every timestamp in this queue's file names, once known (see
        # _unique_rotated_name); None: read the folder.
        self._name_floor: int | None = None
        # True once a listing found no rotated or pack file, until the next
        # such file is named (_unique_rotated_name) or a replay.
        self._known_without_rotated = False

    # -- state -------------------------------------------------------------

    @property
    def is_replaying(self) -> bool:
        """Whether L{replay} is running."""
        return self._replay_file is not None

    @property
    def in_read_behind(self) -> bool:
        """Whether the read-behind reader is open."""
        return self._reader is not None

    @property
    def packing(self) -> bool:
        """Whether a pack is being written or put in place in a thread (a rewrite waits for it)."""
        return bool(self._packs)

    @property
    def maintaining(self) -> bool:
        """Whether a rotation's fsyncs still run in a thread (no rotation or rewrite starts)."""
        return self._maintenance is not None


    def _path(self, name: str) -> str:
        return os.path.join(self.queue_path, name)

    def _now_ms(self) -> int:
        return int(self._clock.seconds() * 1000)

    # -- writes (the hot path) ---------------------------------------------

    def add(self, item: QItem) -> Deferred[None]:
        """Journal an add of C{item} (ADDX)."""
        data = rec.encode_add(item.data, item.add_time_ms, item.expiry_ms)
        self.size += len(data)
        return self._writer.write(data)

    def continue_(self, xid: int, item: QItem) -> Deferred[None]:
        """Journal a confirm of open read C{xid} together with an add of C{item} (CONTINUE)."""
        ops = self._head_ops
        if ops is not None:
            ops.append(xid * 4 + OP_CLOSE)
        data = rec.Continue(xid, item.data, item.add_time_ms, item.expiry_ms).encode()
        self.size += len(data)
        return self._writer.write(data)

    def remove(self) -> Deferred[None]:
        """Journal a remove of the head item (REMOVE)."""
        ops = self._head_ops
        if ops is not None:
            ops.append(OP_REMOVE)
        self.size += 1
        return self._writer.write(rec.REMOVE_BYTES)

    def remove_tentative(self, xid: int) -> Deferred[None]:
        """Journal an open read of the head item under C{xid} (REMOVE_TENTATIVE_XID)."""
        ops = self._head_ops
        if ops is not None:
            ops.append(xid * 4 + OP_OPEN)
        self.size += 5
        return self._writer.write(rec.encode_xid(rec.Opcode.REMOVE_TENTATIVE_XID, xid))

    def unremove(self, xid: int) -> Deferred[None]:
        """Journal an aborted open read C{xid} (UNREMOVE)."""
        ops = self._head_ops
        if ops is not None:
            ops.append(xid * 4 + OP_UNREMOVE)
        self.size += 5
        return self._writer.write(rec.encode_xid(rec.Opcode.UNREMOVE, xid))

    def confirm_remove(self, xid: int) -> Deferred[None]:
        """Journal a confirmed open read C{xid} (CONFIRM_REMOVE)."""
        ops = self._head_ops
        if ops is not None:
            ops.append(xid * 4 + OP_CLOSE)
        self.size += 5
        return self._writer.write(rec.encode_xid(rec.Opcode.CONFIRM_REMOVE, xid))

    def after_written(self, f: Callable[..., object], *args: object) -> None:
        """
        Call C{f(*args)} once the records written so far are in the OS,
        outside any open write batch (see L{WriteCoalescer.after_flush});
        without a coalescer, at once.
        """
        coalescer = self._coalescer
        if coalescer is None:
            f(*args)
        else:
            coalescer.after_flush(f, *args)

    # -- file listing and the pack rule ------------------------------------

    def _list(self) -> list[str]:
        return naming.list_names(self.queue_path)

    def _timed_files(self, names: Iterable[str]) -> list[tuple[int, bool, str]]:
        """Return C{(timestamp, is_pack, name)} of this queue's rotated and pack files, sorted."""
        return naming.timed_files(self.queue_name, names)

    def archived_files(self) -> list[str]:
        """
        Return this queue's rotated files in replay order, first applying the pack rule.

        The pack rule: a C{<q>.<ms>.pack} file holds everything of the rotated
        files with a timestamp up to C{ms}; those are disposed of and the
        pack is renamed C{<q>.<ms>}. It runs on the calling thread (replay,
        the inline rewrite, offline tools), never at the same time as a pack
        being put in place in a thread (L{_install_pack}).
        """
        notes: _Notes = []
        try:
            with self._install_lock:
                return self._apply_pack_rule(notes)
        finally:
            self._log_notes(notes)

    def _apply_pack_rule(self, notes: _Notes) -> list[str]:
        """
        Apply the pack rule on disk (see L{archived_files}); the caller holds
        C{_install_lock}. What it did is appended to C{notes}, for the
        reactor thread to log. Safe on any thread: it touches no state but
        the files.
        """
        while True:
            timed = self._timed_files(self._list())
            packs = [t for t in timed if t[1]]
            if not packs:
                return [name for _, _, name in timed]
            ts, _, pack_name = packs[0]
            doomed = [name for t, is_pack, name in timed if t <= ts and not is_pack]
            notes.append(("Journal {queue}: pack {file} replaces {doomed}",
                          {"file": pack_name, "doomed": doomed}))
            self._dispose(doomed, notes)
            os.rename(self._path(pack_name), self._path(pack_name[:-len(PACK_SUFFIX)]))
            self._fsync_dir(self.queue_path)

    def _log_notes(self, notes: _Notes) -> None:
        for text, fields in notes:
            self._log.info(text, queue=self.queue_name, **fields)

    def _listed_files(self) -> list[str]:
        """
        This queue's rotated files in replay order, as the pack rule would
        leave them, without applying it (L{naming.packed_order}): a pack not
        in place yet stands under its C{.pack} name for the files it replaces.

        Read-behind and the sizes use this listing while the journal serves,
        so that no listing renames, deletes or fsyncs anything on the reactor
        thread. A pack (or one left by an install that failed) is put in place
        by the next pack's install or by replay. The files it lists from a
        file newer than every pack on are the same before, during and after
        an install.
        """
        return naming.packed_order(self._timed_files(self._list()))

    def _without_rotated_files(self) -> bool:
        """
        Whether the queue has no rotated or pack file: listed the first time,
        then known until this journal names one (every such file is named by
        L{_unique_rotated_name}), so that the empty rewrite of a queue that
        never rotates reads nothing of the folder on the calling thread.
        """
        if not self._known_without_rotated:
            self._known_without_rotated = not self._listed_files()
        return self._known_without_rotated

    def _file_after(self, name: str) -> str | None:
        files = [*self._listed_files(), self.queue_name]
        try:
            return files[files.index(name) + 1]
        except (ValueError, IndexError):
            return None

    def _compute_archived_size(self) -> None:
        total = 0
        for name in self._listed_files():
            try:
                total += os.path.getsize(self._path(name))
            except FileNotFoundError:
                pass
        self.archived_size = total

    def _unique_rotated_name(self, suffix: str = "") -> str:
        """
        Return a new C{<q>.<ms><suffix>} whose timestamp sorts after every existing file.

        The folder is read the first time (and after a replay) only: the
        journal makes every later file of its queue, so it knows their
        timestamps. A rotation then reads nothing of the folder on the
        calling thread, where a lookup could wait for the file system to
        commit a thread's renames (3 ms at times: docs/performance.md).
        """
        self._known_without_rotated = False
        floor = self._name_floor
        if floor is None:
            floor = naming.free_rotated_timestamp(self.queue_path, self.queue_name,
                                                  self._now_ms())
        else:
            floor = max(floor, self._now_ms())
        self._name_floor = floor + 1
        return f"{self.queue_name}.{floor}{suffix}"

    # -- directories, disposal, archive ------------------------------------

    def _opener(self, path: str, flags: int) -> int:
        """Open C{path} for C{open()} without following a symbolic link, in the journal mode."""
        return os.open(path, flags | os.O_NOFOLLOW, self._file_mode)

    def _fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            self._fsync(fd)
        finally:
            os.close(fd)

    def _dispose(self, names: Sequence[str], notes: _Notes | None = None) -> None:
        """
        Delete dead files, or move them into the archive when one is set;
        the directory is fsynced after. What was done is appended to
        C{notes} (for the caller to log on the reactor thread), or logged
        now without them.
        """
        if not names:
            return
        told: _Notes = [] if notes is None else notes
        if self.archive_path is None:
            for name in names:
                try:
                    os.unlink(self._path(name))
                except FileNotFoundError:
                    pass
                told.append(("Journal {queue}: deleted {file}", {"file": name}))
            self._fsync_dir(self.queue_path)
        else:
            for name in names:
                self._archive(name, told)
        if notes is None:
            self._log_notes(told)

    def _archive(self, name: str, notes: _Notes) -> None:
        """Move file C{name} into the archive without ever losing it (L{naming.archive_file})."""
        archive = self.archive_path
        assert archive is not None
        target = naming.archive_file(self.queue_path, self.queue_name, name, archive,
                                     self._now_ms(), self._fsync, self._fsync_dir)
        if target is not None:
            notes.append(("Journal {queue}: archived {file} as {target}",
                          {"file": name, "target": target}))

    # -- replay ------------------------------------------------------------

    def replay(self, apply: Callable[[rec.Record], None],
               reset: Callable[[], None] | None = None) -> None:
        """
        Call C{apply} with every record of every file, oldest first, then open C{<q>}.

        This is L{replay_steps} run to its end in one go; see there.
        """
        for _ in self.replay_steps(apply, reset):
            pass

    def replay_steps(self, apply: Callable[[rec.Record], None],
                     reset: Callable[[], None] | None = None,
                     slice_bytes: int | None = None) -> Iterator[int]:
        """
        Replay in steps: a generator doing the work of L{replay} a slice at a time.

        With C{slice_bytes}, it pauses (yields the offset reached in the
        file being read) after about every C{slice_bytes} bytes of records,
        so that a caller can hand the thread back to the reactor between
        slices; without, it pauses only between files. When it is exhausted
        the journal is open, as after L{replay}. Closed before its end (the
        generator's C{close()}, e.g. a shutdown), it stops where it is and
        leaves every file as it was: no tail is cut off, nothing is opened
        for writing; the journal must then be closed, not written.

        With L{on_skipped_adds} set, the ADDX records met while the
        read-behind reader is open (items beyond memory, which the reader
        reads again when their turn comes) are not decoded: each run of
        them is only measured and passed on as C{on_skipped_adds(items,
        data_bytes)}.

        C{~~} files are deleted first and the pack rule is applied. A legacy
        ADD is passed on as an L{rec.Add} whose add time is the time of
        replay.

        A corrupt or truncated record in the current file C{<q>} (the torn
        tail a crash leaves) is cut off: the file is truncated at the
        record's start and fsynced, with a warning.

        A corrupt record in a I{rotated} file is damage (rotated files are
        fsynced before they are renamed, so no crash tears them): the later
        files' removes would then take the wrong items, and a consumed item
        could come back. So that never happens, the damaged file and every
        file before it are moved, untouched, into a folder
        C{<q>.damaged.<ms>} of the queue folder for inspection, C{reset} is
        called (the caller forgets what it replayed so far) and replay goes
        on with the next file: the queue then holds only items of the later
        files, a subset of the items really left. The error is logged and
        counted in L{damaged_replays}. Without C{reset} (offline tools) the
        damaged rotated file is cut off like the current one and replay goes
        on with the next file.
        """
        os.makedirs(self.queue_path, exist_ok=True)
        with self._install_lock:
            # (a reload after a failure: a pack installed in a thread meanwhile
            # is either done or finds its ~~ file gone and gives up)
            self._close_spare()
            self._name_floor = None
            self._known_without_rotated = False
            temps = [n for n in self._list() if n.startswith(self.queue_name + TEMP_INFIX)]
            for name in temps:
                self._log.info("Journal {queue}: deleting unfinished {file}",
                               queue=self.queue_name, file=name)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._path(name))
            if temps:
                self._fsync_dir(self.queue_path)
        # Replay makes long-lived objects only: the cyclic garbage collector
        # would walk them again and again for nothing (about 20% of replay).
        # (Between slices the collector is as the caller left it.)
        collecting = gc.isenabled()
        gc.disable()
        try:
            files = [*self.archived_files(), self.queue_name]
            for index, name in enumerate(files):
                steps = self._replay_one(name, apply,
                                         truncate=reset is None or name == self.queue_name,
                                         count_adds=self.on_skipped_adds,
                                         slice_bytes=slice_bytes)
                try:
                    while True:
                        offset = next(steps)
                        if collecting:
                            gc.enable()
                        yield offset
                        collecting = gc.isenabled()
                        gc.disable()
                except StopIteration as done:
                    damage = done.value
                finally:
                    steps.close()  # (stopped early: its file is unmapped now)
                if damage is not None and reset is not None:
                    self._set_aside(files[:index + 1], name, damage)
                    self._stop_reader()
                    reset()
                if index + 1 < len(files):
                    if collecting:
                        gc.enable()
                    yield 0
                    collecting = gc.isenabled()
                    gc.disable()
        finally:
            self._replay_file = None
            if collecting:
                gc.enable()
        self._compute_archived_size()
        self._writer = self._open_writer()
        self.size = self._writer.position

    def _open_writer(self, fd: int | None = None) -> PeriodicSyncFile:
        """The writer of C{<q>}: opened here, or C{fd} (open on C{<q>} for appending)."""
        run_in_thread = None if self._run_in_thread is None else self._writer_thread
        return PeriodicSyncFile(self._path(self.queue_name), self._clock, self._policy,
                                fsync=self._writer_fsync, run_in_thread=run_in_thread,
                                coalescer=self._coalescer, on_fsync=self._on_fsync,
                                on_error=self._writer_failed, write=self._os_write,
                                mode=self._file_mode, fd=fd)

    def _writer_fsync(self, fd: int) -> None:
        """The current files' fsync: C{fsync}, except the one close of a file just fsynced."""
        presynced = self._presynced
        if presynced is not None and presynced == (fd, threading.get_ident()):
            self._presynced = None
            return
        self._fsync(fd)

    def _writer_thread(self, job: Callable[[], _T]) -> Deferred[_T]:
        """The current files' C{run_in_thread}: held back while a rotation's fsyncs run."""
        assert self._run_in_thread is not None
        if self._maintenance is None:
            return self._run_in_thread(job)
        d: Deferred[_T] = Deferred()
        self._gated.append((job, d))  # type: ignore[arg-type]
        return d

    def _release_gated(self) -> None:
        assert self._run_in_thread is not None
        gated, self._gated = self._gated, []
        for job, d in gated:
            self._run_in_thread(job).chainDeferred(d)

    def _close_presynced(self, writer: PeriodicSyncFile) -> Callable[..., None]:
        """
        Close C{writer} without an fsync; return the function that fires its
        pending acknowledgements (or, given a L{Failure}, fails them). The
        caller makes them true otherwise: a thread fsynced the file after its
        last write (rotation), or a directory fsync makes the file that
        replaced it durable (empty rewrite).
        """
        self._presynced = (writer.fileno(), threading.get_ident())
        try:
            d, fire = writer.close_deferring()
        finally:
            self._presynced = None
        d.addErrback(_log_failure)
        if not d.called:
            self._closing.append(d)
            d.addBoth(self._closed_one, d)
        return fire

    def _after_maintenance(self, f: Callable[[], Deferred[_T]]) -> Deferred[_T]:
        """Call C{f} once the rotation in progress has ended; fire with its result."""
        assert self._maintenance is not None
        d: Deferred[_T] = Deferred()

        def run(_: object) -> None:
            f().chainDeferred(d)

        self._maintenance.addBoth(run)
        return d

    def _writer_failed(self, kind: str, error: OSError) -> None:
        on_failure = self.on_failure
        if on_failure is not None:
            on_failure(kind, error)

    # -- recovery after a failed write or fsync ------------------------------

    def recover(self, kind: str, error: Exception) -> Deferred[int]:
        """
        Give up the current file after a failed write or fsync, and cut it
        back to what is known to be in it; fire with the size kept.

        After a failed write the file was already cut back to its last whole
        record, and what was written before is fsynced now (the writes
        waiting for durability fire). After a failed fsync what it covered
        is in doubt (the kernel may have dropped those pages): the writes
        not yet durable fail with C{error}, and the file is cut back to the
        end of the last successful fsync (under C{sync_journal: never},
        which promises no durability, nothing is cut). Read-behind stops, a
        checkpoint and a pack in progress are dropped. The journal must then
        be replayed (L{replay}) before it is written again. Raises (fails)
        with the C{OSError} of a cut-back or fsync that fails. During a
        rotation whose fsyncs run in a thread, it starts once they end.
        """
        if self._maintenance is not None:
            return self._after_maintenance(lambda: self.recover(kind, error))
        self._epoch += 1
        self._stop_reader()
        self._clear_checkpoint()
        writer = self._writer
        if not isinstance(writer, PeriodicSyncFile):
            # A recovery that failed before: finish cutting the file back.
            keep = self._pending_cut
            if keep is None:
                return succeed(0)
            try:
                self._cut_current(keep)
            except OSError as e:
                return fail(e)
            self._pending_cut = None
            return succeed(keep)
        self._writer = _NotOpen()
        if kind == "fsync" and self._policy is not None:
            done = writer.abandon(error)
        else:
            done = writer.close()
        result: Deferred[int] = Deferred()

        def closed(outcome: object) -> None:
            if isinstance(outcome, Failure) or writer.failed is not None and kind == "fsync":
                keep = writer.durable_position if self._policy is not None else writer.position
            else:
                keep = writer.position
            try:
                self._cut_current(keep)
            except OSError:
                self._pending_cut = keep
                result.errback()
                return
            result.callback(keep)

        done.addBoth(closed)
        return result

    def _cut_current(self, keep: int) -> None:
        """Truncate C{<q>} to C{keep} bytes (if longer) and fsync it."""
        path = self._path(self.queue_name)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return
        try:
            size = os.fstat(fd).st_size
            if size > keep:
                self._log.warn(
                    "Journal {queue}: cutting {file} back from {size} to {keep} bytes after a "
                    "failed write or fsync", queue=self.queue_name, file=self.queue_name,
                    size=size, keep=keep)
                os.ftruncate(fd, keep)
            self._fsync(fd)
        finally:
            os.close(fd)

    def probe(self, xid_counter: int) -> Deferred[None]:
        """
        Check that the journal can be written again: append a harmless
        SAVE_XID(C{xid_counter}) and fsync it; fires when durable, fails if not.
        """
        data = rec.SaveXid(xid_counter).encode()
        self.size += len(data)
        d = self._writer.write(data)
        if d.called and isinstance(d.result, Failure):
            return d
        d.addErrback(_log_failure)
        return self._writer.sync()

    def _set_aside(self, names: Sequence[str], damaged: str, damage: tuple[int, str]) -> None:
        """Move C{names} (the damaged rotated file and those before it) into a new folder."""
        folder = f"{self.queue_name}.damaged.{self._now_ms()}"
        os.makedirs(self._path(folder), mode=0o700, exist_ok=True)
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                os.rename(self._path(name), os.path.join(self._path(folder), name))
        self._fsync_dir(self._path(folder))
        self._fsync_dir(self.queue_path)
        self.damaged_replays += 1
        offset, problem = damage
        self._log.error(
            "Journal {queue}: {problem} at offset {offset} of rotated file {file}. So that no "
            "consumed item comes back, the queue keeps only what the files after it hold; "
            "{files} moved to {folder} for inspection. ITEMS ADDED BEFORE THE DAMAGE ARE NOT "
            "IN THE QUEUE.", queue=self.queue_name, problem=problem, offset=offset,
            file=damaged, files=list(names), folder=self._path(folder))

    def _replay_one(self, name: str, apply: Callable[[rec.Record], None],
                    truncate: bool = True,
                    count_adds: Callable[[int, int], None] | None = None,
                    slice_bytes: int | None = None
                    ) -> Iterator[int]:
        """
        Replay one file, pausing after each C{slice_bytes} (see L{replay_steps});
        the generator returns C{(offset, problem)} if the file is damaged, else C{None}.

        The damaged part of the current file is cut off (C{truncate}); a
        rotated file is left as it is.
        """
        path = self._path(name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            self._log.info("No journal file {file} for {queue}", queue=self.queue_name,
                           file=name)
            return None
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            self._log.warn("Journal {queue}: {file} is a symbolic link; not followed, not read",
                           queue=self.queue_name, file=name)
            return None
        try:
            length = os.fstat(fd).st_size
            buf = mmap.mmap(fd, length, access=mmap.ACCESS_READ) if length else b""
        finally:
            os.close(fd)
        self._replay_file = name
        self._replay_pos = 0
        self.size = 0
        started = self._clock.seconds()
        try:
            end, problem = yield from self._replay_records(buf, length, name, apply, count_adds,
                                                           slice_bytes)
        finally:
            if isinstance(buf, mmap.mmap):
                buf.close()
        self.size = end
        if problem is not None and truncate:
            self._truncate(name, end, length, problem)
        self._log.info("Replayed {queue} file {file}: {bytes} bytes in {seconds:.3f}s",
                       queue=self.queue_name, file=name, bytes=end,
                       seconds=self._clock.seconds() - started)
        return None if problem is None or truncate else (end, problem)

    def _replay_records(self, buf: mmap.mmap | bytes, end: int, name: str,
                        apply: Callable[[rec.Record], None],
                        count_adds: Callable[[int, int], None] | None = None,
                        slice_bytes: int | None = None
                        ) -> Iterator[int]:
        """
        Apply every whole record of C{buf}, pausing (yielding the offset)
        after each C{slice_bytes}; the generator returns where decoding
        stopped and why.
        """
        pos = 0
        # A record may end past the slice's limit: the limit only says when to pause.
        limit = end if slice_bytes is None else min(end, slice_bytes)
        release = (slice_bytes is not None and isinstance(buf, mmap.mmap)
                   and hasattr(mmap, "MADV_DONTNEED"))
        released = 0
        next_report = PROGRESS_BYTES
        read_record = rec.read_record
        unpack_addx = _ADDX_BODY.unpack_from
        add = rec.Add
        legacy = rec.LegacyAdd
        try:
            while True:
                while pos < limit:
                    if count_adds is not None and self._reader is not None and buf[pos] == 2:
                        # Measuring is many times cheaper than decoding: a longer slice.
                        skipped = rec.skip_adds(buf, pos, end if slice_bytes is None else
                                                min(end, pos + SKIP_SLICE_FACTOR * slice_bytes))
                        if skipped.records:
                            pos = self._replay_pos = skipped.end
                            count_adds(skipped.records, skipped.data_bytes)
                            if pos >= next_report:
                                next_report = pos + PROGRESS_BYTES
                                self._log.info(
                                    "Replaying {queue} file {file}: {bytes} of {total} bytes",
                                    queue=self.queue_name, file=name, bytes=pos, total=end)
                            continue
                    if buf[pos] == 2 and pos + 21 <= end:
                        # Inline fast path for ADDX, the record nearly every byte belongs to.
                        size, add_ms, exp_ms = unpack_addx(buf, pos + 1)
                        nxt = pos + 5 + size
                        if size < 16 or nxt > end:
                            got = read_record(buf, pos)
                            if got is None:
                                return pos, "truncated record"
                            record, nxt = got
                        else:
                            record = add(buf[pos + 21:nxt], add_ms, exp_ms)
                    else:
                        got = read_record(buf, pos)
                        if got is None:
                            return pos, "truncated record"
                        record, nxt = got
                        if type(record) is legacy:
                            item = legacy_item(record, self._now_ms())  # type: ignore[arg-type]
                            record = add(item.data, item.add_time_ms, item.expiry_ms)
                    self._replay_pos = nxt
                    apply(record)
                    pos = nxt
                    if pos >= next_report:
                        next_report = pos + PROGRESS_BYTES
                        self._log.info("Replaying {queue} file {file}: {bytes} of {total} bytes",
                                       queue=self.queue_name, file=name, bytes=pos, total=end)
                if pos >= end or slice_bytes is None:
                    break
                if release and pos - released >= RELEASE_BYTES:
                    # Unmap what is read as we go: unmapping a whole big file at
                    # once would hold the reactor for tens of ms.
                    upto = pos - pos % mmap.PAGESIZE
                    buf.madvise(mmap.MADV_DONTNEED, released, upto - released)  # type: ignore[union-attr]
                    released = upto
                yield pos
                limit = min(end, pos + slice_bytes)
        except rec.CorruptRecord as e:
            return pos, e.reason
        return pos, None

    def _truncate(self, name: str, offset: int, length: int, problem: str) -> None:
        self._log.warn(
            "Journal {queue} file {file}: {problem} at offset {offset}; cutting off "
            "{dropped} bytes. DATA MAY HAVE BEEN LOST.",
            queue=self.queue_name, file=name, offset=offset, dropped=length - offset,
            problem=problem)
        try:
            fd = os.open(self._path(name), os.O_WRONLY | os.O_NOFOLLOW)
            try:
                os.ftruncate(fd, offset)
                self._fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            self._log.error("Journal {queue}: could not truncate {file}: {error}",
                            queue=self.queue_name, file=name, error=e)

    # -- rotation, rewrite, pack --------------------------------------------

    def _close_writer(self) -> None:
        """Close the writer (its final fsync runs inline) and remember the close."""
        self._close_writer_deferring()()

    def _close_writer_deferring(self) -> Callable[[], None]:
        """
        Close the writer (its final fsync runs inline); return the function
        that fires the acknowledgements that fsync covered.

        Rotation and rewrite call that function only once the new current
        file is in place: an acknowledgement may set off more writes to this
        journal (a pipelined request served at once), and those must go to
        the new file, never to the closed one or into a file about to be
        replaced.
        """
        writer = self._writer
        if isinstance(writer, PeriodicSyncFile):
            d, fire = writer.close_deferring()
        else:
            d, fire = writer.close(), _no_op
        d.addErrback(_log_failure)
        if not d.called:
            self._closing.append(d)
            d.addBoth(self._closed_one, d)
        return fire

    def _closed_one(self, result: object, d: Deferred[None]) -> object:
        if d in self._closing:
            self._closing.remove(d)
        return result

    def rotate(self, reserved_items: Iterable[QItem], set_checkpoint: bool) -> None:
        """
        Move C{<q>} to a new C{<q>.<ms>} and start a fresh C{<q>}.

        The old file is fsynced before the rename and the directory after it.
        A read-behind reader on C{<q>} follows the renamed file. With
        C{set_checkpoint}, and no checkpoint pending, remember the rotated file
        and C{reserved_items} (the open reads) as the checkpoint.

        With C{run_in_thread}, those two fsyncs run in a thread: the rename
        happens now and writes go to the new C{<q>} at once, but the writes
        to the old file are acknowledged, and the new file is fsynced (so
        its writes are acknowledged), only once both fsyncs have ended.
        While they run, another rotation or a rewrite is skipped (the queue
        asks again on a later operation).
        """
        if self._maintenance is not None:
            self._log.debug("Journal {queue}: rotation skipped: the last one is still syncing",
                            queue=self.queue_name)
            return
        writer = self._writer
        if (self._run_in_thread is not None and isinstance(writer, PeriodicSyncFile)
                and not writer.closed):
            self._rotate_in_thread(writer, reserved_items, set_checkpoint)
            return
        old_size = self._writer.position
        acknowledge = self._close_writer_deferring()
        try:
            rotated = self._unique_rotated_name()
            os.rename(self._path(self.queue_name), self._path(rotated))
        except Exception:
            self._writer = self._open_writer()
            acknowledge()
            raise
        self.size = 0
        self.archived_size += old_size
        self._writer = self._open_writer()
        if self._reader_file == self.queue_name:
            self._reader_file = rotated
        if set_checkpoint and self.checkpoint is None:
            self.checkpoint = Checkpoint(rotated, tuple(reserved_items))
            self._head_ops = array("q")
        try:
            self._fsync_dir(self.queue_path)
        finally:
            acknowledge()
        self._log.info("Journal {queue}: rotated to {file}", queue=self.queue_name,
                       file=rotated)

    def _rotate_in_thread(self, old: PeriodicSyncFile, reserved_items: Iterable[QItem],
                          set_checkpoint: bool) -> None:
        old.flush()
        rotated = self._unique_rotated_name()
        os.rename(self._path(self.queue_name), self._path(rotated))
        new = self._open_writer()
        self.size = 0
        self.archived_size += old.position
        fd = old.fileno()
        queue_path = self.queue_path

        def sync_both() -> None:
            self._fsync(fd)
            self._fsync_dir(queue_path)

        done = self._run_in_thread(sync_both)  # type: ignore[misc]
        self._maintenance = done
        self._writer = new
        if self._reader_file == self.queue_name:
            self._reader_file = rotated
        if set_checkpoint and self.checkpoint is None:
            self.checkpoint = Checkpoint(rotated, tuple(reserved_items))
            self._head_ops = array("q")
        done.addBoth(self._rotation_synced, old, rotated)

    def _rotation_synced(self, result: object, old: PeriodicSyncFile, rotated: str) -> None:
        """The fsyncs of a rotation ended: acknowledge the old file's writes, let the new sync."""
        self._maintenance = None
        if isinstance(result, Failure):
            self._log.error("Journal {queue}: fsync after rotating to {file} failed: {error}",
                            queue=self.queue_name, file=rotated, error=result.value)
            old.abandon(result.value).addErrback(_log_failure)
            if isinstance(result.value, OSError):
                self._writer_failed("fsync", result.value)
        else:
            self._close_presynced(old)()
            self._log.info("Journal {queue}: rotated to {file}", queue=self.queue_name,
                           file=rotated)
        self._release_gated()

    def _clear_checkpoint(self) -> None:
        self.checkpoint = None
        self._head_ops = None

    def _dump(self, xid_counter: int, reserved_items: Iterable[QItem],
              middle: Sequence[QItem | None], items: Iterable[QItem]) -> Iterator[bytes]:
        """The records of a compact journal (L{pack.dump_records}), empty items stamped now."""
        return dump_records(xid_counter, reserved_items, middle, items, self._now_ms())

    def _create_temp(self, flags: int = 0) -> tuple[str, int]:
        """
        Create a new, empty C{<q>~~<ms>} file; return its name and a
        descriptor open on it for writing (with C{flags} too, e.g. C{O_APPEND}).
        """
        ts = self._now_ms()
        while True:
            name = f"{self.queue_name}{TEMP_INFIX}{ts}"
            try:
                return name, self._opener(self._path(name),
                                          os.O_WRONLY | os.O_CREAT | os.O_EXCL | flags)
            except FileExistsError:
                ts += 1

    def _write_temp(self, parts: Iterable[bytes]) -> tuple[str, int]:
        """Write C{parts} to a new C{<q>~~<ms>} file and fsync it; return its name and size."""
        name, fd = self._create_temp()
        try:
            with os.fdopen(fd, "wb", buffering=1024 * 1024) as f:
                for part in parts:
                    f.write(part)
                f.flush()
                self._fsync(f.fileno())
                return name, f.tell()
        except BaseException:
            # (a full disk, say): the old files stay as they are.
            try:
                os.unlink(self._path(name))
            except OSError:
                pass
            raise

    def rewrite(self, reserved_items: Iterable[QItem], items: Iterable[QItem],
                xid_counter: int = 0) -> None:
        """
        Replace every journal file of the queue by one compact C{<q>}.

        The new file holds SAVE_XID(C{xid_counter}), then ADDX +
        REMOVE_TENTATIVE_XID for each open read in C{reserved_items} (in the
        order given), then ADDX for each of C{items}. It is written to a
        C{~~} file and fsynced before any rename. Without rotated files or an
        archive it then replaces C{<q>} in one rename; otherwise C{<q>} is
        rotated and the new file goes through the pack rule. The directory is
        fsynced after every rename. Read-behind ends and any checkpoint is
        dropped: the queue must then hold every item in memory.

        With C{run_in_thread}, an empty queue with no open reads and no
        rotated files or archive is rewritten with no fsync on this thread
        (L{_rewrite_empty}): an empty file is renamed over C{<q>} and
        SAVE_XID(C{xid_counter}) written to it; the old file is freed in a
        thread, and its writes are acknowledged once a directory fsync in a
        thread has made the replacement durable. A crash at any point
        replays to an empty queue (or, before the replacement is durable, to
        the old contents, as a crash just before the rewrite would).

        With C{run_in_thread}, any other queue is rewritten through a pack,
        with no write, rename or fsync of its files on this thread: a
        checkpoint still pending is given up, C{<q>} is rotated with a new
        checkpoint (its fsyncs in a thread, as L{rotate} does), and a pack of
        the checkpoint holding exactly what the new file would hold is
        written, fsynced and put in place in a thread (L{start_pack}), which
        leaves it and the new C{<q>} as the queue's only files. Until then
        the old files are still there, and a crash replays them, as a crash
        just before the rewrite would.

        During a rotation whose fsyncs still run, or while a pack is being
        written, the rewrite is skipped (the queue asks again later).
        """
        if self._maintenance is not None:
            self._log.debug("Journal {queue}: rewrite skipped: a rotation is still syncing",
                            queue=self.queue_name)
            return
        if self._packs:
            self._log.debug("Journal {queue}: rewrite skipped: a pack is still being written",
                            queue=self.queue_name)
            return
        if not isinstance(reserved_items, (list, tuple)):
            reserved_items = list(reserved_items)
        if not isinstance(items, (list, tuple)):
            items = list(items)
        writer = self._writer
        if (self._run_in_thread is not None and not reserved_items and not items
                and isinstance(writer, PeriodicSyncFile) and not writer.closed
                and self.archive_path is None and self._without_rotated_files()):
            self._rewrite_empty(writer, xid_counter)
            return
        if (self._run_in_thread is not None and isinstance(writer, PeriodicSyncFile)
                and not writer.closed):
            # A checkpoint still pending (its reader never got past it) is
            # given up, as the inline rewrite gives it up: no pack of it is
            # being written (checked above), and the rewrite's own pack
            # replaces every file up to a newer checkpoint.
            self._clear_checkpoint()
            self._rewrite_by_packing(writer, reserved_items, items, xid_counter)
            return
        temp, _ = self._write_temp(self._dump(xid_counter, reserved_items, (), items))
        self._epoch += 1
        self._stop_reader()
        self._clear_checkpoint()
        acknowledge = self._close_writer_deferring()
        try:
            self._replace_current(temp)
        except Exception:
            # Whatever step failed, the files on disk replay to the queue
            # (see docs/journal.md), and <q> is the right file to append to.
            self._reopen()
            acknowledge()
            raise
        self._reopen()
        self._log.info("Journal {queue}: rewritten", queue=self.queue_name)
        acknowledge()

    def _rewrite_by_packing(self, writer: PeriodicSyncFile, reserved_items: Sequence[QItem],
                            items: Sequence[QItem], xid_counter: int) -> None:
        """A rewrite as a rotation with a checkpoint and a pack of it, both off this thread."""
        self._stop_reader()
        self._rotate_in_thread(writer, reserved_items, True)
        checkpoint = self.checkpoint
        assert checkpoint is not None
        self._log.info("Journal {queue}: rewriting through a pack of {file}",
                       queue=self.queue_name, file=checkpoint.filename)
        # Nothing was taken from the head since the checkpoint: the pack holds
        # the open reads, then every item, as the rewritten file would.
        self.start_pack(checkpoint, reserved_items, items, xid_counter)

    def _rewrite_empty(self, old: PeriodicSyncFile, xid_counter: int) -> None:
        """
        Replace C{<q>} by a new file holding only SAVE_XID, with no fsync and
        no freeing of the old file's blocks on this thread.

        An empty C{<q>~~<ms>} is renamed over C{<q>} and becomes the writer.
        It is the spare the last rewrite left, made and opened off this
        thread (L{_make_spare}); only a queue's first empty rewrite, or one
        whose spare is gone, creates its own here. The old file's last
        descriptor is closed off this thread, so that the kernel frees its
        blocks there (cutting a 16 MiB journal to nothing in place took
        about 4 ms on the calling thread).

        Under the C{never} sync policy nothing is fsynced and nothing waits:
        given C{chores}, the old descriptor goes to them with the making of
        the next spare, and nothing comes back to this thread. A power loss
        may undo the rewrite, and the old file then replays, as any write
        under that policy may be undone. Under any other policy (or without
        chores) one thread job fsyncs the directory, closes the old file and
        makes the spare; until it ends the new file's fsyncs wait, as after
        a rotation; then the old file's writes are acknowledged (what they
        did is cut: the queue is empty), or failed if the directory fsync
        failed. SAVE_XID is made durable by the sync policy, as any write.
        """
        self._epoch += 1
        self._stop_reader()
        self._clear_checkpoint()
        old.flush()
        current = self._path(self.queue_name)
        with self._install_lock:
            spare, self._spare = self._spare, None
        if spare is not None:
            try:
                os.rename(self._path(spare[0]), current)
            except FileNotFoundError:
                os.close(spare[1])  # (deleted by hand: make one)
                spare = None
        if spare is None:
            spare = self._create_temp(os.O_APPEND)
            try:
                os.rename(self._path(spare[0]), current)
            except BaseException:
                os.close(spare[1])
                with contextlib.suppress(OSError):
                    os.unlink(self._path(spare[0]))
                raise
        epoch = self._epoch
        chores = self._chores
        if (chores is not None and self._policy is None
                and (handed := old.hand_over()) is not None):
            chores(lambda: self._free_then_make_spare(handed, epoch))
        else:
            self._free_in_thread(old, epoch)
        self._writer = new = self._open_writer(spare[1])
        new.write(rec.SaveXid(xid_counter).encode()).addErrback(_log_failure)
        self.size = new.position
        self.archived_size = 0  # (rewrite() found no rotated files)
        # (debug: routine, up to every default_journal_size bytes of a busy
        # queue, and a log line is among this rewrite's costlier steps on the
        # reactor thread; the queue's journal_rewrites stat counts them)
        self._log.debug("Journal {queue}: rewritten (empty)", queue=self.queue_name)

    def _free_in_thread(self, old: PeriodicSyncFile, epoch: int) -> None:
        """
        Close C{old} on this thread without an fsync, keeping a duplicate of
        its descriptor for one thread job that fsyncs the directory (not
        under C{never}, which fsyncs nothing), closes the duplicate (freeing
        the old file there) and makes the next spare. Until the job ends the
        new file's fsyncs wait; then C{old}'s writes are acknowledged, or
        failed with the directory fsync (L{_replacement_synced}).
        """
        keep = os.dup(old.fileno())
        acknowledge = self._close_presynced(old)
        queue_path = self.queue_path
        sync_directory = self._policy is not None

        def sync_directory_then_free() -> None:
            try:
                if sync_directory:
                    self._fsync_dir(queue_path)
            finally:
                os.close(keep)
            self._make_spare(epoch)

        done = self._run_in_thread(sync_directory_then_free)  # type: ignore[misc]
        self._maintenance = done
        done.addBoth(self._replacement_synced, acknowledge)

    def _free_then_make_spare(self, fd: int, epoch: int) -> None:
        """The chore of an empty rewrite under C{never}: close the old file, make the next spare."""
        try:
            os.close(fd)
        finally:
            self._make_spare(epoch)

    def _replacement_synced(self, result: object, acknowledge: Callable[..., None]) -> None:
        """
        The thread job of an empty rewrite ended (the directory fsynced, the
        old file freed): acknowledge the old file's writes, or fail them and
        report the failure, and let the new file sync.
        """
        self._maintenance = None
        if isinstance(result, Failure):
            self._log.error("Journal {queue}: fsync after an empty rewrite failed: {error}",
                            queue=self.queue_name, error=result.value)
            acknowledge(result)
            if isinstance(result.value, OSError):
                self._writer_failed("fsync", result.value)
        else:
            acknowledge()
        self._release_gated()

    def _make_spare(self, epoch: int) -> None:
        """
        Off the reactor thread, after an empty rewrite: make and open the
        empty C{<q>~~<ms>} the next one renames over C{<q>}, so that creating
        and opening it costs the reactor thread nothing. Nothing is made if
        the journal was closed, erased or rewritten since C{epoch} (all of
        which take C{_install_lock}, as this does, to drop a spare, so none
        outlives them), or if it cannot be made (logged; the next rewrite
        then makes its own).
        """
        with self._install_lock:
            if self._epoch != epoch or self.closed or self._spare is not None:
                return
            try:
                self._spare = self._create_temp(os.O_APPEND)
            except OSError as e:
                self._log.warn("Journal {queue}: no spare file for the next rewrite: {error}",
                               queue=self.queue_name, error=e)

    def _close_spare(self) -> str | None:
        """Forget the spare (the caller holds C{_install_lock}); return its name, if any."""
        spare, self._spare = self._spare, None
        if spare is None:
            return None
        os.close(spare[1])
        return spare[0]

    def _drop_spare(self) -> None:
        """Close and delete the spare kept for the next empty rewrite, if any."""
        with self._install_lock:
            name = self._close_spare()
        if name is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._path(name))

    def _reopen(self) -> None:
        self._writer = self._open_writer()
        self.size = self._writer.position
        self._compute_archived_size()

    def _replace_current(self, temp: str) -> None:
        """Make the fsynced file C{temp} the only journal file of the queue."""
        current = self._path(self.queue_name)
        if self.archive_path is None and not self.archived_files():
            os.replace(self._path(temp), current)
            self._fsync_dir(self.queue_path)
            return
        if os.path.lexists(current):
            os.rename(current, self._path(self._unique_rotated_name()))
            self._fsync_dir(self.queue_path)
        pack = self._unique_rotated_name(PACK_SUFFIX)
        os.rename(self._path(temp), self._path(pack))
        self._fsync_dir(self.queue_path)
        files = self.archived_files()
        os.rename(self._path(files[-1]), current)
        self._fsync_dir(self.queue_path)

    def start_pack(self, checkpoint: Checkpoint, open_items: Iterable[QItem],
                   queue_items: Iterable[QItem], xid_counter: int = 0) -> None:
        """
        Pack every file up to C{checkpoint.filename} into one (Kestrel's packer).

        The pack holds SAVE_XID(C{xid_counter}), the checkpoint's open reads
        (ADDX + REMOVE_TENTATIVE_XID), then the items the later files take
        from the head, in the order they take them (the real item where it
        is still open or back in the queue, an empty ADDX where it is gone
        for good), then ADDX of the rest of C{queue_items} (the items in
        memory, which must not yet include any item added after the
        checkpoint). Kestrel writes reads opened since the checkpoint before
        all its "pent-up deletes", which loses an item when removes and
        opens interleave; this layout replays exactly.
        It is written to a C{~~} file and fsynced; then the current file is
        fsynced, the pack is renamed C{<checkpoint>.pack} (directory
        fsynced) and the pack rule puts it in place (L{_install_pack}). With
        C{run_in_thread} every one of these steps runs in a thread (the
        current file's fsync as its writer's fsyncs do), else before this
        returns. A pack that a rewrite, recovery or erase overtook is thrown
        away. L{close} waits for it.
        """
        if not os.path.lexists(self._path(checkpoint.filename)):
            self._log.warn("Journal {queue}: checkpoint file {file} is gone; not packing",
                           queue=self.queue_name, file=checkpoint.filename)
            if self.checkpoint is checkpoint:
                self._clear_checkpoint()
            return
        slots, rest = pack_layout(self._head_ops or array("q"), checkpoint.reserved_items,
                                  list(open_items), list(queue_items))
        self._log.info("Journal {queue}: packing files up to {file}", queue=self.queue_name,
                       file=checkpoint.filename)
        parts = self._dump(xid_counter, checkpoint.reserved_items, slots, rest)
        epoch = self._epoch
        if self._run_in_thread is None:
            self._finish_pack(self._write_temp(parts), checkpoint, epoch)
            return
        written: list[str] = []
        d = self._run_in_thread(lambda: self._write_temp(parts))
        d.addCallback(self._sync_then_finish_pack, checkpoint, epoch, written)
        d.addErrback(self._pack_failed, checkpoint, written)
        self._packs.append(d)
        d.addBoth(self._pack_ended, d)

    def _sync_then_finish_pack(self, temp: tuple[str, int], checkpoint: Checkpoint,
                               epoch: int, written: list[str]) -> Deferred[None] | None:
        written.append(temp[0])
        if self._writer.closed:
            # Closing fsynced the current file already.
            return self._finish_pack(temp, checkpoint, epoch)
        d = self._writer.sync()
        d.addCallback(lambda _: self._finish_pack(temp, checkpoint, epoch))
        return d

    def _finish_pack(self, temp: tuple[str, int], checkpoint: Checkpoint,
                     epoch: int) -> Deferred[None] | None:
        """
        Put a written pack in place (L{_install_pack}), unless a rewrite or
        erase overtook it: in a thread with C{run_in_thread} (the Deferred
        fires once it is in place), else now, after an fsync of the current file.
        """
        name = temp[0]
        if self._run_in_thread is not None:
            notes: _Notes = []
            d = self._run_in_thread(lambda: self._install_pack(name, checkpoint, epoch, notes))
            d.addBoth(self._log_notes_then, notes)
            d.addCallback(self._pack_installed, checkpoint)
            return d
        writer = self._writer
        if isinstance(writer, PeriodicSyncFile) and not writer.closed:
            self._fsync(writer.fileno())
        notes = []
        try:
            installed = self._install_pack(name, checkpoint, epoch, notes)
        finally:
            self._log_notes(notes)
        self._pack_installed(installed, checkpoint)
        return None

    def _log_notes_then(self, result: _T, notes: _Notes) -> _T:
        self._log_notes(notes)
        return result

    def _install_pack(self, name: str, checkpoint: Checkpoint, epoch: int,
                      notes: _Notes) -> bool:
        """
        Rename the fsynced pack C{name} to C{<checkpoint>.pack}, fsync the
        directory, and apply the pack rule (dispose of the files it replaces,
        fsync the directory, rename it C{<checkpoint>}, fsync the directory);
        return C{True}. A pack overtaken by a rewrite, a recovery or an erase
        (or whose checkpoint file is gone) is deleted instead: C{False}.

        Runs on a thread of C{run_in_thread} when there is one: it holds
        C{_install_lock}, reads C{_epoch} (bumped on the reactor thread
        before anything there changes the files) and touches no other state;
        what it did goes to C{notes}, logged on the reactor thread.
        """
        with self._install_lock:
            if epoch != self._epoch or not os.path.lexists(self._path(checkpoint.filename)):
                notes.append(("Journal {queue}: pack {file} overtaken; discarded",
                              {"file": name}))
                try:
                    os.unlink(self._path(name))
                except FileNotFoundError:
                    pass
                return False
            os.rename(self._path(name), self._path(checkpoint.filename + PACK_SUFFIX))
            self._fsync_dir(self.queue_path)
            self._apply_pack_rule(notes)
            return True

    def _pack_installed(self, installed: bool, checkpoint: Checkpoint) -> None:
        """On the reactor thread, once the pack is in place (or discarded): sizes, checkpoint."""
        if not installed:
            return
        self._compute_archived_size()
        if self.checkpoint is checkpoint:
            self._clear_checkpoint()
        self._log.info("Journal {queue}: packed files up to {file}", queue=self.queue_name,
                       file=checkpoint.filename)

    def _pack_failed(self, failure: Failure, checkpoint: Checkpoint,
                     written: list[str]) -> None:
        """
        A pack could not be written or put in place: the files it would have
        replaced stay as they are, or (an install stopped half-way) as the
        pack rule would leave them; either way they replay as before. The
        checkpoint is given up (a later rotation sets a new one) and the
        pack's C{~~} file (C{written}, if it was written) goes; another
        pack's is left alone. An I/O error (a full disk) is logged in one
        line; anything else with its traceback.
        """
        if failure.check(OSError) is not None:
            self._log.error("Journal {queue}: packing up to {file} failed: {error}; the "
                            "files stay as they are", queue=self.queue_name,
                            file=checkpoint.filename, error=failure.value)
        else:
            self._log.failure("Journal {queue}: packing up to {file} failed", failure=failure,
                              queue=self.queue_name, file=checkpoint.filename)
        if self.checkpoint is checkpoint:
            self._clear_checkpoint()
        for name in written:
            try:
                os.unlink(self._path(name))
            except OSError:
                pass

    def _pack_ended(self, result: object, d: Deferred[None]) -> object:
        if d in self._packs:
            self._packs.remove(d)
        return result

    # -- read-behind ---------------------------------------------------------

    def start_read_behind(self) -> None:
        """
        Open the read-behind reader where the writer (or, during replay, the replayer) is.

        Outside replay the current file is fsynced first, as Kestrel does.
        """
        if self._replay_file is not None:
            name, pos = self._replay_file, self._replay_pos
        else:
            self._writer.sync().addErrback(_log_failure)
            name, pos = self.queue_name, self._writer.position
        self._stop_reader()
        self._reader = _Reader(self._path(name), pos)
        self._reader_file = name
        self._log.debug("Journal {queue}: read-behind starts at {file} offset {offset}",
                        queue=self.queue_name, file=name, offset=pos)

    def _stop_reader(self) -> None:
        if self._reader is not None:
            self._reader.close()
        self._reader = None
        self._reader_file = None

    def fill_read_behind(self, got_item: Callable[[QItem], None],
                         got_checkpoint: Callable[[Checkpoint], None]) -> None:
        """
        Read forward one record from the read-behind reader, as Kestrel's C{fillReadBehind}.

        An add or a continue calls C{got_item}; other records are skipped.
        At the end of a rotated file the reader moves to the next file (and
        calls C{got_checkpoint} if it just left the checkpoint file), then
        reads again. At the end of the current file it fsyncs and retries
        once. When the reader reaches the writer, read-behind ends.
        """
        reader = self._reader
        if reader is None:
            return
        if self._replay_file is not None:
            name, pos = self._replay_file, self._replay_pos
        else:
            name, pos = self.queue_name, self._writer.position
        reader_file = self._reader_file
        if reader.position == pos and reader_file == name:
            self._stop_reader()
            return
        record = self._read_one(reader, reader_file)
        if record is None and reader_file == self.queue_name and self._replay_file is None:
            self._writer.sync().addErrback(_log_failure)
            record = self._read_one(reader, reader_file)
        if record is None:
            self._next_reader_file(got_item, got_checkpoint)
            return
        if isinstance(record, (rec.Add, rec.AddXid, rec.Continue)):
            got_item(QItem(record.data, record.add_time_ms, record.expiry_ms))
        elif isinstance(record, rec.LegacyAdd):
            got_item(legacy_item(record, self._now_ms()))

    def _read_one(self, reader: _Reader, name: str | None) -> rec.Record | None:
        try:
            return reader.read()
        except rec.CorruptRecord as e:
            self._log.warn("Journal {queue} file {file}: read-behind found {problem} at "
                           "offset {offset}; skipping the rest of the file",
                           queue=self.queue_name, file=name, problem=e.reason,
                           offset=reader.position)
            return None

    def _next_reader_file(self, got_item: Callable[[QItem], None],
                          got_checkpoint: Callable[[Checkpoint], None]) -> None:
        old = self._reader_file
        assert old is not None
        following = self._file_after(old)
        if following is None:
            self._log.warn("Journal {queue}: read-behind reached the end of {file} with no "
                           "file after it; leaving read-behind", queue=self.queue_name,
                           file=old)
            self._stop_reader()
            return
        self._stop_reader()
        self._reader = _Reader(self._path(following), 0)
        self._reader_file = following
        self._log.info("Journal {queue}: read-behind moves from {old} to {file}",
                       queue=self.queue_name, old=old, file=following)
        checkpoint = self.checkpoint
        if checkpoint is not None and checkpoint.filename == old:
            got_checkpoint(checkpoint)
        self.fill_read_behind(got_item, got_checkpoint)

    # -- close, erase, discovery --------------------------------------------

    def close(self) -> Deferred[None]:
        """Stop read-behind, fsync and close the current file; fires when every file is closed."""
        if self.closed:
            return succeed(None)
        self.closed = True
        self._stop_reader()
        if self._maintenance is not None:
            # The current file's writes are acknowledged after the rotation's fsyncs.
            return self._after_maintenance(self._close_now)
        return self._close_now()

    def _close_now(self) -> Deferred[None]:
        self._close_writer()
        self._drop_spare()
        pending = [*self._closing, *self._packs]
        if not pending:
            return succeed(None)
        return gatherResults(pending, consumeErrors=True).addCallback(lambda _: None)

    def erase(self) -> None:
        """
        Close the journal and delete (or archive) every file of the queue.

        A pack being put in place in a thread is either discarded or, if it
        got there first, finished before the files are listed (both hold
        C{_install_lock}), so nothing it renames outlives the erase.
        """
        self._epoch += 1
        self.close()
        with self._install_lock:
            names = self._list()
            temps = [n for n in names if n.startswith(self.queue_name + TEMP_INFIX)]
            for name in temps:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._path(name))
            files = [name for _, _, name in self._timed_files(names)]
            if self.queue_name in names:
                files.append(self.queue_name)
            self._dispose(files)
            if temps and not files:
                self._fsync_dir(self.queue_path)
        self.size = 0
        self.archived_size = 0
        self._clear_checkpoint()

    @staticmethod
    def queue_names_in(path: str) -> set[str]:
        """
        Return the names of the queues with journal files in C{path}.

        Only regular files named C{<q>}, C{<q>.<digits>} or
        C{<q>.<digits>.pack} name a queue C{<q>}; C{~~} files (a rewrite or
        pack in progress, cleaned up by the replay of their queue) are
        passed over silently. Every other regular file is left untouched
        and logged as a warning naming it; subdirectories are passed over.
        """
        return set(FileJournal.queue_sizes_in(path))

    @staticmethod
    def queue_sizes_in(path: str) -> dict[str, int]:
        """
        Return the bytes of journal (every file: current, rotated, packs) of
        each queue with journal files in C{path}, found and logged as
        L{queue_names_in} says.
        """
        names: dict[str, int] = {}
        try:
            entries = list(os.scandir(path))
        except FileNotFoundError:
            return names
        for entry in entries:
            name = entry.name
            if entry.is_symlink():
                FileJournal._log.warn("Ignoring symbolic link {file!r} in queue directory {path}: "
                                      "journals are never followed out of it", file=name, path=path)
                continue
            if TEMP_INFIX in name or not entry.is_file():
                continue
            queue = journal_queue_name(name)
            if queue is None:
                FileJournal._log.warn(
                    "Ignoring file {file!r} in queue directory {path}: not a journal file",
                    file=name, path=path)
            else:
                try:
                    size = entry.stat(follow_symlinks=False).st_size
                except FileNotFoundError:
                    continue
                names[queue] = names.get(queue, 0) + size
        return names
