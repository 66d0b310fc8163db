"""
Maintenance: the steps that change which files hold a queue's journal --
rotation, rewrite (an empty one with a spare file, any other through a pack)
and pack -- each with one code path.

Every blocking step (an fsync, a pack's write, putting a pack in place,
freeing a replaced file) runs through the journal's runner
(L{kestrel.journal.runner.RunInThread}): the server's thread pool, or the
L{kestrel.journal.runner.InlineRunner} of tests and tools, which runs it at
once. Only when the Deferreds fire differs.

While a rotation's (or an empty rewrite's) own fsyncs run, the fsyncs of
the new current file wait (L{Maintenance.writer_thread}), so that nothing
written after the swap is acknowledged before the swap is durable.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, TypeVar

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from kestrel.item import QItem
from kestrel.journal import records as rec
from kestrel.journal.chores import Chore
from kestrel.journal.files import JournalFiles, Notes
from kestrel.journal.naming import PACK_SUFFIX
from kestrel.journal.pack import Checkpoint, dump_records, pack_layout
from kestrel.journal.readbehind import ReadBehind
from kestrel.journal.runner import RunInThread
from kestrel.journal.syncfile import PeriodicSyncFile
from kestrel.journal.writer import Writer, ignore_failure

_T = TypeVar("_T")


class MaintainedJournal(Protocol):
    """What L{Maintenance} reads and changes of the journal it maintains."""

    size: int
    archived_size: int
    checkpoint: Checkpoint | None
    closed: bool
    read_behind: ReadBehind

    @property
    def writer(self) -> Writer:
        """The current file's writer."""
        ...

    @writer.setter
    def writer(self, writer: Writer) -> None: ...

    def head_ops_since_checkpoint(self) -> Sequence[int]:
        """The head operations journaled since the checkpoint (see L{pack_layout})."""
        ...

    def set_checkpoint(self, filename: str, reserved_items: Iterable[QItem]) -> None:
        """Make C{filename} the checkpoint (if none is pending), with its open reads."""
        ...

    def clear_checkpoint(self) -> None:
        """Give up the checkpoint, if any."""
        ...

    def open_writer(self, fd: int | None = None) -> PeriodicSyncFile:
        """Open a writer on C{<q>} (or on C{fd}, open on it for appending)."""
        ...

    def writer_failed(self, kind: str, error: OSError) -> None:
        """Report a failed fsync of a journal file to the queue."""
        ...


class Maintenance:
    """
    Rotation, rewrite and pack of one journal, and the wiring of its writer
    to them (L{writer_fsync}, L{writer_thread}).

    @ivar epoch: bumped by a rewrite, a recovery and an erase: a pack or a
        spare started before is stale.
    """

    _log = Logger()

    def __init__(self, journal: MaintainedJournal, files: JournalFiles, run: RunInThread,
                 sync_policy: float | None, chores: Callable[[Chore], None] | None,
                 writer_run: RunInThread | None = None) -> None:
        self._journal = journal
        self._files = files
        self._run = run
        # Where the current file's own fsyncs run (the journal's runner unless told).
        self._writer_run = run if writer_run is None else writer_run
        self._policy = sync_policy
        self._chores = chores
        self.epoch = 0
        # The fsyncs of a rotation (or an empty rewrite) still running: while
        # they do, the current file's fsyncs wait in _gated.
        self._busy: Deferred[None] | None = None
        self._gated: list[tuple[Callable[[], Any], Deferred[Any]]] = []
        # The descriptor whose next fsync, on the thread that set it, is
        # skipped: a file a thread has just fsynced, now being closed.
        self._presynced: tuple[int, int] | None = None
        # Closes of old files and packs still running (close() waits for them).
        self._closing: list[Deferred[None]] = []
        self._packs: list[Deferred[None]] = []
        # An empty <q>~~<ms> (its name and a descriptor open on it for
        # appending) made off this thread after the last empty rewrite, for
        # the next one to rename over <q> (see _rewrite_empty). Set and taken
        # under the files' lock.
        self._spare: tuple[str, int] | None = None

    @property
    def busy(self) -> bool:
        """Whether a rotation's (or empty rewrite's) fsyncs still run: none starts meanwhile."""
        return self._busy is not None

    @property
    def packing(self) -> bool:
        """Whether a pack is being written or put in place (a rewrite waits for it)."""
        return bool(self._packs)

    # -- the writer's wiring -------------------------------------------------------

    def writer_fsync(self, fd: int) -> None:
        """The current files' fsync: the files', except the one close of a file just fsynced."""
        presynced = self._presynced
        if presynced is not None and presynced == (fd, threading.get_ident()):
            self._presynced = None
            return
        self._files.fsync(fd)

    def writer_thread(self, job: Callable[[], _T]) -> Deferred[_T]:
        """The current files' runner: held back while a rotation's fsyncs run."""
        if self._busy is None:
            return self._writer_run(job)
        d: Deferred[_T] = Deferred()
        self._gated.append((job, d))
        return d

    def _release_gated(self) -> None:
        gated, self._gated = self._gated, []
        for job, d in gated:
            self._writer_run(job).chainDeferred(d)

    def after(self, f: Callable[[], Deferred[_T]]) -> Deferred[_T]:
        """Call C{f} now, or once no rotation is in progress; fire with its result."""
        busy = self._busy
        if busy is None:
            return f()
        d: Deferred[_T] = Deferred()

        def run(_: object) -> None:
            self.after(f).chainDeferred(d)

        busy.addBoth(run)
        return d

    def track_close(self, d: Deferred[None]) -> None:
        """Remember the close C{d} of an old file until it ends (L{pending} lists it)."""
        d.addErrback(ignore_failure)
        if not d.called:
            self._closing.append(d)
            d.addBoth(self._forget, self._closing, d)

    @staticmethod
    def _forget(result: object, running: list[Deferred[None]], d: Deferred[None]) -> object:
        if d in running:
            running.remove(d)
        return result

    def pending(self) -> list[Deferred[None]]:
        """The closes of old files and the packs still running."""
        return [*self._closing, *self._packs]

    def _close_presynced(self, writer: Writer) -> Callable[..., None]:
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
        self.track_close(d)
        return fire

    # -- rotation ------------------------------------------------------------------

    def rotate(self, reserved_items: Iterable[QItem], set_checkpoint: bool) -> None:
        """
        Rename the current file C{<q>} to a new C{<q>.<ms>} and open a fresh C{<q>}.

        The rename happens now and writes go to the new C{<q>} at once. The
        old file is fsynced, then the directory, through the runner; the
        writes to the old file are acknowledged, and the new file is
        fsynced (so its writes are acknowledged), only once both fsyncs have
        ended. A read-behind reader on C{<q>} follows the renamed file. With
        C{set_checkpoint}, the rotated file and C{reserved_items} (the open
        reads) become the checkpoint, unless one is pending. The caller
        checked that the writer is open and nothing is L{busy}.
        """
        journal = self._journal
        files = self._files
        old = journal.writer
        old.flush()
        rotated = files.unique_rotated_name()
        os.rename(files.path(files.queue_name), files.path(rotated))
        new = journal.open_writer()
        journal.size = 0
        journal.archived_size += old.position
        fd = old.fileno()

        def sync_both() -> None:
            files.fsync(fd)
            files.fsync_dir()

        done = self._run(sync_both)
        self._busy = done
        journal.writer = new
        journal.read_behind.renamed(files.queue_name, rotated)
        journal.read_behind.rotating = (rotated, old)
        if set_checkpoint:
            journal.set_checkpoint(rotated, reserved_items)
        done.addBoth(self._rotation_synced, old, rotated)

    def _rotation_synced(self, result: object, old: Writer, rotated: str) -> None:
        """The fsyncs of a rotation ended: acknowledge the old file's writes, let the new sync."""
        self._busy = None
        queue = self._files.queue_name
        # (settled: a read-behind reader reads it whole again; after a failure
        # nothing is read before the recovery reloads memory)
        self._journal.read_behind.rotating = None
        if isinstance(result, Failure):
            error = result.value
            self._log.error("Journal {queue}: fsync after rotating to {file} failed: {error}",
                            queue=queue, file=rotated, error=error)
            if not isinstance(error, Exception):
                error = OSError(str(error))
            old.abandon(error).addErrback(ignore_failure)
            if isinstance(result.value, OSError):
                self._journal.writer_failed("fsync", result.value)
        else:
            self._close_presynced(old)()
            self._log.info("Journal {queue}: rotated to {file}", queue=queue, file=rotated)
        self._release_gated()

    # -- rewrite -------------------------------------------------------------------

    def rewrite(self, reserved_items: Sequence[QItem], items: Sequence[QItem],
                xid_counter: int) -> None:
        """
        Replace every journal file by one compact C{<q>} (see
        L{kestrel.journal.journal.FileJournal.rewrite}): an empty queue
        without rotated files or archive by L{_rewrite_empty}, any other
        through a rotation with a new checkpoint and a pack of it. The caller
        checked that the writer is open, nothing is L{busy} and no pack runs.
        """
        journal = self._journal
        files = self._files
        if (not reserved_items and not items and files.archive_path is None
                and files.without_rotated()):
            self._rewrite_empty(xid_counter)
            return
        # A checkpoint still pending (its reader never got past it) is given
        # up: no pack of it is being written, and the rewrite's own pack
        # replaces every file up to a newer checkpoint.
        journal.clear_checkpoint()
        journal.read_behind.stop()
        self.rotate(reserved_items, True)
        checkpoint = journal.checkpoint
        assert checkpoint is not None
        self._log.info("Journal {queue}: rewriting through a pack of {file}",
                       queue=files.queue_name, file=checkpoint.filename)
        # Nothing was taken from the head since the checkpoint: the pack holds
        # the open reads, then every item, as the rewritten file would.
        self.start_pack(checkpoint, reserved_items, items, xid_counter)

    def _rewrite_empty(self, xid_counter: int) -> None:
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
        given chores, the old descriptor goes to them with the making of
        the next spare, and nothing comes back to this thread. A power loss
        may undo the rewrite, and the old file then replays, as any write
        under that policy may be undone. Under any other policy (or without
        chores) one runner job fsyncs the directory, closes the old file and
        makes the spare; until it ends the new file's fsyncs wait, as after
        a rotation; then the old file's writes are acknowledged (what they
        did is cut: the queue is empty), or failed if the directory fsync
        failed. SAVE_XID is made durable by the sync policy, as any write.
        """
        journal = self._journal
        files = self._files
        old = journal.writer
        self.epoch += 1
        journal.read_behind.stop()
        journal.clear_checkpoint()
        old.flush()
        current = files.path(files.queue_name)
        with files.lock:
            spare, self._spare = self._spare, None
        if spare is not None:
            try:
                os.rename(files.path(spare[0]), current)
            except FileNotFoundError:
                os.close(spare[1])  # (deleted by hand: make one)
                spare = None
        if spare is None:
            spare = files.create_temp(os.O_APPEND)
            try:
                os.rename(files.path(spare[0]), current)
            except BaseException:
                os.close(spare[1])
                with contextlib.suppress(OSError):
                    os.unlink(files.path(spare[0]))
                raise
        epoch = self.epoch
        chores = self._chores
        if (chores is not None and self._policy is None
                and (handed := old.hand_over()) is not None):
            chores(lambda: self._free_then_make_spare(handed, epoch))
        else:
            self._free_in_thread(old, epoch)
        journal.writer = new = journal.open_writer(spare[1])
        written = new.write(rec.SaveXid(xid_counter).encode())
        if written is not None:
            written.addErrback(ignore_failure)
        journal.size = new.position
        journal.archived_size = 0  # (there were no rotated files)
        # (debug: routine, up to every default_journal_size bytes of a busy
        # queue, and a log line is among this rewrite's costlier steps on the
        # reactor thread; the queue's journal_rewrites stat counts them)
        self._log.debug("Journal {queue}: rewritten (empty)", queue=files.queue_name)

    def _free_in_thread(self, old: Writer, epoch: int) -> None:
        """
        Close C{old} on this thread without an fsync, keeping a duplicate of
        its descriptor for one runner job that fsyncs the directory (not
        under C{never}, which fsyncs nothing), closes the duplicate (freeing
        the old file there) and makes the next spare. Until the job ends the
        new file's fsyncs wait; then C{old}'s writes are acknowledged, or
        failed with the directory fsync (L{_replacement_synced}).
        """
        keep = os.dup(old.fileno())
        acknowledge = self._close_presynced(old)
        files = self._files
        sync_directory = self._policy is not None

        def sync_directory_then_free() -> None:
            try:
                if sync_directory:
                    files.fsync_dir()
            finally:
                os.close(keep)
            self._make_spare(epoch)

        done = self._run(sync_directory_then_free)
        self._busy = done
        done.addBoth(self._replacement_synced, acknowledge)

    def _free_then_make_spare(self, fd: int, epoch: int) -> None:
        """The chore of an empty rewrite under C{never}: close the old file, make the next spare."""
        try:
            os.close(fd)
        finally:
            self._make_spare(epoch)

    def _replacement_synced(self, result: object, acknowledge: Callable[..., None]) -> None:
        """
        The runner job of an empty rewrite ended (the directory fsynced, the
        old file freed): acknowledge the old file's writes, or fail them and
        report the failure, and let the new file sync.
        """
        self._busy = None
        if isinstance(result, Failure):
            self._log.error("Journal {queue}: fsync after an empty rewrite failed: {error}",
                            queue=self._files.queue_name, error=result.value)
            acknowledge(result)
            if isinstance(result.value, OSError):
                self._journal.writer_failed("fsync", result.value)
        else:
            acknowledge()
        self._release_gated()

    def _make_spare(self, epoch: int) -> None:
        """
        Off the reactor thread, after an empty rewrite: make and open the
        empty C{<q>~~<ms>} the next one renames over C{<q>}, so that creating
        and opening it costs the reactor thread nothing. Nothing is made if
        the journal was closed, erased or rewritten since C{epoch} (all of
        which take the files' lock, as this does, to drop a spare, so none
        outlives them), or if it cannot be made (logged; the next rewrite
        then makes its own).
        """
        files = self._files
        with files.lock:
            if self.epoch != epoch or self._journal.closed or self._spare is not None:
                return
            try:
                self._spare = files.create_temp(os.O_APPEND)
            except OSError as e:
                self._log.warn("Journal {queue}: no spare file for the next rewrite: {error}",
                               queue=files.queue_name, error=e)

    def close_spare(self) -> str | None:
        """Forget the spare (the caller holds the files' lock); return its name, if any."""
        spare, self._spare = self._spare, None
        if spare is None:
            return None
        os.close(spare[1])
        return spare[0]

    def drop_spare(self) -> None:
        """Close and delete the spare kept for the next empty rewrite, if any."""
        with self._files.lock:
            name = self.close_spare()
        if name is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._files.path(name))

    # -- pack ----------------------------------------------------------------------

    def start_pack(self, checkpoint: Checkpoint, open_items: Iterable[QItem],
                   queue_items: Iterable[QItem], xid_counter: int) -> None:
        """
        Pack every file up to C{checkpoint.filename} into one (see
        L{kestrel.journal.journal.FileJournal.start_pack}): written to a
        C{~~} file and fsynced, then the current file fsynced, the pack
        renamed C{<checkpoint>.pack} (directory fsynced) and the pack rule
        applied (L{_install_pack}), every step through the runner.
        """
        journal = self._journal
        files = self._files
        if not os.path.lexists(files.path(checkpoint.filename)):
            self._log.warn("Journal {queue}: checkpoint file {file} is gone; not packing",
                           queue=files.queue_name, file=checkpoint.filename)
            if journal.checkpoint is checkpoint:
                journal.clear_checkpoint()
            return
        slots, rest = pack_layout(journal.head_ops_since_checkpoint(),
                                  checkpoint.reserved_items, list(open_items), list(queue_items))
        self._log.info("Journal {queue}: packing files up to {file}", queue=files.queue_name,
                       file=checkpoint.filename)
        parts = dump_records(xid_counter, checkpoint.reserved_items, slots, rest, files.now_ms())
        epoch = self.epoch
        written: list[str] = []
        d = self._run(lambda: files.write_temp(parts))
        d.addCallback(self._sync_then_finish_pack, checkpoint, epoch, written)
        d.addErrback(self._pack_failed, checkpoint, written)
        self._packs.append(d)
        d.addBoth(self._forget, self._packs, d)

    def _sync_then_finish_pack(self, temp: tuple[str, int], checkpoint: Checkpoint,
                               epoch: int, written: list[str]) -> Deferred[None]:
        written.append(temp[0])
        writer = self._journal.writer
        if writer.closed:
            # Closing fsynced the current file already.
            return self._finish_pack(temp[0], checkpoint, epoch)
        d = writer.sync()
        d.addCallback(lambda _: self._finish_pack(temp[0], checkpoint, epoch))
        return d

    def _finish_pack(self, name: str, checkpoint: Checkpoint, epoch: int) -> Deferred[None]:
        """
        Put the written pack C{name} in place (L{_install_pack}) through the
        runner, unless a rewrite or erase overtook it; the Deferred fires
        once it is in place (or discarded).
        """
        notes: Notes = []
        d = self._run(lambda: self._install_pack(name, checkpoint, epoch, notes))
        d.addBoth(self._log_notes_then, notes)
        d.addCallback(self._pack_installed, checkpoint)
        return d

    def _log_notes_then(self, result: _T, notes: Notes) -> _T:
        self._files.log_notes(notes)
        return result

    def _install_pack(self, name: str, checkpoint: Checkpoint, epoch: int,
                      notes: Notes) -> bool:
        """
        Rename the fsynced pack C{name} to C{<checkpoint>.pack}, fsync the
        directory, and apply the pack rule (dispose of the files it replaces,
        fsync the directory, rename it C{<checkpoint>}, fsync the directory);
        return C{True}. A pack overtaken by a rewrite, a recovery or an erase
        (or whose checkpoint file is gone) is deleted instead: C{False}.

        Runs through the runner (on a thread of the server's): it holds the
        files' lock, reads L{epoch} (bumped on the reactor thread before
        anything there changes the files) and touches no other state; what
        it did goes to C{notes}, logged on the reactor thread.
        """
        files = self._files
        with files.lock:
            if epoch != self.epoch or not os.path.lexists(files.path(checkpoint.filename)):
                notes.append(("Journal {queue}: pack {file} overtaken; discarded",
                              {"file": name}))
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(files.path(name))
                return False
            os.rename(files.path(name), files.path(checkpoint.filename + PACK_SUFFIX))
            files.fsync_dir()
            files.apply_pack_rule(notes)
            return True

    def _pack_installed(self, installed: bool, checkpoint: Checkpoint) -> None:
        """On the reactor thread, once the pack is in place (or discarded): sizes, checkpoint."""
        if not installed:
            return
        journal = self._journal
        journal.archived_size = self._files.archived_size()
        if journal.checkpoint is checkpoint:
            journal.clear_checkpoint()
        self._log.info("Journal {queue}: packed files up to {file}",
                       queue=self._files.queue_name, file=checkpoint.filename)

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
        queue = self._files.queue_name
        if failure.check(OSError) is not None:
            self._log.error("Journal {queue}: packing up to {file} failed: {error}; the "
                            "files stay as they are", queue=queue,
                            file=checkpoint.filename, error=failure.value)
        else:
            self._log.failure("Journal {queue}: packing up to {file} failed", failure=failure,
                              queue=queue, file=checkpoint.filename)
        if self._journal.checkpoint is checkpoint:
            self._journal.clear_checkpoint()
        for name in written:
            with contextlib.suppress(OSError):
                os.unlink(self._files.path(name))
