"""
Write batches over a real QueueCollection: journal records held back in a
batch reach the files before anything leaves for another reader, and what
such a reader does at once is never held back.
"""

from __future__ import annotations

import json
from pathlib import Path

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from kestrel.collection import QueueCollection
from kestrel.config import parse_config
from kestrel.journal.batch import WriteCoalescer
from kestrel.journal.records import iter_records
from kestrel.journal.syncfile import PeriodicSyncFile


def make_collection(tmp_path: Path, clock: Clock) -> QueueCollection:
    text = (f"queue_path: {json.dumps(str(tmp_path / 'queues'))}\n"
            f"status_file: {json.dumps(str(tmp_path / 'status'))}\n"
            "expiration_timer_frequency: null\n")
    collection = QueueCollection(parse_config(text), clock)
    collection.startService()
    return collection


def on_disk(tmp_path: Path, name: str) -> list[str]:
    """The kinds of the records in queue C{name}'s current journal file."""
    data = (tmp_path / "queues" / name).read_bytes()
    return [type(record).__name__ for _offset, record in iter_records(data)]


def test_batch_holds_queue_writes_until_it_ends(tmp_path: Path, clock: Clock) -> None:
    """Adds and removes in a batch are in memory at once and in the file when it ends."""
    collection = make_collection(tmp_path, clock)
    coalescer = collection.write_coalescer
    collection.add("q", b"warm")  # creates the file
    coalescer.begin()
    collection.add("q", b"a")
    collection.add("q", b"b")
    collection.remove("q")
    assert on_disk(tmp_path, "q") == ["Add"]
    assert collection.queue("q").length == 2
    assert not collection.queue("q").journal.writes_now()
    coalescer.end()
    assert collection.queue("q").journal.writes_now()
    assert on_disk(tmp_path, "q") == ["Add", "Add", "Add", "Remove"]
    collection.stopService()


def test_woken_reader_runs_outside_the_batch(tmp_path: Path, clock: Clock) -> None:
    """
    A reader blocked on a queue is woken by an add held in another
    connection's batch only at the batch's flush: it finds the add in the
    file, its own remove is written on its own (not held), and so are the
    writes its reply sets off; the batch goes on holding back what follows.
    """
    collection = make_collection(tmp_path, clock)
    coalescer = collection.write_coalescer
    collection.add("other", b"warm")
    collection.add("q", b"warm")
    collection.remove("q")
    seen: list[object] = []

    def woken(item: object) -> None:
        seen.append((item.data, on_disk(tmp_path, "q"), coalescer.active))
        collection.add("other", b"reply")
        seen.append(on_disk(tmp_path, "other"))

    waiting: Deferred = collection.remove("q", deadline=clock.seconds() + 10)
    waiting.addCallback(woken)
    coalescer.begin()
    collection.add("q", b"x")
    assert seen == []  # the add is not in the OS yet
    assert coalescer.flush_batch() is True
    assert seen == [(b"x", ["Add", "Remove", "Add", "Remove"], False), ["Add", "Add"]]
    assert coalescer.active
    collection.add("other", b"held")
    assert on_disk(tmp_path, "other") == ["Add", "Add"]
    coalescer.end()
    assert on_disk(tmp_path, "other") == ["Add", "Add", "Add"]
    collection.stopService()


def test_stop_flushes_a_held_batch(tmp_path: Path, clock: Clock) -> None:
    """Closing the journals hands held records over first: a restart replays them."""
    collection = make_collection(tmp_path, clock)
    collection.write_coalescer.begin()
    collection.add("q", b"kept")
    collection.stopService()
    again = make_collection(tmp_path, clock)
    assert again.queue("q").length == 1
    again.stopService()


def test_after_flush_waits_for_the_batch_and_runs_outside_it(tmp_path: Path,
                                                              clock: Clock) -> None:
    """
    Outside a batch, after_flush is a plain call; inside, the call waits for
    the flush, finds the held bytes in the file, and its own writes go
    straight through while the batch stays open.
    """
    coalescer = WriteCoalescer()
    f = PeriodicSyncFile(str(tmp_path / "j"), clock, None, coalescer=coalescer)
    calls: list[object] = []
    coalescer.after_flush(calls.append, 1)
    assert calls == [1]
    coalescer.begin()
    f.write(b"held")

    def inside() -> None:
        f.write(b"+direct")
        calls.append((tmp_path / "j").read_bytes())

    coalescer.after_flush(inside)
    assert calls == [1]
    assert coalescer.flush_batch() is True
    assert calls == [1, b"held+direct"]
    assert coalescer.active
    f.write(b"+again")
    assert (tmp_path / "j").read_bytes() == b"held+direct"
    coalescer.end()
    assert (tmp_path / "j").read_bytes() == b"held+direct+again"
    f.close()
