"""
Latency and size distributions ("metrics" in Ostrich's terms), cheap enough for the hot path.

A L{Histogram} records a value with one list append; the values are
counted into buckets in bulk, once per distinct value, when anything is read
or its owner settles it (the server settles every histogram once a second:
L{SETTLE_INTERVAL}). Buckets are log-linear (8 per power of two, exact below
16), so any percentile is within about 6% of the true value. Reports compute
percentiles by walking the 500 buckets, which only the admin endpoints do.

L{Metrics} holds one L{QueueMetrics} per queue (Ostrich's C{q/<name>/...}
metrics) and the server-wide histograms; a server-wide read or write latency
is the sum of the queues' (each value is recorded once, in its queue). The
names are Kestrel's (C{docs/metrics.md}). Nothing here reads a clock:
callers measure with their injected clock and record the difference.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from operator import attrgetter
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class _Clock(Protocol):
    def seconds(self) -> float: ...


def elapsed_recorder(histograms: tuple[Histogram, ...], clock: _Clock,
                     scale: float = 1e6) -> Callable[[T], T]:
    """
    Start timing now; return a pass-through callback that records the elapsed time.

    The callback adds C{(clock.seconds() - start) * scale} (microseconds by
    default) to every histogram in C{histograms} and returns its argument
    unchanged, so it can be added to a Deferred with C{addBoth}.
    """
    started = clock.seconds()

    def record(result: T) -> T:
        elapsed = (clock.seconds() - started) * scale
        for h in histograms:
            h.add(elapsed)
        return result

    return record

_SUB_BITS = 3
_SUB = 1 << _SUB_BITS
_EXACT = 2 * _SUB
#: Enough buckets for any non-negative 64-bit value.
BUCKETS = (64 - _SUB_BITS) * _SUB + _SUB

#: The percentiles reported for every histogram, as (label, fraction).
PERCENTILES = (("p50", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99),
               ("p999", 0.999), ("p9999", 0.9999))


def bucket_bounds(index: int) -> tuple[int, int]:
    """Return the smallest and largest value that fall in bucket C{index}."""
    if index < _EXACT:
        return index, index
    shift = index // _SUB - 1
    mantissa = index % _SUB + _SUB
    return mantissa << shift, ((mantissa + 1) << shift) - 1


#: Seconds between two settles of every histogram of a server (L{Metrics.settle}):
#: what waits uncounted is at most what the server recorded in that time.
SETTLE_INTERVAL = 1.0


def _settled(field: str, doc: str) -> property:
    """A read-only L{Histogram} attribute: C{field}, once the pending values are counted."""

    def get(self: Histogram) -> Any:
        if self.pending:
            self.settle()
        return getattr(self, field)

    return property(get, doc=doc)


class Histogram:
    """
    A distribution of non-negative integers: count, sum, min, max and bucketed counts.

    Recording (L{add}) is one list append, with no check: values wait in
    L{pending} and are counted (L{settle}) before anything is read, so every
    reader sees every value recorded, and whenever the histogram's owner
    settles it. An owner that records without end settles on a clock (a
    server's L{Metrics}: every L{SETTLE_INTERVAL}), which bounds what waits
    by what it records in that time. Values are rounded to whole units
    (as C{round} does: half to even), then counted once per distinct value:
    sizes, queue lengths and whole microseconds repeat.

    @ivar add: record one value (floats are rounded as C{round} does,
        negatives count as 0): C{pending}'s own C{append}. A caller that
        records per request calls C{pending.append} itself: the same call,
        which CPython 3.11 specializes (a callable held by an instance, as
        C{add} is, is not).
    """

    __slots__ = ("_count", "_total", "_minimum", "_maximum", "_buckets", "pending", "add")

    def __init__(self) -> None:
        self._count = 0
        self._total = 0
        self._minimum = 0
        self._maximum = 0
        self._buckets = [0] * BUCKETS
        #: Values recorded and not yet counted.
        self.pending: list[int | float] = []
        self.add: Callable[[int | float], None] = self.pending.append

    def settle(self) -> None:
        """Count every pending value (readers call it, and the histogram's owner)."""
        pending = self.pending
        if not pending:
            return
        # (counted per distinct value in C: latencies are floats, nearly all
        # distinct, so they are rounded first; sizes and lengths are ints,
        # which rounding leaves as they are, at more cost than counting them)
        distinct = Counter(pending if pending[0].__class__ is int else map(round, pending))
        pending.clear()
        buckets = self._buckets
        count = self._count
        total = self._total
        low = self._minimum
        high = self._maximum
        for v, n in distinct.items():
            if v.__class__ is not int:  # (a float among ints)
                v = round(v)
            if v < 0:
                v = 0
            if v < _EXACT:
                buckets[v] += n
            else:
                shift = v.bit_length() - _SUB_BITS - 1
                buckets[(shift + 1) * _SUB + (v >> shift) - _SUB] += n
            if count == 0 or v < low:
                low = v
            if v > high:
                high = v
            count += n
            total += v * n
        self._count = count
        self._total = total
        self._minimum = low
        self._maximum = high

    count = _settled("_count", "How many values were recorded.")
    total = _settled("_total", "The sum of the recorded values (each rounded as it is counted).")
    minimum = _settled("_minimum", "The smallest recorded value (0 when empty).")
    maximum = _settled("_maximum", "The largest recorded value (0 when empty).")
    buckets = _settled("_buckets", "The count of values per bucket (see L{bucket_bounds}); "
                                   "do not modify.")

    def merge(self, other: Histogram) -> None:
        """Add every value recorded in C{other} to this histogram."""
        if other.count == 0:
            return
        if self.pending:
            self.settle()
        buckets = self._buckets
        for index, n in enumerate(other.buckets):
            if n:
                buckets[index] += n
        self._minimum = other.minimum if self._count == 0 else min(self._minimum, other.minimum)
        self._maximum = max(self._maximum, other.maximum)
        self._count += other.count
        self._total += other.total

    def clear(self) -> None:
        """Forget every recorded value."""
        self.pending.clear()
        self._count = self._total = self._minimum = self._maximum = 0
        self._buckets = [0] * BUCKETS

    @property
    def average(self) -> float:
        """The mean of the recorded values (0 when empty)."""
        return self.total / self.count if self.count else 0.0

    def percentile(self, fraction: float) -> int:
        """
        Return a value at or near the C{fraction} quantile (0 when empty).

        The answer is the midpoint of the bucket holding that rank, clamped to
        the observed minimum and maximum; the top rank is the maximum itself.
        """
        if self.count == 0:
            return 0
        rank = max(1, int(fraction * self.count + 0.5))
        if rank >= self.count:
            return self.maximum
        seen = 0
        for index, n in enumerate(self.buckets):
            if n:
                seen += n
                if seen >= rank:
                    low, high = bucket_bounds(index)
                    return min(max((low + high) // 2, self.minimum), self.maximum)
        return self.maximum

    def summary(self) -> dict[str, int | float]:
        """Return Ostrich's report: count, minimum, maximum, average, then the percentiles."""
        report: dict[str, int | float] = {
            "count": self.count, "minimum": self.minimum, "maximum": self.maximum,
            "average": round(self.average, 3),
        }
        for label, fraction in PERCENTILES:
            report[label] = self.percentile(fraction)
        return report

    def cumulative(self, bounds: tuple[int, ...]) -> list[int]:
        """
        Return, for each upper bound in ascending C{bounds}, how many values are at most it.

        Counts are by bucket, so a bucket straddling a bound counts wholly below
        it only if its midpoint is; this is the Prometheus C{le} view.
        """
        out = []
        index = 0
        running = 0
        for bound in bounds:
            while index < BUCKETS:
                low, high = bucket_bounds(index)
                if (low + high) // 2 > bound:
                    break
                running += self.buckets[index]
                index += 1
            out.append(running)
        return out


#: Server-wide metric names (Kestrel's).
GLOBAL_METRICS = (
    "set_latency_usec", "get_timeout_msec", "delivery_latency_msec", "get_hit_latency_usec",
    "get_miss_latency_usec", "item_fsync_delay_usec", "fsync_delay_usec",
)

#: Per-queue metric names (Kestrel's).
QUEUE_METRICS = (
    "journal_rewrite_usec", "journal_rotation_usec", "set_latency_usec", "get_timeout_msec",
    "delivery_latency_msec", "get_hit_latency_usec", "get_miss_latency_usec",
    "fill_readbehind_usec", "tx_map_size", "tx_expire_list_size", "queue_size",
    "request_size",
)


#: The histograms of a L{QueueMetrics}, in L{QUEUE_METRICS} order, as a tuple.
_queue_histograms = attrgetter(*QUEUE_METRICS)


class QueueMetrics:
    """
    The histograms of one queue, one attribute per name in L{QUEUE_METRICS}.

    It is also the queue's observer (the shape of
    L{kestrel.queue.QueueObserver}): C{PersistentQueue} calls the methods
    below, which record C{journal_rewrite_usec}, C{journal_rotation_usec},
    C{fill_readbehind_usec} (from seconds), C{request_size},
    C{queue_size}, C{tx_map_size} and C{tx_expire_list_size}; a durable
    add adds its own C{set_latency_usec}.
    """

    __slots__ = QUEUE_METRICS
    # One annotation per name of QUEUE_METRICS, in its order (a test checks it).
    journal_rewrite_usec: Histogram
    journal_rotation_usec: Histogram
    set_latency_usec: Histogram
    get_timeout_msec: Histogram
    delivery_latency_msec: Histogram
    get_hit_latency_usec: Histogram
    get_miss_latency_usec: Histogram
    fill_readbehind_usec: Histogram
    tx_map_size: Histogram
    tx_expire_list_size: Histogram
    queue_size: Histogram
    request_size: Histogram

    def __init__(self) -> None:
        for name in QUEUE_METRICS:
            setattr(self, name, Histogram())

    def items(self) -> Iterator[tuple[str, Histogram]]:
        """Yield C{(name, histogram)} in L{QUEUE_METRICS} order."""
        yield from zip(QUEUE_METRICS, _queue_histograms(self), strict=True)

    def journal_rewritten(self, seconds: float) -> None:
        """Record one journal rewrite's C{journal_rewrite_usec}."""
        self.journal_rewrite_usec.add(seconds * 1e6)

    def journal_rotated(self, seconds: float) -> None:
        """Record one journal rotation's C{journal_rotation_usec}."""
        self.journal_rotation_usec.add(seconds * 1e6)

    def read_behind_filled(self, seconds: float) -> None:
        """Record one read-behind refill's C{fill_readbehind_usec}."""
        self.fill_readbehind_usec.add(seconds * 1e6)

    def item_added(self, size: int, queue_size: int) -> None:
        """Record a stored add: its C{request_size} (bytes) and the C{queue_size} after it."""
        self.request_size.pending.append(size)
        self.queue_size.pending.append(queue_size)

    def item_removed(self, queue_size: int) -> None:
        """Record the C{queue_size} (items in memory) after a remove."""
        self.queue_size.pending.append(queue_size)

    def open_reads_changed(self, open_reads: int, expiring: int) -> None:
        """Record C{tx_map_size} (open reads) and C{tx_expire_list_size} (those with a timeout)."""
        self.tx_map_size.pending.append(open_reads)
        self.tx_expire_list_size.pending.append(expiring)


#: The global metrics that are sums of per-queue ones: recorded per queue only.
SUMMED_METRICS = ("set_latency_usec", "get_timeout_msec", "delivery_latency_msec",
                  "get_hit_latency_usec", "get_miss_latency_usec")


def _summed(name: str) -> property:
    """A read-only L{Metrics} attribute: the sum over every queue (deleted ones too) of C{name}."""

    def total(self: Metrics) -> Histogram:
        return self.summed(name)

    return property(total, doc=f"C{{{name}}} of every queue (a fresh snapshot).")


class Metrics:
    """
    Every histogram of one server: the global ones as attributes, per-queue ones by name.

    The read and write latencies (L{SUMMED_METRICS}) are recorded once, in
    the queue's histogram (C{record_set}, C{record_hit}, ...: one
    L{Histogram.add} per value on the hot path); their global attribute is
    the sum over every queue, deleted ones included, computed when read (a
    snapshot: adding to it records nothing). C{fsync_delay_usec} and
    C{item_fsync_delay_usec} are global only and recorded directly.
    """

    set_latency_usec = _summed("set_latency_usec")
    get_timeout_msec = _summed("get_timeout_msec")
    delivery_latency_msec = _summed("delivery_latency_msec")
    get_hit_latency_usec = _summed("get_hit_latency_usec")
    get_miss_latency_usec = _summed("get_miss_latency_usec")

    def __init__(self) -> None:
        self.fsync_delay_usec = Histogram()
        self.item_fsync_delay_usec = Histogram()
        self._queues: dict[str, QueueMetrics] = {}
        # What deleted queues recorded, still part of the global sums.
        self._retired = QueueMetrics()

    def summed(self, name: str) -> Histogram:
        """A new histogram holding C{name} (one of L{SUMMED_METRICS}) of every queue."""
        total = Histogram()
        total.merge(getattr(self._retired, name))
        for metrics in self._queues.values():
            total.merge(getattr(metrics, name))
        return total

    def settle(self) -> None:
        """
        Count what every histogram holds pending (L{Histogram.settle}): the
        server calls it every L{SETTLE_INTERVAL} seconds.
        """
        self.fsync_delay_usec.settle()
        self.item_fsync_delay_usec.settle()
        for metrics in self._queues.values():
            for h in _queue_histograms(metrics):
                h.settle()

    def queue(self, name: str) -> QueueMetrics:
        """Return the histograms of queue C{name}, creating them on first use."""
        metrics = self._queues.get(name)
        if metrics is None:
            metrics = self._queues[name] = QueueMetrics()
        return metrics

    def remove_queue(self, name: str) -> None:
        """
        Forget queue C{name}'s histograms (Kestrel drops C{q/<name>/*} on
        delete); what it recorded stays in the global sums.
        """
        metrics = self._queues.pop(name, None)
        if metrics is not None:
            for metric in SUMMED_METRICS:
                getattr(self._retired, metric).merge(getattr(metrics, metric))

    def queue_names(self) -> list[str]:
        """The queues that have histograms, sorted."""
        return sorted(self._queues)

    def global_items(self) -> Iterator[tuple[str, Histogram]]:
        """Yield C{(name, histogram)} for the server-wide metrics in L{GLOBAL_METRICS} order."""
        for name in GLOBAL_METRICS:
            yield name, getattr(self, name)

    def record_set(self, queue: str, usec: float) -> None:
        """Record one write's C{set_latency_usec} for C{queue} (and so globally)."""
        (self._queues.get(queue) or self.queue(queue)).set_latency_usec.pending.append(usec)

    def record_hit(self, queue: str, usec: float, delivery_msec: float | None = None) -> None:
        """
        Record C{get_hit_latency_usec} of a read of C{queue} answered with an
        item and, for an item removed, its C{delivery_latency_msec}.
        """
        metrics = self._queues.get(queue) or self.queue(queue)
        metrics.get_hit_latency_usec.pending.append(usec)
        if delivery_msec is not None:
            metrics.delivery_latency_msec.pending.append(delivery_msec)

    def record_miss(self, queue: str, usec: float) -> None:
        """Record C{get_miss_latency_usec} of a read of C{queue} answered empty."""
        (self._queues.get(queue) or self.queue(queue)).get_miss_latency_usec.pending.append(usec)

    def record_delivery(self, queue: str, msec: float) -> None:
        """Record C{delivery_latency_msec} (add to delivery) of one item of C{queue}."""
        self.queue(queue).delivery_latency_msec.add(msec)

    def record_get_timeout(self, queue: str, msec: float) -> None:
        """Record C{get_timeout_msec} of a blocking read of C{queue} that timed out."""
        self.queue(queue).get_timeout_msec.add(msec)

    def record_fsync(self, seconds: float, write_delays: Iterable[float] = ()) -> None:
        """
        Record one journal fsync, in the journal's observer shape (seconds):
        C{fsync_delay_usec} (how long it took) and, per write it made durable,
        C{item_fsync_delay_usec} (from that write until the fsync ended).
        """
        self.fsync_delay_usec.add(seconds * 1e6)
        item = self.item_fsync_delay_usec
        for delay in write_delays:
            item.pending.append(delay * 1e6)

    def write_recorder(self, clock: _Clock, queue: str) -> Callable[[T], T]:
        """
        Start timing a write to C{queue}; return the callback that records C{set_latency_usec}.

        Use: C{collection.add(...).addBoth(metrics.write_recorder(clock, name))}.
        """
        return elapsed_recorder((self.queue(queue).set_latency_usec,), clock)

    def read_recorder(self, clock: _Clock, queue: str) -> Callable[[Any], Any]:
        """
        Start timing a read of C{queue}; return the callback that records its outcome.

        Given the item (anything with C{add_time_ms}), it records
        C{get_hit_latency_usec} and C{delivery_latency_msec} (add to delivery);
        given None, C{get_miss_latency_usec}. Use:
        C{collection.remove(...).addCallback(metrics.read_recorder(clock, name))}.
        """
        started = clock.seconds()

        def record(item: Any) -> Any:
            now = clock.seconds()
            usec = (now - started) * 1e6
            if item is None:
                self.record_miss(queue, usec)
            else:
                self.record_hit(queue, usec, now * 1000 - item.add_time_ms)
            return item

        return record

    def report(self) -> dict[str, dict[str, int | float]]:
        """Return every metric's summary by its Ostrich name (C{q/<queue>/<metric>} per queue)."""
        out = {name: h.summary() for name, h in self.global_items()}
        for queue in self.queue_names():
            for name, h in self._queues[queue].items():
                out[f"q/{queue}/{name}"] = h.summary()
        return out
