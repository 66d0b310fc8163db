"""FIFO replay of one queue agrees with an object-level model (no Spark needed)."""

from __future__ import annotations

import random
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

np = pytest.importorskip("numpy")
pytest.importorskip("pyarrow")

from kestrel.analytics.replay import nearest_rank, replay_queue  # noqa: E402
from kestrel.analytics.scan import scan_buffer, time_bounds, time_estimates  # noqa: E402
from kestrel.journal import events, records  # noqa: E402
from tests.analytics.journals import QueueWriter  # noqa: E402


def _replay(buf: bytes, start: int | None = None, end: int | None = None,
            filler: list[bool] | None = None) -> object:
    scan = scan_buffer(buf)
    lb, ub = time_bounds(scan, start, end)
    est = time_estimates(scan, lb, ub)
    fill = np.zeros(scan.count, bool) if filler is None else np.asarray(filler)
    return replay_queue(scan.op, scan.xid, scan.size, scan.add_ms, scan.expiry_ms, lb, ub, est,
                        fill)


@given(st.integers(0, 2**32), st.integers(0, 120))
def test_replay_matches_the_model(seed: int, ops: int) -> None:
    """After any valid history, queued items, open reads and bytes equal the model's."""
    w = QueueWriter("s", "q", random.Random(seed))
    w.random_ops(ops)
    r = _replay(bytes(w.current.data))
    assert r.queued == len(w.items)
    assert r.open_reads == len(w.open)
    assert r.bytes_left == sum(len(i.data) for i in [*w.items, *w.open.values()])
    assert r.items_left == r.queued + r.open_reads
    removed = [rec for rec in w.current.recs
               if rec.removed is not None and rec.removed.add_ms is not None]
    assert len(r.wait_lb_ms) == len(removed)


def test_unremove_returns_that_item_to_the_head() -> None:
    """Aborting the first of two open reads puts its item (not the last popped) at the head."""
    buf = b"".join([
        records.encode_add(b"a", 1_000), records.encode_add(b"bb", 2_000),
        records.encode_add(b"ccc", 3_000),
        records.encode_xid(9, 1), records.encode_xid(9, 2), records.encode_xid(5, 1),
        records.REMOVE_BYTES, records.encode_add(b"", 70_000), records.encode_xid(6, 2)])
    r = _replay(buf)
    assert (r.queued, r.open_reads, r.bytes_left) == (2, 0, 3)
    # "a" (added at 1 s) was removed by the REMOVE bracketed in [3 s, 70 s]
    assert sorted(r.wait_lb_ms.tolist()) == [2_000, 68_000]
    assert sorted(r.wait_ub_ms.tolist()) == [68_000, 69_000]


def test_records_that_cannot_apply_change_nothing() -> None:
    """A pop of an empty queue or an unknown xid is ignored, as the server's replay does."""
    buf = b"".join([records.REMOVE_BYTES, records.encode_xid(9, 7), records.encode_xid(6, 7),
                    records.encode_xid(5, 8), records.encode_add(b"x", 5),
                    records.encode_xid(6, 3), records.Continue(4, b"yy", 6).encode()])
    r = _replay(buf)
    assert (r.queued, r.open_reads, r.bytes_left, len(r.wait_lb_ms)) == (2, 0, 3, 0)


def test_legacy_tentative_removes_take_the_next_free_xid() -> None:
    """Legacy REMOVE_TENTATIVE opens under the next xid after the counter, as our replay does."""
    buf = b"".join([records.encode_add(b"a", 1), records.encode_add(b"bb", 2),
                    records.encode_add(b"ccc", 3), records.encode_xid(4, 6), b"\x03", b"\x03",
                    records.encode_xid(6, 7), records.encode_xid(5, 8)])
    r = _replay(buf)
    assert (r.queued, r.open_reads, r.lost_open_reads, r.bytes_left) == (2, 0, 0, 5)


def test_reopening_an_open_xid_loses_its_item() -> None:
    """A second REMOVE_TENTATIVE_XID with a still-open xid overwrites it; the item is gone."""
    buf = b"".join([records.encode_add(b"a", 1), records.encode_add(b"b", 2),
                    records.encode_xid(9, 3), records.encode_xid(9, 3)])
    r = _replay(buf)
    assert (r.queued, r.open_reads, r.lost_open_reads, r.bytes_left) == (0, 1, 1, 1)


def test_backlog_is_the_state_at_the_end_of_each_minute() -> None:
    """One backlog point per minute holding the state after that minute's last record; the
    untimed REMOVE is dated midway between its neighbours (123 s), in a minute of its own."""
    buf = b"".join([records.encode_add(b"a", 60_000), records.encode_add(b"b", 61_000),
                    records.REMOVE_BYTES, records.encode_add(b"cc", 185_000)])
    r = _replay(buf)
    assert r.backlog_minute_ms.tolist() == [60_000, 120_000, 180_000]
    assert r.backlog_queued.tolist() == [2, 1, 2]
    assert r.backlog_bytes.tolist() == [2, 1, 3]


def test_a_drain_without_adds_is_spread_to_the_file_end() -> None:
    """40 items added, then read one every 2 s until the file's end: the dequeues and the
    backlog follow the reads (27 in the first minute, 13 in the second), not the last add."""
    t0 = 60_000 * 10 + 5_000
    adds = [records.encode_add(b"x", t0) for _ in range(40)]
    buf = b"".join(adds) + records.REMOVE_BYTES * 40
    end = t0 + 80_000  # the last read, 80 s after the adds (the live file's mtime)
    r = _replay(buf, end=end)
    assert r.backlog_minute_ms.tolist() == [600_000, 660_000]
    # true reads at t0 + 2 s * k: 27 before 660 s, 13 after; the estimate is within one
    assert abs(r.backlog_queued.tolist()[0] - 13) <= 1
    assert r.backlog_queued.tolist()[1] == 0
    assert r.last_clock_ms == end
    assert max(r.wait_ub_ms.tolist()) == 80_000 and min(r.wait_lb_ms.tolist()) == 0


def test_expiry_is_bracketed_by_the_removal_time() -> None:
    """A sweep's REMOVE is dated by the add before it (which precedes the expiry) and the add
    after it: the item counts as expired (at most), not certainly; a REMOVE after a timed
    record past the expiry is certain; a confirmed read never counts as expired."""
    buf = b"".join([records.encode_add(b"a", 1_000, 2_000),   # swept between 1 s and 5 s
                    records.REMOVE_BYTES,
                    records.encode_add(b"b", 5_000, 6_000),
                    records.encode_add(b"c", 7_000),           # past b's expiry
                    records.REMOVE_BYTES,                      # b: certainly expired
                    records.encode_add(b"d", 8_000, 8_500),
                    records.encode_xid(9, 1),                  # c opened ...
                    records.encode_xid(6, 1),                  # ... and confirmed
                    records.encode_add(b"e", 9_000)])
    r = _replay(buf)
    assert (r.expired_removed_min, r.expired_removed) == (1, 2)


def test_fillers_replay_but_do_not_count_as_waits() -> None:
    """A pack's filler is popped by a remove like any item but adds no time-in-queue sample."""
    buf = b"".join([records.encode_add(b"", 10_000), records.encode_add(b"x", 1_000, 2_000),
                    records.REMOVE_BYTES, records.REMOVE_BYTES])
    r = _replay(buf, end=50_000, filler=[True, False, False, False])
    assert (r.queued, len(r.wait_lb_ms), r.with_expiry, r.expired_removed) == (0, 1, 1, 1)
    assert r.wait_lb_ms.tolist() == [9_000]


def test_nearest_rank() -> None:
    """Percentiles are nearest-rank values taken from the data."""
    v = np.arange(1, 101)
    assert [nearest_rank(v, p) for p in (0.5, 0.9, 0.99)] == [50, 90, 99]
    assert nearest_rank(np.array([7]), 0.99) == 7
    assert nearest_rank(np.array([], dtype=np.int64), 0.5) is None


class _FifoModel(events.QueueEvents):
    """The replay rules of docs/analytics.md as queue events: what C{event_applier} drives."""

    __slots__ = ("queue", "open", "counter", "lost")

    def __init__(self) -> None:
        self.queue: deque[int] = deque()
        self.open: dict[int, int] = {}
        self.counter = 0
        self.lost = 0

    def added(self, item: object, xid: int) -> None:
        self.queue.append(len(item.data))  # type: ignore[attr-defined]

    def removed(self) -> None:
        if self.queue:
            self.queue.popleft()

    def opened(self, xid: int | None) -> None:
        if xid is None:
            xid = records.next_xid(self.counter, self.open)
        self.counter = xid
        if self.queue:
            if xid in self.open:
                self.lost += 1
            self.open[xid] = self.queue.popleft()

    def unremoved(self, xid: int) -> None:
        if xid in self.open:
            self.queue.appendleft(self.open.pop(xid))

    def confirmed(self, xid: int) -> None:
        self.open.pop(xid, None)

    def xid_saved(self, xid: int) -> None:
        self.counter = xid


_XIDS = st.integers(1, 6)
_DATA = st.binary(max_size=24)
_TIMES = st.integers(1, 10**12)
_ANY_RECORD = st.one_of(
    st.builds(records.Add, _DATA, _TIMES),
    st.builds(records.LegacyAdd, _DATA, st.integers(0, 10**9)),
    st.builds(records.AddXid, _XIDS, _DATA, _TIMES),
    st.builds(records.Continue, _XIDS, _DATA, _TIMES),
    st.just(records.Remove()),
    st.just(records.RemoveTentative()),
    st.builds(records.RemoveTentativeXid, _XIDS),
    st.builds(records.SaveXid, _XIDS),
    st.builds(records.Unremove, _XIDS),
    st.builds(records.ConfirmRemove, _XIDS),
)


@given(st.lists(_ANY_RECORD, max_size=80))
def test_column_replay_agrees_with_the_journal_event_table(recs: list) -> None:
    """
    The opcode-column replay means by each opcode what kestrel.journal.events
    means by its record: any stream of every record type (legacy ones too,
    xids colliding) leaves the same queue as the events applied to a model.
    """
    buf = b"".join(records.encode(r) for r in recs)
    model = _FifoModel()
    apply = events.event_applier(model, lambda: 0)
    for _, r in records.iter_records(buf):
        apply(r)
    got = _replay(buf)
    assert got.queued == len(model.queue)
    assert got.open_reads == len(model.open)
    assert got.bytes_left == sum(model.queue) + sum(model.open.values())
    assert got.lost_open_reads == model.lost


def test_opcode_groups_match_the_record_event_table() -> None:
    """Each C{*_OPCODES} group holds exactly the opcodes whose record fires that event."""
    samples = {records.Opcode.ADD: records.LegacyAdd(b"x"),
               records.Opcode.REMOVE: records.Remove(),
               records.Opcode.ADDX: records.Add(b"x", 1),
               records.Opcode.REMOVE_TENTATIVE: records.RemoveTentative(),
               records.Opcode.SAVE_XID: records.SaveXid(1),
               records.Opcode.UNREMOVE: records.Unremove(1),
               records.Opcode.CONFIRM_REMOVE: records.ConfirmRemove(1),
               records.Opcode.ADD_XID: records.AddXid(1, b"x", 1),
               records.Opcode.CONTINUE: records.Continue(1, b"x", 1),
               records.Opcode.REMOVE_TENTATIVE_XID: records.RemoveTentativeXid(1)}
    assert set(samples) == set(records.Opcode)

    class Fired(events.QueueEvents):
        __slots__ = ("names",)

        def __init__(self) -> None:
            self.names: set[str] = set()

        def added(self, item: object, xid: int) -> None:
            self.names.add("added")

        def removed(self) -> None:
            self.names.add("removed")

        def opened(self, xid: int | None) -> None:
            self.names.add("opened")

        def unremoved(self, xid: int) -> None:
            self.names.add("unremoved")

        def confirmed(self, xid: int) -> None:
            self.names.add("confirmed")

        def xid_saved(self, xid: int) -> None:
            self.names.add("xid_saved")

    fired = {}
    for op, r in samples.items():
        f = Fired()
        events.event_applier(f, lambda: 0)(r)
        fired[int(op)] = f.names
        assert records.encode(r)[0] == op
    by = {name: {op for op, names in fired.items() if name in names}
          for name in ("added", "opened", "confirmed", "unremoved")}
    assert set(events.ADD_OPCODES) == by["added"]
    assert set(events.OPEN_OPCODES) == by["opened"]
    assert set(events.CONFIRM_OPCODES) == by["confirmed"]
    assert set(events.ABORT_OPCODES) == by["unremoved"]
    assert set(events.DEQUEUE_OPCODES) == by["confirmed"] | {op for op, names in fired.items()
                                                               if "removed" in names}
    timed = {op for op, r in samples.items() if hasattr(r, "add_time_ms")}
    assert set(events.TIMED_OPCODES) == timed
    assert set(events.XID_OPCODES) == {op for op, r in samples.items() if hasattr(r, "xid")}


def _model(ops: list[int], xids: list[int],
           sizes: list[int]) -> tuple[list[int], list[tuple[int, int, int]], int, list[int]]:
    """One step per record, on a deque and a dict: the replay rules as the module states them.

    @return: per item, the record that removed it (-1: none); after each record, the queued
        items, open reads and bytes; the reads lost to a reopened xid; the items left.
    """
    removed_at = [-1] * len(ops)
    queue: deque[int] = deque()
    open_reads: dict[int, int] = {}
    after, nbytes, lost, counter = [], 0, 0, 0
    for i, (o, x) in enumerate(zip(ops, xids, strict=True)):
        if o in (0, 2, 7):
            queue.append(i)
            nbytes += sizes[i]
        elif o == 1 and queue:
            j = queue.popleft()
            removed_at[j] = i
            nbytes -= sizes[j]
        elif o in (3, 9):
            x = counter = x if o == 9 else records.next_xid(counter, open_reads)
            if queue:
                j = queue.popleft()
                if x in open_reads:
                    lost += 1
                    nbytes -= sizes[open_reads[x]]
                open_reads[x] = j
        elif o in (6, 8):
            j = open_reads.pop(x, -1)
            if j >= 0:
                removed_at[j] = i
                nbytes -= sizes[j]
            if o == 8:
                queue.append(i)
                nbytes += sizes[i]
        elif o == 5 and x in open_reads:
            queue.appendleft(open_reads.pop(x))
        elif o == 4:
            counter = x
        after.append((len(queue), len(open_reads), nbytes))
    return removed_at, after, lost, [*queue, *open_reads.values()]


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 300))
def test_any_record_stream_replays_like_one_step_per_record(seed: int, n: int) -> None:
    """On any stream (pops of an empty queue, unknown and reopened xids, aborts in a row,
    legacy opens, other rows), the bulk replay leaves what one step per record leaves:
    which record removed each item, the state after each minute, and what is left."""
    rng = random.Random(seed)
    weights = [rng.random() for _ in range(11)]  # each stream its own mix of records
    rows = [(rng.choices([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, -1], weights)[0], rng.randrange(3),
             rng.randrange(10), rng.random() < 0.1) for _ in range(n)]
    op = np.array([r[0] for r in rows], np.int64)
    xid = np.array([r[1] for r in rows], np.int64)
    size = np.array([r[2] for r in rows], np.int64)
    # a new minute after a record when its flag says so; every record timed, so waits show
    # which record removed which item
    est = np.cumsum([60_000 if r[3] else 1 for r in rows]).astype(np.int64)
    add_ms = np.where(np.isin(op, [0, 2, 7, 8]), est, np.iinfo(np.int64).min)
    none = np.full(n, np.iinfo(np.int64).min, np.int64)
    got = replay_queue(op, xid, size, add_ms, none, est, est, est, np.zeros(n, bool))
    removed_at, after, lost, left = _model(op.tolist(), xid.tolist(), size.tolist())
    done = [j for j in range(n) if removed_at[j] >= 0]
    assert got.wait_lb_ms.tolist() == [int(est[removed_at[j]] - est[j]) for j in done]
    ends = [i for i in range(n) if i == n - 1 or est[i] // 60_000 != est[i + 1] // 60_000]
    assert got.backlog_queued.tolist() == [after[i][0] for i in ends]
    assert got.backlog_open.tolist() == [after[i][1] for i in ends]
    assert got.backlog_bytes.tolist() == [after[i][2] for i in ends]
    assert (got.queued + got.open_reads, got.lost_open_reads) == (len(left), lost)
    assert got.bytes_left == after[-1][2]
