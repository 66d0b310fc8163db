"""Replay skips the adds beyond max_memory_size by size, and the queue comes out the same."""

from __future__ import annotations

import os
import tempfile
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock

from kestrel.journal import records as rec
from kestrel.journal.journal import FileJournal
from tests.unit.test_queue import datas, value
from tests.unit.test_queue_file import open_queue, restart

ADD_MS = 1_767_225_600_123
DATA = st.binary(max_size=40)

ops_strategy = st.lists(st.one_of(
    st.builds(lambda d: rec.Add(d, ADD_MS, 0), DATA),
    st.just(rec.Remove()),
    st.builds(rec.SaveXid, st.integers(0, 5)),
    st.builds(lambda d: rec.AddXid(1, d, ADD_MS, 0), DATA),
), max_size=60)


def assert_skip_matches_decoding(buf: bytes) -> None:
    """skip_adds measures exactly the leading run of ADDX records that decoding finds."""
    decoded = rec.decode_prefix(buf)
    run = 0
    for r in decoded.records:
        if type(r) is not rec.Add:
            break
        run += 1
    got = rec.skip_adds(buf, 0)
    assert got.records == run
    assert got.data_bytes == sum(len(r.data) for r in decoded.records[:run])
    assert got.end == (decoded.offsets[run] if run < len(decoded.offsets) else decoded.end)


@given(st.lists(st.one_of(st.builds(lambda d: rec.Add(d, ADD_MS, 7), DATA),
                          st.just(rec.Remove()),
                          st.builds(rec.SaveXid, st.integers(0, 9))), max_size=20),
       st.integers(0, 30))
def test_skip_adds_measures_the_leading_run_of_addx(records: list[rec.Record], cut: int) -> None:
    buf = b"".join(r.encode() for r in records)
    assert_skip_matches_decoding(buf[:max(0, len(buf) - cut)])


def test_skip_adds_stops_at_an_impossible_block() -> None:
    good = rec.encode_add(b"abc", ADD_MS)
    bad = b"\x02" + (3).to_bytes(4, "little") + bytes(16)
    assert rec.skip_adds(good + bad + good, 0) == rec.SkippedAdds(1, 3, len(good))


def write_journal(folder: str, records: list[rec.Record]) -> None:
    with open(os.path.join(folder, "q"), "wb") as f:
        f.write(b"".join(r.encode() for r in records))


@given(ops_strategy, st.integers(0, 120))
def test_replay_into_read_behind_matches_replay_in_memory(records: list[rec.Record],
                                                          memory: int) -> None:
    """Whatever the journal, a queue past max_memory_size replays to the same items and counts."""
    with tempfile.TemporaryDirectory() as small, tempfile.TemporaryDirectory() as big:
        write_journal(small, records)
        write_journal(big, records)
        clock = Clock()
        skipped = open_queue(small, clock, max_memory_size=memory)
        whole = open_queue(big, clock, max_memory_size=1 << 30)
        assert (skipped.length, skipped.bytes) == (whole.length, whole.bytes)
        assert (skipped.put_items, skipped.put_bytes) == (whole.put_items, whole.put_bytes)
        assert datas(skipped) == datas(whole)


def test_adds_in_read_behind_are_counted_not_decoded(tmp_path) -> None:
    """Once the reader is open, apply never sees an ADDX: count_adds gets their number and size."""
    items = [b"%04d" % i for i in range(10)]
    write_journal(str(tmp_path), [rec.Add(d, ADD_MS, 0) for d in items] + [rec.Remove()])
    journal = FileJournal(str(tmp_path), "q", Clock(), None)
    applied: list[rec.Record] = []
    counted: list[tuple[int, int]] = []

    def apply(record: rec.Record) -> None:
        applied.append(record)
        if len(applied) == 3:
            journal.start_read_behind()

    journal.on_skipped_adds = lambda n, size: counted.append((n, size))
    journal.replay(apply)
    assert [r.data for r in applied[:3]] == items[:3]
    assert applied[3:] == [rec.Remove()]
    assert counted == [(7, 28)]
    value_closed = journal.close()
    assert value_closed.called


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 80)), max_size=6),
       st.sampled_from([b"", b"\x01", b"\x02\x20\x00", rec.SaveXid(3).encode()]),
       st.integers(0, 40))
def test_skip_adds_over_runs_of_equal_items(runs: list[tuple[int, int]], tail: bytes,
                                             cut: int) -> None:
    """Runs of same-sized items (measured many at a time) and what ends them."""
    records = [rec.Add(b"z" * size, ADD_MS, 0) for size, n in runs for _ in range(n)]
    buf = b"".join(r.encode() for r in records) + tail
    assert_skip_matches_decoding(buf[:max(0, len(buf) - cut)])


def test_memory_size_zero_replays_the_item_left(tmp_path) -> None:
    """Regression: max_memory_size 0, add ab, add cd, get, replay: cd is still there to read."""
    write_journal(str(tmp_path), [rec.Add(b"ab", ADD_MS, 0), rec.Add(b"cd", ADD_MS, 0),
                                  rec.Remove()])
    q = open_queue(tmp_path, Clock(), max_memory_size=0)
    assert (q.length, q.bytes) == (1, 2)
    item = q.remove()
    assert item is not None and item.data == b"cd"
    assert (q.length, q.bytes) == (0, 0)


@pytest.mark.parametrize("memory", [0, 1])
def test_memory_size_zero_or_one_live_then_restart(tmp_path, memory: int) -> None:
    """The live queue hands out every item in order, and so does the queue replayed after a get."""
    clock = Clock()
    q = open_queue(tmp_path, clock, max_memory_size=memory)
    for data in (b"ab", b"cd", b"ef"):
        assert value(q.add(data)) is True
    assert q.peek().data == b"ab"
    assert q.remove().data == b"ab"
    q = restart(q, tmp_path, clock, max_memory_size=memory)
    assert (q.length, q.bytes) == (2, 4)
    assert q.peek().data == b"cd"
    assert datas(q) == [b"cd", b"ef"]
    assert (q.length, q.bytes) == (0, 0)


model_ops = st.lists(st.one_of(
    st.tuples(st.just("add"), st.binary(max_size=6)),
    st.tuples(st.just("get"), st.none()),
    st.tuples(st.just("open"), st.none()),
    st.tuples(st.just("confirm"), st.integers(0, 3)),
    st.tuples(st.just("abort"), st.integers(0, 3)),
    st.tuples(st.just("restart"), st.none()),
), max_size=40)


@settings(deadline=None)
@given(model_ops, st.integers(0, 12))
def test_queue_in_read_behind_matches_a_memory_model(ops: list[tuple[str, object]],
                                                     memory: int) -> None:
    """
    Any adds, gets, opens, confirms, aborts and restarts on a queue with a
    small max_memory_size (read-behind and rotations nearly all the time)
    hand out the same items in the same order as a plain in-memory FIFO, and
    a final replay leaves the same items, length and bytes.
    """
    clock = Clock()
    with tempfile.TemporaryDirectory() as folder:
        q = open_queue(folder, clock, max_memory_size=memory)
        model: deque[bytes] = deque()
        model_open: dict[int, bytes] = {}
        for op, arg in ops:
            if op == "add":
                assert value(q.add(arg)) is True
                model.append(arg)
            elif op in ("get", "open"):
                item = q.remove(open_read=op == "open")
                expected = model.popleft() if model else None
                assert (item.data if item is not None else None) == expected
                if op == "open" and item is not None:
                    model_open[item.xid] = item.data
            elif op in ("confirm", "abort") and model_open:
                xid = sorted(model_open)[arg % len(model_open)]
                data = model_open.pop(xid)
                if op == "confirm":
                    q.confirm_remove(xid)
                else:
                    q.unremove(xid)
                    model.appendleft(data)
            elif op == "restart":
                q = restart(q, folder, clock, max_memory_size=memory)
                for xid in sorted(model_open, reverse=True):
                    model.appendleft(model_open[xid])
                model_open = {}
            assert (q.length, q.bytes) == (len(model), sum(len(d) for d in model))
        q = restart(q, folder, clock, max_memory_size=memory)
        for xid in sorted(model_open, reverse=True):
            model.appendleft(model_open[xid])
        assert (q.length, q.bytes) == (len(model), sum(len(d) for d in model))
        assert datas(q) == list(model)
        value(q.close())


def test_read_behind_reads_legacy_adds_as_replay_does(tmp_path) -> None:
    """A Kestrel 1.x ADD read by the read-behind reader: stamped now, expiry seconds to ms."""
    write_journal(str(tmp_path), [rec.Add(b"new", ADD_MS, 0), rec.LegacyAdd(b"old", 1_767_300_000),
                                  rec.LegacyAdd(b"older", 0)])
    clock = Clock()
    clock.advance(1_767_225_700.0)
    q = open_queue(tmp_path, clock, max_memory_size=0)
    assert q.in_read_behind
    assert (q.length, q.bytes) == (3, 11)
    got = [q.remove() for _ in range(3)]
    now_ms = 1_767_225_700_000
    assert [(i.data, i.add_time_ms, i.expiry_ms) for i in got] == [
        (b"new", ADD_MS, 0), (b"old", now_ms, 1_767_300_000_000), (b"older", now_ms, 0)]
