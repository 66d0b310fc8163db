"""
What a pack holds: the checkpoint, the head operations since it, and the pack's layout.

A pack replaces every journal file up to a checkpoint file by one compact
file (Kestrel's packer). The queue at the checkpoint is not known any more,
so the journal records, from the checkpoint on, which head items the later
files take and what becomes of them (L{OP_REMOVE} and the rest, packed in an
C{array} as C{xid * 4 + op}); L{pack_layout} turns that into the items the
pack must hold, L{dump_records} into its records, and L{compact_size} says
how large they are. See docs/journal.md.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator, Sequence

import attrs

from kestrel.item import QItem
from kestrel.journal import records as rec

#: Head operations journaled since the checkpoint, stored as C{xid * 4 + op}.
OP_REMOVE = 0
OP_OPEN = 1
OP_UNREMOVE = 2
OP_CLOSE = 3


@attrs.frozen(eq=False)
class Checkpoint:
    """
    A rotated file and the open reads at the moment it was rotated.

    When the read-behind reader has read past C{filename}, every file up to
    it can be packed into one (L{kestrel.journal.journal.FileJournal.start_pack}).
    """

    filename: str
    reserved_items: tuple[QItem, ...]


def pack_layout(head_ops: Iterable[int], reserved: Sequence[QItem], open_items: list[QItem],
                memory: list[QItem]) -> tuple[list[QItem | None], list[QItem]]:
    """
    Work out what a pack must hold so that the files after the checkpoint replay onto it.

    The queue at the checkpoint is unknown, but the files after it take its
    head items in a known order: C{head_ops} (REMOVE, open, UNREMOVE, and
    confirm or continue, with their xids) says which taken item went where.
    Running them on placeholders tells, for each item taken from the old
    head, whether it is still open now (its data is in C{open_items}), back
    in the queue (its data is in C{memory}, whose first items are the ones
    put back), or gone (an empty item stands for it). What was not taken is
    the rest of C{memory}.

    @return: the taken items in order (C{None} for gone ones), and the rest.
    """
    put_back: collections.deque[int] = collections.deque()
    taken = 0
    # xid -> placeholder: >= 0 for the n-th item taken, < 0 for a reserved read.
    where = {item.xid: -1 - i for i, item in enumerate(reserved)}
    for value in head_ops:
        op = value & 3
        xid = value >> 2
        if op == OP_REMOVE or op == OP_OPEN:
            if put_back:
                placeholder = put_back.popleft()
            else:
                placeholder = taken
                taken += 1
            if op == OP_OPEN:
                where[xid] = placeholder
        elif op == OP_UNREMOVE:
            gone = where.pop(xid, None)
            if gone is not None:
                put_back.appendleft(gone)
        else:
            where.pop(xid, None)
    slots: list[QItem | None] = [None] * taken
    now_open = {item.xid: item for item in open_items}
    for xid, placeholder in where.items():
        if placeholder >= 0 and xid in now_open:
            slots[placeholder] = now_open[xid]
    for index, placeholder in enumerate(put_back):
        if placeholder >= 0 and index < len(memory):
            slots[placeholder] = memory[index]
    return slots, memory[len(put_back):]


def dump_records(xid_counter: int, reserved_items: Iterable[QItem],
                 middle: Sequence[QItem | None], items: Iterable[QItem],
                 now_ms: int) -> Iterator[bytes]:
    """
    Return the records of a compact journal as an iterator of bytes.

    SAVE_XID(C{xid_counter}); ADDX + REMOVE_TENTATIVE_XID per open read
    in C{reserved_items}; ADDX per C{middle} item (an empty one, stamped
    C{now_ms}, for C{None}); ADDX per C{items} item. All but C{items} is
    encoded now, so that the rest may be consumed on another thread while
    the queue goes on changing the open items' xids.
    """
    encode_add = rec.encode_add
    head = [rec.SaveXid(xid_counter).encode()]
    for item in reserved_items:
        head.append(encode_add(item.data, item.add_time_ms, item.expiry_ms))
        head.append(rec.encode_xid(rec.Opcode.REMOVE_TENTATIVE_XID, item.xid))
    dummy = encode_add(b"", now_ms, 0)
    for slot in middle:
        head.append(dummy if slot is None
                    else encode_add(slot.data, slot.add_time_ms, slot.expiry_ms))

    def body() -> Iterator[bytes]:
        yield from head
        for item in items:
            yield encode_add(item.data, item.add_time_ms, item.expiry_ms)

    return body()


#: Bytes of a SAVE_XID or REMOVE_TENTATIVE_XID record (an opcode and a 32-bit xid).
_XID_RECORD_SIZE = len(rec.encode_xid(rec.Opcode.SAVE_XID, 0))


def compact_size(reserved_items: Iterable[QItem], item_count: int, item_bytes: int) -> int:
    """
    How many bytes L{dump_records} writes with nothing in C{middle}: what a
    rewritten journal holds for the open reads C{reserved_items} and
    C{item_count} queued items of C{item_bytes} payload bytes in all.

    Counted from the items alone, without encoding them, so that the size of
    a rewrite through a pack is known before the pack is written (in a thread).
    """
    size = _XID_RECORD_SIZE + item_count * rec.ADDX_OVERHEAD + item_bytes
    for item in reserved_items:
        size += rec.ADDX_OVERHEAD + len(item.data) + _XID_RECORD_SIZE
    return size
