"""
Property test of checkpoint packing: whatever reads, removes, aborts and
confirms happen before and after the checkpoint, the packed journal replays
to the queue the unpacked one describes; and what a rewrite will write is
counted exactly before it is written (L{compact_size}).
"""

from __future__ import annotations

import tempfile
from collections import deque
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock

from kestrel.item import QItem
from kestrel.journal import records as rec
from kestrel.journal.journal import FileJournal
from kestrel.journal.pack import compact_size, dump_records
from tests.compat.model import queue_state

OPS = st.lists(st.sampled_from(["add", "add", "remove", "open", "open", "abort", "confirm",
                                "continue"]), max_size=25)


class Model:
    """A queue that journals what it does, as PersistentQueue would."""

    def __init__(self, journal: FileJournal) -> None:
        self.journal = journal
        self.items: deque[QItem] = deque()
        self.open: dict[int, QItem] = {}
        self.counter = 0
        self.xid = 0
        self.new: set[int] = set()  # ids of items added after the checkpoint
        self.after_checkpoint = False

    def fresh(self) -> QItem:
        self.counter += 1
        i = QItem(b"item%d" % self.counter, self.counter)
        if self.after_checkpoint:
            self.new.add(id(i))
        return i

    def head_takeable(self) -> bool:
        # After the checkpoint the reader has not read any newer item yet.
        return bool(self.items) and id(self.items[0]) not in self.new

    def do(self, op: str, pick: int) -> None:
        j = self.journal
        if op == "add":
            i = self.fresh()
            self.items.append(i)
            j.add(i)
        elif op == "remove" and self.head_takeable():
            self.items.popleft()
            j.remove()
        elif op == "open" and self.head_takeable():
            self.xid += 1
            i = self.items.popleft()
            i.xid = self.xid
            self.open[self.xid] = i
            j.remove_tentative(self.xid)
        elif op in ("abort", "confirm", "continue") and self.open:
            xid = sorted(self.open)[pick % len(self.open)]
            i = self.open.pop(xid)
            if op == "abort":
                i.xid = 0
                self.items.appendleft(i)
                j.unremove(xid)
            elif op == "confirm":
                j.confirm_remove(xid)
            else:
                n = self.fresh()
                self.items.append(n)
                j.continue_(xid, n)

    def state(self) -> tuple[list[bytes], dict[int, bytes]]:
        return [i.data for i in self.items], {x: i.data for x, i in self.open.items()}


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 12), OPS, OPS, st.lists(st.integers(0, 10), min_size=50, max_size=50))
def test_pack_replays_to_same_queue(adds: int, before: list[str], after: list[str],
                                    picks: list[int]) -> None:
    """
    Packing at a checkpoint, with any mix of operations before and after it,
    leaves files that replay to exactly the queue and open reads the model holds.
    """
    clock = Clock()
    clock.advance(1_767_225_600)
    with tempfile.TemporaryDirectory() as d:
        journal = FileJournal(d, "q", clock, None)
        journal.replay(lambda r: None)
        m = Model(journal)
        for op, pick in zip(["add"] * adds + before, picks, strict=False):
            m.do(op, pick)
        journal.rotate([QItem(i.data, i.add_time_ms, 0, x) for x, i in m.open.items()], True)
        checkpoint = journal.checkpoint
        assert checkpoint is not None
        m.after_checkpoint = True
        for op, pick in zip(after, reversed(picks), strict=False):
            m.do(op, pick)
        memory = [i for i in m.items if id(i) not in m.new]
        assert list(m.items)[:len(memory)] == memory
        journal.start_pack(checkpoint, list(m.open.values()), memory, m.xid)
        assert journal.checkpoint is None
        names = sorted(p.name for p in Path(d).iterdir())
        assert names == sorted(["q", checkpoint.filename])
        got: list[rec.Record] = []
        again = FileJournal(d, "q", clock, None)
        again.replay(got.append)
        again.close()
        journal.close()
        assert queue_state(got) == m.state()


ITEMS = st.lists(st.builds(QItem, st.binary(max_size=300), st.integers(0, 2**62),
                           st.integers(0, 2**62), st.integers(1, 2**31 - 1)), max_size=8)


@given(st.integers(0, 2**31 - 1), ITEMS, ITEMS)
def test_compact_size_is_what_a_rewrite_writes(xid_counter: int, open_items: list[QItem],
                                               items: list[QItem]) -> None:
    """compact_size counts, from the items alone, the bytes of the records a rewrite writes."""
    written = b"".join(dump_records(xid_counter, open_items, [], items, 0))
    assert compact_size(open_items, len(items), sum(len(i.data) for i in items)) == len(written)
