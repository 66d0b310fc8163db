"""
Read-behind: reading a queue's items back from its journal files, Kestrel's
C{fillReadBehind}.

When a queue holds more than its memory allows, further adds stay on disk
only; a reader then follows the journal, one record at a time, from where
the writer (or the replayer) stood when read-behind started, through every
later file, until it catches up with the writer. Items come out through
L{kestrel.journal.events.item_of}, the one place that says which records
add an item.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from twisted.logger import Logger

from kestrel.item import QItem
from kestrel.journal import records as rec
from kestrel.journal.events import item_of
from kestrel.journal.files import JournalFiles
from kestrel.journal.pack import Checkpoint
from kestrel.journal.writer import Writer

#: How much the read-behind reader reads from a file at a time.
READ_CHUNK = 256 * 1024


class _Reader:
    """Reads records one at a time from a journal file that may still be growing."""

    def __init__(self, path: str, position: int) -> None:
        self._fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        self.position = position
        self._buf = b""
        self._off = 0

    def read(self, limit: int | None = None) -> rec.Record | None:
        """
        Return the next complete record, or C{None} at the end of the file
        (or of its first C{limit} bytes).

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
            size = max(READ_CHUNK, held)
            if limit is not None:
                size = min(size, limit - self.position - held)
                if size <= 0:
                    return None
            chunk = os.pread(self._fd, size, self.position + held)
            if not chunk:
                return None
            self._buf = self._buf[self._off:] + chunk
            self._off = 0

    def close(self) -> None:
        """Close the file."""
        os.close(self._fd)


class ReadBehind:
    """
    The read-behind reader of one queue's journal files.

    @ivar reader: the open reader, or C{None} when the queue is not in read-behind.
    @ivar file: the file the reader reads (C{None} with no reader).
    @ivar rotating: the file a rotation renamed and its writer, while the
        rotation's fsyncs run (what of it is durable is that writer's
        C{durable_position}); C{None} otherwise.
    """

    _log = Logger()

    def __init__(self, files: JournalFiles, changed: Callable[[bool], object]) -> None:
        """
        @param changed: told C{True} when a reader opens (read-behind starts,
            or moves on to the next file) and C{False} when it closes.
        """
        self._files = files
        self._changed = changed
        self.reader: _Reader | None = None
        self.file: str | None = None
        self.rotating: tuple[str, Writer] | None = None

    def start(self, name: str, position: int) -> None:
        """Open the reader on file C{name} at C{position} (closing any open one)."""
        self.stop()
        self._open(name, position)
        self._log.debug("Journal {queue}: read-behind starts at {file} offset {offset}",
                        queue=self._files.queue_name, file=name, offset=position)

    def stop(self) -> None:
        """Close the reader, if open: read-behind ends."""
        if self.reader is not None:
            self.reader.close()
        self.reader = None
        self.file = None
        self._changed(False)

    def _open(self, name: str, position: int) -> None:
        """Open the reader on file C{name} at C{position} (none is open)."""
        self.reader = _Reader(self._files.path(name), position)
        self.file = name
        self._changed(True)

    def renamed(self, old: str, new: str) -> None:
        """File C{old} was renamed C{new} (a rotation): a reader on it follows."""
        if self.file == old:
            self.file = new

    def fill(self, got_item: Callable[[QItem], None],
             got_checkpoint: Callable[[Checkpoint], None], *, end: tuple[str, int],
             sync: Callable[[], None] | None, checkpoint: Checkpoint | None,
             durable: int | None = None) -> bool:
        """
        Read forward one record, as Kestrel's C{fillReadBehind}.

        An add or a continue calls C{got_item}; other records are skipped.
        At the end of a rotated file the reader moves to the next file (and
        calls C{got_checkpoint} if it just left C{checkpoint}'s file), then
        reads again. At the end of the current file it calls C{sync} (the
        writer's fsync; C{None} during replay) and retries once. When the
        reader reaches C{end} (the file and offset of the writer, or of the
        replayer), read-behind ends.

        With C{durable} (the current file's durable bytes), no record beyond
        what an fsync made durable is read, in the current file nor in one a
        rotation renamed while its fsyncs run: at that point the reader
        stays (no C{sync}) and C{False} is returned. Otherwise C{True}.
        """
        reader = self.reader
        if reader is None:
            return True
        name, pos = end
        reader_file = self.file
        if reader.position == pos and reader_file == name:
            self.stop()
            return True
        limit = durable
        if limit is not None and reader_file != self._files.queue_name:
            rotating = self.rotating
            # (a file renamed by a rotation whose fsyncs run: what they made durable;
            # any other older file is durable whole)
            limit = (rotating[1].durable_position
                     if rotating is not None and rotating[0] == reader_file else None)
        record = self._read_one(reader, reader_file, limit)
        if record is None and limit is not None:
            return False  # (the rest is not durable yet: no sync, no next file)
        if record is None and reader_file == self._files.queue_name and sync is not None:
            sync()
            record = self._read_one(reader, reader_file)
        if record is None:
            return self._next_file(got_item, got_checkpoint, end, sync, checkpoint, durable)
        item = item_of(record, self._files.now_ms)
        if item is not None:
            got_item(item)
        return True

    def _read_one(self, reader: _Reader, name: str | None,
                  limit: int | None = None) -> rec.Record | None:
        try:
            return reader.read(limit)
        except rec.CorruptRecord as e:
            self._log.warn("Journal {queue} file {file}: read-behind found {problem} at "
                           "offset {offset}; skipping the rest of the file",
                           queue=self._files.queue_name, file=name, problem=e.reason,
                           offset=reader.position)
            return None

    def _next_file(self, got_item: Callable[[QItem], None],
                   got_checkpoint: Callable[[Checkpoint], None], end: tuple[str, int],
                   sync: Callable[[], None] | None, checkpoint: Checkpoint | None,
                   durable: int | None) -> bool:
        old = self.file
        assert old is not None
        queue = self._files.queue_name
        following = self._files.file_after(old)
        self.stop()
        if following is None:
            self._log.warn("Journal {queue}: read-behind reached the end of {file} with no "
                           "file after it; leaving read-behind", queue=queue, file=old)
            return True
        self._open(following, 0)
        self._log.info("Journal {queue}: read-behind moves from {old} to {file}",
                       queue=queue, old=old, file=following)
        if checkpoint is not None and checkpoint.filename == old:
            got_checkpoint(checkpoint)
        return self.fill(got_item, got_checkpoint, end=end, sync=sync, checkpoint=checkpoint,
                         durable=durable)
