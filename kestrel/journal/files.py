"""
JournalFiles: one queue's journal files on disk, and every change made to them
outside the current file's appends.

The files (see docs/journal.md): C{<q>} (current), C{<q>.<ms>} (rotated,
replayed in ascending timestamp order before C{<q>}), C{<q>~~<ms>} (being
written by a rewrite or pack, or the empty spare of the next empty rewrite)
and C{<q>.<ms>.pack} (a finished pack, which replaces every rotated file up to
its timestamp: the "pack rule"). Every rename here is followed by an fsync of
the directory and every new file is fsynced before it is renamed into place,
so a crash at any point leaves files that replay to the same queue. Dead
files are deleted, or moved into C{archive_path} when one is set.

Whatever runs on a thread (the pack rule, disposal) touches no state but the
files and appends what it did to a list of notes, logged on the reactor
thread (L{JournalFiles.log_notes}).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterable, Sequence

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from kestrel.journal import naming
from kestrel.journal.naming import PACK_SUFFIX, TEMP_INFIX

Notes = list[tuple[str, dict[str, object]]]
"""Log lines (format, fields) of work done on a thread, logged on the reactor thread."""


class JournalFiles:
    """
    The journal files of queue C{queue_name} in folder C{queue_path}: their
    listing (as replay reads them), the pack rule, new names and temporary
    files, disposal into an archive, setting damaged files aside and cutting
    a file back.

    @ivar lock: held while the pack rule runs or files are erased (a pack
        being put in place in a thread, replay, erase, the spare of an empty
        rewrite): never two at once.
    """

    _log = Logger()

    def __init__(self, queue_path: str, queue_name: str, clock: IReactorTime, *,
                 fsync: Callable[[int], None] = os.fsync, archive_path: str | None = None,
                 file_mode: int = 0o600) -> None:
        self.queue_path = queue_path
        self.queue_name = queue_name
        self.archive_path = archive_path
        self.fsync = fsync
        self.clock = clock
        self._file_mode = file_mode
        self.lock = threading.Lock()
        # Above every timestamp in this queue's file names, once known (see
        # unique_rotated_name); None: read the folder.
        self._name_floor: int | None = None
        # True once a listing found no rotated or pack file, until the next
        # such file is named (unique_rotated_name) or forget_names().
        self._known_without_rotated = False

    def path(self, name: str) -> str:
        """The path of file C{name} of the queue folder."""
        return os.path.join(self.queue_path, name)

    def now_ms(self) -> int:
        """The clock's time in epoch milliseconds."""
        return int(self.clock.seconds() * 1000)

    def log_notes(self, notes: Notes) -> None:
        """Log what work on a thread appended to C{notes} (call it on the reactor thread)."""
        for text, fields in notes:
            self._log.info(text, queue=self.queue_name, **fields)

    # -- listing and the pack rule -------------------------------------------

    def names(self) -> list[str]:
        """Every name in the queue folder (none if it is missing)."""
        return naming.list_names(self.queue_path)

    def timed(self, names: Iterable[str]) -> list[tuple[int, bool, str]]:
        """Return C{(timestamp, is_pack, name)} of this queue's rotated and pack files, sorted."""
        return naming.timed_files(self.queue_name, names)

    def archived_files(self) -> list[str]:
        """
        Return this queue's rotated files in replay order, first applying the pack rule.

        The pack rule: a C{<q>.<ms>.pack} file holds everything of the rotated
        files with a timestamp up to C{ms}; those are disposed of and the
        pack is renamed C{<q>.<ms>}. It runs on the calling thread (replay,
        offline tools), holding L{lock}, so never at the same time as a pack
        being put in place in a thread.
        """
        notes: Notes = []
        try:
            with self.lock:
                return self.apply_pack_rule(notes)
        finally:
            self.log_notes(notes)

    def apply_pack_rule(self, notes: Notes) -> list[str]:
        """
        Apply the pack rule on disk (see L{archived_files}) and return the
        rotated files in replay order; the caller holds L{lock}. What it did
        is appended to C{notes}. Safe on any thread.
        """
        while True:
            timed = self.timed(self.names())
            packs = [t for t in timed if t[1]]
            if not packs:
                return [name for _, _, name in timed]
            ts, _, pack_name = packs[0]
            doomed = [name for t, is_pack, name in timed if t <= ts and not is_pack]
            notes.append(("Journal {queue}: pack {file} replaces {doomed}",
                          {"file": pack_name, "doomed": doomed}))
            self.dispose(doomed, notes)
            os.rename(self.path(pack_name), self.path(pack_name[:-len(PACK_SUFFIX)]))
            self.fsync_dir()

    def listed(self) -> list[str]:
        """
        This queue's rotated files in replay order, as the pack rule would
        leave them, without applying it (L{naming.packed_order}): a pack not
        in place yet stands under its C{.pack} name for the files it replaces.

        Read-behind and the sizes use this listing while the journal serves,
        so that no listing renames, deletes or fsyncs anything on the reactor
        thread. The files it lists from a file newer than every pack on are
        the same before, during and after a pack's install.
        """
        return naming.packed_order(self.timed(self.names()))

    def without_rotated(self) -> bool:
        """
        Whether the queue has no rotated or pack file: listed the first time,
        then known until this object names one (L{unique_rotated_name}), so
        that the empty rewrite of a queue that never rotates reads nothing of
        the folder on the calling thread.
        """
        if not self._known_without_rotated:
            self._known_without_rotated = not self.listed()
        return self._known_without_rotated

    def file_after(self, name: str) -> str | None:
        """The file replay reads after C{name} (the current file last), or C{None}."""
        files = [*self.listed(), self.queue_name]
        try:
            return files[files.index(name) + 1]
        except (ValueError, IndexError):
            return None

    def archived_size(self) -> int:
        """The bytes in the rotated files (as L{listed} lists them)."""
        total = 0
        for name in self.listed():
            try:
                total += os.path.getsize(self.path(name))
            except FileNotFoundError:
                pass
        return total

    def unique_rotated_name(self, suffix: str = "") -> str:
        """
        Return a new C{<q>.<ms><suffix>} whose timestamp sorts after every existing file.

        The folder is read the first time (and after L{forget_names}) only:
        the journal makes every later file of its queue, so it knows their
        timestamps. A rotation then reads nothing of the folder on the
        calling thread, where a lookup could wait for the file system to
        commit a thread's renames (3 ms at times: docs/performance.md).
        """
        self._known_without_rotated = False
        floor = self._name_floor
        if floor is None:
            floor = naming.free_rotated_timestamp(self.queue_path, self.queue_name,
                                                  self.now_ms())
        else:
            floor = max(floor, self.now_ms())
        self._name_floor = floor + 1
        return f"{self.queue_name}.{floor}{suffix}"

    def forget_names(self) -> None:
        """Read the folder again before the next new name (replay: files may have changed)."""
        self._name_floor = None
        self._known_without_rotated = False

    # -- new files ---------------------------------------------------------------

    def opener(self, path: str, flags: int) -> int:
        """Open C{path} for C{open()} without following a symbolic link, in the journal mode."""
        return os.open(path, flags | os.O_NOFOLLOW, self._file_mode)

    def create_temp(self, flags: int = 0) -> tuple[str, int]:
        """
        Create a new, empty C{<q>~~<ms>} file; return its name and a
        descriptor open on it for writing (with C{flags} too, e.g. C{O_APPEND}).
        """
        ts = self.now_ms()
        while True:
            name = f"{self.queue_name}{TEMP_INFIX}{ts}"
            try:
                return name, self.opener(self.path(name),
                                         os.O_WRONLY | os.O_CREAT | os.O_EXCL | flags)
            except FileExistsError:
                ts += 1

    def write_temp(self, parts: Iterable[bytes]) -> tuple[str, int]:
        """Write C{parts} to a new C{<q>~~<ms>} file and fsync it; return its name and size."""
        name, fd = self.create_temp()
        try:
            with os.fdopen(fd, "wb", buffering=1024 * 1024) as f:
                for part in parts:
                    f.write(part)
                f.flush()
                self.fsync(f.fileno())
                return name, f.tell()
        except BaseException:
            # (a full disk, say): the old files stay as they are.
            with contextlib.suppress(OSError):
                os.unlink(self.path(name))
            raise

    def delete_temps(self) -> None:
        """Delete every C{~~} file of the queue (unfinished work of a run that ended)."""
        temps = [n for n in self.names() if n.startswith(self.queue_name + TEMP_INFIX)]
        for name in temps:
            self._log.info("Journal {queue}: deleting unfinished {file}",
                           queue=self.queue_name, file=name)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path(name))
        if temps:
            self.fsync_dir()

    # -- directories, disposal, archive -----------------------------------------

    def fsync_dir(self, path: str | None = None) -> None:
        """Fsync directory C{path} (by default the queue folder)."""
        fd = os.open(self.queue_path if path is None else path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            self.fsync(fd)
        finally:
            os.close(fd)

    def dispose(self, names: Sequence[str], notes: Notes | None = None) -> None:
        """
        Delete dead files, or move them into the archive when one is set;
        the directory is fsynced after. What was done is appended to
        C{notes} (for the caller to log on the reactor thread), or logged
        now without them.
        """
        if not names:
            return
        told: Notes = [] if notes is None else notes
        if self.archive_path is None:
            for name in names:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path(name))
                told.append(("Journal {queue}: deleted {file}", {"file": name}))
            self.fsync_dir()
        else:
            for name in names:
                self._archive(name, told)
        if notes is None:
            self.log_notes(told)

    def _archive(self, name: str, notes: Notes) -> None:
        """Move file C{name} into the archive without ever losing it (L{naming.archive_file})."""
        archive = self.archive_path
        assert archive is not None
        target = naming.archive_file(self.queue_path, self.queue_name, name, archive,
                                     self.now_ms(), self.fsync, self.fsync_dir)
        if target is not None:
            notes.append(("Journal {queue}: archived {file} as {target}",
                          {"file": name, "target": target}))

    def erase(self) -> None:
        """Delete (or archive) every file of the queue, C{~~} files included (holds L{lock})."""
        with self.lock:
            names = self.names()
            temps = [n for n in names if n.startswith(self.queue_name + TEMP_INFIX)]
            for name in temps:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path(name))
            files = [name for _, _, name in self.timed(names)]
            if self.queue_name in names:
                files.append(self.queue_name)
            self.dispose(files)
            if temps and not files:
                self.fsync_dir()

    # -- damage and cut-back -----------------------------------------------------

    def set_aside(self, names: Sequence[str], damaged: str, damage: tuple[int, str]) -> None:
        """
        Move C{names} (the damaged rotated file C{damaged} and those before
        it) untouched into a new folder C{<q>.damaged.<ms>}, and log why.
        """
        folder = f"{self.queue_name}.damaged.{self.now_ms()}"
        os.makedirs(self.path(folder), mode=0o700, exist_ok=True)
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                os.rename(self.path(name), os.path.join(self.path(folder), name))
        self.fsync_dir(self.path(folder))
        self.fsync_dir()
        offset, problem = damage
        self._log.error(
            "Journal {queue}: {problem} at offset {offset} of rotated file {file}. So that no "
            "consumed item comes back, the queue keeps only what the files after it hold; "
            "{files} moved to {folder} for inspection. ITEMS ADDED BEFORE THE DAMAGE ARE NOT "
            "IN THE QUEUE.", queue=self.queue_name, problem=problem, offset=offset,
            file=damaged, files=list(names), folder=self.path(folder))

    def truncate(self, name: str, offset: int, length: int, problem: str) -> None:
        """Cut file C{name} (C{length} bytes) off at C{offset}, where replay found C{problem}."""
        self._log.warn(
            "Journal {queue} file {file}: {problem} at offset {offset}; cutting off "
            "{dropped} bytes. DATA MAY HAVE BEEN LOST.",
            queue=self.queue_name, file=name, offset=offset, dropped=length - offset,
            problem=problem)
        try:
            fd = os.open(self.path(name), os.O_WRONLY | os.O_NOFOLLOW)
            try:
                os.ftruncate(fd, offset)
                self.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            self._log.error("Journal {queue}: could not truncate {file}: {error}",
                            queue=self.queue_name, file=name, error=e)

    def cut_current(self, keep: int) -> None:
        """
        Truncate C{<q>} to C{keep} bytes (if longer) and fsync it.

        @raise OSError: the cut-back or the fsync failed.
        """
        try:
            fd = os.open(self.path(self.queue_name), os.O_WRONLY | os.O_NOFOLLOW)
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
            self.fsync(fd)
        finally:
            os.close(fd)
