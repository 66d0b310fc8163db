"""
Journal compatibility with Kestrel 2.4: journals built byte by byte from the
record layouts of Kestrel 2.4 (docs/journal.md; not with our
encoder) replay to the right records, and what FileJournal writes is those
exact bytes.
"""

from __future__ import annotations

import struct
from pathlib import Path

from twisted.internet.task import Clock

from kestrel.item import QItem
from kestrel.journal import records as rec
from kestrel.journal.journal import FileJournal
from tests.compat.model import queue_state

T1 = 1_767_225_600_000
T2 = T1 + 1500


def addx_block(data: bytes, add_ms: int, exp_ms: int) -> bytes:
    return struct.pack("<iqq", len(data) + 16, add_ms, exp_ms) + data


def kestrel_journal() -> bytes:
    """A journal using every opcode Kestrel 2.x wrote, built from the layout table."""
    return b"".join([
        b"\x00" + struct.pack("<ii", 4 + 6, 1_800_000_000) + b"legacy",   # ADD (1.x)
        b"\x02" + addx_block(b"hello kitty", T1, 0),                       # ADDX
        b"\x07" + struct.pack("<i", 5) + addx_block(b"with xid", T1, T2),  # ADD_XID
        b"\x03",                                                           # REMOVE_TENTATIVE
        b"\x09" + struct.pack("<i", 2),                                    # REMOVE_TENTATIVE_XID
        b"\x04" + struct.pack("<i", 2),                                    # SAVE_XID
        b"\x05" + struct.pack("<i", 2),                                    # UNREMOVE
        b"\x09" + struct.pack("<i", 3),
        b"\x06" + struct.pack("<i", 3),                                    # CONFIRM_REMOVE
        b"\x08" + struct.pack("<i", 0) + addx_block(b"continued", T2, 0),  # CONTINUE
        b"\x01",                                                           # REMOVE
        b"\x02" + addx_block(b"", T2, 0),                                  # empty item
    ])


def test_hand_built_kestrel_journal_replays(tmp_path: Path, clock: Clock) -> None:
    """Every Kestrel opcode in a hand-built journal replays to the right record and queue."""
    (tmp_path / "q").write_bytes(kestrel_journal())
    j = FileJournal(str(tmp_path), "q", clock, None)
    got: list[rec.Record] = []
    j.replay(got.append)
    now_ms = int(clock.seconds() * 1000)
    assert got == [
        rec.Add(b"legacy", now_ms, 1_800_000_000_000),
        rec.Add(b"hello kitty", T1, 0),
        rec.AddXid(5, b"with xid", T1, T2),
        rec.RemoveTentative(),
        rec.RemoveTentativeXid(2),
        rec.SaveXid(2),
        rec.Unremove(2),
        rec.RemoveTentativeXid(3),
        rec.ConfirmRemove(3),
        rec.Continue(0, b"continued", T2, 0),
        rec.Remove(),
        rec.Add(b"", T2, 0),
    ]
    assert queue_state(got) == ([b"continued", b""], {})
    assert j.size == len(kestrel_journal())
    j.close()


def test_written_bytes_are_kestrels(tmp_path: Path, clock: Clock) -> None:
    """FileJournal writes exactly the bytes Kestrel writes for the same operations."""
    j = FileJournal(str(tmp_path), "q", clock, None)
    j.replay(lambda r: None)
    j.add(QItem(b"hello kitty", T1, 0))
    j.add(QItem(b"", T1, T2))
    j.remove_tentative(1)
    j.unremove(1)
    j.remove_tentative(2)
    j.confirm_remove(2)
    j.continue_(7, QItem(b"next", T2))
    j.remove()
    j.close()
    assert (tmp_path / "q").read_bytes() == b"".join([
        bytes.fromhex("021b000000") + struct.pack("<qq", T1, 0) + b"hello kitty",
        bytes.fromhex("0210000000") + struct.pack("<qq", T1, T2),
        bytes.fromhex("0901000000"),
        bytes.fromhex("0501000000"),
        bytes.fromhex("0902000000"),
        bytes.fromhex("0602000000"),
        bytes.fromhex("08" "07000000" "14000000") + struct.pack("<qq", T2, 0) + b"next",
        b"\x01",
    ])


def test_kestrel_half_finished_pack(tmp_path: Path, clock: Clock) -> None:
    """
    Kestrel's own "half-finished pack" case: test.50, test.100, test.100.pack,
    test.3000, test -> test.50 and test.100 are replaced by the pack.
    """
    def one(data: bytes) -> bytes:
        return b"\x02" + addx_block(data, T1, 0)

    (tmp_path / "test.50").write_bytes(one(b"old50"))
    (tmp_path / "test.100").write_bytes(one(b"old100"))
    (tmp_path / "test.100.pack").write_bytes(one(b"packed"))
    (tmp_path / "test.3000").write_bytes(one(b"3000"))
    (tmp_path / "test").write_bytes(one(b"current"))
    j = FileJournal(str(tmp_path), "test", clock, None)
    got: list[rec.Record] = []
    j.replay(got.append)
    j.close()
    assert [r.data for r in got] == [b"packed", b"3000", b"current"]  # type: ignore[union-attr]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["test", "test.100", "test.3000"]


def test_hand_built_kestrel_journal_loads_into_a_queue(tmp_path: Path, clock: Clock) -> None:
    """
    A PersistentQueue started on the hand-built Kestrel journal holds the right
    items in the right order: the legacy tentative remove (opcode 3) takes the
    next xid, as Kestrel 1.x did, so "legacy" is still open at the end and goes
    back to the head; everything else follows the records.
    """
    from kestrel.config import QueueConfig
    from kestrel.queue import PersistentQueue

    (tmp_path / "q").write_bytes(kestrel_journal())
    q = PersistentQueue("q", QueueConfig(), FileJournal(str(tmp_path), "q", clock, None), clock)
    q.setup()
    items = []
    while (item := q.remove()) is not None:
        items.append(item)
    assert [i.data for i in items] == [b"legacy", b"continued", b""]
    now_ms = int(clock.seconds() * 1000)
    assert (items[0].add_time_ms, items[0].expiry_ms) == (now_ms, 1_800_000_000_000)
    assert (items[1].add_time_ms, items[2].add_time_ms) == (T2, T2)
    q.close()


def test_queue_writes_kestrels_bytes(tmp_path: Path, clock: Clock) -> None:
    """
    The records a PersistentQueue writes for set, open, abort, open, confirm
    and get are the bytes Kestrel 2.4 writes for the same operations.
    """
    from kestrel.config import QueueConfig
    from kestrel.queue import PersistentQueue

    q = PersistentQueue("q", QueueConfig(), FileJournal(str(tmp_path), "q", clock, None), clock)
    q.setup()
    assert int(clock.seconds() * 1000) == T1
    q.add(b"hello kitty")
    q.add(b"x", expiry_ms=T2)
    first = q.remove(open_read=True)
    assert first is not None and first.xid == 1
    q.unremove(1)
    again = q.remove(open_read=True)
    assert again is not None and again.xid == 2
    q.confirm_remove(2)
    last = q.remove()
    assert last is not None and last.data == b"x"
    q.close()
    assert (tmp_path / "q").read_bytes() == b"".join([
        bytes.fromhex("021b000000") + struct.pack("<qq", T1, 0) + b"hello kitty",
        bytes.fromhex("0211000000") + struct.pack("<qq", T1, T2) + b"x",
        bytes.fromhex("0901000000"),
        bytes.fromhex("0501000000"),
        bytes.fromhex("0902000000"),
        bytes.fromhex("0602000000"),
        b"\x01",
    ])
