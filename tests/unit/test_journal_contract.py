"""
The journal contract, checked against both L{MemoryJournal} and L{FileJournal}:
what is written is what a later replay (or the memory journal's record list)
holds, and every write returns a Deferred.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from kestrel.item import QItem
from kestrel.journal import records as rec
from kestrel.journal.journal import FileJournal
from kestrel.journal.memory import MemoryJournal
from tests.compat.model import queue_state

Journal = FileJournal | MemoryJournal


@pytest.fixture(params=["memory", "file"])
def journal_and_records(request: pytest.FixtureRequest, tmp_path: Path,
                        clock: Clock) -> Iterator[tuple[Journal, Callable[[], list[rec.Record]]]]:
    """A replayed, empty journal and a function returning the records it holds."""
    if request.param == "memory":
        mem = MemoryJournal(keep_records=True)
        mem.replay(lambda r: None)
        yield mem, lambda: list(mem.records)
        return

    def recorded() -> list[rec.Record]:
        out: list[rec.Record] = []
        again = FileJournal(str(tmp_path), "q", clock, None)
        again.replay(out.append)
        again.close()
        return out

    fj = FileJournal(str(tmp_path), "q", clock, None)
    fj.replay(lambda r: None)
    yield fj, recorded
    fj.close()


def succeeded(d: Deferred[Any]) -> bool:
    out: list[object] = []
    d.addCallback(out.append)
    return out == [None]


def test_fresh_journal_is_empty(journal_and_records: tuple[Journal, Any]) -> None:
    """A new journal replays nothing, is not replaying or reading behind, and has size 0."""
    journal, recorded = journal_and_records
    assert recorded() == []
    assert not journal.is_replaying
    assert not journal.in_read_behind
    assert journal.size == 0
    assert journal.archived_size == 0


def test_writes_fire_and_are_recorded_in_order(journal_and_records: tuple[Journal, Any]) -> None:
    """Every write returns a fired Deferred and journals its record, in call order."""
    journal, recorded = journal_and_records
    a = QItem(b"alpha", 1000, 0)
    b = QItem(b"beta", 2000, 9000)
    ds = [journal.add(a), journal.add(b), journal.remove_tentative(1), journal.unremove(1),
          journal.remove_tentative(2), journal.confirm_remove(2),
          journal.continue_(3, QItem(b"gamma", 3000)), journal.remove()]
    assert all(succeeded(d) for d in ds)
    assert recorded() == [
        rec.Add(b"alpha", 1000, 0), rec.Add(b"beta", 2000, 9000), rec.RemoveTentativeXid(1),
        rec.Unremove(1), rec.RemoveTentativeXid(2), rec.ConfirmRemove(2),
        rec.Continue(3, b"gamma", 3000, 0), rec.Remove(),
    ]


def test_rotate_keeps_every_record(journal_and_records: tuple[Journal, Any]) -> None:
    """Rotation changes files, not contents: the records replay in the same order."""
    journal, recorded = journal_and_records
    journal.add(QItem(b"1", 1))
    journal.rotate([], False)
    journal.add(QItem(b"2", 2))
    journal.rotate([], True)
    journal.remove()
    assert recorded() == [rec.Add(b"1", 1, 0), rec.Add(b"2", 2, 0), rec.Remove()]


def test_rewrite_keeps_queue_state(journal_and_records: tuple[Journal, Any]) -> None:
    """After a rewrite and more writes, replay gives the queue the journal described."""
    journal, recorded = journal_and_records
    for i in range(5):
        journal.add(QItem(b"item%d" % i, i))
    journal.remove()
    journal.remove_tentative(7)
    journal.rotate([], False)
    open_item = QItem(b"item1", 1, 0, xid=7)
    journal.rewrite([open_item], [QItem(b"item%d" % i, i) for i in (2, 3, 4)], 7)
    journal.add(QItem(b"item5", 5))
    journal.confirm_remove(7)
    assert queue_state(recorded()) == ([b"item2", b"item3", b"item4", b"item5"], {})


def test_close_then_erase(journal_and_records: tuple[Journal, Any]) -> None:
    """close() fires; erase() leaves nothing to replay."""
    journal, recorded = journal_and_records
    journal.add(QItem(b"x", 1))
    assert succeeded(journal.close())
    journal.erase()
    assert recorded() == []
