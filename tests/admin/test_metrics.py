"""The O(1) histogram behind the latency metrics."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from kestrel.item import QItem
from kestrel.metrics import (
    BUCKETS,
    GLOBAL_METRICS,
    QUEUE_METRICS,
    Histogram,
    Metrics,
    bucket_bounds,
)

success_result_of = SynchronousTestCase().successResultOf


@given(st.integers(0, 2**63 - 1))
def test_every_value_falls_inside_its_bucket(value: int) -> None:
    """A value's bucket bounds contain it, and a bucket is at most 1/8 of its lower bound wide."""
    h = Histogram()
    h.add(value)
    (index,) = [i for i, n in enumerate(h.buckets) if n]
    assert 0 <= index < BUCKETS
    low, high = bucket_bounds(index)
    assert low <= value <= high
    assert high - low <= max(0, low // 8)


def test_buckets_tile_the_integers() -> None:
    """Consecutive buckets are adjacent: no gap, no overlap."""
    for index in range(BUCKETS - 1):
        assert bucket_bounds(index)[1] + 1 == bucket_bounds(index + 1)[0]


@given(st.lists(st.integers(0, 10**7), min_size=1, max_size=300),
       st.sampled_from([0.5, 0.9, 0.99, 0.999]))
def test_percentiles_are_within_bucket_error(values: list[int], fraction: float) -> None:
    """A percentile is within 1/8 of a value whose rank is the requested one."""
    h = Histogram()
    for v in values:
        h.add(v)
    ordered = sorted(values)
    rank = max(1, int(fraction * len(values) + 0.5))
    exact = ordered[rank - 1]
    got = h.percentile(fraction)
    assert abs(got - exact) <= exact / 8 + 1
    assert h.minimum <= got <= h.maximum


def test_summary_has_ostrichs_fields() -> None:
    """The summary holds count, minimum, maximum, average and p50..p9999."""
    h = Histogram()
    for v in (10, 20, 30, 40, 1000):
        h.add(v)
    s = h.summary()
    assert list(s) == ["count", "minimum", "maximum", "average", "p50", "p90", "p95", "p99",
                       "p999", "p9999"]
    assert (s["count"], s["minimum"], s["maximum"], s["average"]) == (5, 10, 1000, 220.0)
    assert s["p50"] == 30
    assert s["p9999"] == 1000
    assert Histogram().summary()["p99"] == 0


def test_negative_and_float_values() -> None:
    """Negative durations (a clock step back) count as 0; floats are rounded."""
    h = Histogram()
    h.add(-5)
    h.add(2.9)
    h.add(1.2)
    assert (h.count, h.minimum, h.maximum, h.total) == (3, 0, 3, 4)


def test_cumulative_counts_are_monotonic() -> None:
    """cumulative() gives non-decreasing counts ending at most at the total."""
    h = Histogram()
    for v in (1, 5, 100, 1000, 5000, 10**6):
        h.add(v)
    counts = h.cumulative((0, 10, 1000, 10**5, 10**9))
    assert counts == sorted(counts)
    assert counts[0] == 0 and counts[1] == 2 and counts[-1] == 6


def test_metrics_registry_names() -> None:
    """
    Global and per-queue metrics carry Kestrel's names; a global latency is the
    sum of the queues'; deleted queues vanish from the report, not from the sums.
    """
    m = Metrics()
    m.record_set("other", 120)
    m.queue("jobs").delivery_latency_msec.add(7)
    report = m.report()
    assert set(GLOBAL_METRICS) <= set(report)
    assert {f"q/jobs/{n}" for n in QUEUE_METRICS} <= set(report)
    assert report["set_latency_usec"]["count"] == 1
    assert report["q/jobs/delivery_latency_msec"]["maximum"] == 7
    m.remove_queue("jobs")
    m.remove_queue("other")
    report = m.report()
    assert not any(k.startswith("q/") for k in report)
    # What deleted queues recorded stays in the global distributions.
    assert report["set_latency_usec"]["count"] == 1
    assert report["delivery_latency_msec"]["maximum"] == 7


def test_queue_metrics_declares_every_name_for_the_type_checker() -> None:
    """QueueMetrics annotates exactly the QUEUE_METRICS names, in order, as histograms."""
    from kestrel.metrics import QueueMetrics

    assert tuple(QueueMetrics.__annotations__) == QUEUE_METRICS
    assert set(QueueMetrics.__annotations__.values()) == {"Histogram"}
    assert dict(QueueMetrics().items()).keys() == set(QUEUE_METRICS)


def reference_counts(values: list[int | float]) -> tuple[int, int, int, int, list[int]]:
    """Count, total, minimum, maximum and buckets of C{values}, one value at a time."""
    buckets = [0] * BUCKETS
    rounded = [max(0, round(v)) for v in values]
    for v in rounded:
        index = next(i for i in range(BUCKETS) if bucket_bounds(i)[0] <= v <= bucket_bounds(i)[1])
        buckets[index] += 1
    if not rounded:
        return 0, 0, 0, 0, buckets
    return len(rounded), sum(rounded), min(rounded), max(rounded), buckets


@given(st.lists(st.one_of(st.integers(-5, 10**6), st.floats(-3.0, 1e5)), max_size=1500),
       st.lists(st.integers(0, 1500), max_size=4), st.lists(st.integers(0, 1500), max_size=4))
def test_pending_values_are_all_counted_exactly(values: list[int | float], reads_at: list[int],
                                                settles_at: list[int]) -> None:
    """
    Values wait in C{pending} until a settle counts them in bulk; whenever
    it is read, a histogram holds exactly what counting each value on its
    own gives, however its settles and reads fell.
    """
    h = Histogram()
    for position, value in enumerate(values):
        if position in reads_at:
            assert h.count == position
            assert h.pending == []
        if position in settles_at:
            h.settle()
            assert h.pending == []
        h.add(value)
    assert (h.count, h.total, h.minimum, h.maximum, h.buckets) == reference_counts(values)


def test_metrics_settle_counts_every_histogram() -> None:
    """L{Metrics.settle} leaves nothing pending in any histogram, and loses nothing."""
    m = Metrics()
    queue = m.queue("q")
    rounds = 2000
    for n in range(rounds):
        queue.item_added(1024, n)
        queue.item_removed(n)
        m.record_hit("q", 2.4, 7.0)
        m.record_fsync(0.001, [0.002])
    every = [h for _, h in queue.items()] + [m.fsync_delay_usec, m.item_fsync_delay_usec]
    assert max(len(h.pending) for h in every) == 2 * rounds
    m.settle()
    assert [h for h in every if h.pending] == []
    assert queue.request_size.count == rounds and queue.request_size.total == 1024 * rounds
    assert queue.queue_size.count == 2 * rounds and queue.queue_size.maximum == rounds - 1
    hits = queue.get_hit_latency_usec
    assert hits.count == rounds and hits.total == 2 * rounds
    assert m.delivery_latency_msec.total == 7 * rounds
    assert m.fsync_delay_usec.count == rounds and m.item_fsync_delay_usec.total == 2000 * rounds


def test_write_recorder_times_a_deferred(clock: Clock) -> None:
    """write_recorder records, in usec, the clock time until the add's Deferred fires."""
    m = Metrics()
    d: Deferred[bool] = Deferred()
    d.addBoth(m.write_recorder(clock, "jobs"))
    clock.advance(0.0025)
    d.callback(True)
    assert success_result_of(d) is True
    assert m.set_latency_usec.maximum == 2500
    assert m.queue("jobs").set_latency_usec.count == 1


def test_read_recorder_splits_hits_and_misses(clock: Clock) -> None:
    """A hit records hit latency and delivery latency; a miss records miss latency."""
    m = Metrics()
    item = QItem(b"x", add_time_ms=int(clock.seconds() * 1000) - 750)
    record = m.read_recorder(clock, "jobs")
    clock.advance(0.001)
    assert record(item) is item
    assert m.get_hit_latency_usec.maximum == 1000
    assert m.delivery_latency_msec.maximum == 751
    assert m.queue("jobs").delivery_latency_msec.count == 1
    miss = m.read_recorder(clock, "jobs")
    clock.advance(0.5)
    assert miss(None) is None
    assert m.get_miss_latency_usec.maximum == 500_000
    assert m.get_hit_latency_usec.count == 1


def test_direct_recorders_write_global_and_queue_histograms() -> None:
    """record_set / record_hit / record_miss / record_get_timeout fill both levels."""
    m = Metrics()
    m.record_set("q", 12.4)
    m.record_hit("q", 30, 2500)
    m.record_hit("q", 40)  # a peek: no delivery
    m.record_miss("q", 7)
    m.record_get_timeout("q", 500)
    q = m.queue("q")
    assert (m.set_latency_usec.count, q.set_latency_usec.maximum) == (1, 12)
    assert (m.get_hit_latency_usec.count, q.get_hit_latency_usec.count) == (2, 2)
    assert (m.delivery_latency_msec.count, q.delivery_latency_msec.maximum) == (1, 2500)
    assert (m.get_miss_latency_usec.count, q.get_miss_latency_usec.minimum) == (1, 7)
    assert (m.get_timeout_msec.total, q.get_timeout_msec.total) == (500, 500)


def test_record_fsync_takes_the_journal_observer_shape() -> None:
    """record_fsync(seconds, write_delays) records microseconds: one fsync, one value per write."""
    m = Metrics()
    m.record_fsync(0.0015, [0.002, 0.0035])
    m.record_fsync(0.001, [])
    assert (m.fsync_delay_usec.count, m.fsync_delay_usec.minimum,
            m.fsync_delay_usec.maximum) == (2, 1000, 1500)
    assert (m.item_fsync_delay_usec.count, m.item_fsync_delay_usec.total) == (2, 5500)


@given(st.dictionaries(st.sampled_from(["a", "b", "c"]),
                       st.lists(st.integers(0, 10**9), max_size=20), max_size=3),
       st.sets(st.sampled_from(["a", "b", "c"])))
def test_global_latency_is_the_sum_of_the_queues(recorded: dict[str, list[int]],
                                                deleted: set[str]) -> None:
    """A global latency equals one histogram fed every value of every queue, deleted or not."""
    m = Metrics()
    expected = Histogram()
    for queue, values in recorded.items():
        for v in values:
            m.record_set(queue, v)
            expected.add(v)
    for queue in deleted:
        m.remove_queue(queue)
    got = m.set_latency_usec
    assert (got.count, got.total, got.minimum, got.maximum) == (
        expected.count, expected.total, expected.minimum, expected.maximum)
    assert got.buckets == expected.buckets
