"""
Fanout is all or nothing for the producer: an add to a master is
acknowledged only once the master and every child hold the item (under
C{durable_acks}, once every fsync covering it is done). A child that cannot
store it gets the add refused, with one log line per refusal episode.

Faults are injected where the child's journal calls the OS (its C{write} and
C{fsync}); time is a L{Clock}; clients are in memory.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from twisted.internet.task import Clock
from twisted.logger import LogLevel, capturedLogs

from kestrel.errors import JournalUnavailable
from kestrel.protocols.memcache import MemcacheFactory
from kestrel.server import KestrelServer
from tests.support import StringClient, make_server
from tests.unit.test_journal_faults import Disk
from tests.unit.test_queue import value

DURABLE = "default: {sync_journal: always, durable_acks: true}\n"


def failing(server: KestrelServer, name: str, *, writes: bool = True) -> Disk:
    """Make queue C{name}'s journal fail its writes (or, with C{writes=False}, its fsyncs)."""
    journal = server.collection.queue(name).journal
    disk = Disk()
    if writes:
        disk.write_fails = True
    else:
        disk.fsync_fails = True
    journal._os_write = disk.write
    journal._writer._os_write = disk.write
    journal.files.fsync = disk.fsync
    return disk


def items(server: KestrelServer, name: str) -> list[bytes]:
    """Take every item of C{name} (at once)."""
    out = []
    while (item := value(server.collection.remove(name))) is not None:
        out.append(item.data)
    return out


def fanout_server(clock: Clock, tmp_path: Path, yaml: str = DURABLE) -> KestrelServer:
    server = make_server(clock, tmp_path, yaml)
    server.collection.queue("fq+a")
    server.collection.queue("fq+b")
    return server


def refusal(server: KestrelServer, name: str, data: bytes) -> object:
    """What an add answers: True, False, or the exception class of its failure."""
    d = server.collection.add(name, data)
    server.clock.advance(0)  # the reactor turn ends: its fsyncs run
    box: list[object] = []
    d.addBoth(box.append)
    assert box, "the add did not answer"
    result = box[0]
    if hasattr(result, "value"):
        return type(result.value)  # type: ignore[union-attr]
    return result


@pytest.mark.parametrize("writes", [True, False], ids=["write-eio", "fsync-eio"])
def test_a_child_that_cannot_store_refuses_the_add(clock: Clock, tmp_path: Path,
                                                   writes: bool) -> None:
    """EIO on one child's journal: the add fails; the master and the other child keep it."""
    server = fanout_server(clock, tmp_path)
    failing(server, "fq+a", writes=writes)
    assert refusal(server, "fq", b"x") is JournalUnavailable
    assert items(server, "fq") == [b"x"]
    assert items(server, "fq+b") == [b"x"]
    server.collection.stopService()


def test_memcache_producer_gets_server_error(clock: Clock, tmp_path: Path) -> None:
    """The set is answered with the protocol's error naming the child, never STORED."""
    server = fanout_server(clock, tmp_path)
    failing(server, "fq+a")
    client = StringClient(MemcacheFactory(server))
    reply = client.send(b"set fq 0 0 1\r\nx\r\n")
    clock.advance(0)
    reply += client.take()
    assert reply.startswith(b"SERVER_ERROR queue fq+a is read-only")
    assert client.connected
    server.collection.stopService()


def test_fanout_only_master_with_failing_children_refuses(clock: Clock, tmp_path: Path) -> None:
    """fanout_only and every child failing: refused, and nothing is acknowledged."""
    server = fanout_server(clock, tmp_path, DURABLE + "queues:\n  fq: {fanout_only: true}\n")
    failing(server, "fq+a")
    failing(server, "fq+b")
    for _ in range(3):
        assert refusal(server, "fq", b"x") is JournalUnavailable
    assert server.collection.queue("fq+a").length == 0
    assert server.collection.queue("fq+b").length == 0
    server.collection.stopService()


def test_a_full_child_refuses_the_add(clock: Clock, tmp_path: Path) -> None:
    """A child that refuses (full) makes the add answer False: memcache says NOT_STORED."""
    server = fanout_server(clock, tmp_path, "queues:\n  fq+a: {max_items: 1}\n")
    client = StringClient(MemcacheFactory(server))
    assert client.send(b"set fq 0 0 1\r\n1\r\n") == b"STORED\r\n"
    assert client.send(b"set fq 0 0 1\r\n2\r\n") == b"NOT_STORED\r\n"
    assert items(server, "fq+a") == [b"1"]
    assert items(server, "fq+b") == [b"1", b"2"]
    server.collection.stopService()


def test_every_queue_holding_it_is_stored(clock: Clock, tmp_path: Path) -> None:
    """With every queue healthy the add is acknowledged after every durable write."""
    server = fanout_server(clock, tmp_path)
    assert refusal(server, "fq", b"x") is True
    assert [items(server, n) for n in ("fq", "fq+a", "fq+b")] == [[b"x"]] * 3
    assert server.stats.total_items == 3
    server.collection.stopService()


def test_one_log_line_per_refusal_episode(clock: Clock, tmp_path: Path) -> None:
    """A thousand refused adds: one warning, no traceback; recovery: one info line."""
    server = fanout_server(clock, tmp_path, "queues:\n  fq+a: {max_items: 1}\n")
    assert refusal(server, "fq", b"first") is True
    with capturedLogs() as events:
        for _ in range(1000):
            assert refusal(server, "fq", b"x") is False
        items(server, "fq+a")
        assert refusal(server, "fq", b"y") is True
    fanout_lines = [e for e in events if "Fanout child" in e.get("log_format", "")]
    assert [e["log_level"] for e in fanout_lines] == [LogLevel.warn, LogLevel.info]
    assert fanout_lines[1]["count"] == 1000
    assert not [e for e in events if e.get("log_level") in (LogLevel.critical, LogLevel.error)]
    server.collection.stopService()


def test_journal_failure_logs_no_traceback(clock: Clock, tmp_path: Path) -> None:
    """A child whose journal fails: refusals are logged without tracebacks, one per episode."""
    server = fanout_server(clock, tmp_path)
    failing(server, "fq+a")
    with capturedLogs() as events:
        for _ in range(200):
            assert refusal(server, "fq", b"x") is JournalUnavailable
    assert not [e for e in events if e.get("log_failure") is not None
                or e.get("log_level") == LogLevel.critical]
    assert len([e for e in events if "Fanout child" in e.get("log_format", "")]) == 1
    server.collection.stopService()
