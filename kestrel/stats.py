"""
Server-wide counters and the memcache C{STATS} / C{DUMP_STATS} reports.

L{ServerStats} holds plain int attributes so the hot path pays one C{+= 1}.
The report functions build pure values (lists of pairs, strings): a protocol
only has to encode and send them. Their order and format are Kestrel 2.4's
C{STATS} and C{DUMP_STATS} replies (C{docs/metrics.md}).
"""

from __future__ import annotations

import os
import types
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

import attrs

#: Stat pairs as Kestrel reports them: (name, value as text).
StatList = list[tuple[str, str]]


class ServerStats:
    """
    The global counters of one server process.

    Every counter is a plain int attribute that callers bump directly
    (C{stats.cmd_get += 1}). C{start_time} is the clock time (epoch seconds)
    at which the server started, for C{uptime}. C{fsync_errors} counts fsync
    failures by exception class name (Kestrel's C{fsync_error_<class>}).
    """

    #: The counters, in the order the admin report lists them.
    COUNTERS: tuple[str, ...] = (
        "total_items", "cmd_get", "cmd_set", "cmd_peek", "get_hits", "get_misses",
        "bytes_read", "bytes_written", "curr_connections", "total_connections",
        "queue_creates", "queue_deletes", "queue_expires", "cmd_monitor",
        "cmd_monitor_get", "cmd_get_timeout_dropped", "waiters_aborted",
        "cmd_get_open_dropped", "finished_but_add",
    )

    def __init__(self, start_time: float) -> None:
        self.start_time = start_time
        self.total_items = 0
        self.cmd_get = 0
        self.cmd_set = 0
        self.cmd_peek = 0
        self.get_hits = 0
        self.get_misses = 0
        self.bytes_read = 0
        self.bytes_written = 0
        self.curr_connections = 0
        self.total_connections = 0
        self.queue_creates = 0
        self.queue_deletes = 0
        self.queue_expires = 0
        self.cmd_monitor = 0
        self.cmd_monitor_get = 0
        self.cmd_get_timeout_dropped = 0
        self.waiters_aborted = 0
        self.cmd_get_open_dropped = 0
        self.finished_but_add = 0
        self.fsync_errors: dict[str, int] = {}

    def record_fsync_error(self, error: BaseException) -> None:
        """Count one fsync failure under the class name of C{error}."""
        key = type(error).__name__
        self.fsync_errors[key] = self.fsync_errors.get(key, 0) + 1

    def counters(self) -> dict[str, int]:
        """
        Return every counter by name, C{fsync_error_<class>} ones included.

        The dict is a fresh copy; changing it changes nothing here.
        """
        result = {name: getattr(self, name) for name in self.COUNTERS}
        for cls, count in sorted(self.fsync_errors.items()):
            result[f"fsync_error_{cls}"] = count
        return result

    def uptime(self, now: float) -> int:
        """Whole seconds since C{start_time} at clock time C{now} (never negative)."""
        return max(0, int(now - self.start_time))


def _frozen_dict(value: Mapping[str, int]) -> Mapping[str, int]:
    """A read-only copy of C{value}."""
    return types.MappingProxyType(dict(value))


@attrs.frozen
class QueueReport:
    """
    One queue's state at one instant, as numbers (what C{/stats.json} and
    C{/metrics} report per queue; C{docs/metrics.md}).

    Limits are None when unlimited. C{journal_bytes} counts every journal file
    (current and archived); C{age_ms} is the age of the head item (0 when empty);
    C{counters} holds Kestrel's per-queue counters by name.
    """

    name: str
    items: int
    bytes: int
    max_items: int | None
    max_bytes: int | None
    journal_bytes: int
    mem_items: int
    mem_bytes: int
    age_ms: int
    waiters: int
    open_transactions: int
    create_time: float
    counters: Mapping[str, int] = attrs.field(converter=_frozen_dict)


@attrs.frozen
class AliasReport:
    """One alias at one instant: the adds it forwarded and when it was created."""

    name: str
    put_items: int
    put_bytes: int
    create_time: float


@attrs.frozen
class ServerReport:
    """
    The server-wide state at one instant: Kestrel's global counters (C{fsync_error_*}
    included), the totals over every queue, the connection count, uptime and status
    (C{readable} and C{writeable} are the 1.0/0.0 gauges of L{kestrel.status.ServerStatus}).
    """

    counters: Mapping[str, int] = attrs.field(converter=_frozen_dict)
    items: int
    bytes: int
    reserved_memory_ratio: float
    connections: int
    uptime: int
    version: str
    status: str
    readable: float
    writeable: float
    #: Queues whose journal is still being replayed at startup.
    queues_loading: int = 0


class StatsSource(Protocol):
    """What the reports need from the queue collection (see L{kestrel.collection})."""

    def current_items(self) -> int:
        """Items in every queue (open reads excluded)."""

    def current_bytes(self) -> int:
        """Payload bytes in every queue."""

    def reserved_memory_ratio(self) -> float:
        """Sum of the queues' C{max_memory_size} over the memory available."""

    def queue_names(self) -> list[str]:
        """Names of the queues, then of the aliases."""

    def dump_stats(self, name: str) -> StatList:
        """Per-queue (or alias) stats in Kestrel's order; [] for an unknown name."""

    def queues_loading(self) -> int:
        """How many queues are still loading their journal (startup replay)."""


def global_stat_entries(stats: ServerStats, *, now: float, version: str,
                        source: StatsSource) -> StatList:
    """
    The global part of the memcache C{STATS} reply, in Kestrel 2.4's order,
    then C{queues_loading} (queues still replaying their journal; not Kestrel's).

    C{now} is the clock time in epoch seconds.
    """
    return [
        ("uptime", str(stats.uptime(now))),
        ("time", str(int(now))),
        ("version", version),
        ("curr_items", str(source.current_items())),
        ("total_items", str(stats.total_items)),
        ("bytes", str(source.current_bytes())),
        ("reserved_memory_ratio", f"{source.reserved_memory_ratio():.3f}"),
        ("curr_connections", str(stats.curr_connections)),
        ("total_connections", str(stats.total_connections)),
        ("cmd_get", str(stats.cmd_get)),
        ("cmd_set", str(stats.cmd_set)),
        ("cmd_peek", str(stats.cmd_peek)),
        ("get_hits", str(stats.get_hits)),
        ("get_misses", str(stats.get_misses)),
        ("bytes_read", str(stats.bytes_read)),
        ("bytes_written", str(stats.bytes_written)),
        ("queue_creates", str(stats.queue_creates)),
        ("queue_deletes", str(stats.queue_deletes)),
        ("queue_expires", str(stats.queue_expires)),
        ("queues_loading", str(source.queues_loading())),
    ]


def stat_entries(stats: ServerStats, *, now: float, version: str,
                 source: StatsSource) -> StatList:
    """
    Every entry of the memcache C{STATS} reply, in order.

    The global entries come first, then C{queue_<name>_<stat>} for each queue
    and alias of C{source.queue_names()}, in that order.
    """
    entries = global_stat_entries(stats, now=now, version=version, source=source)
    for name in source.queue_names():
        prefix = f"queue_{name}_"
        entries.extend((prefix + key, value) for key, value in source.dump_stats(name))
    return entries


def format_stats(entries: Iterable[tuple[str, str]]) -> str:
    """
    The memcache C{STATS} reply text: C{"STAT <k> <v>\\r\\n"} per entry, then C{"END\\r\\n"}.
    """
    return "".join(f"STAT {key} {value}\r\n" for key, value in entries) + "END\r\n"


def dump_stat_blocks(source: StatsSource, names: Sequence[str] = ()) -> list[tuple[str, StatList]]:
    """
    The C{DUMP_STATS} report as values: C{(name, stats)} per queue or alias named.

    C{names} defaults to every queue and alias; an unknown name gets [].
    """
    return [(name, source.dump_stats(name)) for name in names or source.queue_names()]


def format_stat_blocks(blocks: Iterable[tuple[str, StatList]]) -> str:
    """
    The memcache C{DUMP_STATS} reply text of L{dump_stat_blocks}, C{"\\r\\nEND\\r\\n"}
    included (as Kestrel).

    An empty stat list gives an empty block (C{"queue 'x' {\\r\\n  \\r\\n}"});
    no block at all gives C{"\\r\\nEND\\r\\n"}.
    """
    lines: list[str] = []
    for name, stats in blocks:
        lines.append(f"queue '{name}' {{")
        lines.append("  " + "\r\n  ".join(f"{k}={v}" for k, v in stats))
        lines.append("}")
    return "\r\n".join(lines) + "\r\nEND\r\n"


_physical_memory: int | None = None


def physical_memory_bytes() -> int:
    """
    The machine's physical memory in bytes (looked up once), or 0 when unknown.

    txkestrel divides the queues' C{max_memory_size} by this for
    C{reserved_memory_ratio}, where Kestrel divided by the JVM's maximum heap.
    """
    global _physical_memory
    if _physical_memory is None:
        try:
            _physical_memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (AttributeError, ValueError, OSError):
            _physical_memory = 0
    return _physical_memory
