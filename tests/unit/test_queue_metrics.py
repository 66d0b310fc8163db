"""
PersistentQueue's observer: journal rewrite, rotation and read-behind times
measured on the injected clock, and the request, queue and open-read sizes
of Kestrel's metrics (docs/metrics.md), recorded into a real L{QueueMetrics}.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.task import Clock

from kestrel.config import QueueConfig
from kestrel.journal.journal import FileJournal
from kestrel.journal.memory import MemoryJournal
from kestrel.metrics import Histogram, QueueMetrics
from kestrel.queue import PersistentQueue
from tests.unit.test_queue import value

#: Clock seconds each timed journal operation takes in these tests.
ROTATE_COST = 0.0025
REWRITE_COST = 0.004
FILL_COST = 0.001


class TimedJournal:
    """
    A real journal whose maintenance operations take clock time.

    Everything is delegated to the wrapped journal; C{rotate}, C{rewrite}
    and C{fill_read_behind} first advance the clock by their cost, so the
    queue's measurements have a known true value.
    """

    def __init__(self, journal: Any, clock: Clock) -> None:
        self._journal = journal
        self._clock = clock
        self.fills = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._journal, name)

    def rotate(self, *args: Any, **kwargs: Any) -> None:
        self._clock.advance(ROTATE_COST)
        self._journal.rotate(*args, **kwargs)

    def rewrite(self, *args: Any, **kwargs: Any) -> None:
        self._clock.advance(REWRITE_COST)
        self._journal.rewrite(*args, **kwargs)

    def fill_read_behind(self, *args: Any, **kwargs: Any) -> bool:
        self.fills += 1
        self._clock.advance(FILL_COST)
        return self._journal.fill_read_behind(*args, **kwargs)


class CountingClock(Clock):
    """A Clock that counts how often it is read."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def seconds(self) -> float:
        self.reads += 1
        return super().seconds()


def timed_queue(path: Any, clock: Clock, metrics: QueueMetrics | None,
                **config: Any) -> tuple[PersistentQueue, TimedJournal]:
    """A replayed queue on a real file journal whose maintenance takes clock time."""
    journal = TimedJournal(FileJournal(str(path), "q", clock, None), clock)
    q = PersistentQueue("q", QueueConfig(**config), journal, clock, observer=metrics)
    q.setup()
    return q, journal


def assert_all(h: Histogram, count: int, usec: int) -> None:
    """C{h} holds exactly C{count} values, each C{usec} (give or take float rounding: 1 us)."""
    assert h.count == count
    assert usec - 1 <= h.minimum <= h.maximum <= usec + 1


def test_rotation_time_is_measured_on_the_clock(tmp_path, clock: Clock) -> None:
    """Each journal rotation records its clock duration in journal_rotation_usec."""
    metrics = QueueMetrics()
    q, _ = timed_queue(tmp_path, clock, metrics, max_memory_size=100)
    for i in range(40):
        assert value(q.add(b"%010d" % i)) is True
    assert q.journal_rotations >= 2
    assert_all(metrics.journal_rotation_usec, q.journal_rotations, int(ROTATE_COST * 1e6))
    assert metrics.journal_rewrite_usec.count == 0


def test_rewrite_time_is_measured_on_the_clock(tmp_path, clock: Clock) -> None:
    """Each rewrite of an emptied journal records its clock duration in journal_rewrite_usec."""
    metrics = QueueMetrics()
    q, _ = timed_queue(tmp_path, clock, metrics, default_journal_size=60)
    for _ in range(3):
        for i in range(6):
            value(q.add(b"%010d" % i))
        while q.remove() is not None:
            pass
    assert q.journal_rewrites == 3
    assert_all(metrics.journal_rewrite_usec, 3, int(REWRITE_COST * 1e6))
    assert metrics.journal_rotation_usec.count == 0


def test_graceful_close_rewrite_is_measured(tmp_path, clock: Clock) -> None:
    """The rewrite of an empty queue's journal at a graceful close is recorded too."""
    metrics = QueueMetrics()
    q, _ = timed_queue(tmp_path, clock, metrics)
    value(q.add(b"x"))
    q.remove()
    value(q.close(graceful=True))
    assert_all(metrics.journal_rewrite_usec, 1, int(REWRITE_COST * 1e6))


def test_read_behind_refill_time_is_measured(tmp_path, clock: Clock) -> None:
    """
    Each refill from the journal records, in fill_readbehind_usec, the clock
    time of all the records it read; a queue not in read-behind records none.
    """
    metrics = QueueMetrics()
    q, journal = timed_queue(tmp_path, clock, metrics, max_memory_size=50)
    for i in range(20):
        value(q.add(b"%010d" % i))
    assert q.in_read_behind
    assert metrics.fill_readbehind_usec.count == 0
    got = [q.remove().data for _ in range(20)]
    assert got == [b"%010d" % i for i in range(20)]
    assert not q.in_read_behind
    fills = metrics.fill_readbehind_usec
    assert 1 <= fills.count <= journal.fills
    # Float rounding of clock differences: at most 1 us per recorded value.
    assert abs(fills.total - journal.fills * int(FILL_COST * 1e6)) <= fills.count
    assert fills.minimum >= int(FILL_COST * 1e6) - 1
    recorded = fills.count
    value(q.add(b"after"))
    q.remove()
    assert fills.count == recorded  # out of read-behind: nothing to refill, nothing recorded


def test_request_and_queue_sizes() -> None:
    """
    request_size records each stored add's payload size; queue_size the
    items in memory after each add and remove; refused adds record nothing.
    """
    clock = Clock()
    metrics = QueueMetrics()
    q = PersistentQueue("q", QueueConfig(max_items=2), MemoryJournal(), clock, observer=metrics)
    for data in (b"abc", b"defgh", b"refused"):
        value(q.add(data))
    q.remove()
    q.remove()
    q.remove()  # empty: nothing removed, nothing recorded
    assert (metrics.request_size.count, metrics.request_size.total) == (2, 8)
    assert (metrics.request_size.minimum, metrics.request_size.maximum) == (3, 5)
    sizes = metrics.queue_size
    assert (sizes.count, sizes.total, sizes.maximum) == (4, 1 + 2 + 1 + 0, 2)


def test_open_read_table_sizes() -> None:
    """
    tx_map_size follows every change of the open reads (open, confirm,
    abort, continue); tx_expire_list_size counts them only under
    open_transaction_timeout.
    """
    clock = Clock()
    metrics = QueueMetrics()
    q = PersistentQueue("q", QueueConfig(), MemoryJournal(), clock, observer=metrics)
    for data in (b"a", b"b", b"c"):
        value(q.add(data))
    a = q.remove(open_read=True)
    b = q.remove(open_read=True)
    q.confirm_remove(a.xid)  # 1 left
    q.unremove(b.xid)  # 0 left
    c = q.remove(open_read=True)  # 1
    value(q.add(b"next", xid=c.xid))  # continue: 0
    tx = metrics.tx_map_size
    assert (tx.count, tx.total, tx.maximum) == (6, 1 + 2 + 1 + 0 + 1 + 0, 2)
    assert (metrics.tx_expire_list_size.count, metrics.tx_expire_list_size.maximum) == (6, 0)

    timed = QueueMetrics()
    q = PersistentQueue("t", QueueConfig(open_transaction_timeout=5.0), MemoryJournal(), clock,
                        observer=timed)
    value(q.add(b"a"))
    q.remove(open_read=True)
    clock.advance(6)  # timed out: aborted
    assert q.open_read_count == 0
    expiring = timed.tx_expire_list_size
    assert (expiring.count, expiring.total) == (2, 1)


@given(st.lists(st.one_of(st.binary(max_size=20), st.none()), max_size=40))
def test_queue_size_tracks_memory_length(ops: list[bytes | None]) -> None:
    """After any run of adds (bytes) and removes (None), queue_size last recorded memory_length."""
    last: list[int] = []

    class Recorder(QueueMetrics):
        __slots__ = ()

        def item_added(self, size: int, queue_size: int) -> None:
            super().item_added(size, queue_size)
            last.append(queue_size)

        def item_removed(self, queue_size: int) -> None:
            super().item_removed(queue_size)
            last.append(queue_size)

    metrics = Recorder()
    q = PersistentQueue("q", QueueConfig(), MemoryJournal(), Clock(), observer=metrics)
    adds = 0
    for op in ops:
        if op is None:
            if q.remove() is not None:
                assert last[-1] == q.memory_length
        else:
            value(q.add(op))
            adds += 1
            assert last[-1] == q.memory_length
    assert metrics.request_size.count == adds
    assert metrics.queue_size.count == len(last)


def test_no_observer_reads_no_extra_clock(tmp_path) -> None:
    """
    Without an observer, rotations and rewrites read the clock no more than
    plain adds do; with one, each reads it exactly twice (start and end).
    """
    def run(path: Any, metrics: QueueMetrics | None) -> tuple[int, int]:
        clock = CountingClock()
        path.mkdir()
        q, _ = timed_queue(path, clock, metrics, max_memory_size=100)
        clock.reads = 0
        for i in range(40):
            value(q.add(b"%010d" % i))
        return clock.reads, q.journal_rotations

    bare_reads, rotations = run(tmp_path / "bare", None)
    observed_reads, observed_rotations = run(tmp_path / "observed", QueueMetrics())
    assert rotations == observed_rotations >= 2
    assert observed_reads == bare_reads + 2 * rotations
