"""
Replay: read every journal file of a queue, oldest first, and hand each record on.

L{replay_files} is a generator, so that a caller can replay a slice at a time
and give the thread back to the reactor between slices. It decodes with the
one record decoder (L{kestrel.journal.records.read_record}), but for the
fields of an ADDX record, which it reads itself (nearly every record is
one, and the call per record was a fifth of a replay's work); a run of ADDX
records beyond memory (read-behind reads them again later) is only measured
(L{kestrel.journal.records.skip_adds}). It cuts off the torn tail of the
current file, reports damage in a rotated file to its caller, and warns of
confirms and aborts of reads that no record opened, the one sign of damage
the format gives.
"""

from __future__ import annotations

import errno
import gc
import mmap
import os
from collections.abc import Callable, Generator, Sequence

from twisted.logger import Logger

from kestrel.journal import records as rec
from kestrel.journal.events import legacy_item
from kestrel.journal.files import JournalFiles
from kestrel.journal.readbehind import ReadBehind

#: Replay logs its progress every time it has read this many more bytes of a file.
PROGRESS_BYTES = 64 * 1024 * 1024

#: A replay slice of records only measured (read-behind) is this many times
#: longer than one of records decoded.
SKIP_SLICE_FACTOR = 32

#: A sliced replay gives back the pages of the file it has read every this many bytes.
RELEASE_BYTES = 8 * 1024 * 1024

Damage = tuple[int, str]
"""Where a rotated file is damaged, and how: C{(offset, problem)}."""

_log = Logger(namespace="kestrel.journal.replay")


class ReplayCursor:
    """
    Where a replay stands: the file it reads (C{None} when no replay runs)
    and the offset just past the last record it handed on. Read-behind that
    starts during replay starts there.
    """

    __slots__ = ("file", "pos")

    def __init__(self) -> None:
        self.file: str | None = None
        self.pos = 0


class OpenXids:
    """
    The xids that replayed records opened and did not close yet, and the
    closes (CONFIRM_REMOVE, UNREMOVE, CONTINUE) of xids that none opened.

    A Kestrel 1.x REMOVE_TENTATIVE opens a read without an xid (the replayer
    numbers it): one close of an unknown xid is taken to be its close.
    """

    __slots__ = ("_open", "_unnumbered", "unknown", "first_unknown")

    def __init__(self) -> None:
        self._open: set[int] = set()
        self._unnumbered = 0
        #: How many closes named an xid that no record opened.
        self.unknown = 0
        #: The first such xid (C{None} if there was none).
        self.first_unknown: int | None = None

    def see(self, record: rec.Record) -> None:
        """Note what C{record} (any record but an ADDX) does to the open xids."""
        if isinstance(record, rec.RemoveTentativeXid):
            self._open.add(record.xid)
        elif isinstance(record, (rec.ConfirmRemove, rec.Unremove, rec.Continue)):
            xid = record.xid
            if xid in self._open:
                self._open.remove(xid)
            elif self._unnumbered:
                self._unnumbered -= 1
            else:
                self.unknown += 1
                if self.first_unknown is None:
                    self.first_unknown = xid
        elif isinstance(record, rec.RemoveTentative):
            self._unnumbered += 1


def replay_files(files: JournalFiles, names: Sequence[str], apply: Callable[[rec.Record], None],
                 *, cursor: ReplayCursor, slice_bytes: int | None,
                 count_adds: Callable[[int, int], None] | None,
                 behind: ReadBehind,
                 on_damage: Callable[[Sequence[str], str, Damage], None] | None,
                 set_size: Callable[[int], None]) -> Generator[int, None, None]:
    """
    Hand every record of the files C{names} (in order; the last is the
    current file) to C{apply}, pausing (yielding the offset reached) after
    about every C{slice_bytes} bytes of records and between files.

    While C{behind} reads (its reader is open) and C{count_adds} is given, runs of
    ADDX records are measured, not decoded, and passed on as
    C{count_adds(items, data_bytes)}. A legacy ADD is handed on as an
    L{rec.Add} stamped with the time of replay. C{set_size} is told the
    bytes of whole records of each file as it is read (0 when it starts).

    A corrupt or truncated record in the current file (the torn tail a crash
    leaves), or in any file without C{on_damage}, is cut off with a warning.
    A corrupt record in a rotated file, given C{on_damage}, is left as it is
    and reported as C{on_damage(names_up_to_it, name, (offset, problem))};
    replay goes on with the next file. The cyclic garbage collector is off
    while records are applied (replay makes long-lived objects only: it
    would walk them again and again for nothing), as the caller left it
    between slices. Closed early, the generator stops where it is.
    """
    xids = OpenXids()
    collecting = gc.isenabled()
    gc.disable()
    try:
        for index, name in enumerate(names):
            current = index == len(names) - 1
            steps = _replay_one(files, name, apply, xids, cursor,
                                truncate=on_damage is None or current,
                                count_adds=count_adds, behind=behind,
                                slice_bytes=slice_bytes, set_size=set_size)
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
            if damage is not None and on_damage is not None:
                on_damage(names[:index + 1], name, damage)
                xids = OpenXids()
            if not current:
                if collecting:
                    gc.enable()
                yield 0
                collecting = gc.isenabled()
                gc.disable()
    finally:
        cursor.file = None
        if collecting:
            gc.enable()
    if xids.unknown:
        _log.warn("Journal {queue}: replay met {count} confirms or aborts of reads that no "
                  "record opened (the first: xid {xid}); the journal may be damaged or "
                  "incomplete", queue=files.queue_name, count=xids.unknown,
                  xid=xids.first_unknown)


def _replay_one(files: JournalFiles, name: str, apply: Callable[[rec.Record], None],
                xids: OpenXids, cursor: ReplayCursor, *, truncate: bool,
                count_adds: Callable[[int, int], None] | None,
                behind: ReadBehind, slice_bytes: int | None,
                set_size: Callable[[int], None]) -> Generator[int, None, Damage | None]:
    """
    Replay one file, pausing after each C{slice_bytes}; the generator
    returns C{(offset, problem)} if the file is damaged and not cut
    (C{truncate} false), else C{None}.
    """
    try:
        fd = os.open(files.path(name), os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        _log.info("No journal file {file} for {queue}", queue=files.queue_name, file=name)
        return None
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        _log.warn("Journal {queue}: {file} is a symbolic link; not followed, not read",
                  queue=files.queue_name, file=name)
        return None
    try:
        length = os.fstat(fd).st_size
        buf = mmap.mmap(fd, length, access=mmap.ACCESS_READ) if length else b""
    finally:
        os.close(fd)
    cursor.file = name
    cursor.pos = 0
    set_size(0)
    started = files.clock.seconds()
    try:
        end, problem = yield from _replay_records(
            buf, length, name, files, apply, xids, cursor, count_adds, behind,
            slice_bytes)
    finally:
        if isinstance(buf, mmap.mmap):
            buf.close()
    set_size(end)
    if problem is not None and truncate:
        files.truncate(name, end, length, problem)
    _log.info("Replayed {queue} file {file}: {bytes} bytes in {seconds:.3f}s",
              queue=files.queue_name, file=name, bytes=end,
              seconds=files.clock.seconds() - started)
    return None if problem is None or truncate else (end, problem)


def _replay_records(buf: mmap.mmap | bytes, end: int, name: str, files: JournalFiles,
                    apply: Callable[[rec.Record], None], xids: OpenXids, cursor: ReplayCursor,
                    count_adds: Callable[[int, int], None] | None,
                    behind: ReadBehind,
                    slice_bytes: int | None) -> Generator[int, None, tuple[int, str | None]]:
    """
    Apply every whole record of C{buf}, pausing (yielding the offset) after
    each C{slice_bytes}; the generator returns where decoding stopped and why.
    """
    pos = 0
    # A record may end past the slice's limit: the limit only says when to pause.
    limit = end if slice_bytes is None else min(end, slice_bytes)
    release = (slice_bytes is not None and isinstance(buf, mmap.mmap)
               and hasattr(mmap, "MADV_DONTNEED"))
    released = 0
    next_report = PROGRESS_BYTES
    read_record = rec.read_record
    unpack_addx = rec.ADDX_BODY.unpack_from
    add = rec.Add
    legacy = rec.LegacyAdd
    see = xids.see
    try:
        while True:
            while pos < limit:
                if count_adds is not None and behind.reader is not None and buf[pos] == 2:
                    # Measuring is many times cheaper than decoding: a longer slice.
                    skipped = rec.skip_adds(buf, pos, end if slice_bytes is None else
                                            min(end, pos + SKIP_SLICE_FACTOR * slice_bytes))
                    if skipped.records:
                        pos = cursor.pos = skipped.end
                        count_adds(skipped.records, skipped.data_bytes)
                        if pos >= next_report:
                            next_report = pos + PROGRESS_BYTES
                            _progress(files, name, pos, end)
                        continue
                record: rec.Record | None = None
                if buf[pos] == 2 and pos + 21 <= end:
                    # An ADDX, as nearly every record is: its fields read here
                    # (read_record's first case) save a call and a tuple per record.
                    size, add_ms, exp_ms = unpack_addx(buf, pos + 1)
                    nxt = pos + 5 + size
                    if size >= 16 and nxt <= end:
                        record = add(buf[pos + 21:nxt], add_ms, exp_ms)
                if record is None:
                    got = read_record(buf, pos)
                    if got is None:
                        return pos, "truncated record"
                    record, nxt = got
                    if type(record) is not add:
                        if isinstance(record, legacy):
                            item = legacy_item(record, files.now_ms())
                            record = add(item.data, item.add_time_ms, item.expiry_ms)
                        else:
                            see(record)
                cursor.pos = nxt
                apply(record)
                pos = nxt
                if pos >= next_report:
                    next_report = pos + PROGRESS_BYTES
                    _progress(files, name, pos, end)
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


def _progress(files: JournalFiles, name: str, pos: int, end: int) -> None:
    _log.info("Replaying {queue} file {file}: {bytes} of {total} bytes",
              queue=files.queue_name, file=name, bytes=pos, total=end)

