"""
Clients that vanish in the middle of a blocking read (FIN or RST), against a
real server process: the read ends at once, and the next item stored goes to
a live reader, never to the gone connection (decisions.md: no acknowledged
item is ever handed to a client that is gone).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.chaos.clients import MemcacheClient, ThriftClient, blocked_reader
from tests.chaos.harness import waiters
from tests.wire.conftest import KestrelProcess


@pytest.fixture(scope="module")
def server(kestrel_factory: Callable[..., KestrelProcess]) -> KestrelProcess:
    return kestrel_factory(protocols=("memcache", "text", "thrift"),
                           config={"max_open_transactions": 100})


def wait_for_waiters(server: KestrelProcess, queue: str, count: int) -> None:
    deadline = time.monotonic() + 10
    while waiters(server, queue) != count:
        assert time.monotonic() < deadline, f"{queue}: waiters never became {count}"
        time.sleep(0.02)


def start_waiting(server: KestrelProcess, protocol: str, queue: str) -> object:
    """Open a connection of C{protocol} blocked in a 60 s read of C{queue}."""
    return blocked_reader(server.host, server.ports, protocol, queue, 60000, max_items=3)


@pytest.mark.parametrize("rst", [False, True], ids=["fin", "rst"])
@pytest.mark.parametrize("protocol", ["memcache", "memcache-open", "text", "thrift"])
def test_vanished_reader_takes_no_item(server: KestrelProcess, protocol: str, rst: bool) -> None:
    """Five readers block and vanish; the five items set afterwards all stay in the queue."""
    queue = f"van_{protocol.replace('-', '_')}_{'rst' if rst else 'fin'}"
    readers = [start_waiting(server, protocol, queue) for _ in range(5)]
    wait_for_waiters(server, queue, 5)
    for reader in readers:
        reader.vanish(rst)  # type: ignore[attr-defined]
    wait_for_waiters(server, queue, 0)
    producer = MemcacheClient(server.host, server.ports["memcache"])
    for i in range(5):
        assert producer.set(queue, b"item%d" % i)
    got = [producer.get(queue) for _ in range(6)]
    assert got == [b"item0", b"item1", b"item2", b"item3", b"item4", None]
    producer.close()


def test_thrift_get_cut_by_a_close_puts_back_what_it_collected(server: KestrelProcess) -> None:
    """A thrift get without auto-abort holding one item and waiting for more: a FIN puts it back."""
    producer = MemcacheClient(server.host, server.ports["memcache"])
    assert producer.set("van_partial", b"first")
    reader = ThriftClient(server.host, server.ports["thrift"])
    reader.send_call("get", queue_name="van_partial", max_items=5, timeout_msec=60000,
                     auto_abort_msec=0)
    wait_for_waiters(server, "van_partial", 1)
    reader.close()
    wait_for_waiters(server, "van_partial", 0)
    assert producer.get("van_partial") == b"first"
    producer.close()
