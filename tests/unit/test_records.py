"""
Tests for L{kestrel.journal.records}: Kestrel's worked examples as golden
bytes, round trips of every record type, and decoding of broken tails.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kestrel.journal import records as rec

I32 = st.integers(-(2**31), 2**31 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
DATA = st.binary(max_size=64)

records_strategy: st.SearchStrategy[rec.Record] = st.one_of(
    st.builds(rec.Add, DATA, I64, I64),
    st.builds(rec.LegacyAdd, DATA, I32),
    st.builds(rec.AddXid, I32, DATA, I64, I64),
    st.builds(rec.Continue, I32, DATA, I64, I64),
    st.just(rec.Remove()),
    st.just(rec.RemoveTentative()),
    st.builds(rec.RemoveTentativeXid, I32),
    st.builds(rec.SaveXid, I32),
    st.builds(rec.Unremove, I32),
    st.builds(rec.ConfirmRemove, I32),
)

ADD_MS = 1_767_225_600_123


def test_hello_kitty_addx_golden() -> None:
    """'hello kitty' as ADDX is 32 bytes: 02, size 27 LE, add ms, zero expiry, payload."""
    got = rec.encode(rec.Add(b"hello kitty", ADD_MS, 0))
    assert len(got) == 32
    assert got[:5] == bytes.fromhex("021b000000")
    assert got[5:13] == struct.pack("<q", ADD_MS)
    assert got[13:21] == bytes(8)
    assert got[21:] == bytes.fromhex("68656c6c6f206b69747479")
    assert rec.read_record(got) == (rec.Add(b"hello kitty", ADD_MS, 0), 32)


def test_empty_item_is_21_bytes() -> None:
    """An empty item's ADDX record is 21 bytes with size field 16."""
    got = rec.encode_add(b"", ADD_MS)
    assert len(got) == 21
    assert got[:5] == bytes.fromhex("0210000000")


def test_open_xid_1_golden() -> None:
    """Opening xid 1 is REMOVE_TENTATIVE_XID: 09 01000000."""
    assert rec.encode(rec.RemoveTentativeXid(1)) == bytes.fromhex("0901000000")


@pytest.mark.parametrize(("record", "hexbytes"), [
    (rec.Remove(), "01"),
    (rec.RemoveTentative(), "03"),
    (rec.SaveXid(258), "0402010000"),
    (rec.Unremove(7), "0507000000"),
    (rec.ConfirmRemove(7), "0607000000"),
    (rec.LegacyAdd(b"hi", 0), "0006000000" "00000000" "6869"),
    (rec.AddXid(3, b"", 1, 2), "07" "03000000" "10000000" + "0100000000000000"
     + "0200000000000000"),
    (rec.Continue(3, b"z", 1, 0), "08" "03000000" "11000000" + "0100000000000000"
     + "0000000000000000" + "7a"),
])
def test_every_opcode_golden(record: rec.Record, hexbytes: str) -> None:
    """Each record type encodes to Kestrel's exact little-endian layout and decodes back."""
    raw = bytes.fromhex(hexbytes)
    assert rec.encode(record) == raw
    assert rec.read_record(raw) == (record, len(raw))
    assert rec.record_size(record) == len(raw)


@given(records_strategy)
def test_round_trip_one(record: rec.Record) -> None:
    """decode(encode(r)) == r for every record type, consuming exactly its bytes."""
    raw = rec.encode(record)
    assert rec.read_record(raw) == (record, len(raw))


@given(st.lists(records_strategy, max_size=20))
def test_round_trip_many(rs: list[rec.Record]) -> None:
    """A journal of records decodes to the same records at the right offsets, with no problem."""
    raw = b"".join(rec.encode(r) for r in rs)
    got = rec.decode_prefix(raw)
    assert got.records == rs
    assert got.end == len(raw)
    assert got.problem is None
    assert [r for _, r in rec.iter_records(raw)] == rs


@given(st.lists(records_strategy, min_size=1, max_size=8), st.data())
def test_every_prefix_decodes_to_a_record_prefix(rs: list[rec.Record], data: st.DataObject) -> None:
    """
    Any byte prefix of a journal decodes to a prefix of its records, and
    C{end} is the record boundary just before the cut.
    """
    encoded = [rec.encode(r) for r in rs]
    raw = b"".join(encoded)
    boundaries = [0]
    for e in encoded:
        boundaries.append(boundaries[-1] + len(e))
    cut = data.draw(st.integers(0, len(raw)))
    got = rec.decode_prefix(raw[:cut])
    whole = max(i for i, b in enumerate(boundaries) if b <= cut)
    assert got.records == rs[:whole]
    assert got.end == boundaries[whole]
    assert got.offsets == boundaries[:whole]
    assert (got.problem is None) == (cut == boundaries[whole])


def test_every_prefix_exhaustive_small_journal() -> None:
    """Every single byte prefix of a mixed journal decodes to exactly its complete records."""
    rs: list[rec.Record] = [rec.Add(b"abc", 1, 0), rec.RemoveTentativeXid(1),
                            rec.LegacyAdd(b"x", 5), rec.Continue(1, b"yz", 2, 3), rec.Remove(),
                            rec.SaveXid(9)]
    raw = b"".join(rec.encode(r) for r in rs)
    for cut in range(len(raw) + 1):
        got = rec.decode_prefix(raw[:cut])
        assert rec.decode_prefix(raw[:got.end]).records == got.records
        assert raw[:got.end] == b"".join(rec.encode(r) for r in got.records)
        assert rs[:len(got.records)] == got.records


def test_incomplete_record_reads_as_none() -> None:
    """read_record returns None (not an error) when the buffer ends inside a record."""
    raw = rec.encode_add(b"hello", 1)
    for cut in range(len(raw)):
        assert rec.read_record(raw[:cut]) is None


@pytest.mark.parametrize("op", [10, 11, 0x7F, 0xFF])
def test_invalid_opcode_is_corrupt(op: int) -> None:
    """An unknown opcode raises CorruptRecord at its offset; decode_prefix stops before it."""
    raw = rec.REMOVE_BYTES + bytes([op]) + rec.REMOVE_BYTES
    with pytest.raises(rec.CorruptRecord) as e:
        rec.read_record(raw, 1)
    assert e.value.offset == 1
    got = rec.decode_prefix(raw)
    assert got.records == [rec.Remove()]
    assert got.end == 1
    assert got.problem is not None and "opcode" in got.problem


@pytest.mark.parametrize("head", [
    b"\x02" + struct.pack("<i", 15),
    b"\x02" + struct.pack("<i", -1),
    b"\x00" + struct.pack("<i", 3),
    b"\x07" + struct.pack("<ii", 1, 15),
    b"\x08" + struct.pack("<ii", 1, -100),
])
def test_short_block_is_corrupt(head: bytes) -> None:
    """An add block shorter than its fixed fields is corrupt, not merely incomplete."""
    with pytest.raises(rec.CorruptRecord):
        rec.read_record(head + bytes(64))


# -- the xid counter -----------------------------------------------------------


@given(st.integers(-5, rec.MAX_XID), st.sets(st.integers(-5, 40)))
def test_next_xid_is_the_first_free_xid_after_the_counter(current: int,
                                                          open_xids: set[int]) -> None:
    """
    next_xid counts up from the counter (going on at 1 after MAX_XID) to the
    first xid that is neither 0 nor open.
    """
    got = rec.next_xid(current, open_xids)
    assert got != 0 and got not in open_xids
    assert -5 < got <= rec.MAX_XID
    if got > current:
        visited = list(range(current + 1, got))
    else:  # wrapped
        visited = [*range(current + 1, rec.MAX_XID + 1), *range(1, got)]
    assert all(x == 0 or x in open_xids for x in visited)


def test_next_xid_wraps_to_one_and_skips_open_xids() -> None:
    """After MAX_XID the counter goes on at 1, never 0, past every open xid."""
    assert rec.next_xid(rec.MAX_XID - 1, set()) == rec.MAX_XID
    assert rec.next_xid(rec.MAX_XID, set()) == 1
    assert rec.next_xid(rec.MAX_XID, {1, 2}) == 3
    assert rec.next_xid(-1, set()) == 1
    assert rec.next_xid(0, {1, 2, 4}) == 3
