"""
Replay warns of a CONFIRM_REMOVE, UNREMOVE or CONTINUE whose xid no record
opened: the one sign of damage the journal format gives. One warning per
replayed queue, with the count and the first such xid; a healthy journal
(whatever its files: rotated, packed, rewritten) replays without one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from twisted.internet.task import Clock
from twisted.logger import LogLevel, capturedLogs

from kestrel.config import QueueConfig
from kestrel.journal import records as rec
from kestrel.journal.journal import FileJournal
from kestrel.queue import PersistentQueue
from tests.unit.test_queue import value


def write(folder: Path, name: str, records: list[rec.Record]) -> None:
    folder.mkdir(exist_ok=True)
    (folder / name).write_bytes(b"".join(r.encode() for r in records))


def replay_warnings(folder: Path, clock: Clock, queue: str = "q") -> list[dict[str, Any]]:
    """The warnings about unopened xids that replaying queue C{queue} logs."""
    journal = FileJournal(str(folder), queue, clock, None)
    with capturedLogs() as events:
        journal.replay(lambda r: None)
    journal.close()
    return [e for e in events if e["log_level"] == LogLevel.warn and "xid" in e]


def test_closes_of_opened_xids_replay_quietly(tmp_path: Path, clock: Clock) -> None:
    """Opens followed by their confirm, abort and continue: no warning."""
    write(tmp_path, "q", [
        rec.Add(b"a", 1), rec.Add(b"b", 2), rec.Add(b"c", 3),
        rec.RemoveTentativeXid(1), rec.ConfirmRemove(1),
        rec.RemoveTentativeXid(2), rec.Unremove(2),
        rec.RemoveTentativeXid(3), rec.Continue(3, b"d", 4)])
    assert replay_warnings(tmp_path, clock) == []


def test_closes_of_unopened_xids_warn_once_with_count_and_first_xid(tmp_path: Path,
                                                                    clock: Clock) -> None:
    """Three closes of xids never opened: one warning, count 3, first xid 7."""
    write(tmp_path, "q", [
        rec.Add(b"a", 1), rec.ConfirmRemove(7), rec.RemoveTentativeXid(1),
        rec.Unremove(9), rec.ConfirmRemove(1), rec.Continue(11, b"b", 2)])
    warnings = replay_warnings(tmp_path, clock)
    assert len(warnings) == 1
    assert (warnings[0]["queue"], warnings[0]["count"], warnings[0]["xid"]) == ("q", 3, 7)


def test_a_second_close_of_one_open_warns(tmp_path: Path, clock: Clock) -> None:
    """An xid closed twice after one open: the second close is of no open read."""
    write(tmp_path, "q", [rec.Add(b"a", 1), rec.RemoveTentativeXid(4), rec.ConfirmRemove(4),
                          rec.ConfirmRemove(4)])
    warnings = replay_warnings(tmp_path, clock)
    assert [(w["count"], w["xid"]) for w in warnings] == [(1, 4)]


def test_open_in_a_rotated_file_counts_for_the_next(tmp_path: Path, clock: Clock) -> None:
    """Files replay as one stream: an open in a rotated file, its confirm in <q>."""
    write(tmp_path, "q.1000", [rec.Add(b"a", 1), rec.RemoveTentativeXid(5)])
    write(tmp_path, "q", [rec.ConfirmRemove(5)])
    assert replay_warnings(tmp_path, clock) == []


def test_legacy_unnumbered_open_takes_one_close(tmp_path: Path, clock: Clock) -> None:
    """A Kestrel 1.x open has no xid (the replayer numbers it): one close is its close."""
    write(tmp_path, "q", [rec.Add(b"a", 1), rec.Add(b"b", 1), rec.RemoveTentative(),
                          rec.ConfirmRemove(1), rec.ConfirmRemove(2)])
    warnings = replay_warnings(tmp_path, clock)
    assert [(w["count"], w["xid"]) for w in warnings] == [(1, 2)]


def test_each_queue_warns_of_its_own(tmp_path: Path, clock: Clock) -> None:
    """The warning is per replayed queue: a healthy queue beside a damaged one says nothing."""
    write(tmp_path, "bad", [rec.Unremove(3)])
    write(tmp_path, "good", [rec.Add(b"a", 1), rec.RemoveTentativeXid(3), rec.Unremove(3)])
    assert [(w["queue"], w["count"], w["xid"]) for w in replay_warnings(tmp_path, clock, "bad")
            ] == [("bad", 1, 3)]
    assert replay_warnings(tmp_path, clock, "good") == []


def test_a_queue_through_rotations_packs_and_rewrites_replays_quietly(tmp_path: Path,
                                                                      clock: Clock) -> None:
    """
    A queue that opens, confirms and aborts reads across rotations, packs
    and rewrites (every file layout the journal makes) replays with no warning.
    """
    config = QueueConfig(max_memory_size=64, default_journal_size=128, max_journal_size=512)
    q = PersistentQueue("q", config, FileJournal(str(tmp_path), "q", clock, None), clock)
    q.setup()
    for i in range(60):
        value(q.add(b"%010d" % i))
        if i % 3 == 0:
            item = q.remove(open_read=True)
            assert item is not None
            if i % 2:
                q.confirm_remove(item.xid)
            else:
                q.unremove(item.xid)
        if i % 4 == 0:
            q.remove()
    while q.remove() is not None:
        pass  # (an empty queue: a rewrite)
    for i in range(3):
        value(q.add(b"%010d" % i))
    assert q.remove(open_read=True) is not None
    kept = q.length + q.open_read_count  # (open reads go back to the queue at setup)
    assert q.journal_rotations and q.journal_rewrites
    value(q.close())
    with capturedLogs() as events:
        again = PersistentQueue("q", config, FileJournal(str(tmp_path), "q", clock, None), clock)
        again.setup()
    assert [e for e in events if e["log_level"] == LogLevel.warn] == []
    assert again.length == kept
    value(again.close())


def test_healthy_history_stays_quiet_after_the_queue_aborts_open_reads(tmp_path: Path,
                                                                       clock: Clock) -> None:
    """Reads left open at close are aborted at the next setup (UNREMOVE): still no warning."""
    config = QueueConfig()
    q = PersistentQueue("q", config, FileJournal(str(tmp_path), "q", clock, None), clock)
    q.setup()
    for i in range(3):
        value(q.add(b"x%d" % i))
    assert q.remove(open_read=True) is not None
    value(q.close())
    for _ in range(2):
        with capturedLogs() as events:
            q = PersistentQueue("q", config, FileJournal(str(tmp_path), "q", clock, None), clock)
            q.setup()
        assert [e for e in events if e["log_level"] == LogLevel.warn] == []
        value(q.close())
