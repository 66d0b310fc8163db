"""
The journal contract (L{kestrel.journal.interface.IJournal}), checked against
both L{MemoryJournal} and L{FileJournal}: what is written is what a later
replay (or the memory journal's record list) holds, every write returns a
Deferred that fires once it is durable (or C{None} when there is nothing to
wait for: no fsync on write), and the failure path (recover, replay, probe) leaves a healthy
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
from kestrel.journal.runner import RunInThread, SyncTurn, run_inline
from tests.compat.model import queue_state
from tests.support import ThreadFlag

Journal = FileJournal | MemoryJournal

#: The file journal runs under each runner (the InlineRunner of tests and tools;
#: a thread runner whose jobs run when the test settles, as the server's thread
#: pool runs them; that thread runner with the reactor-turn fsync of "always",
#: the server's default) and each sync policy (never, always, every 0.5 s).
FILE_SETUPS = [(runner, policy) for runner in ("inline", "thread", "turn")
               for policy in (None, 0.0, 0.5)]


class Harness:
    """
    A replayed, empty journal; C{recorded()} returns the records it holds
    (replayed by a second journal over the same files), C{settle()} lets
    every fsync the journal asked for run (the clock past the sync period,
    the thread's jobs run).
    """

    def __init__(self, journal: Journal, recorded: Callable[[], list[rec.Record]],
                 settle: Callable[[], None], policy: float | None = None) -> None:
        self.journal = journal
        self.recorded = recorded
        self.settle = settle
        self.policy = policy

    def acknowledged(self, d: Deferred[None] | None) -> bool:
        """
        Whether the write that returned C{d} is acknowledged: with no fsync on
        write it returned C{None} (nothing to wait for), else C{d} fired.
        """
        if self.policy is None:
            return d is None
        return d is not None and succeeded(d)


@pytest.fixture(params=["memory", *(f"file-{r}-{p}" for r, p in FILE_SETUPS)])
def h(request: pytest.FixtureRequest, tmp_path: Path, clock: Clock) -> Iterator[Harness]:
    """A journal of each kind, runner and sync policy, replayed and empty."""
    if request.param == "memory":
        mem = MemoryJournal(keep_records=True)
        mem.replay(lambda r: None)
        yield Harness(mem, lambda: list(mem.records), lambda: None)
        return
    _, runner, policy_text = request.param.split("-")
    policy = None if policy_text == "None" else float(policy_text)
    thread = ThreadFlag()
    run: RunInThread = run_inline if runner == "inline" else thread
    turn = SyncTurn(clock) if runner == "turn" else None

    def recorded() -> list[rec.Record]:
        out: list[rec.Record] = []
        again = FileJournal(str(tmp_path), "q", clock, None)
        again.replay(out.append)
        again.close()
        return out

    def settle() -> None:
        for _ in range(10):
            clock.advance(0.5)
            thread.run_all()

    fj = FileJournal(str(tmp_path), "q", clock, policy, run_in_thread=run, sync_turn=turn)
    fj.replay(lambda r: None)
    yield Harness(fj, recorded, settle, policy)
    settle()
    fj.close()
    settle()
    assert thread.jobs == []


def succeeded(d: Deferred[Any]) -> bool:
    out: list[object] = []
    d.addCallback(out.append)
    return out == [None]


def test_fresh_journal_is_empty(h: Harness) -> None:
    """A new journal replays nothing, is not replaying or reading behind, and has size 0."""
    journal, recorded = h.journal, h.recorded
    assert recorded() == []
    assert not journal.is_replaying
    assert not journal.in_read_behind
    assert journal.size == 0
    assert journal.archived_size == 0


def test_writes_fire_and_are_recorded_in_order(h: Harness) -> None:
    """Every write returns a Deferred that fires once it is durable (nothing without
    an fsync on write), and journals its record, in call order."""
    journal, recorded = h.journal, h.recorded
    a = QItem(b"alpha", 1000, 0)
    b = QItem(b"beta", 2000, 9000)
    ds = [journal.add(a), journal.add(b), journal.remove_tentative(1), journal.unremove(1),
          journal.remove_tentative(2), journal.confirm_remove(2),
          journal.continue_(3, QItem(b"gamma", 3000)), journal.remove()]
    h.settle()
    assert all(h.acknowledged(d) for d in ds)
    assert recorded() == [
        rec.Add(b"alpha", 1000, 0), rec.Add(b"beta", 2000, 9000), rec.RemoveTentativeXid(1),
        rec.Unremove(1), rec.RemoveTentativeXid(2), rec.ConfirmRemove(2),
        rec.Continue(3, b"gamma", 3000, 0), rec.Remove(),
    ]


def test_unseen_adds_keep_their_place_among_other_records(h: Harness) -> None:
    """Adds no reader sees before they are durable are journaled in call order with the rest,
    across a rotation and a rewrite, and their Deferreds fire once they are durable."""
    journal, recorded = h.journal, h.recorded
    ds = [journal.add_unseen(QItem(b"1", 1)), journal.remove(),
          journal.add_unseen(QItem(b"2", 2))]
    journal.rotate([], False)
    ds.append(journal.add_unseen(QItem(b"3", 3)))
    h.settle()
    assert all(h.acknowledged(d) for d in ds)
    assert recorded() == [rec.Add(b"1", 1, 0), rec.Remove(), rec.Add(b"2", 2, 0),
                          rec.Add(b"3", 3, 0)]
    ds = [journal.add_unseen(QItem(b"4", 4))]
    journal.rewrite([], [QItem(b"2", 2), QItem(b"3", 3), QItem(b"4", 4)])
    ds.append(journal.add_unseen(QItem(b"5", 5)))
    h.settle()
    assert all(h.acknowledged(d) for d in ds)
    assert queue_state(recorded()) == ([b"2", b"3", b"4", b"5"], {})


def test_rotate_keeps_every_record(h: Harness) -> None:
    """Rotation changes files, not contents: the records replay in the same order."""
    journal, recorded = h.journal, h.recorded
    journal.add(QItem(b"1", 1))
    journal.rotate([], False)
    journal.add(QItem(b"2", 2))
    h.settle()  # (no rotation starts while the last one's fsyncs run)
    journal.rotate([], True)
    journal.remove()
    h.settle()
    assert recorded() == [rec.Add(b"1", 1, 0), rec.Add(b"2", 2, 0), rec.Remove()]


def test_rewrite_keeps_queue_state(h: Harness) -> None:
    """After a rewrite and more writes, replay gives the queue the journal described."""
    journal, recorded = h.journal, h.recorded
    for i in range(5):
        journal.add(QItem(b"item%d" % i, i))
    journal.remove()
    journal.remove_tentative(7)
    journal.rotate([], False)
    h.settle()  # (no rewrite starts while a rotation's fsyncs run)
    open_item = QItem(b"item1", 1, 0, xid=7)
    journal.rewrite([open_item], [QItem(b"item%d" % i, i) for i in (2, 3, 4)], 7)
    journal.add(QItem(b"item5", 5))
    journal.confirm_remove(7)
    h.settle()
    assert not journal.packing and not journal.maintaining
    assert queue_state(recorded()) == ([b"item2", b"item3", b"item4", b"item5"], {})


def test_close_then_erase(h: Harness) -> None:
    """close() fires; erase() leaves nothing to replay."""
    journal, recorded = h.journal, h.recorded
    added = journal.add(QItem(b"x", 1))
    h.settle()
    assert succeeded(journal.close())
    assert h.acknowledged(added)
    journal.erase()
    assert recorded() == []


def test_close_twice_is_harmless(h: Harness) -> None:
    """Closing again fires too, and what was written before the first close stays."""
    journal, recorded = h.journal, h.recorded
    added = journal.add(QItem(b"kept", 1))
    closed = journal.close()
    h.settle()  # (the descriptor closes once an fsync running in the thread ends)
    assert succeeded(closed) and h.acknowledged(added)
    assert succeeded(journal.close())
    assert recorded() == [rec.Add(b"kept", 1, 0)]


def test_after_written_calls_at_once_outside_a_batch(h: Harness) -> None:
    """
    after_written, with no write batch open (writes_now), calls the function
    with its arguments now.
    """
    calls: list[tuple[object, ...]] = []
    assert h.journal.writes_now()
    h.journal.after_written(lambda *args: calls.append(args), 1, "two")
    assert calls == [(1, "two")]


def test_recover_of_a_healthy_journal_keeps_everything(
        h: Harness) -> None:
    """recover, replay and probe (the queue's failure path) on a journal that did not
    fail: every record stays, the journal is writable again, and the probe succeeds."""
    journal, recorded = h.journal, h.recorded
    assert journal.on_failure is None
    journal.add(QItem(b"a", 1))
    journal.remove_tentative(1)
    kept: list[int] = []
    journal.recover("write", OSError("test")).addCallback(kept.append)
    h.settle()
    assert len(kept) == 1
    journal.replay(lambda r: None, lambda: None)
    probed = journal.probe(1)
    added = journal.add(QItem(b"b", 2))
    h.settle()
    assert succeeded(probed) and h.acknowledged(added)
    assert [r for r in recorded() if not isinstance(r, rec.SaveXid)] == [
        rec.Add(b"a", 1, 0), rec.RemoveTentativeXid(1), rec.Add(b"b", 2, 0)]


def test_writes_are_acknowledged_by_the_sync_policy(h: Harness, clock: Clock) -> None:
    """
    Under a sync period a write is acknowledged once the period has passed
    and its fsync ran, not before; with no fsync on write (never, or a
    memory journal) at once; under "always" by the fsync that follows it.
    """
    d = h.journal.add(QItem(b"a", 1))
    if h.policy is None:
        assert d is None  # (nothing to wait for)
        return
    assert d is not None
    if h.policy > 0:
        clock.advance(h.policy / 2)
        assert not d.called
    h.settle()
    assert succeeded(d)


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
        h: Harness) -> None:
    """size, archived_size, on_failure and in_read_behind are there on an open journal."""
    journal = h.journal
    _typed: IJournal = journal
    assert isinstance(journal.size, int) and isinstance(journal.archived_size, int)
    assert isinstance(journal.in_read_behind, bool)
    assert journal.on_failure is None
