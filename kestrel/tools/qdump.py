"""
C{kestrel-qdump}: describe the contents of Kestrel journal files, as Kestrel's C{qdump.sh}.

The options are Kestrel's (C{-q}, C{-d}, C{-A}, C{-Q}), plus C{--help} and
C{--version}; with no file it is a usage error (status 1).

Output on stdout matches Kestrel 2.4's C{QDumper} byte for byte; the
"Reading journal" progress of C{-q} goes to stderr instead, so that stdout
stays clean when redirected. Item data is printed as raw bytes (Kestrel
printed it as ISO-8859-1, which is the same bytes). See C{docs/tools.md}.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Sequence
from typing import BinaryIO

from kestrel.item import QItem
from kestrel.journal import records as rec
from kestrel.journal.events import QueueEvents, event_applier
from kestrel.tools.journal_file import (
    JournalReadError,
    ToolParser,
    bytes_to_human,
    duration_to_text,
    iter_journal,
)

#: Progress is shown every time this many more bytes have been read (quiet mode).
PROGRESS_EVERY = 1024 * 1024


class QueueDumper:
    """
    Replays one journal file into an in-memory model and describes each operation.

    Only the named file is read: a file that starts after a rotation may remove
    items it never saw added; such operations are described and otherwise
    ignored (Kestrel's tool crashed on them).
    """

    def __init__(self, out: BinaryIO, err: BinaryIO, *, quiet: bool = False,
                 dump: bool = False, dump_raw: bool = False, dump_queue: bool = False,
                 now_ms: int | None = None) -> None:
        self.out = out
        self.err = err
        self.quiet = quiet or dump_raw or dump_queue
        self.dump = dump
        self.dump_raw = dump_raw
        self.dump_queue = dump_queue
        self.now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        self.offset = 0
        self.operations = 0
        self.current_xid = 0
        self.queue: deque[bytes] = deque()
        self.open_reads: dict[int, bytes | None] = {}
        self._apply = event_applier(_Describer(self), lambda: self.now_ms)

    def _verbose(self, text: str) -> None:
        if not self.quiet:
            self.out.write(text.encode("latin-1"))

    def dump_file(self, path: str) -> bool:
        """
        Describe the journal at C{path}; return whether it was read to its end.

        Problems are reported on stderr with Kestrel's messages.
        """
        try:
            stream = open(path, "rb")
        except OSError:
            self.err.write(f"Can't open journal file: {path}\n".encode())
            return False
        last_display = 0
        shown_progress = False
        try:
            with stream:
                for _offset, record, size in iter_journal(stream):
                    self.operations += 1
                    self._describe(record)
                    self.offset += size
                    if (self.quiet and not self.dump_raw
                            and self.offset - last_display > PROGRESS_EVERY):
                        progress = f"\rReading journal: {bytes_to_human(self.offset):<6}"
                        self.err.write(progress.encode())
                        self.err.flush()
                        shown_progress = True
                        last_display = self.offset
        except (JournalReadError, OSError) as e:
            self.out.flush()
            if shown_progress:
                self.err.write(b"\n")
            self.err.write(f"Exception reading journal file: {path}\n".encode())
            self.err.write(f"    {type(e).__name__}: {e}\n".encode())
            return False
        if shown_progress:
            self.err.write(b"\r" + b" " * 30 + b"\r")
        if not self.dump_raw:
            self.out.write(b"\r" + b" " * 30 + b"\n")
            total_items = len(self.queue) + len(self.open_reads)
            total_bytes = (sum(len(d) for d in self.queue)
                           + sum(len(d) for d in self.open_reads.values() if d))
            self.out.write(f"Journal size: {self.offset} bytes, with {self.operations} "
                           f"operations.\n".encode())
            self.out.write(f"{total_items} items totalling {total_bytes} bytes.\n".encode())
        if self.dump_queue:
            for data in self.queue:
                self.out.write(data + b"\n")
        return True

    def _describe_add(self, word: str, data: bytes, expiry_ms: int, xid: int) -> None:
        if not self.quiet:
            line = f"{word} {len(data):<6d}"
            if xid > 0:
                line += f" xid={xid}"
            if expiry_ms:
                left = expiry_ms - self.now_ms
                line += " expired" if left < 0 else f" exp={duration_to_text(left)}"
            self._verbose(line + "\n")
        if self.dump:
            self.out.write(b"    " + data + b"\n")
        elif self.dump_raw:
            self.out.write(data)

    def _describe(self, record: rec.Record) -> None:
        self._verbose(f"{self.offset & 0xFFFFFFFF:08x}  ")
        self._apply(record)


class _Describer(QueueEvents):
    """Describes each queue event of the dumped file and keeps its in-memory model."""

    def __init__(self, dumper: QueueDumper) -> None:
        self.d = dumper

    def added(self, item: QItem, xid: int) -> None:
        """ADD line; the item joins the tail."""
        self.d._describe_add("ADD", item.data, item.expiry_ms, xid)
        self.d.queue.append(item.data)

    def removed(self) -> None:
        """REM line; the head goes."""
        d = self.d
        d._verbose("REM\n")
        if d.queue:
            d.queue.popleft()

    def opened(self, xid: int | None) -> None:
        """RSV line; the head is held under the xid."""
        d = self.d
        if not xid:
            d.current_xid = xid = rec.next_xid(d.current_xid, d.open_reads)
        d.open_reads[xid] = d.queue.popleft() if d.queue else None
        d._verbose(f"RSV {xid}\n")

    def xid_saved(self, xid: int) -> None:
        """XID line."""
        self.d._verbose(f"XID {xid}\n")
        self.d.current_xid = xid

    def unremoved(self, xid: int) -> None:
        """CAN line; the held item goes back to the head."""
        d = self.d
        data = d.open_reads.pop(xid, None)
        if data is not None:
            d.queue.appendleft(data)
        d._verbose(f"CAN {xid}\n")

    def confirmed(self, xid: int) -> None:
        """ACK line."""
        self.d._verbose(f"ACK {xid}\n")
        self.d.open_reads.pop(xid, None)

    def continued(self, xid: int, item: QItem) -> None:
        """CON line: the held item goes, the new one joins the tail."""
        d = self.d
        d._describe_add("CON", item.data, item.expiry_ms, 0)
        d.open_reads.pop(xid, None)
        d.queue.append(item.data)


def main(argv: Sequence[str] | None = None, stdout: BinaryIO | None = None,
         stderr: BinaryIO | None = None, now_ms: int | None = None) -> int:
    """
    Run C{kestrel-qdump} with C{argv} (default: the command line); return the exit status.

    0 when every file was read to its end (or for C{--help}, C{--version}), 1 otherwise
    (a file that cannot be read, or a usage error).
    """
    out = stdout if stdout is not None else sys.stdout.buffer
    err = stderr if stderr is not None else sys.stderr.buffer
    parser = ToolParser("kestrel-qdump", "Describe the contents of Kestrel journal files.",
                        out, err)
    parser.add_argument("-q", dest="quiet", action="store_true",
                        help="quiet: don't describe every operation, just the summary")
    parser.add_argument("-d", dest="dump", action="store_true",
                        help="dump the contents of added items")
    parser.add_argument("-A", dest="dump_raw", action="store_true",
                        help="dump only the raw contents of added items")
    parser.add_argument("-Q", dest="dump_queue", action="store_true",
                        help="dump only the raw queue state (the items still in the queue)")
    parser.add_argument("files", nargs="+", metavar="JOURNAL_FILE",
                        help="journal files, each described on its own")
    args = parser.parse(sys.argv[1:] if argv is None else argv)
    if isinstance(args, int):
        return args
    dump, dump_raw, dump_queue = args.dump, args.dump_raw, args.dump_queue
    quiet = args.quiet or dump_raw or dump_queue
    filenames: list[str] = args.files
    status = 0
    for filename in filenames:
        if not quiet:
            out.write(f"Queue: {filename}\n".encode())
        dumper = QueueDumper(out, err, quiet=quiet, dump=dump, dump_raw=dump_raw,
                             dump_queue=dump_queue, now_ms=now_ms)
        if not dumper.dump_file(filename):
            status = 1
        out.flush()
    return status


if __name__ == "__main__":
    sys.exit(main())
