"""ServerStats and the STATS / DUMP_STATS reports, over a real QueueCollection."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from twisted.internet.task import Clock

from kestrel.collection import QueueCollection
from kestrel.config import parse_config
from kestrel.stats import (
    ServerStats,
    dump_stat_blocks,
    format_stat_blocks,
    format_stats,
    global_stat_entries,
    physical_memory_bytes,
    stat_entries,
)

GLOBAL_ORDER = [
    "uptime", "time", "version", "curr_items", "total_items", "bytes", "reserved_memory_ratio",
    "curr_connections", "total_connections", "cmd_get", "cmd_set", "cmd_peek", "get_hits",
    "get_misses", "bytes_read", "bytes_written", "queue_creates", "queue_deletes",
    "queue_expires", "queues_loading",
]

QUEUE_ORDER = [
    "items", "bytes", "total_items", "logsize", "expired_items", "mem_items", "mem_bytes", "age",
    "discarded", "waiters", "open_transactions", "transactions", "canceled_transactions",
    "total_flushes", "journal_rewrites", "journal_rotations",
]


@pytest.fixture
def collection(tmp_path: Path, clock: Clock) -> QueueCollection:
    """A started collection with one alias."""
    config = parse_config(f"queue_path: {json.dumps(str(tmp_path / 'queues'))}\n"
                          f"status_file: {json.dumps(str(tmp_path / 'status'))}\n"
                          "expiration_timer_frequency: null\n"
                          "aliases:\n  al: [a, b]\n")
    c = QueueCollection(config, clock)
    c.startService()
    yield c
    c.stopService()



def format_dump_stats(source: QueueCollection, names: list[str] | tuple[str, ...] = ()) -> str:
    """The DUMP_STATS reply text as the server builds it (KestrelServer.dump_stats_text)."""
    return format_stat_blocks(dump_stat_blocks(source, names))

def test_counters_start_at_zero_and_are_plain_ints() -> None:
    """Every counter is an int attribute at 0; counters() reports them all."""
    stats = ServerStats(100.0)
    counters = stats.counters()
    assert list(counters) == list(ServerStats.COUNTERS)
    assert set(counters.values()) == {0}
    stats.cmd_get += 1
    assert stats.counters()["cmd_get"] == 1


def test_fsync_errors_by_class() -> None:
    """fsync failures are counted per exception class, as fsync_error_<class>."""
    stats = ServerStats(0.0)
    stats.record_fsync_error(OSError("disk"))
    stats.record_fsync_error(OSError("disk"))
    stats.record_fsync_error(PermissionError("no"))
    counters = stats.counters()
    assert counters["fsync_error_OSError"] == 2
    assert counters["fsync_error_PermissionError"] == 1


def test_uptime() -> None:
    """uptime is whole seconds since start, never negative."""
    stats = ServerStats(1000.0)
    assert stats.uptime(1000.9) == 0
    assert stats.uptime(1061.5) == 61
    assert stats.uptime(900.0) == 0


def test_global_entries_in_reference_order(collection: QueueCollection, clock: Clock) -> None:
    """The global STATS entries come in Kestrel's order with their values."""
    collection.add("a", b"xyz")
    collection.stats.cmd_set = 7
    clock.advance(12)
    entries = global_stat_entries(collection.stats, now=clock.seconds(), version="1.2.3",
                                  source=collection)
    assert [k for k, _ in entries] == GLOBAL_ORDER
    values = dict(entries)
    assert values["uptime"] == "12"
    assert values["time"] == str(int(clock.seconds()))
    assert values["version"] == "1.2.3"
    assert values["curr_items"] == "1"
    assert values["bytes"] == "3"
    assert values["total_items"] == "1"
    assert values["cmd_set"] == "7"
    assert values["queue_creates"] == "1"
    assert len(values["reserved_memory_ratio"].split(".")[1]) == 3


def test_stat_entries_add_queues_then_aliases(collection: QueueCollection, clock: Clock) -> None:
    """Per-queue entries are queue_<name>_<stat>, queues first, then aliases."""
    collection.queue("a+f")
    collection.add("a", b"1")
    entries = stat_entries(collection.stats, now=clock.seconds(), version="v",
                           source=collection)
    keys = [k for k, _ in entries][len(GLOBAL_ORDER):]
    expected = ([f"queue_a+f_{s}" for s in QUEUE_ORDER]
                + [f"queue_a_{s}" for s in QUEUE_ORDER] + ["queue_a_children"]
                + ["queue_al_put_items", "queue_al_put_bytes", "queue_al_children"])
    assert keys == expected
    assert dict(entries)["queue_a_children"] == "a+f"
    assert dict(entries)["queue_al_children"] == "a,b"


def test_format_stats() -> None:
    """STAT lines end with END, all CRLF-terminated."""
    assert format_stats([("uptime", "5"), ("version", "x")]) == (
        "STAT uptime 5\r\nSTAT version x\r\nEND\r\n")
    assert format_stats([]) == "END\r\n"


def test_dump_stats_text(collection: QueueCollection) -> None:
    """DUMP_STATS: one block per name, two-space indented k=v lines, then END."""
    collection.queue("q")
    text = format_dump_stats(collection, ["q"])
    lines = text.split("\r\n")
    assert lines[0] == "queue 'q' {"
    assert lines[1:17] == [f"  {k}={'0'}" for k in QUEUE_ORDER]
    assert lines[17:] == ["}", "END", ""]


def test_dump_stats_unknown_and_default(collection: QueueCollection) -> None:
    """An unknown name gives an empty block; no names means every queue and alias."""
    assert format_dump_stats(collection, ["nope"]) == "queue 'nope' {\r\n  \r\n}\r\nEND\r\n"
    assert format_dump_stats(collection) == (
        "queue 'al' {\r\n  put_items=0\r\n  put_bytes=0\r\n  children=a,b\r\n}\r\nEND\r\n")


def test_dump_stats_with_nothing(tmp_path: Path, clock: Clock) -> None:
    """No queues and no aliases: just the END line."""
    config = parse_config(f"queue_path: {json.dumps(str(tmp_path / 'queues'))}\n"
                          f"status_file: {json.dumps(str(tmp_path / 'status'))}\n")
    assert format_dump_stats(QueueCollection(config, clock)) == "\r\nEND\r\n"


def test_physical_memory_is_known_here() -> None:
    """The memory denominator of reserved_memory_ratio is found on Linux."""
    assert physical_memory_bytes() > 0
