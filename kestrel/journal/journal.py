"""
FileJournal: the journal files of one queue, as Kestrel's C{Journal} keeps
them; the L{kestrel.journal.interface.IJournal} a queue holds.

Files in the queue directory (see docs/journal.md):

  - C{<q>}: the current file, appended to by a L{PeriodicSyncFile};
  - C{<q>.<ms>}: rotated files, replayed in ascending timestamp order before C{<q>};
  - C{<q>~~<ms>}: a file being written by a rewrite or pack, or the empty
    spare of the next empty rewrite; deleted at replay (the spare at close too);
  - C{<q>.<ms>.pack}: a finished pack; it replaces every rotated file whose
    timestamp is at most its own (the "pack rule", applied when a pack is put
    in place and by replay; listings while the journal serves only read the
    files as the rule would leave them).

This module is the facade: record writes (the hot path) and the head
operations a checkpoint needs, replay, recovery after a failed write or
fsync, read-behind, close and erase. The rest is in its own module:
L{kestrel.journal.files} (the files on disk), L{kestrel.journal.replay},
L{kestrel.journal.readbehind} and L{kestrel.journal.maintenance} (rotation,
rewrite, pack).
"""

from __future__ import annotations

import os
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
from kestrel.journal.files import JournalFiles
from kestrel.journal.maintenance import Maintenance
from kestrel.journal.naming import journal_queue_name
from kestrel.journal.pack import (
    OP_CLOSE,
    OP_OPEN,
    OP_REMOVE,
    OP_UNREMOVE,
    Checkpoint,
)
from kestrel.journal.readbehind import ReadBehind
from kestrel.journal.replay import Damage, ReplayCursor, replay_files
from kestrel.journal.runner import RunInThread, SyncTurn, run_inline
from kestrel.journal.syncfile import FsyncObserver, PeriodicSyncFile, Waiter
from kestrel.journal.writer import CLOSED_WRITER, JournalNotOpenError, Writer, ignore_failure
from kestrel.settled import settled

#: Opcodes written per open read, read once: an enum member read from its
#: class is not specialized (CPython 3.11).
_REMOVE_TENTATIVE_XID = rec.Opcode.REMOVE_TENTATIVE_XID
_UNREMOVE = rec.Opcode.UNREMOVE
_CONFIRM_REMOVE = rec.Opcode.CONFIRM_REMOVE


_T = TypeVar("_T")

__all__ = ["Checkpoint", "FileJournal", "JournalNotOpenError", "journal_queue_name"]


class FileJournal:
    """
    The journal of one queue: replay, durable writes, rotation, rewrite,
    read-behind and packing, as Kestrel's C{Journal} does them.

    Writes return what the L{PeriodicSyncFile} returns: a Deferred that fires
    when the record is durable under C{sync_policy}, or C{None} under
    C{never} (nothing to wait for). With a C{coalescer}, records
    written while its batch is open reach the OS when it flushes; every
    other operation on the file (sync, rotate, rewrite, close) flushes first.
    An C{on_fsync} observer is handed to every current file it opens, so it
    hears of each fsync that makes records of this queue durable (see
    L{kestrel.journal.syncfile.FsyncObserver}). Every fsync, rename and
    pack write of a rotation, rewrite or pack runs through C{run_in_thread}
    (a L{kestrel.journal.runner.RunInThread}: the server's thread pool, or
    the default L{kestrel.journal.runner.InlineRunner} of tests and tools,
    which runs it at once; the code path is the same). With a C{sync_turn}
    (a L{kestrel.journal.runner.SyncTurn}) and C{sync_policy} 0.0, the
    current file's own fsyncs run on the calling (reactor) thread instead,
    once per reactor turn for every record written in it (see
    L{PeriodicSyncFile}); under a period it only gathers the records of
    L{add_unseen} into one write per turn; C{never} ignores it. With C{chores} (a
    L{kestrel.journal.chores.FileChores}), an empty rewrite under the
    C{never} policy hands the file it replaced to them.

    @ivar size: bytes in the current file C{<q>}.
    @ivar archived_size: bytes in the rotated files.
    @ivar checkpoint: the checkpoint set by L{rotate}, until it is packed.
    @ivar files: the queue's files on disk (L{JournalFiles}).
    @ivar read_behind: the read-behind reader (L{ReadBehind}).
    """

    _log = Logger()

    #: Whether the read-behind reader is open: kept on each journal by its
    #: reader (an attribute, not a property: queues read it per add and remove).
    in_read_behind: bool = False

    def __init__(self, queue_path: str, queue_name: str, clock: IReactorTime,
                 sync_policy: float | None, *, archive_path: str | None = None,
                 fsync: Callable[[int], None] = os.fsync,
                 write: Callable[[int, bytes], int] = os.write,
                 run_in_thread: RunInThread = run_inline,
                 coalescer: WriteCoalescer | None = None,
                 on_fsync: FsyncObserver | None = None, file_mode: int = 0o600,
                 chores: Callable[[Chore], None] | None = None,
                 sync_turn: SyncTurn | None = None) -> None:
        self.queue_path = queue_path
        self.queue_name = queue_name
        self.archive_path = archive_path
        self._clock = clock
        self._policy = sync_policy
        self._os_write = write
        self._coalescer = coalescer
        self._on_fsync = on_fsync
        self._file_mode = file_mode
        self.files = JournalFiles(queue_path, queue_name, clock, fsync=fsync,
                                  archive_path=archive_path, file_mode=file_mode)
        self.in_read_behind = False
        self.read_behind = ReadBehind(self.files, self._read_behind_changed)
        if sync_policy is None:
            sync_turn = None
        # (under 0.0 the turn runs the current file's fsyncs, on this thread;
        # under a period it only ends the wait of the durable adds' records)
        reactor_fsync = sync_turn is not None and sync_policy is not None and sync_policy <= 0.0
        self._maintenance = Maintenance(self, self.files, run_in_thread, sync_policy, chores,
                                        writer_run=run_inline if reactor_fsync else None)
        self._sync_turn = sync_turn
        self._writer: Writer = CLOSED_WRITER
        self._replay = ReplayCursor()
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
        #: ADDX records skipped undecoded in read-behind (see L{replay_steps}).
        self.on_skipped_adds: Callable[[int, int], None] | None = None

    # -- state -------------------------------------------------------------

    @property
    def is_replaying(self) -> bool:
        """Whether L{replay} is running."""
        return self._replay.file is not None

    def _read_behind_changed(self, open_now: bool) -> None:
        self.in_read_behind = open_now

    @property
    def packing(self) -> bool:
        """Whether a pack is being written or put in place in a thread (a rewrite waits for it)."""
        return self._maintenance.packing

    @property
    def maintaining(self) -> bool:
        """Whether a rotation's fsyncs still run in a thread (no rotation or rewrite starts)."""
        return self._maintenance.busy

    @property
    def writer(self) -> Writer:
        """The current file's writer (the L{ClosedWriter} when none is open)."""
        return self._writer

    @writer.setter
    def writer(self, writer: Writer) -> None:
        self._writer = writer

    # -- writes (the hot path) ---------------------------------------------

    def add(self, item: QItem) -> Deferred[None] | None:
        """Journal an add of C{item} (ADDX)."""
        data = rec.encode_add(item.data, item.add_time_ms, item.expiry_ms)
        self.size += len(data)
        return self._writer.write(data)

    def add_unseen(self, item: QItem, waiter: Waiter | None = None) -> Deferred[None] | None:
        """
        Journal an add of C{item} (ADDX) that no reader sees before it is
        durable: with a C{sync_turn} (under 0.0 or a period) its bytes reach
        the OS at the end of the reactor turn, in one write with the turn's
        other such records (L{PeriodicSyncFile.write_unseen}, which tells
        C{waiter} if one is given).
        """
        data = rec.encode_add(item.data, item.add_time_ms, item.expiry_ms)
        self.size += len(data)
        return self._writer.write_unseen(data, waiter)

    def continue_(self, xid: int, item: QItem) -> Deferred[None] | None:
        """Journal a confirm of open read C{xid} together with an add of C{item} (CONTINUE)."""
        ops = self._head_ops
        if ops is not None:
            ops.append(xid * 4 + OP_CLOSE)
        data = rec.Continue(xid, item.data, item.add_time_ms, item.expiry_ms).encode()
        self.size += len(data)
        return self._writer.write(data)

    def remove(self) -> Deferred[None] | None:
        """Journal a remove of the head item (REMOVE)."""
        ops = self._head_ops
        if ops is not None:
            ops.append(OP_REMOVE)
        self.size += 1
        return self._writer.write(rec.REMOVE_BYTES)

    def remove_tentative(self, xid: int) -> Deferred[None] | None:
        """Journal an open read of the head item under C{xid} (REMOVE_TENTATIVE_XID)."""
        ops = self._head_ops
        if ops is not None:
            ops.append(xid * 4 + OP_OPEN)
        self.size += 5
        return self._writer.write(rec.encode_xid(_REMOVE_TENTATIVE_XID, xid))

    def unremove(self, xid: int) -> Deferred[None] | None:
        """Journal an aborted open read C{xid} (UNREMOVE)."""
        ops = self._head_ops
        if ops is not None:
            ops.append(xid * 4 + OP_UNREMOVE)
        self.size += 5
        return self._writer.write(rec.encode_xid(_UNREMOVE, xid))

    def confirm_remove(self, xid: int) -> Deferred[None] | None:
        """Journal a confirmed open read C{xid} (CONFIRM_REMOVE)."""
        ops = self._head_ops
        if ops is not None:
            ops.append(xid * 4 + OP_CLOSE)
        self.size += 5
        return self._writer.write(rec.encode_xid(_CONFIRM_REMOVE, xid))

    def after_written(self, f: Callable[..., object], *args: object) -> None:
        """
        Call C{f(*args)} once the records written so far are in the OS,
        outside any open write batch (see L{WriteCoalescer.after_flush});
        without a coalescer, at once.
        """
        coalescer = self._coalescer
        if coalescer is None or not coalescer.depth:  # (after_flush's own test, inlined)
            f(*args)
        else:
            coalescer.after_flush(f, *args)

    def writes_now(self) -> bool:
        """Whether no write batch is open: a record written now reaches the OS at once."""
        coalescer = self._coalescer
        return coalescer is None or not coalescer.depth

    # -- the checkpoint ------------------------------------------------------

    def set_checkpoint(self, filename: str, reserved_items: Iterable[QItem]) -> None:
        """Make rotated file C{filename} the checkpoint, unless one is pending."""
        if self.checkpoint is None:
            self.checkpoint = Checkpoint(filename, tuple(reserved_items))
            self._head_ops = array("q")

    def clear_checkpoint(self) -> None:
        """Give up the checkpoint (and the head operations logged since), if any."""
        self.checkpoint = None
        self._head_ops = None

    def head_ops_since_checkpoint(self) -> Sequence[int]:
        """The head operations journaled since the checkpoint, as C{xid * 4 + op}."""
        return self._head_ops if self._head_ops is not None else array("q")

    def archived_files(self) -> list[str]:
        """This queue's rotated files in replay order, first applying the pack rule."""
        return self.files.archived_files()

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
        replay. A CONFIRM_REMOVE, UNREMOVE or CONTINUE of an xid that no
        record opened is logged (one warning per replay, with the count and
        the first such xid).

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
        files = self.files
        os.makedirs(self.queue_path, exist_ok=True)
        with files.lock:
            # (a reload after a failure: a pack installed in a thread meanwhile
            # is either done or finds its ~~ file gone and gives up)
            self._maintenance.close_spare()
            files.forget_names()
            files.delete_temps()

        def damaged(names: Sequence[str], name: str, damage: Damage) -> None:
            files.set_aside(names, name, damage)
            self.damaged_replays += 1
            self.read_behind.stop()
            assert reset is not None
            reset()

        yield from replay_files(files, [*files.archived_files(), self.queue_name], apply,
                                cursor=self._replay, slice_bytes=slice_bytes,
                                count_adds=self.on_skipped_adds, behind=self.read_behind,
                                on_damage=None if reset is None else damaged,
                                set_size=self._set_size)
        self.archived_size = files.archived_size()
        self._writer = self.open_writer()
        self.size = self._writer.position

    def _set_size(self, size: int) -> None:
        self.size = size

    def open_writer(self, fd: int | None = None) -> PeriodicSyncFile:
        """The writer of C{<q>}: opened here, or C{fd} (open on C{<q>} for appending)."""
        maintenance = self._maintenance
        return PeriodicSyncFile(self.files.path(self.queue_name), self._clock, self._policy,
                                fsync=maintenance.writer_fsync,
                                run_in_thread=maintenance.writer_thread,
                                coalescer=self._coalescer, on_fsync=self._on_fsync,
                                on_error=self.writer_failed, write=self._os_write,
                                mode=self._file_mode, fd=fd, turn=self._sync_turn)

    def writer_failed(self, kind: str, error: OSError) -> None:
        """A write or fsync of a journal file failed: tell L{on_failure} (the queue)."""
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
        return self._maintenance.after(lambda: self._recover_now(kind, error))

    def _recover_now(self, kind: str, error: Exception) -> Deferred[int]:
        self._maintenance.epoch += 1
        self.read_behind.stop()
        self.clear_checkpoint()
        writer = self._writer
        if writer.closed:
            # Not open, or a recovery that failed before: finish cutting the file back.
            keep = self._pending_cut
            if keep is None:
                return succeed(0)
            try:
                self.files.cut_current(keep)
            except OSError as e:
                return fail(e)
            self._pending_cut = None
            return succeed(keep)
        self._writer = CLOSED_WRITER
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
                self.files.cut_current(keep)
            except OSError:
                self._pending_cut = keep
                result.errback()
                return
            result.callback(keep)

        done.addBoth(closed)
        return result

    def probe(self, xid_counter: int) -> Deferred[None]:
        """
        Check that the journal can be written again: append a harmless
        SAVE_XID(C{xid_counter}) and fsync it; fires when durable, fails if not.
        """
        data = rec.SaveXid(xid_counter).encode()
        self.size += len(data)
        d = self._writer.write(data)
        if d is not None:
            outcome = settled(d)
            if isinstance(outcome, Failure):
                return d
            d.addErrback(ignore_failure)
        return self._writer.sync()

    # -- maintenance ---------------------------------------------------------

    def rotate(self, reserved_items: Iterable[QItem], set_checkpoint: bool) -> None:
        """
        Move C{<q>} to a new C{<q>.<ms>} and start a fresh C{<q>}.

        The rename happens now and writes go to the new C{<q>} at once. The
        old file is fsynced, then the directory, through C{run_in_thread};
        the writes to the old file are acknowledged, and the new file is
        fsynced (so its writes are acknowledged), only once both fsyncs have
        ended. While they run, another rotation or a rewrite is skipped (the
        queue asks again on a later operation). A read-behind reader on
        C{<q>} follows the renamed file. With C{set_checkpoint}, and no
        checkpoint pending, remember the rotated file and C{reserved_items}
        (the open reads) as the checkpoint. A journal with no open current
        file is not rotated.
        """
        if self._skipped("rotation"):
            return
        self._maintenance.rotate(reserved_items, set_checkpoint)

    def _skipped(self, what: str, *, packing: bool = False) -> bool:
        """Whether C{what} cannot start now (logged): a rotation syncs, a pack runs, no file."""
        reason = ("a rotation is still syncing" if self._maintenance.busy
                  else "a pack is still being written" if packing and self._maintenance.packing
                  else "no current file is open" if self._writer.closed else None)
        if reason is None:
            return False
        self._log.debug("Journal {queue}: {what} skipped: {reason}", queue=self.queue_name,
                        what=what, reason=reason)
        return True

    def rewrite(self, reserved_items: Iterable[QItem], items: Iterable[QItem],
                xid_counter: int = 0) -> None:
        """
        Replace every journal file of the queue by one compact C{<q>}, with
        no write, rename or fsync of its files on this thread (all of them
        run through C{run_in_thread}).

        What replays afterwards: SAVE_XID(C{xid_counter}), then ADDX +
        REMOVE_TENTATIVE_XID for each open read in C{reserved_items} (in the
        order given), then ADDX for each of C{items}. Read-behind ends and
        any checkpoint is dropped: the queue must then hold every item in
        memory.

        An empty queue with no open reads and no rotated files or archive
        has an empty file renamed over C{<q>} and SAVE_XID(C{xid_counter})
        written to it; the old file is freed off this thread, and its writes
        are acknowledged once a directory fsync has made the replacement
        durable. A crash at any point replays to an empty queue (or, before
        the replacement is durable, to the old contents, as a crash just
        before the rewrite would).

        Any other queue is rewritten through a pack: a checkpoint still
        pending is given up, C{<q>} is rotated with a new checkpoint (as
        L{rotate} does), and a pack of the checkpoint holding exactly what
        the new file would hold is written, fsynced and put in place
        (L{start_pack}), which leaves it (C{<q>.<ms>}) and the new C{<q>} as
        the queue's only files. Until then the old files are still there,
        and a crash replays them, as a crash just before the rewrite would.

        During a rotation whose fsyncs still run, while a pack is being
        written, or with no current file open, the rewrite is skipped (the
        queue asks again later).
        """
        if self._skipped("rewrite", packing=True):
            return
        if not isinstance(reserved_items, (list, tuple)):
            reserved_items = list(reserved_items)
        if not isinstance(items, (list, tuple)):
            items = list(items)
        self._maintenance.rewrite(reserved_items, items, xid_counter)

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
        fsynced) and the pack rule puts it in place. Every one of these
        steps runs through C{run_in_thread} (the current file's fsync as its
        writer's fsyncs do). A pack that a rewrite, recovery or erase
        overtook is thrown away. L{close} waits for it.
        """
        self._maintenance.start_pack(checkpoint, open_items, queue_items, xid_counter)

    # -- read-behind ---------------------------------------------------------

    def start_read_behind(self) -> None:
        """
        Open the read-behind reader where the writer (or, during replay, the replayer) is.

        Outside replay the current file is fsynced first, as Kestrel does.
        """
        replay = self._replay
        if replay.file is not None:
            self.read_behind.start(replay.file, replay.pos)
            return
        self._writer.sync().addErrback(ignore_failure)
        self.read_behind.start(self.queue_name, self._writer.position)

    def fill_read_behind(self, got_item: Callable[[QItem], None],
                         got_checkpoint: Callable[[Checkpoint], None],
                         durable_only: bool = False) -> bool:
        """
        Read forward one record from the read-behind reader, as Kestrel's C{fillReadBehind}.

        An add or a continue calls C{got_item}; other records are skipped.
        At the end of a rotated file the reader moves to the next file (and
        calls C{got_checkpoint} if it just left the checkpoint file), then
        reads again. At the end of the current file it fsyncs and retries
        once. When the reader reaches the writer, read-behind ends.

        With C{durable_only} (outside replay), no record an fsync has not
        made durable yet is read: there the reader waits, and C{False} is
        returned (read again once the fsync succeeded). Otherwise C{True}.
        """
        replay = self._replay
        if replay.file is not None:
            return self.read_behind.fill(got_item, got_checkpoint, end=(replay.file, replay.pos),
                                         sync=None, checkpoint=self.checkpoint)
        writer = self._writer
        return self.read_behind.fill(
            got_item, got_checkpoint, end=(self.queue_name, writer.position),
            sync=self._sync_quietly, checkpoint=self.checkpoint,
            durable=writer.durable_position if durable_only else None)

    def _sync_quietly(self) -> None:
        self._writer.sync().addErrback(ignore_failure)

    # -- close, erase, discovery --------------------------------------------

    def close(self) -> Deferred[None]:
        """Stop read-behind, fsync and close the current file; fires when every file is closed."""
        if self.closed:
            return succeed(None)
        self.closed = True
        self.read_behind.stop()
        # (after a rotation's fsyncs: the current file's writes are acknowledged after them)
        return self._maintenance.after(self._close_now)

    def _close_now(self) -> Deferred[None]:
        maintenance = self._maintenance
        maintenance.track_close(self._writer.close())
        maintenance.drop_spare()
        pending = maintenance.pending()
        if not pending:
            return succeed(None)
        return gatherResults(pending, consumeErrors=True).addCallback(lambda _: None)

    def erase(self) -> None:
        """
        Close the journal and delete (or archive) every file of the queue.

        A pack being put in place in a thread is either discarded or, if it
        got there first, finished before the files are listed (both hold the
        files' lock), so nothing it renames outlives the erase.
        """
        self._maintenance.epoch += 1
        self.close()
        self.files.erase()
        self.size = 0
        self.archived_size = 0
        self.clear_checkpoint()

    @staticmethod
    def queue_names_in(path: str) -> set[str]:
        """The queues with journal files in C{path} (L{naming.queue_names_in})."""
        return naming.queue_names_in(path)

    @staticmethod
    def queue_sizes_in(path: str) -> dict[str, int]:
        """The bytes of journal of each queue in C{path} (L{naming.queue_sizes_in})."""
        return naming.queue_sizes_in(path)
