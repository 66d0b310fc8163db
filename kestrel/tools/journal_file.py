"""
Streaming access to one journal file for the offline tools, Kestrel's human
sizes, and the command-line parser the journal tools share.

The tools read journals far larger than memory, so records are decoded from a
sliding buffer filled in chunks; only the record being decoded is held whole.
The codec itself is L{kestrel.journal.records}.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from typing import Any, BinaryIO, NoReturn

from kestrel import __version__
from kestrel.journal import records as rec

#: How much of a journal file is read at a time.
CHUNK_SIZE = 1024 * 1024

KILOBYTE = 1024
MEGABYTE = 1024 * KILOBYTE
GIGABYTE = 1024 * MEGABYTE


class JournalReadError(Exception):
    """
    A journal file could not be read to its end: a corrupt or truncated record.

    @ivar offset: where the broken record starts in the file.
    @ivar reason: a short explanation.
    """

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"{reason} at offset {offset}")
        self.offset = offset
        self.reason = reason


def iter_journal(stream: BinaryIO, chunk_size: int = CHUNK_SIZE
                 ) -> Iterator[tuple[int, rec.Record, int]]:
    """
    Yield C{(offset, record, size)} for every record of an open journal file, in order.

    Memory use is bounded by C{chunk_size} plus the largest record.

    @raise JournalReadError: at a corrupt record, or when the file ends inside
        a record (every record before it has been yielded).
    """
    buf = bytearray()
    base = 0
    pos = 0
    while True:
        try:
            got = rec.read_record(buf, pos)
        except rec.CorruptRecord as e:
            raise JournalReadError(base + e.offset, e.reason) from None
        if got is None:
            chunk = stream.read(chunk_size)
            if not chunk:
                if pos < len(buf):
                    raise JournalReadError(base + pos, "truncated record")
                return
            del buf[:pos]
            base += pos
            pos = 0
            buf += chunk
            continue
        record, nxt = got
        yield base + pos, record, nxt - pos
        pos = nxt


def bytes_to_human(size: int, min_divisor: int = 0) -> str:
    """
    Format a byte count as Kestrel's tools do: C{"0"}, C{"12.5K"}, C{"1.0M"}, C{"120G"}.

    The unit switches at 95% of the next one; one decimal is shown below 100,
    rounded half up.
    """
    if size == 0 and min_divisor == 0:
        return "0"
    if size >= GIGABYTE * 95 // 100 or min_divisor == GIGABYTE:
        divisor, unit = GIGABYTE, "G"
    elif size >= MEGABYTE * 95 // 100 or min_divisor == MEGABYTE:
        divisor, unit = MEGABYTE, "M"
    else:
        divisor, unit = KILOBYTE, "K"
    dot = ((size % divisor) * 20 + divisor) // (2 * divisor)
    base = (size - size % divisor) // divisor
    if dot >= 10:
        base += 1
        dot -= 10
    return f"{base}.{dot}{unit}" if base < 100 else f"{base}{unit}"


_DURATION_UNITS = (
    ("days", 86_400_000), ("hours", 3_600_000), ("minutes", 60_000),
    ("seconds", 1000), ("milliseconds", 1),
)


def duration_to_text(ms: int) -> str:
    """
    Format a duration in milliseconds as Kestrel's qdump printed one.

    That is Twitter util's C{Duration.toString}: C{"1.hours+2.minutes+3.seconds+4.milliseconds"},
    zero parts left out, C{"0.seconds"} for zero.
    """
    if ms == 0:
        return "0.seconds"
    parts: list[str] = []
    rest = ms
    for name, unit in _DURATION_UNITS:
        value = int(rest / unit)  # truncates toward zero, as Java's TimeUnit.convert
        if value:
            rest -= value * unit
            if value > 0 and parts:
                parts.append("+")
            parts.append(f"{value}.{name}")
    return "".join(parts)


class ToolParser(argparse.ArgumentParser):
    """
    The command line of a journal tool, printing to given binary streams.

    C{--help} and C{--version} print on C{out} (status 0); a usage error prints
    the usage line and the problem on C{err} (status 1, as C{kestrel-load}).
    L{parse} returns the parsed arguments or that exit status, never exits.
    """

    def __init__(self, prog: str, description: str, out: BinaryIO, err: BinaryIO,
                 **kwargs: Any) -> None:
        super().__init__(prog=prog, description=description, **kwargs)
        self._out = out
        self._err = err
        self.add_argument("--version", action="version",
                          version=f"%(prog)s (txkestrel) {__version__}")

    def _print_message(self, message: str, file: object = None) -> None:
        if message:
            stream = self._err if file is sys.stderr else self._out
            stream.write(message.encode())
            stream.flush()

    def error(self, message: str) -> NoReturn:
        """Print the usage and the problem on stderr, then exit 1."""
        self.print_usage(sys.stderr)
        self.exit(1, f"{self.prog}: error: {message}\n")

    def parse(self, argv: Sequence[str]) -> argparse.Namespace | int:
        """The parsed C{argv} (options and files in any order), or the exit status to return."""
        try:
            return self.parse_intermixed_args(list(argv))
        except SystemExit as done:
            return done.code if isinstance(done.code, int) else 1
