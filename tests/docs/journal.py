"""
C{kestrel-docs-journal FILE OP...}: write a journal file for a documentation example.

Each OP is one record: C{add:DATA} (an item added at a fixed time, no
expiry), C{remove}, C{open:XID} (a read opened), C{confirm:XID},
C{abort:XID}. Missing folders are created. Hidden doctest setup uses it to give
an example real journals.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from kestrel.journal import records as rec

#: The add time of every item (2026-01-01T00:00:00Z), so that output is stable.
ADD_TIME_MS = 1_767_225_600_000


def record(op: str) -> rec.Record:
    """The record an OP word stands for; ValueError if it is not one."""
    word, _, arg = op.partition(":")
    if word == "add":
        return rec.Add(arg.encode(), ADD_TIME_MS)
    if word == "remove" and not arg:
        return rec.Remove()
    makers = {"open": rec.RemoveTentativeXid, "confirm": rec.ConfirmRemove,
              "abort": rec.Unremove}
    if word in makers and arg.isdigit():
        return makers[word](int(arg))
    raise ValueError(f"not a journal op: {op!r}")


def main(argv: Sequence[str]) -> int:
    """Write the records of C{argv[1:]} to the file C{argv[0]} (replacing it)."""
    if not argv:
        print("usage: kestrel-docs-journal FILE OP...", file=sys.stderr)
        return 1
    path, *ops = argv
    data = b"".join(record(op).encode() for op in ops)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "wb") as out:
        out.write(data)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
