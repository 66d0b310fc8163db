"""
Startup replay while serving (QueueCollection.start_loading), on a Clock.

The collection replays one journal step (C{replay_step_bytes}) per reactor
turn here (C{replay_slice_seconds=0}), and a turn comes every
C{replay_pause} clock seconds: the test decides when replay moves on, and
talks to the collection in between, as clients would.
"""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path

import pytest
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.logger import capturedLogs
from twisted.python.failure import Failure

from kestrel.collection import QueueCollection
from kestrel.config import ServerConfig, parse_config
from kestrel.errors import QueueLoading, ShuttingDown
from kestrel.item import QItem
from kestrel.journal import records as rec
from kestrel.loading import REPLAY_PROGRESS_INTERVAL

#: Clock seconds between two replay turns.
PAUSE = 1.0
BIG = 200
ADD_MS = 1_700_000_000_000


def make_config(tmp_path: Path, extra: str = "") -> ServerConfig:
    text = (f"queue_path: {json.dumps(str(tmp_path / 'queues'))}\n"
            f"status_file: {json.dumps(str(tmp_path / 'status'))}\n"
            "expiration_timer_frequency: null\n")
    return parse_config(text + extra)


def write_journal(tmp_path: Path, name: str, items: list[bytes], tail: bytes = b"") -> Path:
    """A journal file of ADDX records (and C{tail}) written with the project's encoder."""
    folder = tmp_path / "queues"
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_bytes(b"".join(rec.encode_add(data, ADD_MS) for data in items) + tail)
    return path


def big_items() -> list[bytes]:
    return [b"big-%04d" % i + b"." * 40 for i in range(BIG)]


def loading_collection(tmp_path: Path, clock: Clock, extra: str = "") -> QueueCollection:
    """A collection over the journals of C{tmp_path}, loading them one step per turn."""
    c = QueueCollection(make_config(tmp_path, extra), clock, replay_slice_seconds=0.0,
                        replay_step_bytes=512, replay_pause=PAUSE)
    return c


def fired(d: Deferred) -> list[object]:
    """A box that gets C{d}'s result when it fires."""
    box: list[object] = []
    d.addBoth(box.append)
    return box


def run_until_loaded(c: QueueCollection, clock: Clock, limit: int = 10_000) -> int:
    """Advance turn by turn until nothing loads; return how many turns it took."""
    for turn in range(limit):
        if not c.loading_names():
            return turn
        clock.advance(PAUSE)
    raise AssertionError("replay never ended")


@pytest.fixture
def two_queues(tmp_path: Path) -> Path:
    """A big journal (many replay steps) and a small one (one step)."""
    write_journal(tmp_path, "big", big_items())
    write_journal(tmp_path, "small", [b"s0", b"s1"])
    return tmp_path


def test_ports_first_then_smallest_queue_first(two_queues: Path, clock: Clock) -> None:
    """Nothing is replayed in start_loading itself; the small queue is loaded first."""
    c = loading_collection(two_queues, clock)
    loaded = fired(c.start_loading())
    assert c.loading_names() == ["small", "big"]
    assert c.queue_names(include_aliases=False) == []
    clock.advance(PAUSE)
    assert c.loading_names() == ["big"]
    assert c.queue_names(include_aliases=False) == ["small"]
    assert loaded == []
    turns = run_until_loaded(c, clock)
    assert turns > 5  # the big journal took many turns
    assert loaded == [None]
    assert c.queues_loading() == 0
    c.stopService()


def test_progress_logged_during_a_long_replay(two_queues: Path, clock: Clock) -> None:
    """Every REPLAY_PROGRESS_INTERVAL seconds, even in the middle of one queue's journal."""
    c = loading_collection(two_queues, clock)
    c.start_loading()
    with capturedLogs() as events:
        for _ in range(int(REPLAY_PROGRESS_INTERVAL / PAUSE) + 1):
            clock.advance(PAUSE)
    progress = [e for e in events if e.get("log_format", "").startswith("Replay progress")]
    assert len(progress) == 1
    assert (progress[0]["done"], progress[0]["count"], progress[0]["left"]) == (1, 2, 1)
    assert progress[0]["current"] == ", now big"
    assert "big" in c.loading_names()
    c.stopService()


def test_small_queue_served_while_big_replays(two_queues: Path, clock: Clock) -> None:
    c = loading_collection(two_queues, clock)
    c.start_loading()
    clock.advance(PAUSE)
    clock.advance(PAUSE)
    assert c.loading_names() == ["big"]
    got = fired(c.remove("small"))
    assert isinstance(got[0], QItem) and got[0].data == b"s0"
    assert fired(c.add("small", b"s2")) == [True]
    assert fired(c.remove("small", peek=True))[0].data == b"s1"  # type: ignore[union-attr]
    assert c.loading_names() == ["big"]
    c.stopService()


def test_new_queue_served_during_replay(two_queues: Path, clock: Clock) -> None:
    """A queue with no journal on disk is created and served at once."""
    c = loading_collection(two_queues, clock)
    c.start_loading()
    assert fired(c.add("fresh", b"x")) == [True]
    got = fired(c.remove("fresh"))
    assert isinstance(got[0], QItem) and got[0].data == b"x"
    assert c.loading_names() == ["small", "big"]
    c.stopService()


def test_waiting_set_and_get_served_after_replay(two_queues: Path, clock: Clock) -> None:
    """Requests for a loading queue wait, then are served in order, as usual."""
    c = loading_collection(two_queues, clock)
    c.start_loading()
    clock.advance(PAUSE)
    clock.advance(PAUSE)
    got = fired(c.remove("big"))
    added = fired(c.add("big", b"late"))
    peeked = fired(c.remove("big", peek=True))
    assert got == [] and added == [] and peeked == []
    clock.advance(PAUSE)
    assert got == [] and "big" in c.loading_names()
    run_until_loaded(c, clock)
    assert isinstance(got[0], QItem) and got[0].data == big_items()[0]
    assert added == [True]
    assert isinstance(peeked[0], QItem) and peeked[0].data == big_items()[1]
    big = c.queue("big", create=False)
    assert big is not None and big.length == BIG  # one taken, one added
    assert c.stats.get_hits == 2 and c.stats.total_items == 1
    c.stopService()


def test_blocking_read_answers_empty_at_its_deadline(two_queues: Path, clock: Clock) -> None:
    """A read with a deadline gets "no item" at the deadline if the queue still loads."""
    c = loading_collection(two_queues, clock)
    c.start_loading()
    got = fired(c.remove("big", deadline=clock.seconds() + 2.5 * PAUSE))
    later = fired(c.remove("big", deadline=clock.seconds() + 10_000.0))
    clock.advance(PAUSE)
    clock.advance(PAUSE)
    assert got == []
    clock.advance(PAUSE)
    assert got == [None]
    assert "big" in c.loading_names()
    assert c.stats.get_misses == 1
    assert later == []
    run_until_loaded(c, clock)
    assert isinstance(later[0], QItem) and later[0].data == big_items()[0]
    c.stopService()


def test_cancelled_wait_leaves_the_line(two_queues: Path, clock: Clock) -> None:
    """A withdrawn read takes no item once the queue is ready."""
    c = loading_collection(two_queues, clock)
    c.start_loading()
    d = c.remove("big", deadline=clock.seconds() + 10_000.0)
    d.addErrback(lambda f: None)
    d.cancel()
    run_until_loaded(c, clock)
    big = c.queue("big", create=False)
    assert big is not None and big.length == BIG
    c.stopService()


@pytest.mark.parametrize("command", ["flush", "delete", "flush_expired"])
def test_commands_that_cannot_wait_are_refused(two_queues: Path, clock: Clock,
                                               command: str) -> None:
    c = loading_collection(two_queues, clock)
    c.start_loading()
    clock.advance(PAUSE)
    with pytest.raises(QueueLoading) as e:
        getattr(c, command)("big")
    assert "queue big is still loading its journal" in str(e.value)
    assert command in str(e.value)
    with pytest.raises(QueueLoading, match="queue big is still loading its journal; "
                                           "flush_all refused"):
        c.flush_all()
    assert c.queue("small", create=False).length == 2  # type: ignore[union-attr]
    run_until_loaded(c, clock)
    big = c.queue("big", create=False)
    assert big is not None and big.length == BIG  # nothing was flushed or deleted
    getattr(c, command)("big")
    c.flush_all()
    c.stopService()


def test_flush_all_names_the_loading_queues(two_queues: Path, clock: Clock) -> None:
    c = loading_collection(two_queues, clock)
    c.start_loading()
    with pytest.raises(QueueLoading, match="queue small and 1 other.s. are still loading"):
        c.flush_all()
    c.stopService()


def test_stop_during_replay_is_quick_and_keeps_journals(two_queues: Path, clock: Clock) -> None:
    """A stop mid-replay ends waiting requests and leaves every journal as it was."""
    big = two_queues / "queues" / "big"
    # A torn tail: cut off only by a replay that reaches it.
    with open(big, "ab") as f:
        f.write(b"\x02\x00\x10")
    before = {p.name: p.read_bytes() for p in (two_queues / "queues").iterdir()}
    c = loading_collection(two_queues, clock)
    loaded = fired(c.start_loading())
    clock.advance(PAUSE)
    clock.advance(PAUSE)
    got = fired(c.remove("big"))
    added = fired(c.add("big", b"never"))
    with capturedLogs() as events:
        stopped = fired(c.stopService())
    assert stopped == [None]
    assert got == [None]
    assert isinstance(added[0], Failure) and added[0].check(ShuttingDown)
    assert isinstance(loaded[0], Failure) and loaded[0].check(ShuttingDown)
    assert any("not loaded" in e.get("log_format", "") for e in events)
    assert not clock.getDelayedCalls()
    after = {p.name: p.read_bytes() for p in (two_queues / "queues").iterdir()}
    assert after == before

    again = QueueCollection(make_config(two_queues), clock)
    again.startService()
    queue = again.queue("big", create=False)
    assert queue is not None and queue.length == BIG
    assert os.path.getsize(big) == len(before["big"]) - 3  # this replay cut the torn tail
    again.stopService()


def test_fanout_child_loading_gets_the_masters_adds(tmp_path: Path, clock: Clock) -> None:
    """
    An add to a master reaches a fanout child that is still loading: it
    waits, and is acknowledged once the child holds it too.
    """
    write_journal(tmp_path, "m+child", big_items())
    c = loading_collection(tmp_path, clock)
    c.start_loading()
    added = fired(c.add("m", b"to-all"))
    assert added == []
    run_until_loaded(c, clock)
    assert added == [True]
    child = c.queue("m+child", create=False)
    assert child is not None and child.length == BIG + 1
    c.stopService()


@pytest.mark.parametrize("journals", [True, False])
def test_everything_alive_is_frozen_once_loaded(tmp_path: Path, clock: Clock,
                                                journals: bool) -> None:
    """
    Once start_loading's replay is done (at once when there is no journal),
    every object alive is out of the garbage collector's reach: the
    replayed items, and the objects made to start, are long-lived, and a
    full collection would walk them again for nothing. The collector is on.
    """
    if journals:
        write_journal(tmp_path, "big", big_items())
    c = loading_collection(tmp_path, clock)
    gc.unfreeze()
    try:
        loaded = fired(c.start_loading())
        if journals:
            assert gc.get_freeze_count() == 0  # (nothing frozen while it replays)
            run_until_loaded(c, clock)
        assert loaded == [None]
        assert gc.isenabled()
        assert gc.get_freeze_count() > 0
        reached = {id(obj) for obj in gc.get_objects()}  # (every generation but the frozen)
        assert gc.is_tracked(c) and id(c) not in reached
        if journals:
            queue = c.queue("big", create=False)
            assert queue is not None
            item = queue.peek()
            assert item is not None and item.data == big_items()[0]
            assert gc.is_tracked(item) and id(item) not in reached
    finally:
        gc.unfreeze()
        c.stopService()


def test_synchronous_start_still_replays_everything(two_queues: Path, clock: Clock) -> None:
    """startService (tools, tests) replays every journal before it returns."""
    c = QueueCollection(make_config(two_queues), clock, replay_step_bytes=64)
    with capturedLogs() as events:
        c.startService()
    assert c.loading_names() == []
    assert sorted(c.queue_names(include_aliases=False)) == ["big", "small"]
    assert any(e.get("log_format", "").startswith("Replay finished") for e in events)
    c.stopService()


def test_journal_that_cannot_be_read_fails_the_load(two_queues: Path, clock: Clock) -> None:
    """
    A journal that cannot be replayed fails when_loaded (the server then
    stops, as when replay came before the listeners); waiting requests end.
    """
    c = loading_collection(two_queues, clock)
    loaded = fired(c.start_loading())
    got = fired(c.remove("big"))
    big = two_queues / "queues" / "big"
    big.unlink()
    big.mkdir()  # (listed as a journal, found to be no regular file when its turn comes)
    with capturedLogs() as events:
        run_until_loaded(c, clock)
    assert isinstance(loaded[0], Failure)
    assert "not a regular file" in str(loaded[0].value)
    assert got == [None]
    assert any("Replaying queue {queue} failed" in e.get("log_format", "") for e in events)
    assert c.queue("small", create=False) is not None
    c.stopService()
