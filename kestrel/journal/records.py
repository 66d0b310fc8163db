"""
Kestrel's journal record format: bytes to records and records to bytes.

This module never opens a file. All integers are little-endian, as Kestrel
writes them. Every opcode Kestrel 2.x ever wrote is decoded; txkestrel writes
ADDX, REMOVE, REMOVE_TENTATIVE_XID, UNREMOVE, CONFIRM_REMOVE and SAVE_XID
(and CONTINUE for completeness).

Layouts after the opcode byte:

==  =====================  =================================================
op  name                   layout
==  =====================  =================================================
0   ADD (legacy)           i32 size, i32 expiry seconds, data[size - 4]
1   REMOVE                 nothing
2   ADDX                   i32 size (= len + 16), i64 add ms, i64 expiry ms, data
3   REMOVE_TENTATIVE       nothing (legacy, no xid)
4   SAVE_XID               i32 xid
5   UNREMOVE               i32 xid
6   CONFIRM_REMOVE         i32 xid
7   ADD_XID                i32 xid, then an ADDX block
8   CONTINUE               i32 xid, then an ADDX block
9   REMOVE_TENTATIVE_XID   i32 xid
==  =====================  =================================================

An expiry of 0 means "never expires".
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Container, Iterator
from dataclasses import dataclass
from enum import IntEnum
from typing import NamedTuple

#: Xids are signed 32-bit in the journal; the counter wraps to 1 after this.
MAX_XID = 0x7FFFFFFF


def next_xid(current: int, open_xids: Container[int]) -> int:
    """
    Return the xid that follows C{current}: never 0 and never one in C{open_xids}.

    This is Kestrel's xid counter (C{nextXid}): count up from C{current},
    skipping 0 and every xid still open, except that after L{MAX_XID} the
    count goes on at 1 (Kestrel's 32-bit counter would turn negative).
    The caller stores the result as its new counter.
    """
    xid = current
    while True:
        xid = xid + 1 if xid < MAX_XID else 1
        if xid and xid not in open_xids:
            return xid


class Opcode(IntEnum):
    """The opcode byte that starts every journal record."""

    ADD = 0
    REMOVE = 1
    ADDX = 2
    REMOVE_TENTATIVE = 3
    SAVE_XID = 4
    UNREMOVE = 5
    CONFIRM_REMOVE = 6
    ADD_XID = 7
    CONTINUE = 8
    REMOVE_TENTATIVE_XID = 9


@dataclass(slots=True, eq=True)
class Add:
    """
    An item appended to the tail of the queue (ADDX, opcode 2).

    Times are epoch milliseconds; C{expiry_ms} 0 means "never".
    """

    data: bytes
    add_time_ms: int
    expiry_ms: int = 0

    def encode(self) -> bytes:
        """Return the ADDX bytes of this record."""
        return encode_add(self.data, self.add_time_ms, self.expiry_ms)


@dataclass(slots=True, eq=True)
class LegacyAdd:
    """
    An item added by Kestrel 1.x (ADD, opcode 0), with an expiry in epoch seconds.

    It carries no add time: replay uses the time of replay, as Kestrel does.
    """

    data: bytes
    expiry_s: int = 0

    def encode(self) -> bytes:
        """Return the legacy ADD bytes of this record."""
        return _HEAD_I32_I32.pack(Opcode.ADD, len(self.data) + 4, self.expiry_s) + self.data


@dataclass(slots=True, eq=True)
class AddXid:
    """An item added with an xid by old Kestrel versions (ADD_XID, opcode 7); replays as an add."""

    xid: int
    data: bytes
    add_time_ms: int
    expiry_ms: int = 0

    def encode(self) -> bytes:
        """Return the ADD_XID bytes of this record."""
        return _encode_xid_block(Opcode.ADD_XID, self.xid, self.data, self.add_time_ms,
                                 self.expiry_ms)


@dataclass(slots=True, eq=True)
class Continue:
    """Confirm open read C{xid} and append a new item, atomically (CONTINUE, opcode 8)."""

    xid: int
    data: bytes
    add_time_ms: int
    expiry_ms: int = 0

    def encode(self) -> bytes:
        """Return the CONTINUE bytes of this record."""
        return _encode_xid_block(Opcode.CONTINUE, self.xid, self.data, self.add_time_ms,
                                 self.expiry_ms)


@dataclass(slots=True, eq=True)
class Remove:
    """The head item was removed for good (REMOVE, opcode 1)."""

    def encode(self) -> bytes:
        """Return the REMOVE byte."""
        return REMOVE_BYTES


@dataclass(slots=True, eq=True)
class RemoveTentative:
    """The head item was opened by a reliable read, without an xid (legacy opcode 3)."""

    def encode(self) -> bytes:
        """Return the legacy REMOVE_TENTATIVE byte."""
        return b"\x03"


@dataclass(slots=True, eq=True)
class RemoveTentativeXid:
    """The head item was opened by a reliable read under C{xid} (opcode 9)."""

    xid: int

    def encode(self) -> bytes:
        """Return the REMOVE_TENTATIVE_XID bytes of this record."""
        return encode_xid(Opcode.REMOVE_TENTATIVE_XID, self.xid)


@dataclass(slots=True, eq=True)
class SaveXid:
    """The xid counter stands at C{xid} (SAVE_XID, opcode 4)."""

    xid: int

    def encode(self) -> bytes:
        """Return the SAVE_XID bytes of this record."""
        return encode_xid(Opcode.SAVE_XID, self.xid)


@dataclass(slots=True, eq=True)
class Unremove:
    """Open read C{xid} was aborted: its item goes back to the head (UNREMOVE, opcode 5)."""

    xid: int

    def encode(self) -> bytes:
        """Return the UNREMOVE bytes of this record."""
        return encode_xid(Opcode.UNREMOVE, self.xid)


@dataclass(slots=True, eq=True)
class ConfirmRemove:
    """Open read C{xid} was confirmed: its item is gone for good (CONFIRM_REMOVE, opcode 6)."""

    xid: int

    def encode(self) -> bytes:
        """Return the CONFIRM_REMOVE bytes of this record."""
        return encode_xid(Opcode.CONFIRM_REMOVE, self.xid)


Record = (Add | LegacyAdd | AddXid | Continue | Remove | RemoveTentative | RemoveTentativeXid
          | SaveXid | Unremove | ConfirmRemove)
"""Any journal record."""

#: Records that append an item to the queue on replay.
ADD_RECORDS = (Add, LegacyAdd, AddXid)

_HEAD_I32 = struct.Struct("<Bi")
_HEAD_I32_I32 = struct.Struct("<Bii")
_ADDX_HEAD = struct.Struct("<Biqq")
_XID_ADDX_HEAD = struct.Struct("<Biiqq")
_I32 = struct.Struct("<i")
_I32_I32 = struct.Struct("<ii")
#: What follows an ADDX record's opcode: its block's size, then the item's add
#: time and expiry (the item's bytes follow, to the block's end).
ADDX_BODY = struct.Struct("<iqq")
_I32_I32_Q_Q = struct.Struct("<iiqq")

REMOVE_BYTES = b"\x01"
"""The encoded REMOVE record."""

#: Size of an ADDX record beyond its payload.
ADDX_OVERHEAD = _ADDX_HEAD.size

#: The shared REMOVE record (it has no fields).
REMOVE = Remove()
_REMOVE_TENTATIVE = RemoveTentative()


def encode_add(data: bytes, add_time_ms: int, expiry_ms: int = 0) -> bytes:
    """Return the ADDX record for an item: the record every add writes."""
    return _ADDX_HEAD.pack(2, len(data) + 16, add_time_ms, expiry_ms) + data


def encode_xid(opcode: int, xid: int) -> bytes:
    """Return a five-byte record made of C{opcode} and a 32-bit C{xid}."""
    return _HEAD_I32.pack(opcode, xid)


def _encode_xid_block(opcode: int, xid: int, data: bytes, add_time_ms: int,
                      expiry_ms: int) -> bytes:
    return _XID_ADDX_HEAD.pack(opcode, xid, len(data) + 16, add_time_ms, expiry_ms) + data


def encode(record: Record) -> bytes:
    """Return the bytes of any record, exactly as Kestrel writes them."""
    return record.encode()


class CorruptRecord(ValueError):  # noqa: N818 (name fixed by docs/architecture.md)
    """
    The bytes at C{offset} are not a valid record (unknown opcode or impossible size).

    @ivar offset: where the broken record starts.
    @ivar reason: a short human-readable explanation.
    """

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"corrupt journal record at offset {offset}: {reason}")
        self.offset = offset
        self.reason = reason


def read_record(buf: bytes | bytearray | memoryview | mmap.mmap,
                pos: int = 0) -> tuple[Record, int] | None:
    """
    Decode the record starting at C{pos}.

    @return: C{(record, next_pos)}, or C{None} when C{buf} ends before the
        record does (a truncated tail, or a record still being written).
    @raise CorruptRecord: the bytes at C{pos} can never become a valid record.
    """
    end = len(buf)
    if pos >= end:
        return None
    op = buf[pos]
    if op == 2 and pos + 21 <= end:
        # ADDX, the record nearly every byte of a journal belongs to: one unpack.
        size, add_ms, exp_ms = ADDX_BODY.unpack_from(buf, pos + 1)
        nxt = pos + 5 + size
        if size >= 16 and nxt <= end:
            return Add(bytes(buf[pos + 21:nxt]), add_ms, exp_ms), nxt
    if op == 2 or op == 0:
        if pos + 5 > end:
            return None
        (size,) = _I32.unpack_from(buf, pos + 1)
        minimum = 16 if op == 2 else 4
        if size < minimum:
            raise CorruptRecord(pos, f"block of {size} bytes is shorter than {minimum}")
        nxt = pos + 5 + size
        if nxt > end:
            return None
        if op == 2:
            add_ms, exp_ms = _QQ.unpack_from(buf, pos + 5)
            return Add(bytes(buf[pos + 21:nxt]), add_ms, exp_ms), nxt
        (exp_s,) = _I32.unpack_from(buf, pos + 5)
        return LegacyAdd(bytes(buf[pos + 9:nxt]), exp_s), nxt
    if op == 1:
        return REMOVE, pos + 1
    if op == 9 or op == 5 or op == 6 or op == 4:
        if pos + 5 > end:
            return None
        (xid,) = _I32.unpack_from(buf, pos + 1)
        return _XID_RECORDS[op](xid), pos + 5
    if op == 7 or op == 8:
        if pos + 9 > end:
            return None
        xid, size = _I32_I32.unpack_from(buf, pos + 1)
        if size < 16:
            raise CorruptRecord(pos, f"block of {size} bytes is shorter than 16")
        nxt = pos + 9 + size
        if nxt > end:
            return None
        add_ms, exp_ms = _QQ.unpack_from(buf, pos + 9)
        cls = AddXid if op == 7 else Continue
        return cls(xid, bytes(buf[pos + 25:nxt]), add_ms, exp_ms), nxt
    if op == 3:
        return _REMOVE_TENTATIVE, pos + 1
    raise CorruptRecord(pos, f"invalid opcode {op}")


_QQ = struct.Struct("<qq")
_XidRecord = type[SaveXid | Unremove | ConfirmRemove | RemoveTentativeXid]
_XID_RECORDS: dict[int, _XidRecord] = {
    4: SaveXid, 5: Unremove, 6: ConfirmRemove, 9: RemoveTentativeXid,
}


def iter_records(buf: bytes | bytearray | memoryview,
                 pos: int = 0) -> Iterator[tuple[int, Record]]:
    """
    Yield C{(offset, record)} for every complete record in C{buf} from C{pos}.

    Iteration stops silently at an incomplete tail; use L{decode_prefix} to
    learn where and why decoding stopped.

    @raise CorruptRecord: at the first invalid record.
    """
    while True:
        got = read_record(buf, pos)
        if got is None:
            return
        record, nxt = got
        yield pos, record
        pos = nxt


class DecodedPrefix(NamedTuple):
    """
    The result of decoding a byte string that may end in a broken record.

    @ivar records: every complete record, in order.
    @ivar offsets: the offset at which each record starts.
    @ivar end: the clean truncation point: the offset just past the last
        complete record. Bytes from C{end} on are a broken tail.
    @ivar problem: C{None} if every byte was decoded; otherwise why decoding
        stopped at C{end} ("truncated record" or the corruption reason).
    """

    records: list[Record]
    offsets: list[int]
    end: int
    problem: str | None


def decode_prefix(buf: bytes | bytearray | memoryview) -> DecodedPrefix:
    """
    Decode as many whole records as C{buf} holds, never raising.

    Any prefix of a valid journal decodes to a prefix of its records, and
    C{end} is where the file would be truncated to drop the broken tail.
    """
    records: list[Record] = []
    offsets: list[int] = []
    pos = 0
    problem: str | None = None
    try:
        while True:
            got = read_record(buf, pos)
            if got is None:
                if pos < len(buf):
                    problem = "truncated record"
                break
            records.append(got[0])
            offsets.append(pos)
            pos = got[1]
    except CorruptRecord as e:
        problem = e.reason
    return DecodedPrefix(records, offsets, pos, problem)


def record_size(record: Record) -> int:
    """Return how many bytes C{record} takes in a journal."""
    return len(record.encode())


class SkippedAdds(NamedTuple):
    """
    A run of whole ADDX records measured without being decoded.

    @ivar records: how many ADDX records the run holds.
    @ivar data_bytes: the sum of their payload sizes.
    @ivar end: the offset just past the last of them.
    """

    records: int
    data_bytes: int
    end: int


#: The longest run of equal-sized ADDX records L{skip_adds} checks at once.
_MAX_STRIDE_RUN = 1 << 16
#: Records L{skip_adds} measures one by one after a run check failed.
_STRIDE_BACKOFF = 32


def skip_adds(buf: bytes | bytearray | memoryview | mmap.mmap, pos: int,
              end: int | None = None) -> SkippedAdds:
    """
    Measure the run of whole ADDX records starting at C{pos}, reading only
    each opcode and length.

    The run stops before the first record that is not an ADDX, or that is
    truncated or impossible (block shorter than 16 bytes), or at C{end}
    (default: the end of C{buf}); L{read_record} then decodes or reports
    what follows. Neither the payloads nor their times are read.

    Items of one size (the usual journal) are measured many at a time: the
    opcode and length bytes of the next records are compared, as strided
    slices, with those of the first; where they differ, records are
    measured one by one for a while.
    """
    if end is None:
        end = len(buf)
    unpack_size = _I32.unpack_from
    start = pos
    count = 0
    trial = 16
    one_by_one = 0
    while pos + 21 <= end and buf[pos] == 2:
        (size,) = unpack_size(buf, pos + 1)
        stride = 5 + size
        if size < 16 or pos + stride > end:
            break
        if one_by_one:
            one_by_one -= 1
        else:
            n = min((end - pos) // stride, trial)
            if n > 1:
                stop = pos + n * stride
                if all(buf[pos + i:stop:stride] == buf[pos + i:pos + i + 1] * n
                       for i in range(5)):
                    count += n
                    pos = stop
                    trial = min(trial * 2, _MAX_STRIDE_RUN)
                    continue
                trial = 16
                one_by_one = _STRIDE_BACKOFF
        count += 1
        pos += stride
    return SkippedAdds(count, pos - start - count * ADDX_OVERHEAD, pos)
