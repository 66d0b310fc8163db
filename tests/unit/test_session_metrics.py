"""
Latency metrics recorded by ClientSession and KestrelServer, on a real
server (collection, queues, journals in a temporary folder) driven by a Clock.

Each test reads the server's L{kestrel.metrics.Metrics}: global histograms
and the per-queue ones (C{metrics.queue(name)}).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from twisted.internet.task import Clock

from kestrel.metrics import Histogram
from kestrel.server import KestrelServer
from kestrel.session import ClientSession
from tests.support import ManualThread, make_server

#: What the shared C{server} fixture (tests/unit/conftest.py) passes to make_server.
SERVER_OPTIONS = {"max_open_transactions": 10}
DURABLE = "default: {sync_journal: always, durable_acks: true}\n"


@pytest.fixture
def session(server: KestrelServer) -> ClientSession:
    return server.new_session("memcache")


def values(h: Histogram) -> tuple[int, int, int]:
    """(count, minimum, maximum) of C{h}."""
    return h.count, h.minimum, h.maximum


def test_set_records_set_latency(server: KestrelServer, session: ClientSession) -> None:
    """Every set answered at once adds one set_latency_usec value, globally and per queue."""
    session.set_item("q", b"a")
    session.set_item("q", b"b")
    session.set_item("other", b"c")
    metrics = server.metrics
    assert metrics.set_latency_usec.count == 3
    assert metrics.queue("q").set_latency_usec.count == 2
    assert metrics.queue("other").set_latency_usec.count == 1


@pytest.mark.parametrize("answered", ["by a Deferred", "by answer"])
def test_durable_set_latency_lasts_until_the_fsync(clock: Clock, tmp_path: Path,
                                                   answered: str) -> None:
    """
    With durable acks the set latency runs until the covering fsync answered:
    through the Deferred of set_item, or through offer_item's answer (the
    memcache set's way, no Deferred), recorded before answer runs.
    """
    thread = ManualThread()
    server = make_server(clock, tmp_path, DURABLE, run_in_thread=thread)
    try:
        session = server.new_session("memcache")
        told: list[tuple[object, object, int]] = []
        if answered == "by a Deferred":
            d = session.set_item("q", b"a")
        else:
            def answer(outcome: object) -> None:
                told.append((outcome, "extra", server.metrics.set_latency_usec.count))

            assert session.offer_item("q", b"a", 0, answer) is None
        assert server.metrics.set_latency_usec.count == 0
        clock.advance(0.004)
        thread.run_all()
        if answered == "by a Deferred":
            assert d.called
        else:
            assert told == [(True, "extra", 1)]
        assert values(server.metrics.set_latency_usec) == (1, 4000, 4000)
        assert values(server.metrics.queue("q").set_latency_usec) == (1, 4000, 4000)
    finally:
        thread.run_all()
        server.collection.stopService()


def test_fsync_delays_are_recorded(clock: Clock, tmp_path: Path) -> None:
    """A journal fsync records fsync_delay_usec and, per covered write, item_fsync_delay_usec."""
    thread = ManualThread()
    server = make_server(clock, tmp_path, DURABLE, run_in_thread=thread)
    try:
        server.new_session("memcache").set_item("q", b"a")
        clock.advance(0.002)
        thread.run_all()
        metrics = server.metrics
        assert metrics.fsync_delay_usec.count == 1
        assert values(metrics.item_fsync_delay_usec) == (1, 2000, 2000)
    finally:
        server.collection.stopService()


def test_get_hit_records_hit_and_delivery_latency(clock: Clock, server: KestrelServer,
                                                  session: ClientSession) -> None:
    """A get that finds an item records get_hit_latency_usec, and its age as delivery latency."""
    session.set_item("q", b"a")
    clock.advance(2.5)
    item = session.get_item("q", None, False, False).result
    assert item.data == b"a"
    metrics = server.metrics
    assert metrics.get_hit_latency_usec.count == 1
    assert metrics.get_miss_latency_usec.count == 0
    assert values(metrics.delivery_latency_msec) == (1, 2500, 2500)
    assert values(metrics.queue("q").delivery_latency_msec) == (1, 2500, 2500)


def test_get_miss_records_miss_latency(server: KestrelServer, session: ClientSession) -> None:
    """A get on an empty queue records get_miss_latency_usec and no delivery."""
    assert session.get_item("q", None, False, False).result is None
    metrics = server.metrics
    assert (metrics.get_miss_latency_usec.count, metrics.get_hit_latency_usec.count) == (1, 0)
    assert metrics.queue("q").get_miss_latency_usec.count == 1
    assert metrics.delivery_latency_msec.count == 0


def test_peek_is_not_a_delivery(server: KestrelServer, session: ClientSession) -> None:
    """A peek that finds an item records a hit but no delivery latency (nothing was removed)."""
    session.set_item("q", b"a")
    assert session.get_item("q", None, False, True).result.data == b"a"
    assert server.metrics.get_hit_latency_usec.count == 1
    assert server.metrics.delivery_latency_msec.count == 0


def test_blocking_get_timeout_records_get_timeout(clock: Clock, server: KestrelServer,
                                                  session: ClientSession) -> None:
    """A get whose deadline passes records get_timeout_msec (the wait), not a miss latency."""
    d = session.get_item("q", clock.seconds() + 0.5, False, False)
    assert not d.called
    clock.advance(0.5)
    assert d.result is None
    metrics = server.metrics
    assert values(metrics.get_timeout_msec) == (1, 500, 500)
    assert values(metrics.queue("q").get_timeout_msec) == (1, 500, 500)
    assert metrics.get_miss_latency_usec.count == 0


def test_blocking_get_woken_records_delivery(clock: Clock, server: KestrelServer,
                                             session: ClientSession) -> None:
    """A waiting get handed an item records its delivery latency and no timeout."""
    d = session.get_item("q", clock.seconds() + 10, True, False)
    clock.advance(1)
    server.new_session("memcache").set_item("q", b"a")
    assert d.result.data == b"a"  # handed over as it was added: delivered after 0 ms
    assert values(server.metrics.delivery_latency_msec) == (1, 0, 0)
    assert server.metrics.get_timeout_msec.count == 0


def test_cancelled_wait_records_nothing(clock: Clock, server: KestrelServer,
                                        session: ClientSession) -> None:
    """A wait cancelled by the end of its session is neither a timeout nor a delivery."""
    d = session.get_item("q", clock.seconds() + 10, False, False)
    d.addErrback(lambda _: None)
    session.finish()
    clock.advance(10)
    assert server.metrics.get_timeout_msec.count == 0
    assert server.metrics.delivery_latency_msec.count == 0


def test_monitor_records_each_delivery(clock: Clock, server: KestrelServer,
                                       session: ClientSession) -> None:
    """Items handed out by monitor record a hit and a delivery latency each."""
    session.set_item("q", b"a")
    session.set_item("q", b"b")
    clock.advance(1)
    got = []
    session.monitor_until("q", clock.seconds() + 1, 5, False, got.append)
    assert [item.data for item in got] == [b"a", b"b"]
    assert values(server.metrics.delivery_latency_msec) == (2, 1000, 1000)
    assert server.metrics.get_hit_latency_usec.count == 2


def test_delete_forgets_the_queue_metrics(server: KestrelServer,
                                          session: ClientSession) -> None:
    """Deleting a queue drops its q/<name>/ histograms; the global ones keep their values."""
    session.set_item("q", b"a")
    assert server.metrics.queue_names() == ["q"]
    session.delete("q")
    assert server.metrics.queue_names() == []
    assert server.metrics.set_latency_usec.count == 1
