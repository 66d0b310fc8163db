"""
Plain gets pipelined in one pass over a memcache connection's input hold
their items in place, at successive positions of their queue, until the
pass's replies are written: then each is removed with one REMOVE record (no
open read), and a reply that did not reach the kernel turns them into open
reads. Whatever else the pass or another connection does to the queue in
between never hands a held item to a second reader.
"""

from __future__ import annotations

from pathlib import Path

from twisted.internet.task import Clock

from kestrel.protocols.memcache import MemcacheFactory
from kestrel.server import KestrelServer
from tests.support import StringClient, full_disk_writes, make_server
from tests.unit.test_held_reads import BIG, Client, contents
from tests.unit.test_queue_file import journal_records


def record_names(tmp_path: Path, name: str) -> list[str]:
    return [type(r).__name__ for r in journal_records(tmp_path / "queues", name)]


def fill(server: KestrelServer, name: str, *items: bytes) -> None:
    conn = StringClient(MemcacheFactory(server))
    for item in items:
        assert conn.send(b"set %s 0 0 %d\r\n%s\r\n" % (name.encode(), len(item), item)) == (
            b"STORED\r\n")


def test_pipelined_gets_write_one_remove_each(server: KestrelServer, tmp_path: Path) -> None:
    """set, set, get, get in one pass: two ADDs, two REMOVEs, nothing left open."""
    conn = StringClient(MemcacheFactory(server))
    reply = conn.send(b"set q 0 0 1\r\na\r\nset q 0 0 1\r\nb\r\nget q\r\nget q\r\n")
    assert reply == b"STORED\r\nSTORED\r\nVALUE q 0 1\r\na\r\nEND\r\nVALUE q 0 1\r\nb\r\nEND\r\n"
    queue = server.collection.queue("q")
    assert queue.length == 0 and queue.open_read_count == 0 and queue.transactions == 0
    assert server.stats.get_hits == 2 and queue.get_items_hit == 2
    assert record_names(tmp_path, "q") == ["Add", "Add", "Remove", "Remove"]


def test_get_past_the_held_items_misses(server: KestrelServer) -> None:
    """A get finding only held items misses (they were first taken as open reads)."""
    fill(server, "q", b"a", b"b")
    conn = StringClient(MemcacheFactory(server))
    reply = conn.send(b"get q\r\nget q\r\nget q\r\n")
    assert reply == b"VALUE q 0 1\r\na\r\nEND\r\nVALUE q 0 1\r\nb\r\nEND\r\nEND\r\n"
    queue = server.collection.queue("q")
    assert queue.length == 0 and queue.open_read_count == 0 and queue.transactions == 0
    assert server.stats.get_hits == 2 and server.stats.get_misses == 1


def test_pipelined_gets_replay_to_what_is_left(clock: Clock, tmp_path: Path) -> None:
    """A server started on the files as a crash leaves them finds only what was not read."""
    server = make_server(clock, tmp_path)
    fill(server, "q", b"a", b"b", b"c")
    conn = StringClient(MemcacheFactory(server))
    reply = conn.send(b"get q\r\nset q 0 0 1\r\nd\r\nget q\r\nget other\r\nget q\r\n")
    assert reply == (b"VALUE q 0 1\r\na\r\nEND\r\nSTORED\r\nVALUE q 0 1\r\nb\r\nEND\r\n"
                     b"END\r\nVALUE q 0 1\r\nc\r\nEND\r\n")
    again = make_server(clock, tmp_path)
    try:
        assert contents(again, "q") == [b"d"]
    finally:
        again.collection.stopService()
        server.collection.stopService()


def test_gets_of_two_queues_in_one_pass(server: KestrelServer) -> None:
    """Each queue's held items are counted apart: every get has the next item of its queue."""
    fill(server, "a", b"a1", b"a2")
    fill(server, "b", b"b1", b"b2")
    conn = StringClient(MemcacheFactory(server))
    reply = conn.send(b"get a\r\nget b\r\nget a\r\nget b\r\nget a\r\n")
    assert reply == (b"VALUE a 0 2\r\na1\r\nEND\r\nVALUE b 0 2\r\nb1\r\nEND\r\n"
                     b"VALUE a 0 2\r\na2\r\nEND\r\nVALUE b 0 2\r\nb2\r\nEND\r\nEND\r\n")
    assert contents(server, "a") == [] and contents(server, "b") == []


def test_open_read_and_peek_after_plain_gets_see_what_follows(server: KestrelServer,
                                                              tmp_path: Path) -> None:
    """
    An open read or a peek after plain gets of the same pass: the held items
    are first taken as open reads, so the open read gets the next item and
    the peek sees the one after; no item goes to two readers.
    """
    fill(server, "q", b"a", b"b", b"c", b"d")
    conn = StringClient(MemcacheFactory(server))
    reply = conn.send(b"get q\r\nget q/peek\r\nget q\r\nget q/open\r\n")
    assert reply == (b"VALUE q 0 1\r\na\r\nEND\r\nVALUE q/peek 0 1\r\nb\r\nEND\r\n"
                     b"VALUE q 0 1\r\nb\r\nEND\r\nVALUE q/open 0 1\r\nc\r\nEND\r\n")
    queue = server.collection.queue("q")
    assert queue.open_read_count == 1 and queue.length == 1 and queue.transactions == 1
    assert conn.send(b"get q/abort\r\n") == b"END\r\n"
    assert contents(server, "q") == [b"c", b"d"]
    assert "RemoveTentativeXid" in record_names(tmp_path, "q")


def test_blocked_reader_of_another_connection_gets_the_next_item(server: KestrelServer) -> None:
    """
    A reader blocked on the empty queue is woken after the pass's journal
    flush: the pass's get does not hold its item in place, so the two get
    different items.
    """
    reader = StringClient(MemcacheFactory(server))
    assert reader.send(b"get q/t=1000\r\n") == b""
    writer = StringClient(MemcacheFactory(server))
    reply = writer.send(b"set q 0 0 1\r\na\r\nset q 0 0 1\r\nb\r\nget q\r\n")
    assert reply == b"STORED\r\nSTORED\r\nVALUE q 0 1\r\na\r\nEND\r\n"
    assert reader.take() == b"VALUE q/t=1000 0 1\r\nb\r\nEND\r\n"
    queue = server.collection.queue("q")
    assert queue.length == 0 and queue.open_read_count == 0


def test_reply_left_behind_turns_held_items_into_open_reads(server: KestrelServer) -> None:
    """
    The kernel takes part of the pass's replies: its held items become open
    reads, in order; a reset returns them to the head, the first first.
    """
    fill(server, "big", BIG, b"second", b"third")
    client = Client(MemcacheFactory(server), room=2048)
    client.send(b"get big\r\nget big\r\n")
    queue = server.collection.queue("big")
    assert queue.open_read_count == 2 and queue.length == 1
    client.reset()
    assert contents(server, "big") == [BIG, b"second", b"third"]


def test_refused_batch_leaves_the_held_items_queued(server: KestrelServer, clock: Clock) -> None:
    """The pass's journal write fails: its replies are dropped and its gets take nothing."""
    fill(server, "q", b"a", b"b")
    conn = StringClient(MemcacheFactory(server))
    with full_disk_writes(server, clock, "q"):
        reply = conn.send(b"get q\r\nset q 0 0 1\r\nc\r\nget q\r\n")
    assert reply == b"SERVER_ERROR journal write failed\r\n"
    assert not conn.connected
    queue = server.collection.queue("q")
    assert queue.open_read_count == 0
    assert [item.data for item in queue.memory_items()][:2] == [b"a", b"b"]


def test_stats_in_the_same_pass_count_the_replied_items_as_taken(server: KestrelServer) -> None:
    """get then dump_stats (or stats) in one pass: the item the get replied with is not queued."""
    fill(server, "q", b"a", b"b")
    conn = StringClient(MemcacheFactory(server))
    reply = conn.send(b"get q\r\ndump_stats q\r\nstats\r\n")
    assert reply.startswith(b"VALUE q 0 1\r\na\r\nEND\r\nqueue 'q' {\r\n  items=1\r\n")
    assert b"STAT queue_q_items 1\r\n" in reply
    assert server.collection.queue("q").length == 1


def test_flush_in_the_same_pass_leaves_the_replied_item_taken(server: KestrelServer) -> None:
    """get then flush in one pass: the replied item is the client's, the rest is flushed."""
    fill(server, "q", b"a", b"b")
    conn = StringClient(MemcacheFactory(server))
    assert conn.send(b"get q\r\nflush q\r\n") == b"VALUE q 0 1\r\na\r\nEND\r\nEND\r\n"
    queue = server.collection.queue("q")
    assert queue.length == 0 and queue.open_read_count == 0
    assert conn.send(b"get q\r\n") == b"END\r\n"


def test_a_get_of_an_empty_queue_misses_once_and_a_waiting_one_still_waits(
        server: KestrelServer, clock: Clock) -> None:
    """
    A plain get of an existing, empty queue is a miss counted once (server,
    queue, metrics); one with a timeout still waits and gets the next item.
    """
    fill(server, "q", b"a")
    conn = StringClient(MemcacheFactory(server))
    assert conn.send(b"get q\r\nget q\r\n") == b"VALUE q 0 1\r\na\r\nEND\r\nEND\r\n"
    assert conn.send(b"get q\r\n") == b"END\r\n"
    queue = server.collection.queue("q")
    assert (server.stats.get_hits, server.stats.get_misses) == (1, 2)
    assert (queue.get_items_hit, queue.get_items_miss) == (1, 2)
    waiter = StringClient(MemcacheFactory(server))
    assert waiter.send(b"get q/t=1000\r\n") == b""
    fill(server, "q", b"b")
    assert waiter.take() == b"VALUE q/t=1000 0 1\r\nb\r\nEND\r\n"
    assert (server.stats.get_hits, server.stats.get_misses) == (2, 2)
