"""
A reference model of journal replay: the queue a list of records describes.

Tests use it to check that files left by a rewrite, a pack or a crash replay
to the same queue as the journal they replace.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from kestrel.journal import records as rec


def queue_state(records: Iterable[rec.Record]) -> tuple[list[bytes], dict[int, bytes]]:
    """
    Return the payloads queued and the open reads (xid to payload) after C{records}.

    Replay semantics of Kestrel (docs/journal.md): adds append, REMOVE
    pops the head, REMOVE_TENTATIVE(_XID) moves the head into the open reads,
    UNREMOVE puts an open read back at the head, CONFIRM_REMOVE drops it,
    CONTINUE drops it and appends a new item.
    """
    items: deque[bytes] = deque()
    open_reads: dict[int, bytes] = {}
    for r in records:
        if isinstance(r, (rec.Add, rec.LegacyAdd, rec.AddXid)):
            items.append(r.data)
        elif isinstance(r, rec.Remove):
            if items:
                items.popleft()
        elif isinstance(r, rec.RemoveTentative):
            if items:
                open_reads[0] = items.popleft()
        elif isinstance(r, rec.RemoveTentativeXid):
            if items:
                open_reads[r.xid] = items.popleft()
        elif isinstance(r, rec.Unremove):
            if r.xid in open_reads:
                items.appendleft(open_reads.pop(r.xid))
        elif isinstance(r, rec.ConfirmRemove):
            open_reads.pop(r.xid, None)
        elif isinstance(r, rec.Continue):
            open_reads.pop(r.xid, None)
            items.append(r.data)
    return list(items), open_reads
