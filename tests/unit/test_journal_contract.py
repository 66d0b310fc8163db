"""
The journal contract (L{kestrel.journal.interface.IJournal}), checked against
both L{MemoryJournal} and L{FileJournal}: what is written is what a later
replay (or the memory journal's record list) holds, every write returns a
Deferred, and the failure path (recover, replay, probe) leaves a healthy
journal as it was. What only a file journal does (files, fsyncs, damage,
packing) is in C{test_journal_file.py}.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from kestrel.item import QItem
from kestrel.journal import records as rec
from kestrel.journal.interface import IJournal
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


def test_close_twice_is_harmless(journal_and_records: tuple[Journal, Any]) -> None:
    """Closing again fires too, and what was written before the first close stays."""
    journal, recorded = journal_and_records
    journal.add(QItem(b"kept", 1))
    assert succeeded(journal.close())
    assert succeeded(journal.close())
    assert recorded() == [rec.Add(b"kept", 1, 0)]


def test_after_written_calls_at_once_outside_a_batch(
        journal_and_records: tuple[Journal, Any]) -> None:
    """after_written, with no write batch open, calls the function with its arguments now."""
    journal, _ = journal_and_records
    calls: list[tuple[object, ...]] = []
    journal.after_written(lambda *args: calls.append(args), 1, "two")
    assert calls == [(1, "two")]


def test_recover_of_a_healthy_journal_keeps_everything(
        journal_and_records: tuple[Journal, Any]) -> None:
    """recover, replay and probe (the queue's failure path) on a journal that did not
    fail: every record stays, the journal is writable again, and the probe succeeds."""
    journal, recorded = journal_and_records
    assert journal.on_failure is None
    journal.add(QItem(b"a", 1))
    journal.remove_tentative(1)
    kept: list[int] = []
    journal.recover("write", OSError("test")).addCallback(kept.append)
    assert len(kept) == 1
    journal.replay(lambda r: None, lambda: None)
    assert succeeded(journal.probe(1))
    assert succeeded(journal.add(QItem(b"b", 2)))
    assert [r for r in recorded() if not isinstance(r, rec.SaveXid)] == [
        rec.Add(b"a", 1, 0), rec.RemoveTentativeXid(1), rec.Add(b"b", 2, 0)]


@pytest.mark.parametrize("cls", [FileJournal, MemoryJournal])
def test_class_has_every_member_of_the_interface(cls: type) -> None:
    """Each journal class has every method of IJournal, taking the same parameters."""
    members = [n for n, v in vars(IJournal).items()
               if not n.startswith("_") and (callable(v) or isinstance(v, property))]
    assert "replay" in members and "in_read_behind" in members
    for name in members:
        wanted = vars(IJournal)[name]
        got = getattr(cls, name)
        if isinstance(wanted, property):
            continue
        assert list(inspect.signature(got).parameters) == list(
            inspect.signature(wanted).parameters), name


def test_instances_have_the_interface_attributes(
        journal_and_records: tuple[Journal, Any]) -> None:
    """size, archived_size, on_failure and in_read_behind are there on an open journal."""
    journal, _ = journal_and_records
    _typed: IJournal = journal
    assert isinstance(journal.size, int) and isinstance(journal.archived_size, int)
    assert isinstance(journal.in_read_behind, bool)
    assert journal.on_failure is None
