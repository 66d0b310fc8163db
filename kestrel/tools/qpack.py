"""
C{kestrel-qpack}: pack journal files into one compact journal, as Kestrel's C{qpack.sh}.

The options are Kestrel's (C{-f FILE}, C{-q} accepted and ignored), plus
C{--help} and C{--version}; missing C{-f} or files is a usage error (status 1).

The given files are replayed in order with two cursors (Kestrel's
C{JournalPacker}): a remover that walks every operation and an adder that
yields the added items only when a removal or the final write needs them, so
memory holds only open reads and unremoved items, never the queue.

The new journal holds C{SAVE_XID} first, then C{ADDX} + C{REMOVE_TENTATIVE_XID}
for each read still open (ascending xid), then C{ADDX} for every item
still queued, in queue order. Unlike Kestrel's tool, C{CONTINUE} records are
understood. The file is written beside the target under a C{~~} name, fsynced
and renamed into place, so an interrupted run never leaves half a journal.
Stdout matches Kestrel's tool; the "Packing:" progress goes to stderr.
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import BinaryIO

from kestrel.item import QItem
from kestrel.journal import records as rec
from kestrel.journal.events import QueueEvents, event_applier, item_of
from kestrel.tools.journal_file import (
    JournalReadError,
    ToolParser,
    bytes_to_human,
    iter_journal,
)

#: Progress is reported each time a cursor has moved this many more bytes.
PROGRESS_EVERY = 1024 * 1024

#: An item as the packer keeps it: (data, add time ms, expiry ms).
PackItem = tuple[bytes, int, int]


class PackError(Exception):
    """The journals cannot be packed: a file is missing, corrupt, or inconsistent."""


class _Cursor:
    """One pass over the records of several journal files, in order."""

    def __init__(self, paths: Sequence[str]) -> None:
        self.paths = paths
        self.offset = 0
        self._iter = self._walk()

    def _walk(self) -> Iterator[tuple[rec.Record, int]]:
        for path in self.paths:
            try:
                stream = open(path, "rb")
            except OSError as e:
                raise PackError(f"Can't open journal file: {path}") from e
            with stream:
                try:
                    for _offset, record, size in iter_journal(stream):
                        yield record, size
                except (JournalReadError, OSError) as e:
                    raise PackError(f"Exception reading journal file: {path}\n"
                                    f"    {type(e).__name__}: {e}") from e

    def __iter__(self) -> Iterator[tuple[rec.Record, int]]:
        return self

    def __next__(self) -> tuple[rec.Record, int]:
        record, size = next(self._iter)
        self.offset += size
        return record, size


class JournalPacker:
    """
    Computes the queue state at the end of a sequence of journal files and writes it compactly.

    C{progress(remover_bytes, adder_bytes)} is called every megabyte of either
    cursor, and once with C{(0, 0)} when writing starts.
    """

    def __init__(self, paths: Sequence[str], new_path: str, *, now_ms: int | None = None,
                 progress: Callable[[int, int], None] | None = None,
                 fsync: Callable[[int], None] = os.fsync) -> None:
        self.paths = list(paths)
        self.new_path = new_path
        self.now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        self.progress = progress or (lambda a, b: None)
        self.fsync = fsync
        self._adder = _Cursor(self.paths)
        self._adder_stack: deque[PackItem] = deque()
        self._last_adder_update = 0
        self.open_reads: dict[int, PackItem] = {}
        self.current_xid = 0
        self.highest_xid = 0
        self._remover_offset = 0

    def _item_of(self, record: rec.Record) -> PackItem | None:
        item = item_of(record, self._now)
        return None if item is None else (item.data, item.add_time_ms, item.expiry_ms)

    def _now(self) -> int:
        return self.now_ms

    def _advance_adder(self) -> PackItem | None:
        if self._adder_stack:
            return self._adder_stack.popleft()
        for record, _size in self._adder:
            if self._adder.offset - self._last_adder_update > PROGRESS_EVERY:
                self.progress(self._remover_offset, self._adder.offset)
                self._last_adder_update = self._adder.offset
            item = self._item_of(record)
            if item is not None:
                return item
        return None

    def _take(self, what: str) -> PackItem:
        item = self._advance_adder()
        if item is None:
            raise PackError(f"Inconsistent journal: {what} with no item in the queue "
                            f"(at byte {self._remover_offset} of the journals)")
        return item

    def _replay(self) -> None:
        remover = _Cursor(self.paths)
        apply = event_applier(_Remover(self), self._now)
        last_update = 0
        for record, _size in remover:
            apply(record)
            self._remover_offset = remover.offset
            if remover.offset - last_update > PROGRESS_EVERY:
                self.progress(remover.offset, self._adder.offset)
                last_update = remover.offset

    def pack(self) -> int:
        """
        Replay the journals and write the packed one; return its size in bytes.

        @raise PackError: nothing is written to C{new_path} then.
        """
        self._replay()
        self.progress(0, 0)
        tmp_path = f"{self.new_path}~~{os.getpid()}"
        size = 0
        try:
            with open(tmp_path, "wb") as out:
                def write(chunk: bytes) -> None:
                    nonlocal size
                    out.write(chunk)
                    size += len(chunk)

                write(rec.SaveXid(max(self.current_xid, self.highest_xid)).encode())
                for xid in sorted(self.open_reads):
                    data, add_ms, exp_ms = self.open_reads[xid]
                    write(rec.encode_add(data, add_ms, exp_ms))
                    write(rec.RemoveTentativeXid(xid).encode())
                while (item := self._advance_adder()) is not None:
                    write(rec.encode_add(*item))
                out.flush()
                self.fsync(out.fileno())
            os.replace(tmp_path, self.new_path)
        except BaseException:
            if os.path.exists(tmp_path):
                os.unlink(tmp_path)
            raise
        _fsync_directory(os.path.dirname(os.path.abspath(self.new_path)), self.fsync)
        return size


class _Remover(QueueEvents):
    """
    The remover's pass: removes and opens take items from the adder's pass
    (adds are read there, so they are ignored here), aborts give them back.
    """

    def __init__(self, packer: JournalPacker) -> None:
        self.p = packer

    def removed(self) -> None:
        """The head item is gone."""
        self.p._take("REMOVE")

    def opened(self, xid: int | None) -> None:
        """The head item is held under the xid (numbered by the counter if none)."""
        p = self.p
        if not xid:
            p.current_xid = xid = rec.next_xid(p.current_xid, p.open_reads)
        p.highest_xid = max(p.highest_xid, xid)
        p.open_reads[xid] = p._take(f"REMOVE_TENTATIVE {xid}")

    def xid_saved(self, xid: int) -> None:
        """The counter stood at C{xid}."""
        p = self.p
        p.current_xid = xid
        p.highest_xid = max(p.highest_xid, xid)

    def unremoved(self, xid: int) -> None:
        """The held item goes back to the head; an unknown xid is an inconsistent journal."""
        item = self.p.open_reads.pop(xid, None)
        if item is None:
            raise PackError(f"Inconsistent journal: UNREMOVE of unknown xid {xid}")
        self.p._adder_stack.appendleft(item)

    def confirmed(self, xid: int) -> None:
        """The held item is gone."""
        self.p.open_reads.pop(xid, None)

    def continued(self, xid: int, item: QItem) -> None:
        """The held item is gone; the new item reaches the queue through the adder's pass."""
        self.p.open_reads.pop(xid, None)


def _fsync_directory(path: str, fsync: Callable[[int], None]) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        fsync(fd)
    finally:
        os.close(fd)


def main(argv: Sequence[str] | None = None, stdout: BinaryIO | None = None,
         stderr: BinaryIO | None = None, now_ms: int | None = None) -> int:
    """
    Run C{kestrel-qpack} with C{argv} (default: the command line); return the exit status.

    0 on success (or for C{--help}, C{--version}), 1 when the journals could not be
    packed or on a usage error.
    """
    out = stdout if stdout is not None else sys.stdout.buffer
    err = stderr if stderr is not None else sys.stderr.buffer
    parser = ToolParser("kestrel-qpack",
                        "Pack one or more Kestrel journal files, in order, into a single new "
                        "one holding only the open reads and the items still queued.",
                        out, err)
    parser.add_argument("-f", dest="new_file", required=True, metavar="FILE",
                        help="the new packed journal file (written under a temporary name, "
                        "then renamed into place)")
    parser.add_argument("-q", dest="quiet", action="store_true",
                        help="accepted for Kestrel's command lines; has no effect")
    parser.add_argument("files", nargs="+", metavar="JOURNAL_FILE",
                        help="journal files, oldest first")
    args = parser.parse(sys.argv[1:] if argv is None else argv)
    if isinstance(args, int):
        return args
    filenames: list[str] = args.files
    new_filename: str = args.new_file

    out.write(b"Packing journals...\n")
    out.flush()

    shown_progress = False

    def progress(remover_bytes: int, adder_bytes: int) -> None:
        nonlocal shown_progress
        if remover_bytes == 0 and adder_bytes == 0:
            if shown_progress:
                err.write(b"\r" + b" " * 40 + b"\r")
                err.flush()
            out.write(b"\rWriting new journal..." + b" " * 40 + b"\n")
            out.flush()
        else:
            text = (f"\rPacking: {bytes_to_human(remover_bytes):<6} "
                    f"{bytes_to_human(adder_bytes):<6}")
            err.write(text.encode())
            err.flush()
            shown_progress = True

    packer = JournalPacker(filenames, new_filename, now_ms=now_ms, progress=progress)
    try:
        size = packer.pack()
    except (PackError, OSError) as e:
        out.flush()
        prefix = "\n" if shown_progress else ""  # end the progress line first
        err.write(f"{prefix}{e}\n".encode())
        return 1
    out.write(b"\r" + b" " * 40 + b"\n")
    out.write(f"Done. New journal size: {size}\n".encode())
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
