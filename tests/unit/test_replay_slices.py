"""Replay in slices (FileJournal.replay_steps) ends as replay in one go: same queue, same files."""

from __future__ import annotations

import os
import tempfile

from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.task import Clock

from kestrel.config import QueueConfig
from kestrel.journal import records as rec
from kestrel.journal.journal import FileJournal
from kestrel.queue import PersistentQueue
from tests.unit.test_queue import datas

ADD_MS = 1_767_225_600_123
DATA = st.binary(max_size=40)

records_strategy = st.lists(st.one_of(
    st.builds(lambda d: rec.Add(d, ADD_MS, 0), DATA),
    st.just(rec.Remove()),
    st.builds(rec.SaveXid, st.integers(0, 5)),
    st.builds(lambda d: rec.AddXid(1, d, ADD_MS, 0), DATA),
    st.builds(rec.RemoveTentativeXid, st.integers(1, 9)),
    st.builds(rec.ConfirmRemove, st.integers(1, 9)),
), max_size=60)


def queue_in(folder: str, clock: Clock, memory: int) -> tuple[PersistentQueue, FileJournal]:
    journal = FileJournal(folder, "q", clock, None)
    return PersistentQueue("q", QueueConfig(max_memory_size=memory), journal, clock), journal


@given(records_strategy, st.binary(max_size=12), st.integers(1, 200), st.integers(0, 120))
def test_sliced_replay_matches_replay_in_one_go(records: list[rec.Record], tail: bytes,
                                               step: int, memory: int) -> None:
    """Whatever the journal (torn tail included) and the slice, the same queue and file."""
    body = b"".join(r.encode() for r in records) + tail
    with tempfile.TemporaryDirectory() as one, tempfile.TemporaryDirectory() as sliced:
        for folder in (one, sliced):
            with open(os.path.join(folder, "q"), "wb") as f:
                f.write(body)
        clock = Clock()
        whole, _ = queue_in(one, clock, memory)
        whole.setup()
        parts, _ = queue_in(sliced, clock, memory)
        pauses = sum(1 for _ in parts.setup_steps(step))
        assert pauses >= len(body) // (32 * step + 64) - 1  # it did pause
        assert (parts.length, parts.bytes, parts.xid_counter) == (
            whole.length, whole.bytes, whole.xid_counter)
        assert [i.data for i in parts.open_items()] == [i.data for i in whole.open_items()]
        with open(os.path.join(one, "q"), "rb") as a, open(os.path.join(sliced, "q"), "rb") as b:
            assert a.read() == b.read()
        assert datas(parts) == datas(whole)


@given(records_strategy, st.integers(1, 64), st.integers(0, 30))
def test_replay_closed_midway_leaves_the_file_untouched(records: list[rec.Record], step: int,
                                                        stop_after: int) -> None:
    """A replay stopped between two slices (a shutdown) changes no byte of the journal."""
    body = b"".join(r.encode() for r in records) + b"\x02\x00"  # a torn tail
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "q")
        with open(path, "wb") as f:
            f.write(body)
        clock = Clock()
        queue, journal = queue_in(folder, clock, 1 << 20)
        steps = queue.setup_steps(step)
        for _ in zip(range(stop_after), steps, strict=False):
            pass
        finished = next(steps, None) is None
        steps.close()
        if not finished:
            journal.close()
            with open(path, "rb") as f:
                assert f.read() == body
            assert not journal.is_replaying
